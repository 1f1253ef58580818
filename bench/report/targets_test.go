package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/bench"
	"github.com/fairgo/fairgo/bench/model"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/harness"
)

// truth is the testbed the synthetic records come from: NVLink, and one
// NIC per machine that moves 1.19 GB/s of a 10 Gbit/s line.
var truth = model.Params{Intra: model.Link{Alpha: 8e-6, BW: 250e9}, Net: model.Link{Alpha: 150e-6, BW: 1.19e9},
	NetPerMachine: 1.19e9, PeerAlpha: -1}

// inProcess models M × D GPUs of one host driven by one process: every
// link is NVLink.
var inProcess = model.Params{Intra: truth.Intra, Net: truth.Intra, PeerAlpha: -1}

type layout struct {
	m, d    int
	testbed bool
	dtypes  []string
	iters   []int
	lo, hi  int64
}

// synthRun makes a run's records as scripts/gpu.sh targets would: flat,
// naive and fairgo (rail-rsag, 16 MiB slices) timed exactly as truth
// predicts; slow(layout, size) slows fairgo by a factor.
func synthRun(run string, slow func(m, d int, testbed bool, bytes int64) float64) []bench.Record {
	layouts := []layout{
		{1, 2, false, []string{"float32", "bfloat16"}, []int{1, 20}, 64 << 10, 1 << 30},
		{2, 1, false, []string{"float32"}, []int{1}, 1 << 20, 1 << 30},
		{2, 1, true, []string{"float32"}, []int{1}, 1 << 20, 1 << 30},
		{2, 2, true, []string{"float32"}, []int{1}, 1 << 20, 1 << 30},
		{4, 2, true, []string{"float32"}, []int{1}, 1 << 20, 1 << 30},
	}
	var recs []bench.Record
	add := func(l layout, kind, dt string, iters, buckets int, bytes int64) {
		p, cmd := inProcess, fmt.Sprintf("fairbench sweep -backend cuda -machines %d -devices %d", l.m, l.d)
		tb := bench.Setup{Placement: harness.Placement{RanksPerGPU: 1}}
		procs := 1
		if l.testbed {
			p, cmd, procs = truth, "fairbench sweep -backend cuda", l.m*l.d
			tb.Emulation = harness.Emulation{Machines: l.m, NICGbit: 10, MPS: true, NetNS: true}
			tb.Placement = harness.Placement{RanksPerGPU: l.m, SharedAcrossMachines: l.m > 1 && l.d > 1}
		}
		g := model.Grid{M: l.m, D: l.d}
		n := float64(bytes)
		k := float64(max(buckets, 1))
		chosen := hier.RailRSAG
		if l.m == 1 {
			chosen = hier.Flat
		}
		fo := model.Fairgo{Rail: hier.RailRSAG, Slice: 16 << 20, Parallelism: 4, FlatThreshold: -1}
		times := map[string]float64{"flat": k * p.Flat(g, n), "naive": k * p.Naive(g, n),
			"fairgo": p.FairgoTime(g, n, max(buckets, 1), fo) * slow(l.m, l.d, l.testbed, bytes)}
		if l.m == 1 {
			times["fairgo"] = k * p.Flat(g, n) * slow(l.m, l.d, l.testbed, bytes)
		}
		for _, alg := range []string{"flat", "naive", "fairgo"} {
			r := bench.Record{
				Kind:      kind,
				Run:       run,
				Command:   cmd,
				Backend:   "cuda",
				Machines:  l.m,
				Devices:   l.d,
				Processes: procs,
				Testbed:   tb,
				DType:     dt,
				Op:        "sum",
				Algorithm: alg,
				Bytes:     bytes,
				Buckets:   buckets,
				Iters:     iters,
				Reps:      3,
				TimeUS:    times[alg] * 1e6,
			}
			if alg == "fairgo" {
				r.Fairgo = &bench.FairgoSetup{
					Algorithm:     "auto",
					Chosen:        chosen.String(),
					SliceBytes:    16 << 20,
					Parallelism:   4,
					FlatThreshold: -1,
				}
			}
			r.AlgBW, r.BusBW = bench.Bandwidths(r.TotalBytes(), times[alg], l.m*l.d)
			if l.testbed {
				r.IdealBusBW = bench.IdealBusBW(r.TotalBytes(), l.m, l.d, 1.25e9)
			}
			recs = append(recs, r)
		}
	}
	for _, l := range layouts {
		for _, dt := range l.dtypes {
			for _, it := range l.iters {
				for s := l.lo; s <= l.hi; s *= 4 {
					add(l, bench.KindSweep, dt, it, 0, s)
				}
			}
		}
	}
	add(layout{m: 2, d: 2, testbed: true}, bench.KindOverlap, "float32", 1, 64, 25<<20)
	return recs
}

