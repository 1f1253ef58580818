package hier_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/elem"
	"github.com/fairgo/fairgo/internal/reftest"
	"github.com/fairgo/fairgo/sim"
	"github.com/fairgo/fairgo/streams"
)

// Counts that differ only past the last multiple of M·D go through the same
// collectives on every rank: only the check tells them apart. Every rank's
// Work fails with a MismatchError; none returns nil.
func TestCountsDifferingInTheTailFail(t *testing.T) {
	for _, tc := range []struct {
		counts   []int
		algo     hier.Algorithm
		machines int
	}{
		{[]int{1002, 1001, 1001, 1001}, hier.RailAllToAll, 2},
		{[]int{1048577, 1048578, 1048578, 1048578}, hier.RailRSAG, 2},
		{[]int{1001, 1001, 1001, 1002}, hier.Flat, 2},
		{[]int{1001, 1001, 1001, 1002}, hier.Flat, 1}, // the shared memory's check
		{[]int{1001, 1002, 1001, 1001}, hier.HalvingDoubling, 2},
		{[]int{1001, 1001, 1002, 1001}, hier.RecursiveDoubling, 4},
	} {
		t.Run(fmt.Sprintf("%v/%d×%d", tc.algo, tc.machines, 4/tc.machines), func(t *testing.T) {
			w := newWorld(
				t,
				sim.Config{Machines: tc.machines, Devices: 4 / tc.machines, Seed: 3},
				hier.WithFlatThreshold(hier.FlatNever),
				hier.WithAlgorithm(tc.algo),
				hier.WithFingerprintMax(0), // the separate check, which names the range
			)
			if tc.machines == 1 {
				warmUp(t, w, beforeSharedMemory)
			}
			for g, wk := range sumOfCounts(t, w, tc.counts) {
				err := wk.Wait(context.Background())
				require.ErrorIs(t, err, fairgo.ErrMismatch, "rank %d", g)
				var me *hier.MismatchError
				require.ErrorAs(t, err, &me)
				require.Equal(t, "count", me.Field)
				require.Contains(t, err.Error(), "count")
				require.ErrorIs(t, w.reducers[g].Err(), fairgo.ErrMismatch)
				require.Equal(t, tc.machines == 1, hier.SharedMemoryCheck(w.reducers[g]))
			}
		})
	}
}

// sumOfCounts submits on every rank g a float32 sum of counts[g] zeros and
// returns the Works, by rank.
func sumOfCounts(t *testing.T, w *world, counts []int) []*hier.Work {
	t.Helper()
	data := make([][]byte, len(counts))
	for g := range data {
		data[g] = make([]byte, 4*counts[g])
	}
	ts := w.upload(t, fairgo.Float32, data)
	works := make([]*hier.Work, 0, len(ts))
	for g, r := range w.reducers {
		works = append(works, r.AllReduce(context.Background(), ts[g], fairgo.Sum))
	}
	return works
}

// sumExceptOn submits on every rank g an allreduce of ts[g], a sum but on
// rank avg (none where it is -1), which averages, and returns the Works,
// by rank.
func sumExceptOn(w *world, ts []fairgo.Tensor, avg int) []*hier.Work {
	works := make([]*hier.Work, 0, len(ts))
	for g, r := range w.reducers {
		op := fairgo.Sum
		if g == avg {
			op = fairgo.Avg
		}
		works = append(works, r.AllReduce(context.Background(), ts[g], op))
	}
	return works
}

// The same counts with the check in the data (fingerprint.go), whatever
// the route: the fingerprint lands at a different place on each rank, and
// every rank's Work fails, never nil (the fingerprint says the ranks
// differ, not in which field, and a route whose exchanges the counts
// misalign may end in the watchdog instead).
func TestCountsDifferingInTheTailFailWithFingerprints(t *testing.T) {
	for _, tc := range []struct {
		counts   []int
		algo     hier.Algorithm
		machines int
		fp       bool // fingerprinted; else the route cuts the call into slices and the separate check runs
	}{
		{[]int{1002, 1001, 1001, 1001}, hier.RailAllToAll, 2, true},
		{[]int{1001, 1001, 1002, 1001}, hier.RailAllToAll, 4, true},
		{[]int{2001, 2002, 2002, 2002}, hier.RailRSAG, 2, true},
		{[]int{1048577, 1048578, 1048578, 1048578}, hier.RailRSAG, 2, false},
		{[]int{1001, 1001, 1002, 1001}, hier.RailAllReduce, 2, true},
		{[]int{1001, 1001, 1001, 1002}, hier.Flat, 2, true},
		{[]int{1001, 1002, 1001, 1001}, hier.HalvingDoubling, 2, true},
		{[]int{1001, 1001, 1002, 1001}, hier.RecursiveDoubling, 4, true},
	} {
		t.Run(fmt.Sprintf("%v/%d×%d", tc.algo, tc.machines, 4/tc.machines), func(t *testing.T) {
			w := newWorld(
				t,
				sim.Config{Machines: tc.machines, Devices: 4 / tc.machines, Seed: 3},
				hier.WithFlatThreshold(hier.FlatNever),
				hier.WithAlgorithm(tc.algo),
				hier.WithTimeout(5*time.Second),
				hier.WithFingerprintMax(8<<20),
				fingerprintsFirst,
			)
			for g, wk := range sumOfCounts(t, w, tc.counts) {
				err := wk.Wait(context.Background())
				require.Error(t, err, "rank %d", g)
				require.True(t, errors.Is(err, fairgo.ErrMismatch) || errors.Is(err, fairgo.ErrTimeout),
					"rank %d: %v", g, err)
				require.Equal(t, tc.fp, hier.FingerprintedCalls(w.reducers[g]) == 1, "rank %d", g)
				if !tc.fp {
					var me *hier.MismatchError
					require.ErrorAs(t, err, &me, "rank %d", g)
					require.Equal(t, "count", me.Field)
				}
			}
		})
	}
}

// Calls by every route carry their check in their data where it fits
// (calls up to WithFingerprintMax, in one piece, of element types a sum
// of the world's ones fits: here every one; the operators other than sum
// and float average with the separate check beside), and give the
// reference's results: every element type and operator, counts
// from 1 to past a staging buffer's turn. The fingerprinted copy has a
// length the grid divides, so sums of any count take no padding slot.
func TestFingerprintedRoutesAreExact(t *testing.T) {
	for _, tc := range []struct {
		algo     hier.Algorithm
		machines int
	}{
		{hier.RailAllToAll, 2},
		{hier.RailAllToAll, 4},
		{hier.RailRSAG, 2},
		{hier.RailAllReduce, 2},
		{hier.HalvingDoubling, 4},
		{hier.RecursiveDoubling, 4},
	} {
		t.Run(fmt.Sprintf("%v/%d×%d", tc.algo, tc.machines, 4/tc.machines), func(t *testing.T) {
			w := newWorld(t, sim.Config{Machines: tc.machines, Devices: 4 / tc.machines, Seed: 8, StallTimeout: time.Minute, Jitter: 50 * time.Microsecond},
				hier.WithTimeout(time.Minute), hier.WithFlatThreshold(hier.FlatNever), hier.WithAlgorithm(tc.algo), fingerprintsFirst)
			sums := sumsWithoutPadding(t, w, rand.New(rand.NewPCG(13, 14)))
			calls := allReduceEveryShape(t, w, rand.New(rand.NewPCG(5, 6)))
			for _, r := range w.reducers {
				require.Equal(t, uint64(sums+calls), hier.FingerprintedCalls(r))
			}
		})
	}
}

// sumsWithoutPadding sums float32 inputs of counts the grid does not
// divide, one call at a time, checks each result against the reference,
// and that no rank's pipeline made its padding slots: each call is
// fingerprinted, its staged copy cut with no tail. It returns the calls.
func sumsWithoutPadding(t *testing.T, w *world, rng *rand.Rand) int {
	t.Helper()
	counts := []int{1, 1001, 16384}
	for _, n := range counts {
		w.sumChecked(t, rng, n, "n=%d", n)
	}
	for g, r := range w.reducers {
		require.False(t, hier.MadePaddingRing(r), "rank %d", g)
	}
	return len(counts)
}

// allReduceEveryShape reduces, one call at a time, random inputs of every
// element type and operator at counts 1, 7 and 4097 (past a staging
// buffer's turn) and checks each result against the reference. It returns
// how many calls it made: a fingerprint may carry every one of them on
// worlds of up to 127 ranks (int8's sum of ones), whatever the operator.
func allReduceEveryShape(t *testing.T, w *world, rng *rand.Rand) int {
	t.Helper()
	calls := 0
	for _, dt := range fairgo.DTypes {
		for _, op := range fairgo.Ops {
			for _, n := range []int{1, 7, 4097} {
				in := reftest.RandomInputs(rng, dt, op, w.size(), n)
				out, err := w.allReduce(t, dt, op, in)
				require.NoError(t, err, "%s %s n=%d", dt, op, n)
				require.NoError(t, reftest.CheckResults(dt, reftest.ComputeReference(dt, op, in), out),
					"%s %s n=%d", dt, op, n)
				calls++
				w.freeAllocs()
			}
		}
	}
	return calls
}

