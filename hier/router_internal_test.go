package hier

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo/staging"
)

// fixedMeasurer answers the router's measurements without a device: the
// candidates' times it was given (by algorithm), and no link model.
type fixedMeasurer struct {
	times map[Algorithm]int64
	timed int        // how many calibrations it ran
	links *linkModel // what the probe measures; nil: it fails
}

func (m *fixedMeasurer) timeRoutes(_ int64, cands []plan) ([]int64, []int, error) {
	m.timed++
	out := make([]int64, len(cands))
	samples := make([]int, len(cands))
	for i, p := range cands {
		out[i] = m.times[p.algo]
		samples[i] = calibrationRounds
	}
	return out, samples, nil
}

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
			sliceSet:   true,
		}
		m := &fixedMeasurer{times: map[Algorithm]int64{
			Flat:          rapid.Int64Range(1, 100).Draw(t, "flat time"),
			RailAllReduce: rapid.Int64Range(1, 100).Draw(t, "one-piece time"),
			RailRSAG:      rapid.Int64Range(1, 100).Draw(t, "sliced time"),
		}}
		rt := testRouter(g, cfg, m)
		sizes := rapid.SliceOfN(rapid.Int64Range(1, 1<<30), 1, 20).Draw(t, "sizes")
		for _, b := range sizes {
			p := rt.route(b) // calibrates the class where Auto must
			c := rt.choiceFor(b)
			require.Equal(t, p.algo, c.Algorithm, "%d bytes: plan %v, choice %v", b, p, c)
			require.Equal(t, p.route.String(), c.String(), "%d bytes", b)
			require.Equal(t, p.algo == Flat, rt.isFlat(b), "%d bytes", b)
			require.NotEqual(t, Auto, p.algo)
			if p.algo.impl().whole() {
				require.Equal(t, b, p.slice, "an algorithm that takes the call in one piece")
			} else {
				require.Equal(t, int64(16<<20), p.slice, "WithSliceSize's slice")
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
	// The sliced rail is a candidate only where its slice cuts the call.
	require.Equal(t, map[string]int64{"flat": 50, "rail-allreduce": 10}, nanos(c.Calibration.Times))
	big := pick(rt.choices(), maxCalibrationBytes)
	require.Equal(t, map[string]int64{"flat": 50, "rail-allreduce": 10, "rail-rsag-serial": 30},
		nanos(big.Calibration.Times))
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
