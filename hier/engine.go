package hier

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/streams"
)

// callQueue is the calls waiting for the engine goroutine, in call order,
// and whether a call is being enqueued (by the engine, or inline by its
// caller). Its lock is taken before the router's and the breaker's, never
// after.
type callQueue struct {
	mu        sync.Mutex
	seq       uint64 // the last call number handed out
	items     []*request
	closed    bool
	busy      bool      // a request is being enqueued
	busySince time.Time // since when
	busySeq   uint64    // which call
	wake      chan struct{}
}

// inflight is the memory range of a call whose device work may still run.
type inflight struct {
	lo, hi uintptr
	ev     streams.Event
	last   streams.Stream // the stream ev was recorded on
	work   *Work
}

// inflightSet is the calls whose device work may still run: the engine
// adds each enqueued call, the watcher removes it once complete (and
// recycles its event, so a wait on it is enqueued under the lock).
type inflightSet struct {
	mu   sync.Mutex
	list fifo[inflight]
}

func (s *inflightSet) add(f inflight) {
	s.mu.Lock()
	s.list.Push(f)
	s.mu.Unlock()
}

func (s *inflightSet) remove(w *Work) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.list.Len() { // the oldest, almost always
		if s.list.At(i).work == w {
			s.list.Remove(i)
			return
		}
	}
}

// engine is the goroutine that owns all enqueueing for the device, in call
// order. It exits when the Reducer is closed, after the watcher has seen the
// end of all device work, and frees the engine's memory.
//
// It is not locked to an OS thread (every device call makes the device's
// context current for itself). A locked goroutine runs on its own thread
// only, which the OS must wake and schedule, where an unlocked one can run
// on the thread of the caller that readied it: on the 2-core build host
// (BenchmarkEngineOverhead, null device, one call at a time, no check), a
// call and its StreamWait took 22–42 µs through a locked engine against
// 4.5–8.5 µs unlocked, and 149–188 µs against 25–37 µs when the engine had
// parked between calls (idle=1ms), which a GPU call of a millisecond made
// one at a time always lets it do (bench/NOTES.md item 41). The GPU idles
// meanwhile.
func (r *Reducer) engine(ready chan<- error) {
	defer close(r.done)
	var err error
	if r.exec.chain, err = streams.NewChain(r.rank.Device); err != nil {
		close(r.watch.ch)
		ready <- fmt.Errorf("hier: %w", err)
		return
	}
	if r.rank.Comms.Check != nil && !r.cfg.checkOff {
		if err := r.startCollectiveCheck(); err != nil {
			close(r.watch.ch)
			ready <- errors.Join(err, r.exec.release())
			return
		}
	}
	ready <- nil
	for {
		q := r.next()
		if q == nil {
			break
		}
		r.execute(q, r.exec.first())
		r.idle()
	}
	close(r.watch.ch)
	// No call comes any more, so the agreement on shared memory has no
	// call left to serve: the checker may still be starting the relay
	// (for a call every rank refused, towards a peer that closed first or
	// has not started its own), and neither the watcher, which waits for
	// that call's check, nor the checker's stop may wait for the dials.
	if r.checker != nil {
		r.checker.agreement.abandon()
	}
	grace := time.NewTimer(r.closeGrace())
	select {
	case <-r.watch.done:
	case <-grace.C:
		r.abort(fmt.Errorf("%w: the Reducer was closed with work still running", fairgo.ErrClosed))
		<-r.watch.done
	}
	grace.Stop()
	var errs []error
	if r.checker != nil {
		errs = append(errs, r.checker.stop())
	}
	if r.host != nil {
		errs = append(errs, r.host.close())
	}
	if r.fps != nil {
		errs = append(errs, r.fps.release())
	}
	if r.board != nil {
		r.board.stop()
	}
	errs = append(errs, r.router.measure.release(), r.exec.release(), r.events.release())
	// Close returns only once this Reducer's aborts have ended (closeGrace
	// at most), whoever owns the communicators: an owner that destroys a
	// communicator NCCL is still aborting crashes its process.
	switch finished := r.abortsFinished(r.closeGrace()); {
	case finished && r.rank.OwnsResources:
		errs = append(errs, r.rank.Release())
	case !finished: // destroying a communicator NCCL is still aborting would be worse than leaking it
		errs = append(errs, fmt.Errorf(
			"hier: the communicators were still aborting %v after Close; left to NCCL (do not destroy them)",
			r.closeGrace()))
	}
	r.closeErr = errors.Join(errs...)
}

