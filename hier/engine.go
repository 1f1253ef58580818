package hier

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/padding"
	"github.com/fairgo/fairgo/staging"
	"github.com/fairgo/fairgo/streams"
)

// engine is the goroutine that owns all enqueueing for the device, in call
// order. It exits when the Reducer is closed, after the watcher has seen the
// end of all device work, and frees the engine's memory.
func (r *Reducer) engine(ready chan<- error) {
	defer close(r.engineDone)
	release, err := r.dev.Bind()
	if err != nil {
		close(r.watchCh)
		ready <- fmt.Errorf("hier: binding the engine to the device: %w", err)
		return
	}
	defer release()
	if r.chain, err = streams.NewChain(r.dev); err != nil {
		close(r.watchCh)
		ready <- fmt.Errorf("hier: %w", err)
		return
	}
	if r.comms.Check != nil && !r.cfg.checkOff {
		if err := r.startChecker(); err != nil {
			close(r.watchCh)
			ready <- errors.Join(err, r.chain.Release())
			return
		}
	}
	ready <- nil
	for {
		q := r.next()
		if q == nil {
			break
		}
		r.execute(q, r.chain.Stream(streams.ReduceScatter))
		r.idle()
	}
	close(r.watchCh)
	grace := time.NewTimer(r.closeGrace())
	select {
	case <-r.watchDone:
	case <-grace.C:
		r.abort(fmt.Errorf("%w: the Reducer was closed with work still running", fairgo.ErrClosed))
		<-r.watchDone
	}
	grace.Stop()
	var errs []error
	if r.checker != nil {
		errs = append(errs, r.checker.stop())
	}
	if r.board != nil {
		r.board.stop()
	}
	if r.calib != nil {
		errs = append(errs, r.calib.release(r.dev))
	}
	errs = append(errs, r.chain.Release(), r.events.release())
	if r.stagingR != nil {
		errs = append(errs, r.stagingR.Close())
	}
	if r.paddingR != nil {
		errs = append(errs, r.paddingR.Close())
	}
	if r.rank.OwnsResources {
		if r.abortsFinished(r.closeGrace()) {
			errs = append(errs, r.rank.Release())
		} else { // destroying a communicator NCCL is still aborting would be worse than leaking it
			errs = append(errs,
				fmt.Errorf("hier: the communicators were still aborting %v after Close; left to NCCL", r.closeGrace()))
		}
	}
	r.closeErr = errors.Join(errs...)
}

// next blocks until a request is queued, then claims it; it returns nil once
// the Reducer is closed. Enqueueing stays on this one goroutine: NCCL's first
// call on a communicator can block the calling thread until the peers join,
// so a caller that drives several ranks from one goroutine must never enqueue
// itself.
func (r *Reducer) next() *request {
	for {
		r.mu.Lock()
		if len(r.queue) > 0 && !r.busy {
			q := r.queue[0]
			r.queue[0] = nil
			r.queue = r.queue[1:]
			r.busy, r.busySince, r.busySeq = true, time.Now(), q.seq
			r.mu.Unlock()
			return q
		}
		done := r.closed && !r.busy
		r.mu.Unlock()
		if done {
			return nil
		}
		r.park()
	}
}

// park waits for a kick, polling for cfg.spin first.
func (r *Reducer) park() {
	if r.cfg.spin > 0 {
		deadline := time.Now().Add(r.cfg.spin)
		for time.Now().Before(deadline) {
			select {
			case <-r.wake:
				return
			default:
				runtime.Gosched()
			}
		}
	}
	<-r.wake
}

