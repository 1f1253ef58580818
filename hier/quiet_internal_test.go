package hier

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/streams"
)

// doneEvent is an event whose work is complete.
type doneEvent struct{}

func (doneEvent) Record(streams.Stream) error { return nil }
func (doneEvent) Query() (bool, error)        { return true, nil }
func (doneEvent) Wait(context.Context) error  { return nil }

// TestWatcherQuiet: when the watcher leaves the driver alone while it
// waits for a call. Times are from the watcher's epoch.
func TestWatcherQuiet(t *testing.T) {
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	for _, tc := range []struct {
		name         string
		lastEnqueued time.Duration // when an execute last ended
		alone        bool          // and the one before long before it
		turned, now  time.Duration // when the watcher turned to the call; now
		waiting      int32
		leave        uint64 // the last call a Wait left to the watcher
		noDevice     bool   // the call has no completion event (not helpable)
		refused      bool   // the call was refused at the call (not helpable)
		want         bool
	}{
		{name: "back to back", lastEnqueued: us(100), turned: us(100), now: us(110), want: true},
		{name: "after a burst", lastEnqueued: us(100), turned: us(100), now: us(100) + watchQuietGap, want: false},
		{name: "a call alone", lastEnqueued: us(100), alone: true, turned: us(100), now: us(110), want: false},
		{name: "enqueues without end", lastEnqueued: us(2000), turned: 0, now: us(2005), want: false},
		{name: "a Wait polls", lastEnqueued: 0, turned: 0, now: time.Second, waiting: 1, want: true},
		{name: "a Wait polls a later call", turned: 0, now: time.Second, waiting: 2, leave: 6, want: true},
		{name: "a Wait left the call to the watcher", now: time.Second, waiting: 1, leave: 7, want: false},
		{name: "nothing on the device", lastEnqueued: us(100), turned: us(100), now: us(101), waiting: 1, noDevice: true},
		{name: "refused", lastEnqueued: us(100), turned: us(100), now: us(101), waiting: 1, refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w watcher
			w.epoch = time.Now()
			w.lastEnqueued.Store(int64(tc.lastEnqueued))
			w.burst.Store(!tc.alone)
			w.waiting.Store(tc.waiting)
			w.leave.Store(tc.leave)
			p := pending{req: &request{seq: 7, work: &Work{}}, ev: doneEvent{}}
			if tc.noDevice {
				p.ev = nil
			}
			if tc.refused {
				p.req.rejected = errors.New("refused")
			}
			require.Equal(t, tc.want, w.quiet(p, w.epoch.Add(tc.turned), w.epoch.Add(tc.now)))
		})
	}
}

// TestEnqueuesMakeABurst: enqueues within watchQuietGap of each other make
// a burst, one alone does not.
func TestEnqueuesMakeABurst(t *testing.T) {
	var w watcher
	w.epoch = time.Now().Add(-time.Second)
	w.enqueueEnded()
	require.False(t, w.burst.Load(), "the first enqueue, a second after the epoch")
	burst := false // a pause of the test's thread may part two enqueues: one burst in ten tries
	for range 10 {
		w.enqueueEnded()
		burst = burst || w.burst.Load()
	}
	require.True(t, burst, "enqueues right after each other")
	time.Sleep(2 * watchQuietGap)
	w.enqueueEnded()
	require.False(t, w.burst.Load(), "one after a pause")
}

// TestWatchPace: the watcher naps an eighth of how long it has looked, at
// least watchNapMin and at most watchNapMax, and watchNapMin with a
// backlog of calls behind the one it watches.
func TestWatchPace(t *testing.T) {
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	for _, tc := range []struct {
		age     time.Duration
		backlog int
		want    time.Duration
	}{
		{0, 0, watchNapMin},
		{us(400), 0, watchNapMin},
		{us(800), 0, watchNapMin},
		{us(1600), 0, us(200)},
		{us(4000), 0, us(500)},
		{us(8000), 0, watchNapMax},
		{time.Minute, 0, watchNapMax},
		{time.Minute, watchBacklog - 1, watchNapMax},
		{time.Minute, watchBacklog, watchNapMin},
		{us(1600), 1000, watchNapMin},
	} {
		require.Equal(t, tc.want, watchPace(tc.age, tc.backlog), "age %v, backlog %d", tc.age, tc.backlog)
	}
}