// Fingerprinted calls in flight at once take the staging buffers in turn:
// a call must not stage its data into a buffer whose last call's route (on
// other streams than its first) has not finished with it. The jitter
// reorders the streams, so a missing wait gives wrong results.
func TestFingerprintedCallsBackToBack(t *testing.T) {
	for _, tc := range []struct {
		algo     hier.Algorithm
		machines int
	}{
		{hier.RailAllToAll, 2},
		{hier.RailRSAG, 2},
		{hier.HalvingDoubling, 4},
	} {
		t.Run(fmt.Sprintf("%v/%d×%d", tc.algo, tc.machines, 4/tc.machines), func(t *testing.T) {
			w := newWorld(t, sim.Config{Machines: tc.machines, Devices: 4 / tc.machines, Seed: 11, StallTimeout: time.Minute,
				Jitter: 100 * time.Microsecond},
				hier.WithTimeout(time.Minute), hier.WithFlatThreshold(hier.FlatNever), hier.WithAlgorithm(tc.algo), fingerprintsFirst)
			rng := rand.New(rand.NewPCG(9, 10))
			const calls = 12
			var ins [][][]byte
			var ts [][]fairgo.Tensor
			var works []*hier.Work
			for k := range calls {
				in := reftest.RandomInputs(rng, fairgo.Float32, fairgo.Sum, w.size(), 1000+37*k)
				tk := w.upload(t, fairgo.Float32, in)
				for g, r := range w.reducers {
					works = append(works, r.AllReduce(context.Background(), tk[g], fairgo.Sum))
				}
				ins, ts = append(ins, in), append(ts, tk)
			}
			require.NoError(t, reftest.WaitAll(works))
			for k := range calls {
				out := w.download(t, ts[k])
				require.NoError(t, reftest.CheckResults(fairgo.Float32,
					reftest.ComputeReference(fairgo.Float32, fairgo.Sum, ins[k]), out), "call %d", k)
			}
			for _, r := range w.reducers {
				require.Equal(t, uint64(calls), hier.FingerprintedCalls(r))
			}
		})
	}
}

// An operator that differs leaves a route's exchanges aligned where no
// collective reduces (one device per machine: the rail's exchanges are
// all-to-alls and the reduction a kernel of each rank's own), so only the
// fingerprint the data carries can tell: every rank fails with the field
// named, none returns nil.
func TestFingerprintOnARouteFindsADifferentOperator(t *testing.T) {
	for _, algo := range []hier.Algorithm{hier.RailAllToAll, hier.HalvingDoubling, hier.RecursiveDoubling} {
		t.Run(algo.String(), func(t *testing.T) {
			w := newWorld(t, sim.Config{Machines: 4, Devices: 1, Seed: 9, StallTimeout: time.Minute},
				hier.WithTimeout(5*time.Second), hier.WithFlatThreshold(hier.FlatNever), hier.WithAlgorithm(algo), fingerprintsFirst)
			ts := w.upload(t, fairgo.Float32, reftest.RandomInputs(rand.New(rand.NewPCG(7, 8)), fairgo.Float32,
				fairgo.Sum, w.size(), 3000))
			works := sumExceptOn(w, ts, 2)
			for g, wk := range works {
				err := wk.Wait(context.Background())
				var me *hier.MismatchError
				require.ErrorAs(t, err, &me, "rank %d", g)
				require.Contains(t, []string{"operator", "shape"}, me.Field, "rank %d", g) // "shape": a field hash that collided
				require.Equal(t, uint64(1), hier.FingerprintedCalls(w.reducers[g]), "rank %d", g)
			}
		})
	}
}

// Ops, element types and roots that differ are caught too.
func TestShapesDifferingAcrossRanksFail(t *testing.T) {
	for _, tc := range []struct {
		name  string
		field string
		call  func(g int, r *hier.Reducer, t fairgo.Tensor) *hier.Work
	}{
		{"op", "operator", func(g int, r *hier.Reducer, t fairgo.Tensor) *hier.Work {
			op := fairgo.Sum
			if g == 1 {
				op = fairgo.Max
			}
			return r.AllReduce(context.Background(), t, op)
		}},
		{"dtype", "element type", func(g int, r *hier.Reducer, t fairgo.Tensor) *hier.Work {
			if g == 2 {
				t.DType = fairgo.Int32
			}
			return r.AllReduce(context.Background(), t, fairgo.Sum)
		}},
		{"root", "root", func(g int, r *hier.Reducer, t fairgo.Tensor) *hier.Work {
			return r.Broadcast(context.Background(), t, g%2)
		}},
		{"kind", "kind", func(g int, r *hier.Reducer, t fairgo.Tensor) *hier.Work {
			if g == 3 {
				return r.Broadcast(context.Background(), t, 0)
			}
			return r.AllReduce(context.Background(), t, fairgo.Sum)
		}},
	} {
		for _, mode := range checkModes {
			t.Run(tc.name+"/"+mode.name, func(t *testing.T) {
				w := mode.world(t, sim.Config{Machines: mode.machines, Devices: 4 / mode.machines, Seed: 4, StallTimeout: 20 * time.Second})
				warmUp(t, w, mode.warm)
				ts := w.upload(
					t,
					fairgo.Float32,
					[][]byte{make([]byte, 4096), make([]byte, 4096), make([]byte, 4096), make([]byte, 4096)},
				)
				var works []*hier.Work
				for g, r := range w.reducers {
					works = append(works, tc.call(g, r, ts[g]))
				}
				for g, wk := range works {
					err := wk.Wait(context.Background())
					require.ErrorIs(t, err, fairgo.ErrMismatch, "rank %d", g)
					var me *hier.MismatchError
					if errors.As(err, &me) { // the sim may see the data mismatch first
						require.Contains(t, []string{tc.field, "shape"}, me.Field) // "shape": a fingerprint whose field hash collided
					}
				}
				if tc.name != "root" { // a broadcast never carries a fingerprint
					mode.used(t, w)
				}
			})
		}
	}
}

// A call whose count differs on one rank, on a route whose world variant
// every rank makes at the call: the peers' checks find the mismatch and
// abort, which can fail the differing rank's enqueue (its split of the
// variant) before its own checker has read the same verdict. Every rank's
// Work still says mismatch, not only that the communicators were aborted.
// The race is the scheduler's: many fresh worlds give it many chances.
func TestMismatchThatAbortsAnEnqueueIsReportedAsMismatch(t *testing.T) {
	for _, a := range []hier.Algorithm{hier.FlatRing, hier.FlatTree} {
		t.Run(a.String(), func(t *testing.T) {
			for round := range 100 {
				w := newWorld(t, sim.Config{Machines: 2, Devices: 2, Seed: int64(round), StallTimeout: 20 * time.Second},
					hier.WithAlgorithm(a), hier.WithFlatThreshold(hier.FlatNever), hier.WithFingerprintMax(0))
				data := make([][]byte, 4)
				for g := range data {
					n := 3001
					if g == 3 { // the last to call: its check completes every rank's
						n = 2 * 3001
					}
					data[g] = make([]byte, 4*n)
				}
				for g, wk := range sumExceptOn(w, w.upload(t, fairgo.Float32, data), -1) {
					err := wk.Wait(context.Background())
					var me *hier.MismatchError
					require.ErrorAs(t, err, &me, "round %d, rank %d", round, g)
					require.Equal(t, "count", me.Field, "round %d, rank %d", round, g)
				}
				w.close()
			}
		})
	}
}

// A mismatch one rank's check found reaches the peers whose own check
// never ends: a rank that aborts at once can take down, with its
// communicators, the last pieces of the check's collective that the peers
// were still to receive (NCCL hands a send to its proxy thread, which the
// abort stops), and a peer whose enqueue NCCL holds at the data's first
// connection has no data to complete either. The rank that found the
// mismatch leaves its reduced check on the Board before it aborts, and the
// peers read it there: here the checkers of every rank but the first
// decide nothing, yet every rank fails with the count's mismatch, long
// before the watchdog. On six machines of two, the rail all-to-all's
// exchanges misaligned by the counts hang (HangOnMismatch) on
// communicators connected at their first call (ConnectAtFirstCall), as
// NCCL's do: the peers learn of the mismatch when the first rank's abort
// fails their communicators. (On GPUs the peers' enqueue may still be
// held in a connection then; the watcher asks the Board for such a call
// too, decideHeldCall.)
func TestMismatchReadFromTheBoardWhereTheCheckNeverEnds(t *testing.T) {
	const watchdog = time.Minute
	for _, tc := range []struct {
		name string
		cfg  sim.Config
		algo hier.Algorithm
	}{
		{"2x2/flat", sim.Config{Machines: 2, Devices: 2}, hier.Flat},
		{"6x2/rail-a2a", sim.Config{Machines: 6, Devices: 2, ConnectAtFirstCall: true, HangOnMismatch: true},
			hier.RailAllToAll},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Seed, cfg.StallTimeout = 9, watchdog
			w := newWorld(t, cfg, hier.WithAlgorithm(tc.algo), hier.WithFlatThreshold(hier.FlatNever),
				hier.WithFingerprintMax(0), hier.WithTimeout(watchdog))
			for _, r := range w.reducers[1:] {
				hier.HoldChecker(r, true)
				t.Cleanup(func() { hier.HoldChecker(r, false) }) // before the world's Close, which waits for the checks
			}
			data := lastRankDiffers(w.size(), 3001, 6002)
			for g, mm := range requireCountMismatches(t, w, data, watchdog/6) {
				require.Equal(t, "3001", mm.Low, "rank %d", g)
				require.Equal(t, "6002", mm.High, "rank %d", g)
			}
		})
	}
}

// The same where the peers' launch is held: the first rank's count puts
// its call below the flat threshold (the world communicator), its peers'
// above it (the rail's all-to-all, whose communicator connects at its
// first call and waits for that rank, which never comes). The checks
// still meet (each rank enqueues its own before its data) and the first
// rank's finds the mismatch; the peers' checkers decide nothing, their
// launch stays held, and a peer's abort does not end it
// (ConnectAtFirstCall): only the watcher's look at the Board, a second
// after the launch was held (decideHeldCall), ends their calls with the
// mismatch.
func TestMismatchReadFromTheBoardWhileTheLaunchIsHeld(t *testing.T) {
	const watchdog = time.Minute
	w := newWorld(t, sim.Config{Machines: 2, Devices: 2, Seed: 11, StallTimeout: watchdog, ConnectAtFirstCall: true},
		hier.WithAlgorithm(hier.RailAllToAll), hier.WithFlatThreshold(4<<10), hier.WithFingerprintMax(0),
		hier.WithTimeout(watchdog))
	for _, r := range w.reducers[1:] {
		hier.HoldChecker(r, true)
		t.Cleanup(func() { hier.HoldChecker(r, false) }) // before the world's Close, which waits for the checks
	}
	data := lastRankDiffers(w.size(), 3001, 3001)
	data[0] = make([]byte, 4*512) // flat: 2 KiB
	ts := w.upload(t, fairgo.Float32, data)
	start := time.Now()
	works := callEveryRank(w, func(g int, r *hier.Reducer) *hier.Work {
		return r.AllReduce(context.Background(), ts[g], fairgo.Sum)
	})
	for g, wk := range works {
		ctx, cancel := context.WithTimeout(context.Background(), watchdog/2)
		err := wk.Wait(ctx)
		cancel()
		var mm *hier.MismatchError
		require.ErrorAs(t, err, &mm, "rank %d", g)
		require.Equal(t, "count", mm.Field, "rank %d: %v", g, err)
		require.Less(t, time.Since(start), watchdog/6, "rank %d: %v", g, err)
	}
}

