package hier

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/staging"
)

// fixedMeasurer answers the router's measurements without a device: the
// candidates' times it was given (by algorithm), and no link model. With
// variants, its world variants are stubs that count their closes.
type fixedMeasurer struct {
	times    map[Algorithm]int64
	fine     int64      // the time of the rail in fine slices; 0: its algorithm's
	timed    int        // how many calibrations it ran
	links    *linkModel // what the probe measures; nil: it fails
	variants bool
	made     []*stubComm // the world variants it made, in order
	cands    [][]Algorithm
	sizes    []int64 // the sizes each calibration proposed
	disagree bool    // agreedSize finds the ranks' sizes different
}

func (m *fixedMeasurer) timeRoutes(_ int64, cands []plan) (timings, error) {
	m.timed++
	out := make([]int64, len(cands))
	samples := make([]int, len(cands))
	var algos []Algorithm
	for i, p := range cands {
		out[i] = m.times[p.algo]
		if p.fine && m.fine != 0 {
			out[i] = m.fine
		}
		if out[i] == 0 {
			out[i] = 1000
		}
		samples[i] = calibrationRounds
		algos = append(algos, p.algo)
		if p.algo.variant() != "" && p.comm == nil {
			return timings{}, errors.New("a world variant's candidate without its communicator")
		}
	}
	m.cands = append(m.cands, algos)
	return timings{burst: out, samples: samples}, nil
}

func (m *fixedMeasurer) agreedSize(size int64) (int64, bool, error) {
	m.sizes = append(m.sizes, size)
	return size, !m.disagree, nil
}

func (m *fixedMeasurer) hasVariants() bool { return m.variants }

func (m *fixedMeasurer) world(algo backend.NCCLAlgo) (backend.Comm, error) {
	if !m.variants {
		return nil, errNoVariants(FlatRing)
	}
	c := &stubComm{name: string(algo)}
	m.made = append(m.made, c)
	return c, nil
}

// stubComm is a communicator that only counts its closes.
type stubComm struct {
	backend.Comm
	name   string
	closed int
}

func (c *stubComm) Close() error { c.closed++; return nil }
func (c *stubComm) Abort() error { return nil }

func (m *fixedMeasurer) probeLinks() (linkModel, error) {
	if m.links != nil {
		return *m.links, nil
	}
	return linkModel{}, errors.New("no links here")
}
func (m *fixedMeasurer) release() error { return nil }

func testRouter(g Grid, cfg config, m measurer) *router {
	cfg.logger = slog.New(slog.DiscardHandler)
	if cfg.layout.SliceBytes == 0 {
		cfg.layout = staging.Layout{SliceBytes: 16 << 20}
	}
	return newRouter(g, &cfg, m, nil)
}

