package hier_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/reftest"
	"github.com/fairgo/fairgo/sim"
)

// Auto measures a size class at its first call and chooses the same
// algorithm on every rank, although each rank's own timings differ (the
// jitter is drawn per stream); results stay right throughout.
func TestAutoChoosesAlikeOnEveryRank(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 2, Devices: 2, Seed: 21, Jitter: 200 * time.Microsecond},
		hier.WithFlatThreshold(64<<10))
	before := w.reducers[0].Choices()
	require.Equal(t, hier.Flat, before[0].Algorithm)
	for _, c := range before[1:] {
		require.False(t, c.Measured, "nothing measured yet: %+v", c)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, count := range []int{20000, 70000, 300000, 20001, 1<<20 + 5} { // 80 KB, 280 KB, 1.2 MB, 4.2 MB: four classes
		in := reftest.RandomInputs(rng, fairgo.Float32, fairgo.Sum, 4, count)
		out, err := w.allReduce(t, fairgo.Float32, fairgo.Sum, in)
		require.NoError(t, err)
		require.NoError(
			t,
			reftest.CheckResults(fairgo.Float32, reftest.ComputeReference(fairgo.Float32, fairgo.Sum, in), out),
		)
	}
	first := w.reducers[0].Choices()
	measured := 0
	for _, c := range first {
		if c.Measured && c.MinBytes >= 64<<10 {
			measured++
		}
	}
	require.Equal(t, 4, measured, "one measured class per size: %+v", first)
	// Each sample of a candidate is a burst of calls back to back, and
	// one call alone beside it (classes below 4 MiB), at the size of the
	// class's first call (rounded down to 64 bytes).
	var calls uint64
	for _, c := range first {
		if c.Calibration != nil {
			require.Contains(t, []int64{80000, 280000, 1200000, 4194304}, c.Calibration.Bytes)
			burst := hier.CalibrationBurst(c.Calibration.Bytes)
			require.Equal(t, 4, burst, "%d bytes: a burst moves 64 MiB, at most 4 calls", c.Calibration.Bytes)
			require.Len(t, c.Calibration.Samples, len(c.Calibration.Times))
			alone := c.Calibration.Bytes < 4<<20
			if alone {
				require.Len(t, c.Calibration.OneAtATime, len(c.Calibration.Times))
			} else {
				require.Nil(t, c.Calibration.OneAtATime, "%d bytes: bursts only", c.Calibration.Bytes)
			}
			for route, n := range c.Calibration.Samples {
				require.True(t, n == 1 || n == hier.CalibrationRounds, "%s: %d samples", route, n)
				calls += uint64(1 + n*burst) // a warm-up call, then the bursts
				if alone {
					require.Positive(t, c.Calibration.OneAtATime[route], route)
					calls += uint64(n) // and a call alone beside each burst
				}
			}
		}
	}
	for g, r := range w.reducers {
		require.Equal(t, calls, hier.CalibrationCalls(r), "rank %d", g)
	}
	for g, r := range w.reducers[1:] {
		require.Equal(t, withoutCosts(first), withoutCosts(r.Choices()), "rank %d", g+1)
		for _, b := range []int64{1000, 80000, 280000, 1200000, 4200000, 1 << 30} {
			require.Equal(t, w.reducers[0].AlgorithmFor(b), r.AlgorithmFor(b), "rank %d, %d bytes", g+1, b)
		}
	}
}

// A fixed algorithm is reported as such; one machine is always flat.
func TestChoicesReportTheFixedAlgorithm(t *testing.T) {
	w := newWorld(
		t,
		sim.Config{Machines: 2, Devices: 1},
		hier.WithAlgorithm(hier.RailRSAG),
		hier.WithFlatThreshold(1<<20),
	)
	require.Equal(
		t,
		[]hier.Choice{
			{MinBytes: 0, Algorithm: hier.Flat, Measured: true},
			{MinBytes: 1 << 20, Algorithm: hier.RailRSAG, Serial: true, Measured: true},
		},
		w.reducers[0].Choices(),
	)
	require.Equal(t, hier.Flat, w.reducers[0].AlgorithmFor(1<<20-1))
	require.Equal(t, hier.RailRSAG, w.reducers[0].AlgorithmFor(1<<20))
	one := newWorld(t, sim.Config{Machines: 1, Devices: 4})
	require.Equal(t, hier.Flat, one.reducers[0].AlgorithmFor(1<<30))
	for _, s := range []string{"auto", "flat", "rail-a2a", "rail-rsag", "rail-allreduce", "flat-ring", "flat-tree",
		"halving-doubling"} {
		a, err := hier.ParseAlgorithm(s)
		require.NoError(t, err)
		require.Equal(t, s, a.String())
	}
	_, err := hier.ParseAlgorithm("ring")
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
}

