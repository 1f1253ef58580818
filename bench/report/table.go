// Package report turns benchmark records (package bench) into what people
// read: nccl-tests-like tables, a digest, CSV, plots, the cost model's
// errors and predictions, fairgo against the best baseline across node
// counts (NodeCurves, NodesPlot), and the targets (T1–T8, U1–U7, S1–S8).
// Every "best" is the fastest baseline measured at a point
// (bench.Baselines). It measures nothing; bench does.
package report

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/fairgo/fairgo/bench"
	"github.com/fairgo/fairgo/hier"
)

// Table prints a run as an nccl-tests-like table: a commented header, then
// one line per point with time, ±%, algbw, busbw and #wrong for each
// method, the NIC-bound ideal busbw, and for each fairgo variant its ratios
// to flat, to the best baseline (flat, flat-ring, flat-tree, naive) and to
// the ideal.
// It implements bench.Observer.
type Table struct {
	w        io.Writer
	methods  []string // column order
	variants []string // the fairgo variants among methods
	err      error
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
	lead      = "%10s %11s %9s %5s"
	methCols  = "  %10s %5s %7s %7s %6s"
	methHead  = "  %-39s"
	idealCol  = " %7s"
	ratioCols = " %12s"
)

// Start prints the run's description and the column headers.
func (t *Table) Start(h bench.Header) {
	cfg, info := h.Config, h.Testbed
	t.methods, t.variants = nil, nil
	for _, m := range cfg.Methods {
		t.methods = append(t.methods, m.Name)
		if m.Variant != nil {
			t.variants = append(t.variants, m.Name)
		}
	}
	mode := "sweep"
	switch {
	case cfg.Buckets > 0:
		mode = fmt.Sprintf(
			"overlap: %d buckets of %s enqueued back to back",
			cfg.Buckets,
			bench.FormatSize(cfg.BucketBytes),
		)
	case cfg.Kind == bench.KindLink:
		mode = "links: 2-rank allreduce over " + cfg.Link
	}
	t.printf("# fairbench %s\n", mode)
	if cfg.Run != "" || cfg.Label != "" {
		t.printf("# run %q, label %q\n", cfg.Run, cfg.Label)
	}
	t.printf("# backend %s, timing: %s\n", info.Backend, info.Timing)
	if info.SimTimings {
		t.printf("# NOTE: sim timings are not GPU timings; they only show the harness works\n")
	}
	t.printf("# NCCL version %s\n", orNone(info.NCCLVersion))
	t.printf("# GPUs (this process): %s\n", summarizeGPUs(info.GPUs))
	t.printf("# grid %d×%d (M machines × D devices) = %d ranks, %d process(es), host %s\n",
		info.Machines, info.Devices, info.World(), info.Processes, info.Host)
	t.printf("# testbed: %v; %v\n", info.Emulation, info.Placement)
	if line := bench.SetupOf(info).IntraLine(); line != "" {
		t.printf("# %s\n", line)
	}
	if why := info.Invalid(); why != "" {
		t.invalidBanner(why)
	}
	for i, fs := range h.Fairgo {
		t.printf("# fairgo variant %s: %s\n", t.variants[i], describeFairgo(fs))
	}
	t.printf("# NCCL env: %s\n", orNone(strings.Join(info.NCCLEnv, " ")))
	check := "off"
	if cfg.Check {
		check = fmt.Sprintf("on (seed %d, float64 reference)", cfg.Seed)
	}
	t.printf(
		"# %s %s, warm-up %d, iters %d, reps %d, check %s\n",
		cfg.DType,
		cfg.Op,
		cfg.Warmup,
		cfg.Iters,
		cfg.Reps,
		check,
	)
	t.printf(
		"# time: median over reps of the mean over ranks of %d call(s) back to back, "+
			"per call (of one round in overlap); ±%%: (max−min)/median over reps\n",
		cfg.Iters,
	)
	t.printf("# busbw = algbw·2(n−1)/n; ideal: the NIC-bound busbw (one NIC of rate B per machine: " +
		"t = 2(M−1)/M·S/B)\n")
	t.printf(
		"# v/flat = time(flat)/time(v); v/best = time(min(flat, flat-ring, flat-tree, naive))/time(v); " +
			"v/ideal = busbw(v)/ideal: above 1, v is faster\n",
	)
	t.printf("#\n")
	t.columnHeads()
}

// invalidBanner says loudly that the run's timings mean nothing.
func (t *Table) invalidBanner(why string) {
	bar := strings.Repeat("!", 100)
	t.printf(
		"# %s\n# INVALID TESTBED: %s.\n# Every time below is an artefact of GPU time-slicing; "+
			"run under MPS (fairrun --mps on).\n# %s\n",
		bar,
		why,
		bar,
	)
}