// next blocks until a request is queued, then claims it; it returns nil once
// the Reducer is closed. Enqueueing stays on this one goroutine: NCCL's first
// call on a communicator can block the calling thread until the peers join,
// so a caller that drives several ranks from one goroutine must never enqueue
// itself.
func (r *Reducer) next() *request {
	c := &r.calls
	for {
		c.mu.Lock()
		if len(c.items) > 0 && !c.busy {
			q := c.items[0]
			c.items[0] = nil
			c.items = c.items[1:]
			c.busy, c.busySince, c.busySeq = true, time.Now(), q.seq
			c.mu.Unlock()
			return q
		}
		done := c.closed && !c.busy
		c.mu.Unlock()
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
			case <-r.calls.wake:
				return
			default:
				runtime.Gosched()
			}
		}
	}
	<-r.calls.wake
}

// startCollectiveCheck starts the checker, and the fingerprints where the
// options ask for them.
func (r *Reducer) startCollectiveCheck() error {
	if err := r.startChecker(); err != nil {
		return err
	}
	if r.cfg.timeout > 0 && r.cfg.fingerprintMax > 0 {
		var err error
		if r.fps, err = r.newFingerprints(); err != nil {
			err = errors.Join(err, r.checker.stop())
			r.checker = nil
			return err
		}
	}
	return nil
}

// execute enqueues one request's device work, starting on first (the
// engine's first stage, or the caller's stream for an inline call), and
// hands its completion event and its check to the watcher and the checker.
// It runs on the engine goroutine, or on the caller's while it holds busy.
func (r *Reducer) execute(q *request, first streams.Stream) {
	defer r.watch.enqueueEnded()
	if a := r.checker.agreementDue(q); a != nil {
		r.host = a.take() // from this call on, every rank alike
		if r.host != nil {
			r.relay.Store(r.host.relay)
		}
	}
	if q.rejected != nil { // refused at the call: only its check runs
		r.checkRejected(q, first)
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
		if err := r.rank.Device.CheckRange(t.Ptr, t.ByteLen()); err != nil {
			q.rejected = fmt.Errorf("hier: %v: %w", q, err)
			q.work.finish(q.rejected)
			r.events.put(q.after)
			q.after = nil
			r.checkRejected(q, first)
			return
		}
	}
	fp, fingerprinted := r.fingerprintPlan(q)
	if fingerprinted {
		q.cursor = r.host
	}
	if !fingerprinted || !r.fingerprintVouches(q) {
		if err := r.postCheck(q); err != nil { // before the data: see hostcheck.go
			r.abortAfterEnqueueError(q, err)
			return
		}
	}
	waited, err := r.waitOverlaps(q, first)
	if err != nil {
		r.abortAfterEnqueueError(q, err)
		return
	}
	var last streams.Stream
	if !fingerprinted {
		// The separate check goes before the data: NCCL may hold this
		// thread in the data's first collective on a communicator until
		// every peer has made one (its connection), which a peer that
		// refused the call never does; the checks then still meet, and the
		// mismatch they find aborts the held enqueue. A fingerprinted call
		// needs not: a refusing peer runs the same collective.
		r.checkLater(q)
	}
	r.held.Store(q) // the watcher decides it if the enqueue is held (decideHeldCall)
	if fingerprinted {
		last, err = r.fps.enqueue(q, fp, first, true)
	} else {
		last, err = r.dispatch(q, first)
	}
	r.held.Store(nil)
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
		r.flight.add(inflight{lo: lo, hi: hi, ev: ev, last: last, work: q.work})
	}
	q.work.markEnqueued(ev, last)
	r.watch.enqueued.Store(q.seq)
	if fingerprinted && !r.fingerprintVouches(q) {
		q.pairsFirst = true // its pairs are read before its check ends
		r.checkLater(q)
	}
	if ev == nil && q.check == nil && !q.posted { // nothing on the device, no peer to hear from
		q.work.finish(nil)
		r.events.put(q.after)
		r.watch.completed.Store(q.seq)
		return
	}
	p := pending{req: q, ev: ev, on: last}
	q.work.helpable.Store(p.helpable())
	r.watch.ch <- p
}