// lastRankDiffers is a float32 input of base elements for each of size
// ranks but the last, whose input has odd.
func lastRankDiffers(size int, base, odd int64) [][]byte {
	data := make([][]byte, size)
	for g := range data {
		n := base
		if g == size-1 {
			n = odd
		}
		data[g] = make([]byte, 4*n)
	}
	return data
}

// requireCountMismatches sums data on every rank of w and requires each
// rank's Work to fail, within limit, with a *hier.MismatchError on the
// count that carries the rank's own; it returns the errors by rank.
func requireCountMismatches(t *testing.T, w *world, data [][]byte, limit time.Duration) []*hier.MismatchError {
	t.Helper()
	start := time.Now()
	var out []*hier.MismatchError
	for g, wk := range sumExceptOn(w, w.upload(t, fairgo.Float32, data), -1) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*limit)
		err := wk.Wait(ctx)
		cancel()
		var mm *hier.MismatchError
		require.ErrorAs(t, err, &mm, "rank %d", g)
		require.Equal(t, "count", mm.Field, "rank %d: %v", g, err)
		require.Equal(t, fmt.Sprint(len(data[g])/4), mm.This, "rank %d", g)
		require.Less(t, time.Since(start), limit, "rank %d: %v", g, err)
		out = append(out, mm)
	}
	return out
}

// A call whose own checks can never decide it, because the ranks' shapes
// misalign the exchanges that carry them, fails on every rank with the
// mismatch named, long before the watchdog: NCCL's collectives then hang
// (the simulator's too, with HangOnMismatch), and a call undecided for a
// second compares its shape with rank 0's on the Board. Here the check
// rides in the data (a fingerprint), whose collective the counts misalign;
// on shared memory, a rank that posted the call waits for a peer that
// fingerprinted it (the count puts it past the fingerprint's bound).
func TestMismatchWhoseChecksHangIsFoundOnTheBoard(t *testing.T) {
	const watchdog = time.Minute
	for _, tc := range []struct {
		name      string
		m, d      int
		warm      int
		opts      []hier.Option
		base, odd int64 // float32 elements: every rank's but the last's, and the last's
	}{
		{name: "fingerprint", m: 2, d: 2, warm: 3, opts: []hier.Option{fingerprintsFirst}, base: 3001, odd: 6002},
		// Past the relay's mesh a flat call up to the fingerprint's bound
		// carries its fingerprint, a larger one is posted (checksByRoute).
		{name: "shared memory past the mesh", m: hier.RelayMeshMachines + 1, d: 1, warm: beforeSharedMemory,
			opts: []hier.Option{hier.WithSharedMemoryDir(t.TempDir()), hier.WithCheckHost("127.0.0.1"),
				hier.WithAlgorithm(hier.Flat), hier.WithFingerprintMax(4 << 10)}, base: 1 << 10, odd: 1 << 11},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, sim.Config{Machines: tc.m, Devices: tc.d, Seed: 10, StallTimeout: watchdog,
				HangOnMismatch: true}, append(slices.Clone(tc.opts), hier.WithTimeout(watchdog))...)
			warmUp(t, w, tc.warm)
			requireCountMismatches(t, w, lastRankDiffers(w.size(), tc.base, tc.odd), watchdog/6)
		})
	}
}

// An operator or a count that differs on one rank reaches a different
// reduction, or different transfers, on every route, yet every route's
// ranks fail with a MismatchError naming the field: the check does not
// depend on the algorithm that carries the data.
func TestShapeDifferingFailsOnEveryAlgorithm(t *testing.T) {
	for a := hier.Flat; a.Valid(); a++ {
		for _, field := range []string{"operator", "count"} {
			t.Run(a.String()+"/"+field, func(t *testing.T) {
				w := newWorld(t, sim.Config{Machines: 2, Devices: 2, Seed: 6, StallTimeout: 20 * time.Second},
					hier.WithAlgorithm(a), hier.WithFlatThreshold(hier.FlatNever), hier.WithFingerprintMax(0))
				data := make([][]byte, 4)
				for g := range data {
					n := 3001
					if g == 2 && field == "count" {
						n = 2 * 3001
					}
					data[g] = make([]byte, 4*n)
				}
				ts := w.upload(t, fairgo.Float32, data)
				avg := -1
				if field == "operator" {
					avg = 2
				}
				works := sumExceptOn(w, ts, avg)
				for g, wk := range works {
					err := wk.Wait(context.Background())
					require.ErrorIs(t, err, fairgo.ErrMismatch, "rank %d", g)
					var me *hier.MismatchError
					require.ErrorAs(t, err, &me, "rank %d", g)
					require.Equal(t, field, me.Field, "rank %d", g)
				}
			})
		}
	}
}

// checkMode is a form of the cross-rank check: a collective of its own
// (WithFingerprintMax(0)), the fingerprint a small flat sum carries in its
// data (the default, with the watchdog; hier/fingerprint.go), staged by
// pair copies or, on a device without them, by four copies, and shared
// memory on one machine. used asserts the form was taken.
type checkMode struct {
	name     string
	machines int // the sim's grid: machines × (4 / machines)
	warm     int // calls to make before the test's (warmUp)
	opts     []hier.Option
	plain    bool // the Reducers see only backend.Device: no pair copies, no mapped host memory
	used     func(t *testing.T, w *world)
}

// world builds the mode's simulated cluster of cfg, each rank as edit
// leaves it.
func (m checkMode) world(t *testing.T, cfg sim.Config, edit ...func(rk *backend.Rank)) *world {
	return worldOf(t, cfg, func(_ int, rk *backend.Rank) []hier.Option {
		if m.plain {
			rk.Device = plainDevice{rk.Device}
		}
		for _, e := range edit {
			e(rk)
		}
		return m.opts
	})
}

// plainDevice hides every optional interface of the device it wraps.
type plainDevice struct{ backend.Device }

func fingerprintedBy(pairs bool) func(t *testing.T, w *world) {
	return func(t *testing.T, w *world) {
		n := uint64(0)
		for _, r := range w.reducers {
			n += hier.FingerprintedCalls(r)
			require.Equal(t, pairs, hier.StagesByPairs(r))
		}
		require.Positive(t, n)
	}
}

var checkModes = []checkMode{
	{name: "separate", machines: 2, opts: []hier.Option{hier.WithFingerprintMax(0)}, used: func(t *testing.T, w *world) {
		for _, r := range w.reducers {
			require.Zero(t, hier.FingerprintedCalls(r))
			require.False(t, hier.SharedMemoryCheck(r))
		}
	}},
	{name: "fingerprint", machines: 2, opts: []hier.Option{fingerprintsFirst}, used: fingerprintedBy(true)},
	{name: "fingerprint/four copies", machines: 2, plain: true, opts: []hier.Option{fingerprintsFirst},
		used: fingerprintedBy(false)},
	// Past the agreement: the ranks compare their calls in shared memory,
	// even where fingerprints are asked for; across machines, the relay
	// brings the other machines' images.
	{name: "shared memory", machines: 1, warm: beforeSharedMemory,
		opts: []hier.Option{hier.WithTimeout(time.Minute), hier.WithFingerprintMax(hier.DefaultFingerprintMax)},
		used: func(t *testing.T, w *world) {
			for _, r := range w.reducers {
				require.True(t, hier.SharedMemoryCheck(r))
			}
		}},
	{name: "shared memory/relay", machines: 2, warm: beforeSharedMemory,
		opts: []hier.Option{hier.WithTimeout(time.Minute), hier.WithCheckHost("127.0.0.1")},
		used: func(t *testing.T, w *world) {
			for _, r := range w.reducers {
				require.True(t, hier.RelayedCheck(r))
			}
		}},
}

// fingerprintsFirst keeps a job of several machines on fingerprints and
// the separate check past its first calls: with shared memory, call 1's
// check carries the agreement on it (no fingerprint), and calls from
// hier.SharedMemoryFirstCall on are checked there.
var fingerprintsFirst = hier.WithSharedMemoryDir("")

