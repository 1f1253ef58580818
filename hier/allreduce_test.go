package hier_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/elem"
	"github.com/fairgo/fairgo/internal/reftest"
	"github.com/fairgo/fairgo/sim"
	"github.com/fairgo/fairgo/staging"
	"github.com/fairgo/fairgo/streams"
)

// allReduceCase is one drawn configuration of the property test.
type allReduceCase struct {
	cfg   sim.Config
	opts  []hier.Option
	dt    fairgo.DType
	op    fairgo.Op
	count int
	seed  uint64
}

func drawCase(t *rapid.T) allReduceCase {
	m := rapid.IntRange(1, 8).Draw(t, "M")
	d := rapid.IntRange(1, 8).Draw(t, "D")
	w := m * d
	dt := rapid.SampledFrom(fairgo.DTypes).Draw(t, "dtype")
	op := rapid.SampledFrom(fairgo.Ops).Draw(t, "op")
	es := dt.Size()
	maxCount := max(64, (8<<20)/(w*es)) // at most 8 MiB per rank set
	count := rapid.OneOf(
		rapid.IntRange(0, 100),
		rapid.SampledFrom([]int{w - 1, w, w + 1, 16*w - 1, 16*w + 1, 4099, 65537, 100003}),
		rapid.IntRange(100, maxCount),
	).Draw(t, "count")
	count = max(0, min(count, maxCount))
	bytes := int64(max(count*es, 1))
	par := rapid.IntRange(1, 6).Draw(t, "parallelism")
	unit := int64(w) * staging.Align
	slice := rapid.Int64Range(max(1, bytes/48), 2*bytes+unit).Draw(t, "slice")
	minStaging := int64(par) * (max(slice/unit*unit, unit) + int64(m)*staging.Align)
	opts := []hier.Option{
		hier.WithSliceSize(slice),
		hier.WithParallelism(par),
		// Staging as small as one unit per slot, but not so small that a
		// large call takes more than ~512 pipeline steps (each with the
		// sim's jitter: minutes).
		hier.WithStagingMemory(
			rapid.Int64Range(max(int64(par)*(unit+int64(m)*staging.Align), min(minStaging, int64(par)*bytes/512)), 2*minStaging).
				Draw(t, "staging"),
		),
		hier.WithPaddingMemory(rapid.Int64Range(unit, 8*unit).Draw(t, "padding")),
		hier.WithFlatThreshold(
			rapid.SampledFrom([]int64{hier.FlatNever, hier.FlatNever, 0, bytes / 2, bytes + 1}).Draw(t, "flat"),
		),
		hier.WithAlgorithm(
			rapid.SampledFrom([]hier.Algorithm{hier.RailAllToAll, hier.RailRSAG, hier.RailAllToAll, hier.RailRSAG,
				hier.RailAllReduce, hier.Flat, hier.Auto, hier.FlatRing, hier.FlatTree, hier.HalvingDoubling,
				hier.RecursiveDoubling}).
				Draw(t, "algorithm"),
		),
		hier.WithInlineEnqueue(rapid.Bool().Draw(t, "inline")),
		hier.WithSerialRail(rapid.Bool().Draw(t, "serial rail")),
		// With the watchdog, small flat calls carry their check in their
		// data; the limit at the call's size, or just below it.
		hier.WithTimeout(rapid.SampledFrom([]time.Duration{0, time.Minute}).Draw(t, "watchdog")),
		hier.WithFingerprintMax(rapid.SampledFrom([]int64{hier.DefaultFingerprintMax, bytes, bytes - 1}).Draw(t, "fingerprint max")),
	}
	return allReduceCase{
		cfg: sim.Config{Machines: m, Devices: d, Seed: rapid.Int64().Draw(t, "seed"),
			Jitter: 20 * time.Microsecond, StallTimeout: 20 * time.Second},
		opts: opts, dt: dt, op: op, count: count, seed: rapid.Uint64().Draw(t, "data"),
	}
}

