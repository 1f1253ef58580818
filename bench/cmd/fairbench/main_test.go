package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fairgo/fairgo/bench"
)

// rows returns the table's data lines, split into fields.
func rows(t *testing.T, out string) [][]string {
	t.Helper()
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("fairbench %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// TestAcceptanceSweep is issue 5's CI command:
//
//	go run ./bench/cmd/fairbench -backend sim -machines 2 -devices 4 -b 1K -e 4M -f 4 -check
func TestAcceptanceSweep(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "out.jsonl")
	out := runCmd(t, "-backend", "sim", "-machines", "2", "-devices", "4", "-b", "1K", "-e", "4M", "-f", "4", "-check", "-json", js)
	if !strings.Contains(out, "not GPU timings") {
		t.Error("the sim table does not say its timings are not GPU timings")
	}
	rs := rows(t, out)
	if len(rs) != 7 { // 1K 4K 16K 64K 256K 1M 4M
		t.Fatalf("%d rows, want 7:\n%s", len(rs), out)
	}
	for _, r := range rs {
		if len(r) != 22 {
			t.Fatalf("row with %d fields: %v", len(r), r)
		}
		for _, col := range []int{9, 14, 19} { // #wrong of flat, naive, fairgo
			if r[col] != "0" {
				t.Errorf("size %s: #wrong column %d is %s, want 0\n%s", r[0], col, r[col], out)
			}
		}
	}
	recs, err := bench.ReadJSONLFiles([]string{js})
	if err != nil || len(recs) != 21 {
		t.Fatalf("JSON: %d records, %v", len(recs), err)
	}
	for _, r := range recs {
		if r.Wrong != 0 || r.Machines != 2 || r.Devices != 4 || !r.SimTimings || r.TimeUS <= 0 {
			t.Errorf("record %+v", r)
		}
	}
}

func TestOverlapScaleLinksModelAndPlots(t *testing.T) {
	if testing.Short() {
		t.Skip("several sim runs")
	}
	dir := t.TempDir()
	// Overlap with every parallelism setting, checked.
	ov := filepath.Join(dir, "overlap.jsonl")
	out := runCmd(t, "-mode", "overlap", "-machines", "2", "-devices", "2", "-buckets", "4", "-bucket-bytes", "64K",
		"-parallelism", "1,2", "-w", "1", "-n", "1", "-reps", "2", "-check", "-json", ov, "-csv", filepath.Join(dir, "o.csv"))
	rs := rows(t, out)
	if len(rs) != 2 {
		t.Fatalf("overlap: %d rows, want 2:\n%s", len(rs), out)
	}
	for _, r := range rs {
		if r[0] != "4×64K" || r[9] != "0" || r[14] != "0" || r[19] != "0" {
			t.Errorf("overlap row %v", r)
		}
	}
	// Scale over 1, 2 and 4 machines, in process on sim.
	sc := filepath.Join(dir, "scale.jsonl")
	out = runCmd(t, "-mode", "scale", "-machines-list", "1,2,4", "-devices", "2", "-b", "16K", "-e", "64K", "-f", "4",
		"-w", "0", "-n", "1", "-reps", "1", "-json", sc, "-plot", filepath.Join(dir, "plots"))
	if !strings.Contains(out, "scale summary") {
		t.Errorf("no scale summary:\n%s", out)
	}
	// Links, then the model over everything.
	ln := filepath.Join(dir, "links.jsonl")
	out = runCmd(t, "-mode", "links", "-b", "4K", "-e", "256K", "-f", "4", "-w", "0", "-n", "2", "-reps", "1", "-json", ln)
	if !strings.Contains(out, "# link nvlink:") || !strings.Contains(out, "# link net:") {
		t.Errorf("links output lacks the fits:\n%s", out)
	}
	out = runCmd(t, "-mode", "model", "-backend", "sim", "-in", strings.Join([]string{ln, sc, ov}, ","), "-model-machines", "1,8,1024")
	for _, want := range []string{"error against", "predictions for D = 8", "where fairgo wins", "median |error|"} {
		if !strings.Contains(out, want) {
			t.Errorf("model output lacks %q:\n%s", want, out)
		}
	}
	for _, f := range []string{"speedup_2gpus_float32.png", "speedup_2gpus_float32.svg", "busbw_4x2_float32.png"} {
		if st, err := os.Stat(filepath.Join(dir, "plots", f)); err != nil || st.Size() == 0 {
			t.Errorf("plot %s: %v", f, err)
		}
	}
}

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-mode", "bogus"}, {"-b", "1Q"}, {"-dtype", "float7"}, {"-op", "xor"}, {"-algos", "ring"},
		{"-parallelism", "0"}, {"-link", "pcie"}, {"-backend", "tpu"}, {"-b", "8M", "-e", "1M"},
		{"-mode", "model"}, {"extra"},
	} {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), args, &stdout, &stderr); err == nil {
			t.Errorf("fairbench %v: no error", args)
		}
	}
}

func TestWorkerArgs(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseFlags([]string{"-mode", "scale", "-backend", "cuda", "-b", "1M", "-check", "-json", "x", "-machines-list", "1,2", "-model-devices", "4"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(o.workerArgs("sweep"), " ")
	for _, want := range []string{"-mode sweep", "-backend cuda", "-b=1M", "-check=true"} {
		if !strings.Contains(args, want) {
			t.Errorf("worker args %q lack %q", args, want)
		}
	}
	for _, bad := range []string{"-json", "machines-list", "model-devices", "scale"} {
		if strings.Contains(args, bad) {
			t.Errorf("worker args %q carry %q", args, bad)
		}
	}
}