func same(int, int, bool, int64) float64 { return 1 }

func byID(t *testing.T, ts []Target) map[string]Target {
	t.Helper()
	out := map[string]Target{}
	for _, x := range ts {
		out[x.ID] = x
	}
	require.Len(t, out, 23, "T1–T8, U1–U7 and S1–S8")
	return out
}

func TestTargetsOfAModelledRun(t *testing.T) {
	recs := append(synthRun("r1", same), synthRun("r2", same)...)
	ts, err := Targets(recs, TargetOptions{Enqueue: &Enqueue{Micros: 7.5, Where: "BenchmarkEnqueue", SliceMicros: 15,
		SliceWhere: "BenchmarkEnqueue/rail"}})
	require.NoError(t, err)
	got := byID(t, ts)
	// T1: fairgo is flat on one machine here: 1.00 at every one of 2 types
	// × 2 call patterns × 8 sizes.
	require.Equal(t, 32, got["T1"].Points)
	require.InDelta(t, 1, *got["T1"].Measured, 1e-9)
	require.True(t, got["T1"].Pass)
	require.Equal(t, 12, got["T2"].Points)
	require.Equal(t, 12, got["T3"].Points)
	require.Equal(t, 9, got["T4"].Points)
	require.Equal(t, 1, got["T5"].Points)
	require.Empty(t, got["T4"].Missing)
	require.True(t, got["T6"].Pass)
	require.Equal(t, 7.5, *got["T6"].Measured, "flat and slice at the same margin: the flat figure")
	require.Equal(t, 2, got["T6"].Points)
	// The model fitted to the run's own links predicts its points.
	require.Less(t, *got["T7"].Measured, 0.01, got["T7"].Where)
	require.True(t, got["T7"].Pass)
	require.Equal(t, 3*6*3+3, got["T7"].Points, "every testbed sweep point of every method, and the overlap round")
	// Two identical runs repeat exactly.
	require.InDelta(t, 0, *got["T8"].Measured, 1e-12)
	require.True(t, got["T8"].Pass)
	require.Equal(t, 32+12+12+9+1+5+5, got["T8"].Points, "T1–T5's, and U4's and U6's of the 2 × 1 testbed at 10 Gbit/s")
	// The commands name the testbed.
	require.Contains(
		t,
		strings.Join(got["T3"].Command, "\n"),
		"fairrun --emulate-machines 4 --nproc-per-node 8 --nic-gbit 10 --mps on -- fairbench sweep",
	)
}