// run performs the case's allreduce and checks it against the reference.
func (c allReduceCase) run(t testing.TB, hook func(*hier.Reducer)) error {
	w, err := tryWorld(c.cfg, c.opts...)
	require.NoError(t, err)
	defer w.close()
	if hook != nil {
		for _, r := range w.reducers {
			hook(r)
		}
	}
	rng := rand.New(rand.NewPCG(c.seed, 7))
	in := reftest.RandomInputs(rng, c.dt, c.op, w.size(), c.count)
	out, err := w.allReduce(t, c.dt, c.op, in)
	for g, r := range w.reducers {
		// A calibration that failed would have lost a GPU's context (a
		// misaligned timed size once did); the sim only falls back.
		if n := hier.GuessedClasses(r); n > 0 && err == nil {
			return fmt.Errorf("rank %d: %d size classes could not be calibrated", g, n)
		}
	}
	if err != nil {
		return err
	}
	return reftest.CheckResults(c.dt, reftest.ComputeReference(c.dt, c.op, in), out)
}

func TestAllReduceProperty(t *testing.T) {
	t.Parallel() // its own simulated worlds; CPU-bound, it overlaps the other parallel tests
	rapid.Check(t, func(rt *rapid.T) {
		c := drawCase(rt)
		require.NoError(rt, c.run(t, nil))
	})
}

// Counts of several million elements, including primes and M·D ± 1.
func TestAllReduceLarge(t *testing.T) {
	t.Parallel() // its own simulated worlds; CPU-bound, it overlaps the other parallel tests
	if testing.Short() {
		t.Skip("large counts")
	}
	for _, tc := range []struct {
		m, d  int
		count int
		dt    fairgo.DType
		op    fairgo.Op
		algo  hier.Algorithm
	}{
		{3, 5, 1000003, fairgo.BFloat16, fairgo.Avg, hier.RailAllToAll},
		{2, 2, 4<<20 + 1, fairgo.Float32, fairgo.Sum, hier.RailRSAG},
		{8, 1, 2000003, fairgo.Float16, fairgo.Sum, hier.RailAllToAll},
		{1, 8, 3 << 20, fairgo.Int32, fairgo.Max, hier.FlatTree},
		{5, 1, 1<<20 + 7, fairgo.BFloat16, fairgo.Avg, hier.HalvingDoubling},
		{6, 1, 1<<20 + 3, fairgo.Float32, fairgo.Avg, hier.RecursiveDoubling},
		{2, 4, 1<<21 - 1, fairgo.Float64, fairgo.Prod, hier.RailRSAG},
		{4, 3, 12*100000 + 11, fairgo.Uint8, fairgo.Sum, hier.RailAllToAll},
		{3, 2, 600001, fairgo.Int64, fairgo.Avg, hier.RailRSAG},
	} {
		t.Run(tc.dt.String()+"/"+tc.op.String()+"/"+tc.algo.String(), func(t *testing.T) {
			c := allReduceCase{cfg: sim.Config{Machines: tc.m, Devices: tc.d, Seed: 1, Jitter: 10 * time.Microsecond},
				opts: []hier.Option{
					hier.WithSliceSize(1 << 20),
					hier.WithAlgorithm(tc.algo),
				}, dt: tc.dt, op: tc.op, count: tc.count, seed: 3}
			require.NoError(t, c.run(t, nil))
		})
	}
}

