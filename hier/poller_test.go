package hier_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/poll"
	"github.com/fairgo/fairgo/streams"
)

// gatedDevice is the null device whose events complete only once its gate
// is open, counting the queries of events recorded on a stream that the
// check communicator launched on apart from the others.
type gatedDevice struct {
	*nullDevice
	open                       atomic.Bool
	checkQueries, otherQueries atomic.Int64
}

type gatedStream struct{ check atomic.Bool }

func (*gatedStream) WaitEvent(streams.Event) error { return nil }

type gatedEvent struct {
	d     *gatedDevice
	check atomic.Bool // last recorded on the check's stream
}

func (e *gatedEvent) Record(s streams.Stream) error {
	gs, _ := s.(*gatedStream)
	e.check.Store(gs != nil && gs.check.Load())
	return nil
}

func (e *gatedEvent) Query() (bool, error) {
	if e.check.Load() {
		e.d.checkQueries.Add(1)
	} else {
		e.d.otherQueries.Add(1)
	}
	return e.d.open.Load(), nil
}

// Wait polls as the CUDA device's events do: naps from 10 µs, growing.
func (e *gatedEvent) Wait(ctx context.Context) error {
	var nap poll.Backoff
	for {
		if done, _ := e.Query(); done {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		nap.Wait()
	}
}

func (d *gatedDevice) NewStream() (streams.Stream, error) { return &gatedStream{}, nil }
func (d *gatedDevice) NewEvent() (streams.Event, error)   { return &gatedEvent{d: d}, nil }

// checkComm is the null check communicator that marks the streams it
// launches on.
type checkComm struct{ nullComm }

func (c checkComm) AllReduce(_, _ uintptr, _ int64, _ fairgo.DType, _ fairgo.Op, s streams.Stream) error {
	if gs, ok := s.(*gatedStream); ok {
		gs.check.Store(true)
	}
	return nil
}

// gatedRank is rank 0 of 2 × 1 on a gatedDevice.
func gatedRank() (backend.Rank, *gatedDevice) {
	rk := nullRank(2, 1)
	d := &gatedDevice{nullDevice: rk.Device.(*nullDevice)}
	rk.Device = d
	rk.Comms.Check = checkComm{rk.Comms.Check.(nullComm)}
	return rk, d
}

// While a call's data runs, only the watcher polls the device for it: the
// checker asks its check's event once and then waits for the data (each
// query is a driver call that contends with launches, the peers' too on a
// GPU under MPS), unless the data takes longer than the checker's wait.
func TestCheckPollsOnceTheDataIsDone(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		alone time.Duration
	}{
		{"waits-for-the-data", time.Hour},
		{"polls-alone-after-its-wait", time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rk, d := gatedRank()
			r, err := hier.NewReducer(ctx, rk, hier.WithCheckAlone(tc.alone), hier.WithInlineEnqueue(true),
				hier.WithFlatThreshold(1<<30), hier.WithFingerprintMax(0), hier.WithTimeout(time.Minute),
				hier.WithLogger(slog.New(slog.DiscardHandler)))
			require.NoError(t, err)
			defer func() { require.NoError(t, r.Close()) }()
			ptr, err := rk.Device.Alloc(64 << 10)
			require.NoError(t, err)
			w := r.AllReduce(ctx, fairgo.Tensor{Ptr: ptr, Bytes: 64 << 10, Count: 16 << 10, DType: fairgo.Float32}, fairgo.Sum)
			require.Eventually(t, func() bool { return d.checkQueries.Load() > 0 }, 10*time.Second, time.Millisecond,
				"the checker asks the check's event")
			time.Sleep(50 * time.Millisecond)
			require.False(t, w.IsCompleted())
			require.Greater(t, d.otherQueries.Load(), int64(1), "the watcher polls the data's event")
			if tc.alone == time.Hour {
				require.Equal(t, int64(1), d.checkQueries.Load(), "the check's event, polled while the data runs")
			} else {
				require.Greater(t, d.checkQueries.Load(), int64(1), "the check's event, polled alone after its wait")
			}
			d.open.Store(true)
			require.NoError(t, w.Wait(ctx))
			if tc.alone == time.Hour {
				require.Greater(t, d.checkQueries.Load(), int64(1), "the check's event, polled once the data is done")
			}
		})
	}
}

// TestWatcherNapsWhileNobodyWaits: a call nobody waits for is looked at
// by the watcher at its pace, not tens of times a millisecond (each look a
// driver query, each nap a wake-up of its thread: with many ranks on a
// host they kept the ranks waiting for a processor), and its Done channel
// still closes soon after its device work ends.
func TestWatcherNapsWhileNobodyWaits(t *testing.T) {
	ctx := context.Background()
	rk, d := gatedRank()
	r, err := hier.NewReducer(ctx, rk, hier.WithInlineEnqueue(true), hier.WithFlatThreshold(1<<30),
		hier.WithCheck(false), hier.WithTimeout(time.Minute), hier.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	ptr, err := rk.Device.Alloc(64 << 10)
	require.NoError(t, err)
	start := time.Now()
	w := r.AllReduce(ctx, fairgo.Tensor{Ptr: ptr, Bytes: 64 << 10, Count: 16 << 10, DType: fairgo.Float32}, fairgo.Sum)
	time.Sleep(50 * time.Millisecond)
	queries, running := d.otherQueries.Load(), time.Since(start)
	require.False(t, w.IsCompleted())
	// At its pace (naps from 0.1 ms up to 1 ms) the watcher looks about 70
	// times in 50 ms; polling as fast as it once did, hundreds of times.
	require.Less(t, queries, 40+2*running.Milliseconds(), "queries in %v of a call nobody waits for", running)
	opened := time.Now()
	d.open.Store(true)
	select {
	case <-w.Done():
		require.NoError(t, w.Err())
	case <-time.After(10 * time.Second):
		t.Fatal("the call nobody waited for did not complete")
	}
	require.Less(t, time.Since(opened), 20*time.Millisecond, "Done closed long after the device work ended")
}

// TestWatcherPollsForTheNextCall: a call made soon after the last one
// completed finds the watcher polling for it, not parked (a park puts a
// wake-up on the call's path); idle for longer, the watcher parks rather
// than poll for ever.
func TestWatcherPollsForTheNextCall(t *testing.T) {
	ctx := context.Background()
	rk, d := gatedRank()
	d.open.Store(true) // every call's device work is done at once
	r, err := hier.NewReducer(ctx, rk, hier.WithInlineEnqueue(true), hier.WithFlatThreshold(1<<30),
		hier.WithFingerprintMax(0), hier.WithTimeout(time.Minute), hier.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	ptr, err := rk.Device.Alloc(64 << 10)
	require.NoError(t, err)
	call := func() error {
		return r.AllReduce(ctx, fairgo.Tensor{Ptr: ptr, Bytes: 64 << 10, Count: 16 << 10, DType: fairgo.Float32},
			fairgo.Sum).Wait(ctx)
	}
	require.NoError(t, call())
	// Idle: parked at the start, and again once its poll for the next call
	// is over.
	require.Eventually(t, func() bool { return hier.WatcherParks(r) >= 2 }, time.Second, time.Millisecond)
	before := hier.WatcherParks(r)
	const calls = 100
	for range calls {
		require.NoError(t, call())
	}
	// A watcher parks only where its next call came late (a slow host):
	// far fewer times than the calls (without its poll, once each).
	require.Less(t, hier.WatcherParks(r)-before, uint64(calls/4))
}