// A call that one rank refuses (here: its context was already done, or an
// unknown operator) while the others accept it fails everywhere at once,
// instead of leaving the others waiting for data that never comes. The
// peers' error names the rank that refused, the call and, where a Board
// carries it, the reason; without a Board it says where the reason is.
func TestCallRefusedOnOneRankFailsEverywhere(t *testing.T) {
	for _, mode := range checkModes {
		for _, tc := range []struct {
			name    string
			refuser int
			board   bool
			op      fairgo.Op // the refusing rank's operator
			reason  string    // in the peers' error
			is      error     // the refusing rank's own error
		}{
			{"rank 0, cancelled, board", 0, true, fairgo.Sum, ": context canceled", context.Canceled},
			{"rank 2, cancelled, board", 2, true, fairgo.Sum, ": context canceled", context.Canceled},
			{"rank 1, unknown op, board", 1, true, fairgo.Op(42), ": fairgo: invalid op Op(42): unknown reduction operator",
				fairgo.ErrUnknownOp},
			{"rank 2, cancelled, no board", 2, false, fairgo.Sum,
				": that rank's own error says why (no Board carried the reason here)", context.Canceled},
		} {
			t.Run(mode.name+"/"+tc.name, func(t *testing.T) {
				cfg := sim.Config{Machines: mode.machines, Devices: 4 / mode.machines, Seed: 4, StallTimeout: time.Minute}
				var edit []func(*backend.Rank)
				if !tc.board {
					edit = append(edit, func(rk *backend.Rank) { rk.Board = nil })
				}
				w := mode.world(t, cfg, edit...)
				warmUp(t, w, mode.warm)
				fingerprinted := make([]uint64, len(w.reducers))
				for g, r := range w.reducers {
					fingerprinted[g] = hier.FingerprintedCalls(r)
				}
				ts := w.upload(t, fairgo.Float32, [][]byte{
					make([]byte, 4096), make([]byte, 4096), make([]byte, 4096), make([]byte, 4096)})
				done, cancel := context.WithCancel(context.Background())
				cancel()
				start := time.Now()
				works := make([]*hier.Work, len(w.reducers))
				for g, r := range w.reducers {
					ctx, op := context.Background(), fairgo.Sum
					if g == tc.refuser {
						ctx, op = done, tc.op
						if tc.op != fairgo.Sum {
							ctx = context.Background()
						}
					}
					works[g] = r.AllReduce(ctx, ts[g], op)
				}
				for g, wk := range works {
					err := wk.Wait(context.Background())
					if g == tc.refuser {
						require.ErrorIs(t, err, tc.is)
						continue
					}
					require.ErrorIs(t, err, fairgo.ErrMismatch, "rank %d", g)
					require.ErrorContains(t, err,
						fmt.Sprintf("rank %d refused call %d (allreduce of 1024 float32)%s", tc.refuser, 1+mode.warm, tc.reason), "rank %d", g)
					var me *hier.MismatchError
					require.ErrorAs(t, err, &me)
					require.NotNil(t, me.Refusal)
					require.Equal(t, tc.refuser, me.Refusal.Rank)
				}
				require.Less(t, time.Since(start), 10*time.Second)
				for g, r := range w.reducers { // every Reducer breaks: Close it and build a new one
					// The refusing rank's Work failed before its check ran.
					require.Eventually(t, func() bool { return errors.Is(r.Err(), fairgo.ErrMismatch) },
						5*time.Second, time.Millisecond, "rank %d", g)
				}
				mode.used(t, w)
				if strings.HasPrefix(mode.name, "fingerprint") { // the refusing rank ran the fingerprinted collective too
					require.Equal(t, uint64(1), hier.FingerprintedCalls(w.reducers[tc.refuser])-fingerprinted[tc.refuser])
				}
			})
		}
	}
}

// worldOf builds a simulated cluster whose rank g's Reducer is built from
// its rank as edit leaves it, with the options edit returns, each on a
// goroutine of its own (they rendezvous with each other).
func worldOf(t *testing.T, cfg sim.Config, edit func(g int, rk *backend.Rank) []hier.Option) *world {
	t.Helper()
	c, err := sim.NewCluster(cfg)
	require.NoError(t, err)
	rs := make([]*hier.Reducer, c.Size())
	errs := make([]error, c.Size())
	var wg sync.WaitGroup
	for g := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rk := c.Rank(g)
			opts := edit(g, &rk)
			rs[g], errs[g] = hier.NewReducer(context.Background(), rk, opts...)
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	devs := make([]testDevice, c.Size())
	for g := range devs {
		devs[g] = c.Device(g)
	}
	w := &world{cluster: c, devs: devs, reducers: rs, m: cfg.Machines, d: cfg.Devices, closeFn: func() { _ = c.Close() }}
	t.Cleanup(w.close)
	return w
}

// Fingerprints only when asked (WithFingerprintMax), and only with the
// watchdog (armed unless WithTimeout(0)): a fingerprint cannot vouch for
// the count, so no world size gets them by default. Every operator's
// call is fingerprinted (ranks whose operators differ run one shape of
// collective); under max, min or product the separate check runs beside.
func TestFingerprintsWhereTheyApply(t *testing.T) {
	for _, c := range []struct {
		m, d     int
		op       fairgo.Op
		opts     []hier.Option
		expected bool
	}{
		{2, 4, fairgo.Sum, []hier.Option{hier.WithTimeout(time.Minute)}, true},
		{8, 1, fairgo.Sum, nil, true}, // the default watchdog (DefaultTimeout) is armed
		{8, 1, fairgo.Avg, nil, true},
		{8, 1, fairgo.Max, nil, true}, // and the separate check: a peer's data could stand in for its fingerprint
		{8, 1, fairgo.Sum, []hier.Option{hier.WithFingerprintMax(1 << 20)}, true},
		{8, 1, fairgo.Sum, []hier.Option{hier.WithFingerprintMax(1 << 10)}, false}, // 4000 bytes: above it
		{8, 1, fairgo.Sum, []hier.Option{hier.WithTimeout(0)}, false},
		{2, 2, fairgo.Sum, []hier.Option{hier.WithTimeout(time.Minute), hier.WithFingerprintMax(1 << 20)}, true},
		{2, 4, fairgo.Sum, []hier.Option{hier.WithTimeout(time.Minute), hier.WithFingerprintMax(0)}, false},
	} {
		t.Run(fmt.Sprintf("%dx%d/%s/%d", c.m, c.d, c.op, len(c.opts)), func(t *testing.T) {
			w := newWorld(t, sim.Config{Machines: c.m, Devices: c.d, Seed: 2, StallTimeout: time.Minute},
				append([]hier.Option{fingerprintsFirst}, c.opts...)...)
			in := reftest.RandomInputs(rand.New(rand.NewPCG(1, 2)), fairgo.Float32, c.op, w.size(), 1000)
			out, err := w.allReduce(t, fairgo.Float32, c.op, in)
			require.NoError(t, err)
			require.NoError(t, reftest.CheckResults(fairgo.Float32, reftest.ComputeReference(fairgo.Float32, c.op, in), out))
			for _, r := range w.reducers {
				require.Equal(t, c.expected, hier.FingerprintedCalls(r) == 1)
			}
		})
	}
}

// Ranks whose operators differ on a small call run one shape of
// collective, the fingerprinted one, whether or not the fingerprint alone
// vouches for their operator: a rank that sums and a peer that takes the
// maximum find the difference in the reduced pairs. Had the peer taken
// the plain collective and the separate check, NCCL would have waited for
// the missing elements until the watchdog (the simulator finds the sizes
// differ; the count of fingerprinted calls shows which collective each
// rank took). Under max alone, the call is fingerprinted and checked
// apart as well; under sum the fingerprint alone checks it.
func TestOperatorsDifferingRunOneCollective(t *testing.T) {
	cfg := sim.Config{Machines: 8, Devices: 1, Seed: 12, StallTimeout: time.Minute}
	for _, tc := range []struct {
		name  string
		op    func(g int) fairgo.Op
		apart uint64 // separate checks a rank ran, call 1's aside
		field string // the field of the mismatch found; "": none
	}{
		{"sum", func(int) fairgo.Op { return fairgo.Sum }, 0, ""},
		{"max", func(int) fairgo.Op { return fairgo.Max }, 1, ""},
		{"sum-and-max", func(g int) fairgo.Op {
			if g == 7 {
				return fairgo.Max
			}
			return fairgo.Sum
		}, 0, "operator"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, cfg, hier.WithTimeout(time.Minute), fingerprintsFirst)
			warmUp(t, w, 1) // past call 1, whose separate check every rank runs
			in := reftest.RandomInputs(rand.New(rand.NewPCG(12, 12)), fairgo.Float32, fairgo.Max, w.size(), 1000)
			ts := w.upload(t, fairgo.Float32, in)
			works := make([]*hier.Work, len(w.reducers))
			for g, r := range w.reducers {
				works[g] = r.AllReduce(context.Background(), ts[g], tc.op(w.rank(g)))
			}
			for g, wk := range works {
				err := wk.Wait(context.Background())
				r := w.reducers[g]
				require.Equal(t, uint64(2), hier.FingerprintedCalls(r), "rank %d", w.rank(g))
				if tc.field == "" {
					require.NoError(t, err, "rank %d", w.rank(g))
					require.Equal(t, 1+tc.apart, hier.SeparateChecks(r), "rank %d", w.rank(g))
					continue
				}
				// The simulator may find the operators differ in the
				// collective first, where NCCL reduces without a word.
				require.ErrorIs(t, err, fairgo.ErrMismatch, "rank %d", w.rank(g))
				var mm *hier.MismatchError
				if errors.As(err, &mm) {
					require.Contains(t, []string{tc.field, "shape"}, mm.Field, "rank %d: %v", w.rank(g), err)
				}
			}
			if tc.field == "" {
				ref := reftest.ComputeReference(fairgo.Float32, tc.op(0), in)
				require.NoError(t, reftest.CheckResults(fairgo.Float32, ref, w.download(t, ts)))
			}
		})
	}
}

// A call fingerprinted and checked apart (a maximum) fails on the
// fingerprint's pairs as soon as its data is done, without waiting for its
// separate check: here the checkers decide nothing, and rank 0 refused the
// call (its context was done), which its pairs tell the others. Ranks whose
// operators differ, one taking no separate check, rely on that.
func TestPairsDecidedBeforeTheSeparateCheck(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 8, Devices: 1, Seed: 13, StallTimeout: time.Minute},
		hier.WithTimeout(time.Minute), fingerprintsFirst)
	warmUp(t, w, 2) // past call 1, whose collective check carries the agreement
	checks := make([]uint64, len(w.reducers))
	for g, r := range w.reducers {
		checks[g] = hier.SeparateChecks(r)
		hier.HoldChecker(r, true)
		t.Cleanup(func() { hier.HoldChecker(r, false) }) // before the world's Close, which waits for the checks
	}
	ts := w.upload(t, fairgo.Float32, reftest.RandomInputs(rand.New(rand.NewPCG(13, 13)), fairgo.Float32, fairgo.Max, w.size(), 1000))
	done, cancel := context.WithCancel(context.Background())
	cancel()
	works := make([]*hier.Work, len(w.reducers))
	for g, r := range w.reducers {
		ctx := context.Background()
		if w.rank(g) == 0 {
			ctx = done
		}
		works[g] = r.AllReduce(ctx, ts[g], fairgo.Max)
	}
	for g, wk := range works {
		ctx, stop := context.WithTimeout(context.Background(), 20*time.Second)
		err := wk.Wait(ctx)
		stop()
		if w.rank(g) == 0 { // failed at the call; its check runs after
			require.ErrorIs(t, err, context.Canceled)
			continue
		}
		require.Equal(t, checks[g]+1, hier.SeparateChecks(w.reducers[g]), "rank %d", w.rank(g))
		var mm *hier.MismatchError
		require.ErrorAs(t, err, &mm, "rank %d", w.rank(g))
		require.NotNil(t, mm.Refusal, "rank %d: %v", w.rank(g), err)
		require.Equal(t, 0, mm.Refusal.Rank)
	}
}