// Removing any one event wait from the stage chain must make the property
// test fail: the jitter reorders the stages and the results come out wrong.
// With a serial rail the diffuse runs on the collect's stream: for
// RailRSAG, whose add stage has nothing to do for a float sum, the waits
// into and out of the add stage order nothing that the stream does not.
func TestMissingEventWaitIsCaught(t *testing.T) {
	all := []streams.Stage{streams.Collect, streams.Add, streams.Diffuse, streams.AllGather}
	type testCase struct {
		algo   hier.Algorithm
		serial bool
		stage  streams.Stage
	}
	var cases []testCase
	for _, stage := range all {
		cases = append(cases, testCase{hier.RailAllToAll, false, stage}, testCase{hier.RailRSAG, false, stage},
			testCase{hier.RailAllToAll, true, stage})
	}
	cases = append(
		cases,
		testCase{hier.RailRSAG, true, streams.Collect},
		testCase{hier.RailRSAG, true, streams.AllGather},
	)
	for _, tc := range cases {
		algo, stage := tc.algo, tc.stage
		name := algo.String() + "/" + stage.String()
		if tc.serial {
			name = algo.String() + "-serial/" + stage.String()
		}
		t.Run(name, func(t *testing.T) {
			caught := false
			for attempt := 0; attempt < 20 && !caught; attempt++ {
				c := allReduceCase{
					cfg: sim.Config{
						Machines:     3,
						Devices:      2,
						Seed:         int64(attempt),
						Jitter:       300 * time.Microsecond,
						StallTimeout: 20 * time.Second,
					},
					opts: []hier.Option{
						hier.WithSliceSize(6 * 16 * 64),
						hier.WithFlatThreshold(hier.FlatNever),
						hier.WithAlgorithm(algo),
						hier.WithSerialRail(tc.serial),
					},
					dt: fairgo.Float32, op: fairgo.Sum, count: 6*16*10 + 5, seed: uint64(attempt),
				}
				require.NoError(t, c.run(t, nil), "control run without the hook")
				err := c.run(t, func(r *hier.Reducer) { hier.SkipStageWait(r, stage) })
				if err != nil {
					caught = true
					t.Logf("attempt %d caught it: %v", attempt, err)
				}
			}
			require.True(t, caught, "dropping the %s wait of %s went unnoticed", stage, algo)
		})
	}
}

// Float16 and bfloat16 accumulate in float32 in the add stage: more accurate
// than a flat ring, which rounds to 16 bits at every hop.
func TestSixteenBitAccumulatesInFloat32(t *testing.T) {
	for _, dt := range []fairgo.DType{fairgo.BFloat16, fairgo.Float16} {
		t.Run(dt.String(), func(t *testing.T) {
			const ranks, count = 8, 4096
			rng := rand.New(rand.NewPCG(11, 12))
			in := make([][]byte, ranks)
			for g := range in {
				in[g] = make([]byte, count*2)
				for i := 0; i < count; i++ {
					// a large value on rank 0 and small ones elsewhere: each
					// ring hop rounds the small addends away.
					v := 1 + rng.Float64()
					if g > 0 {
						v = (rng.Float64() + 0.5) * dt.Epsilon() * 1.5
					}
					elem.Set(dt, in[g], i, v)
				}
			}
			errOf := func(out []byte) float64 {
				var total float64
				for i := 0; i < count; i++ {
					var want float64
					for g := range in {
						want += elem.Get(dt, in[g], i)
					}
					total += math.Abs(elem.Get(dt, out, i) - want)
				}
				return total
			}
			hierW := newWorld(
				t,
				sim.Config{Machines: ranks, Devices: 1, Seed: 1},
				hier.WithFlatThreshold(hier.FlatNever),
				hier.WithAlgorithm(hier.RailAllToAll),
			)
			got, err := hierW.allReduce(t, dt, fairgo.Sum, in)
			require.NoError(t, err)
			flatW := newWorld(t, sim.Config{Machines: ranks, Devices: 1, Seed: 1}, hier.WithFlatThreshold(1<<40))
			flat, err := flatW.allReduce(t, dt, fairgo.Sum, in)
			require.NoError(t, err)
			hierErr, flatErr := errOf(got[0]), errOf(flat[0])
			t.Logf("%s: total abs error fairgo %.4g, flat ring %.4g", dt, hierErr, flatErr)
			require.Less(t, hierErr, flatErr/2, "fairgo's 16-bit sum should be clearly more accurate than a ring's")
		})
	}
}

func TestDegenerateGrids(t *testing.T) {
	for _, g := range [][2]int{{1, 1}, {1, 4}, {4, 1}} {
		for _, op := range fairgo.Ops {
			c := allReduceCase{cfg: sim.Config{Machines: g[0], Devices: g[1], Seed: 5, Jitter: 5 * time.Microsecond},
				opts: []hier.Option{hier.WithFlatThreshold(hier.FlatNever), hier.WithSliceSize(1024)},
				dt:   fairgo.Float32, op: op, count: 1001, seed: 9}
			require.NoError(t, c.run(t, nil), "grid %v op %v", g, op)
		}
	}
}

