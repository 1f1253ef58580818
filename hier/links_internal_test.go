package hier

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo/staging"
)

// The fit recovers a link's α and bandwidth from two probe times made with
// them.
func TestFitLinksRecoversTheModel(t *testing.T) {
	g := Grid{Machines: 4, Devices: 8}
	want := linkModel{intra: link{alpha: 20e-6, bw: 300e9}, rail: link{alpha: 400e-6, bw: 1.2e9}}
	probe := func(l link, p int, n float64) int64 {
		return int64(math.Round((2*l.alpha + 2*float64(p-1)/float64(p)*n/l.bw) * 1e9))
	}
	ns := []int64{
		probe(want.intra, 8, probeSmall),
		probe(want.intra, 8, probeLarge),
		probe(want.rail, 4, probeSmall),
		probe(want.rail, 4, probeLarge),
	}
	got := fitLinks(g, ns)
	require.InEpsilon(t, want.intra.bw, got.intra.bw, 1e-3)
	require.InEpsilon(t, want.rail.bw, got.rail.bw, 1e-3)
	require.InDelta(t, want.intra.alpha, got.intra.alpha, 1e-7)
	require.InDelta(t, want.rail.alpha, got.rail.alpha, 1e-7)

	// No intra link on one device per machine; a large probe no slower
	// than the small one gives a bandwidth and no α.
	got = fitLinks(Grid{Machines: 2, Devices: 1}, []int64{0, 0, 2e6, 2e6})
	require.Zero(t, got.intra)
	require.Zero(t, got.rail.alpha)
	require.InEpsilon(t, probeLarge/2e-3, got.rail.bw, 1e-9)
}

func TestSliceBytesExamples(t *testing.T) {
	testbed := linkModel{intra: link{alpha: 300e-6, bw: 2.8e9}, rail: link{alpha: 2e-3, bw: 0.3125e9 / 4}}
	for _, tc := range []struct {
		name   string
		g      Grid
		m      linkModel
		bytes  int64
		sliced bool
	}{
		{"one device per machine: nothing to overlap", Grid{Machines: 8, Devices: 1}, testbed, 256 << 20, false},
		{"not measured", Grid{Machines: 2, Devices: 4}, linkModel{}, 256 << 20, false},
		{"network-bound, large", Grid{Machines: 2, Devices: 4}, testbed, 256 << 20, true},
		{"small: one slice", Grid{Machines: 2, Devices: 4}, testbed, 256 << 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.m.sliceBytes(tc.g, tc.bytes)
			require.Equal(t, tc.sliced, s < tc.bytes, "slice %d of %d", s, tc.bytes)
		})
	}
}

// The chosen slice is a whole number of grid units, cuts the call into at
// most maxModelSlices, and is no slower in the model than any other number
// of slices it could have taken.
func TestSliceBytesMinimizesTheModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		g := Grid{Machines: rapid.IntRange(1, 64).Draw(t, "M"), Devices: rapid.IntRange(1, 8).Draw(t, "D")}
		m := linkModel{
			intra: link{
				alpha: rapid.Float64Range(0, 1e-3).Draw(t, "intra α"),
				bw:    rapid.Float64Range(1e8, 1e12).Draw(t, "intra B"),
			},
			rail: link{
				alpha: rapid.Float64Range(0, 1e-2).Draw(t, "rail α"),
				bw:    rapid.Float64Range(1e7, 1e11).Draw(t, "rail B"),
			},
		}
		bytes := rapid.Int64Range(1, 4<<30).Draw(t, "bytes")
		s := m.sliceBytes(g, bytes)
		if s == bytes {
			return
		}
		unit := int64(g.Size()) * staging.Align
		require.Zero(t, s%unit, "slice %d not a multiple of %d", s, unit)
		require.Less(t, s, bytes)
		k := int((bytes + s - 1) / s)
		require.LessOrEqual(t, k, maxModelSlices)
		require.Less(t, m.pipelineTime(g, bytes, k), m.pipelineTime(g, bytes, 1))
	})
}

