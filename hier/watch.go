package hier

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/internal/poll"
	"github.com/fairgo/fairgo/streams"
)

// pending is a call the watcher waits for: its completion event (nil when
// it put nothing on the device), the stream the event was recorded on, and
// its check (req.check, or the shared memory's when req.posted; neither
// without peers).
type pending struct {
	req *request
	ev  streams.Event
	on  streams.Stream
}

const (
	watchPoll  = 50 * time.Millisecond // how often a wait checks communicator errors and deadlines
	abortGrace = 2 * time.Second       // how long to wait for device work after an abort before reporting it
	// failureVerdictGrace is how long a call whose communicator failed
	// waits for its own check's verdict before it reports the failure
	// (verdictBeforeFailure).
	failureVerdictGrace = time.Second
	// watchIdlePoll is how long the watcher naps for the next call, once
	// it has completed one, before it parks: a training loop's next call
	// comes sooner, and its hand-off to a napping watcher costs the
	// caller no wake-up (a futex, a hand-off through the scheduler).
	watchIdlePoll = 20 * time.Millisecond
	// watchQuietGap is the longest gap between two enqueues of a burst
	// (calls back to back), and how long after a burst's last enqueue the
	// watcher still leaves the driver alone; watchQuietMax how long at
	// most it leaves one call to the caller's threads (quiet).
	watchQuietGap = 50 * time.Microsecond
	watchQuietMax = time.Millisecond
	// The watcher's pace (watchPace): between two looks at a call still
	// running, or for the next call, it naps an eighth of the time it has
	// been looking, at least watchNapMin and at most watchNapMax, and
	// watchNapMin while watchBacklog calls or more wait behind the one it
	// watches, so that the checks' slots (checkSlots, fpSlots), which
	// calls free as they complete, keep up with a caller that enqueues
	// many short calls.
	watchNapShare = 8
	watchNapMin   = 100 * time.Microsecond
	watchNapMax   = time.Millisecond
	watchBacklog  = 16
)

// watchPace is the watcher's nap before it looks again at a call (or for
// the next one) it has been looking at for age, with backlog calls queued
// behind it.
//
// Why the watcher is slow to see a call end: nobody waits for it. A Wait
// polls its call itself and completes it at once (help); a caller that
// orders its stream after the call (StreamWait, the C ABI's and the
// PyTorch hook's way) needs no host at all; what is left to the watcher
// is the watchdog, freeing the call's resources, and closing the Done
// channel of a Work nobody waits on, which it does at most an eighth of
// the call's time, or watchNapMax, late. Every nap ends in a wake-up of
// the watcher's thread, and every look in a driver query: with many
// ranks on a host (16 emulated machines, four processes a GPU under MPS)
// the watchers' naps of tens of µs kept the ranks' threads waiting for a
// processor and the ranks starting each call far apart, and fairgo on
// NCCL's tree took 1.8–2.4× NCCL's tree alone (bench/NOTES.md item 102).
func watchPace(age time.Duration, backlog int) time.Duration {
	if backlog >= watchBacklog {
		return watchNapMin
	}
	return min(max(age/watchNapShare, watchNapMin), watchNapMax)
}

// backlog is how many calls wait behind the watcher's current one.
func (w *watcher) backlog() int { return max(int(w.queued.Load())-1, 0) + len(w.ch) }

