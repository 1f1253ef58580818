package sim

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/streams"
)

// gate enqueues an op on s that blocks until the returned func is called.
func gate(t testing.TB, s *Stream) func() {
	t.Helper()
	ch := make(chan struct{})
	require.NoError(t, s.enqueue(op{name: "gate", run: func(ctx context.Context) error {
		select {
		case <-ch:
		case <-ctx.Done():
		}
		return nil
	}}))
	return func() { close(ch) }
}

// mark enqueues an op on s that sets *flag.
func mark(t testing.TB, s *Stream, flag *atomic.Bool) {
	t.Helper()
	require.NoError(t, s.enqueue(op{name: "mark", run: func(context.Context) error { flag.Store(true); return nil }}))
}

func TestEventNeverRecordedIsComplete(t *testing.T) {
	c := newCluster(t, Config{Machines: 1, Devices: 1})
	d := c.Device(0)
	e := newEvent(t, d)
	done, err := e.Query()
	require.True(t, done)
	require.NoError(t, err)
	require.NoError(t, e.Wait(context.Background()))
	s := mkStream(t, d)
	require.NoError(t, s.WaitEvent(e))
	require.NoError(t, syncStream(t, s))
}

// Timing events read the time between the moments their streams reached
// them, the work between included, whenever the host asks; plain events
// and events not yet complete are refused.
func TestTimingEventsMeasureTheStream(t *testing.T) {
	c := newCluster(t, Config{Machines: 1, Devices: 1})
	d := c.Device(0)
	s := mkStream(t, d)
	start, err := d.NewTimingEvent()
	require.NoError(t, err)
	end, err := d.NewTimingEvent()
	require.NoError(t, err)
	_, err = d.Elapsed(start, end)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument, "never recorded")
	require.NoError(t, start.Record(s))
	// The stream reaches start on its own goroutine, which a loaded host
	// can run late: the held time below starts once it has.
	require.NoError(t, start.Wait(context.Background()))
	open := gate(t, s)
	require.NoError(t, end.Record(s))
	_, err = d.Elapsed(start, end)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument, "end not reached")
	const held = 20 * time.Millisecond
	time.Sleep(held)
	open()
	require.NoError(t, syncStream(t, s))
	time.Sleep(10 * held) // the host looks late: not counted
	got, err := d.Elapsed(start, end)
	require.NoError(t, err)
	require.GreaterOrEqual(t, got, held)
	require.Less(t, got, 8*held)
	plain := newEvent(t, d)
	require.NoError(t, plain.Record(s))
	require.NoError(t, syncStream(t, s))
	_, err = d.Elapsed(start, plain)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument, "a plain event")
}

func TestWaitCapturesRecordAtCallTime(t *testing.T) {
	c := newCluster(t, Config{Machines: 1, Devices: 1})
	d := c.Device(0)
	a, b := mkStream(t, d), mkStream(t, d)
	e := newEvent(t, d)

	open1 := gate(t, a)
	require.NoError(t, e.Record(a)) // capture 1: after gate 1
	require.NoError(t, b.WaitEvent(e))
	var ran atomic.Bool
	mark(t, b, &ran)
	open2 := gate(t, a)
	require.NoError(t, e.Record(a)) // capture 2: after gate 2; b's wait keeps capture 1

	time.Sleep(20 * time.Millisecond)
	require.False(t, ran.Load(), "b ran before the captured work completed")
	done, _ := e.Query()
	require.False(t, done)

	open1()
	require.Eventually(t, ran.Load, 5*time.Second, time.Millisecond, "b still waits although capture 1 completed")
	done, _ = e.Query()
	require.False(t, done, "the event shows its latest capture, still pending")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	require.True(t, e.Wait(ctx) == context.DeadlineExceeded, "Wait returns ctx.Err() unchanged")

	open2()
	require.NoError(t, e.Wait(context.Background()))
	done, err := e.Query()
	require.True(t, done)
	require.NoError(t, err)
}