// execute enqueues one request's device work, starting on first (the
// engine's first stage, or the caller's stream for an inline call), and
// hands its completion event and its check to the watcher and the checker.
// It runs on the engine goroutine, or on the caller's while it holds busy.
func (r *Reducer) execute(q *request, first streams.Stream) {
	if q.rejected != nil { // refused at the call: only its check runs
		r.checkLater(q)
		return
	}
	if cause := r.brokenCause(); cause != nil {
		q.work.finish(brokenErr(q, cause))
		r.events.put(q.after)
		return
	}
	for _, t := range []fairgo.Tensor{q.a, q.b} {
		if t.Count == 0 {
			continue
		}
		if err := r.dev.CheckRange(t.Ptr, t.ByteLen()); err != nil {
			q.rejected = fmt.Errorf("hier: %v: %w", q, err)
			q.work.finish(q.rejected)
			r.events.put(q.after)
			r.checkLater(q)
			return
		}
	}
	waited, err := r.waitOverlaps(q, first)
	if err != nil {
		r.abortAfterEnqueueError(q, err)
		return
	}
	last, err := r.dispatch(q, first)
	if err != nil {
		r.abortAfterEnqueueError(q, err)
		return
	}
	if last == nil && waited {
		// No device work, but what the call waited for (its After event,
		// earlier calls on its memory) is its result: later StreamWaits
		// must wait for it too.
		last = first
	}
	var ev streams.Event
	if last != nil {
		ev, err = r.events.get()
		if err == nil {
			err = ev.Record(last)
		}
		if err != nil {
			r.abortAfterEnqueueError(q, err)
			return
		}
		lo, hi := q.span()
		r.mu.Lock()
		r.inflight = append(r.inflight, inflight{lo: lo, hi: hi, ev: ev, last: last, work: q.work})
		r.mu.Unlock()
	}
	q.work.markEnqueued(ev, last)
	r.enqueued.Store(q.seq)
	r.checkLater(q)
	if ev == nil && q.check == nil { // nothing on the device, no peer to hear from
		q.work.finish(nil)
		r.events.put(q.after)
		r.completed.Store(q.seq)
		return
	}
	r.watchCh <- pending{req: q, ev: ev}
}

// checkLater hands the call to the checker, when there are peers.
func (r *Reducer) checkLater(q *request) {
	if r.checker != nil && !r.skipCheck {
		r.checker.submit(q)
	}
}

// abortAfterEnqueueError handles a failure in the middle of enqueueing: the
// peers may already have enqueued their part, so the communicators are
// aborted rather than left to hang.
func (r *Reducer) abortAfterEnqueueError(q *request, err error) {
	if cause := r.brokenCause(); cause != nil && !errors.Is(err, cause) {
		err = fmt.Errorf("%w (%w)", cause, err) // an abort (a timeout) ended the enqueue: it is the cause
	}
	// The Work fails with what the abort reports: the communicators are
	// aborted, which the error says (fairgo.ErrAborted) whatever the
	// enqueue's own error was (NCCL reports a dead peer as a plain
	// ncclRemoteError from the enqueue when it finds out then).
	err = fmt.Errorf("%w: hier: %v: enqueueing: %w", fairgo.ErrAborted, q, err)
	r.abort(err)
	q.work.markEnqueued(nil, nil)
	q.work.finish(err)
	r.events.put(q.after)
}

// span is the address range the request reads or writes.
func (q *request) span() (lo, hi uintptr) {
	lo, hi = q.a.Ptr, q.a.Ptr+uintptr(q.a.ByteLen())
	if q.b.Count > 0 {
		lo = min(lo, q.b.Ptr)
		hi = max(hi, q.b.Ptr+uintptr(q.b.ByteLen()))
	}
	return lo, hi
}

