package hier

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/streams"
)

// pending is enqueued device work the watcher waits for.
type pending struct {
	req   *request
	ev    streams.Event
	start time.Time
}

const (
	watchPoll  = 50 * time.Millisecond // how often a wait checks communicator errors and deadlines
	abortGrace = 10 * time.Second      // how long to wait for device work after an abort
)

// watch completes Works in enqueue order as their completion events fire,
// and runs the watchdog.
func (r *Reducer) watch() {
	defer close(r.watchDone)
	for p := range r.watchCh {
		err := r.await(p)
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
		if err == nil || ev == nil {
			r.events.put(ev)
		}
		r.events.put(p.req.after)
	}
}

// await waits for one completion event, checking the communicators'
// asynchronous errors and the watchdog deadline while it waits.
func (r *Reducer) await(p pending) error {
	var abortedAt time.Time
	for {
		ctx, cancel := context.WithTimeout(context.Background(), watchPoll)
		_ = p.ev.Wait(ctx) // returns the work's own error once complete: ask Query
		cancel()
		if done, qerr := p.ev.Query(); done {
			if qerr != nil {
				if cause := r.brokenCause(); cause != nil && !errors.Is(qerr, cause) {
					return fmt.Errorf("%w (%w)", cause, qerr)
				}
			}
			return qerr
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
		}
		if r.cfg.timeout > 0 && now.Sub(p.start) > r.cfg.timeout {
			r.abort(fmt.Errorf("%w: %v not complete after %v", fairgo.ErrTimeout, p.req, r.cfg.timeout))
		}
	}
}

// commFailure returns a failed communicator and its error, preferring a root
// cause (a mismatch, a stall, a device error) to an abort that a peer made
// in reaction to it, so that the Work reports what went wrong first.
func (r *Reducer) commFailure() (Comm, error) {
	var first Comm
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