func TestRecordValidation(t *testing.T) {
	c := newCluster(t, Config{Machines: 1, Devices: 2})
	d0, d1 := c.Device(0), c.Device(1)
	e := newEvent(t, d0)
	err := e.Record(mkStream(t, d1))
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	require.ErrorContains(t, err, "another device")
	require.ErrorIs(t, e.Record(foreignStream{}), fairgo.ErrInvalidArgument)
	require.ErrorIs(t, mkStream(t, d0).WaitEvent(foreignEvent{}), fairgo.ErrInvalidArgument)
	// Waiting on another device's event is allowed, as in CUDA.
	e1 := newEvent(t, d1)
	s1 := mkStream(t, d1)
	require.NoError(t, e1.Record(s1))
	s0 := mkStream(t, d0)
	require.NoError(t, s0.WaitEvent(e1))
	require.NoError(t, syncStream(t, s0))
}

type foreignStream struct{}

func (foreignStream) WaitEvent(streams.Event) error { return nil }

type foreignEvent struct{}

func (foreignEvent) Record(streams.Stream) error    { return nil }
func (foreignEvent) Query() (bool, error)           { return true, nil }
func (foreignEvent) Wait(ctx context.Context) error { return nil }

// orderingTrial: a producer stream writes a new value into buf, a consumer
// copies buf out. It returns whether the consumer saw the old value.
func orderingTrial(t *testing.T, c *Cluster, withWait bool) bool {
	d := c.Device(0)
	prod, cons := mkStream(t, d), mkStream(t, d)
	fresh := tensorOf(t, d, fairgo.Float32, 2)
	buf := tensorOf(t, d, fairgo.Float32, 1)
	out := tensorOf(t, d, fairgo.Float32, 0)
	e := newEvent(t, d)
	require.NoError(t, d.CopyAsync(buf.Ptr, fresh.Ptr, 4, prod))
	require.NoError(t, e.Record(prod))
	if withWait {
		require.NoError(t, cons.WaitEvent(e))
	}
	require.NoError(t, d.CopyAsync(out.Ptr, buf.Ptr, 4, cons))
	require.NoError(t, syncStream(t, cons))
	require.NoError(t, syncStream(t, prod))
	require.NoError(t, prod.Destroy())
	require.NoError(t, cons.Destroy())
	return values(t, d, out)[0] != 2
}

func TestMissingWaitIsVisibleWithJitter(t *testing.T) {
	c := newCluster(t, Config{Machines: 1, Devices: 1, Seed: 7, Jitter: 2 * time.Millisecond})
	violations := 0
	for range 30 {
		if orderingTrial(t, c, false) {
			violations++
		}
	}
	require.Positive(t, violations, "without the event wait the consumer should sometimes read stale data")
	for range 30 {
		require.False(t, orderingTrial(t, c, true), "with the event wait the consumer must never read stale data")
	}
}

// Random programs of work, records and waits over three streams: every
// work op after a wait starts after the captured work ended, and each
// stream runs its ops in order.
func TestEventOrderingProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		c, err := NewCluster(
			Config{Machines: 1, Devices: 1, Seed: rapid.Int64().Draw(rt, "seed"), Jitter: 200 * time.Microsecond},
		)
		require.NoError(rt, err)
		defer c.Close()
		d := c.Device(0)
		const nStreams, nEvents = 3, 2
		var ss [nStreams]*Stream
		for i := range ss {
			st, err := d.NewStream()
			require.NoError(rt, err)
			ss[i] = st.(*Stream)
		}
		var es [nEvents]*Event
		for i := range es {
			ev, err := d.NewEvent()
			require.NoError(rt, err)
			es[i] = ev.(*Event)
		}
		var clock atomic.Int64
		type span struct{ start, end atomic.Int64 }
		var works [nStreams][]*span
		type capture struct{ stream, works int } // event state: ops 0..works-1 of stream
		var recorded [nEvents]*capture
		type constraint struct {
			stream, after  int // work ops on stream with index >= after ...
			onStream, upTo int // ... start after work upTo-1 of onStream ends
		}
		var cons []constraint
		steps := rapid.IntRange(1, 40).Draw(rt, "steps")
		for range steps {
			s := rapid.IntRange(0, nStreams-1).Draw(rt, "stream")
			switch rapid.IntRange(0, 2).Draw(rt, "kind") {
			case 0:
				sp := &span{}
				works[s] = append(works[s], sp)
				require.NoError(rt, ss[s].enqueue(op{name: "work", run: func(context.Context) error {
					sp.start.Store(clock.Add(1))
					runtime.Gosched()
					sp.end.Store(clock.Add(1))
					return nil
				}}))
			case 1:
				e := rapid.IntRange(0, nEvents-1).Draw(rt, "event")
				require.NoError(rt, es[e].Record(ss[s]))
				recorded[e] = &capture{s, len(works[s])}
			case 2:
				e := rapid.IntRange(0, nEvents-1).Draw(rt, "event")
				require.NoError(rt, ss[s].WaitEvent(es[e]))
				if cp := recorded[e]; cp != nil && cp.works > 0 {
					cons = append(cons, constraint{s, len(works[s]), cp.stream, cp.works})
				}
			}
		}
		for _, s := range ss {
			require.NoError(rt, s.Synchronize(context.Background()))
		}
		for s, ws := range works {
			for i := 1; i < len(ws); i++ {
				require.Greater(rt, ws[i].start.Load(), ws[i-1].end.Load(), "stream %d ran out of order", s)
			}
		}
		for _, k := range cons {
			before := works[k.onStream][k.upTo-1].end.Load()
			for _, w := range works[k.stream][k.after:] {
				require.Greater(rt, w.start.Load(), before, "a wait on stream %d did not hold", k.stream)
			}
		}
	})
}

