package report

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/bench"
	"github.com/fairgo/fairgo/internal/harness"
)

// nodeLayout is one layout of the S targets' records.
type nodeLayout struct {
	m, d   int
	oneGPU bool // the one-GPU testbed (loopback for NVLink), else real NVLink
	gbit   float64
}

// setup is the testbed of the layout: in one process for one machine,
// else fairrun's emulated machines under MPS.
func (l nodeLayout) setup() (bench.Setup, int) {
	if l.m == 1 {
		return bench.Setup{Placement: harness.Placement{RanksPerGPU: 1}}, 1
	}
	tb := bench.Setup{Emulation: harness.Emulation{Machines: l.m, NICGbit: l.gbit, MPS: true, NetNS: true,
		Intra: harness.IntraNVLink}, Placement: harness.Placement{RanksPerGPU: max(l.m*l.d/4, 1)}}
	if l.oneGPU {
		tb.Intra = harness.IntraLoopback
		tb.RanksPerGPU = l.m * l.d
	}
	return tb, l.m * l.d
}

// nodeRecords are the records of one layout: every method at every size
// of sizes (bytes), at the times us gives (µs, by method and size).
func nodeRecords(run string, l nodeLayout, sizes []int64, us func(alg string, bytes int64) float64) []bench.Record {
	tb, procs := l.setup()
	var recs []bench.Record
	for _, s := range sizes {
		for _, alg := range []string{bench.Flat, bench.FlatRing, bench.FlatTree, bench.Naive, bench.DefaultVariant,
			NoCheckVariant} {
			t := us(alg, s)
			if t <= 0 {
				continue
			}
			r := bench.Record{Kind: bench.KindSweep, Run: run, Command: "fairbench sweep -backend cuda",
				Backend: "cuda", Machines: l.m, Devices: l.d, Processes: procs, Testbed: tb, DType: "float32",
				Op: "sum", Algorithm: alg, Bytes: s, Iters: 1, Reps: 3, TimeUS: t}
			switch alg {
			case bench.DefaultVariant:
				r.Fairgo = &bench.FairgoSetup{Algorithm: "auto", Chosen: "flat"}
			case NoCheckVariant:
				r.Fairgo = &bench.FairgoSetup{Algorithm: "auto", Chosen: "flat", Spec: "check:off,routes:fairgo"}
			}
			recs = append(recs, r)
		}
	}
	return recs
}

// twoRuns is recs as run r1 and again, alike, as run r2: an S target is
// met only when a second run reproduces it.
func twoRuns(recs []bench.Record) []bench.Record {
	out := slices.Clone(recs)
	for _, r := range recs {
		r.Run = "r2"
		out = append(out, r)
	}
	return out
}

// pow4 are the sizes lo, 4·lo, … up to hi.
func pow4(lo, hi int64) []int64 {
	var out []int64
	for s := lo; s <= hi; s *= 4 {
		out = append(out, s)
	}
	return out
}

// flatTimes: every baseline at base µs, fairgo at base/gain, nocheck a
// hair faster than fairgo.
func flatTimes(base, gain float64) func(string, int64) float64 {
	return func(alg string, _ int64) float64 {
		switch alg {
		case bench.DefaultVariant:
			return base / gain
		case NoCheckVariant:
			return base / gain * 0.995
		}
		return base
	}
}

func sTargets(t *testing.T, recs []bench.Record, o TargetOptions) map[string]Target {
	t.Helper()
	o.Sets = []string{SetS}
	ts, err := Targets(recs, o)
	require.NoError(t, err)
	out := map[string]Target{}
	var ids []string
	for _, x := range ts {
		out[x.ID] = x
		ids = append(ids, x.ID)
	}
	require.Equal(t, []string{"S1", "S2", "S3", "S4", "S5", "S6", "S7", "S8", "T6"}, ids, "set S: S1–S8 and T6")
	return out
}