// Several ranks whose launcher order is not machine-major.
func TestShuffledRankOrder(t *testing.T) {
	order := []int{5, 0, 3, 1, 4, 2} // global rank g sits at grid rank order[g]
	c := allReduceCase{
		cfg:   sim.Config{Machines: 3, Devices: 2, Seed: 2, Jitter: 10 * time.Microsecond, RankOrder: order},
		opts:  []hier.Option{hier.WithFlatThreshold(hier.FlatNever), hier.WithSliceSize(4096)},
		dt:    fairgo.Int64,
		op:    fairgo.Sum,
		count: 10007,
		seed:  4,
	}
	require.NoError(t, c.run(t, nil))
}

// 64 allreduces in flight per rank, issued in the same order everywhere.
func TestManyInFlight(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 2, Devices: 2, Seed: 3, Jitter: 5 * time.Microsecond},
		hier.WithSliceSize(2048), hier.WithFlatThreshold(hier.FlatNever), hier.WithParallelism(2))
	const calls = 64
	rng := rand.New(rand.NewPCG(1, 2))
	type call struct {
		in  [][]byte
		ts  []fairgo.Tensor
		wks []*hier.Work
	}
	cs := make([]call, calls)
	for i := range cs {
		n := 100 + rng.IntN(3000)
		cs[i].in = reftest.RandomInputs(rng, fairgo.Int32, fairgo.Sum, w.size(), n)
		cs[i].ts = w.upload(t, fairgo.Int32, cs[i].in)
	}
	for i := range cs {
		for g, r := range w.reducers {
			cs[i].wks = append(cs[i].wks, r.AllReduce(context.Background(), cs[i].ts[g], fairgo.Sum))
		}
	}
	for i := range cs {
		require.NoError(t, reftest.WaitAll(cs[i].wks))
		require.NoError(
			t,
			reftest.CheckResults(
				fairgo.Int32,
				reftest.ComputeReference(fairgo.Int32, fairgo.Sum, cs[i].in),
				w.download(t, cs[i].ts),
			),
			"call %d",
			i,
		)
	}
}