func TestStickyErrorsPropagate(t *testing.T) {
	c := newCluster(t, Config{Machines: 1, Devices: 1})
	d := c.Device(0)
	a, b := mkStream(t, d), mkStream(t, d)
	small := tensorOf(t, d, fairgo.Float32, 1, 2)
	other := tensorOf(t, d, fairgo.Float32, 0, 0)

	require.NoError(t, d.CopyAsync(other.Ptr, small.Ptr, 12, a)) // 4 bytes too many
	var ran atomic.Bool
	mark(t, a, &ran)
	e := newEvent(t, d)
	require.NoError(t, e.Record(a))
	require.NoError(t, b.WaitEvent(e))
	require.NoError(t, d.CopyAsync(other.Ptr, small.Ptr, 8, b))

	err := syncStream(t, a)
	var ill *IllegalAddressError
	require.ErrorAs(t, err, &ill)
	require.ErrorIs(t, err, ErrIllegalAddress)
	require.Contains(t, err.Error(), "sim device 0")
	require.Contains(t, err.Error(), "past the end")
	require.False(t, ran.Load(), "ops after a failure are skipped")
	requireSameErr(t, err, a.Err())

	requireSameErr(t, err, e.Wait(context.Background()), "an event recorded after the failure carries it")
	_, qerr := e.Query()
	requireSameErr(t, err, qerr)

	requireSameErr(t, err, syncStream(t, b), "a stream waiting on a failed event fails with the same error")
	require.Equal(t, []float64{0, 0}, values(t, d, other), "the failed stream's later copy did not run")

	// An event recorded before the failure stays clean.
	s := mkStream(t, d)
	e2 := newEvent(t, d)
	require.NoError(t, e2.Record(s))
	require.NoError(t, d.CopyAsync(other.Ptr, 0x10, 4, s))
	require.NoError(t, e2.Wait(context.Background()))
	require.ErrorIs(t, syncStream(t, s), ErrIllegalAddress)
}

func TestDeviceCloseFailsPendingWork(t *testing.T) {
	c, err := NewCluster(Config{Machines: 1, Devices: 1})
	require.NoError(t, err)
	d := c.Device(0)
	s := mkStream(t, d)
	_ = gate(t, s) // never opened
	e := newEvent(t, d)
	require.NoError(t, e.Record(s))
	require.NoError(t, d.Close())
	require.ErrorIs(t, e.Wait(context.Background()), fairgo.ErrClosed)
	require.ErrorIs(t, s.WaitEvent(e), fairgo.ErrClosed)
	_, err = d.NewStream()
	require.ErrorIs(t, err, fairgo.ErrClosed)
	require.NoError(t, d.Close())
	require.NoError(t, c.Close())
	require.NoError(t, c.Close())
	_, err = c.Reducers(context.Background())
	require.ErrorIs(t, err, fairgo.ErrClosed)
}

func TestStreamDestroyDrains(t *testing.T) {
	c := newCluster(t, Config{Machines: 1, Devices: 1})
	d := c.Device(0)
	s := mkStream(t, d)
	var ran atomic.Bool
	open := gate(t, s)
	mark(t, s, &ran)
	require.NoError(t, s.Destroy())
	require.ErrorIs(t, s.enqueue(op{name: "late"}), fairgo.ErrClosed)
	open()
	require.Eventually(t, ran.Load, 5*time.Second, time.Millisecond)
	require.NoError(t, d.Synchronize(context.Background()))
}