// The fine slice is a whole number of grid units no larger than the
// model's slice, and cuts the call into fineSlices times the model's
// slices where units, maxModelSlices and the rounding to a unit allow:
// never fewer slices than the model's, never more than maxModelSlices.
func TestFineSliceBytesCutsFineSlicesTimesFiner(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		g := Grid{Machines: rapid.IntRange(1, 64).Draw(t, "M"), Devices: rapid.IntRange(1, 8).Draw(t, "D")}
		m := linkModel{
			intra: link{alpha: rapid.Float64Range(0, 1e-3).Draw(t, "intra α"), bw: rapid.Float64Range(1e8, 1e12).Draw(t, "intra B")},
			rail:  link{alpha: rapid.Float64Range(0, 1e-2).Draw(t, "rail α"), bw: rapid.Float64Range(1e7, 1e11).Draw(t, "rail B")},
		}
		bytes := rapid.Int64Range(1, 4<<30).Draw(t, "bytes")
		unit := int64(g.Size()) * staging.Align
		s, f := m.sliceBytes(g, bytes), m.fineSliceBytes(g, bytes)
		if bytes <= unit {
			require.Equal(t, bytes, f)
			return
		}
		require.LessOrEqual(t, f, s, "no coarser than the model's")
		if f < bytes {
			require.Zero(t, f%unit, "fine slice %d not a multiple of %d", f, unit)
		}
		k, kf := (bytes+s-1)/s, (bytes+f-1)/f
		require.LessOrEqual(t, kf, int64(maxModelSlices))
		require.LessOrEqual(t, kf, k*fineSlices)
		if want := min(k*fineSlices, int64(maxModelSlices), bytes/unit); kf < want {
			// Fewer only where a unit's rounding merged the last slices.
			require.Greater(t, (bytes+want-1)/want+unit-1, f-unit, "k %d, want %d, got %d", k, want, kf)
		}
	})
}

// Within calibrationTie of the fastest, the earlier candidate (the simpler
// route) wins; beyond it, the fastest.
func TestFastestBreaksTiesTowardTheEarlier(t *testing.T) {
	for _, tc := range []struct {
		times []int64
		want  int
	}{
		{[]int64{100}, 0},
		{[]int64{102, 100}, 0},
		{[]int64{104, 100}, 1},
		{[]int64{150, 103, 100}, 1},
		{[]int64{150, 110, 100}, 2},
		{[]int64{100, 100, 99}, 0},
	} {
		require.Equal(t, tc.want, fastest(tc.times), "%v", tc.times)
	}
}

// Where a class was timed one call at a time too, the candidate whose
// worse ratio to the fastest of either mode is the smallest wins; with
// bursts only, the fastest burst.
func TestChooseWeighsBothModes(t *testing.T) {
	for _, tc := range []struct {
		name          string
		burst, single []int64
		want          int
	}{
		{"bursts only", []int64{300, 200}, nil, 1},
		{"one mode decides when the other ties", []int64{200, 200}, []int64{300, 200}, 1},
		// Flat NCCL and its tree at 256 KiB on 2 × 1: the bursts favour
		// flat a little, one call at a time the tree by 1.6×.
		{"a small loss in bursts for a large gain alone", []int64{180, 195}, []int64{313, 196}, 1},
		{"a large loss in bursts for a small gain alone", []int64{100, 200}, []int64{110, 100}, 0},
		{"each mode's fastest: the one that loses less in the other", []int64{90, 100, 120}, []int64{50, 70, 40}, 0},
		{"ties on the worse ratio go to the earlier", []int64{100, 102}, []int64{102, 100}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, choose(timings{burst: tc.burst, single: tc.single}, nil))
		})
	}
}

// An exchange of fairgo's own wins only where it measures more than its
// handicap faster than NCCL's collectives, in either mode of timing.
func TestChooseHandicapsExchanges(t *testing.T) {
	flatTree := plan{route: route{algo: FlatTree}}
	hd := plan{route: route{algo: HalvingDoubling}}
	a2a := plan{route: route{algo: RailAllToAll}}
	oneGPU, fourGPUs := Grid{Machines: 8, Devices: 1}, Grid{Machines: 2, Devices: 4}
	require.Equal(t, []float64{1, 1 + exchangeHandicap, 1 + exchangeHandicap}, handicaps([]plan{flatTree, hd, a2a}, oneGPU))
	require.Equal(t, []float64{1, 1 + exchangeHandicap, 1}, handicaps([]plan{flatTree, hd, a2a}, fourGPUs),
		"the rail all-to-all of machines of several GPUs is the hierarchy's")
	h := handicaps([]plan{flatTree, hd}, oneGPU)
	for _, tc := range []struct {
		name          string
		burst, single []int64
		want          int
	}{
		// 8 × 1 64 KiB on 4 × H100 (MPS): the calibration's times of
		// NCCL's tree and halving-doubling, which then took 349 and 1762 µs.
		{"within the handicap in both modes", []int64{552, 462}, []int64{561, 589}, 0},
		{"within the handicap, bursts only", []int64{552, 462}, nil, 0},
		{"beyond it in both modes", []int64{552, 400}, []int64{561, 420}, 1},
		{"beyond it, bursts only", []int64{552, 400}, nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, choose(timings{burst: tc.burst, single: tc.single}, h))
			require.Equal(t, 1, choose(timings{burst: tc.burst, single: tc.single}, nil),
				"without the handicap the exchange wins")
		})
	}
}

