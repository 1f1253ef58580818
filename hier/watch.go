package hier

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/internal/poll"
	"github.com/fairgo/fairgo/streams"
)

// pending is a call the watcher waits for: its completion event (nil when
// it put nothing on the device) and its check (req.check, or the shared
// memory's when req.posted; neither without peers).
type pending struct {
	req *request
	ev  streams.Event
}

const (
	watchPoll  = 50 * time.Millisecond // how often a wait checks communicator errors and deadlines
	abortGrace = 2 * time.Second       // how long to wait for device work after an abort before reporting it
	// watchIdlePoll is how long the watcher polls for the next call, once
	// it has completed one, before it parks: a training loop's next call
	// comes sooner, and the watcher then starts watching it without a
	// wake-up (a futex, a hand-off through the scheduler) that a call of
	// a few tens of µs would wait for.
	watchIdlePoll = time.Millisecond
)

// watcher is the goroutine that completes Works: the calls the engine
// hands it, and how far this rank got.
type watcher struct {
	ch        chan pending
	done      chan struct{} // closed when the watcher has exited
	enqueued  atomic.Uint64 // the last call whose device work was enqueued
	completed atomic.Uint64 // the last call whose Work completed
	// poll paces a wait for a check whose data is done; made at the first
	// such wait and reused, on the watcher goroutine only.
	poll *time.Timer
}

// pollTimer is the watcher's poll timer, started for one watchPoll.
func (w *watcher) pollTimer() *time.Timer {
	if w.poll == nil {
		w.poll = time.NewTimer(watchPoll)
	} else {
		w.poll.Reset(watchPoll)
	}
	return w.poll
}

// watchCalls completes Works in call order as their device work and their
// checks end, and runs the watchdog. A call's clock starts when the
// watcher turns to it, that is once every earlier call has completed: time
// spent queued behind healthy work is not held against it.
func (r *Reducer) watchCalls() {
	defer close(r.watch.done)
	tick := time.NewTicker(watchPoll)
	defer tick.Stop()
	var (
		lastDone time.Time    // when the last call completed; zero: none yet
		nap      poll.Backoff // paces the polls for the next call meanwhile
	)
	for {
		var (
			p  pending
			ok bool
		)
		select {
		case p, ok = <-r.watch.ch:
		case <-tick.C:
			r.checkEnqueueStall()
			continue
		default:
			if !lastDone.IsZero() && time.Since(lastDone) < watchIdlePoll {
				nap.Wait()
				continue
			}
			r.hooks.watcherParks.Add(1)
			select {
			case p, ok = <-r.watch.ch:
			case <-tick.C:
				r.checkEnqueueStall()
				continue
			}
		}
		if !ok {
			return
		}
		r.complete(p)
		lastDone, nap = time.Now(), poll.Backoff{}
	}
}

// complete waits for one pending call and finishes its Work.
func (r *Reducer) complete(p pending) {
	err := r.await(p, time.Now())
	if fc := p.req.fp; fc != nil {
		p.req.fp = nil
		fc.free()
	}
	if err != nil {
		err = fmt.Errorf("hier: %v: %w", p.req, err)
	}
	ev := p.req.work.releaseEvent()
	if ev == nil {
		ev = p.ev // a refused call's fingerprinted check, which its Work never carried
	}
	r.flight.remove(p.req.work)
	p.req.work.finish(err)
	r.watch.completed.Store(p.req.seq)
	if err == nil || ev == nil {
		r.events.put(ev)
	}
	r.events.put(p.req.after)
}

// progressed tells the enqueue watchdog that the engine, busy with one
// call for long (a calibration), is making progress.
func (r *Reducer) progressed() {
	r.calls.mu.Lock()
	r.calls.busySince = time.Now()
	r.calls.mu.Unlock()
}

// checkEnqueueStall is the watchdog of enqueueing itself: NCCL can block
// the thread that enqueues (its queue to the device full of work that
// waits for a dead peer), which leaves no pending call to time out.
func (r *Reducer) checkEnqueueStall() {
	if r.cfg.timeout <= 0 {
		return
	}
	c := &r.calls
	c.mu.Lock()
	busy, since, seq := c.busy, c.busySince, c.busySeq
	c.mu.Unlock()
	if busy && r.brokenCause() == nil {
		if waited := time.Since(since); waited > r.cfg.timeout {
			r.timedOutOn(fmt.Sprintf("enqueueing call %d", seq), waited)
		}
	}
}

