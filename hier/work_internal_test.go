package hier

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStreamWaitSeesTheFailure: a Work that fails without reaching the
// device (a pointer CheckRange refuses) makes StreamWait return its error,
// whenever StreamWait wakes: a nil there would order the caller's stream
// after nothing and report success.
func TestStreamWaitSeesTheFailure(t *testing.T) {
	bad := errors.New("refused")
	for range 20000 {
		w := &Work{}
		got := make(chan error, 1)
		go func() { got <- w.StreamWait(context.Background(), nil) }()
		w.finish(bad)
		require.ErrorIs(t, <-got, bad)
	}
}

// TestWaitInEveryPhase: Wait returns the Work's error, or ctx's, whether
// the Work ends (or ctx does) while Wait spins, while it naps, or once its
// naps have grown to their longest.
func TestWaitInEveryPhase(t *testing.T) {
	bad := errors.New("failed")
	for _, after := range []time.Duration{0, waitSpin / 2, waitSpin * 10, 20 * waitNapMax} {
		t.Run(fmt.Sprint("work ends after ", after), func(t *testing.T) {
			w := &Work{}
			time.AfterFunc(after, func() { w.finish(bad) })
			require.ErrorIs(t, w.Wait(context.Background()), bad)
		})
		t.Run(fmt.Sprint("ctx ends after ", after), func(t *testing.T) {
			w := &Work{}
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(after, cancel)
			require.ErrorIs(t, w.Wait(ctx), context.Canceled)
			require.False(t, w.IsCompleted())
		})
	}
}

// TestSignalReachesEveryWaiter: a signal set once closes every channel
// handed out before it was set, hands out closed ones after, runs its
// before function once, and whoever sees it set (by the channel or by
// isSet) sees what before wrote. A channel left open would hang a caller
// of Done; a write seen late would return the nil of a failed Work.
func TestSignalReachesEveryWaiter(t *testing.T) {
	for range 2000 {
		var s signal
		var value, runs int
		seen := make(chan int, 8)
		for range 4 {
			go func() { <-s.wait(); seen <- value }()
			go func() {
				for !s.isSet() {
				}
				seen <- value
			}()
		}
		require.True(t, s.setWith(func() { value, runs = 7, runs+1 }))
		require.False(t, s.setWith(func() { value, runs = 8, runs+1 }))
		for range 8 {
			require.Equal(t, 7, <-seen)
		}
		require.Equal(t, 1, runs)
		select {
		case <-s.wait():
		default:
			t.Fatal("a channel asked for after set is open")
		}
	}
}

// TestWorkChannels: Done closes when the Work finishes, not when it is
// enqueued; Enqueued closes at either; a channel asked for before and
// after each step is the same signal's.
func TestWorkChannels(t *testing.T) {
	w := &Work{}
	done, enq := w.Done(), w.Enqueued()
	open := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return false
		default:
			return true
		}
	}
	require.True(t, open(done))
	require.True(t, open(enq))
	w.markEnqueued(nil, nil)
	require.False(t, open(enq))
	require.False(t, open(w.Enqueued()))
	require.True(t, open(done))
	require.True(t, open(w.Done()))
	require.False(t, w.IsCompleted())
	require.NoError(t, w.Err())
	bad := errors.New("failed")
	w.finish(bad)
	w.finish(nil) // ignored
	require.False(t, open(done))
	require.True(t, w.IsCompleted())
	require.ErrorIs(t, w.Err(), bad)

	f := &Work{}
	enq = f.Enqueued()
	f.finish(bad) // a Work that fails before its device work counts as enqueued
	require.False(t, open(enq))
	require.False(t, open(f.Done()))
}