// The model decides between slices and one piece only beyond the tie.
func TestSlicesPay(t *testing.T) {
	testbed := linkModel{intra: link{alpha: 300e-6, bw: 2.8e9}, rail: link{alpha: 2e-3, bw: 0.3125e9 / 4}}
	g := Grid{Machines: 2, Devices: 4}
	for _, tc := range []struct {
		name         string
		m            linkModel
		bytes, slice int64
		want         bool
	}{
		{"the model's own slices at 64 MiB", testbed, 64 << 20, testbed.sliceBytes(g, 64<<20), true},
		{"one piece", testbed, 64 << 20, 64 << 20, false},
		{"no slice", testbed, 64 << 20, 0, false},
		{"slices so small that their latency costs more", testbed, 64 << 20, 64 << 10, false},
		{"an intra link so fast that overlap gains nothing", linkModel{intra: link{bw: 1e15}, rail: testbed.rail},
			64 << 20, 8 << 20, false},
		{"a rail fitted without latency", linkModel{intra: testbed.intra, rail: link{bw: testbed.rail.bw}},
			4 << 20, 1 << 20, false},
		{"NVLink fitted without latency", linkModel{intra: link{bw: testbed.intra.bw}, rail: testbed.rail},
			64 << 20, testbed.sliceBytes(g, 64<<20), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.m.slicesPay(g, tc.bytes, tc.slice))
		})
	}
}

// Auto's candidates put the sliced rail first, so that it wins a measured
// tie, exactly where the model predicts the slices faster by more than the
// tie; otherwise the one-piece hierarchy comes first.
func TestCandidatesOrderFollowsTheModel(t *testing.T) {
	g := Grid{Machines: 2, Devices: 4}
	for _, tc := range []struct {
		name  string
		links linkModel
		first Algorithm
	}{
		{"network-bound: the slices pay",
			linkModel{intra: link{alpha: 300e-6, bw: 2.8e9}, rail: link{alpha: 2e-3, bw: 0.3125e9 / 4}}, RailRSAG},
		{"overlap gains less than the tie",
			linkModel{intra: link{alpha: 1e-6, bw: 1e11}, rail: link{alpha: 1e-6, bw: 0.3125e9}}, RailAllReduce},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config{flatThreshold: 256 << 10, layout: staging.Layout{SliceBytes: 16 << 20}}
			rt := &router{grid: g, cfg: &cfg, table: &routeTable{links: &tc.links, linksTried: true}}
			cs := rt.candidates(64 << 20)
			require.Equal(t, tc.first, cs[0].algo, "%v", cs)
			algos := map[Algorithm]bool{}
			for _, c := range cs {
				algos[c.algo] = true
			}
			require.True(t, algos[Flat] && algos[RailAllReduce] && algos[RailRSAG], "%v", cs)
			i := slices.IndexFunc(cs, func(p plan) bool { return p.fine })
			require.GreaterOrEqual(t, i, 0, "the fine slices are a candidate: %v", cs)
			require.Less(t, i, len(cs)-1, "%v", cs)
			fine, model := cs[i], cs[i+1]
			require.Equal(t, RailRSAG, fine.algo)
			require.Equal(t, plan{route: route{algo: RailRSAG, serial: fine.serial}, slice: tc.links.sliceBytes(g, 64<<20)},
				model, "the model's slices right after the fine ones: %v", cs)
			require.Equal(t, tc.links.fineSliceBytes(g, 64<<20), fine.slice)
			require.Less(t, fine.slice, model.slice)
		})
	}
}

// The log line of a fit names the probe times it came from.
func TestLinkModelStringNamesTheProbes(t *testing.T) {
	m := fitLinks(Grid{Machines: 2, Devices: 2}, []int64{100e3, 3000e3, 2500e3, 80000e3})
	require.Contains(t, m.String(), "probes of 256 KiB and 8192 KiB: intra 100.0 and 3000.0 µs, rail 2500.0 and 80000.0 µs")
	require.NotContains(t, linkModel{rail: link{bw: 1e9}}.String(), "probes")
}
