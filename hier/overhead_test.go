package hier_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/streams"
)

// A null device and null communicators: every operation returns at once
// and every event is complete, so that what a call costs on them is the
// engine's own host time (the queue, the router, the executor's
// bookkeeping, the events, the hand-offs to the watcher and the checker),
// apart from any device or NCCL: T6's host time without the driver's. They
// count the driver calls a real device would make (deviceCalls), each of
// which costs a GPU host about a microsecond or more.

// deviceCalls counts what the engine asks of a device: collective and
// copy launches, event records, and stream waits on events.
type deviceCalls struct {
	launches, records, waits atomic.Int64
}

// total is every call counted so far (0 when not counted).
func (c *deviceCalls) total() int64 {
	if c == nil {
		return 0
	}
	return c.launches.Load() + c.records.Load() + c.waits.Load()
}

type nullStream struct{ calls *deviceCalls }

func (s nullStream) WaitEvent(streams.Event) error {
	if s.calls != nil {
		s.calls.waits.Add(1)
	}
	return nil
}

type nullEvent struct{ calls *deviceCalls }

func (e nullEvent) Record(streams.Stream) error {
	if e.calls != nil {
		e.calls.records.Add(1)
	}
	return nil
}
func (nullEvent) Query() (bool, error)                   { return true, nil }
func (nullEvent) Wait(context.Context) error             { return nil }
func (d *nullDevice) NewStream() (streams.Stream, error) { return nullStream{d.calls}, nil }
func (d *nullDevice) NewEvent() (streams.Event, error)   { return nullEvent{d.calls}, nil }

type nullDevice struct {
	mu    sync.Mutex
	next  uintptr
	calls *deviceCalls
}

// launch counts one launch.
func (d *nullDevice) launch() error {
	if d.calls != nil {
		d.calls.launches.Add(1)
	}
	return nil
}

func (d *nullDevice) Alloc(bytes int64) (uintptr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next += 1 << 40 // disjoint ranges, never dereferenced
	return d.next, nil
}

func (*nullDevice) Free(uintptr) error                                        { return nil }
func (*nullDevice) Upload(uintptr, []byte) error                              { return nil }
func (*nullDevice) Download([]byte, uintptr) error                            { return nil }
func (*nullDevice) AllocHost(n int) ([]byte, error)                           { return make([]byte, n), nil }
func (*nullDevice) FreeHost([]byte) error                                     { return nil }
func (*nullDevice) CheckRange(uintptr, int64) error                           { return nil }
func (*nullDevice) Group(fn func() error) error                               { return fn() }
func (*nullDevice) Close() error                                              { return nil }
func (d *nullDevice) CopyAsync(_, _ uintptr, _ int64, _ streams.Stream) error { return d.launch() }
func (d *nullDevice) CopyFromHostAsync(uintptr, []byte, streams.Stream) error { return d.launch() }
func (d *nullDevice) CopyToHostAsync([]byte, uintptr, streams.Stream) error   { return d.launch() }

func (d *nullDevice) Copy2DAsync(uintptr, int64, uintptr, int64, int64, int64, streams.Stream) error {
	return d.launch()
}

func (d *nullDevice) ReduceAsync(_, _ uintptr, _ int, _, _ int64, _ fairgo.DType, _ fairgo.Op, _ int,
	_ streams.Stream) error {
	return d.launch()
}

type nullComm struct {
	size, rank int
	name       string
	calls      *deviceCalls
}

// launch counts one collective's launch.
func (c nullComm) launch() error {
	if c.calls != nil {
		c.calls.launches.Add(1)
	}
	return nil
}

func (c nullComm) Size() int    { return c.size }
func (c nullComm) Rank() int    { return c.rank }
func (c nullComm) Name() string { return c.name }
func (nullComm) Err() error     { return nil }
func (nullComm) Abort() error   { return nil }
func (nullComm) Close() error   { return nil }