// The route is decided once: for any grid, options and calibration, the
// plan of a call, the choice table's entry for its size and the inline
// path's flat test agree.
func TestRouteChoicesAndInlineAgree(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		g := Grid{Machines: rapid.IntRange(1, 4).Draw(t, "M"), Devices: rapid.IntRange(1, 4).Draw(t, "D")}
		cfg := config{
			algorithm: Algorithm(rapid.IntRange(0, int(numAlgorithms)-1).Draw(t, "algorithm")),
			flatThreshold: rapid.SampledFrom([]int64{FlatNever, 0, 1 << 10, 64 << 10, 256 << 10, 4 << 20,
				128 << 20}).Draw(t, "flat threshold"),
			serialRail: rapid.Bool().Draw(t, "serial"),
			serialSet:  rapid.Bool().Draw(t, "serial set"),
			sliceSet:   rapid.Bool().Draw(t, "slice set"),
		}
		m := &fixedMeasurer{times: map[Algorithm]int64{}, variants: rapid.Bool().Draw(t, "variants")}
		if rapid.Bool().Draw(t, "links") {
			m.links = &linkModel{intra: link{alpha: 5e-6, bw: 100e9}, rail: link{alpha: 20e-6, bw: 1e9}}
		}
		for a := Flat; a < numAlgorithms; a++ {
			m.times[a] = rapid.Int64Range(1, 100).Draw(t, a.String()+" time")
		}
		rt := testRouter(g, cfg, m)
		sizes := rapid.SliceOfN(rapid.Int64Range(1, 1<<30), 1, 20).Draw(t, "sizes")
		for _, b := range sizes {
			if rt.inlineable(b) { // known already: the plan route makes, in one piece or one slice
				p := rt.route(b)
				require.True(t, p.algo.impl().single() || p.slice >= b, "%d bytes inline: %v", b, p)
			}
			p := rt.route(b) // calibrates the class where Auto must
			for range 2 {    // read from the table, then settled
				again := rt.route(b)
				require.Equal(t, p.route, again.route, "%d bytes: the route known again", b)
			}
			// A settled class's plan for a call whole is kept, and answers
			// for every size of the class as the table, the links and the
			// variants would.
			if r, class := rt.settledRoute(b); r != nil && *r == p.route && p.algo.impl().whole() && p.commErr == nil {
				_, kept := rt.settledWhole(b)
				require.True(t, kept, "%d bytes: %v settled, not kept", b, p)
				lo := rt.classBase() << class
				other := rapid.Int64Range(lo, max(lo, min(2*lo-1, 4*maxCalibrationBytes))).Draw(t, "same class")
				if c, _ := rt.classOf(other); c == class {
					got, ok := rt.settledWhole(other)
					require.True(t, ok)
					require.Equal(t, rt.freshPlan(other), got, "%d bytes, kept for %d", other, b)
					require.Equal(t, rt.freshInlineable(other), rt.inlineable(other), "%d bytes", other)
				}
			}
			c := rt.choiceFor(b)
			require.Equal(t, p.algo, c.Algorithm, "%d bytes: plan %v, choice %v", b, p, c)
			require.Equal(t, p.route.String(), c.String(), "%d bytes", b)
			require.Equal(t, p.algo.impl().single() && (p.algo.variant() == "" || p.comm != nil), rt.isFlat(b),
				"%d bytes", b)
			if rt.table.linksSettled() || cfg.sliceSet || b < probeMinBytes || p.algo.impl().whole() {
				require.Equal(t, rt.isFlat(b) || !p.algo.impl().single() && p.slice >= b, rt.inlineable(b),
					"%d bytes, plan %v", b, p)
			}
			require.NotEqual(t, Auto, p.algo)
			if g.Machines == 1 {
				require.False(t, p.algo.hierarchical(), "one machine: %v", p)
			}
			if p.algo.variant() != "" {
				if m.variants {
					require.NotNil(t, p.comm, "%v: its world variant", p)
				} else {
					require.Equal(t, cfg.algorithm, p.algo, "Auto takes no variant without Variants")
					var ae *fairgo.ArgError
					require.ErrorAs(t, p.commErr, &ae)
				}
			}
			if p.algo.impl().whole() {
				require.Equal(t, b, p.slice, "an algorithm that takes the call in one piece")
			} else {
				if cfg.sliceSet {
					require.Equal(t, int64(16<<20), p.slice, "WithSliceSize's slice")
				}
				if cfg.algorithm == Auto && p.algo == RailRSAG {
					require.Less(t, p.slice, b, "Auto's sliced rail cuts the call")
				}
			}
		}
	})
}