func TestTargetsFindTheWorstPoint(t *testing.T) {
	slow := func(m, d int, tb bool, bytes int64) float64 {
		if m == 4 && tb && bytes == 16<<20 {
			return 2 // fairgo at half speed on the testbed's 4 × 2 at 16 MiB
		}
		return 1
	}
	second := func(m, d int, tb bool, bytes int64) float64 {
		if m == 1 && bytes == 1<<20 {
			return 1.25 // a one-machine point 20% slower in the second run
		}
		return slow(m, d, tb, bytes)
	}
	recs := append(synthRun("a", slow), synthRun("b", second)...)
	// A sim record and an invalid one are never counted.
	junk := synthRun("a", func(int, int, bool, int64) float64 { return 100 })[:3]
	for i := range junk {
		junk[i].SimTimings = i == 0
		junk[i].Invalid = map[bool]string{true: "time-sliced"}[i > 0]
	}
	recs = append(recs, junk...)
	ts, err := Targets(recs, TargetOptions{})
	require.NoError(t, err)
	got := byID(t, ts)
	t3 := got["T3"]
	require.False(t, t3.Pass)
	require.Contains(t, t3.Where, "run a: 4×2 on the testbed, float32 16M")
	flat, naive := truth.Flat(model.Grid{M: 4, D: 2}, 16<<20), truth.Naive(model.Grid{M: 4, D: 2}, 16<<20)
	fo := truth.FairgoTime(
		model.Grid{M: 4, D: 2},
		16<<20,
		1,
		model.Fairgo{Rail: hier.RailRSAG, Slice: 16 << 20, Parallelism: 4, FlatThreshold: -1},
	)
	require.InDelta(t, math.Min(flat, naive)/(2*fo), *t3.Measured, 1e-9)
	// The model cannot explain the slow point: T7 fails there.
	require.False(t, got["T7"].Pass)
	require.InDelta(t, 0.5, *got["T7"].Measured, 1e-6)
	require.Contains(t, got["T7"].Where, "fairgo 4×2 16M")
	// T8: 1/1.25 = 0.8 in the second run.
	require.InDelta(t, 0.2, *got["T8"].Measured, 1e-9)
	require.False(t, got["T8"].Pass)
	require.Contains(t, got["T8"].Where, "T1 1×2 in one process")
	// No T6 input.
	require.False(t, got["T6"].Pass)
	require.Nil(t, got["T6"].Measured)

	var js bytes.Buffer
	require.NoError(t, WriteTargetsJSON(&js, ts))
	var back []map[string]any
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	require.Len(t, back, 23)
	for _, o := range back {
		for _, k := range []string{"id", "measured", "target", "pass", "command"} {
			require.Contains(t, o, k)
		}
	}
	var tab bytes.Buffer
	require.NoError(t, PrintTargets(&tab, ts))
	require.Contains(t, tab.String(), "T3")
	require.Contains(t, tab.String(), "missing: no -enqueue input")
}

func TestTargetsNameWhatIsMissing(t *testing.T) {
	var only []bench.Record
	for _, r := range synthRun("x", same) {
		if r.Machines == 2 && r.Devices == 2 {
			only = append(only, r)
		}
	}
	ts, err := Targets(only, TargetOptions{Variant: "fairgo"})
	require.NoError(t, err)
	got := byID(t, ts)
	require.False(t, got["T1"].Pass)
	require.Nil(t, got["T1"].Measured)
	require.Len(t, got["T1"].Missing, 4)
	require.Equal(t, []string{"4×2 on the testbed"}, got["T3"].Missing)
	require.False(t, got["T3"].Pass, "a missing layout fails the target")
	require.NotEmpty(t, got["T7"].Missing, "no links to fit")
	require.Contains(t, got["T8"].Missing[0], "second run")
	_, err = Targets(nil, TargetOptions{})
	require.Error(t, err)
}