// A rank whose operator differs from its peers' on a fingerprinted call
// fails with them, long before its watchdog, though it alone runs a
// separate check (a maximum; its peers sum). NCCL connects a communicator
// at its first collective and blocks the enqueuing thread until every peer
// has made one (the simulator's ConnectAtFirstCall): had no earlier call
// used the check communicator on every rank, that rank's enqueue would
// block there and its call never reach the watcher that finds the
// difference.
func TestOperatorDifferingFailsBeforeTheWatchdog(t *testing.T) {
	const timeout = 20 * time.Second
	w := newWorld(t, sim.Config{Machines: 8, Devices: 1, Seed: 14, StallTimeout: time.Minute, ConnectAtFirstCall: true},
		hier.WithTimeout(timeout), fingerprintsFirst)
	warmUp(t, w, 3) // sums, fingerprinted; call 1 checked apart as well on every rank
	for g, r := range w.reducers {
		require.Equal(t, uint64(3), hier.FingerprintedCalls(r), "rank %d", w.rank(g))
		require.Equal(t, uint64(1), hier.SeparateChecks(r), "rank %d", w.rank(g))
	}
	start := time.Now()
	requireMismatchesWithin(t, w, maxAmongSums(t, w), start, timeout/2)
}

// Small flat calls give the reference's results whether or not they carry
// their check in their data (every element type and operator, counts from 1
// to past a staging buffer's turn): every one does by default (the
// operators other than sum and float average with the separate check
// beside), and WithFingerprintMax(0) turns them off.
func TestFingerprintedCallsAreExact(t *testing.T) {
	for _, fpMax := range []int64{hier.DefaultFingerprintMax, 0} {
		t.Run(fmt.Sprint(fpMax), func(t *testing.T) {
			w := newWorld(t, sim.Config{Machines: 2, Devices: 2, Seed: 8, StallTimeout: time.Minute},
				hier.WithTimeout(time.Minute), hier.WithFingerprintMax(fpMax), hier.WithInlineEnqueue(fpMax == 0),
				fingerprintsFirst)
			calls := allReduceEveryShape(t, w, rand.New(rand.NewPCG(3, 4)))
			want := uint64(calls)
			if fpMax == 0 {
				want = 0
			}
			for _, r := range w.reducers {
				require.Equal(t, want, hier.FingerprintedCalls(r))
			}
		})
	}
}

// A nil context is a typed error, never a panic.
func TestNilContext(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 1, Devices: 2})
	ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 64), make([]byte, 64)})
	//lint:ignore SA1012 the nil context is the point
	wk := w.reducers[0].AllReduce(nil, ts[0], fairgo.Sum) //nolint:staticcheck
	require.ErrorIs(t, wk.Err(), fairgo.ErrInvalidArgument)
	require.ErrorIs(t, wk.Wait(nil), fairgo.ErrInvalidArgument)            //nolint:staticcheck
	require.ErrorIs(t, wk.StreamWait(nil, nil), fairgo.ErrInvalidArgument) //nolint:staticcheck
	_, err := hier.NewReducer(nil, w.cluster.Rank(0))                      //nolint:staticcheck
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	// The peer then makes the same (refused) call: the Reducers stay in step.
	require.ErrorIs(
		t,
		w.reducers[1].AllReduce(nil, ts[1], fairgo.Sum).Err(),
		fairgo.ErrInvalidArgument,
	) //nolint:staticcheck
	var works []*hier.Work
	for g, r := range w.reducers {
		works = append(works, r.AllReduce(context.Background(), ts[g], fairgo.Sum))
	}
	require.NoError(t, reftest.WaitAll(works))
}

// Once a call has returned its Work, its device work is enqueued whatever
// happens to its context: a rank whose contexts expire right after the
// calls does not drop them, and every rank gets the right sums.
func TestExpiringContextDoesNotDropCalls(t *testing.T) {
	const calls = 40
	w := newWorld(
		t,
		sim.Config{Machines: 2, Devices: 2, Seed: 9, Jitter: 50 * time.Microsecond},
		hier.WithFlatThreshold(hier.FlatNever),
	)
	rng := rand.New(rand.NewPCG(1, 2))
	inputs := make([][][]byte, calls)
	bufs := make([][]fairgo.Tensor, calls)
	for c := range calls {
		inputs[c] = reftest.RandomInputs(rng, fairgo.Int32, fairgo.Sum, 4, 1000+c)
		bufs[c] = w.upload(t, fairgo.Int32, inputs[c])
	}
	var works []*hier.Work
	for g, r := range w.reducers {
		for c := range calls {
			// Rank 0's context ends right after each call (cancelled as
			// soon as AllReduce returns: a 1 ms timeout sometimes ended
			// before the call on a loaded host, which rightly rejects it).
			ctx, cancel := context.WithCancel(context.Background())
			works = append(works, r.AllReduce(ctx, bufs[c][g], fairgo.Sum))
			if g == 0 {
				cancel()
			}
			defer cancel()
		}
	}
	require.NoError(t, reftest.WaitAll(works))
	for c := range calls {
		require.NoError(
			t,
			reftest.CheckResults(
				fairgo.Int32,
				reftest.ComputeReference(fairgo.Int32, fairgo.Sum, inputs[c]),
				w.download(t, bufs[c]),
			),
			"call %d",
			c,
		)
	}
}

// The watchdog's clock starts when a call could start (its predecessors
// done), not when it was queued: a long batch of healthy calls, each well
// within the timeout, all succeed although the batch takes longer.
func TestTimeoutCountsFromWhenTheCallCouldStart(t *testing.T) {
	// The timeout leaves room for a loaded CI host (two cores running the
	// other packages' tests): with 400 ms the first call's own 80 ms
	// sometimes stretched past it.
	const timeout, delay, calls = time.Second, 200 * time.Millisecond, 12
	w := newWorld(t, sim.Config{Machines: 2, Devices: 1, Seed: 2, StallTimeout: time.Minute},
		hier.WithFlatThreshold(hier.FlatNever), hier.WithTimeout(timeout))
	ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 4096), make([]byte, 4096)})
	slow := make([]streams.Stream, 2)
	for g := range slow {
		s, err := w.devs[g].NewStream()
		require.NoError(t, err)
		slow[g] = s
	}
	start := time.Now()
	var works []*hier.Work
	for range calls {
		for g, r := range w.reducers {
			// Each call waits for 200 ms of its caller's work: the batch
			// takes about 2.4 s, every call 200 ms.
			require.NoError(t, w.devs[g].(*sim.Device).DelayAsync(delay, slow[g]))
			works = append(works, r.AllReduce(context.Background(), ts[g], fairgo.Sum, hier.After(slow[g])))
		}
	}
	require.NoError(t, reftest.WaitAll(works))
	require.Greater(t, time.Since(start), 2*timeout, "the batch must outlast the timeout for the test to mean anything")
}

// A rank whose watchdog fires tells the others: every rank's error wraps
// ErrTimeout (and ErrAborted), names the rank that timed out, and reports
// how far each rank got; the broken Reducers say so.
func TestTimeoutIsReportedOnEveryRank(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 2, Devices: 1, Seed: 6, StallTimeout: time.Minute},
		hier.WithFlatThreshold(hier.FlatNever), hier.WithTimeout(300*time.Millisecond))
	ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 4*64), make([]byte, 4*64)})
	// Two calls everywhere, a third on rank 0 only: rank 1 "skipped" a call
	// of the same shape, which shapes cannot reveal.
	var works []*hier.Work
	for range 2 {
		for g, r := range w.reducers {
			works = append(works, r.AllReduce(context.Background(), ts[g], fairgo.Sum))
		}
	}
	require.NoError(t, reftest.WaitAll(works))
	start := time.Now()
	err := w.reducers[0].AllReduce(context.Background(), ts[0], fairgo.Sum).Wait(context.Background())
	require.Less(t, time.Since(start), 15*time.Second)
	require.ErrorIs(t, err, fairgo.ErrTimeout)
	require.ErrorIs(t, err, fairgo.ErrAborted)
	var te *hier.TimeoutError
	require.ErrorAs(t, err, &te)
	require.Equal(t, 0, te.Rank)
	require.Contains(t, te.Progress, "rank 0: enqueued call 3, completed 2")
	require.Contains(t, te.Progress, "rank 1: enqueued call 2, completed 2")
	// Rank 1 learns of it from the board, and says so.
	require.Eventually(t, func() bool { return w.reducers[1].Err() != nil }, 10*time.Second, 10*time.Millisecond)
	for _, r := range w.reducers {
		require.ErrorIs(t, r.Err(), fairgo.ErrTimeout)
		later := r.AllReduce(context.Background(), ts[0], fairgo.Sum).Wait(context.Background())
		require.ErrorIs(t, later, fairgo.ErrClosed)
		require.ErrorIs(t, later, fairgo.ErrTimeout)
	}
}