// watcher is the goroutine that completes Works: the calls the engine
// hands it, and how far this rank got. A Wait may complete calls in its
// place (help): the first thread to see a call's device work done
// finishes it, so that a caller waiting for its call does not also wait
// for the watcher to wake up and see it. Either way calls complete in call
// order, one at a time, under mu.
type watcher struct {
	ch        chan pending
	done      chan struct{} // closed when the watcher has exited
	enqueued  atomic.Uint64 // the last call whose device work was enqueued
	completed atomic.Uint64 // the last call whose Work completed
	// poll paces a wait for a check whose data is done; made at the first
	// such wait and reused, on the watcher goroutine only.
	poll *time.Timer
	// askedBoard is when the watcher last asked the Board about a call
	// undecided for long (boardVerdict); the watcher goroutine's.
	askedBoard time.Time

	mu sync.Mutex // held while a call is completed; guards the fields below
	// queue holds the calls taken off ch and not yet completed, oldest
	// first: ch hands each call to the watcher or to a helping Wait,
	// whichever receives it, and both complete from the front.
	queue fifo[pending]
	// current is the call the watcher is waiting for (nil: none); orphan
	// is its completion event when a Wait completed it meanwhile, kept out
	// of the event pool until the watcher has stopped polling it, so that
	// no later call's recording can be taken for it.
	current *request
	orphan  streams.Event
	// known is what helping Waits learnt of the device (help); asked the
	// last call a Wait found still running.
	known knownDone
	asked uint64
	// receiving is set while the watcher blocks on ch for the next call
	// (receive), which a helping Wait then leaves to it, without even
	// taking mu: a Wait that polls takes it again and again, and the
	// watcher, woken with the call, must get it.
	receiving atomic.Bool
	// queued is len(queue), and blocked whether the oldest call is one no
	// Wait may complete (helpable): read without mu, they let a polling
	// Wait pass by without contending for the lock the watcher needs.
	queued  atomic.Int32
	blocked atomic.Bool
	// What quiet reads: lastEnqueued is when a thread last ended an
	// execute (nanoseconds since epoch), burst whether the one before
	// ended within watchQuietGap of it; waiting counts the Waits that
	// poll their call (help); leave is the last call such a Wait found it
	// cannot complete (a mismatch, a failed check), which the watcher
	// decides and explains.
	lastEnqueued atomic.Int64
	burst        atomic.Bool // the last two enqueues ended within watchQuietGap of each other
	waiting      atomic.Int32
	leave        atomic.Uint64
	epoch        time.Time
}

// quiet reports whether the watcher leaves the driver alone for now
// while it waits for p, the call it turned to at turned:
//
//   - a Wait polls, and will complete p itself (help), unless it found
//     that it cannot (leave);
//   - or the caller enqueues calls back to back (its last two enqueues
//     ended within watchQuietGap of each other, the last within
//     watchQuietGap of now): the next call is being enqueued. For at most
//     watchQuietMax, so that a caller that enqueues without end and
//     selects on Done still sees its calls complete; a call enqueued alone
//     is polled from its start.
//
// Why: a completion query is a driver call, which the driver serialises
// with the launches of the process's other threads, so that the watcher's
// polls slow the enqueue of the caller's next call (bench/NOTES.md, "The
// watcher leaves the driver to the caller"); and a Wait that polls p
// would only have its queries doubled. What holds: every call that
// reaches the watcher is asked about by someone (its Wait, or the watcher
// once quiet ends), and quiet or not, the watcher's watchdog and error
// checks run (await).
func (w *watcher) quiet(p pending, turned, now time.Time) bool {
	if !p.helpable() {
		return false
	}
	if w.waiting.Load() > 0 && p.req.seq > w.leave.Load() {
		return true
	}
	return w.burst.Load() && now.Sub(turned) <= watchQuietMax &&
		now.Sub(w.epoch)-time.Duration(w.lastEnqueued.Load()) < watchQuietGap
}

// enqueueEnded records the end of a thread's execute, for quiet.
func (w *watcher) enqueueEnded() {
	now := time.Since(w.epoch)
	prev := time.Duration(w.lastEnqueued.Swap(int64(now)))
	w.burst.Store(now-prev < watchQuietGap)
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
	var lastDone time.Time // when the last call completed; zero: none yet
	for {
		// Across machines, the images posted so far go out at each turn,
		// whoever completes the calls (relay.flush).
		r.relay.Load().flush(false)
		if r.hooks.watcherHeld.Load() {
			time.Sleep(100 * time.Microsecond)
			continue
		}
		if p, ok := r.watch.take(); ok {
			if r.hooks.watcherHeld.Load() { // held since the look above: the call is the Waits'
				r.watch.untake()
				continue
			}
			r.complete(p)
			lastDone = time.Now()
			continue
		}
		select {
		case <-tick.C:
			r.decideHeldCall()
			r.checkEnqueueStall()
			continue
		default:
		}
		got, open := r.watch.receive(false)
		switch {
		case got:
			continue
		case !open:
			return // no call queued, and no more to come
		case !lastDone.IsZero() && time.Since(lastDone) < watchIdlePoll:
			poll.Nap(watchPace(time.Since(lastDone), 0))
			continue
		}
		r.hooks.watcherParks.Add(1)
		r.watch.receive(true)
	}
}

