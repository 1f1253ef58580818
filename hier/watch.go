package hier

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/streams"
)

// pending is a call the watcher waits for: its completion event (nil when
// it put nothing on the device) and its check (req.check, nil without
// peers).
type pending struct {
	req *request
	ev  streams.Event
}

const (
	watchPoll  = 50 * time.Millisecond // how often a wait checks communicator errors and deadlines
	abortGrace = 2 * time.Second       // how long to wait for device work after an abort before reporting it
)

// watch completes Works in call order as their device work and their
// checks end, and runs the watchdog. A call's clock starts when the
// watcher turns to it, that is once every earlier call has completed: time
// spent queued behind healthy work is not held against it.
func (r *Reducer) watch() {
	defer close(r.watchDone)
	tick := time.NewTicker(watchPoll)
	defer tick.Stop()
	for {
		select {
		case p, ok := <-r.watchCh:
			if !ok {
				return
			}
			r.complete(p)
		case <-tick.C:
			r.checkEnqueueStall()
		}
	}
}

// complete waits for one pending call and finishes its Work.
func (r *Reducer) complete(p pending) {
	err := r.await(p, time.Now())
	if err != nil {
		err = fmt.Errorf("hier: %v: %w", p.req, err)
	}
	ev := p.req.work.releaseEvent()
	r.mu.Lock()
	for i, f := range r.inflight {
		if f.work == p.req.work {
			r.inflight = append(r.inflight[:i], r.inflight[i+1:]...)
			break
		}
	}
	r.mu.Unlock()
	p.req.work.finish(err)
	r.completed.Store(p.req.seq)
	if err == nil || ev == nil {
		r.events.put(ev)
	}
	r.events.put(p.req.after)
}

// progressed tells the enqueue watchdog that the engine, busy with one
// call for long (a calibration), is making progress.
func (r *Reducer) progressed() {
	r.mu.Lock()
	r.busySince = time.Now()
	r.mu.Unlock()
}

// checkEnqueueStall is the watchdog of enqueueing itself: NCCL can block
// the thread that enqueues (its queue to the device full of work that
// waits for a dead peer), which leaves no pending call to time out.
func (r *Reducer) checkEnqueueStall() {
	if r.cfg.timeout <= 0 {
		return
	}
	r.mu.Lock()
	busy, since, seq, broken := r.busy, r.busySince, r.busySeq, r.broken
	r.mu.Unlock()
	if busy && broken == nil {
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
		checkDone = p.req.check == nil
		checkErr  error
		checkC    <-chan struct{}
		timedOut  bool
		asked     bool // the check was asked for
		poll      = time.NewTimer(watchPoll)
	)
	poll.Stop()
	defer poll.Stop()
	if !checkDone {
		checkC = p.req.check.done
	}
	for {
		if !dataDone {
			ctx, cancel := context.WithTimeout(context.Background(), watchPoll)
			_ = p.ev.Wait(ctx) // returns the work's own error once complete: ask Query
			cancel()
			dataDone, dataErr = p.ev.Query()
		}
		if !checkDone {
			if dataDone { // only the check is left: ask for it, and wait for it a poll at a time
				if !asked {
					r.checker.want(p.req.seq)
					asked = true
				}
				poll.Reset(watchPoll)
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
			if dataErr != nil {
				if cause := r.brokenCause(); cause != nil && !errors.Is(dataErr, cause) {
					return fmt.Errorf("%w (%w)", cause, dataErr)
				}
				return dataErr
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