// Inline calls (each rank driven by its own goroutine) stay in call order
// with the calls the engine enqueues: a broadcast through the engine, then
// inline allreduces on the same memory, then a hierarchical one, all with
// the caller's stream, give the sums of the broadcast values.
func TestInlineEnqueueKeepsCallOrder(t *testing.T) {
	w := newWorld(
		t,
		sim.Config{Machines: 1, Devices: 3, Seed: 5, Jitter: 100 * time.Microsecond},
		hier.WithInlineEnqueue(true),
	)
	const n, rounds = 999, 30
	rng := rand.New(rand.NewPCG(8, 9))
	in := reftest.RandomInputs(rng, fairgo.Int64, fairgo.Sum, 3, n)
	bufs := w.upload(t, fairgo.Int64, in)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for g, r := range w.reducers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := w.devs[g].NewStream()
			if err != nil {
				errs[g] = err
				return
			}
			var works []*hier.Work
			for i := range rounds {
				if i%5 == 0 { // through the engine, then (once it is done) inline again
					works = append(works, r.Broadcast(context.Background(), bufs[g], 1, hier.After(s)))
					if i%10 == 0 {
						if errs[g] = works[len(works)-1].Wait(context.Background()); errs[g] != nil {
							return
						}
					}
				}
				works = append(works, r.AllReduce(context.Background(), bufs[g], fairgo.Max, hier.After(s)))
			}
			errs[g] = reftest.WaitAll(works)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	for g, r := range w.reducers {
		require.Positive(t, hier.InlineCalls(r), "rank %d never enqueued inline", g)
	}
	want := slices.Repeat([][]byte{in[1]}, 3) // Max of three copies of rank 1's values
	require.NoError(
		t,
		reftest.CheckResults(
			fairgo.Int64,
			reftest.ComputeReference(fairgo.Int64, fairgo.Max, want),
			w.download(t, bufs),
		),
	)
}

// The hierarchy in one piece (RailAllReduce), a route Auto may choose:
// padding included, on several grids, with the integer average's single
// division over the whole row.
func TestRailAllReduceInOnePiece(t *testing.T) {
	t.Parallel() // its own simulated worlds; CPU-bound, it overlaps the other parallel tests
	for _, tc := range []struct {
		m, d, count int
		dt          fairgo.DType
	}{{2, 2, 1 << 20, fairgo.BFloat16}, {3, 2, 1000003, fairgo.BFloat16}, {4, 1, 65537, fairgo.Float32},
		{2, 3, 7, fairgo.Int32}, {3, 4, 100003, fairgo.Int64}} {
		t.Run(fmt.Sprintf("%dx%d/%d/%s", tc.m, tc.d, tc.count, tc.dt), func(t *testing.T) {
			w := newWorld(t, sim.Config{Machines: tc.m, Devices: tc.d, Seed: 7, Jitter: 20 * time.Microsecond},
				hier.WithFlatThreshold(hier.FlatNever), hier.WithSliceSize(64<<10))
			for _, r := range w.reducers {
				hier.SetRoute(r, hier.RailAllReduce)
			}
			for _, op := range []fairgo.Op{fairgo.Sum, fairgo.Avg} {
				rng := rand.New(rand.NewPCG(uint64(tc.count), 1))
				in := reftest.RandomInputs(rng, tc.dt, op, w.size(), tc.count)
				out, err := w.allReduce(t, tc.dt, op, in)
				require.NoError(t, err)
				require.NoError(t, reftest.CheckResults(tc.dt, reftest.ComputeReference(tc.dt, op, in), out))
			}
			c := w.reducers[0].Choices()
			require.Equal(t, hier.RailAllReduce, c[len(c)-1].Algorithm)
			require.Equal(t, "rail-allreduce", c[len(c)-1].String())
		})
	}
}

// withoutCosts drops what each rank's calibration cost it (its own wall
// time), keeping what every rank must agree on.
func withoutCosts(cs []hier.Choice) []hier.Choice {
	out := make([]hier.Choice, len(cs))
	for i, c := range cs {
		if c.Calibration != nil {
			cal := *c.Calibration
			cal.Cost, cal.Setup = 0, 0
			c.Calibration = &cal
		}
		out[i] = c
	}
	return out
}