// Every S target measured on a synthetic run: each one's worst point, the
// testbed it names, and whether it passes.
func TestNodeTargets(t *testing.T) {
	var recs []bench.Record
	// S1, 1 × 4: 64K 3 µs slower than the best (ratio 0.95, within 5 µs), 1M
	// at 0.99; the pass holds with the slack.
	recs = append(recs, nodeRecords("r1", nodeLayout{m: 1, d: 4}, pow4(64<<10, 1<<20), func(alg string, s int64) float64 {
		base := map[int64]float64{64 << 10: 57, 256 << 10: 80, 1 << 20: 120}[s]
		switch {
		case alg == NoCheckVariant:
			return 0 // not measured
		case alg == bench.DefaultVariant && s == 64<<10:
			return base + 3
		case alg == bench.DefaultVariant:
			return base / 0.99
		}
		return base
	})...)
	// S2: 2 × 2 and 4 × 1 at 10 Gbit/s; 4 × 1 at 256K is the worst (0.98),
	// flat-ring the best baseline there.
	for _, l := range []nodeLayout{{m: 2, d: 2, gbit: 10}, {m: 4, d: 1, gbit: 10}} {
		recs = append(recs, nodeRecords("r1", l, pow4(64<<10, 64<<20), func(alg string, s int64) float64 {
			switch {
			case alg == bench.FlatRing && l.m == 4 && s == 256<<10:
				return 900
			case alg == bench.DefaultVariant && l.m == 4 && s == 256<<10:
				return 900 / 0.98
			}
			return flatTimes(1000, 1.0)(alg, s)
		})...)
	}
	// S3 and S5: 8 × 1 and 16 × 1; fairgo gains 1.3 at 256K on 8 × 1 and 1.25
	// at 1M on 16 × 1, ties elsewhere.
	for _, l := range []nodeLayout{{m: 8, d: 1, gbit: 10}, {m: 16, d: 1, gbit: 10}} {
		recs = append(recs, nodeRecords("r1", l, pow4(64<<10, 64<<20), func(alg string, s int64) float64 {
			gain := 1.0
			switch {
			case l.m == 8 && s == 256<<10:
				gain = 1.3
			case l.m == 16 && s == 1<<20:
				gain = 1.25
			}
			return flatTimes(1000, gain)(alg, s)
		})...)
	}
	// S4 on one GPU: naive 1.1× fairgo at 64M–256M, but 2 × 4 at 4M is 0.9
	// of the best.
	for _, l := range []nodeLayout{{2, 2, true, 2.5}, {2, 4, true, 2.5}, {4, 2, true, 2.5}} {
		recs = append(recs, nodeRecords("r1", l, pow4(1<<20, 256<<20), func(alg string, s int64) float64 {
			switch alg {
			case bench.Naive:
				return 1100
			case bench.DefaultVariant, NoCheckVariant:
				if l.d == 4 && s == 4<<20 {
					return 1100 / 0.9
				}
				return 990
			}
			return 2000
		})...)
	}
	// S8: 64 × 25M over NVLink on 2 × 2, fairgo 0.99 of the best (enough
	// there, ≥ 0.98), and on one GPU's 2 × 4, 1.15 (≥ 1.10 there).
	for _, o := range []struct {
		l     nodeLayout
		times map[string]float64
	}{
		{nodeLayout{m: 2, d: 2, gbit: 10}, map[string]float64{bench.Flat: 198e3, bench.Naive: 250e3,
			bench.DefaultVariant: 200e3}},
		{nodeLayout{2, 4, true, 2.5}, map[string]float64{bench.Flat: 300e3, bench.Naive: 230e3,
			bench.DefaultVariant: 200e3}},
	} {
		tb, procs := o.l.setup()
		for alg, us := range o.times {
			r := bench.Record{Kind: bench.KindOverlap, Run: "r1", Backend: "cuda", Machines: o.l.m, Devices: o.l.d,
				Processes: procs, Testbed: tb, DType: "float32", Op: "sum", Algorithm: alg, Bytes: 25 << 20,
				Buckets: 64, Iters: 1, TimeUS: us}
			if alg == bench.DefaultVariant {
				r.Fairgo = &bench.FairgoSetup{Algorithm: "auto"}
			}
			recs = append(recs, r)
		}
	}

	got := sTargets(t, twoRuns(recs), TargetOptions{Enqueue: &Enqueue{Micros: 12, Where: "BenchmarkGPUEnqueueJob"}})
	s1 := got["S1"]
	require.InDelta(t, 57.0/60, *s1.Measured, 1e-9, "the lowest ratio, passed by the slack")
	require.True(t, s1.Pass, s1.Where)
	require.Equal(t, StatusPass, s1.Status)
	require.Contains(t, s1.Where, "1×4, float32 64K (fairgo 60.00 µs, best flat 57.00 µs); 1×4, one process")

	s2 := got["S2"]
	require.InDelta(t, 0.98, *s2.Measured, 1e-9)
	require.True(t, s2.Pass)
	require.Contains(t, s2.Where, "4×1 at 10 Gbit/s, float32 256K (fairgo 918.4 µs, best flat-ring 900.0 µs)")
	require.Contains(t, s2.Where, "4×1 on the testbed, 10 Gbit/s NIC per machine, 1 rank(s) per GPU, MPS")
	require.Equal(t, 2*6, s2.Points)

	s3 := got["S3"]
	require.InDelta(t, 1, *s3.Measured, 1e-9)
	require.True(t, s3.Pass)

	s4 := got["S4"]
	require.InDelta(t, 0.9, *s4.Measured, 1e-9, "the best ratio's miss is farther than naive's margin")
	require.False(t, s4.Pass)
	require.Equal(t, StatusFail, s4.Status)
	require.Contains(t, s4.Where, "2×4 on one GPU, fairgo/best at 1M–256M, float32 4M")
	require.Contains(t, s4.Where, "intra loopback, 8 rank(s) per GPU")

	s5 := got["S5"]
	require.InDelta(t, 1.25, *s5.Measured, 1e-9, "16 × 1's best size is the worse layout's")
	require.True(t, s5.Pass)
	require.Equal(t, 2, s5.Points, "one point per layout: its best")
	require.Contains(t, s5.Where, "16×1 at 10 Gbit/s, 64K–1M, float32 1M")
	require.Contains(t, s5.Where, "the best of 3 points")

	s6 := got["S6"]
	require.InDelta(t, 0.995, *s6.Measured, 1e-9)
	require.True(t, s6.Pass)

	s8 := got["S8"]
	require.InDelta(t, 198.0/200, *s8.Measured, 1e-9, "over NVLink the nearer its bound of 0.98")
	require.True(t, s8.Pass)
	require.Equal(t, 2, s8.Points)
	require.Contains(t, s8.Where, "64×25M back to back over NVLink")
	require.Contains(t, s8.Where, "2×2 on the testbed")

	require.Equal(t, StatusFail, got["T6"].Status, "12 µs")

	// The JSON carries the shape of bench/results/targets.json.
	var js bytes.Buffer
	require.NoError(t, WriteTargetsJSON(&js, []Target{s2}))
	var back []map[string]any
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	for _, k := range []string{"id", "target", "measured", "where", "pass", "status", "command"} {
		require.Contains(t, back[0], k)
	}
	require.Equal(t, []any{"fairrun --emulate-machines 2 --nproc-per-node 4 --nic-gbit 10 --mps on -- " +
		"fairbench sweep -backend cuda", "fairrun --emulate-machines 4 --nproc-per-node 4 --nic-gbit 10 --mps on -- " +
		"fairbench sweep -backend cuda"}, back[0]["command"])
}