// receive takes the next call off ch into the queue, without blocking or
// (block) until one comes or a watchPoll has passed; got reports whether a
// call is queued, and open is false once ch is closed and drained. The
// watcher receives with mu held, or marks itself receiving while it
// blocks, when a Wait that helps leaves ch to it (help): no call can reach
// the queue ahead of one the watcher took off ch first.
func (w *watcher) receive(block bool) (got, open bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var p pending
	select {
	case p, open = <-w.ch:
		got = open
	default:
		if !block {
			return false, true
		}
		w.receiving.Store(true)
		w.mu.Unlock()
		t := w.pollTimer()
		select {
		case p, open = <-w.ch:
			got = open
		case <-t.C:
			open = true
		}
		t.Stop()
		w.mu.Lock()
		w.receiving.Store(false)
	}
	if got {
		w.queue.Push(p)
		w.queueChanged()
	}
	// A Wait may have queued a call since the watcher found none.
	return w.queue.Len() > 0, open
}

// take makes the oldest call not yet completed the watcher's current one
// (false: none is queued).
func (w *watcher) take() (pending, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.queue.Len() == 0 {
		return pending{}, false
	}
	w.current = w.queue.Front().req
	return w.queue.Front(), true
}

// untake gives the current call back (the watcher was held).
func (w *watcher) untake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.current = nil
}

// complete waits for the watcher's current call, p, and finishes its Work,
// unless a Wait finished it meanwhile.
func (r *Reducer) complete(p pending) {
	dataErr, checkErr, err := r.await(p, time.Now())
	w := &r.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	w.current = nil
	if w.queue.Len() == 0 || w.queue.Front().req != p.req { // a Wait completed it
		r.events.put(w.orphan)
		w.orphan = nil
		return
	}
	if err == nil {
		err = r.conclude(p, dataErr, checkErr)
	}
	r.finishLocked(p, err)
}

// help completes, on the goroutine of a Wait for w, the calls up to w
// whose device work is done and whose check, if any, matched (in the
// shared memory, or decided by the checker; not a refusal to decide), in
// call order. It reports whether w is done. It never blocks: where the
// watcher is completing a call, or the next call is not done, the Wait
// goes on waiting.
//
// Calls are enqueued in call order, so events recorded on one stream
// complete in call order: once the oldest call is done, one query of the
// newest queued call on its stream (ahead) tells whether every call
// between them is done too (known), and those are completed without a
// query each, past w if need be. A caller that waits for its calls one by
// one after a burst (a step's buckets) then pays two driver queries, not
// one a call.
func (r *Reducer) help(w *Work) bool {
	wt := &r.watch
	if wt.blocked.Load() || wt.receiving.Load() || wt.queued.Load() == 0 && len(wt.ch) == 0 || !wt.mu.TryLock() {
		return false
	}
	defer wt.mu.Unlock()
	for !w.IsCompleted() || wt.queue.Len() > 0 && wt.known.covers(wt.queue.Front()) {
		if wt.queue.Len() == 0 && !wt.takeFromCh() {
			return false
		}
		p := wt.queue.Front()
		if !p.helpable() {
			return w.IsCompleted()
		}
		var dataErr error
		if !wt.known.covers(p) {
			var done bool
			r.hooks.helpQueries.Add(1)
			if done, dataErr = p.ev.Query(); !done {
				wt.asked = p.req.seq
				return false
			}
			if dataErr == nil {
				r.ahead(p, wt.asked != p.req.seq, &r.hooks.helpQueries)
			}
		}
		r.checker.dataDone(p.req.seq)
		if t := p.req.check; t != nil {
			if !t.finished() && !r.checker.decideEarly(p.req) {
				return w.IsCompleted() // the checker has not decided it yet
			}
			if t.err != nil {
				wt.leave.Store(p.req.seq)
				return w.IsCompleted() // a mismatch, or a check that failed: the watcher's
			}
		}
		if p.req.posted {
			// Decided only when it matched: a mismatch is left to the
			// watcher, which aborts and explains it.
			r.host.relay.flush(false)
			ok, err := r.host.read(p.req)
			if err != nil {
				wt.leave.Store(p.req.seq)
			}
			if !ok || err != nil {
				return w.IsCompleted()
			}
			r.host.advance(p.req.seq)
		}
		r.finishLocked(p, r.conclude(p, dataErr, nil))
		r.hooks.helped.Add(1)
	}
	return true
}