// await waits for one call's completion event and check, watching the
// communicators' asynchronous errors and the watchdog deadline meanwhile.
func (r *Reducer) await(p pending, start time.Time) error {
	var (
		abortedAt time.Time
		dataDone  = p.ev == nil
		dataErr   error
		checkDone = p.req.check == nil && !p.req.posted
		checkErr  error
		checkC    <-chan struct{}
		timedOut  bool
	)
	if p.req.check != nil {
		checkC = p.req.check.done
	}
	if dataDone {
		r.checker.dataDone(p.req.seq)
	}
	for {
		if !dataDone {
			// A call the watcher reaches late is often complete already:
			// asked first, it costs no timer.
			if dataDone, dataErr = p.ev.Query(); !dataDone {
				ctx, cancel := context.WithTimeout(context.Background(), watchPoll)
				_ = p.ev.Wait(ctx) // returns the work's own error once complete: ask Query
				cancel()
				dataDone, dataErr = p.ev.Query()
			}
			if dataDone { // the checker polls the call's check from now on
				r.checker.dataDone(p.req.seq)
			}
		}
		if !checkDone && p.req.posted {
			// Posted before the data: once the data is done, the peers'
			// images are there, or about to be.
			wait := time.Duration(0)
			if dataDone {
				wait = watchPoll
			}
			checkDone, checkErr = r.awaitHostCheck(p.req, wait)
		} else if !checkDone {
			if dataDone { // only the check is left: wait for it a poll at a time
				poll := r.watch.pollTimer()
				select {
				case <-checkC:
					checkDone, checkErr = true, p.req.check.err
				case <-poll.C:
				}
				poll.Stop()
			} else {
				select {
				case <-checkC:
					checkDone, checkErr = true, p.req.check.err
				default:
				}
			}
		}
		if checkDone && errors.Is(checkErr, fairgo.ErrMismatch) {
			return checkErr // whatever the data did, the call did not match
		}
		if dataDone && checkDone {
			cause := r.brokenCause()
			switch {
			case dataErr != nil && cause != nil && !errors.Is(dataErr, cause):
				return fmt.Errorf("%w (%w)", cause, dataErr)
			case dataErr != nil:
				return dataErr
			case checkErr == nil && cause != nil:
				// An abort ends the device work early, and its event then
				// completes: the data may be partial.
				return cause
			}
			if fc := p.req.fp; fc != nil { // no separate check: the data carried it
				if err := fc.decide(p.req); err != nil {
					r.explainRefusal(p.req, err)
					r.abort(err)
					return err
				}
			}
			return checkErr
		}
		now := time.Now()
		if cause := r.brokenCause(); cause != nil {
			if abortedAt.IsZero() {
				abortedAt = now
			} else if now.Sub(abortedAt) > abortGrace {
				return fmt.Errorf("%w; the device work did not end within %v of the abort", cause, abortGrace)
			}
			continue
		}
		if c, cerr := r.commFailure(); cerr != nil {
			r.abort(fmt.Errorf("%w: communicator %s failed: %w", fairgo.ErrAborted, c.Name(), cerr))
			continue
		}
		if r.cfg.timeout > 0 && now.Sub(start) > r.cfg.timeout && !timedOut {
			timedOut = true
			r.timedOut(p.req, now.Sub(start))
		}
	}
}

// commFailure returns a failed communicator and its error, preferring a root
// cause (a mismatch, a stall, a device error) to an abort that a peer made
// in reaction to it, so that the Work reports what went wrong first.
func (r *Reducer) commFailure() (backend.Comm, error) {
	var first backend.Comm
	var firstErr error
	for _, c := range r.commList() {
		cerr := c.Err()
		if cerr == nil {
			continue
		}
		if !errors.Is(cerr, fairgo.ErrAborted) {
			return c, cerr
		}
		if first == nil {
			first, firstErr = c, cerr
		}
	}
	return first, firstErr
}