// Calls from several goroutines on one Reducer are serialized without data
// races. Every buffer of a rank holds the same data, so any pairing of calls
// across ranks gives the same sum.
func TestConcurrentCallers(t *testing.T) {
	w := newWorld(
		t,
		sim.Config{Machines: 2, Devices: 2, Seed: 4},
		hier.WithFlatThreshold(hier.FlatNever),
		hier.WithSliceSize(1024),
	)
	const goroutines, perG, n = 4, 6, 777
	rng := rand.New(rand.NewPCG(3, 4))
	in := reftest.RandomInputs(rng, fairgo.Int64, fairgo.Sum, w.size(), n)
	ref := reftest.ComputeReference(fairgo.Int64, fairgo.Sum, in)
	var wg sync.WaitGroup
	errs := make(chan error, w.size()*goroutines)
	// Now issue concurrently: each goroutine owns its buffers.
	bufs := make([][][]fairgo.Tensor, w.size())
	for g := range bufs {
		bufs[g] = make([][]fairgo.Tensor, goroutines)
		for k := range bufs[g] {
			for j := 0; j < perG; j++ {
				dev := w.cluster.Device(g)
				tn, err := dev.AllocTensor(n, fairgo.Int64)
				require.NoError(t, err)
				require.NoError(t, dev.Upload(tn.Ptr, in[g]))
				bufs[g][k] = append(bufs[g][k], tn)
			}
		}
	}
	for g, r := range w.reducers {
		for k := 0; k < goroutines; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var works []*hier.Work
				for _, tn := range bufs[g][k] {
					works = append(works, r.AllReduce(context.Background(), tn, fairgo.Sum))
				}
				errs <- reftest.WaitAll(works)
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for k := 0; k < goroutines; k++ {
		for j := 0; j < perG; j++ {
			var ts []fairgo.Tensor
			for g := range bufs {
				ts = append(ts, bufs[g][k][j])
			}
			out := w.download(t, ts)
			for g := range out {
				require.NoError(
					t,
					reftest.CheckResults(fairgo.Int64, ref, [][]byte{out[g]}),
					"rank %d buffer %d/%d",
					g,
					k,
					j,
				)
			}
		}
	}
}

// Ranks that enqueue calls in different orders get a mismatch error naming
// the call and the field that differs, not a hang. The separate check
// names the field; a fingerprint in the data only says the ranks differ
// (TestCountsDifferingInTheTailFailWithFingerprints).
func TestDifferentOrdersFailClearly(t *testing.T) {
	w := newWorld(
		t,
		sim.Config{Machines: 2, Devices: 1, Seed: 5, StallTimeout: 5 * time.Second},
		hier.WithFlatThreshold(hier.FlatNever),
		hier.WithFingerprintMax(0),
	)
	a := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 4*100), make([]byte, 4*100)})
	b := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 4*300), make([]byte, 4*300)})
	var works []*hier.Work
	works = append(
		works,
		w.reducers[0].AllReduce(context.Background(), a[0], fairgo.Sum),
		w.reducers[0].AllReduce(context.Background(), b[0], fairgo.Sum),
	)
	works = append(
		works,
		w.reducers[1].AllReduce(context.Background(), b[1], fairgo.Sum),
		w.reducers[1].AllReduce(context.Background(), a[1], fairgo.Sum),
	)
	start := time.Now()
	err := reftest.WaitAll(works)
	// The failure is reported as soon as the device work ends with it, not
	// after the watcher's abort grace.
	require.Less(t, time.Since(start), 5*time.Second, "failed work took %v to report", time.Since(start))
	require.Error(t, err)
	require.ErrorIs(t, err, fairgo.ErrMismatch)
	for _, wk := range works {
		require.ErrorIs(t, wk.Err(), fairgo.ErrMismatch)
	}
	var me *hier.MismatchError
	require.ErrorAs(t, works[0].Err(), &me)
	require.Equal(t, uint64(1), me.Seq)
	require.Equal(t, "count", me.Field)
	require.Equal(t, "100", me.This)
	require.Equal(t, "100", me.Low)
	require.Equal(t, "300", me.High)
}

// A rank that never calls cannot hang the others: the watchdog aborts.
func TestWatchdogTimesOut(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 2, Devices: 1, Seed: 6, StallTimeout: time.Minute},
		hier.WithFlatThreshold(hier.FlatNever), hier.WithTimeout(300*time.Millisecond))
	ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 4*64), make([]byte, 4*64)})
	start := time.Now()
	err := w.reducers[0].AllReduce(context.Background(), ts[0], fairgo.Sum).Wait(context.Background())
	require.ErrorIs(t, err, fairgo.ErrTimeout)
	require.Less(t, time.Since(start), 15*time.Second)
	// Later calls fail at once.
	require.ErrorIs(
		t,
		w.reducers[0].AllReduce(context.Background(), ts[0], fairgo.Sum).Wait(context.Background()),
		fairgo.ErrTimeout,
	)
}

func TestWaitHonoursContext(t *testing.T) {
	w := newWorld(
		t,
		sim.Config{Machines: 2, Devices: 1, Seed: 6, StallTimeout: time.Minute},
		hier.WithFlatThreshold(hier.FlatNever),
	)
	ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 4*64), make([]byte, 4*64)})
	wk := w.reducers[0].AllReduce(context.Background(), ts[0], fairgo.Sum)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, wk.Wait(ctx), context.DeadlineExceeded)
	require.False(t, wk.IsCompleted())
	// The peer arrives late; the work completes.
	require.NoError(t, w.reducers[1].AllReduce(context.Background(), ts[1], fairgo.Sum).Wait(context.Background()))
	require.NoError(t, wk.Wait(context.Background()))
}

