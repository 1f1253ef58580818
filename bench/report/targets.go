package report

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/fairgo/fairgo/bench"
	"github.com/fairgo/fairgo/bench/model"
	"github.com/fairgo/fairgo/internal/harness"
)

// Target is one of fairgo's performance targets (T1–T8 on NVLink, U1–U7
// on the one-GPU testbed, S1–S8 across node counts), measured on a run's
// records.
type Target struct {
	ID   string `json:"id"`
	What string `json:"what"`
	// Measured is the worst case over the target's points in the first
	// run (nil: no point measured), and Where says where it occurred: the
	// layout, size and, for the S targets, the testbed.
	Measured *float64 `json:"measured"`
	Where    string   `json:"where,omitempty"`
	Target   string   `json:"target"` // e.g. "≥ 0.97"
	Pass     bool     `json:"pass"`
	// Status is StatusPass, StatusFail, StatusIncomplete (no point fails,
	// but a part the target needs has no record) or StatusNotMeasured (no
	// point at all): a target without records never reads as passed.
	Status  string   `json:"status"`
	Points  int      `json:"points"`            // points compared in the first run
	Missing []string `json:"missing,omitempty"` // what the target needs and the records lack
	// Runs is the worst case of every run, by run label.
	Runs map[string]*float64 `json:"runs,omitempty"`
	// Repeat, for the S targets, is the largest |second/first − 1| over the
	// points measured in both of the first two runs, and RepeatWhere that
	// point; nil without a second run. An S target is met only when a
	// second run reproduces every point within repeatTolerance.
	Repeat      *float64 `json:"repeat,omitempty"`
	RepeatWhere string   `json:"repeat_where,omitempty"`
	Command     []string `json:"command"` // the commands that measured the points
}

// The states of a target.
const (
	StatusPass        = "pass"
	StatusFail        = "fail"
	StatusIncomplete  = "incomplete"
	StatusNotMeasured = "not measured"
)

// The sets of targets Targets computes (TargetOptions.Sets): T1–T8 on
// NVLink, U1–U7 on one GPU, and S1–S8 across node counts with T6 (the
// enqueue time belongs to both T and S).
const (
	SetT = "T"
	SetU = "U"
	SetS = "S"
)

// TargetSets are every set, in the order their targets are listed.
var TargetSets = []string{SetS, SetT, SetU}

// TargetOptions steer Targets.
type TargetOptions struct {
	Variant string // the fairgo variant the targets are about; "" is bench.DefaultVariant
	// Sets are the sets of targets to compute (SetS, SetT, SetU); nil:
	// every set.
	Sets       []string
	Enqueue    *Enqueue  // T6's input; nil: not measured
	Hooks      []HookRun // S7's input; nil: not measured
	IncludeSim bool      // count sim records (tests); their times are not GPU times
	// Intra and Net replace T7's fitted links when their bandwidth is set.
	Intra, Net model.Link
}

// Enqueue is T6's input: the host time to enqueue one AllReduce with the
// cross-rank check on, from a Go benchmark (hier's BenchmarkGPUEnqueue),
// for a flat call and for one hierarchical slice (a rail route): the
// slowest benchmark of each.
type Enqueue struct {
	Micros float64 // a flat call
	Where  string
	// SliceMicros is one hierarchical slice's, 0 where no benchmark of a
	// rail route was read.
	SliceMicros float64
	SliceWhere  string
}

// The bounds of T6, µs per call.
const (
	enqueueFlatUS  = 10
	enqueueSliceUS = 20
)