// Where Auto chose the sliced rail for a class but the links keep a call
// of the class whole, the call runs as the hierarchy in one piece, and
// ChoiceFor says so; a fixed algorithm is followed as given.
func TestAutoTakesAnUncutCallInOnePiece(t *testing.T) {
	// r1's 2 × 4 on the one-GPU testbed: 1 MiB in one slice, 1.5 MiB in two.
	links := &linkModel{intra: link{alpha: 296e-6, bw: 2.94e9}, rail: link{alpha: 150e-6, bw: 0.079e9}}
	g := Grid{Machines: 2, Devices: 4}
	require.Equal(t, int64(1<<20), links.sliceBytes(g, 1<<20))
	require.Less(t, links.sliceBytes(g, 3<<19), int64(3<<19))
	m := &fixedMeasurer{times: map[Algorithm]int64{Flat: 50, RailAllReduce: 30, RailRSAG: 20}, links: links}
	rt := testRouter(g, config{flatThreshold: 256 << 10}, m)
	for _, tc := range []struct {
		bytes int64
		want  Algorithm
	}{{3 << 19, RailRSAG}, {1 << 20, RailAllReduce}, {2<<20 - 64, RailRSAG}} {
		p := rt.route(tc.bytes)
		require.Equal(t, tc.want, p.algo, "%d bytes", tc.bytes)
		c := rt.choiceFor(tc.bytes)
		require.Equal(t, tc.want, c.Algorithm, "%d bytes", tc.bytes)
		require.Equal(t, p.route.String(), c.String(), "%d bytes", tc.bytes)
		require.True(t, c.Measured)
		require.NotNil(t, c.Calibration, "the class's calibration")
		if tc.want == RailAllReduce {
			require.Equal(t, tc.bytes, p.slice)
		} else {
			require.Less(t, p.slice, tc.bytes)
		}
	}
	require.Equal(t, 1, m.timed, "one class")
	require.Equal(t, RailRSAG, pick(rt.choices(), 1<<20).Algorithm, "the class's choice is unchanged")

	fixed := testRouter(g, config{flatThreshold: 256 << 10, algorithm: RailRSAG}, m)
	p := fixed.route(1 << 20)
	require.Equal(t, RailRSAG, p.algo, "a fixed algorithm is followed")
	require.Equal(t, int64(1<<20), p.slice)
	require.Equal(t, RailRSAG, fixed.choiceFor(1<<20).Algorithm)
}

// Auto times the sliced rail in the model's slices and in fineSlices
// times as many, the fine ones just before the model's; where they
// measure faster or tie, every call of the class is cut in fine slices and
// ChoiceFor says so.
func TestAutoTimesFineSlices(t *testing.T) {
	// The one-GPU testbed's 2 × 4 (2.5 Gbit/s NIC): the model cuts 25 MiB
	// in two.
	links := &linkModel{intra: link{alpha: 374e-6, bw: 2.98e9}, rail: link{alpha: 1172e-6, bw: 0.087e9}}
	g := Grid{Machines: 2, Devices: 4}
	const bytes = 25 << 20
	model, fine := links.sliceBytes(g, bytes), links.fineSliceBytes(g, bytes)
	require.Less(t, model, int64(bytes))
	require.Less(t, fine, model)
	for _, tc := range []struct {
		name      string
		fine      int64
		wantFine  bool
		wantSlice int64
	}{
		{"fine slices faster", 80, true, fine},
		{"a tie goes to the fine slices", 102, true, fine},
		{"the model's slices faster", 110, false, model},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &fixedMeasurer{times: map[Algorithm]int64{Flat: 500, RailAllReduce: 120, RailRSAG: 100}, fine: tc.fine,
				links: links}
			rt := testRouter(g, config{flatThreshold: 256 << 10}, m)
			p := rt.route(bytes)
			require.Equal(t, RailRSAG, p.algo)
			require.Equal(t, tc.wantFine, p.fine)
			require.Equal(t, tc.wantSlice, p.slice)
			require.Len(t, m.cands, 1)
			cands := m.cands[0]
			i := slices.Index(cands, RailRSAG)
			require.Equal(t, []Algorithm{RailRSAG, RailRSAG}, cands[i:i+2], "the fine slices, then the model's: %v", cands)
			c := rt.choiceFor(bytes)
			require.Equal(t, tc.wantFine, c.Fine)
			require.Equal(t, p.route.String(), c.String())
			times := nanos(c.Calibration.Times)
			require.Contains(t, times, "rail-rsag-serial-fine")
			require.Contains(t, times, "rail-rsag-serial")
			smaller := rt.route(17 << 20) // the same class: its own fine slices
			require.Equal(t, tc.wantFine, smaller.fine)
			if tc.wantFine {
				require.Equal(t, links.fineSliceBytes(g, 17<<20), smaller.slice)
				require.Equal(t, "rail-rsag-serial-fine", c.String())
			}
		})
	}
	// Below 4 MiB, where classes are timed one call at a time too, no fine
	// candidate.
	m := &fixedMeasurer{times: map[Algorithm]int64{Flat: 500, RailAllReduce: 120, RailRSAG: 100}, fine: 1, links: links}
	rt := testRouter(g, config{flatThreshold: 256 << 10}, m)
	require.False(t, rt.route(3<<20).fine)
	require.NotContains(t, nanos(pick(rt.choices(), 3<<20).Calibration.Times), "rail-rsag-serial-fine")
	// With WithSliceSize the slices are the caller's: no fine candidate.
	m = &fixedMeasurer{times: map[Algorithm]int64{Flat: 500, RailAllReduce: 120, RailRSAG: 100}, fine: 1, links: links}
	rt = testRouter(g, config{flatThreshold: 256 << 10, sliceSet: true}, m)
	require.False(t, rt.route(bytes).fine)
	require.NotContains(t, nanos(pick(rt.choices(), bytes).Calibration.Times), "rail-rsag-serial-fine")
}