// Every rank makes the same invalid calls (SPMD code with a bug): each gets
// a typed error at once, nothing reaches the device, and the Reducers stay
// usable.
func TestBadInput(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 2, Devices: 2, Seed: 7})
	bufs := w.upload(
		t,
		fairgo.Float32,
		[][]byte{make([]byte, 64), make([]byte, 64), make([]byte, 64), make([]byte, 64)},
	)
	for g, r := range w.reducers {
		badCalls(t, r, bufs[g], bufs[(g+1)%len(bufs)]) // another device's memory
	}
	// A valid call afterwards completes everywhere.
	ctx := context.Background()
	ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 64), make([]byte, 64), make([]byte, 64), make([]byte, 64)})
	var works []*hier.Work
	for g, rr := range w.reducers {
		works = append(works, rr.AllReduce(ctx, ts[g], fairgo.Sum))
	}
	require.NoError(t, reftest.WaitAll(works))
	for _, r := range w.reducers {
		require.NoError(t, r.Err())
	}
}

// badCalls makes a dozen invalid calls on r and checks each error.
func badCalls(t *testing.T, r *hier.Reducer, good, other fairgo.Tensor) {
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		name string
		work *hier.Work
		is   error
		arg  string
	}{
		{"negative count",
			r.AllReduce(ctx, fairgo.Tensor{Ptr: good.Ptr, Bytes: 64, Count: -1, DType: fairgo.Float32}, fairgo.Sum),
			fairgo.ErrInvalidArgument, "count"},
		{"overflowing count",
			r.AllReduce(ctx,
				fairgo.Tensor{Ptr: good.Ptr, Bytes: 64, Count: math.MaxInt64 / 2, DType: fairgo.Float32}, fairgo.Sum),
			fairgo.ErrInvalidArgument, "count"},
		{"short buffer",
			r.AllReduce(ctx, fairgo.Tensor{Ptr: good.Ptr, Bytes: 64, Count: 17, DType: fairgo.Float32}, fairgo.Sum),
			fairgo.ErrInvalidArgument, "buffer"},
		{"unknown dtype",
			r.AllReduce(ctx, fairgo.Tensor{Ptr: good.Ptr, Bytes: 64, Count: 4, DType: fairgo.DType(99)}, fairgo.Sum),
			fairgo.ErrUnknownDType, "dtype"},
		{"unknown op", r.AllReduce(ctx, good, fairgo.Op(42)), fairgo.ErrUnknownOp, "op"},
		{"other device's memory", r.AllReduce(ctx, other, fairgo.Sum), fairgo.ErrInvalidArgument, ""},
		// A GPU kernel reading a float32 at an odd pair of bytes would
		// fault and lose the process's CUDA context.
		{"address not a multiple of the element size",
			r.AllReduce(ctx, fairgo.Tensor{Ptr: good.Ptr + 2, Bytes: 60, Count: 15, DType: fairgo.Float32}, fairgo.Sum),
			fairgo.ErrInvalidArgument, "ptr"},
		{"range past the allocation",
			r.AllReduce(ctx, fairgo.Tensor{Ptr: good.Ptr + 32, Bytes: 64, Count: 16, DType: fairgo.Float32}, fairgo.Sum),
			fairgo.ErrInvalidArgument, ""},
		{"cancelled context", r.AllReduce(cancelled, good, fairgo.Sum), context.Canceled, ""},
		// A slice outside its tensor (16 elements) is refused by name, not
		// found later by the memory it strays into.
		{"slice past the end", r.AllReduce(ctx, good.Slice(10, 10), fairgo.Sum), fairgo.ErrInvalidArgument, "slice"},
		{"slice before the start", r.Broadcast(ctx, good.Slice(-1, 4), 0), fairgo.ErrInvalidArgument, "slice"},
		{"all-gather of a slice past the end", r.AllGather(ctx, good.Slice(15, 4), good), fairgo.ErrInvalidArgument,
			"slice"},
		{"reduce-scatter counts", r.ReduceScatter(ctx, good, good, fairgo.Sum), fairgo.ErrInvalidArgument, "recv count"},
		{"all-gather counts", r.AllGather(ctx, good, good), fairgo.ErrInvalidArgument, "recv count"},
		{"broadcast root", r.Broadcast(ctx, good, 4), fairgo.ErrInvalidArgument, "root"},
		{"all-to-allv counts", r.AllToAllv(ctx, good, []int64{1, 2}, good, []int64{1, 2, 3, 4}),
			fairgo.ErrInvalidArgument, "sendCounts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.work.Wait(ctx)
			require.ErrorIs(t, err, tc.is)
			// StreamWait returns the error too, at once: the work never
			// reaches the device (it once waited for its context instead).
			s, serr := r.Device().NewStream()
			require.NoError(t, serr)
			short, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			require.ErrorIs(t, tc.work.StreamWait(short, s), tc.is)
			if tc.arg != "" {
				var ae *fairgo.ArgError
				require.ErrorAs(t, err, &ae)
				require.Equal(t, tc.arg, ae.Arg)
			}
		})
	}
}