// knownDone is what helping Waits learnt of the device: for a few of the
// streams calls' events were recorded on, the newest call seen done there
// without error, so that every call before it on that stream is done too.
// What it says stays true, so it is never cleared; a stream that stops
// being used is pushed out by newer ones.
type knownDone [4]struct {
	on  streams.Stream
	seq uint64
}

// covers reports whether p's device work is known done.
func (k *knownDone) covers(p pending) bool {
	if p.on == nil || !p.helpable() {
		return false
	}
	for _, e := range k {
		if e.on == p.on {
			return p.req.seq <= e.seq
		}
	}
	return false
}

// learn records that the calls up to seq on stream on are done.
func (k *knownDone) learn(on streams.Stream, seq uint64) {
	i := len(k) - 1 // the oldest entry, unless on has one
	for j, e := range k {
		if e.on == on {
			if seq <= e.seq {
				return
			}
			i = j
			break
		}
	}
	copy(k[1:i+1], k[:i]) // the newest first
	k[0].on, k[0].seq = on, seq
}

// knownDone reports whether p's device work is known done (help's known),
// for the watcher, which then needs no query of its own.
func (r *Reducer) knownDone(p pending) bool {
	r.watch.mu.Lock()
	defer r.watch.mu.Unlock()
	return r.watch.known.covers(p)
}

// learnAhead is ahead for the watcher, which found p done with err.
func (r *Reducer) learnAhead(p pending, err error, probe bool) {
	if err != nil {
		return
	}
	r.watch.mu.Lock()
	defer r.watch.mu.Unlock()
	r.ahead(p, probe, &r.hooks.watcherPolls)
}

// takeFromCh moves the next call off ch into the queue, for a helping Wait
// (mu held); false where there is none, or the watcher is receiving it.
func (w *watcher) takeFromCh() bool {
	if w.receiving.Load() {
		return false // the watcher takes the next call
	}
	select {
	case p, ok := <-w.ch:
		if !ok {
			return false
		}
		w.queue.Push(p)
		w.queueChanged()
		return true
	default:
		return false
	}
}

// ahead, for p, a call just found done without error, learns that, and
// (probe) asks the newest call queued on the same stream (taking the calls
// waiting on ch into the queue first) whether it is done too (watch.mu
// held); queries counts the question. Probe only where p was done when
// first asked: the device was ahead of whoever looks, and the calls behind
// p likely done too. A call seen done only after polls says the device is
// being kept up with, and the newest call is still running: asking it
// would be a query wasted each call.
func (r *Reducer) ahead(p pending, probe bool, queries *atomic.Uint64) {
	w := &r.watch
	if p.on == nil {
		return
	}
	w.known.learn(p.on, p.req.seq)
	if !probe {
		return
	}
	for len(w.ch) > 0 && w.takeFromCh() {
	}
	for i := w.queue.Len() - 1; i >= 0; i-- {
		q := w.queue.At(i)
		if q.req.seq <= p.req.seq {
			return
		}
		if q.on != p.on || !q.helpable() {
			continue
		}
		queries.Add(1)
		if done, err := q.ev.Query(); done && err == nil {
			w.known.learn(q.on, q.req.seq)
		}
		return
	}
}

// queueChanged publishes queued and blocked (mu held).
func (w *watcher) queueChanged() {
	w.queued.Store(int32(w.queue.Len()))
	w.blocked.Store(w.queue.Len() > 0 && !w.queue.Front().helpable())
}

// helpable reports whether a Wait may complete p: it has device work to
// poll and no refusal to decide (a shared-memory image it reads, a
// collective check once the checker has decided it; a mismatch it
// leaves to the watcher, which aborts and explains it).
func (p pending) helpable() bool {
	return p.ev != nil && p.req.rejected == nil
}