// The rank whose watchdog fired reports its own timeout even where a peer,
// told by the Board, aborts first: the peer's abort ends this rank's call
// (a simulated world fails it at once) before this rank aborts. The Board
// here holds the note's Set until the peer has aborted and the call had
// time to end.
func TestTimedOutRankReportsItsTimeoutThoughThePeerAbortsFirst(t *testing.T) {
	var peer atomic.Pointer[hier.Reducer]
	w := worldOf(t, sim.Config{Machines: 2, Devices: 1, Seed: 6, StallTimeout: time.Minute},
		func(g int, rk *backend.Rank) []hier.Option {
			if g == 0 {
				rk.Board = noteHeldBoard{Store: rk.Board, hold: func() {
					deadline := time.Now().Add(10 * time.Second)
					for time.Now().Before(deadline) && (peer.Load() == nil || peer.Load().Err() == nil) {
						time.Sleep(5 * time.Millisecond)
					}
					time.Sleep(300 * time.Millisecond) // for this rank's Wait to see its call end
				}}
			}
			return []hier.Option{hier.WithAlgorithm(hier.Flat), hier.WithTimeout(300 * time.Millisecond)}
		})
	peer.Store(w.reducers[1])
	ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 4*64), make([]byte, 4*64)})
	err := w.reducers[0].AllReduce(context.Background(), ts[0], fairgo.Sum).Wait(context.Background())
	require.ErrorIs(t, err, fairgo.ErrTimeout)
	var te *hier.TimeoutError
	require.ErrorAs(t, err, &te)
	require.Equal(t, 0, te.Rank)
	require.Error(t, w.reducers[1].Err(), "the peer must have aborted for the test to mean anything")
	require.ErrorIs(t, w.reducers[0].Err(), fairgo.ErrTimeout)
}

// noteHeldBoard calls hold after it has stored a timeout note.
type noteHeldBoard struct {
	backend.Store
	hold func()
}

func (b noteHeldBoard) Set(ctx context.Context, key string, value []byte) error {
	err := b.Store.Set(ctx, key, value)
	if key == hier.BoardTimeoutKey {
		b.hold()
	}
	return err
}

// A call with nothing to do on the device still honours its After stream
// and the calls on its memory still in flight: a consumer ordered by
// StreamWait sees what the producer wrote.
func TestNoOpCallsKeepTheirDependencies(t *testing.T) {
	for _, tc := range []struct {
		name string
		m, d int
		call func(r *hier.Reducer, buf fairgo.Tensor, s streams.Stream) *hier.Work
	}{
		{"one rank allreduce", 1, 1, func(r *hier.Reducer, b fairgo.Tensor, s streams.Stream) *hier.Work {
			return r.AllReduce(context.Background(), b, fairgo.Sum, hier.After(s))
		}},
		{"one rank broadcast", 1, 1, func(r *hier.Reducer, b fairgo.Tensor, s streams.Stream) *hier.Work {
			return r.Broadcast(context.Background(), b, 0, hier.After(s))
		}},
		{"one rank reduce-scatter in place", 1, 1, func(r *hier.Reducer, b fairgo.Tensor, s streams.Stream) *hier.Work {
			return r.ReduceScatter(context.Background(), b, b, fairgo.Sum, hier.After(s))
		}},
		{"one rank all-gather in place", 1, 1, func(r *hier.Reducer, b fairgo.Tensor, s streams.Stream) *hier.Work {
			return r.AllGather(context.Background(), b, b, hier.After(s))
		}},
		{"count 0 on 2x2", 2, 2, func(r *hier.Reducer, b fairgo.Tensor, s streams.Stream) *hier.Work {
			return r.AllReduce(context.Background(), b.Slice(0, 0), fairgo.Sum, hier.After(s))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, sim.Config{Machines: tc.m, Devices: tc.d, Seed: 1})
			const n = 256
			works := make([]*hier.Work, w.size())
			outs := make([]fairgo.Tensor, w.size())
			bufs := w.upload(t, fairgo.Float32, make([][]byte, w.size()))
			consumers := make([]streams.Stream, w.size())
			for g, r := range w.reducers {
				dev := w.devs[g]
				buf, err := dev.AllocTensor(n, fairgo.Float32)
				require.NoError(t, err)
				bufs[g] = buf
				src, err := dev.AllocTensor(n, fairgo.Float32)
				require.NoError(t, err)
				ones := make([]byte, 4*n)
				for i := range n {
					elem.Set(fairgo.Float32, ones, i, 1)
				}
				require.NoError(t, dev.Upload(src.Ptr, ones))
				require.NoError(t, dev.Upload(buf.Ptr, make([]byte, 4*n)))
				producer, err := dev.NewStream()
				require.NoError(t, err)
				// The producer writes the buffer after a delay.
				require.NoError(t, dev.(*sim.Device).DelayAsync(100*time.Millisecond, producer))
				require.NoError(t, dev.CopyAsync(buf.Ptr, src.Ptr, 4*n, producer))
				works[g] = tc.call(r, buf, producer)
				consumers[g], err = dev.NewStream()
				require.NoError(t, err)
				require.NoError(t, works[g].StreamWait(context.Background(), consumers[g]))
				outs[g], err = dev.AllocTensor(n, fairgo.Float32)
				require.NoError(t, err)
				require.NoError(t, dev.CopyAsync(outs[g].Ptr, buf.Ptr, 4*n, consumers[g]))
			}
			require.NoError(t, reftest.WaitAll(works))
			for g := range w.reducers {
				require.NoError(t, w.devs[g].(*sim.Device).Synchronize(context.Background()))
				out := make([]byte, 4*n)
				require.NoError(t, w.devs[g].Download(out, outs[g].Ptr))
				require.Equal(
					t,
					1.0,
					elem.Get(fairgo.Float32, out, 0),
					"rank %d: the consumer read the buffer before the producer wrote it",
					g,
				)
			}
		})
	}
}

// Avg of values near a 16-bit type's maximum does not overflow where a flat
// average would not (every level averages; partial sums never exceed the
// inputs), on every algorithm; Sum whose total fits does not overflow
// either.
func TestSixteenBitNearTheMaximum(t *testing.T) {
	for _, dt := range []fairgo.DType{fairgo.Float16, fairgo.BFloat16} {
		maxv := 65504.0
		if dt == fairgo.BFloat16 {
			maxv = 3.3e38
		}
		for _, algo := range []hier.Algorithm{hier.Flat, hier.RailAllToAll, hier.RailRSAG, hier.RailAllReduce, hier.FlatRing,
			hier.FlatTree, hier.HalvingDoubling, hier.RecursiveDoubling} {
			t.Run(dt.String()+"/"+algo.String(), func(t *testing.T) {
				const m, d, count = 2, 4, 4099
				w := newWorld(
					t,
					sim.Config{Machines: m, Devices: d, Seed: 8},
					hier.WithFlatThreshold(hier.FlatNever),
					hier.WithAlgorithm(algo),
				)
				rng := rand.New(rand.NewPCG(5, 6))
				avgIn := make([][]byte, m*d)
				sumIn := make([][]byte, m*d)
				for g := range avgIn {
					avgIn[g], sumIn[g] = make([]byte, 2*count), make([]byte, 2*count)
					for i := range count {
						elem.Set(dt, avgIn[g], i, maxv*(0.26+0.65*rng.Float64())) // ~17,000 – 60,000 for float16
						elem.Set(dt, sumIn[g], i, maxv/float64(m*d)*(0.5+0.45*rng.Float64()))
					}
				}
				for _, c := range []struct {
					op fairgo.Op
					in [][]byte
				}{{fairgo.Avg, avgIn}, {fairgo.Sum, sumIn}} {
					out, err := w.allReduce(t, dt, c.op, c.in)
					require.NoError(t, err)
					for i := range count {
						v := elem.Get(dt, out[0], i)
						require.False(t, math.IsInf(v, 0) || math.IsNaN(v), "%v element %d is %v", c.op, i, v)
					}
					require.NoError(
						t,
						reftest.CheckResults(dt, reftest.ComputeReference(dt, c.op, c.in), out),
						"%v",
						c.op,
					)
				}
			})
		}
	}
}

// blockingComm is a communicator whose calls after the first block until
// the communicator is aborted, as NCCL can block the enqueueing thread when
// its queue to the device is full of work waiting for a dead peer, or
// while it connects to a peer that never comes. They then fail with err,
// or an error wrapping fairgo.ErrAborted when err is nil.
type blockingComm struct {
	backend.Comm
	mu      sync.Mutex
	calls   int
	aborted chan struct{}
	once    sync.Once
	err     error
}

func (c *blockingComm) AllReduce(
	send, recv uintptr,
	count int64,
	dt fairgo.DType,
	op fairgo.Op,
	s streams.Stream,
) error {
	c.mu.Lock()
	c.calls++
	n := c.calls
	c.mu.Unlock()
	if n > 1 {
		<-c.aborted
		if c.err != nil {
			return c.err
		}
		return fmt.Errorf("blocked enqueue ended by the abort: %w", fairgo.ErrAborted)
	}
	return c.Comm.AllReduce(send, recv, count, dt, op, s)
}

func (c *blockingComm) Abort() error {
	c.once.Do(func() { close(c.aborted) })
	return c.Comm.Abort()
}

// A call stuck in its enqueue (inline, on the caller's goroutine, so no
// Work is pending yet) is still covered by the watchdog: the caller gets a
// Work failed with ErrTimeout instead of hanging.
func TestWatchdogCoversAStuckEnqueue(t *testing.T) {
	rs, ts := pairWithWorld(t, func(w backend.Comm) backend.Comm {
		return &blockingComm{Comm: w, aborted: make(chan struct{})}
	}, hier.WithInlineEnqueue(true), hier.WithTimeout(300*time.Millisecond))
	start := time.Now()
	done := make(chan *hier.Work)
	go func() { done <- rs[0].AllReduce(context.Background(), ts[0], fairgo.Sum) }()
	select {
	case wk := <-done:
		err := wk.Wait(context.Background())
		require.ErrorIs(t, err, fairgo.ErrTimeout)
		require.Contains(t, err.Error(), "enqueueing call 2")
		require.Less(t, time.Since(start), 10*time.Second)
	case <-time.After(20 * time.Second):
		t.Fatal("the stuck enqueue was never aborted")
	}
}