// checkRejected runs the check of a call this rank refused: inside a
// fingerprinted collective when the call's shape makes one (its peers that
// accepted it run theirs), else on the checker. The Work has failed
// already; a mismatch aborts, as on the peers.
func (r *Reducer) checkRejected(q *request, first streams.Stream) {
	r.postRefusal(q)
	fp, fingerprinted := r.fingerprintPlan(q)
	if fingerprinted {
		q.cursor = r.host
	}
	if r.host != nil && (!fingerprinted || !r.fingerprintVouches(q)) {
		if err := r.postCheck(q); err != nil {
			r.abort(fmt.Errorf("%w: hier: %v: posting the check of a refused call: %w", fairgo.ErrAborted, q, err))
			return
		}
		if !fingerprinted {
			r.watch.ch <- pending{req: q} // the watcher decides it in call order; the Work has its error
			return
		}
	}
	if !fingerprinted {
		r.checkLater(q)
		r.checker.dataDone(q.seq) // no data: its check needs not wait for any
		return
	}
	if r.brokenCause() != nil {
		return // the peers' calls fail with the abort too
	}
	last, err := r.fps.enqueue(q, fp, first, false)
	var ev streams.Event
	if err == nil {
		if ev, err = r.events.get(); err == nil {
			err = ev.Record(last)
		}
		if err != nil {
			q.fp.free()
			q.fp = nil
		}
	}
	if err != nil {
		r.abort(fmt.Errorf("%w: hier: %v: enqueueing the check of a refused call: %w", fairgo.ErrAborted, q, err))
		return
	}
	if !r.fingerprintVouches(q) { // as its peers that accepted it
		q.pairsFirst = true
		r.checkLater(q)
	}
	// The Work failed at the call and keeps no event: its StreamWait
	// returns the error, never a wait on the check's collective.
	r.watch.ch <- pending{req: q, ev: ev}
}

// postCheck posts the call's image in the shared memory of a one-machine
// job (hostcheck.go); without it, nothing.
func (r *Reducer) postCheck(q *request) error {
	if r.host == nil || r.hooks.skipCheck {
		return nil
	}
	err := r.host.post(q, r.brokenCause)
	if err == nil {
		q.posted = true
	}
	return err
}

// checkLater hands the call to the checker, when there are peers and no
// shared memory checks the call.
func (r *Reducer) checkLater(q *request) {
	if r.checker != nil && r.host == nil && !r.hooks.skipCheck {
		r.hooks.checkedApart.Add(1)
		r.checker.submit(q)
	}
}