// Each size class is calibrated once, by its first call, and every later
// call of the class follows what it measured; calls beyond the largest
// calibrated size share its class.
func TestRouteCalibratesEachClassOnce(t *testing.T) {
	m := &fixedMeasurer{times: map[Algorithm]int64{Flat: 50, RailAllReduce: 10, RailRSAG: 30}}
	rt := testRouter(Grid{Machines: 2, Devices: 2}, config{flatThreshold: 256 << 10, sliceSet: true}, m)
	require.Equal(t, Flat, rt.route(100<<10).algo, "below the threshold")
	require.Equal(t, 0, m.timed)
	require.Equal(t, RailAllReduce, rt.route(300<<10).algo)
	require.Equal(t, RailAllReduce, rt.route(500<<10-1).algo)
	require.Equal(t, 1, m.timed, "one class so far")
	rt.route(maxCalibrationBytes)
	rt.route(4 * maxCalibrationBytes)
	require.Equal(t, 2, m.timed, "calls beyond the largest class share it")
	c := pick(rt.choices(), 300<<10)
	require.True(t, c.Measured)
	require.NotNil(t, c.Calibration)
	// The sliced rail is a candidate only where its slice cuts the call;
	// halving-doubling up to hdMaxBytes.
	require.Equal(t, map[string]int64{"flat": 50, "rail-allreduce": 10, "halving-doubling": 1000},
		nanos(c.Calibration.Times))
	big := pick(rt.choices(), maxCalibrationBytes)
	require.Equal(t, map[string]int64{"flat": 50, "rail-allreduce": 10, "rail-rsag-serial": 30},
		nanos(big.Calibration.Times))
	// A class is timed at its first call's size; the last, open-ended
	// class at its bound.
	require.Equal(t, []int64{300 << 10, maxCalibrationBytes}, m.sizes)
	require.Equal(t, int64(300<<10), c.Calibration.Bytes)
	require.Equal(t, int64(maxCalibrationBytes), big.Calibration.Bytes)
}