// S1 holds on the ratio alone, or on the slack alone, and fails where
// fairgo misses both; S5 fails where no size gains enough.
func TestNodeTargetsMiss(t *testing.T) {
	recs := nodeRecords("r1", nodeLayout{m: 1, d: 4}, []int64{1 << 20}, flatTimes(200, 200.0/206))
	for _, l := range []nodeLayout{{m: 8, d: 1, gbit: 10}, {m: 16, d: 1, gbit: 10}} {
		recs = append(recs, nodeRecords("r1", l, pow4(64<<10, 1<<20), flatTimes(1000, 1.1))...)
	}
	got := sTargets(t, twoRuns(recs), TargetOptions{})
	require.True(t, got["S1"].Pass, "6 µs slower, but at 0.971")
	require.InDelta(t, 200.0/206, *got["S1"].Measured, 1e-9)
	require.False(t, got["S5"].Pass)
	require.Equal(t, StatusFail, got["S5"].Status)
	require.InDelta(t, 1.1, *got["S5"].Measured, 1e-9)

	recs = nodeRecords("r1", nodeLayout{m: 1, d: 4}, []int64{1 << 20}, flatTimes(200, 200.0/210))
	got = sTargets(t, twoRuns(recs), TargetOptions{})
	require.False(t, got["S1"].Pass, "10 µs slower at 0.952")
	require.Equal(t, StatusFail, got["S1"].Status)
	require.Contains(t, got["S1"].Where, "fairgo 210.0 µs, best flat 200.0 µs")
}

// Every best of the S targets is the fastest baseline, flat-tree
// included: S2 and S5 take flat-tree's time where it is the fastest, and
// S2 fails there.
func TestNodeTargetsBestIncludesFlatTree(t *testing.T) {
	var recs []bench.Record
	for _, l := range []nodeLayout{{m: 2, d: 2, gbit: 10}, {m: 4, d: 1, gbit: 10}, {m: 8, d: 1, gbit: 10},
		{m: 16, d: 1, gbit: 10}} {
		recs = append(recs, nodeRecords("r1", l, pow4(64<<10, 1<<20), func(alg string, s int64) float64 {
			switch {
			case alg == bench.FlatTree && s == 256<<10:
				return 500 // the fastest baseline here: fairgo at 0.5 of it
			case alg == bench.FlatTree:
				return 0 // not measured
			}
			return flatTimes(1000, 1.3)(alg, s)
		})...)
	}
	got := sTargets(t, recs, TargetOptions{})
	require.InDelta(t, 500/(1000/1.3), *got["S2"].Measured, 1e-9)
	require.False(t, got["S2"].Pass)
	require.Contains(t, got["S2"].Where, "best flat-tree 500.0 µs")
	require.InDelta(t, 1.3, *got["S5"].Measured, 1e-9, "the best size is one where flat-tree was not the best")
	require.InDelta(t, 500/(1000/1.3), *got["S3"].Measured, 1e-9)
}