// hangingAbortComm is a communicator whose Abort does not return until
// released, as ncclCommAbort can hang while a peer is dead.
type hangingAbortComm struct {
	backend.Comm
	release chan struct{}
}

func (c *hangingAbortComm) Abort() error {
	<-c.release
	return c.Comm.Abort()
}

// A communicator abort that hangs does not hold back the failure: the
// caller's Wait returns the timeout within its grace after the deadline.
func TestHangingAbortStillReports(t *testing.T) {
	c, err := sim.NewCluster(sim.Config{Machines: 1, Devices: 2, StallTimeout: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	rk := c.Rank(0)
	hang := &hangingAbortComm{Comm: rk.Comms.World, release: make(chan struct{})}
	rk.Comms.World = hang
	r, err := hier.NewReducer(
		context.Background(),
		rk,
		hier.WithAlgorithm(hier.Flat),
		hier.WithTimeout(300*time.Millisecond),
	)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	t.Cleanup(func() { close(hang.release) }) // runs first: lets Close finish
	ts, err := c.Device(0).AllocTensor(1024, fairgo.Float32)
	require.NoError(t, err)
	start := time.Now()
	wk := r.AllReduce(context.Background(), ts, fairgo.Sum) // rank 1 never joins
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = wk.Wait(ctx)
	require.ErrorIs(t, err, fairgo.ErrTimeout)
	require.Less(t, time.Since(start), 300*time.Millisecond+5*time.Second)
}

// pairWithWorld builds the Reducers of a simulated 1 × 2 cluster whose rank
// 0 has its world communicator wrapped by wrap, and a tensor of 1024
// float32 per rank, and makes one allreduce on each that must succeed (the
// wrappers let their first call through).
func pairWithWorld(
	t *testing.T, wrap func(backend.Comm) backend.Comm, opts ...hier.Option,
) ([]*hier.Reducer, []fairgo.Tensor) {
	t.Helper()
	c, err := sim.NewCluster(sim.Config{Machines: 1, Devices: 2, StallTimeout: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	rks := []backend.Rank{c.Rank(0), c.Rank(1)}
	rks[0].Comms.World = wrap(rks[0].Comms.World)
	var rs []*hier.Reducer
	for _, rk := range rks {
		r, err := hier.NewReducer(context.Background(), rk, opts...)
		require.NoError(t, err)
		rs = append(rs, r)
	}
	t.Cleanup(func() { _ = hier.CloseAll(rs) })
	ts := make([]fairgo.Tensor, 2)
	var works []*hier.Work
	for g, r := range rs {
		ts[g], err = c.Device(g).AllocTensor(1024, fairgo.Float32)
		require.NoError(t, err)
		works = append(works, r.AllReduce(context.Background(), ts[g], fairgo.Sum))
	}
	require.NoError(t, reftest.WaitAll(works))
	return rs, ts
}

// failingComm is a world communicator whose second call fails in its
// enqueue with an untyped error, as NCCL's enqueue returns a plain
// ncclRemoteError once it finds a peer dead.
type failingComm struct {
	backend.Comm
	mu    sync.Mutex
	calls int
}

func (c *failingComm) AllReduce(
	send, recv uintptr,
	count int64,
	dt fairgo.DType,
	op fairgo.Op,
	s streams.Stream,
) error {
	c.mu.Lock()
	c.calls++
	n := c.calls
	c.mu.Unlock()
	if n > 1 {
		return errors.New("ncclRemoteError: remote process exited or there was a network error")
	}
	return c.Comm.AllReduce(send, recv, count, dt, op, s)
}

// A call whose enqueue fails aborts the communicators, and its Work says so
// (fairgo.ErrAborted), with the enqueue's own error kept: a survivor of a
// dead peer gets a typed error whichever way NCCL reported the death (the
// fault run on 2 × 2 got an untyped one before).
func TestEnqueueFailureIsTyped(t *testing.T) {
	for _, inline := range []bool{true, false} {
		t.Run(fmt.Sprintf("inline=%v", inline), func(t *testing.T) {
			rs, ts := pairWithWorld(t, func(w backend.Comm) backend.Comm { return &failingComm{Comm: w} },
				hier.WithInlineEnqueue(inline), hier.WithTimeout(500*time.Millisecond))
			var works []*hier.Work
			for g, r := range rs {
				works = append(works, r.AllReduce(context.Background(), ts[g], fairgo.Sum))
			}
			err := works[0].Wait(context.Background())
			require.ErrorIs(t, err, fairgo.ErrAborted)
			require.Contains(t, err.Error(), "ncclRemoteError")
			require.ErrorIs(t, rs[0].Err(), fairgo.ErrAborted)
			require.Error(t, works[1].Wait(context.Background()), "the peer's call cannot succeed")
		})
	}
}

// A flat call on a world variant (NCCL's tree only) carries its
// fingerprint on that communicator: an operator that differs (an average
// among sums) fails on every rank, and matched calls give the reference's
// results.
func TestFingerprintOnAWorldVariant(t *testing.T) {
	cfg := sim.Config{Machines: 4, Devices: 1, Seed: 5, StallTimeout: time.Minute}
	w := newWorld(t, cfg, hier.WithAlgorithm(hier.FlatTree), hier.WithTimeout(time.Minute),
		hier.WithFingerprintMax(hier.DefaultFingerprintMax))
	const n = 128 << 10 // 512 KiB: above the flat threshold, where the algorithm applies
	in := reftest.RandomInputs(rand.New(rand.NewPCG(5, 6)), fairgo.Float32, fairgo.Sum, w.size(), n)
	out, err := w.allReduce(t, fairgo.Float32, fairgo.Sum, in)
	require.NoError(t, err)
	require.NoError(t, reftest.CheckResults(fairgo.Float32, reftest.ComputeReference(fairgo.Float32, fairgo.Sum, in), out))
	for _, r := range w.reducers { // the first call made the variant: its check went apart
		require.Zero(t, hier.FingerprintedCalls(r))
		require.Equal(t, hier.FlatTree, r.AlgorithmFor(4*n))
		// An abort ends the variant's work too: on NCCL a call hung on it
		// (counts that differ) would otherwise block every later free.
		require.Contains(t, hier.AbortedComms(r), "flat-tree")
	}
	ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 4*n), make([]byte, 4*n), make([]byte, 4*n), make([]byte, 4*n)})
	works := sumExceptOn(w, ts, 1)
	for g, wk := range works {
		err := wk.Wait(context.Background())
		require.ErrorIs(t, err, fairgo.ErrMismatch, "rank %d", g)
		var me *hier.MismatchError
		if errors.As(err, &me) { // the sim may see the data mismatch first
			require.Contains(t, []string{"operator", "shape"}, me.Field) // "shape": a field hash that collided
		}
	}
	for _, r := range w.reducers {
		require.Equal(t, uint64(1), hier.FingerprintedCalls(r))
	}
}

// Calls that every rank refuses fail at the call, before their checks run:
// a trainer that waited on every Work and closes right after must not find
// Close waiting for checks that a peer's Close dropped (it used to wait out
// its grace, 4 s, and abort the communicators in about one run of three).
// Each case repeats enough times that a stall of one run in three goes
// unseen with a probability under 1%.
func TestCloseIsPromptAfterRefusedCalls(t *testing.T) {
	const runs = 12
	ctx := context.Background()
	for _, mode := range checkModes {
		for _, tc := range []struct {
			name string
			call func(r *hier.Reducer, t fairgo.Tensor) *hier.Work
			is   error
		}{
			{"unknown dtype", func(r *hier.Reducer, t fairgo.Tensor) *hier.Work {
				t.DType = fairgo.DType(99)
				return r.AllReduce(ctx, t, fairgo.Sum)
			}, fairgo.ErrUnknownDType},
			{"broadcast root out of range", func(r *hier.Reducer, t fairgo.Tensor) *hier.Work {
				return r.Broadcast(ctx, t, 4)
			}, fairgo.ErrInvalidArgument},
			{"all-gather receive too small", func(r *hier.Reducer, t fairgo.Tensor) *hier.Work {
				return r.AllGather(ctx, t, t)
			}, fairgo.ErrInvalidArgument},
		} {
			t.Run(mode.name+"/"+tc.name, func(t *testing.T) {
				var slowest time.Duration
				for range runs {
					w := mode.world(t, sim.Config{Machines: 2, Devices: 2, Seed: 7})
					ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 64), make([]byte, 64), make([]byte, 64), make([]byte, 64)})
					for g, r := range w.reducers {
						require.ErrorIs(t, tc.call(r, ts[g]).Wait(ctx), tc.is)
					}
					start := time.Now()
					require.NoError(t, hier.CloseAll(w.reducers))
					slowest = max(slowest, time.Since(start))
					for g, r := range w.reducers {
						require.NoError(t, r.Err(), "rank %d: Close aborted the communicators", g)
					}
				}
				t.Logf("slowest CloseAll of %d: %v", runs, slowest)
				// 100 ms on an idle host; the bound leaves room for a loaded CI
				// machine under the race detector, far below the 4 s stall.
				require.Less(t, slowest, time.Second)
			})
		}
	}
}

// The most common first mistake in a program that drives several ranks:
// waiting on rank 0's call before rank 1 has made its own. The simulated
// cluster reports the stall as a timeout (fairgo.ErrTimeout, like the
// watchdog's) and names the cause.
func TestWaitBeforeEveryRankCalledIsATimeout(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 2, Devices: 1, Seed: 4, StallTimeout: 200 * time.Millisecond})
	ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 4096), make([]byte, 4096)})
	ctx := context.Background()
	err := w.reducers[0].AllReduce(ctx, ts[0], fairgo.Sum).Wait(ctx) // rank 1 has not called yet
	require.ErrorIs(t, err, fairgo.ErrTimeout)
	require.ErrorIs(t, err, sim.ErrStall)
	require.ErrorContains(t, err, "ranks [1] never made the call")
	require.ErrorContains(t, err, "every rank must make a collective before any rank waits on one")
}