// finishLocked finishes the Work of p, the oldest call queued, with err,
// and recycles what the call held (watch.mu held).
func (r *Reducer) finishLocked(p pending, err error) {
	w := &r.watch
	w.queue.PopFront()
	w.queueChanged()
	if fc := p.req.fp; fc != nil {
		p.req.fp = nil
		fc.free()
		if h := p.req.cursor; h != nil {
			// Decided (every call before it too): its peers' posts may
			// reuse the slots of the calls up to it (hostCheck.reusable),
			// though it took none.
			h.advance(p.req.seq)
		}
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
	w.completed.Store(p.req.seq)
	if err == nil || ev == nil {
		if p.req == w.current { // the watcher still polls it
			w.orphan = ev
		} else {
			r.events.put(ev)
		}
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

// decideHeldCall decides, on the watcher's tick, a call whose data's
// enqueue has been held: after checkAlone from its shared check, if it
// has one, and after refusalGrace from the Board (boardVerdict); it
// aborts on a mismatch. NCCL holds the enqueuing thread in a
// communicator's first collective until every peer has made one (its
// connection): where a peer refused the call, none will, and the call
// never reaches the watcher that would read its check; the abort ends the
// held enqueue. A match decides nothing: the watcher decides the call
// once it has it.
func (r *Reducer) decideHeldCall() {
	q := r.held.Load()
	if q == nil || r.brokenCause() != nil {
		return
	}
	c := &r.calls
	c.mu.Lock()
	busy, since, seq := c.busy, c.busySince, c.busySeq
	c.mu.Unlock()
	held := time.Since(since)
	if !busy || seq != q.seq || held < checkAlone {
		return
	}
	var err error
	if q.posted {
		r.relay.Load().flush(false)
		r.watch.mu.Lock()
		var ok bool
		ok, err = r.host.read(q)
		r.watch.mu.Unlock()
		if !ok || !errors.Is(err, fairgo.ErrMismatch) {
			err = nil
		} else {
			r.explainRefusal(q, err)
		}
	}
	if w := &r.watch; err == nil && held >= refusalGrace && time.Since(w.askedBoard) >= refusalGrace {
		w.askedBoard = time.Now()
		err = r.boardVerdict(q, true)
	}
	if err != nil {
		r.abort(err)
	}
}

// await waits for one call's completion event and check, watching the
// communicators' asynchronous errors and the watchdog deadline meanwhile.
// It returns the data's and the check's errors once both are done, for
// conclude, or err, the call's final error, where it ended otherwise (a
// mismatch the check found, device work an abort did not end).
func (r *Reducer) await(p pending, start time.Time) (dataErr, checkErr, err error) {
	var (
		abortedAt time.Time
		dataDone  = p.ev == nil
		checkDone = p.req.check == nil && !p.req.posted
		checkC    <-chan struct{}
		timedOut  bool
		asked     bool // the watcher found the data still running
		pairsRead bool // a fingerprint's pairs read before its separate check ended
	)
	if p.req.check != nil {
		checkC = p.req.check.done
	}
	if dataDone {
		r.checker.dataDone(p.req.seq)
	}
	for {
		r.relay.Load().flush(false) // across machines, the images posted so far go out
		if !dataDone {
			if dataDone, dataErr = r.waitData(p, start, watchPoll, &asked); dataDone {
				r.checker.dataDone(p.req.seq) // the checker polls the call's check from now on
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
			return nil, nil, checkErr // whatever the data did, the call did not match
		}
		if p.req.pairsFirst && dataDone && dataErr == nil && !checkDone && !pairsRead {
			pairsRead = true
			if err := r.readPairsFirst(p); err != nil {
				return nil, nil, err
			}
		}
		if p.req.completedElsewhere() { // complete sees that a Wait finished it
			return nil, nil, nil
		}
		if dataDone && checkDone {
			return dataErr, checkErr, nil
		}
		now := time.Now()
		if cause := r.brokenCause(); cause != nil {
			if abortedAt.IsZero() {
				abortedAt = now
			} else if now.Sub(abortedAt) > abortGrace {
				return nil, nil, fmt.Errorf("%w; the device work did not end within %v of the abort", cause, abortGrace)
			}
			continue
		}
		if c, cerr := r.commFailure(); cerr != nil {
			if err := r.boardVerdict(p.req, false); err != nil { // why a peer aborted, where no check said
				r.abort(err)
				return nil, nil, err
			}
			if !checkDone {
				if err := r.verdictBeforeFailure(p); err != nil {
					return nil, nil, err // the mismatch the peer aborted on, aborted on here too
				}
			}
			r.abort(fmt.Errorf("%w: communicator %s failed: %w", fairgo.ErrAborted, c.Name(), cerr))
			continue
		}
		if w := &r.watch; now.Sub(start) >= refusalGrace && now.Sub(w.askedBoard) >= refusalGrace {
			w.askedBoard = now
			if err := r.boardVerdict(p.req, true); err != nil {
				r.abort(err)
				return nil, nil, err
			}
		}
		if r.cfg.timeout > 0 && now.Sub(start) > r.cfg.timeout && !timedOut {
			timedOut = true
			r.timedOut(p.req, now.Sub(start))
		}
	}
}

// verdictBeforeFailure gives p's check through shared memory, undecided
// when a communicator failed, failureVerdictGrace to decide, and returns
// the mismatch it found (nil: none, or no verdict in time). A
// communicator fails under this rank when a peer aborts it, most often on
// a mismatch the peer's check found first: the same check here names the
// mismatch, where the communicator's failure says only that a peer went
// away. Past four machines the relay's star brings the peers' images a
// hop later than NCCL brings the abort (bench/NOTES.md, "A peer's abort
// reported before the mismatch"). Only the shared memory's check decides
// without NCCL: a fingerprint rides on the data, and the separate check
// on a communicator the peer's abort failed too.
func (r *Reducer) verdictBeforeFailure(p pending) error {
	if !p.req.posted {
		return nil
	}
	if _, err := r.awaitHostCheck(p.req, failureVerdictGrace); errors.Is(err, fairgo.ErrMismatch) {
		return err // awaitHostCheck explained it and aborted
	}
	return nil
}

// readPairsFirst decides the fingerprint of p, a call fingerprinted and
// checked apart (request.pairsFirst) whose data is done, before its
// separate check ends: the pairs may show a mismatch that the peers, which
// may have taken no separate check (their operator differs), find in
// theirs and abort on without joining this rank's check. On a mismatch it
// explains and aborts as conclude does, and returns it; else nil (no
// mismatch in the pairs, or a Wait completed the call meanwhile, freeing
// its slot: watch.mu guards both).
func (r *Reducer) readPairsFirst(p pending) error {
	w := &r.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if p.req.fp == nil || p.req.completedElsewhere() {
		return nil
	}
	err := p.req.fp.decide(p.req)
	if !errors.Is(err, fairgo.ErrMismatch) {
		return nil
	}
	r.explainRefusal(p.req, err)
	r.abort(err)
	return err
}

// waitData waits for p's data for about d and returns what the last query
// of its completion event said; it returns early, not done, once a Wait
// has completed p. It asks first (a call the watcher reaches late is
// often complete already), then naps at watchPace between asks; while
// quiet it naps without asking.
//
// asked says whether the watcher has found p still running before (so
// that a call done at the first ask makes it probe ahead, and no other).
func (r *Reducer) waitData(p pending, turned time.Time, d time.Duration, asked *bool) (bool, error) {
	for start := time.Now(); ; {
		if r.knownDone(p) {
			return true, nil
		}
		now := time.Now()
		if !r.watch.quiet(p, turned, now) {
			r.hooks.watcherPolls.Add(1)
			if done, err := p.ev.Query(); done {
				r.learnAhead(p, err, !*asked)
				return true, err
			}
			*asked = true
		}
		if p.req.completedElsewhere() || now.Sub(start) >= d {
			return false, nil
		}
		poll.Nap(watchPace(now.Sub(turned), r.watch.backlog()))
	}
}

// completedElsewhere reports whether a Wait completed q (help) while the
// watcher waited for it: the Work of a call that reached the watcher
// unrefused is finished only by whoever completes the call.
func (q *request) completedElsewhere() bool { return q.rejected == nil && q.work.IsCompleted() }

// conclude is the error of call p, whose device work and check are done
// with dataErr and checkErr: an abort that ended the work early fails it
// even where the work reported nothing, and a fingerprint is decided here,
// once, by whoever completes the call (watch.mu held).
func (r *Reducer) conclude(p pending, dataErr, checkErr error) error {
	cause := r.brokenCause()
	if dataErr != nil && cause == nil {
		// A peer's abort can end the data first (the simulator's does,
		// NCCL's may): a refusal that no check carried, which that peer
		// read from the Board, is why.
		if err := r.boardVerdict(p.req, false); err != nil {
			r.abort(err)
			return err
		}
	}
	if dataErr != nil && checkErr != nil && !errors.Is(dataErr, checkErr) {
		// Both ended badly: the data's error says only that its
		// communicator was aborted, the check's why it could not run
		// (NCCL's own message, where its enqueue failed).
		dataErr = fmt.Errorf("%w; its check: %w", dataErr, checkErr)
	}
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
	if fc := p.req.fp; fc != nil { // the data carried it (alone, or beside the separate check)
		if err := fc.decide(p.req); err != nil {
			r.explainRefusal(p.req, err)
			r.abort(err)
			return err
		}
	}
	return checkErr
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