// A class is timed at the size of its first call, rounded down to 64
// bytes, where every rank's first call has that size; where they differ,
// at 1.5 times the class's smallest size, which needs no agreement.
func TestCalibrationTimesTheFirstCallsSize(t *testing.T) {
	for _, disagree := range []bool{false, true} {
		m := &fixedMeasurer{disagree: disagree}
		rt := testRouter(Grid{Machines: 2, Devices: 2}, config{flatThreshold: 64 << 10, sliceSet: true}, m)
		rt.route(300<<10 + 63)
		rt.route(70 << 10)
		want := []int64{300<<10 + 63, 70 << 10}
		if disagree {
			want = []int64{384 << 10, 96 << 10}
		}
		require.Equal(t, []int64{300 << 10, 70 << 10}, m.sizes, "proposed")
		require.Equal(t, want[0]/64*64, pick(rt.choices(), 300<<10).Calibration.Bytes, "disagree %v", disagree)
		require.Equal(t, want[1], pick(rt.choices(), 70<<10).Calibration.Bytes, "disagree %v", disagree)
	}
}

func nanos[K comparable, V ~int64](m map[K]V) map[K]int64 {
	out := map[K]int64{}
	for k, v := range m {
		out[k] = int64(v)
	}
	return out
}

// A calibration sample is a burst that moves calibrationBurstBytes, of 1 to
// calibrationMaxBurst calls.
func TestCalibrationBurst(t *testing.T) {
	for _, tc := range []struct {
		size int64
		want int
	}{
		{0, 1}, {-1, 1}, {1, 4}, {96 << 10, 4}, {6 << 20, 4}, {16 << 20, 4}, {24 << 20, 2},
		{32 << 20, 2}, {48 << 20, 1}, {64 << 20, 1}, {1 << 30, 1},
	} {
		require.Equal(t, tc.want, calibrationBurst(tc.size), "%d bytes", tc.size)
	}
}