// The size ranges of the targets.
const (
	kib = int64(1) << 10
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// sample is one ratio a target compares: its key matches the same point in
// another run (T8). ok says whether the point alone meets the target, and
// margin is the value over the threshold it is held to (the worst sample
// has the smallest: a target's parts may have thresholds of their own).
type sample struct {
	key, where string
	detail     string // where's parenthesis: the times the ratio came from
	setup      string // the testbed, where the target names it
	value      float64
	ok         bool
	margin     float64
	command    string
}

// requirement is one part of a target: the records it takes and the
// ratio it computes at each of their points.
type requirement struct {
	name  string
	keep  func(bench.Record) bool
	ratio func(p point, v string) float64
	// threshold is this part's, where it differs from the target's (0:
	// the target's).
	threshold float64
	// slack, if set, lets a point that misses the threshold pass anyway
	// (S1: at most 5 µs per call slower than the best).
	slack func(p point, v string) bool
	// detail, if set, adds to where the point is (the times compared).
	detail func(p point, v string) string
}

// targetDef defines a target over one run's records.
type targetDef struct {
	id, what, target string
	set              string // SetT, SetU or SetS
	atLeast          bool   // the worst case is the smallest (else the largest)
	threshold        float64
	parts            []requirement
	// some: a part is met when its best point meets it (S5: a gain at
	// some size), so each part gives one sample, its best point.
	some bool
	// testbed: where says the testbed of the point (layouts of several
	// testbeds meet in one target).
	testbed bool
}

func sweepOn(m, d int, testbed bool, dtypes []string, lo, hi int64, iters func(int) bool) func(bench.Record) bool {
	return func(r bench.Record) bool {
		onTestbed := r.Testbed.NICGbit > 0
		inProcess := !onTestbed && r.Processes == 1
		return r.Kind == bench.KindSweep && r.Machines == m && r.Devices == d &&
			onTestbed == testbed && (testbed || inProcess) &&
			slices.Contains(dtypes, r.DType) &&
			r.Bytes >= lo &&
			r.Bytes <= hi &&
			iters(r.Iters)
	}
}

func anyIters(int) bool { return true }

// NoCheckVariant is the fairgo variant with the cross-rank check off that
// U5 compares the default variant with (-fairgo nocheck=check:off,routes:fairgo:
// the same routes, hier.WithRoutesOf, so that the ratio is the check's cost
// alone, not two calibrations' difference).
const NoCheckVariant = "nocheck"

// oneGPU keeps the sweeps of the one-GPU testbed: M × D emulated
// machines with NICs of gbit Gbit/s, the intra-machine link loopback
// wherever a machine has several ranks.
func oneGPU(m, d int, gbit float64, lo, hi int64, iters func(int) bool) func(bench.Record) bool {
	on := sweepOn(m, d, true, []string{"float32"}, lo, hi, iters)
	return func(r bench.Record) bool {
		return on(r) && r.Testbed.NICGbit == gbit && (d == 1 || r.Testbed.Intra == harness.IntraLoopback)
	}
}

// notLoopback keeps records whose intra-machine link is not the one-GPU
// testbed's loopback (real NVLink, or one rank per machine).
func notLoopback(keep func(bench.Record) bool) func(bench.Record) bool {
	return func(r bench.Record) bool { return keep(r) && r.Testbed.Intra != harness.IntraLoopback }
}

// vsNoCheck is time(nocheck)/time(v): what the check costs v.
func vsNoCheck(p point, v string) float64 { return p.ratio(v, p.time(NoCheckVariant)) }

// vsFastestFairgo is time(fastest fairgo variant with the check on)/time(v):
// how close Auto's choice came to the best route measured at the point.
func vsFastestFairgo(p point, v string) float64 {
	best := math.NaN()
	for name, r := range p {
		if r.Fairgo == nil || name == NoCheckVariant || strings.Contains(r.Fairgo.Spec, "check:off") {
			continue
		}
		if t := r.TimeUS; t > 0 && (math.IsNaN(best) || t < best) {
			best = t
		}
	}
	return p.ratio(v, best)
}

// vsNaive is time(naive)/time(v).
func vsNaive(p point, v string) float64 { return p.ratio(v, p.time(bench.Naive)) }

func vsBest(p point, v string) float64  { return p.vsBest(v) }
func vsIdeal(p point, v string) float64 { return p.vsIdeal(v) }

// oneGPULayout is a layout of the one-GPU testbed: m machines of d
// ranks with NICs of gbit Gbit/s.
type oneGPULayout struct {
	m, d int
	gbit float64
}

// The one-GPU testbed's layouts: several ranks per machine at 2.5 Gbit/s, one per
// machine at 10 Gbit/s.
var (
	sharedLayouts = []oneGPULayout{{2, 2, 2.5}, {2, 4, 2.5}, {4, 2, 2.5}}
	singleLayouts = []oneGPULayout{{2, 1, 10}, {4, 1, 10}, {8, 1, 10}}
)

// callPatterns are the ways a sweep calls: one call at a time, and 20
// back to back.
var callPatterns = []struct {
	name string
	ok   func(iters int) bool
}{
	{"one call at a time", func(n int) bool { return n == 1 }},
	{"20 back to back", func(n int) bool { return n >= 20 }},
}

// String names the layout in requirements: "2×2 at 2.5 Gbit/s".
func (l oneGPULayout) String() string { return fmt.Sprintf("%d×%d at %g Gbit/s", l.m, l.d, l.gbit) }

// sweeps keeps the layout's sweeps of sizes lo–hi whose call count iters
// accepts.
func (l oneGPULayout) sweeps(lo, hi int64, iters func(int) bool) func(bench.Record) bool {
	return oneGPU(l.m, l.d, l.gbit, lo, hi, iters)
}

// smallest is the smallest size U5 and U6 look at: 256K with one rank per
// machine, else 1M.
func (l oneGPULayout) smallest() int64 {
	if l.d == 1 {
		return 256 * kib
	}
	return mib
}

// layoutParts is one requirement per layout of ls: its sweeps of sizes
// lo–hi, compared by ratio.
func layoutParts(ls []oneGPULayout, lo, hi int64, ratio func(point, string) float64) []requirement {
	var out []requirement
	for _, l := range ls {
		out = append(out, requirement{name: l.String(), keep: l.sweeps(lo, hi, anyIters), ratio: ratio})
	}
	return out
}

// u5Parts are U5's requirements: every layout, one call at a time and 20
// back to back, the check's cost.
func u5Parts() []requirement {
	var out []requirement
	for _, l := range append(slices.Clone(sharedLayouts), singleLayouts...) {
		for _, it := range callPatterns {
			out = append(
				out,
				requirement{
					name:  l.String() + ", " + it.name,
					keep:  l.sweeps(l.smallest(), 256*mib, it.ok),
					ratio: vsNoCheck,
				},
			)
		}
	}
	return out
}

// u6Parts are U6's requirements: every layout, Auto's choice against the
// fastest fairgo variant.
func u6Parts() []requirement {
	var out []requirement
	for _, l := range append(slices.Clone(sharedLayouts), singleLayouts...) {
		out = append(
			out,
			requirement{name: l.String(), keep: l.sweeps(l.smallest(), 256*mib, anyIters), ratio: vsFastestFairgo},
		)
	}
	return out
}

// u7Parts are U7's requirements: 64 buckets of 25 MiB back to back on the
// first two layouts of several ranks per machine.
func u7Parts() []requirement {
	var out []requirement
	for _, l := range sharedLayouts[:2] {
		out = append(out, requirement{name: l.String() + ", 64×25M", keep: func(r bench.Record) bool {
			return r.Kind == bench.KindOverlap && r.Machines == l.m && r.Devices == l.d &&
				r.Testbed.NICGbit == l.gbit &&
				r.Testbed.Intra == harness.IntraLoopback &&
				r.Buckets == 64 &&
				r.Bytes == 25*mib
		}, ratio: vsBest})
	}
	return out
}

// oneGPUDefs are the U targets, on the one-GPU testbed: several ranks
// per machine at 2.5 Gbit/s (2 × 2, 2 × 4, 4 × 2), one per machine at 10
// Gbit/s (2 × 1, 4 × 1, 8 × 1).
func oneGPUDefs() []targetDef {
	return []targetDef{
		{id: "U1", what: "one GPU, 2 × 2, 2 × 4, 4 × 2 at 2.5 Gbit/s: fairgo/naive at 64M–256M",
			target: "≥ 1.05", atLeast: true, threshold: 1.05, parts: layoutParts(sharedLayouts, 64*mib, 256*mib, vsNaive)},
		{
			id: "U2",
			what: "one GPU, 2 × 2, 2 × 4, 4 × 2 at 2.5 Gbit/s: fairgo / best (flat, flat ring, flat tree, " +
				"naive) at every size 1M–256M",
			target:    "≥ 0.97",
			atLeast:   true,
			threshold: 0.97,
			parts:     layoutParts(sharedLayouts, mib, 256*mib, vsBest),
		},
		{id: "U3", what: "one GPU, 2 × 2, 2 × 4, 4 × 2 at 2.5 Gbit/s: fairgo busbw / NIC-bound ideal at 64M–256M",
			target: "≥ 0.90", atLeast: true, threshold: 0.90, parts: layoutParts(sharedLayouts, 64*mib, 256*mib, vsIdeal)},
		{
			id: "U4",
			what: "one GPU, 2 × 1, 4 × 1, 8 × 1 at 10 Gbit/s: fairgo / best (flat, flat ring, flat tree, " +
				"naive) at every size 256K–256M",
			target:    "≥ 0.97",
			atLeast:   true,
			threshold: 0.97,
			parts:     layoutParts(singleLayouts, 256*kib, 256*mib, vsBest),
		},
		{
			id: "U5",
			what: "all of U1–U4's layouts: fairgo with the check / without it on the same routes " +
				"(-fairgo nocheck=check:off,routes:fairgo), " +
				"one call at a time and 20 back to back",
			target:    "≥ 0.98",
			atLeast:   true,
			threshold: 0.98,
			parts:     u5Parts(),
		},
		{
			id: "U6",
			what: "all of U1–U4's layouts: time of the fastest fairgo variant measured at the point / time " +
				"of Auto's choice (100% of points within 3%)",
			target:    "≥ 0.971",
			atLeast:   true,
			threshold: 1 / 1.03,
			parts:     u6Parts(),
		},
		{
			id:        "U7",
			what:      "one GPU, 2 × 2 and 2 × 4 at 2.5 Gbit/s, 64 buckets × 25 MiB back to back: time(best)/time(fairgo)",
			target:    "≥ 1.10",
			atLeast:   true,
			threshold: 1.10,
			parts:     u7Parts(),
		},
	}
}

func targetDefs() []targetDef {
	f32 := []string{"float32"}
	vsFlat := func(p point, v string) float64 { return p.vsFlat(v) }
	var t1 []requirement
	for _, dt := range []string{"float32", "bfloat16"} {
		for _, it := range callPatterns {
			t1 = append(t1, requirement{
				name:  fmt.Sprintf("1×2 in one process, %s, %s", dt, it.name),
				keep:  sweepOn(1, 2, false, []string{dt}, 64*kib, gib, it.ok),
				ratio: vsFlat,
			})
		}
	}
	overlap := func(r bench.Record) bool {
		return r.Kind == bench.KindOverlap && r.Machines == 2 && r.Devices == 2 && r.Testbed.NICGbit > 0 &&
			r.Buckets == 64 &&
			r.Bytes == 25*mib &&
			r.Testbed.Intra != harness.IntraLoopback
	}
	return []targetDef{
		{
			id: "T1",
			what: "1 × 2, one process (NVLink): fairgo/flat at every size 64K–1G, float32 and bfloat16, " +
				"one call at a time and 20 back to back",
			target:    "≥ 0.97",
			atLeast:   true,
			threshold: 0.97,
			parts:     t1,
		},
		{id: "T2", what: "2 × 1 in one process (NVLink) and 2 × 1 on the testbed: fairgo/flat at every size 1M–1G",
			target: "≥ 0.97", atLeast: true, threshold: 0.97, parts: []requirement{
				{name: "2×1 in one process", keep: sweepOn(2, 1, false, f32, mib, gib, anyIters), ratio: vsFlat},
				{name: "2×1 on the testbed", keep: sweepOn(2, 1, true, f32, mib, gib, anyIters), ratio: vsFlat}}},
		{id: "T3", what: "testbed 2 × 2 and 4 × 2: fairgo / best (flat, flat ring, flat tree, naive) at every size 1M–1G",
			target: "≥ 0.97", atLeast: true, threshold: 0.97, parts: []requirement{
				{name: "2×2 on the testbed", keep: notLoopback(sweepOn(2, 2, true, f32, mib, gib, anyIters)), ratio: vsBest},
				{name: "4×2 on the testbed", keep: notLoopback(sweepOn(4, 2, true, f32, mib, gib, anyIters)), ratio: vsBest}}},
		{id: "T4", what: "testbed 2 × 1, 2 × 2, 4 × 2: fairgo busbw / NIC-bound ideal busbw at 64M–1G",
			target: "≥ 0.90", atLeast: true, threshold: 0.90, parts: []requirement{
				{name: "2×1 on the testbed", keep: sweepOn(2, 1, true, f32, 64*mib, gib, anyIters), ratio: vsIdeal},
				{name: "2×2 on the testbed", keep: notLoopback(sweepOn(2, 2, true, f32, 64*mib, gib, anyIters)), ratio: vsIdeal},
				{name: "4×2 on the testbed", keep: notLoopback(sweepOn(4, 2, true, f32, 64*mib, gib, anyIters)), ratio: vsIdeal}}},
		{
			id: "T5",
			what: "testbed 2 × 2, 64 buckets × 25 MiB back to back: " +
				"time(min(flat, flat ring, flat tree, naive)) / time(fairgo)",
			target:    "≥ 1.0",
			atLeast:   true,
			threshold: 1.0,
			parts:     []requirement{{name: "2×2 on the testbed, 64×25M", keep: overlap, ratio: vsBest}},
		},
	}
}

// allDefs are every target's definitions: T1–T8 (on NVLink), U1–U7 (on
// one GPU) and those across node counts (S1–S8).
func allDefs() []targetDef {
	var out []targetDef
	for _, set := range []struct {
		name string
		defs []targetDef
	}{{SetT, targetDefs()}, {SetU, oneGPUDefs()}, {SetS, nodeDefs()}} {
		for _, d := range set.defs {
			d.set = set.name
			out = append(out, d)
		}
	}
	return out
}

// runsOf groups records by run label, runs in the order they first appear.
func runsOf(recs []bench.Record) ([]string, map[string][]bench.Record) {
	var order []string
	by := map[string][]bench.Record{}
	for _, r := range recs {
		if _, ok := by[r.Run]; !ok {
			order = append(order, r.Run)
		}
		by[r.Run] = append(by[r.Run], r)
	}
	return order, by
}

// samples computes a target's ratios over one run's records and lists the
// parts that have no point.
func (d targetDef) samples(recs []bench.Record, o TargetOptions) ([]sample, []string) {
	var out []sample
	var missing []string
	for _, req := range d.parts {
		order, ps := points(recs, func(r bench.Record) bool {
			return r.Invalid == "" && (o.IncludeSim || !r.SimTimings) && req.keep(r)
		})
		var got []sample
		for _, k := range order {
			p := ps[k]
			x := req.ratio(p, o.Variant)
			if math.IsNaN(x) {
				continue
			}
			got = append(got, d.sample(req, k, p, x, o.Variant))
		}
		switch {
		case len(got) == 0:
			missing = append(missing, req.name)
		case d.some:
			best := slices.MaxFunc(got, func(a, b sample) int { return cmp.Compare(a.margin, b.margin) })
			best.where += fmt.Sprintf(" (the best of %d points)", len(got))
			out = append(out, best)
		default:
			out = append(out, got...)
		}
	}
	return out, missing
}

// sample is the sample of ratio x at point p (key k) of requirement req.
func (d targetDef) sample(req requirement, k pointKey, p point, x float64, v string) sample {
	where := fmt.Sprintf("%s, %s %s", req.name, k.dtype, sizeName(k))
	if k.iters > 1 {
		where += fmt.Sprintf(", %d back to back", k.iters)
	}
	detail := ""
	if req.detail != nil {
		if detail = req.detail(p, v); detail != "" {
			where += " (" + detail + ")"
		}
	}
	th := d.threshold
	if req.threshold != 0 {
		th = req.threshold
	}
	margin := x / th
	if !d.atLeast {
		margin = th / x
	}
	ok := margin >= 1 || (req.slack != nil && req.slack(p, v))
	setup := ""
	if d.testbed {
		setup = testbedOf(p[v])
	}
	return sample{
		// The testbed too: a part that spans testbeds (S6's every point)
		// has a point of each size on each, and a second run must be held
		// to the same testbed's point.
		key:     fmt.Sprintf("%s|%s|%s|%d|%d|%d", req.name, testbedOf(p[v]), k.dtype, k.iters, k.buckets, k.bytes),
		where:   where,
		detail:  detail,
		setup:   setup,
		value:   x,
		ok:      ok,
		margin:  margin,
		command: commandOf(p[v]),
	}
}

func sizeName(k pointKey) string {
	if k.buckets > 0 {
		return fmt.Sprintf("%d×%s", k.buckets, bench.FormatSize(k.bytes))
	}
	return bench.FormatSize(k.bytes)
}

// worst is the sample farthest on the failing side: among the points that
// miss the target, if any, the one of the smallest margin.
func (d targetDef) worst(ss []sample) (sample, bool) {
	if len(ss) == 0 {
		return sample{}, false
	}
	return slices.MinFunc(ss, func(a, b sample) int {
		if a.ok != b.ok {
			if a.ok {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.margin, b.margin)
	}), true
}

// status is a target's state: measured by some points or none, the worst
// of them meeting it (ok) or not, with parts missing or not.
func status(measured, ok bool, missing []string) string {
	switch {
	case !measured:
		return StatusNotMeasured
	case !ok:
		return StatusFail
	case len(missing) > 0:
		return StatusIncomplete
	}
	return StatusPass
}

// inSets reports whether the target id belongs to one of sets (nil: every
// set).
func inSets(id string, sets []string) bool {
	if sets == nil {
		return true
	}
	if id == "T6" && slices.Contains(sets, SetS) {
		return true
	}
	return slices.Contains(sets, id[:1])
}

// Targets computes the targets of o.Sets from the records of one or more
// runs (grouped by run label, in the order they first appear): T1–T5,
// U1–U7, S1–S8 and T7 on the first run, T6 from o.Enqueue, S7 from
// o.Hooks, T8 comparing every ratio of T1–T5 and U1–U7 in the second run
// with the first; an S target measured by records is met only where the
// second run reproduces each of its points within ±10% (Repeat). A
// target whose records are absent says so in Missing, and one without any
// point is not measured (Status), never passed.
func Targets(recs []bench.Record, o TargetOptions) ([]Target, error) {
	if o.Variant == "" {
		o.Variant = bench.DefaultVariant
	}
	for _, s := range o.Sets {
		if !slices.Contains(TargetSets, s) {
			return nil, fmt.Errorf("report: targets: no set %q (%s)", s, strings.Join(TargetSets, ", "))
		}
	}
	runs, byRun := runsOf(recs)
	if len(runs) == 0 {
		return nil, errors.New("report: targets: no records")
	}
	var out []Target
	first := map[string]sample{} // T1–T5 and U1–U7 samples of the first run, by key, for T8
	second := map[string]sample{}
	for _, d := range allDefs() {
		t := Target{ID: d.id, What: d.what, Target: d.target, Runs: map[string]*float64{}}
		var pair [2]map[string]sample // the S target's samples of the first two runs, by key
		for i, run := range runs {
			ss, missing := d.samples(byRun[run], o)
			w, ok := d.worst(ss)
			if ok {
				t.Runs[run] = ptr(w.value)
			}
			for _, s := range ss {
				switch {
				case d.set == SetS:
					if i < 2 {
						if pair[i] == nil {
							pair[i] = map[string]sample{}
						}
						pair[i][s.key] = s
					}
				case i == 0:
					first[d.id+"|"+s.key] = s
				case i == 1:
					second[d.id+"|"+s.key] = s
				}
			}
			if i > 0 {
				continue
			}
			t.Points, t.Missing = len(ss), missing
			t.Command = commands(ss)
			if ok {
				t.Measured, t.Where = ptr(w.value), runName(run)+w.where
				if w.setup != "" {
					t.Where += "; " + w.setup
				}
				t.Pass = len(missing) == 0 && w.ok
			}
			t.Status = status(ok, w.ok, missing)
		}
		if d.set == SetS && t.Measured != nil {
			t.reproduce(runs, pair)
		}
		out = append(out, t)
	}
	out = append(
		out,
		enqueueTarget(o.Enqueue),
		hookTarget(o.Hooks),
		modelTarget(runs, byRun, o),
		repeatTarget(runs, first, second),
	)
	out = slices.DeleteFunc(out, func(t Target) bool { return !inSets(t.ID, o.Sets) })
	for i := range out {
		if out[i].Status == "" { // S7, T6, T7, T8: one figure each
			out[i].Status = status(out[i].Measured != nil, out[i].Pass, nil)
		}
	}
	slices.SortStableFunc(out, func(a, b Target) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// repeatTolerance is how far a second run's ratio may be from the first's
// at the same point for an S target to be met.
const repeatTolerance = 0.10

// reproduce holds an S target measured in the first run to its second
// (pair: the two runs' samples by key): without a second run, or with a
// point off by more than repeatTolerance, it is not met.
func (t *Target) reproduce(runs []string, pair [2]map[string]sample) {
	if len(runs) < 2 {
		t.Missing = append(t.Missing, fmt.Sprintf("a second run within ±%.0f%% of the first", 100*repeatTolerance))
		t.Pass = false
		if t.Status == StatusPass {
			t.Status = StatusIncomplete
		}
		return
	}
	var worst float64
	n := 0
	for _, k := range slices.Sorted(maps.Keys(pair[0])) {
		a := pair[0][k]
		b, ok := pair[1][k]
		if !ok || a.value <= 0 {
			continue
		}
		n++
		if dev := math.Abs(b.value/a.value - 1); n == 1 || dev > worst {
			worst = dev
			// The second run's times too: a reader tells a baseline that
			// moved from fairgo that did.
			where := a.where
			if a.setup != "" {
				where += "; " + a.setup
			}
			t.RepeatWhere = fmt.Sprintf("%s: %.3f in run %s, %.3f in run %s", where, a.value, runs[0], b.value, runs[1])
			if b.detail != "" {
				t.RepeatWhere += " (" + b.detail + ")"
			}
		}
	}
	if n == 0 {
		t.Missing = append(t.Missing, "no point measured in both runs")
		t.Pass = false
		if t.Status == StatusPass {
			t.Status = StatusIncomplete
		}
		return
	}
	t.Repeat = ptr(worst)
	if worst > repeatTolerance {
		t.Pass = false
		t.Status = StatusFail
	}
}

func ptr(x float64) *float64 { return &x }

func runName(run string) string {
	if run == "" {
		return ""
	}
	return "run " + run + ": "
}

func commands(ss []sample) []string {
	var out []string
	for _, s := range ss {
		if s.command != "" && !slices.Contains(out, s.command) {
			out = append(out, s.command)
		}
	}
	return out
}

// commandOf is the command that measured a record: fairbench's own, under
// the fairrun line that made its testbed when it ran in several processes.
func commandOf(r bench.Record) string {
	if r.Command == "" || r.Processes <= 1 {
		return r.Command
	}
	tb := r.Testbed
	fr := "fairrun"
	if tb.Emulated() {
		fr += fmt.Sprintf(" --emulate-machines %d", tb.Machines)
	}
	fr += fmt.Sprintf(" --nproc-per-node %d", r.Processes)
	if tb.NICGbit > 0 {
		fr += fmt.Sprintf(" --nic-gbit %g", tb.NICGbit)
	}
	if tb.NICLatency > 0 {
		fr += fmt.Sprintf(" --nic-latency %v", tb.NICLatency)
	}
	if tb.NICQueue > 0 {
		fr += fmt.Sprintf(" --nic-queue %v", tb.NICQueue)
	}
	if tb.NICRtoMin > 0 || tb.NICQueue > 0 { // a fairrun that told both: 0 is the kernel's
		fr += fmt.Sprintf(" --nic-rto-min %v", tb.NICRtoMin)
	}
	if tb.NICSlowStartAfterIdle != nil && *tb.NICSlowStartAfterIdle {
		fr += " --nic-slow-start-after-idle"
	}
	if tb.NVLinkGbit > 0 {
		fr += fmt.Sprintf(" --nvlink-gbit %g", tb.NVLinkGbit)
	}
	if tb.MPS {
		fr += " --mps on"
	}
	return fr + " -- " + r.Command
}

func enqueueTarget(e *Enqueue) Target {
	t := Target{
		ID: "T6",
		What: "host time to enqueue one AllReduce with the check on (Go benchmark), µs: " +
			"a flat call / one hierarchical slice",
		Target:  fmt.Sprintf("≤ %d / ≤ %d", enqueueFlatUS, enqueueSliceUS),
		Command: []string{"hier.test -test.run '^$' -test.bench '^BenchmarkGPUEnqueue$' (fairbench targets -enqueue FILE|µs)"},
	}
	if e == nil {
		t.Missing = []string{"no -enqueue input"}
		return t
	}
	// The measured figure is the part of the smaller margin, so that the
	// worse of the two is what the table shows.
	t.Measured, t.Where, t.Points = ptr(e.Micros), fmt.Sprintf("flat %.1f µs (%s)", e.Micros, e.Where), 1
	flatOK := e.Micros <= enqueueFlatUS
	if e.SliceMicros <= 0 {
		t.Missing = []string{"no benchmark of a hierarchical slice (a rail route)"}
		if flatOK {
			t.Status = StatusIncomplete // the flat part holds; the other is not measured
		}
		return t
	}
	t.Points++
	t.Where += fmt.Sprintf("; one hierarchical slice %.1f µs (%s)", e.SliceMicros, e.SliceWhere)
	if e.SliceMicros/enqueueSliceUS > e.Micros/enqueueFlatUS {
		t.Measured = ptr(e.SliceMicros)
	}
	t.Pass = flatOK && e.SliceMicros <= enqueueSliceUS
	return t
}

func modelTarget(runs []string, byRun map[string][]bench.Record, o TargetOptions) Target {
	t := Target{
		ID:      "T7",
		What:    "model error at every measured testbed point, |predicted − measured| / measured",
		Target:  "≤ 0.15",
		Runs:    map[string]*float64{},
		Command: []string{"fairbench model -in RECORDS (bench/model fitted to the run's links)"},
	}
	mo := ModelOptions{IncludeSim: o.IncludeSim, Intra: o.Intra, Net: o.Net}
	for i, run := range runs {
		p, _, err := FitModel(byRun[run], mo)
		if err != nil {
			if i == 0 {
				t.Missing = []string{strings.ReplaceAll(err.Error(), "\n", "; ")}
			}
			continue
		}
		errs := TestbedErrors(p, byRun[run], mo)
		w, ok := worstError(errs)
		if !ok {
			if i == 0 {
				t.Missing = []string{"no testbed point"}
			}
			continue
		}
		t.Runs[run] = ptr(math.Abs(w.Rel))
		if i == 0 {
			t.Measured = ptr(math.Abs(w.Rel))
			t.Where = fmt.Sprintf(
				"%s%s %v %s %s (predicted %.1f µs, measured %.1f µs)",
				runName(run),
				w.Algorithm,
				w.Grid,
				bench.FormatSize(int64(w.Bytes)),
				w.Label,
				w.Predicted*1e6,
				w.Seconds*1e6,
			)
			t.Points = len(errs)
			t.Pass = math.Abs(w.Rel) <= 0.15
		}
	}
	return t
}

func repeatTarget(runs []string, first, second map[string]sample) Target {
	t := Target{
		ID:     "T8",
		What:   "every ratio of T1–T5 and U1–U7 in a second run against the first, |second/first − 1|",
		Target: "≤ 0.10",
	}
	if len(runs) < 2 {
		t.Missing = []string{"a second run (records with another -run label)"}
		return t
	}
	var worst float64
	var where string
	for _, k := range slices.Sorted(maps.Keys(first)) {
		a, b := first[k], second[k]
		if _, ok := second[k]; !ok || a.value <= 0 {
			continue
		}
		t.Points++
		if d := math.Abs(b.value/a.value - 1); d >= worst {
			worst = d
			where = fmt.Sprintf(
				"%s %s: %.3f in run %s, %.3f in run %s",
				strings.SplitN(k, "|", 2)[0],
				a.where,
				a.value,
				runs[0],
				b.value,
				runs[1],
			)
		}
	}
	if t.Points == 0 {
		t.Missing = []string{"no ratio measured in both runs"}
		return t
	}
	t.Measured, t.Where, t.Pass = ptr(worst), where, worst <= 0.10
	t.Command = []string{fmt.Sprintf("the same commands, run %s and run %s", runs[0], runs[1])}
	return t
}

// PrintTargets prints the targets as a table; a target without a point
// reads "not measured".
func PrintTargets(w io.Writer, ts []Target) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "id\tmeasured\ttarget\tpass\tstatus\tpoints\twhere (worst case)\t")
	for _, t := range ts {
		m := StatusNotMeasured
		if t.Measured != nil {
			m = strconv.FormatFloat(*t.Measured, 'f', 3, 64)
		}
		pass := "no"
		if t.Pass {
			pass = "yes"
		}
		where := strings.ReplaceAll(t.Where, "\n", "; ")
		if t.Repeat != nil {
			where += fmt.Sprintf(" [second run: off by %.1f%% at most, at %s]", 100**t.Repeat, t.RepeatWhere)
		}
		if len(t.Missing) > 0 {
			where = strings.TrimSpace(where + " [missing: " + strings.Join(t.Missing, "; ") + "]")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t\n", t.ID, m, t.Target, pass, t.Status, t.Points, where)
	}
	return tw.Flush()
}

// WriteTargetsJSON writes the targets as one indented JSON array.
func WriteTargetsJSON(w io.Writer, ts []Target) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(ts); err != nil {
		return fmt.Errorf("report: writing targets: %w", err)
	}
	return nil
}

var benchLine = regexp.MustCompile(`^(Benchmark\S*)\s+\d+\s+(.*)$`)

// EnqueueMetric is the unit of T6 in hier's enqueue benchmarks.
const EnqueueMetric = "enqueue-ns/op"

// ParseEnqueue reads T6's input: a number of microseconds (a flat call's),
// or a file of `go test -bench` output (text, or -json events) whose
// benchmark lines matching pattern report the metric (EnqueueMetric, else
// ns/op). Benchmarks with the check off (check=false in the name) are not
// T6's; those of a route of several exchanges (the rail's, halving-doubling,
// recursive doubling: severalExchanges) are the hierarchical slice's, the
// others (one collective: flat, reduce-scatter, all-gather, broadcast) the
// flat call's; of each, the largest time counts, in µs.
func ParseEnqueue(arg, pattern string) (*Enqueue, error) {
	if us, err := strconv.ParseFloat(arg, 64); err == nil {
		if us < 0 {
			return nil, fmt.Errorf("report: -enqueue %s: negative", arg)
		}
		return &Enqueue{Micros: us, Where: "given"}, nil
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, fmt.Errorf("report: -enqueue-bench %q: %w", pattern, err)
	}
	f, err := os.Open(arg)
	if err != nil {
		return nil, fmt.Errorf("report: -enqueue: %w", err)
	}
	defer f.Close()
	var e Enqueue
	found := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		var ev struct{ Output string }
		if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &ev) == nil {
			line = ev.Output
		}
		m := benchLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil || !re.MatchString(m[1]) || strings.Contains(m[1], "check=false") {
			continue
		}
		ns, ok := metric(strings.Fields(m[2]), EnqueueMetric)
		if !ok {
			ns, ok = metric(strings.Fields(m[2]), "ns/op")
		}
		if !ok {
			continue
		}
		found = true
		us := ns / 1e3
		switch {
		case severalExchanges.MatchString(m[1]):
			if us > e.SliceMicros {
				e.SliceMicros, e.SliceWhere = us, m[1]
			}
		case us > e.Micros || e.Where == "":
			e.Micros, e.Where = us, m[1]
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("report: -enqueue %s: %w", arg, err)
	}
	if !found || e.Where == "" {
		return nil, fmt.Errorf(
			"report: -enqueue %s: no benchmark of a flat call matching %q (check on) reports %s or ns/op",
			arg,
			pattern,
			EnqueueMetric,
		)
	}
	return &e, nil
}

// severalExchanges matches the name of an enqueue benchmark whose route
// runs several exchanges, T6's hierarchical slice rather than its flat
// call.
var severalExchanges = regexp.MustCompile(`rail|halving|doubling`)

func metric(fields []string, unit string) (float64, bool) {
	for i := 1; i < len(fields); i++ {
		if fields[i] == unit {
			v, err := strconv.ParseFloat(fields[i-1], 64)
			return v, err == nil
		}
	}
	return 0, false
}
