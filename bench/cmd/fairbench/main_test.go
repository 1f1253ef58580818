package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/bench"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/cli"
	"github.com/fairgo/fairgo/internal/cli/clitest"
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
	code := run(ctx, args, &stdout, &stderr)
	require.Zero(
		t,
		code,
		"fairbench %s\nstdout:\n%s\nstderr:\n%s",
		strings.Join(args, " "),
		stdout.String(),
		stderr.String(),
	)
	return stdout.String()
}

// TestAcceptanceSweep is the sweep the README and doc/commands.md give as
// the check without a GPU:
//
//	go run ./bench/cmd/fairbench sweep -backend sim -machines 2 -devices 4 -b 1K -e 4M -f 4 -check
func TestAcceptanceSweep(t *testing.T) {
	js := filepath.Join(t.TempDir(), "out.jsonl")
	out := runCmd(
		t,
		"sweep",
		"-backend",
		"sim",
		"-machines",
		"2",
		"-devices",
		"4",
		"-b",
		"1K",
		"-e",
		"4M",
		"-f",
		"4",
		"-check",
		"-run",
		"ci",
		"-json",
		js,
	)
	require.Contains(t, out, "not GPU timings", "the sim table says its timings are not GPU timings")
	require.Contains(t, out, "testbed: not emulated")
	rs := rows(out)
	require.Len(t, rs, 7, "1K 4K 16K 64K 256K 1M 4M\n%s", out)
	require.Contains(t, out, "v/best = time(min(flat, flat-ring, flat-tree, naive))/time(v)")
	for _, r := range rs {
		// size count type op, time ±% algbw busbw #wrong × 5, ideal, 3 ratios
		require.Len(t, r, 4+5*5+1+3, "%v", r)
		for _, col := range []int{8, 13, 18, 23, 28} { // #wrong of flat, flat-ring, flat-tree, naive, fairgo
			require.Equal(t, "0", r[col], "size %s\n%s", r[0], out)
		}
	}
	recs, err := bench.ReadJSONLFiles([]string{js})
	require.NoError(t, err)
	require.Len(t, recs, 35)
	for i, m := range []string{"flat", "flat-ring", "flat-tree", "naive", "fairgo"} {
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
	out := runCmd(
		t,
		"overlap",
		"-machines",
		"2",
		"-devices",
		"2",
		"-buckets",
		"4",
		"-bucket-bytes",
		"64K",
		"-fairgo",
		"p1=parallelism:1,slice:16K",
		"-fairgo",
		"p2=parallelism:2,algo:rail-rsag,slice:16K",
		"-w",
		"1",
		"-n",
		"1",
		"-reps",
		"2",
		"-check",
		"-json",
		ov,
		"-csv",
		filepath.Join(dir, "o.csv"),
	)
	rs := rows(out)
	require.Len(t, rs, 1, out)
	require.Equal(t, "4×64K", rs[0][0])
	require.Len(t, rs[0], 4+6*5+1+2*3)
	for _, col := range []int{8, 13, 18, 23, 28, 33} {
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
	for _, want := range []string{"error against", "predictions for M machines × D = 8 GPUs",
		"median |error|", "rail-a2a(us)"} {
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
	require.Len(t, ts, 23, "every set: S1–S8, T1–T8, U1–U7")
	require.Equal(t, "T6", ts[13]["id"])
	require.Equal(t, false, ts[13]["pass"], "a flat call's figure alone: the hierarchical slice's is missing")
	require.Equal(t, "incomplete", ts[13]["status"])
	// The S set: S1–S8 and T6, each S target not measured on these records
	// but S7, from the training runs' files.
	for name, f := range map[string]string{
		"resnet-1x4-default.json": `{"hook": "default", "world_size": 4, "images_per_s": 100, "nccl_algo": null}`,
		"resnet-1x4-fairgo.json":  `{"hook": "fairgo", "world_size": 4, "images_per_s": 99, "nccl_algo": null}`,
	} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(f), 0o644))
	}
	out = runCmd(t, "targets", "-in", in, "-include-sim", "-enqueue", "6.5", "-set", "S", "-out", tj,
		"-hook", filepath.Join(dir, "resnet-*.json"))
	require.Contains(t, out, "not measured")
	blob, err = os.ReadFile(tj)
	require.NoError(t, err)
	ts = nil
	require.NoError(t, json.Unmarshal(blob, &ts))
	var ids []string
	for _, x := range ts {
		ids = append(ids, x["id"].(string))
		if x["id"] == "S7" {
			require.Equal(t, "incomplete", x["status"], "1 × 4 at 0.99, 2 × 2 not run")
			require.InDelta(t, 0.99, x["measured"], 1e-9)
		} else if x["id"] != "T6" {
			require.Equal(t, "not measured", x["status"], x["id"])
			require.Equal(t, false, x["pass"], x["id"])
		}
	}
	require.Equal(t, []string{"S1", "S2", "S3", "S4", "S5", "S6", "S7", "S8", "T6"}, ids)
}