func (t *Table) columnHeads() {
	t.printf("#%s", strings.Repeat(" ", 38))
	for _, m := range t.methods {
		name := " " + m + " "
		left := max(39-len(name), 0) / 2
		t.printf(methHead, strings.Repeat("-", left)+name+strings.Repeat("-", max(39-left-len(name), 0)))
	}
	t.printf("\n")
	t.printf("#%9s %11s %9s %5s", "size", "count", "type", "op")
	for range t.methods {
		t.printf(methCols, "time(us)", "±%", "algbw", "busbw", "#wrong")
	}
	t.printf(idealCol, "ideal")
	for _, v := range t.variants {
		for _, x := range []string{"flat", "best", "ideal"} {
			t.printf(ratioCols, v+"/"+x)
		}
	}
	t.printf("\n")
}

// Point prints the records of one point (one per method, in the header's
// order); it implements bench.Observer.
func (t *Table) Point(recs []bench.Record) {
	if len(recs) == 0 {
		return
	}
	if t.methods == nil {
		for _, r := range recs {
			t.methods = append(t.methods, r.Algorithm)
			if r.Fairgo != nil {
				t.variants = append(t.variants, r.Algorithm)
			}
		}
	}
	r0 := recs[0]
	size, count := bench.FormatSize(r0.Bytes), fmt.Sprint(r0.Count)
	if r0.Kind == bench.KindOverlap {
		size = fmt.Sprintf("%d×%s", r0.Buckets, size)
		count = fmt.Sprintf("%d×%d", r0.Buckets, r0.Count)
	}
	t.printf(lead, size, count, r0.DType, r0.Op)
	p := pointOf(recs)
	for _, m := range t.methods {
		r, ok := p[m]
		if !ok {
			t.printf(methCols, "-", "-", "-", "-", "-")
			continue
		}
		wrong := "-"
		if r.Wrong >= 0 {
			wrong = fmt.Sprint(r.Wrong)
		}
		t.printf(methCols, fmtTime(r.TimeUS), fmtPct(spread(r)), fmtBW(r.AlgBW), fmtBW(r.BusBW), wrong)
	}
	ideal := "-"
	if r0.IdealBusBW > 0 {
		ideal = fmtBW(r0.IdealBusBW)
	}
	t.printf(idealCol, ideal)
	for _, v := range t.variants {
		for _, x := range []float64{p.vsFlat(v), p.vsBest(v), p.vsIdeal(v)} {
			t.printf(ratioCols, fmtRatio(x))
		}
	}
	if r0.Invalid != "" {
		t.printf("  INVALID")
	}
	t.printf("\n")
}

// Footer prints a closing comment line.
func (t *Table) Footer(format string, args ...any) {
	t.printf("# "+format+"\n", args...)
}

// point is the records of one point by method.
type point map[string]bench.Record

func pointOf(recs []bench.Record) point {
	p := point{}
	for _, r := range recs {
		p[r.Algorithm] = r
	}
	return p
}

// ratio is time(other)/time(v), NaN when either is missing.
func (p point) ratio(v string, other float64) float64 {
	r, ok := p[v]
	if !ok || r.TimeUS <= 0 || other <= 0 || math.IsNaN(other) {
		return math.NaN()
	}
	return other / r.TimeUS
}

func (p point) time(m string) float64 {
	if r, ok := p[m]; ok && r.TimeUS > 0 {
		return r.TimeUS
	}
	return math.NaN()
}

// vsFlat is time(flat)/time(v).
func (p point) vsFlat(v string) float64 { return p.ratio(v, p.time(bench.Flat)) }

// vsBest is time(best)/time(v), best the fastest of the baselines
// measured (bench.Baselines): fairgo against the best a user gets
// without it. Records from before flat-ring and flat-tree have flat and
// naive only, and those from before flat-tree flat-ring too.
func (p point) vsBest(v string) float64 {
	_, best := p.best()
	return p.ratio(v, best)
}

// best is the fastest baseline measured at the point and its time; "" and
// NaN without one.
func (p point) best() (string, float64) {
	name, best := "", math.NaN()
	for _, b := range bench.Baselines {
		if t := p.time(b); !math.IsNaN(t) && (math.IsNaN(best) || t < best) {
			name, best = b, t
		}
	}
	return name, best
}

// vsIdeal is busbw(v)/ideal busbw.
func (p point) vsIdeal(v string) float64 {
	r, ok := p[v]
	if !ok || r.IdealBusBW <= 0 {
		return math.NaN()
	}
	return r.BusBW / r.IdealBusBW
}

func describeFairgo(fs bench.FairgoSetup) string {
	ft := bench.FormatSize(fs.FlatThreshold)
	if fs.FlatThreshold == hier.FlatNever {
		ft = "never"
	}
	spec := fs.Spec
	if spec == "" {
		spec = "defaults"
	}
	return fmt.Sprintf("%s: algorithm %s, slice %s, parallelism %d, flat threshold %s; choices %s",
		spec, fs.Algorithm, bench.FormatSize(fs.SliceBytes), fs.Parallelism, ft, describeChoices(fs.Choices))
}

func describeChoices(cs []bench.Choice) string {
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s+ %s", bench.FormatSize(c.MinBytes), c.Algorithm))
	}
	return orNone(strings.Join(parts, ", "))
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func spread(r bench.Record) float64 {
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

func fmtRatio(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	return fmt.Sprintf("%.2f", x)
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
