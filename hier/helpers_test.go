package hier_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/reftest"
	"github.com/fairgo/fairgo/sim"
)

// testDevice is what the tests need of a device: backend.Device and typed
// allocation, which sim and cuda devices both have.
type testDevice interface {
	backend.Device
	AllocTensor(count int64, dt fairgo.DType) (fairgo.Tensor, error)
}

// world is the ranks this process drives of a cluster (simulated, or
// GPUs), one Reducer each: every rank of the world, or (a GPU test under a
// launcher) one rank of a job of one rank per process. Data for the whole
// world is indexed by world rank; devs, reducers and results by local index.
type world struct {
	cluster   *sim.Cluster // nil on GPUs
	devs      []testDevice
	reducers  []*hier.Reducer
	m, d      int
	closeFn   func()
	allocs    [][]uintptr    // per local rank, freed by close
	worldSize int            // 0: len(reducers), every rank is here
	global    []int          // the world rank of each local rank; nil: the local index
	flat      []backend.Comm // GPU worlds: each local rank's world communicator, for flat baselines
}

func newWorld(t testing.TB, cfg sim.Config, opts ...hier.Option) *world {
	t.Helper()
	w, err := tryWorld(cfg, opts...)
	require.NoError(t, err)
	t.Cleanup(w.close)
	return w
}

