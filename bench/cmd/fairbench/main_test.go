package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/bench"
)

// rows returns the table's data lines, split into fields.
func rows(out string) [][]string {
	var rs [][]string
	for _, l := range strings.Split(out, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		rs = append(rs, strings.Fields(l))
	}
	return rs
}

func runCmd(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, args, &stdout, &stderr)
	require.NoError(t, err, "fairbench %s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), stdout.String(), stderr.String())
	return stdout.String()
}

// TestAcceptanceSweep is issue 5's CI command:
//
//	go run ./bench/cmd/fairbench sweep -backend sim -machines 2 -devices 4 -b 1K -e 4M -f 4 -check
func TestAcceptanceSweep(t *testing.T) {
	js := filepath.Join(t.TempDir(), "out.jsonl")
	out := runCmd(t, "sweep", "-backend", "sim", "-machines", "2", "-devices", "4", "-b", "1K", "-e", "4M", "-f", "4", "-check",
		"-run", "ci", "-json", js)
	require.Contains(t, out, "not GPU timings", "the sim table says its timings are not GPU timings")
	require.Contains(t, out, "testbed: not emulated")
	rs := rows(out)
	require.Len(t, rs, 7, "1K 4K 16K 64K 256K 1M 4M\n%s", out)
	require.Contains(t, out, "v/best = time(min(flat, flat-ring, naive))/time(v)")
	for _, r := range rs {
		// size count type op, time ±% algbw busbw #wrong × 4, ideal, 3 ratios
		require.Len(t, r, 4+4*5+1+3, "%v", r)
		for _, col := range []int{8, 13, 18, 23} { // #wrong of flat, flat-ring, naive, fairgo
			require.Equal(t, "0", r[col], "size %s\n%s", r[0], out)
		}
	}
	recs, err := bench.ReadJSONLFiles([]string{js})
	require.NoError(t, err)
	require.Len(t, recs, 28)
	for i, m := range []string{"flat", "flat-ring", "naive", "fairgo"} {
		require.Equal(t, m, recs[i].Algorithm, "the default methods, in order")
	}
	for _, r := range recs {
		require.Zero(t, r.Wrong)
		require.Equal(t, 2, r.Machines)
		require.Equal(t, 4, r.Devices)
		require.True(t, r.SimTimings)
		require.Positive(t, r.TimeUS)
		require.Equal(t, "ci", r.Run)
		require.Contains(t, r.Command, "fairbench sweep -backend sim")
		require.Empty(t, r.Invalid)
	}
}

