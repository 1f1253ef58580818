package hier

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairgo/fairgo/internal/poll"
	"github.com/fairgo/fairgo/streams"
)

// waitNapMax is the longest nap between a Wait's polls. A Wait polls for
// as long as it waits rather than parks: it sees a call's end itself,
// napping in the kernel, and completes the call (Reducer.help). A parked
// waiter is woken from the watcher's thread, and the watcher from its own
// nap: two more wake-ups through the scheduler on the critical path of
// every call of a training loop, each of which a busy CPU can hold up by a
// scheduler's time slice. Naps are also bounded by a sixteenth of the wait
// so far (poll.Backoff), so a long wait costs a poll a millisecond and
// sees the end at most ~6% late.
const waitNapMax = time.Millisecond

// waitSpin is how long Wait first polls without napping: a call whose
// device work is done when Wait is called, or within a few µs, is
// completed without a nap, which would add up to its length to every call
// that the caller waits for.
const waitSpin = 20 * time.Microsecond

// Work is the future of one collective call. It completes when the device
// work of the call has finished (or failed); Wait, Done and Err observe that
// without blocking the device. Calls that fail validation return a Work that
// is already complete with the error.
type Work struct {
	done     signal        // the work has completed or failed; err is final
	enqueued signal        // the completion event is recorded, or the work is done
	spin     time.Duration // how long StreamWait polls enqueued before blocking
	// r completes calls in the watcher's place while Wait polls (help);
	// nil for a Work that failed at the call. helpable is set, before the
	// call reaches the watcher, where a Wait may complete it: a Wait for
	// another call (a refused one, or one without device work) leaves the
	// watcher alone, as its polls would only compete with it.
	r        *Reducer
	helpable atomic.Bool
	err      error // written once, before done is set

	mu    sync.Mutex     // guards event against recycling while StreamWait enqueues a wait on it
	event streams.Event  // recorded after the call's last stage; nil if nothing was enqueued or once recycled
	last  streams.Stream // the stream the event was recorded on
}

// signal is a one-shot flag that a Work's owner sets once and anyone
// reads without a lock, with a channel made only for whoever asks for one
// (Work.Done, Work.Enqueued, a StreamWait that must block). Most calls
// never need the channel: an inline call is enqueued before its caller
// holds the Work, and a Wait polls. What holds: once set, it stays set,
// and every channel handed out is closed; a write made before set is
// visible to whoever sees it set (the atomic's ordering).
type signal struct {
	set atomic.Bool
	mu  sync.Mutex
	ch  chan struct{} // made by wait; closed by setWith
}

// closedSignal is the channel of every signal set before anyone asked.
var closedSignal = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// isSet reports whether the signal is set.
func (s *signal) isSet() bool { return s.set.Load() }

// setWith runs before (when non-nil) and sets the signal, unless it was
// set already; it reports whether this call set it.
func (s *signal) setWith(before func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.set.Load() {
		return false
	}
	if before != nil {
		before()
	}
	s.set.Store(true)
	if s.ch != nil {
		close(s.ch)
	}
	return true
}

// wait returns a channel closed once the signal is set.
func (s *signal) wait() <-chan struct{} {
	if s.set.Load() {
		return closedSignal
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.set.Load() {
		return closedSignal
	}
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func failedWork(err error) *Work {
	w := &Work{}
	w.finish(err)
	return w
}

// finish completes the work once; later calls are ignored. Work that ends
// without reaching the device counts as enqueued too, so that StreamWait
// never waits for it; done is set first, so a StreamWait that sees
// enqueued reads the error (not the nil of work still running).
func (w *Work) finish(err error) {
	if w.done.setWith(func() { w.err = err }) {
		w.enqueued.setWith(nil)
	}
}

// markEnqueued publishes the completion event (nil when the call enqueued
// nothing on the device).
func (w *Work) markEnqueued(ev streams.Event, last streams.Stream) {
	w.mu.Lock()
	w.event, w.last = ev, last
	w.mu.Unlock()
	w.enqueued.setWith(nil)
}

// releaseEvent detaches the completion event so that it can be reused; the
// work is done by then, so later StreamWaits need no wait.
func (w *Work) releaseEvent() streams.Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	ev := w.event
	w.event = nil
	return ev
}

// Done is closed when the work has completed or failed. A Wait sees the
// end of its call at once; with nobody waiting, the Reducer's watcher
// closes Done (and IsCompleted turns true) up to an eighth of the call's
// time, and at most about a millisecond, after its device work ended: it
// looks at a call nobody waits for at that pace, since every look is a
// driver query and every nap a wake-up that ranks sharing a host pay for.
func (w *Work) Done() <-chan struct{} { return w.done.wait() }

// Enqueued is closed once the call's device work has been enqueued, or the
// work has completed without reaching the device: from then on StreamWait
// does not block.
func (w *Work) Enqueued() <-chan struct{} { return w.enqueued.wait() }

// Err returns the work's error once it is done, and nil before.
func (w *Work) Err() error {
	if w.done.isSet() {
		return w.err
	}
	return nil
}

// IsCompleted reports whether the work is done (successfully or not).
func (w *Work) IsCompleted() bool { return w.done.isSet() }

// Wait blocks until the work is done and returns its error, or returns
// ctx.Err() unchanged if ctx ends first. The work itself goes on. It
// polls the call's device work (spinning for 20 µs, then napping in the
// kernel) rather than parks, and completes the call itself once it ends,
// so that a call's end reaches the caller without a thread wake-up.
func (w *Work) Wait(ctx context.Context) error {
	if ctx == nil {
		return errNilContext
	}
	nap := poll.Backoff{Max: waitNapMax}
	polling := false // counted in the watcher's waiting: it leaves the driver to this Wait (watcher.quiet)
	defer func() {
		if polling {
			w.r.watch.waiting.Add(-1)
		}
	}()
	for start := time.Now(); ; {
		if w.done.isSet() {
			return w.err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if w.r != nil {
			w.r.relay.Load().tryFlush() // across machines, the images posted so far go out
		}
		if w.helpable.Load() {
			if !polling {
				polling = true
				w.r.watch.waiting.Add(1)
			}
			if w.r.help(w) {
				return w.err
			}
		}
		if time.Since(start) < waitSpin {
			runtime.Gosched()
		} else {
			nap.Wait()
		}
	}
}

// StreamWait makes work enqueued on s after this call wait for the
// collective's completion on the device, without blocking the host on the
// device (it waits only until the engine has enqueued the call, which it does
// in call order). A stream of the same device as the Reducer's is expected.
func (w *Work) StreamWait(ctx context.Context, s streams.Stream) error {
	if ctx == nil {
		return errNilContext
	}
	if !w.enqueued.isSet() { // else the common case (an inline call, an engine ahead): no clock read
		for deadline := time.Now().Add(w.spin); !w.enqueued.isSet() && time.Now().Before(deadline); {
			runtime.Gosched()
		}
		select {
		case <-w.enqueued.wait():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.event == nil { // nothing enqueued, or already complete: the result is final
		return w.Err()
	}
	if s == w.last { // enqueued on s itself (an inline call): already in order
		return nil
	}
	return s.WaitEvent(w.event)
}