func TestInvalidOptions(t *testing.T) {
	c, err := sim.NewCluster(sim.Config{Machines: 2, Devices: 2})
	require.NoError(t, err)
	defer c.Close()
	for _, tc := range []struct {
		opt hier.Option
		arg string
	}{
		{hier.WithSliceSize(-1), "WithSliceSize"},
		{hier.WithStagingMemory(-5), "WithStagingMemory"},
		{hier.WithStagingMemory(10), "WithStagingMemory"},
		{hier.WithPaddingMemory(16), "WithPaddingMemory"},
		{hier.WithParallelism(-1), "WithParallelism"},
		{hier.WithFlatThreshold(-2), "WithFlatThreshold"},
		{hier.WithTimeout(-time.Second), "WithTimeout"},
		{hier.WithSpin(-time.Microsecond), "WithSpin"},
	} {
		_, err := hier.NewReducer(context.Background(), c.Rank(0), tc.opt)
		var ae *fairgo.ArgError
		require.ErrorAs(t, err, &ae, tc.arg)
		require.Equal(t, tc.arg, ae.Arg)
	}
}

func TestUseAfterClose(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 1, Devices: 2})
	ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 64)})
	require.NoError(t, w.reducers[0].Close())
	require.ErrorIs(t, w.reducers[0].Close(), fairgo.ErrClosed)
	require.ErrorIs(
		t,
		w.reducers[0].AllReduce(context.Background(), ts[0], fairgo.Sum).Wait(context.Background()),
		fairgo.ErrClosed,
	)
}

// Close with work still pending ends that work with an error, never a hang.
func TestCloseWhilePending(t *testing.T) {
	w := newWorld(
		t,
		sim.Config{Machines: 2, Devices: 1, StallTimeout: time.Minute},
		hier.WithFlatThreshold(hier.FlatNever),
	)
	ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 4096), make([]byte, 4096)})
	var works []*hier.Work
	for i := 0; i < 5; i++ { // only rank 0 calls: the work cannot complete
		works = append(works, w.reducers[0].AllReduce(context.Background(), ts[0], fairgo.Sum))
	}
	start := time.Now()
	require.NoError(t, w.reducers[0].Close())
	require.Less(t, time.Since(start), 20*time.Second)
	for _, wk := range works {
		err := wk.Wait(context.Background())
		require.Error(t, err)
		require.True(t, errors.Is(err, fairgo.ErrClosed), "got %v", err)
	}
}

// After makes the first stage wait for the caller's stream; StreamWait makes
// the caller's stream wait for the result.
func TestCallerStreams(t *testing.T) {
	w := newWorld(
		t,
		sim.Config{Machines: 2, Devices: 2, Seed: 8, Jitter: 50 * time.Microsecond},
		hier.WithFlatThreshold(hier.FlatNever),
	)
	const n = 999
	rng := rand.New(rand.NewPCG(5, 6))
	in := reftest.RandomInputs(rng, fairgo.Int32, fairgo.Sum, w.size(), n)
	ref := reftest.ComputeReference(fairgo.Int32, fairgo.Sum, in)
	var works []*hier.Work
	outs := make([]fairgo.Tensor, w.size())
	var done []streams.Event
	for g, r := range w.reducers {
		dev := w.cluster.Device(g)
		s, err := dev.NewStream()
		require.NoError(t, err)
		src, err := dev.AllocTensor(n, fairgo.Int32)
		require.NoError(t, err)
		require.NoError(t, dev.Upload(src.Ptr, in[g]))
		buf, err := dev.AllocTensor(n, fairgo.Int32)
		require.NoError(t, err)
		out, err := dev.AllocTensor(n, fairgo.Int32)
		require.NoError(t, err)
		// The "gradients" are produced on the caller's stream, the allreduce
		// waits for them, and the caller's stream copies the result out.
		require.NoError(t, dev.CopyAsync(buf.Ptr, src.Ptr, buf.ByteLen(), s))
		wk := r.AllReduce(context.Background(), buf, fairgo.Sum, hier.After(s))
		require.NoError(t, wk.StreamWait(context.Background(), s))
		require.NoError(t, dev.CopyAsync(out.Ptr, buf.Ptr, buf.ByteLen(), s))
		ev, err := dev.NewEvent()
		require.NoError(t, err)
		require.NoError(t, ev.Record(s))
		works = append(works, wk)
		outs[g] = out
		done = append(done, ev)
	}
	for _, ev := range done { // the host waits for the caller's streams only
		require.NoError(t, ev.Wait(context.Background()))
		_, err := ev.Query()
		require.NoError(t, err)
	}
	require.NoError(t, reftest.CheckResults(fairgo.Int32, ref, w.download(t, outs)))
	require.NoError(t, reftest.WaitAll(works))
}