func (c nullComm) AllReduce(_, _ uintptr, _ int64, _ fairgo.DType, _ fairgo.Op, _ streams.Stream) error {
	return c.launch()
}

func (c nullComm) ReduceScatter(_, _ uintptr, _ int64, _ fairgo.DType, _ fairgo.Op, _ streams.Stream) error {
	return c.launch()
}

func (c nullComm) AllGather(_, _ uintptr, _ int64, _ fairgo.DType, _ streams.Stream) error {
	return c.launch()
}

func (c nullComm) Broadcast(_, _ uintptr, _ int64, _ fairgo.DType, _ int, _ streams.Stream) error {
	return c.launch()
}

func (c nullComm) AllToAllv(uintptr, []int64, []int64, uintptr, []int64, []int64, fairgo.DType,
	streams.Stream) error {
	return c.launch()
}

// nullRank is rank 0 of an M × D grid on the null device.
func nullRank(m, d int) backend.Rank { return countingNullRank(m, d, nil) }

// countingNullRank is nullRank whose device and communicators count their
// calls in calls (nil: not counted).
func countingNullRank(m, d int, calls *deviceCalls) backend.Rank {
	g := fairgo.Grid{Machines: m, Devices: d}
	comm := func(name string, size, rank int) backend.Comm {
		if size == 1 {
			return nil
		}
		return nullComm{size: size, rank: rank, name: name, calls: calls}
	}
	return backend.Rank{Grid: g, Device: &nullDevice{calls: calls}, Comms: backend.Comms{
		World:              nullComm{size: g.Size(), name: "world", calls: calls},
		Check:              comm("check", g.Size(), 0),
		IntraReduceScatter: comm("intra-rs", d, 0),
		IntraAllGather:     comm("intra-ag", d, 0),
		RailCollect:        comm("rail-collect", m, 0),
		RailDiffuse:        comm("rail-diffuse", m, 0),
	}}
}

// BenchmarkEngineOverhead is the engine's own host time per call: an
// AllReduce of 64 KiB of float32 and its StreamWait on the null device,
// batch calls back to back, then a Wait on the last. "batch=1" is one call
// at a time; "idle=1ms" leaves the engine 1 ms between calls, long enough
// to park (a GPU call of a millisecond made one at a time does that), so
// that enqueue-ns/op holds the engine's wake-up. With the check, the
// checker and its batches are included; without it, only the data path.
// enqueue-ns/op is the call and its StreamWait (T6); ns/op also holds the
// waits.
func BenchmarkEngineOverhead(b *testing.B) {
	for _, tc := range []struct {
		name string
		m, d int
		opts []hier.Option
	}{
		{"1x2/flat/inline", 1, 2, []hier.Option{hier.WithInlineEnqueue(true)}},
		{"1x2/flat/engine", 1, 2, nil},
		{"2x2/rail-allreduce", 2, 2, []hier.Option{hier.WithFlatThreshold(hier.FlatNever),
			hier.WithAlgorithm(hier.RailAllReduce)}},
		{"2x2/rail-rsag", 2, 2, []hier.Option{hier.WithFlatThreshold(hier.FlatNever),
			hier.WithAlgorithm(hier.RailRSAG)}},
	} {
		for _, check := range []bool{true, false} {
			for _, p := range []struct {
				batch int
				idle  time.Duration
			}{{1, 0}, {32, 0}, {1, time.Millisecond}} {
				name := fmt.Sprintf("%s/check=%v/batch=%d", tc.name, check, p.batch)
				if p.idle > 0 {
					name += "/idle=" + p.idle.String()
				}
				b.Run(name, func(b *testing.B) {
					// The null communicators reduce nothing, so that a
					// fingerprint never matches: with the check, it is the
					// separate one.
					opts := append([]hier.Option{hier.WithCheck(check), hier.WithFingerprintMax(0),
						hier.WithLogger(slog.New(slog.DiscardHandler))}, tc.opts...)
					benchNullEnqueue(b, countingNullRank(tc.m, tc.d, &deviceCalls{}), opts, p.batch, p.idle)
				})
			}
		}
	}
}

