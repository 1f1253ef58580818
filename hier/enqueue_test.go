package hier_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/reftest"
	"github.com/fairgo/fairgo/sim"
	"github.com/fairgo/fairgo/streams"
)

// BenchmarkEnqueue measures the host time of one single-slice collective:
// from the call until its device work is enqueued (what StreamWait waits
// for), on rank 0, which calls from the benchmark's goroutine while every
// other rank makes the same calls from a goroutine of its own. The device
// work itself is tiny (4 KiB), and every 32 calls the ranks wait for
// completion so that queues stay short. ns/op is the whole
// loop; enqueue-ns/op is the figure of target T6 (the host's cost per call).
func BenchmarkEnqueue(b *testing.B) {
	one := sim.Config{Machines: 1, Devices: 2}
	inline := []hier.Option{hier.WithInlineEnqueue(true)}
	for _, tc := range []struct {
		name string
		cfg  sim.Config
		opts []hier.Option
		coll collective
	}{
		{"1x2/flat/inline", one, inline, allReduceCall},
		{"1x2/flat/engine", one, nil, allReduceCall},
		{"2x2/rail-a2a", sim.Config{Machines: 2, Devices: 2},
			[]hier.Option{hier.WithFlatThreshold(hier.FlatNever), hier.WithAlgorithm(hier.RailAllToAll)}, allReduceCall},
		{"2x2/rail-rsag", sim.Config{Machines: 2, Devices: 2},
			[]hier.Option{hier.WithFlatThreshold(hier.FlatNever), hier.WithAlgorithm(hier.RailRSAG)}, allReduceCall},
		{"2x2/rail-rsag/inline", sim.Config{Machines: 2, Devices: 2},
			[]hier.Option{hier.WithFlatThreshold(hier.FlatNever), hier.WithAlgorithm(hier.RailRSAG),
				hier.WithInlineEnqueue(true)}, allReduceCall},
		{"1x2/reduce-scatter/inline", one, inline, reduceScatterCall},
		{"1x2/reduce-scatter/engine", one, nil, reduceScatterCall},
		{"1x2/all-gather/inline", one, inline, allGatherCall},
		{"1x2/broadcast/inline", one, inline, broadcastCall},
	} {
		b.Run(tc.name, func(b *testing.B) {
			w := newWorld(b, tc.cfg, tc.opts...)
			benchEnqueue(b, w.reducers, w.devs, 1024, 32, tc.coll)
		})
	}
}

// collective makes one call of an enqueue benchmark on t, a buffer of the
// benchmark's size: the allreduce of t, its reduce-scatter or all-gather
// in place (this rank's block of t), or its broadcast from rank 0.
type collective func(ctx context.Context, r *hier.Reducer, t fairgo.Tensor, opts ...hier.CallOption) *hier.Work

func allReduceCall(ctx context.Context, r *hier.Reducer, t fairgo.Tensor, opts ...hier.CallOption) *hier.Work {
	return r.AllReduce(ctx, t, fairgo.Sum, opts...)
}

func reduceScatterCall(ctx context.Context, r *hier.Reducer, t fairgo.Tensor, opts ...hier.CallOption) *hier.Work {
	return r.ReduceScatter(ctx, t, ownBlock(r, t), fairgo.Sum, opts...)
}

func allGatherCall(ctx context.Context, r *hier.Reducer, t fairgo.Tensor, opts ...hier.CallOption) *hier.Work {
	return r.AllGather(ctx, ownBlock(r, t), t, opts...)
}

func broadcastCall(ctx context.Context, r *hier.Reducer, t fairgo.Tensor, opts ...hier.CallOption) *hier.Work {
	return r.Broadcast(ctx, t, 0, opts...)
}

// ownBlock is r's block of t, cut into one block per rank.
func ownBlock(r *hier.Reducer, t fairgo.Tensor) fairgo.Tensor {
	n := t.Count / int64(r.Grid().Size())
	return t.Slice(int64(r.Grid().Rank())*n, n)
}

// benchEnqueue runs the enqueue benchmark on any world (sim or GPUs): calls
// of coll on count float32 elements, batch of them enqueued before they are
// waited for (1: one call at a time).
func benchEnqueue(b *testing.B, reds []*hier.Reducer, devs []testDevice, count int64, batch int, coll collective) {
	n := len(reds)
	ts := make([]fairgo.Tensor, n)
	ss := make([]streams.Stream, n)
	for g := range reds {
		var err error
		ts[g], err = devs[g].AllocTensor(count, fairgo.Float32)
		require.NoError(b, err)
		require.NoError(b, devs[g].Upload(ts[g].Ptr, make([]byte, 4*count)))
		ss[g], err = devs[g].NewStream()
		require.NoError(b, err)
	}
	b.Cleanup(func() {
		for g := range ts {
			_ = devs[g].Free(ts[g].Ptr)
		}
	})
	ctx := context.Background()
	// One untimed call on every rank first: the first call of a size class
	// may calibrate it (Auto measures every grid), which is no enqueue cost.
	warm := make([]error, n)
	var wwg sync.WaitGroup
	for g := range reds {
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			warm[g] = coll(ctx, reds[g], ts[g], hier.After(ss[g])).Wait(ctx)
		}()
	}
	wwg.Wait()
	for _, err := range warm {
		require.NoError(b, err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var enqueue time.Duration
	var calls int
	errs := make([]error, n)
	followers := make([]chan bool, n)
	for g := 1; g < n; g++ {
		followers[g] = make(chan bool, 1024)
	}
	step := func(g int, last bool, works *[]*hier.Work) error {
		start := time.Now()
		wk := coll(ctx, reds[g], ts[g], hier.After(ss[g]))
		if err := wk.StreamWait(ctx, ss[g]); err != nil {
			return err
		}
		if g == 0 {
			mu.Lock()
			enqueue += time.Since(start)
			calls++
			mu.Unlock()
		}
		*works = append(*works, wk)
		if len(*works) == batch || last {
			err := reftest.WaitAll(*works)
			*works = (*works)[:0]
			return err
		}
		return nil
	}
	for g := 1; g < n; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var works []*hier.Work
			for last := range followers[g] {
				if errs[g] == nil {
					errs[g] = step(g, last, &works)
				}
			}
		}()
	}
	// Rank 0, the rank timed, calls on the benchmark's own goroutine, as a
	// training loop calls from its own: no hand-off between goroutines
	// before each call, whose wake-up would be timed with the call.
	var works []*hier.Work
	lead := func(last bool) {
		for g := 1; g < n; g++ {
			followers[g] <- last
		}
		if errs[0] == nil {
			errs[0] = step(0, last, &works)
		}
	}
	b.SetBytes(4 * count)
	for b.Loop() {
		lead(false)
	}
	lead(true) // a last call that waits for everything
	for g := 1; g < n; g++ {
		close(followers[g])
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(b, err)
	}
	b.ReportMetric(float64(enqueue.Nanoseconds())/float64(calls), "enqueue-ns/op")
}