// TestDetachedLeavesTheStreamFree: an inline call (one flat piece, with
// WithInlineEnqueue) would run on its After stream; Detached keeps it off,
// so the caller's stream drains while the call waits for a peer that has
// not called yet, and StreamWait then makes the stream wait for the result.
func TestDetachedLeavesTheStreamFree(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 1, Devices: 2, Seed: 12, Jitter: 50 * time.Microsecond},
		hier.WithInlineEnqueue(true))
	const n = 257
	in := reftest.RandomInputs(rand.New(rand.NewPCG(12, 1)), fairgo.Float32, fairgo.Sum, w.size(), n)
	ref := reftest.ComputeReference(fairgo.Float32, fairgo.Sum, in)
	outs := make([]fairgo.Tensor, w.size())
	works := make([]*hier.Work, w.size())
	done := make([]streams.Event, w.size())
	for g, r := range w.reducers {
		dev := w.cluster.Device(g)
		s, err := dev.NewStream()
		require.NoError(t, err)
		src, err := dev.AllocTensor(n, fairgo.Float32)
		require.NoError(t, err)
		require.NoError(t, dev.Upload(src.Ptr, in[g]))
		buf, err := dev.AllocTensor(n, fairgo.Float32)
		require.NoError(t, err)
		outs[g], err = dev.AllocTensor(n, fairgo.Float32)
		require.NoError(t, err)
		require.NoError(t, dev.CopyAsync(buf.Ptr, src.Ptr, buf.ByteLen(), s))
		works[g] = r.AllReduce(context.Background(), buf, fairgo.Sum, hier.After(s), hier.Detached())
		if g == 0 { // its peer has not called: the reduction cannot have run
			drained, err := dev.NewEvent()
			require.NoError(t, err)
			require.NoError(t, drained.Record(s))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			require.NoError(t, drained.Wait(ctx), "the After stream waits for a detached call")
			cancel()
			require.False(t, works[0].IsCompleted())
		}
		require.NoError(t, works[g].StreamWait(context.Background(), s))
		require.NoError(t, dev.CopyAsync(outs[g].Ptr, buf.Ptr, buf.ByteLen(), s))
		done[g], err = dev.NewEvent()
		require.NoError(t, err)
		require.NoError(t, done[g].Record(s))
	}
	for _, ev := range done {
		require.NoError(t, ev.Wait(context.Background()))
	}
	require.NoError(t, reftest.CheckResults(fairgo.Float32, ref, w.download(t, outs)))
	require.NoError(t, reftest.WaitAll(works))
	for _, r := range w.reducers {
		require.Positive(t, hier.InlineCalls(r), "the test's call must take the inline path")
	}
}

func TestZeroCountCompletes(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 2, Devices: 2})
	var works []*hier.Work
	for _, r := range w.reducers {
		works = append(works, r.AllReduce(context.Background(), fairgo.Tensor{DType: fairgo.Float32}, fairgo.Sum))
	}
	require.NoError(t, reftest.WaitAll(works))
}