// abortAfterEnqueueError handles a failure in the middle of enqueueing: the
// peers may already have enqueued their part, so the communicators are
// aborted rather than left to hang. A call whose separate check went out
// before its data first gives that check its verdict (awaitOwnCheck).
func (r *Reducer) abortAfterEnqueueError(q *request, err error) {
	r.awaitOwnCheck(q)
	err = r.withBreakCause(err)
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

// awaitOwnCheck waits, up to refusalGrace, for the verdict of q's separate
// check where it was enqueued before q's data. A peer whose check found the
// call mismatched aborts the communicators, and that abort can fail this
// rank's enqueue (the split of a world variant made at the call, NCCL's
// launch) before this rank's checker has read the same verdict from the
// same collective: the checker's mismatch, which then breaks the Reducer
// as its root cause, is what the Work must report, as on the peers, rather
// than the abort alone. The check needs only the peers' checks, which go
// before their data too, so the wait is short where the peers are alive;
// the bound keeps an enqueue error from waiting on peers that are not.
func (r *Reducer) awaitOwnCheck(q *request) {
	t := q.check
	if t == nil || t.slot == nil {
		return
	}
	timer := time.NewTimer(refusalGrace)
	defer timer.Stop()
	select {
	case <-t.done:
	case <-timer.C:
	}
}

// withBreakCause returns err, an enqueue's error, led by the cause of the
// Reducer's break when it broke meanwhile: an abort (a timeout, a
// mismatch) ends an enqueue that NCCL held, with an error of NCCL's own
// (ncclInternalError) that says nothing of why, and the Work must report
// the why.
func (r *Reducer) withBreakCause(err error) error {
	if cause := r.brokenCause(); cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%w (%w)", cause, err)
	}
	return err
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
//
// Invariant: every call in flight was ordered, when it was enqueued, after
// every older call in flight whose memory overlaps its own (this function
// made it so, and the set only loses calls). So once the scan, newest
// first, has ordered this call after one whose memory contains this
// call's, the older ones are ordered too, and the scan stops: back to back
// calls on one buffer cost one step each, not one per call in flight.
func (r *Reducer) waitOverlaps(q *request, first streams.Stream) (waited bool, err error) {
	if q.after != nil {
		if err := first.WaitEvent(q.after); err != nil {
			return true, err
		}
		waited = true
	}
	lo, hi := q.span()
	r.flight.mu.Lock() // held while enqueueing the waits: the watcher recycles events under it
	defer r.flight.mu.Unlock()
	var seen [streams.NumStages + 1]streams.Stream // streams already waited on (first counts as one)
	seen[0] = first
	n := 1
	for i := r.flight.list.Len() - 1; i >= 0; i-- { // newest first
		f := r.flight.list.At(i)
		if f.hi <= lo || hi <= f.lo {
			continue
		}
		waited = true
		if !slices.Contains(seen[:n], f.last) { // else ordered already, by the stream or by a newer wait
			if err := first.WaitEvent(f.ev); err != nil {
				return true, err
			}
			if n < len(seen) {
				seen[n] = f.last
				n++
			}
		}
		if f.lo <= lo && hi <= f.hi {
			break // f was ordered after the older calls on this memory
		}
	}
	return waited, nil
}

// dispatch enqueues the request's stages and returns the stream its last
// work went to, or nil when there was nothing to do. Flat work goes on
// first; the pipeline's stages on the engine's streams.
func (r *Reducer) dispatch(q *request, first streams.Stream) (streams.Stream, error) {
	g := r.rank.Grid
	switch q.kind {
	case kindAllReduce:
		t := q.a
		if t.Count == 0 || g.Size() == 1 {
			return nil, nil
		}
		return r.exec.allReduce(t, q.op, r.router.route(t.ByteLen()), first)
	case kindReduceScatter:
		return r.exec.reduceScatter(q.a, q.b, q.op, first)
	case kindAllGather:
		return r.exec.allGather(q.a, q.b, first)
	case kindBroadcast:
		if q.a.Count == 0 || g.Size() == 1 {
			return nil, nil
		}
		return first, r.rank.Comms.World.Broadcast(q.a.Ptr, q.a.Ptr, q.a.Count, q.a.DType, q.root, first)
	case kindAllToAllv:
		if g.Size() == 1 {
			if q.a.Count == 0 || q.sendCounts[0] == 0 {
				return nil, nil
			}
			n := min(q.sendCounts[0], q.recvCounts[0])
			return first, r.rank.Device.CopyAsync(q.b.Ptr, q.a.Ptr, n*int64(q.a.DType.Size()), first)
		}
		return first, r.rank.Comms.World.AllToAllv(
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
