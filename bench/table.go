package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/fairgo/fairgo/hier"
)

// Table prints records as an nccl-tests-like table: a commented header,
// then one line per size (or per parallelism setting in overlap mode) with
// time, algbw, busbw and #wrong for each algorithm, and fairgo's speedups.
type Table struct {
	w    io.Writer
	algs []Algorithm
	err  error
}

// NewTable prints to w.
func NewTable(w io.Writer) *Table { return &Table{w: w} }

// Err is the first write error.
func (t *Table) Err() error { return t.err }

func (t *Table) printf(format string, args ...any) {
	if t.err == nil {
		_, t.err = fmt.Fprintf(t.w, format, args...)
	}
}

const (
	lead    = "%10s %11s %9s %5s %4s"
	algCols = "  %10s %5s %7s %7s %6s"
	algHead = "  %-39s"
)

// Header prints the run's description; red is one of the Reducers, for the
// options the defaults resolved to.
func (t *Table) Header(info Info, cfg Config, red *hier.Reducer) {
	t.algs = cfg.Algorithms
	mode := "sweep"
	if cfg.Buckets > 0 {
		mode = fmt.Sprintf("overlap: %d buckets of %s enqueued back to back", cfg.Buckets, FormatSize(cfg.BucketBytes))
	}
	if cfg.Kind == KindLink {
		mode = "links: 2-rank allreduce over " + cfg.Link
	}
	t.printf("# fairbench %s\n", mode)
	t.printf("# backend %s, timing: %s\n", info.Backend, info.Timing)
	if info.SimTimings {
		t.printf("# NOTE: sim timings are not GPU timings; they only show the harness works\n")
	}
	ver := info.NCCLVersion
	if ver == "" {
		ver = "none"
	}
	t.printf("# NCCL version %s\n", ver)
	t.printf("# GPUs (this process): %s\n", summarizeGPUs(info.GPUs))
	t.printf("# grid %d×%d (M machines × D devices) = %d ranks, %d process(es), host %s\n",
		info.Machines, info.Devices, info.World(), info.Processes, info.Host)
	if red != nil {
		ft := FormatSize(red.FlatThreshold())
		if red.FlatThreshold() == hier.FlatNever {
			ft = "never"
		}
		pars := make([]string, len(cfg.Parallelism))
		for i, p := range cfg.Parallelism {
			pars[i] = fmt.Sprint(resolvedPar(p))
		}
		t.printf("# fairgo: slice %s, parallelism %s, flat threshold %s\n", FormatSize(red.SliceBytes()), strings.Join(pars, ","), ft)
	}
	env := NCCLEnv()
	if len(env) == 0 {
		env = []string{"(none)"}
	}
	t.printf("# NCCL env: %s\n", strings.Join(env, " "))
	check := "off"
	if cfg.Check {
		check = fmt.Sprintf("on (seed %d, float64 reference)", cfg.Seed)
	}
	t.printf("# %s %s, warm-up %d, iters %d, reps %d, check %s\n", cfg.DType, cfg.Op, cfg.Warmup, cfg.Iters, cfg.Reps, check)
	t.printf("# time: median over reps of the mean over ranks of one call (of one round in overlap); ±%%: (max−min)/median over reps\n")
	t.printf("# busbw = algbw·2(n−1)/n; fairgo/x = time(x)/time(fairgo): above 1, fairgo is faster\n")
	t.printf("#\n")
	t.printf("#%s", strings.Repeat(" ", 43))
	for _, a := range t.algs {
		name := " " + a.String() + " "
		left := (39 - len(name)) / 2
		t.printf(algHead, strings.Repeat("-", left)+name+strings.Repeat("-", 39-left-len(name)))
	}
	t.printf("\n")
	t.printf("#%9s %11s %9s %5s %4s", "size", "count", "type", "op", "par")
	for range t.algs {
		t.printf(algCols, "time(us)", "±%", "algbw", "busbw", "#wrong")
	}
	for _, a := range t.ratioAlgs() {
		t.printf(" %12s", "fairgo/"+a.String())
	}
	t.printf("\n")
}

// ratioAlgs are the algorithms fairgo is compared with (when fairgo runs).
func (t *Table) ratioAlgs() []Algorithm {
	if !slices.Contains(t.algs, Fairgo) {
		return nil
	}
	var out []Algorithm
	for _, a := range t.algs {
		if a != Fairgo {
			out = append(out, a)
		}
	}
	return out
}

// Row prints the records of one point (one per algorithm, in the header's
// order).
func (t *Table) Row(recs []Record) {
	if len(recs) == 0 {
		return
	}
	if t.algs == nil {
		for _, r := range recs {
			for _, a := range Algorithms {
				if a.String() == r.Algorithm {
					t.algs = append(t.algs, a)
				}
			}
		}
	}
	r0 := recs[0]
	size := FormatSize(r0.Bytes)
	count := fmt.Sprint(r0.Count)
	if r0.Kind == KindOverlap {
		size = fmt.Sprintf("%d×%s", r0.Buckets, size)
		count = fmt.Sprintf("%d×%d", r0.Buckets, r0.Count)
	}
	t.printf(lead, size, count, r0.DType, r0.Op, fmt.Sprint(r0.Parallelism))
	byAlg := map[string]Record{}
	for _, r := range recs {
		byAlg[r.Algorithm] = r
	}
	for _, a := range t.algs {
		r, ok := byAlg[a.String()]
		if !ok {
			t.printf(algCols, "-", "-", "-", "-", "-")
			continue
		}
		wrong := "-"
		if r.Wrong >= 0 {
			wrong = fmt.Sprint(r.Wrong)
		}
		t.printf(algCols, fmtTime(r.TimeUS), fmtPct(spread(r)), fmtBW(r.AlgBW), fmtBW(r.BusBW), wrong)
	}
	if f, ok := byAlg[Fairgo.String()]; ok {
		for _, a := range t.ratioAlgs() {
			x, ok := byAlg[a.String()]
			if !ok || f.TimeUS <= 0 {
				t.printf(" %12s", "-")
				continue
			}
			t.printf(" %12.2f", x.TimeUS/f.TimeUS)
		}
	}
	t.printf("\n")
}

// Footer prints a closing comment line.
func (t *Table) Footer(format string, args ...any) {
	t.printf("# "+format+"\n", args...)
}

func spread(r Record) float64 {
	if r.TimeUS <= 0 {
		return math.NaN()
	}
	return (r.MaxUS - r.MinUS) / r.TimeUS * 100
}

func fmtTime(us float64) string {
	switch {
	case math.IsNaN(us):
		return "-"
	case us >= 1e6:
		return fmt.Sprintf("%.4g", us)
	case us >= 100:
		return fmt.Sprintf("%.1f", us)
	}
	return fmt.Sprintf("%.2f", us)
}

func fmtPct(p float64) string {
	if math.IsNaN(p) {
		return "-"
	}
	return fmt.Sprintf("%.0f", p)
}

func fmtBW(bw float64) string {
	if bw >= 100 {
		return fmt.Sprintf("%.1f", bw)
	}
	return fmt.Sprintf("%.2f", bw)
}

func summarizeGPUs(gpus []string) string {
	if len(gpus) == 0 {
		return "none"
	}
	if len(gpus) > 4 {
		return fmt.Sprintf("%d: %s, %s, …, %s", len(gpus), gpus[0], gpus[1], gpus[len(gpus)-1])
	}
	return fmt.Sprintf("%d: %s", len(gpus), strings.Join(gpus, ", "))
}