// Auto's candidates per grid, in their tie-breaking order: world variants
// only where the backend makes them, halving-doubling from 4 ranks up to
// 4 MiB, the rail all-to-all with one device per machine, the hierarchy's
// forms across machines, nothing over the world communicator with
// FlatNever.
func TestCandidatesPerGrid(t *testing.T) {
	const small, large = 96 << 10, 6 << 20
	for _, tc := range []struct {
		name     string
		g        Grid
		variants bool
		flat     int64
		bytes    int64
		want     []Algorithm
	}{
		{"one machine of two", Grid{Machines: 1, Devices: 2}, false, 0, small, []Algorithm{Flat}},
		{"one machine of two, variants", Grid{Machines: 1, Devices: 2}, true, 0, small,
			[]Algorithm{Flat, FlatRing, FlatTree}},
		{"one machine of four", Grid{Machines: 1, Devices: 4}, false, 0, small, []Algorithm{Flat, HalvingDoubling}},
		{"one machine of four, large", Grid{Machines: 1, Devices: 4}, false, 0, large, []Algorithm{Flat}},
		{"2 x 1", Grid{Machines: 2, Devices: 1}, false, 0, small, []Algorithm{Flat, RailAllToAll}},
		{"8 x 1, variants", Grid{Machines: 8, Devices: 1}, true, 0, small,
			[]Algorithm{Flat, FlatRing, FlatTree, HalvingDoubling, RailAllToAll}},
		{"8 x 1, variants, large", Grid{Machines: 8, Devices: 1}, true, 0, large,
			[]Algorithm{Flat, FlatRing, FlatTree, RailAllToAll}},
		{"4 x 1, FlatNever", Grid{Machines: 4, Devices: 1}, true, FlatNever, small,
			[]Algorithm{RailAllReduce, RailAllToAll}},
		{"2 x 2, variants", Grid{Machines: 2, Devices: 2}, true, 0, large,
			[]Algorithm{RailAllReduce, Flat, FlatRing, FlatTree, RailRSAG}},
		{"2 x 4, FlatNever", Grid{Machines: 2, Devices: 4}, true, FlatNever, small, []Algorithm{RailAllReduce, RailRSAG}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := testRouter(tc.g, config{flatThreshold: tc.flat}, &fixedMeasurer{variants: tc.variants})
			var got []Algorithm
			for _, r := range rt.candidateRoutes(tc.bytes) {
				got = append(got, r.algo)
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// Auto measures every size class with more than one candidate, with one
// device per machine and on one machine too; calls below the smallest
// class, below a flat threshold the user gave, and classes with flat as
// their only candidate are flat without measuring.
func TestDecideMeasuresWhereThereIsAChoice(t *testing.T) {
	for _, tc := range []struct {
		name     string
		g        Grid
		variants bool
		flat     int64 // WithFlatThreshold; 0: none given
		measured []int64
		flatAt   []int64
	}{
		{"8 x 1", Grid{Machines: 8, Devices: 1}, false, 0,
			[]int64{64 << 10, 256 << 10, 1 << 20, 64 << 20, 1 << 30}, []int64{1, 64<<10 - 1}},
		{"4 x 1, a threshold given", Grid{Machines: 4, Devices: 1}, true, 1 << 20,
			[]int64{1 << 20, 8 << 20}, []int64{64 << 10, 1<<20 - 1}},
		{"one machine of four", Grid{Machines: 1, Devices: 4}, false, 0,
			[]int64{64 << 10, 4<<20 - 1}, []int64{64<<10 - 1, 4 << 20, 1 << 30}},
		{"one machine of two, variants", Grid{Machines: 1, Devices: 2}, true, 0,
			[]int64{64 << 10, 1 << 30}, []int64{1000}},
		{"one machine of two", Grid{Machines: 1, Devices: 2}, false, 0, nil, []int64{64 << 10, 1 << 30}},
		{"one rank", Grid{Machines: 1, Devices: 1}, true, 0, nil, []int64{64 << 10, 1 << 30}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []Option
			if tc.flat != 0 {
				opts = append(opts, WithFlatThreshold(tc.flat))
			}
			cfg, err := buildConfig(tc.g, opts)
			require.NoError(t, err)
			rt := testRouter(tc.g, cfg, &fixedMeasurer{variants: tc.variants})
			for _, b := range tc.measured {
				_, class, fixed := rt.decide(b)
				require.False(t, fixed, "%d bytes", b)
				require.GreaterOrEqual(t, class, 0, "%d bytes", b)
			}
			for _, b := range tc.flatAt {
				r, _, fixed := rt.decide(b)
				require.True(t, fixed, "%d bytes", b)
				require.Equal(t, Flat, r.algo, "%d bytes", b)
			}
		})
	}
}

// A world variant is made once, at the first calibration that has it as
// a candidate; once every size class is measured, the variants no class
// chose are closed, the chosen one is kept for its calls and closed with
// the Reducer.
func TestWorldVariantsLiveWhileAClassUsesThem(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fastest Algorithm
		kept    []string
	}{
		{"flat fastest", Flat, nil},
		{"tree fastest", FlatTree, []string{"tree"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &fixedMeasurer{variants: true, times: map[Algorithm]int64{tc.fastest: 1}}
			cfg, err := buildConfig(Grid{Machines: 1, Devices: 2}, []Option{WithFlatThreshold(16 << 20)})
			require.NoError(t, err)
			rt := testRouter(Grid{Machines: 1, Devices: 2}, cfg, m)
			require.Equal(t, 3, rt.numClasses(), "16, 32 and 64 MiB")
			rt.route(20 << 20)
			require.Len(t, m.made, 2, "both variants, at the first calibration")
			require.Len(t, rt.worldComms(), 2)
			rt.route(40 << 20)
			for _, c := range m.made {
				require.Zero(t, c.closed, "%s: a class is still to measure", c.name)
			}
			p := rt.route(1 << 30)
			require.Equal(t, tc.fastest, p.algo)
			require.Len(t, m.made, 2, "made once")
			var kept []string
			for _, c := range m.made {
				if c.closed == 0 {
					kept = append(kept, c.name)
				} else {
					require.Equal(t, 1, c.closed, "%s closed once", c.name)
				}
			}
			require.Equal(t, tc.kept, kept)
			require.Len(t, rt.worldComms(), len(tc.kept))
			if tc.fastest == FlatTree {
				require.Same(t, m.made[1], p.comm.(*stubComm), "the call runs on the kept variant")
			}
			require.NoError(t, rt.closeWorlds(false))
			for _, c := range m.made {
				require.Equal(t, 1, c.closed, "%s: closed once in all", c.name)
			}
			require.Empty(t, rt.worldComms())
		})
	}
}

// A fixed world variant without a backend that makes one fails with an
// *fairgo.ArgError: the options' check against the rank, and any plan of
// it.
func TestFixedWorldVariantNeedsVariants(t *testing.T) {
	g := Grid{Machines: 2, Devices: 1}
	for _, a := range []Algorithm{FlatRing, FlatTree} {
		cfg, err := buildConfig(g, []Option{WithAlgorithm(a)})
		require.NoError(t, err)
		var ae *fairgo.ArgError
		require.ErrorAs(t, cfg.checkRank(backend.Rank{Grid: g}), &ae)
		require.Equal(t, "WithAlgorithm", ae.Arg)
		require.NoError(t, cfg.checkRank(backend.Rank{Grid: g, Variants: noVariants{}}))
		rt := testRouter(g, cfg, &fixedMeasurer{})
		p := rt.route(1 << 20)
		require.Equal(t, a, p.algo)
		require.Nil(t, p.comm)
		require.ErrorAs(t, p.commErr, &ae)
	}
	cfg, err := buildConfig(g, []Option{WithAlgorithm(HalvingDoubling)})
	require.NoError(t, err)
	require.NoError(t, cfg.checkRank(backend.Rank{Grid: g}), "halving-doubling needs the world communicator only")
}

type noVariants struct{}

func (noVariants) World(context.Context, backend.NCCLAlgo) (backend.Comm, error) {
	return nil, errors.New("none")
}

// A call whose plan waits for the links' probe (a collective) is not
// enqueued inline until the probe has run; asking never probes. Once the
// links are known, a call that they cut into several slices goes through
// the engine, one they take whole goes inline.
func TestInlineWaitsForTheLinks(t *testing.T) {
	g := Grid{Machines: 2, Devices: 4}
	cfg, err := buildConfig(g, []Option{WithAlgorithm(RailRSAG)})
	require.NoError(t, err)
	m := &fixedMeasurer{links: &linkModel{intra: link{alpha: 5e-6, bw: 100e9}, rail: link{alpha: 20e-6, bw: 1e9}}}
	rt := testRouter(g, cfg, m)
	require.True(t, rt.inlineable(probeMinBytes/2), "below the probe's size: the layout's slice")
	require.False(t, rt.inlineable(probeMinBytes), "the probe first")
	require.False(t, rt.table.linksSettled(), "asking does not probe")
	big := int64(256 << 20)
	p := rt.route(big)
	require.True(t, rt.table.linksSettled())
	require.Less(t, p.slice, big, "the links cut 256 MiB")
	require.False(t, rt.inlineable(big), "several slices: through the engine")
	require.True(t, rt.inlineable(probeMinBytes) == (rt.route(probeMinBytes).slice >= probeMinBytes))

	// The hierarchy in one piece plans without the links: inline before
	// any probe.
	cfg, err = buildConfig(g, []Option{WithAlgorithm(RailAllReduce)})
	require.NoError(t, err)
	rt = testRouter(g, cfg, m)
	require.True(t, rt.inlineable(big))
	require.False(t, rt.table.linksSettled())
}

// A fixed world variant is flat for the inline path and the check in the
// call's own collective only once its communicator is made: the call that
// makes it (a collective) goes through the engine.
func TestFixedWorldVariantIsFlatOnceMade(t *testing.T) {
	g := Grid{Machines: 4, Devices: 1}
	cfg, err := buildConfig(g, []Option{WithAlgorithm(FlatTree)})
	require.NoError(t, err)
	m := &fixedMeasurer{variants: true}
	rt := testRouter(g, cfg, m)
	require.True(t, rt.isFlat(100), "below the threshold: flat")
	require.False(t, rt.isFlat(1<<20), "its communicator is still to make")
	p := rt.route(1 << 20)
	require.Equal(t, FlatTree, p.algo)
	require.Len(t, m.made, 1)
	require.True(t, rt.isFlat(1<<20))
	require.True(t, rt.isFlat(1<<30))
	require.Len(t, m.made, 1, "made once")
}

// closeLog is a world variant's communicator that records when it is
// closed.
type closeLog struct {
	backend.Comm
	name string
	log  *[]string
}

func (c closeLog) Close() error { *c.log = append(*c.log, c.name); return nil }
func (c closeLog) Abort() error { return nil }

// Every rank closes its world variants in one order: NCCL's destroy
// finalizes with the peers, so two ranks that closed the ring and the tree
// in opposite orders (the orders of their maps) waited on each other.
func TestWorldVariantsCloseInOneOrder(t *testing.T) {
	for range 50 {
		var log []string
		rt := testRouter(Grid{Machines: 2, Devices: 1}, config{}, &fixedMeasurer{})
		for _, v := range []backend.NCCLAlgo{backend.AlgoTree, backend.AlgoRing} {
			rt.worlds[v] = &worldVariant{comm: closeLog{name: string(v), log: &log}}
		}
		require.NoError(t, rt.closeWorlds(false))
		require.Equal(t, []string{string(backend.AlgoRing), string(backend.AlgoTree)}, log)
		require.Empty(t, rt.worlds)
	}
}

// classOf is the integer log2 of the size over the classes' base, capped
// at the last class: base<<class <= min(bytes, top) < base<<(class+1).
func TestClassOfBoundsTheSize(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		threshold := rapid.SampledFrom([]int64{FlatNever, 1, 1000, 64 << 10, 2826158, 8 << 20}).Draw(t, "threshold")
		rt := testRouter(Grid{Machines: 2, Devices: 2}, config{flatThreshold: threshold}, &fixedMeasurer{})
		base := rt.classBase()
		bytes := rapid.Int64Range(1, 1<<40).Draw(t, "bytes")
		class, ok := rt.classOf(bytes)
		if bytes < base {
			require.False(t, ok)
			return
		}
		require.True(t, ok)
		capped := min(bytes, max(rt.topClass(), base))
		require.LessOrEqual(t, base<<class, capped)
		require.Less(t, capped, base<<(class+1))
	})
}

// The size a class is timed at is a multiple of 64 bytes inside the class
// (the last class: at most its bound), whatever the flat threshold and
// the first call's size: the timed calls' buffers sit one after another
// in scratch memory, and a kernel or NCCL fails on a misaligned one (a
// threshold of 2826158 bytes once timed at 2826158).
func TestTimedSizeIsAlignedInsideTheClass(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		threshold := rapid.Int64Range(1, 8<<20).Draw(t, "threshold")
		rt := testRouter(Grid{Machines: 2, Devices: 2}, config{flatThreshold: threshold}, &fixedMeasurer{})
		bytes := rapid.Int64Range(rt.classBase(), 4*maxCalibrationBytes).Draw(t, "bytes")
		class, ok := rt.classOf(bytes)
		require.True(t, ok)
		lo := rt.classBase() << class
		size := rt.timedSize(class, bytes)
		require.Zero(t, size%64, "timed at %d bytes", size)
		if class == rt.numClasses()-1 {
			require.LessOrEqual(t, size, max(rt.topClass(), lo))
			return
		}
		require.GreaterOrEqual(t, size, lo)
		require.Less(t, size, 2*lo)
		require.LessOrEqual(t, size, max(bytes, (lo+63)/64*64))
	})
}