func TestOverlapScaleLinksModelReportAndPlots(t *testing.T) {
	if testing.Short() {
		t.Skip("several sim runs")
	}
	dir := t.TempDir()
	// Overlap with two fairgo variants, checked.
	ov := filepath.Join(dir, "overlap.jsonl")
	out := runCmd(t, "overlap", "-machines", "2", "-devices", "2", "-buckets", "4", "-bucket-bytes", "64K",
		"-fairgo", "p1=parallelism:1,slice:16K", "-fairgo", "p2=parallelism:2,algo:rail-rsag,slice:16K", "-w", "1", "-n", "1", "-reps", "2",
		"-check", "-json", ov, "-csv", filepath.Join(dir, "o.csv"))
	rs := rows(out)
	require.Len(t, rs, 1, out)
	require.Equal(t, "4×64K", rs[0][0])
	require.Len(t, rs[0], 4+5*5+1+2*3)
	for _, col := range []int{8, 13, 18, 23, 28} {
		require.Equal(t, "0", rs[0][col], out)
	}
	require.Contains(t, out, "fairgo variant p2: parallelism:2,algo:rail-rsag,slice:16K: algorithm rail-rsag")
	// Scale over 1, 2 and 4 machines, in process on sim.
	sc := filepath.Join(dir, "scale.jsonl")
	out = runCmd(t, "scale", "-machines-list", "1,2,4", "-devices", "2", "-b", "16K", "-e", "64K", "-f", "4",
		"-w", "0", "-n", "1", "-reps", "1", "-json", sc, "-plot", filepath.Join(dir, "plots"))
	require.Contains(t, out, "scale summary")
	// Links, then the model over everything.
	ln := filepath.Join(dir, "links.jsonl")
	out = runCmd(t, "links", "-b", "4K", "-e", "256K", "-f", "4", "-w", "0", "-n", "2", "-reps", "1", "-json", ln)
	require.Contains(t, out, "# link nvlink:")
	require.Contains(t, out, "# link net:")
	in := strings.Join([]string{ln, sc, ov}, ",")
	out = runCmd(t, "model", "-include-sim", "-in", in, "-model-machines", "8,64")
	for _, want := range []string{"error against", "predictions for M machines × D = 8 GPUs", "median |error|", "rail-a2a(us)"} {
		require.Contains(t, out, want)
	}
	out = runCmd(t, "report", "-in", in, "-csv", filepath.Join(dir, "all.csv"))
	require.Contains(t, out, "p2/best")
	for _, f := range []string{"speedup_2gpus_float32.png", "speedup_2gpus_float32.svg", "busbw_4x2_float32.png"} {
		st, err := os.Stat(filepath.Join(dir, "plots", f))
		require.NoError(t, err, f)
		require.Positive(t, st.Size(), f)
	}
	// Targets of sim records: written, with what is missing named.
	tj := filepath.Join(dir, "targets.json")
	out = runCmd(t, "targets", "-in", in, "-include-sim", "-enqueue", "6.5", "-out", tj)
	require.Contains(t, out, "T6")
	blob, err := os.ReadFile(tj)
	require.NoError(t, err)
	var ts []map[string]any
	require.NoError(t, json.Unmarshal(blob, &ts))
	require.Len(t, ts, 15)
	require.Equal(t, "T6", ts[5]["id"])
	require.Equal(t, true, ts[5]["pass"])
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"help"}, {"--help"}} {
		var stdout, stderr bytes.Buffer
		require.NoError(t, run(context.Background(), args, &stdout, &stderr), "%v", args)
		for _, c := range []string{"sweep", "overlap", "scale", "links", "model", "report", "targets", "help"} {
			require.Contains(t, stdout.String(), "  "+c+" ", "%v lists %s", args, c)
		}
	}
	flagsOf := func(out string) []string {
		var names []string
		for _, m := range regexp.MustCompile(`(?m)^  -([a-z-]+)`).FindAllStringSubmatch(out, -1) {
			names = append(names, m[1])
		}
		slices.Sort(names)
		return names
	}
	want := map[string][]string{
		"sweep": {"algos", "b", "backend", "check", "csv", "devices", "dtype", "e", "f", "fairgo", "jitter", "json", "label", "machines",
			"n", "op", "plot", "reps", "run", "seed", "timeout", "w"},
		"targets": {"enqueue", "enqueue-bench", "in", "include-sim", "net-alpha-us", "net-gbps", "nvlink-alpha-us", "nvlink-gbps", "out", "variant"},
		"model": {"in", "include-sim", "model-devices", "model-machines", "model-parallelism", "model-sizes", "net-alpha-us", "net-gbps",
			"nvlink-alpha-us", "nvlink-gbps"},
	}
	for cmd, names := range want {
		var stdout, stderr bytes.Buffer
		require.NoError(t, run(context.Background(), []string{"help", cmd}, &stdout, &stderr))
		require.Equal(t, names, flagsOf(stdout.String()), "help %s", cmd)
		stderr.Reset()
		err := run(context.Background(), []string{cmd, "-h"}, &stdout, &stderr)
		require.ErrorIs(t, err, flag.ErrHelp)
		require.Equal(t, names, flagsOf(stderr.String()), "%s -h", cmd)
	}
	// Only the overlap command has buckets; only scale a machine list.
	var stdout bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"help", "scale"}, &stdout, &bytes.Buffer{}))
	require.Contains(t, flagsOf(stdout.String()), "machines-list")
	require.NotContains(t, flagsOf(stdout.String()), "machines")
	require.NotContains(t, flagsOf(stdout.String()), "buckets")
}

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{}, {"bogus"}, {"-backend", "sim"}, {"help", "bogus"},
		{"sweep", "-b", "1Q"}, {"sweep", "-dtype", "float7"}, {"sweep", "-op", "xor"}, {"sweep", "-algos", "ring"},
		{"sweep", "-fairgo", "x=parallelism:0"}, {"sweep", "-fairgo", "flat"}, {"sweep", "-fairgo", "a", "-fairgo", "a"},
		{"sweep", "-fairgo", "flat-ring=slice:1M"},
		{"links", "-link", "pcie"}, {"sweep", "-backend", "tpu"}, {"sweep", "-b", "8M", "-e", "1M"},
		{"model"}, {"targets"}, {"targets", "-in", "x.jsonl", "-enqueue", "/nonexistent"}, {"sweep", "extra"},
		{"sweep", "-buckets", "4"}, {"overlap", "-buckets", "0"}, {"model", "-in", "x", "-model-machines", "0"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), args, &stdout, &stderr)
		require.Error(t, err, "fairbench %v", args)
		require.False(t, errors.Is(err, flag.ErrHelp), "fairbench %v", args)
	}
}

// TestWorkerArgs: what scale gives the sweep workers it launches.
func TestWorkerArgs(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var b backendFlags
	var s sizeFlags
	var tf timingFlags
	var m methodFlags
	b.register(fs)
	s.register(fs)
	tf.register(fs)
	m.register(fs)
	require.NoError(t, fs.Parse([]string{"-backend", "cuda", "-b", "1M", "-check", "-run", "r2", "-fairgo", "a=slice:64M", "-fairgo", "b"}))
	args := strings.Join(append(append(append(b.args(fs), s.args(fs)...), tf.args(fs)...), m.args(fs)...), " ")
	for _, want := range []string{"-backend=cuda", "-b=1M", "-check=true", "-run=r2", "-fairgo=a=slice:64M", "-fairgo=b"} {
		require.Contains(t, args, want)
	}
	for _, bad := range []string{"-json", "-e=", "-timeout"} {
		require.NotContains(t, args, bad)
	}
	// The workers parse them back to the same variants.
	fs2 := flag.NewFlagSet("w", flag.ContinueOnError)
	var m2 methodFlags
	m2.register(fs2)
	require.NoError(t, fs2.Parse(m.args(fs)))
	require.Equal(t, m.variants, m2.variants)
}