// sweep's help names every algorithm a -fairgo variant's algo key takes.
func TestSweepHelpNamesEveryAlgorithm(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Zero(t, run(context.Background(), []string{"sweep", "-h"}, &stdout, &stderr))
	for a := hier.Auto; a.Valid(); a++ {
		require.Regexp(t, `[\s(]`+regexp.QuoteMeta(a.String())+`[,)]`, stdout.String(), "%s", a)
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"help"}, {"--help"}, {"-help"}} {
		var stdout, stderr bytes.Buffer
		require.Zero(t, run(context.Background(), args, &stdout, &stderr), "%v", args)
		require.Empty(t, stderr.String())
		for _, c := range []string{"sweep", "overlap", "scale", "links", "model", "report", "nodes", "targets",
			"help"} {
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
		"sweep": {
			"algos",
			"b",
			"backend",
			"check",
			"cpuprofile",
			"csv",
			"devices",
			"dtype",
			"e",
			"f",
			"fairgo",
			"jitter",
			"json",
			"label",
			"machines",
			"min-rounds",
			"n",
			"op",
			"plot",
			"rep-bytes",
			"reps",
			"run",
			"seed",
			"timeout",
			"trace",
			"w",
			"work-wait",
		},
		"targets": {
			"enqueue",
			"enqueue-bench",
			"hook",
			"in",
			"include-sim",
			"net-alpha-us",
			"net-gbps",
			"nvlink-alpha-us",
			"nvlink-gbps",
			"out",
			"set",
			"variant",
		},
		"nodes": {
			"in",
			"include-sim",
			"net-alpha-us",
			"net-gbps",
			"nic-gbit",
			"nvlink-alpha-us",
			"nvlink-gbps",
			"plot",
			"variant",
		},
		"model": {
			"in",
			"include-sim",
			"model-devices",
			"model-machines",
			"model-parallelism",
			"model-sizes",
			"net-alpha-us",
			"net-gbps",
			"nic-gbit",
			"nvlink-alpha-us",
			"nvlink-gbps",
		},
	}
	for cmd, names := range want {
		// help CMD, -h CMD, CMD -h and CMD --help print the same on stdout.
		var first string
		for _, args := range [][]string{{"help", cmd}, {"-h", cmd}, {cmd, "-h"}, {cmd, "--help"},
			{cmd, "-b", "1M", "-help"}} {
			if cmd != "sweep" && len(args) == 4 { // -b is sweep's
				continue
			}
			var stdout, stderr bytes.Buffer
			require.Zero(t, run(context.Background(), args, &stdout, &stderr), "%v", args)
			require.Empty(t, stderr.String(), "%v", args)
			require.Equal(t, names, flagsOf(stdout.String()), "%v", args)
			if first == "" {
				first = stdout.String()
			}
			require.Equal(t, first, stdout.String(), "%v", args)
		}
	}
	// Only the overlap command has buckets; only scale a machine list.
	var stdout bytes.Buffer
	require.Zero(t, run(context.Background(), []string{"help", "scale"}, &stdout, &bytes.Buffer{}))
	require.Contains(t, flagsOf(stdout.String()), "machines-list")
	require.NotContains(t, flagsOf(stdout.String()), "machines")
	require.NotContains(t, flagsOf(stdout.String()), "buckets")
	// Sizes and choices show what they take.
	stdout.Reset()
	require.Zero(t, run(context.Background(), []string{"sweep", "-h"}, &stdout, &bytes.Buffer{}))
	for _, want := range []string{"  -b size\n", "  -dtype type\n", "  -op reduction\n",
		"  -backend backend\n", "(default 1M)", "(default float32)", "bfloat16"} {
		require.Contains(t, stdout.String(), want)
	}
}

func runFairbench(args []string, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return run(ctx, args, stdout, stderr)
}