// The watchdog is armed by default, at DefaultTimeout (10 minutes, as
// PyTorch's NCCL process group): a Go trainer whose peer hangs ends with
// fairgo.ErrTimeout instead of waiting forever. WithTimeout(0) turns it off.
func TestWatchdogByDefault(t *testing.T) {
	require.Equal(t, 10*time.Minute, hier.DefaultTimeout)
	for _, tc := range []struct {
		name string
		opts []hier.Option
		want time.Duration
	}{
		{"not given", nil, hier.DefaultTimeout},
		{"off", []hier.Option{hier.WithTimeout(0)}, 0},
		{"set", []hier.Option{hier.WithTimeout(time.Minute)}, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, sim.Config{Machines: 1, Devices: 2}, tc.opts...)
			for _, r := range w.reducers {
				require.Equal(t, tc.want, hier.WatchdogTimeout(r))
			}
		})
	}
	var ae *fairgo.ArgError
	require.ErrorAs(t, hier.ValidateOptions(hier.WithTimeout(-time.Second)), &ae)
	require.Equal(t, "WithTimeout", ae.Arg)
}

// A check whose enqueue the watchdog's abort ends reports the timeout (the
// cause), not the enqueue's own error alone: the Work's error is a
// fairgo.ErrTimeout that keeps NCCL's message. NCCL's enqueue of a check
// can wait on a peer that never comes (a peer whose data collective hangs
// on a count that differs) and returns ncclInternalError once the
// watchdog aborts it.
func TestCheckEnqueueEndedByTheWatchdogReportsTheTimeout(t *testing.T) {
	for _, inline := range []bool{true, false} {
		t.Run(fmt.Sprintf("inline=%v", inline), func(t *testing.T) {
			c, err := sim.NewCluster(sim.Config{Machines: 1, Devices: 2, StallTimeout: time.Minute})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			rks := []backend.Rank{c.Rank(0), c.Rank(1)}
			rks[0].Comms.Check = &blockingComm{Comm: rks[0].Comms.Check, aborted: make(chan struct{}),
				err: errors.New("ncclInternalError: internal error - please report this issue to the NCCL developers")}
			var rs []*hier.Reducer
			for _, rk := range rks {
				r, err := hier.NewReducer(context.Background(), rk, hier.WithInlineEnqueue(inline),
					hier.WithTimeout(300*time.Millisecond), hier.WithSharedMemoryDir(""), hier.WithFingerprintMax(0))
				require.NoError(t, err)
				rs = append(rs, r)
			}
			t.Cleanup(func() { _ = hier.CloseAll(rs) })
			ts := make([]fairgo.Tensor, 2)
			for g := range rs {
				ts[g], err = c.Device(g).AllocTensor(1024, fairgo.Float32)
				require.NoError(t, err)
			}
			for call := 1; call <= 2; call++ {
				var works []*hier.Work
				for g, r := range rs {
					works = append(works, r.AllReduce(context.Background(), ts[g], fairgo.Sum))
				}
				if call == 1 {
					require.NoError(t, reftest.WaitAll(works))
					continue
				}
				err := works[0].Wait(context.Background())
				require.ErrorIs(t, err, fairgo.ErrTimeout)
				require.ErrorIs(t, err, fairgo.ErrAborted)
				require.Contains(t, err.Error(), "ncclInternalError")
				require.Error(t, works[1].Wait(context.Background()), "the peer's call cannot succeed")
			}
		})
	}
}

// slowAbortComm is a communicator whose Abort fails its calls at once but
// takes a while to return, as ncclCommAbort tears a communicator down on a
// GPU, and records when it has returned.
type slowAbortComm struct {
	backend.Comm
	returned atomic.Bool
}

func (c *slowAbortComm) Abort() error {
	err := c.Comm.Abort()
	time.Sleep(300 * time.Millisecond)
	c.returned.Store(true)
	return err
}

// Close returns only after the Reducer's aborts have: the caller that owns
// the communicators destroys them next, and destroying one NCCL is still
// aborting crashes the process. Rank 0's call times out (rank 1 never
// joins) and aborts its world communicator, which takes 300 ms to return
// (within Close's grace of 1 s); Close must outlast that.
func TestCloseWaitsForTheAborts(t *testing.T) {
	c, err := sim.NewCluster(sim.Config{Machines: 1, Devices: 2, StallTimeout: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	rk := c.Rank(0)
	slow := &slowAbortComm{Comm: rk.Comms.World}
	rk.Comms.World = slow
	r, err := hier.NewReducer(context.Background(), rk, hier.WithAlgorithm(hier.Flat), hier.WithTimeout(time.Second))
	require.NoError(t, err)
	ts, err := c.Device(0).AllocTensor(1024, fairgo.Float32)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.ErrorIs(t, r.AllReduce(ctx, ts, fairgo.Sum).Wait(ctx), fairgo.ErrTimeout)
	_ = r.Close()
	require.True(t, slow.returned.Load(), "Close returned while its abort was still running")
}

// A call refused on one rank fails everywhere at once also where the
// peers' data is the first collective on its communicators (NCCL connects
// a communicator there and holds the enqueuing thread until every peer
// has made one, sim.Config.ConnectAtFirstCall): the refusing rank makes
// none, so the peers must learn of the refusal from the check while their
// enqueue is held, not from the watchdog. Earlier calls leave the data's
// communicators unused (their tensors are empty) and carry the agreement
// on shared memory where there is one. Each rank calls from a goroutine of
// its own, as a trainer's processes do.
func TestCallRefusedAtTheFirstConnectionFailsEverywhere(t *testing.T) {
	const watchdog = 20 * time.Second
	for _, mode := range checkModes {
		if strings.HasPrefix(mode.name, "fingerprint") {
			continue // the refusing rank runs the fingerprinted collective with its peers
		}
		t.Run(mode.name, func(t *testing.T) {
			cfg := sim.Config{Machines: mode.machines, Devices: 4 / mode.machines, Seed: 5,
				StallTimeout: watchdog, ConnectAtFirstCall: true}
			w := worldOf(t, cfg, func(_ int, _ *backend.Rank) []hier.Option {
				return append(slices.Clone(mode.opts), hier.WithTimeout(watchdog))
			})
			empty := fairgo.Tensor{DType: fairgo.Float32}
			for range mode.warm {
				require.NoError(t, reftest.WaitAll(callEveryRank(w, func(_ int, r *hier.Reducer) *hier.Work {
					return r.AllReduce(context.Background(), empty, fairgo.Sum)
				})))
			}
			ts := w.upload(t, fairgo.Float32, [][]byte{
				make([]byte, 4096), make([]byte, 4096), make([]byte, 4096), make([]byte, 4096)})
			const refuser = 2
			done, cancel := context.WithCancel(context.Background())
			cancel()
			start := time.Now()
			works := callEveryRank(w, func(g int, r *hier.Reducer) *hier.Work {
				ctx := context.Background()
				if g == refuser {
					ctx = done
				}
				return r.AllReduce(ctx, ts[g], fairgo.Sum)
			})
			for g, wk := range works {
				err := wk.Wait(context.Background())
				if g == refuser {
					require.ErrorIs(t, err, context.Canceled)
					continue
				}
				require.ErrorIs(t, err, fairgo.ErrMismatch, "rank %d", g)
				require.ErrorContains(t, err, fmt.Sprintf("rank %d refused call %d", refuser, 1+mode.warm), "rank %d", g)
				require.Less(t, time.Since(start), watchdog/6, "rank %d: %v", g, err)
			}
			enginesIdle(t, w)
			mode.used(t, w)
		})
	}
}

// A rank that refuses a small call for an unknown element type cannot run
// the collective that carries its peers' check (their fingerprint), nor
// do they run its separate check: neither check decides the call. The
// peers then read the refusal from the Board once their call has stayed
// undecided for a second, and the refusing rank reads from the Board that
// they did: every rank fails with ErrMismatch long before the watchdog.
func TestRefusalNoCheckCarriesIsReadFromTheBoard(t *testing.T) {
	const watchdog = time.Minute
	for _, mode := range checkModes[1:3] { // the fingerprint modes
		t.Run(mode.name, func(t *testing.T) {
			cfg := sim.Config{Machines: mode.machines, Devices: 4 / mode.machines, Seed: 6, StallTimeout: watchdog}
			w := worldOf(t, cfg, func(_ int, rk *backend.Rank) []hier.Option {
				if mode.plain {
					rk.Device = plainDevice{rk.Device}
				}
				return append(slices.Clone(mode.opts), hier.WithTimeout(watchdog))
			})
			warmUp(t, w, 2)
			ts := w.upload(t, fairgo.Float32, [][]byte{
				make([]byte, 4096), make([]byte, 4096), make([]byte, 4096), make([]byte, 4096)})
			const refuser = 1
			start := time.Now()
			works := callEveryRank(w, func(g int, r *hier.Reducer) *hier.Work {
				tn := ts[g]
				if g == refuser {
					tn.DType = fairgo.DType(99)
				}
				return r.AllReduce(context.Background(), tn, fairgo.Sum)
			})
			for g, wk := range works {
				err := wk.Wait(context.Background())
				if g == refuser {
					require.ErrorIs(t, err, fairgo.ErrUnknownDType)
					continue
				}
				require.ErrorIs(t, err, fairgo.ErrMismatch, "rank %d", g)
				require.ErrorContains(t, err, "rank 1 refused call 3 (allreduce of 1024 float32): ", "rank %d", g)
				require.ErrorContains(t, err, "unknown element type", "rank %d", g) // the reason, from the Board
				require.Less(t, time.Since(start), watchdog/6, "rank %d", g)
			}
			for g, r := range w.reducers {
				require.Eventually(t, func() bool { return errors.Is(r.Err(), fairgo.ErrMismatch) },
					watchdog/6, time.Millisecond, "rank %d: %v", g, r.Err())
			}
			mode.used(t, w)
		})
	}
}