func TestParseEnqueue(t *testing.T) {
	e, err := ParseEnqueue("8.25", "Enqueue")
	require.NoError(t, err)
	require.Equal(t, 8.25, e.Micros)
	dir := t.TempDir()
	text := filepath.Join(dir, "bench.txt")
	require.NoError(t, os.WriteFile(text, []byte(`goos: linux
BenchmarkEnqueue/flat-16         	  200000	      3100 ns/op	  12 B/op
BenchmarkEnqueue/one-slice-16    	  150000	     19200 ns/op	      9200 enqueue-ns/op
BenchmarkOther-16                	  100000	     99000 ns/op
PASS
`), 0o644))
	e, err = ParseEnqueue(text, "Enqueue")
	require.NoError(t, err)
	require.Equal(t, 9.2, e.Micros)
	require.Equal(t, "BenchmarkEnqueue/one-slice-16", e.Where)
	js := filepath.Join(dir, "bench.json")
	require.NoError(
		t,
		os.WriteFile(
			js,
			[]byte(`{"Action":"output","Output":"BenchmarkEnqueue-16 \t 1000 \t 4500 ns/op\n"}`+"\n"),
			0o644,
		),
	)
	e, err = ParseEnqueue(js, "Enqueue")
	require.NoError(t, err)
	require.Equal(t, 4.5, e.Micros)
	_, err = ParseEnqueue(text, "Nothing")
	require.Error(t, err)
	_, err = ParseEnqueue(filepath.Join(dir, "absent"), "Enqueue")
	require.Error(t, err)
	_, err = ParseEnqueue("-3", "Enqueue")
	require.Error(t, err)
}

// T6 reads hier's BenchmarkGPUEnqueue: the check-on benchmarks only, a
// route of several exchanges (the rail, halving-doubling) as the
// hierarchical slice's, and holds each to its own bound.
func TestEnqueueTargetFlatAndSlice(t *testing.T) {
	text := filepath.Join(t.TempDir(), "enqueue.txt")
	require.NoError(t, os.WriteFile(text, []byte(`
BenchmarkGPUEnqueue/1x2/flat/inline/check=true-64   2000  25749 ns/op  10180.75 MB/s  9100 enqueue-ns/op
BenchmarkGPUEnqueue/1x2/flat/inline/check=false-64  2000  23378 ns/op  11213.16 MB/s  45000 enqueue-ns/op
BenchmarkGPUEnqueue/1x2/flat/engine/check=true-64   2000  41828 ns/op  6267.15 MB/s   9800 enqueue-ns/op
BenchmarkGPUEnqueue/2x1/rail-a2a/check=true-64      2000  114296 ns/op 2293.56 MB/s   21955 enqueue-ns/op
BenchmarkGPUEnqueue/2x1/rail-rsag/check=true-64     2000  86392 ns/op  3034.36 MB/s   17676 enqueue-ns/op
BenchmarkGPUEnqueue/2x1/rail-rsag/check=false-64    2000  68438 ns/op  3830.38 MB/s   99000 enqueue-ns/op
BenchmarkGPUEnqueue/2x1/halving-doubling/check=true-64  2000  76246 ns/op  3438.14 MB/s  21000 enqueue-ns/op
BenchmarkGPUEnqueue/1x2/reduce-scatter/inline/check=true-64  2000  21892 ns/op  11974.29 MB/s  9500 enqueue-ns/op
`), 0o644))
	e, err := ParseEnqueue(text, "^BenchmarkGPUEnqueue/")
	require.NoError(t, err)
	require.InDelta(t, 9.8, e.Micros, 1e-9,
		"the slower one-collective benchmark with the check; check=false and halving-doubling not flat")
	require.Equal(t, "BenchmarkGPUEnqueue/1x2/flat/engine/check=true-64", e.Where)
	require.InDelta(t, 21.955, e.SliceMicros, 1e-9)
	require.Contains(t, e.SliceWhere, "rail-a2a")

	tg := enqueueTarget(e)
	require.False(t, tg.Pass, "the slice misses 20 µs")
	require.InDelta(t, 21.955, *tg.Measured, 1e-9, "the worse margin is the slice's")
	require.Contains(t, tg.Where, "flat 9.8 µs")
	require.Contains(t, tg.Where, "one hierarchical slice 22.0 µs")

	e.SliceMicros = 19
	tg = enqueueTarget(e)
	require.True(t, tg.Pass)
	require.InDelta(t, 9.8, *tg.Measured, 1e-9)

	tg = enqueueTarget(&Enqueue{Micros: 8, Where: "given"})
	require.False(t, tg.Pass, "no slice measured")
	require.Equal(t, StatusIncomplete, tg.Status)
	require.NotEmpty(t, tg.Missing)

	only := filepath.Join(t.TempDir(), "rail.txt")
	require.NoError(t, os.WriteFile(only, []byte(
		"BenchmarkGPUEnqueue/2x1/rail-a2a/check=true-64  2000  114296 ns/op  21955 enqueue-ns/op\n"), 0o644))
	_, err = ParseEnqueue(only, "Enqueue")
	require.Error(t, err, "no flat benchmark")
}