// TestCLIRules: help on stdout with status 0; a bad command line one
// message on stderr with status 2, sizes as given, choices listed, no
// extra arguments; a failure status 1.
func TestCLIRules(t *testing.T) {
	commands := "sweep, overlap, scale, links, model, report, nodes, targets, help"
	dtypes := "float16, bfloat16, float32, float64, int8, uint8, int32, uint32, int64, uint64"
	usage := func(name string, args []string, stderr ...string) clitest.Case {
		return clitest.Case{Name: name, Args: args, Code: cli.ExitUsage, Stderr: stderr}
	}
	a := func(s string) []string { return strings.Fields(s) }
	clitest.Check(t, "fairbench", runFairbench, []clitest.Case{
		{Name: "help", Args: a("help"), Code: cli.ExitOK, Stdout: []string{"usage: fairbench COMMAND"}},
		{
			Name: "help sweep",
			Args: a("help sweep"),
			Code: cli.ExitOK,
			Stdout: []string{"usage: fairbench sweep [flags]", "-dtype",
				"-timeout duration\n    \tgive up after this duration (default 30m)\n", "-jitter delay\n"},
		},
		{Name: "sweep -h", Args: a("sweep -h"), Code: cli.ExitOK, Stdout: []string{"usage: fairbench sweep [flags]"}},
		{
			Name:   "targets --help",
			Args:   a("targets --help"),
			Code:   cli.ExitOK,
			Stdout: []string{"usage: fairbench targets [flags]", "-enqueue"},
		},
		{
			Name:   "overlap -help",
			Args:   a("overlap -help"),
			Code:   cli.ExitOK,
			Stdout: []string{"usage: fairbench overlap [flags]", "-bucket-bytes size"},
		},
		usage("no command", nil, "fairbench: no command ("+commands+")", `run "fairbench help" for the commands`),
		usage("unknown command", a("bogus"), `unknown command "bogus" (`+commands),
		usage("a flag first", a("-backend sim"), `unknown command "-backend" (`+commands),
		usage("help of an unknown command", a("help bogus"), `unknown command "bogus" (`+commands),
		usage("help with an extra argument", a("help sweep extra"), `unexpected argument "extra"`),
		usage(
			"unknown flag",
			a("sweep -bogus"),
			"flag provided but not defined: -bogus",
			`run "fairbench sweep -h" for its flags`,
		),
		usage("a flag of another command", a("sweep -buckets 4"), "flag provided but not defined: -buckets"),
		usage("extra argument", a("sweep extra"), `unexpected argument "extra"`),
		usage("extra arguments after flags", a("report -in x.jsonl a b"), `unexpected arguments "a" "b"`),
		usage(
			"bad size",
			a("sweep -e 3X"),
			`invalid value "3X" for flag -e: not an integer with an optional K, M, G or T suffix`,
		),
		usage("sizes in the user's units", a("sweep -b 2M -e 1M"), "-e 1M: smaller than -b 2M"),
		usage(
			"sizes in the user's units, other spelling",
			a("sweep -b 2048KiB -e 1mb"),
			"-e 1mb: smaller than -b 2048KiB",
		),
		usage("zero size", a("sweep -b 0 -e 1K"), "-b 0: must be at least 1 byte"),
		usage("factor", a("sweep -b 1K -e 4K -f 1"), "-f 1: must be at least 2"),
		usage("no element", a("sweep -b 2 -e 2 -f 1 -dtype float64"), "-e 2: holds no float64 (8 bytes)"),
		usage("bucket holds no element", a("overlap -bucket-bytes 3"), "-bucket-bytes 3: holds no float32 (4 bytes)"),
		usage("no buckets", a("overlap -buckets 0"), "-buckets 0: must be at least 1"),
		usage(
			"dtype lists the types",
			a("sweep -dtype float8"),
			`invalid value "float8" for flag -dtype: not one of `+dtypes,
		),
		usage(
			"op lists the operators",
			a("sweep -op xor"),
			`invalid value "xor" for flag -op: not one of sum, avg, max, min, prod`,
		),
		usage(
			"backend lists the backends",
			a("sweep -backend tpu"),
			`invalid value "tpu" for flag -backend: not one of sim, cuda`,
		),
		usage(
			"algos lists the methods",
			a("sweep -algos flat,ring"),
			`"ring" is not one of flat, flat-ring, flat-tree, naive, fairgo`,
		),
		usage("empty algos", a("sweep -algos ,"), `no method (flat, flat-ring, flat-tree, naive, fairgo)`),
		usage(
			"fairgo algo lists the algorithms",
			a("sweep -fairgo x=algo:ring"),
			`algo ring: unknown (auto, flat, rail-a2a, rail-rsag, rail-allreduce`, // and hier's further ones
		),
		usage("fairgo slice as given", a("sweep -fairgo x=slice:1Q"), `slice 1Q: not an integer`),
		usage(
			"fairgo key",
			a("sweep -fairgo x=colour:red"),
			`unknown key "colour" (algo, slice, parallelism, flat, spin, inline, rail, check, routes)`,
		),
		usage("fairgo baseline name", a("sweep -fairgo flat"), `invalid value "flat" for flag -fairgo: needs a NAME`),
		usage(
			"fairgo baseline name with a spec",
			a("sweep -fairgo flat-ring=slice:1M"),
			`-fairgo flat-ring: a baseline's name`,
		),
		usage(
			"a variant of flat-tree's name",
			a("sweep -fairgo flat-tree=slice:1M"),
			`-fairgo flat-tree: a baseline's name`,
		),
		usage("fairgo parallelism", a("sweep -fairgo x=parallelism:0"), `parallelism 0: must be at least 1`),
		usage("fairgo twice", a("sweep -fairgo a -fairgo a"), `-fairgo a: two variants of one name`),
		usage(
			"link lists the links",
			a("links -link pcie"),
			`invalid value "pcie" for flag -link: not one of nvlink, net, or empty for both`,
		),
		usage("negative jitter", a("sweep -jitter -1ms"), "-jitter -1ms: negative"),
		usage("jitter as written", a("overlap -jitter -1500us"), "-jitter -1500us: negative"),
		usage("timeout as written", a("sweep -timeout -60s"), "-timeout -60s: must be positive"),
		usage("zero timeout as written", a("links -timeout 0m"), "-timeout 0m: must be positive"),
		usage(
			"not a duration",
			a("sweep -timeout 60"),
			`invalid value "60" for flag -timeout: not a duration (300ms, 1.5s, 2m, 1h)`,
		),
		usage("negative machines", a("sweep -machines -1"), "-machines -1: negative"),
		usage("no reps", a("sweep -reps 0"), "-reps 0: must be at least 1"),
		usage("no rounds", a("sweep -min-rounds 0"), "-min-rounds 0: not within 1–4096"),
		usage("negative rep bytes", a("sweep -rep-bytes -1M"), `invalid value "-1M" for flag -rep-bytes: negative`),
		usage("machine list", a("scale -machines-list 1,0"), `-machines-list 1,0: "0" is not a positive integer`),
		usage("no records", a("model"), `-in "": needs records`),
		usage("no records for targets", a("targets -in ,"), `-in ",": needs records`),
		usage("an unknown target set", a("targets -in x.jsonl -set S,V"), `"V" is not one of S, T, U, all`),
		usage("no training runs", a("targets -in x.jsonl -hook /nonexistent/resnet-*.json"),
			"-hook /nonexistent/resnet-*.json: no such file"),
		usage("no records for nodes", a("nodes -plot p"), `-in "": needs records`),
		usage("a NIC rate of nodes", a("nodes -in x.jsonl -nic-gbit 0"), `-nic-gbit 0: must be positive`),
		usage("model sizes as given", a("model -in x.jsonl -model-sizes 1M,2Q"), "-model-sizes 1M,2Q: not an integer"),
		usage(
			"model machines",
			a("model -in x.jsonl -model-machines 0"),
			`-model-machines 0: "0" is not a positive integer`,
		),
		usage("model devices", a("model -in x.jsonl -model-devices 0"), "-model-devices 0: must be at least 1"),
		usage("a NIC rate of model", a("model -in x.jsonl -nic-gbit -2.5"), "-nic-gbit -2.5: must be positive, or 0"),
	})
	// A failure (a file that is not there) is status 1, one message.
	for _, args := range [][]string{a("report -in /nonexistent/x.jsonl"),
		a("targets -in /nonexistent/x.jsonl -enqueue 6.5"),
		a("targets -in /nonexistent/x.jsonl -enqueue /nonexistent/enqueue.txt")} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, cli.ExitFailure, runFairbench(args, &stdout, &stderr), "%v", args)
		require.Equal(t, 1, strings.Count(stderr.String(), "fairbench: "), stderr.String())
		require.Contains(t, stderr.String(), "/nonexistent/x.jsonl")
		require.NotContains(t, stderr.String(), "run \"fairbench")
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
	require.NoError(
		t,
		fs.Parse(
			[]string{
				"-backend",
				"cuda",
				"-jitter",
				"1500us",
				"-b",
				"1M",
				"-check",
				"-run",
				"r2",
				"-fairgo",
				"a=slice:64M",
				"-fairgo",
				"b",
			},
		),
	)
	args := strings.Join(append(append(append(b.args(fs), s.args(fs)...), tf.args(fs)...), m.args(fs)...), " ")
	for _, want := range []string{"-backend=cuda", "-jitter=1500us", "-b=1M", "-check=true", "-run=r2",
		"-fairgo=a=slice:64M", "-fairgo=b"} {
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

// The nodes report: a curve per layout of the testbed's records, and the
// real cluster's prediction, drawn into -plot.
func TestNodes(t *testing.T) {
	dir := t.TempDir()
	var recs []bench.Record
	for _, m := range []int{2, 4} {
		for _, s := range []int64{1 << 20, 4 << 20} {
			for alg, us := range map[string]float64{"flat": 1000, "flat-ring": 900, "naive": 1100, "fairgo": 1000} {
				r := bench.Record{Kind: bench.KindSweep, Run: "r1", Backend: "cuda", Machines: m, Devices: 1,
					Processes: m, DType: "float32", Op: "sum", Algorithm: alg, Bytes: s, Iters: 1, TimeUS: us * float64(s>>20)}
				r.Testbed.NICGbit, r.Testbed.Machines, r.Testbed.MPS = 10, m, true
				if alg == "fairgo" {
					r.Fairgo = &bench.FairgoSetup{Algorithm: "auto", Chosen: "flat"}
				}
				recs = append(recs, r)
			}
		}
	}
	in := filepath.Join(dir, "nodes.jsonl")
	f, err := os.Create(in)
	require.NoError(t, err)
	require.NoError(t, bench.WriteJSONL(f, recs))
	require.NoError(t, f.Close())
	out := runCmd(t, "nodes", "-in", in, "-plot", filepath.Join(dir, "plots"), "-nvlink-gbps", "300")
	for _, want := range []string{"2×1 measured", "2×1 model", "4×1 measured", "4×1 model", "64×8 model, real links",
		"flat-ring", "0.90", "# plot: "} {
		require.Contains(t, out, want)
	}
	for _, ext := range []string{".png", ".svg"} {
		st, err := os.Stat(filepath.Join(dir, "plots", "nodes_fairgo_vs_best"+ext))
		require.NoError(t, err)
		require.Positive(t, st.Size())
	}
}

// -algos takes flat-tree: measured on the sim, checked, in the table.
func TestFlatTreeSweep(t *testing.T) {
	js := filepath.Join(t.TempDir(), "tree.jsonl")
	out := runCmd(t, "sweep", "-backend", "sim", "-machines", "3", "-devices", "2", "-algos", "fairgo,flat-tree",
		"-b", "4K", "-e", "64K", "-f", "4", "-w", "0", "-reps", "1", "-check", "-json", js)
	require.Contains(t, out, "- flat-tree -")
	recs, err := bench.ReadJSONLFiles([]string{js})
	require.NoError(t, err)
	require.Len(t, recs, 6)
	for i, r := range recs {
		require.Equal(t, []string{"flat-tree", "fairgo"}[i%2], r.Algorithm)
		require.Zero(t, r.Wrong)
	}
}

// TestRecordings: -cpuprofile and -trace write a Go CPU profile and an
// execution trace of the sweep, named for the rank when the process is one
// rank of a launched job.
func TestRecordings(t *testing.T) {
	dir := t.TempDir()
	prof, tr := filepath.Join(dir, "sweep.prof"), filepath.Join(dir, "sweep.trace")
	runCmd(t, "sweep", "-backend", "sim", "-machines", "2", "-devices", "2", "-algos", "fairgo",
		"-b", "64K", "-e", "64K", "-w", "0", "-reps", "1", "-cpuprofile", prof, "-trace", tr)
	for _, f := range []string{prof, tr} {
		st, err := os.Stat(f)
		require.NoError(t, err)
		require.Positive(t, st.Size(), f)
	}
	b, err := os.ReadFile(tr)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(b), "go 1."), "not a Go execution trace: %.20q", b)

	stop, err := startRecording(prof, "3", pprof.StartCPUProfile, pprof.StopCPUProfile)
	require.NoError(t, err)
	require.NoError(t, stop())
	_, err = os.Stat(prof + ".rank3")
	require.NoError(t, err)

	_, err = startRecording(filepath.Join(dir, "missing", "x.prof"), "", pprof.StartCPUProfile, pprof.StopCPUProfile)
	require.Error(t, err)
}