// waitOverlaps makes the first stage wait for the caller's After event and
// for every earlier call still in flight whose memory overlaps this one's,
// and reports whether there was anything to wait for. An event recorded on
// first itself needs no wait (the stream runs in order), and of the events
// recorded on one stream only the newest is waited for (it captures the
// others): back to back calls on one buffer cost at most one wait per
// stream, not one per call in flight.
func (r *Reducer) waitOverlaps(q *request, first streams.Stream) (waited bool, err error) {
	if q.after != nil {
		if err := first.WaitEvent(q.after); err != nil {
			return true, err
		}
		waited = true
	}
	lo, hi := q.span()
	r.mu.Lock() // held while enqueueing the waits: the watcher recycles events under it
	defer r.mu.Unlock()
	var seen [streams.NumStages + 1]streams.Stream // streams already waited on (first counts as one)
	seen[0] = first
	n := 1
	for i := len(r.inflight) - 1; i >= 0; i-- { // newest first
		f := r.inflight[i]
		if f.hi <= lo || hi <= f.lo {
			continue
		}
		if slices.Contains(seen[:n], f.last) {
			waited = true // ordered already, by the stream or by a newer wait
			continue
		}
		if err := first.WaitEvent(f.ev); err != nil {
			return true, err
		}
		waited = true
		if n < len(seen) {
			seen[n] = f.last
			n++
		}
	}
	return waited, nil
}

// dispatch enqueues the request's stages and returns the stream its last
// work went to, or nil when there was nothing to do. Flat work goes on
// first; the pipeline's stages on the engine's streams.
func (r *Reducer) dispatch(q *request, first streams.Stream) (streams.Stream, error) {
	g := r.grid
	switch q.kind {
	case kindAllReduce:
		t := q.a
		if t.Count == 0 || g.Size() == 1 {
			return nil, nil
		}
		return r.allReduceWith(t, q.op, r.routeFor(t.ByteLen()), first)
	case kindReduceScatter:
		return r.reduceScatter(q.a, q.b, q.op)
	case kindAllGather:
		return r.allGather(q.a, q.b)
	case kindBroadcast:
		if q.a.Count == 0 || g.Size() == 1 {
			return nil, nil
		}
		return first, r.comms.World.Broadcast(q.a.Ptr, q.a.Ptr, q.a.Count, q.a.DType, q.root, first)
	case kindAllToAllv:
		if g.Size() == 1 {
			if q.a.Count == 0 || q.sendCounts[0] == 0 {
				return nil, nil
			}
			n := min(q.sendCounts[0], q.recvCounts[0])
			return first, r.dev.CopyAsync(q.b.Ptr, q.a.Ptr, n*int64(q.a.DType.Size()), first)
		}
		return first, r.comms.World.AllToAllv(
			q.a.Ptr,
			q.sendCounts,
			prefixSums(q.sendCounts),
			q.b.Ptr,
			q.recvCounts,
			prefixSums(q.recvCounts),
			q.a.DType,
			first,
		)
	}
	return nil, fmt.Errorf("unknown request kind %d", q.kind)
}

func prefixSums(counts []int64) []int64 {
	out := make([]int64, len(counts))
	var sum int64
	for i, c := range counts {
		out[i] = sum
		sum += c
	}
	return out
}

// handoff records the end of stage from and makes the next stage wait on it
// (unless the test hook drops that wait).
func (r *Reducer) handoff(from streams.Stage) error {
	if err := r.chain.Record(from); err != nil {
		return err
	}
	if r.skipWait == from+1 {
		return nil
	}
	return r.chain.Wait(from + 1)
}

// handoffsFrom hands off from stage from to the end of the chain.
func (r *Reducer) handoffsFrom(from streams.Stage) error {
	for s := from; s < streams.NumStages-1; s++ {
		if err := r.handoff(s); err != nil {
			return err
		}
	}
	return nil
}

func (r *Reducer) stagingRing() (*staging.Ring, error) {
	if r.stagingR == nil {
		ring, err := staging.NewRing(r.dev, r.layout.StagingSlots, r.layout.StagingSlotBytes)
		if err != nil {
			return nil, err
		}
		r.stagingR = ring
	}
	return r.stagingR, nil
}

func (r *Reducer) paddingRing() (*padding.Ring, error) {
	if r.paddingR == nil {
		ring, err := padding.NewRing(r.dev, r.layout)
		if err != nil {
			return nil, err
		}
		r.paddingR = ring
	}
	return r.paddingR, nil
}