func TestModelReport(t *testing.T) {
	recs := synthRun("r1", same)
	var buf bytes.Buffer
	require.NoError(
		t,
		ModelReport(&buf, recs, ModelOptions{Devices: 8, Machines: []int{8, 64}, Sizes: []float64{1 << 20, 1 << 30}}),
	)
	out := buf.String()
	for _, want := range []string{"one NIC per machine (fairrun --nic-gbit 10)", "error against",
		"testbed points: worst |error|",
		"predictions for M machines × D = 8 GPUs, one NIC per GPU", "rail-rsag(us)", "NCCL's double binary tree"} {
		require.Contains(t, out, want)
	}
	p, _, err := FitModel(recs, ModelOptions{})
	require.NoError(t, err)
	require.InDelta(t, truth.Net.BW, p.Net.BW, truth.Net.BW*1e-6)
	require.InDelta(t, truth.Net.BW, p.NetPerMachine, truth.Net.BW*1e-6)
	// Records of two NIC rates are refused.
	other := synthRun("r2", same)
	for i := range other {
		if other[i].Testbed.NICGbit > 0 {
			other[i].Testbed.NICGbit = 40
		}
	}
	_, _, err = FitModel(append(recs, other...), ModelOptions{})
	require.ErrorContains(t, err, "records of testbeds with NICs of [10 40] Gbit/s")
	// NICGbit fits to one rate's: the other's records are left out.
	for _, rate := range []float64{10, 40} {
		p, _, err = FitModel(append(recs, other...), ModelOptions{NICGbit: rate})
		require.NoError(t, err, "%g Gbit/s", rate)
		require.InDelta(t, truth.Net.BW, p.Net.BW, truth.Net.BW*1e-6)
	}
	var buf40 bytes.Buffer
	require.NoError(t, ModelReport(&buf40, append(recs, other...), ModelOptions{NICGbit: 40, Devices: 8,
		Machines: []int{8}, Sizes: []float64{1 << 20}}))
	require.Contains(t, buf40.String(), "(fairrun --nic-gbit 40)")
	// No testbed record of 25 Gbit/s: the pair off the testbed alone.
	_, notes, err := FitModel(append(recs, other...), ModelOptions{NICGbit: 25})
	require.NoError(t, err)
	require.NotContains(t, strings.Join(notes, "\n"), "fairrun --nic-gbit")
	require.Contains(t, strings.Join(notes, "\n"), "flat sweep points on 2×1")
}

// Without an NVLink pair in the records (a host of one GPU: only M × 1 on
// the testbed), T7 fits the network and takes the NVLink link it is given.
func TestTargetsModelWithAGivenNVLink(t *testing.T) {
	var only []bench.Record
	for _, r := range synthRun("x", same) {
		if r.Devices == 1 && r.Testbed.NICGbit > 0 {
			only = append(only, r)
		}
	}
	ts, err := Targets(only, TargetOptions{})
	require.NoError(t, err)
	require.Contains(t, strings.Join(byID(t, ts)["T7"].Missing, " "), "NVLink pair")
	ts, err = Targets(only, TargetOptions{Intra: truth.Intra})
	require.NoError(t, err)
	t7 := byID(t, ts)["T7"]
	require.Empty(t, t7.Missing)
	require.Less(t, *t7.Measured, 0.01, t7.Where)
	require.Equal(t, 3*6, t7.Points, "the 2 × 1 testbed points of every method")
}