// FlatNever keeps every call hierarchical, also where Auto would otherwise
// be flat (one device per machine).
func TestFlatNeverStaysHierarchicalWithOneDevicePerMachine(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 2, Devices: 1, Seed: 6}, hier.WithFlatThreshold(hier.FlatNever))
	rng := rand.New(rand.NewPCG(2, 2))
	in := reftest.RandomInputs(rng, fairgo.Float32, fairgo.Sum, w.size(), 100000)
	out, err := w.allReduce(t, fairgo.Float32, fairgo.Sum, in)
	require.NoError(t, err)
	require.NoError(
		t,
		reftest.CheckResults(fairgo.Float32, reftest.ComputeReference(fairgo.Float32, fairgo.Sum, in), out),
	)
	for _, r := range w.reducers {
		require.NotEqual(t, hier.Flat, r.AlgorithmFor(400000), "%+v", r.Choices())
	}
}

// sharingWorld builds a second Reducer on every rank of w, each taking the
// routes of w's Reducer of its rank (WithRoutesOf), with opts.
func sharingWorld(t *testing.T, w *world, opts ...hier.Option) *world {
	t.Helper()
	rs := make([]*hier.Reducer, len(w.reducers))
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for g := range rs {
		wg.Go(func() {
			rk := w.cluster.Rank(g)
			rk.Board = nil // one Reducer of the rank posts notes
			rs[g], errs[g] = hier.NewReducer(context.Background(), rk,
				append(slices.Clone(opts), hier.WithRoutesOf(w.reducers[g]))...)
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	s := &world{cluster: w.cluster, devs: w.devs, reducers: rs, m: w.m, d: w.d, closeFn: func() {}}
	t.Cleanup(s.close)
	return s
}

// Two Reducers of each rank that share their routes (WithRoutesOf) follow
// the same route at every size: a size class measured through either one
// serves the other, nothing is measured twice, and results stay right.
func TestRoutesOfShareMeasurements(t *testing.T) {
	thr := hier.WithFlatThreshold(64 << 10)
	w := newWorld(t, sim.Config{Machines: 2, Devices: 2, Seed: 5, Jitter: 200 * time.Microsecond}, thr)
	nocheck := sharingWorld(t, w, thr, hier.WithCheck(false))
	rng := rand.New(rand.NewPCG(5, 6))
	reduce := func(on *world, count int) {
		in := reftest.RandomInputs(rng, fairgo.Float32, fairgo.Sum, 4, count)
		out, err := on.allReduce(t, fairgo.Float32, fairgo.Sum, in)
		require.NoError(t, err)
		require.NoError(
			t,
			reftest.CheckResults(fairgo.Float32, reftest.ComputeReference(fairgo.Float32, fairgo.Sum, in), out),
		)
	}
	shared := func(bytes int64) {
		t.Helper()
		for g, r := range w.reducers {
			mine, theirs := r.ChoiceFor(bytes), nocheck.reducers[g].ChoiceFor(bytes)
			require.True(t, mine.Measured, "rank %d, %d bytes: %+v", g, bytes, mine)
			require.NotNil(t, mine.Calibration, "rank %d, %d bytes", g, bytes)
			require.Same(t, mine.Calibration, theirs.Calibration, "rank %d, %d bytes: measured once", g, bytes)
			require.Equal(t, mine, theirs, "rank %d, %d bytes", g, bytes)
		}
	}
	reduce(w, 300000) // 1.2 MB, measured through the first Reducers
	shared(1200000)
	reduce(nocheck, 20000) // 80 KB, measured through the second
	shared(80000)
	require.False(t, w.reducers[0].ChoiceFor(280000).Measured, "a class no call reached stays unmeasured")
	for g, r := range w.reducers {
		require.Equal(t, r.Choices(), nocheck.reducers[g].Choices(), "rank %d", g)
	}
	reduce(nocheck, 300001) // the shared class again: both sets still agree
	reduce(w, 20001)
}

// WithRoutesOf is refused, with the option's name, where the two Reducers
// could not follow one route table: another rank's Reducer, the same rank
// of another job, size classes that differ, a fixed algorithm on either
// side.
func TestRoutesOfRefusesWhatCannotShare(t *testing.T) {
	thr := hier.WithFlatThreshold(64 << 10)
	w := newWorld(t, sim.Config{Machines: 2, Devices: 2}, thr)
	other := newWorld(t, sim.Config{Machines: 2, Devices: 2}, thr)
	rk := w.cluster.Rank(0)
	rk.Board = nil
	fixed, err := hier.NewReducer(context.Background(), rk, thr, hier.WithAlgorithm(hier.RailRSAG))
	require.NoError(t, err)
	t.Cleanup(func() { _ = fixed.Close() })
	for _, tc := range []struct {
		name string
		src  *hier.Reducer
		opts []hier.Option
		want string
	}{
		{"another rank", w.reducers[1], []hier.Option{thr}, "another grid"},
		{"another job", other.reducers[0], []hier.Option{thr}, "another world communicator"},
		{"another flat threshold", w.reducers[0], []hier.Option{hier.WithFlatThreshold(128 << 10)}, "flat threshold"},
		{"a fixed algorithm here", w.reducers[0], []hier.Option{thr, hier.WithAlgorithm(hier.Flat)}, "Auto"},
		{"a fixed algorithm there", fixed, []hier.Option{thr}, "Auto"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := hier.NewReducer(context.Background(), rk, append(tc.opts, hier.WithRoutesOf(tc.src))...)
			require.Nil(t, r)
			require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
			var ae *fairgo.ArgError
			require.ErrorAs(t, err, &ae)
			require.Equal(t, "WithRoutesOf", ae.Arg)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// A candidate that the first round puts more than twice behind the fastest
// is not timed again (the sliced rail in 1 KiB slices, against one NCCL
// call), on every rank alike; the others get every round.
func TestCalibrationPrunesHopelessRoutes(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 2, Devices: 2, Seed: 5}, hier.WithFlatThreshold(64<<10),
		hier.WithSliceSize(1<<10))
	rng := rand.New(rand.NewPCG(5, 6))
	in := reftest.RandomInputs(rng, fairgo.Float32, fairgo.Sum, 4, 300000) // 1.2 MB: the 1 MiB class
	out, err := w.allReduce(t, fairgo.Float32, fairgo.Sum, in)
	require.NoError(t, err)
	require.NoError(t, reftest.CheckResults(fairgo.Float32, reftest.ComputeReference(fairgo.Float32, fairgo.Sum, in), out))
	var cal *hier.Calibration
	for _, c := range w.reducers[0].Choices() {
		if c.Calibration != nil {
			cal = c.Calibration
		}
	}
	require.NotNil(t, cal)
	var fastest time.Duration
	for _, d := range cal.Times {
		if fastest == 0 || d < fastest {
			fastest = d
		}
	}
	// A pruned candidate's time is its first sample, more than twice the
	// first round's fastest, which is no faster than the fastest's best:
	// it ends more than twice behind. A candidate that the first round
	// kept may end there too (the fastest's later rounds beat its first),
	// so the converse is not a property.
	pruned := 0
	for route, d := range cal.Times {
		switch cal.Samples[route] {
		case 1:
			require.Greater(t, d, 2*fastest, "%s was timed once: %v", route, cal.Times)
			pruned++
		case hier.CalibrationRounds:
		default:
			require.Failf(t, "neither pruned nor timed every round", "%s: %d samples", route, cal.Samples[route])
		}
	}
	sliced := ""
	for route := range cal.Times {
		if strings.HasPrefix(route, "rail-rsag") {
			sliced = route
		}
	}
	require.NotEmpty(t, sliced, "the sliced rail is a candidate: %v", cal.Times)
	require.Equal(t, 1, cal.Samples[sliced], "1 KiB slices: %v", cal.Times)
	require.Positive(t, pruned)
	for g, r := range w.reducers[1:] {
		require.Equal(t, withoutCosts(w.reducers[0].Choices()), withoutCosts(r.Choices()), "rank %d", g+1)
	}
}

// Ranks whose first calls of a class differ in size (a mismatch, which
// the call's check then reports) still time the class alike: at 1.5 times
// its smallest size, never each at its own, which would leave their
// timing collectives of different sizes.
func TestCalibrationOfMismatchedFirstCalls(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 2, Devices: 1, Seed: 5, StallTimeout: 10 * time.Second},
		hier.WithFlatThreshold(64<<10), hier.WithTimeout(5*time.Second))
	ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 280000), make([]byte, 280064)})
	for _, r := range w.reducers { // the check, enqueued before the data, waits for the calibration
		hier.HoldChecker(r, true)
		t.Cleanup(func() { hier.HoldChecker(r, false) })
	}
	works := []*hier.Work{
		w.reducers[0].AllReduce(context.Background(), ts[0], fairgo.Sum),
		w.reducers[1].AllReduce(context.Background(), ts[1], fairgo.Sum),
	}
	for _, wk := range works {
		<-wk.Enqueued()
	}
	for _, r := range w.reducers {
		hier.HoldChecker(r, false)
	}
	for g, wk := range works {
		require.Error(t, wk.Wait(context.Background()), "rank %d", g)
		c := pickChoice(w.reducers[g].Choices(), 280000)
		require.True(t, c.Measured, "rank %d", g)
		require.NotNil(t, c.Calibration, "rank %d", g)
		require.Equal(t, int64(384<<10), c.Calibration.Bytes, "rank %d", g)
	}
}

// pickChoice is the Choice of cs that covers bytes.
func pickChoice(cs []hier.Choice, bytes int64) hier.Choice {
	var out hier.Choice
	for _, c := range cs {
		if bytes >= c.MinBytes {
			out = c
		}
	}
	return out
}