func tryWorld(cfg sim.Config, opts ...hier.Option) (*world, error) {
	c, err := sim.NewCluster(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs, err := c.Reducers(ctx, opts...)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	devs := make([]testDevice, c.Size())
	for g := range devs {
		devs[g] = c.Device(g)
	}
	return &world{
		cluster:  c,
		devs:     devs,
		reducers: rs,
		m:        cfg.Machines,
		d:        cfg.Devices,
		closeFn:  func() { _ = c.Close() },
	}, nil
}

// close closes the world's Reducers together (CloseAll): one rank's Close
// can wait in NCCL's destroy of a world variant for its peers' (a GPU world
// closed one Reducer after another stalled in TestGPUNoLeaks).
func (w *world) close() {
	_ = hier.CloseAll(w.reducers)
	w.freeAllocs()
	w.closeFn()
}

// freeAllocs frees the tensors allocated through w.
func (w *world) freeAllocs() {
	for g, ptrs := range w.allocs {
		for _, p := range ptrs {
			_ = w.devs[g].Free(p)
		}
		w.allocs[g] = nil
	}
}

// alloc allocates a tensor on rank g's device that close frees.
func (w *world) alloc(g int, count int64, dt fairgo.DType) (fairgo.Tensor, error) {
	tn, err := w.devs[g].AllocTensor(count, dt)
	if err == nil && tn.Ptr != 0 {
		if w.allocs == nil {
			w.allocs = make([][]uintptr, len(w.devs))
		}
		w.allocs[g] = append(w.allocs[g], tn.Ptr)
	}
	return tn, err
}

// maxAmongSums allreduces 256 float32 on every rank of w: the last world
// rank takes the maximum, the others sum. It returns the Works in w's
// order.
func maxAmongSums(t testing.TB, w *world) []*hier.Work {
	t.Helper()
	works := make([]*hier.Work, len(w.reducers))
	for g, r := range w.reducers {
		ts, err := w.alloc(g, 256, fairgo.Float32)
		require.NoError(t, err)
		op := fairgo.Sum
		if w.rank(g) == w.size()-1 {
			op = fairgo.Max
		}
		works[g] = r.AllReduce(context.Background(), ts, op)
	}
	return works
}

// requireMismatchesWithin requires every one of works (in w's order) to
// fail with ErrMismatch, not a timeout, within d of start.
func requireMismatchesWithin(t testing.TB, w *world, works []*hier.Work, start time.Time, d time.Duration) {
	t.Helper()
	for g, wk := range works {
		err := wk.Wait(context.Background())
		require.ErrorIs(t, err, fairgo.ErrMismatch, "rank %d", w.rank(g))
		require.NotErrorIs(t, err, fairgo.ErrTimeout, "rank %d", w.rank(g))
		require.Less(t, time.Since(start), d, "rank %d: %v", w.rank(g), err)
		t.Logf("rank %d after %v: %v", w.rank(g), time.Since(start).Round(time.Millisecond), err)
	}
}

// size is the number of ranks in the world (here or elsewhere).
func (w *world) size() int {
	if w.worldSize > 0 {
		return w.worldSize
	}
	return len(w.reducers)
}

// rank is the world rank of local rank i.
func (w *world) rank(i int) int {
	if w.global == nil {
		return i
	}
	return w.global[i]
}

// upload allocates one tensor per local rank holding its world rank's
// entry of data (indexed by world rank; local ranks past its end get none).
func (w *world) upload(t testing.TB, dt fairgo.DType, data [][]byte) []fairgo.Tensor {
	t.Helper()
	out := make([]fairgo.Tensor, len(w.reducers))
	for g := range w.reducers {
		if w.rank(g) >= len(data) {
			continue
		}
		b := data[w.rank(g)]
		tn, err := w.alloc(g, int64(len(b)/dt.Size()), dt)
		require.NoError(t, err)
		if len(b) > 0 {
			require.NoError(t, w.devs[g].Upload(tn.Ptr, b))
		}
		out[g] = tn
	}
	return out
}

func (w *world) download(t testing.TB, ts []fairgo.Tensor) [][]byte {
	t.Helper()
	out := make([][]byte, len(ts))
	for g, tn := range ts {
		out[g] = make([]byte, tn.ByteLen())
		if tn.Count > 0 {
			require.NoError(t, w.devs[g].Download(out[g], tn.Ptr))
		}
	}
	return out
}

// allReduce runs one allreduce of data (every rank's) on the local ranks
// and returns their results, by local index.
func (w *world) allReduce(t testing.TB, dt fairgo.DType, op fairgo.Op, data [][]byte) ([][]byte, error) {
	ts := w.upload(t, dt, data)
	works := make([]*hier.Work, len(ts))
	for g, r := range w.reducers {
		works[g] = r.AllReduce(context.Background(), ts[g], op)
	}
	if err := reftest.WaitAll(works); err != nil {
		return nil, err
	}
	out := w.download(t, ts)
	if w.cluster == nil && launched() {
		w.allSame(t, "allreduce", out) // the ranks of other processes
	}
	return out, nil
}

// sumChecked runs one float32 sum of n random elements a rank, requires
// every result right, and frees the call's buffers.
func (w *world) sumChecked(t *testing.T, rng *rand.Rand, n int, msgAndArgs ...any) {
	t.Helper()
	in := reftest.RandomInputs(rng, fairgo.Float32, fairgo.Sum, w.size(), n)
	out, err := w.allReduce(t, fairgo.Float32, fairgo.Sum, in)
	require.NoError(t, err, msgAndArgs...)
	require.NoError(t, reftest.CheckResults(fairgo.Float32, reftest.ComputeReference(fairgo.Float32, fairgo.Sum, in), out), msgAndArgs...)
	w.freeAllocs()
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// callEveryRank makes call on every rank of w at once, each from a
// goroutine of its own, and returns their Works once every call returned.
func callEveryRank(w *world, call func(g int, r *hier.Reducer) *hier.Work) []*hier.Work {
	works := make([]*hier.Work, len(w.reducers))
	var wg sync.WaitGroup
	for g, r := range w.reducers {
		wg.Go(func() { works[g] = call(g, r) })
	}
	wg.Wait()
	return works
}

// allocEach allocates a tensor of count elements of dt for every local
// rank of w.
func allocEach(t testing.TB, w *world, count int64, dt fairgo.DType) []fairgo.Tensor {
	t.Helper()
	ts := make([]fairgo.Tensor, len(w.reducers))
	for g := range ts {
		var err error
		ts[g], err = w.alloc(g, count, dt)
		require.NoError(t, err)
	}
	return ts
}

// enginesIdle waits until every Reducer of w has executed the calls made
// on it: a refused call's Work fails at the call, before its engine runs
// its check and takes up what the call brings (the shared memory's check).
func enginesIdle(t testing.TB, w *world) {
	t.Helper()
	for g, r := range w.reducers {
		require.Eventually(t, func() bool { return hier.EngineIdle(r) }, 10*time.Second, time.Millisecond,
			"rank %d's engine still busy", w.rank(g))
	}
}