// A host of one GPU sweeps 8 × 1 and 16 × 1 and no pair of machines: the
// network pair comes from the flat-ring sweeps on the fewest machines,
// each point read as the pair its ring implies; a 2 × 1 sweep, where
// there is one, takes precedence.
func TestFitModelNetworkFromRings(t *testing.T) {
	ring := func(m int, scale float64) func(int64) float64 {
		return func(s int64) float64 { return truth.Ring(model.Grid{M: m, D: 1}, float64(s)) * 1e6 * scale }
	}
	var recs []bench.Record
	for _, m := range []int{16, 8} { // the fewest machines are not the first records
		recs = append(recs, oneGPURun("r1", m, 1, 10, 1, map[string]func(int64) float64{
			bench.FlatRing: ring(m, 1),
			bench.Flat:     ring(m, 0.9), // NCCL's own choice is not a ring: never read
		})...)
	}
	_, _, err := FitModel(recs, ModelOptions{})
	require.ErrorContains(t, err, "NVLink pair", "no NVLink pair is given or swept")
	p, notes, err := FitModel(recs, ModelOptions{Intra: truth.Intra})
	require.NoError(t, err)
	require.InDelta(t, truth.Net.Alpha, p.Net.Alpha, truth.Net.Alpha*1e-6)
	require.InDelta(t, truth.Net.BW, p.Net.BW, truth.Net.BW*1e-6)
	require.Contains(t, strings.Join(notes, "\n"), "flat-ring sweep points on 8×1")

	// 16 × 1 alone fits the same link.
	var sixteen []bench.Record
	for _, r := range recs {
		if r.Machines == 16 {
			sixteen = append(sixteen, r)
		}
	}
	p, _, err = FitModel(sixteen, ModelOptions{Intra: truth.Intra})
	require.NoError(t, err)
	require.InDelta(t, truth.Net.BW, p.Net.BW, truth.Net.BW*1e-6)

	// A 2 × 1 sweep is the pair itself.
	pair := oneGPURun("r1", 2, 1, 10, 1, map[string]func(int64) float64{
		bench.Flat: func(s int64) float64 { return truth.Ring(model.Grid{M: 2, D: 1}, float64(s)) * 1e6 * 2 },
	})
	p, notes, err = FitModel(append(recs, pair...), ModelOptions{Intra: truth.Intra})
	require.NoError(t, err)
	require.InDelta(t, truth.Net.BW/2, p.Net.BW, truth.Net.BW*1e-6)
	require.Contains(t, strings.Join(notes, "\n"), "flat sweep points on 2×1")

	// Sweeps of calls back to back are no pair.
	for i := range recs {
		recs[i].Iters = 20
	}
	_, _, err = FitModel(recs, ModelOptions{Intra: truth.Intra})
	require.ErrorContains(t, err, "network pair")
}