func benchNullEnqueue(b *testing.B, rk backend.Rank, opts []hier.Option, batch int, idle time.Duration) {
	ctx := context.Background()
	r, err := hier.NewReducer(ctx, rk, opts...)
	require.NoError(b, err)
	b.Cleanup(func() { _ = r.Close() })
	ptr, err := rk.Device.Alloc(64 << 10)
	require.NoError(b, err)
	t := fairgo.Tensor{Ptr: ptr, Bytes: 64 << 10, Count: 16 << 10, DType: fairgo.Float32}
	s := nullStream{}
	var enqueue time.Duration
	var driver *deviceCalls
	if d, ok := rk.Device.(*nullDevice); ok {
		driver, s = d.calls, nullStream{d.calls}
	}
	driver0 := driver.total()
	calls := 0
	b.SetBytes(t.Bytes)
	for b.Loop() {
		for range batch {
			for wait := time.Now(); time.Since(wait) < idle; { // the last call runs on the GPU
				runtime.Gosched()
			}
			start := time.Now()
			w := r.AllReduce(ctx, t, fairgo.Sum, hier.After(s))
			if err := w.StreamWait(ctx, s); err != nil {
				b.Fatal(err)
			}
			enqueue += time.Since(start)
			calls++
			if calls%batch == 0 {
				if err := w.Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.ReportMetric(float64(enqueue.Nanoseconds())/float64(calls), "enqueue-ns/op")
	if driver != nil {
		b.ReportMetric(float64(driver.total()-driver0)/float64(calls), "driver-calls/op")
	}
}

// The null device runs every kind of call to completion: the benchmark's
// testbed works, and what it measures is a successful call.
func TestNullDeviceCalls(t *testing.T) {
	ctx := context.Background()
	for _, g := range [][2]int{{1, 2}, {2, 2}, {2, 1}} {
		rk := nullRank(g[0], g[1])
		r, err := hier.NewReducer(ctx, rk, hier.WithFlatThreshold(hier.FlatNever), hier.WithTimeout(10*time.Second),
			hier.WithLogger(slog.New(slog.DiscardHandler)))
		require.NoError(t, err)
		ptr, err := rk.Device.Alloc(1 << 20)
		require.NoError(t, err)
		w := int64(g[0] * g[1])
		buf := fairgo.Tensor{Ptr: ptr, Bytes: 1 << 20, Count: 1 << 18, DType: fairgo.Float32}
		part := fairgo.Tensor{Ptr: ptr, Bytes: (1 << 20) / w, Count: (1 << 18) / w, DType: fairgo.Float32}
		works := []*hier.Work{
			r.AllReduce(ctx, buf, fairgo.Avg),
			r.ReduceScatter(ctx, buf, part, fairgo.Sum),
			r.AllGather(ctx, part, buf),
			r.Broadcast(ctx, buf, 0),
			r.AllToAll(ctx, buf, buf),
		}
		for i, wk := range works {
			require.NoError(t, wk.Wait(ctx), "grid %v, call %d", g, i)
		}
		require.NoError(t, r.Close())
	}
}

// Each route's driver calls per call, on the null device after a warm-up,
// with the check off (the check's own calls differ by device: CUDA reduces
// mapped host memory in place, the null device copies): each costs a GPU
// host a microsecond or more, so a route that gains one shows here first.
func TestDriverCallsPerCall(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		m, d                     int
		opts                     []hier.Option
		launches, records, waits int64
	}{
		// Inline on the caller's stream: the allreduce and the completion
		// event.
		{"1x2/flat/inline", 1, 2, []hier.Option{hier.WithInlineEnqueue(true)}, 1, 1, 0},
		// Through the engine: its first stage waits for the caller's
		// After event, recorded at the call.
		{"1x2/flat/engine", 1, 2, nil, 1, 2, 1},
		{"2x1/rail-a2a", 2, 1, []hier.Option{hier.WithFlatThreshold(hier.FlatNever),
			hier.WithAlgorithm(hier.RailAllToAll)}, 3, 3, 2},
		{"2x1/rail-rsag", 2, 1, []hier.Option{hier.WithFlatThreshold(hier.FlatNever),
			hier.WithAlgorithm(hier.RailRSAG)}, 2, 2, 1},
		{"2x2/rail-allreduce", 2, 2, []hier.Option{hier.WithFlatThreshold(hier.FlatNever),
			hier.WithAlgorithm(hier.RailAllReduce)}, 3, 2, 1},
		{"2x2/rail-rsag", 2, 2, []hier.Option{hier.WithFlatThreshold(hier.FlatNever),
			hier.WithAlgorithm(hier.RailRSAG)}, 4, 2, 1},
		{"2x2/rail-a2a", 2, 2, []hier.Option{hier.WithFlatThreshold(hier.FlatNever),
			hier.WithAlgorithm(hier.RailAllToAll)}, 5, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			calls := &deviceCalls{}
			rk := countingNullRank(tc.m, tc.d, calls)
			r, err := hier.NewReducer(ctx, rk, append([]hier.Option{hier.WithCheck(false),
				hier.WithTimeout(10 * time.Second), hier.WithLogger(slog.New(slog.DiscardHandler))}, tc.opts...)...)
			require.NoError(t, err)
			defer func() { require.NoError(t, r.Close()) }()
			ptr, err := rk.Device.Alloc(64 << 10)
			require.NoError(t, err)
			tn := fairgo.Tensor{Ptr: ptr, Bytes: 64 << 10, Count: 16 << 10, DType: fairgo.Float32}
			s := nullStream{calls}
			require.NoError(t, r.AllReduce(ctx, tn, fairgo.Sum, hier.After(s)).Wait(ctx)) // settles the route
			l0, r0, w0 := calls.launches.Load(), calls.records.Load(), calls.waits.Load()
			const n = 20
			for range n {
				w := r.AllReduce(ctx, tn, fairgo.Sum, hier.After(s))
				require.NoError(t, w.StreamWait(ctx, s))
				require.NoError(t, w.Wait(ctx))
			}
			require.Equal(t, []int64{tc.launches, tc.records, tc.waits},
				[]int64{(calls.launches.Load() - l0) / n, (calls.records.Load() - r0) / n, (calls.waits.Load() - w0) / n},
				"launches, event records, stream waits per call")
			require.Zero(t, (calls.total()-l0-r0-w0)%n, "every call alike")
		})
	}
}

// A flat call enqueued inline allocates its request, its Work (with two
// channels) and little else: the router's decision, the watcher's wait and
// its timer allocate nothing per call (bench/NOTES.md item 64 counted 15
// before).
func TestInlineCallAllocations(t *testing.T) {
	ctx := context.Background()
	rk := nullRank(1, 2)
	r, err := hier.NewReducer(ctx, rk, hier.WithCheck(false), hier.WithInlineEnqueue(true),
		hier.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	ptr, err := rk.Device.Alloc(64 << 10)
	require.NoError(t, err)
	tn := fairgo.Tensor{Ptr: ptr, Bytes: 64 << 10, Count: 16 << 10, DType: fairgo.Float32}
	s := nullStream{}
	call := func() {
		w := r.AllReduce(ctx, tn, fairgo.Sum, hier.After(s))
		if err := w.StreamWait(ctx, s); err != nil {
			t.Fatal(err)
		}
		if err := w.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	call() // settles the route
	require.LessOrEqual(t, testing.AllocsPerRun(200, call), 6.0, "allocations per call")
}