// A target without records is not measured, never passed, and says so in
// its status, its JSON and the table.
func TestNodeTargetsNotMeasured(t *testing.T) {
	recs := nodeRecords("r1", nodeLayout{m: 2, d: 2, gbit: 10}, pow4(1<<20, 4<<20), flatTimes(100, 1))
	got := sTargets(t, recs, TargetOptions{})
	for _, id := range []string{"S1", "S3", "S4", "S5", "S8", "T6"} {
		require.Nil(t, got[id].Measured, id)
		require.False(t, got[id].Pass, id)
		require.Equal(t, StatusNotMeasured, got[id].Status, id)
	}
	require.Equal(t, StatusIncomplete, got["S2"].Status, "2 × 2 passes, 4 × 1 has no record")
	require.False(t, got["S2"].Pass)
	require.Equal(t, []string{"4×1 at 10 Gbit/s", "a second run within ±10% of the first"}, got["S2"].Missing)
	var tab bytes.Buffer
	ts := []Target{got["S1"], got["S2"]}
	require.NoError(t, PrintTargets(&tab, ts))
	lines := strings.Split(strings.TrimSpace(tab.String()), "\n")
	require.Contains(t, lines[1], "not measured")
	require.Contains(t, lines[2], "incomplete")

	_, err := Targets(recs, TargetOptions{Sets: []string{"X"}})
	require.Error(t, err)
}

// An S target met in one run is incomplete until a second run reproduces
// it, and fails where the second run is more than 10% off at a point.
func TestNodeTargetsNeedASecondRun(t *testing.T) {
	l := nodeLayout{m: 2, d: 2, gbit: 10}
	first := nodeRecords("r1", l, pow4(1<<20, 4<<20), flatTimes(100, 1))
	got := sTargets(t, first, TargetOptions{})
	require.InDelta(t, 1, *got["S2"].Measured, 1e-9)
	require.False(t, got["S2"].Pass)
	require.Nil(t, got["S2"].Repeat)
	require.Contains(t, got["S2"].Missing, "a second run within ±10% of the first")

	got = sTargets(t, twoRuns(first), TargetOptions{})
	require.InDelta(t, 0, *got["S6"].Repeat, 1e-12)
	require.Equal(t, []string{"4×1 at 10 Gbit/s"}, got["S2"].Missing, "reproduced: only the layout is missing")

	second := nodeRecords("r2", l, pow4(1<<20, 4<<20), func(alg string, s int64) float64 {
		if alg == bench.DefaultVariant && s == 4<<20 {
			return 100 / 0.85 // 0.85 where the first run had 1.00
		}
		return flatTimes(100, 1)(alg, s)
	})
	got = sTargets(t, append(slices.Clone(first), second...), TargetOptions{})
	s2 := got["S2"]
	require.InDelta(t, 0.15, *s2.Repeat, 1e-9)
	require.Equal(t, StatusFail, s2.Status)
	require.False(t, s2.Pass)
	require.Contains(t, s2.RepeatWhere, "2×2 at 10 Gbit/s, float32 4M")
	require.Contains(t, s2.RepeatWhere, "1.000 in run r1, 0.850 in run r2 (fairgo 117.6 µs, best ")
	require.InDelta(t, 1, *s2.Measured, 1e-9, "the first run's worst point")
}

// A part that spans testbeds (S6: every point with nocheck) holds a
// second run's point to the same testbed's point of the first run, never
// to another testbed's point of the same size.
func TestNodeTargetsRepeatOnTheSameTestbed(t *testing.T) {
	sizes := pow4(4<<20, 4<<20)
	slower := func(alg string, s int64) float64 { // fairgo at 0.85 of nocheck
		if alg == bench.DefaultVariant {
			return 100 / 0.85
		}
		return flatTimes(100, 1)(alg, s)
	}
	wide := nodeLayout{m: 4, d: 1, gbit: 10}
	var recs []bench.Record
	recs = append(recs, nodeRecords("r1", wide, sizes, flatTimes(100, 1))...)
	recs = append(recs, nodeRecords("r1", nodeLayout{m: 2, d: 2, gbit: 10}, sizes, slower)...)
	recs = append(recs, nodeRecords("r2", wide, sizes, flatTimes(100, 1))...)
	s6 := sTargets(t, recs, TargetOptions{})["S6"]
	require.NotNil(t, s6.Repeat)
	require.InDelta(t, 0, *s6.Repeat, 1e-9, "4 × 1 against 4 × 1, not 2 × 2's 0.85")
	require.Contains(t, s6.RepeatWhere, "4×1 on the testbed")
}