// oneGPURun makes the records of the one-GPU testbed for a layout:
// the baselines, fairgo, fairgo without the check and a forced route,
// at the times given (µs, by method, per size).
func oneGPURun(
	run string,
	m, d int,
	gbit float64,
	iters int,
	times map[string]func(bytes int64) float64,
) []bench.Record {
	var recs []bench.Record
	tb := bench.Setup{
		Emulation: harness.Emulation{Machines: m, NICGbit: gbit, MPS: true, NetNS: true, Intra: harness.IntraLoopback},
		Placement: harness.Placement{RanksPerGPU: m * d},
	}
	if d == 1 {
		tb.Intra = harness.IntraNVLink
	}
	for s := int64(256 << 10); s <= 256<<20; s *= 4 {
		for alg, f := range times {
			r := bench.Record{
				Kind:      bench.KindSweep,
				Run:       run,
				Command:   "fairbench sweep -backend cuda",
				Backend:   "cuda",
				Machines:  m,
				Devices:   d,
				Processes: m * d,
				Testbed:   tb,
				DType:     "float32",
				Op:        "sum",
				Algorithm: alg,
				Bytes:     s,
				Iters:     iters,
				Reps:      3,
				TimeUS:    f(s),
			}
			switch alg {
			case bench.DefaultVariant:
				r.Fairgo = &bench.FairgoSetup{Algorithm: "auto"}
			case NoCheckVariant:
				r.Fairgo = &bench.FairgoSetup{Algorithm: "auto", Spec: "check:off"}
			case "rsag":
				r.Fairgo = &bench.FairgoSetup{Algorithm: "rail-rsag", Spec: "algo:rail-rsag"}
			}
			r.AlgBW, r.BusBW = bench.Bandwidths(s, r.TimeUS/1e6, m*d)
			r.IdealBusBW = bench.IdealBusBW(s, m, d, gbit*1e9/8)
			recs = append(recs, r)
		}
	}
	return recs
}

// Issue 18's targets come from the one-GPU testbed's records: U1 against
// naive, U2 against the best baseline, U3 against the NIC-bound ideal, U5
// against the variant without the check, U6 against the fastest fairgo
// variant; T1–T5 ignore these records (their intra link is loopback).
func TestIssue18Targets(t *testing.T) {
	ideal := func(m, d int, gbit float64) func(int64) float64 {
		return func(s int64) float64 { return float64(s) * 2 * float64(m-1) / float64(m) / (gbit * 1e9 / 8) * 1e6 }
	}
	scaled := func(f func(int64) float64, k float64) func(int64) float64 {
		return func(s int64) float64 { return f(s) * k }
	}
	var recs []bench.Record
	for _, l := range []struct {
		m, d int
		gbit float64
	}{{2, 2, 2.5}, {2, 4, 2.5}, {4, 2, 2.5}, {2, 1, 10}, {4, 1, 10}, {8, 1, 10}} {
		id := ideal(l.m, l.d, l.gbit)
		for _, it := range []int{1, 20} {
			recs = append(recs, oneGPURun("r1", l.m, l.d, l.gbit, it, map[string]func(int64) float64{
				bench.Flat: scaled(id, 1.6), bench.FlatRing: scaled(id, 1.5), bench.Naive: scaled(id, 1.2),
				bench.DefaultVariant: scaled(id, 1.06), NoCheckVariant: scaled(id, 1.05), "rsag": scaled(id, 1.04)})...)
		}
	}
	ts, err := Targets(recs, TargetOptions{})
	require.NoError(t, err)
	got := byID(t, ts)
	for id, want := range map[string]float64{"U1": 1.2 / 1.06, "U2": 1.2 / 1.06, "U3": 1 / 1.06,
		"U4": 1.2 / 1.06, "U5": 1.05 / 1.06, "U6": 1.04 / 1.06} {
		require.NotNil(t, got[id].Measured, id)
		require.InDelta(t, want, *got[id].Measured, 1e-9, id)
		require.Empty(t, got[id].Missing, id)
	}
	require.True(t, got["U1"].Pass)
	require.True(t, got["U5"].Pass)
	require.True(t, got["U6"].Pass, "1.04/1.06 is within 3%%")
	require.Equal(t, []string{"2×2 at 2.5 Gbit/s, 64×25M", "2×4 at 2.5 Gbit/s, 64×25M"}, got["U7"].Missing)
	require.Nil(t, got["T3"].Measured, "T3 takes no loopback records")
	require.Equal(
		t,
		[]string{"2×2 on the testbed", "4×2 on the testbed"},
		got["T4"].Missing,
		"T4 takes 2 × 1, not the loopback layouts",
	)
}
