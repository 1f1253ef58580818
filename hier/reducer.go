package hier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/streams"
)

// CallOption adjusts one call.
type CallOption func(*callConfig)

type callConfig struct {
	after    streams.Stream
	detached bool
}

// After makes the call's first stage wait for the work enqueued on s before
// the call: an event is recorded on s during the call, so work enqueued on s
// later is not waited for. Pass the stream that produced the gradients.
// A call enqueued inline (WithInlineEnqueue) runs on s itself, so work
// enqueued on s later waits for it, unless the call is Detached.
func After(s streams.Stream) CallOption { return func(c *callConfig) { c.after = s } }

// Detached keeps the call's device work off the After stream: it runs on
// the Reducer's own streams, inline or not, so work enqueued on the After
// stream after the call runs on without waiting for it (a comm hook's
// backward pass). Work.StreamWait makes a stream wait for the result.
func Detached() CallOption { return func(c *callConfig) { c.detached = true } }

type kind int

const (
	kindAllReduce kind = iota
	kindReduceScatter
	kindAllGather
	kindBroadcast
	kindAllToAllv
)

var kindNames = [...]string{"allreduce", "reduce-scatter", "all-gather", "broadcast", "all-to-all"}

// request is one call waiting for the engine goroutine.
type request struct {
	kind       kind
	ctx        context.Context
	a, b       fairgo.Tensor // the buffer, or send (a) and receive (b)
	op         fairgo.Op
	root       int
	sendCounts []int64
	recvCounts []int64
	after      streams.Event // recorded on the caller's stream at call time
	work       *Work
	seq        uint64  // the call's number in this Reducer's call order, from 1
	rejected   error   // set when this rank refused the call: only its check runs
	check      *ticket // the outcome of the cross-rank check; nil without peers or when fp carries it alone
	posted     bool    // the call's check is in the shared memory of a one-machine job (hostcheck.go)
	fp         *fpCall // the fingerprint the call's data carries (fingerprint.go); nil otherwise
	// cursor is the shared memory's check where it checks the calls
	// around a fingerprinted one (checksByRoute): the call moves this
	// rank's cursor there once complete. Set where the call executes, read
	// where it completes (the watcher's channel orders the two).
	cursor *hostCheck
	// pairsFirst: fp with the separate check beside it
	// (fingerprintVouches), set before the call reaches the watcher, which
	// reads fp's pairs when the data is done, before the check ends
	// (readPairsFirst).
	pairsFirst bool

	// cc and w are the call's options and its Work, held here so that a
	// call costs one allocation for the three (the per-call host time is
	// part of a call's speed); work points at w once the call is
	// submitted.
	cc callConfig
	w  Work
}

func (q *request) String() string {
	return fmt.Sprintf("%s of %d %s", kindNames[q.kind], q.a.Count, q.a.DType)
}

// Reducer runs fairgo's collectives for one rank (one device). It is safe
// for concurrent use: calls from several goroutines are enqueued in the order
// they arrive.
//
// Its parts have one job each: the call queue and the engine goroutine
// (engine.go) keep the call order, the router (router.go) decides each
// allreduce's route and slice, the executor (pipeline.go) enqueues the
// device work, the checker (check.go) compares the calls across ranks, and
// the watcher (watch.go) completes the Works and runs the watchdog.
type Reducer struct {
	rank    backend.Rank // grid, device and communicators; released on Close when it owns them
	cfg     config
	events  eventPool
	calls   callQueue   // the calls waiting for the engine, in call order
	fail    breaker     // why the Reducer broke, once it did
	flight  inflightSet // the memory of calls whose device work may still run
	router  *router
	exec    *executor  // the engine goroutine's (or an inline caller's while it holds calls.busy)
	checker *checker   // the collective check; nil without peers or with host
	host    *hostCheck // the check through shared memory; nil otherwise
	// held is the call whose data the executing goroutine is enqueueing:
	// the watcher decides it if the enqueue is held (decideHeldCall).
	held atomic.Pointer[request]
	// relay is host's relay across machines, for the watcher and the
	// Waits that help, which flush it (relay.flush); nil otherwise.
	relay    atomic.Pointer[relay]
	fps      *fingerprints // nil unless small calls carry their check in their data (WithFingerprintMax)
	board    *bulletin     // nil without a Board
	watch    watcher       // completes Works in call order
	hooks    testHooks     // export_test.go's knobs
	done     chan struct{} // closed when the engine goroutine has exited
	closeErr error         // what the engine's release reported, for Close
}

// testHooks are the knobs export_test.go turns.
type testHooks struct {
	skipCheck     bool          // no cross-rank check
	inlined       atomic.Uint64 // calls enqueued on the caller's goroutine
	fingerprinted atomic.Uint64 // calls that took the fingerprinted collective (refused ones and failed enqueues included)
	checkedApart  atomic.Uint64 // calls handed to the separate check (checkLater)
	// allreduces Auto's calibration enqueued
	calibrationCalls atomic.Uint64
	watcherParks     atomic.Uint64 // times the watcher blocked for its next call
	watcherHeld      atomic.Bool   // the watcher takes no call while set
	helped           atomic.Uint64 // calls a Wait completed in the watcher's place
	watcherPolls     atomic.Uint64 // the watcher's queries of a call's completion event
	helpQueries      atomic.Uint64 // helping Waits' queries of a call's completion event
	checkerHeld      atomic.Bool   // the checker's goroutine decides no check while set
	relayHeld        atomic.Bool   // the relay reads in no message received while set
	// checks a helping Wait decided in the checker goroutine's place
	checksDecidedEarly atomic.Uint64
}

// NewReducer builds the engine of one rank from its device, grid and
// communicators, and starts its goroutine. Sim clusters and setup.New call it;
// trainers usually do not. ctx bounds the construction only. Reducers built
// over the same communicators must not have calls in flight at the same
// time (wait for one's Works before calling another): NCCL pairs the
// operations of a communicator in the order each rank enqueues them, and
// two Reducers' calls and checks would meet in different orders on
// different ranks.
func NewReducer(ctx context.Context, rk backend.Rank, opts ...Option) (*Reducer, error) {
	if ctx == nil {
		return nil, errNilContext
	}
	if err := rk.Validate(); err != nil {
		return nil, err
	}
	cfg, err := buildConfig(rk.Grid, opts)
	if err != nil {
		return nil, err
	}
	if rk.Grid.Size() > 1 { // a world of one rank never needs a world variant
		if err := cfg.checkRank(rk); err != nil {
			return nil, err
		}
	}
	table, err := cfg.sharedRoutes(rk.Grid, rk.Comms.World)
	if err != nil {
		return nil, err
	}
	cfg.routesOf = nil // the table is what it was for
	layout := cfg.layout
	r := &Reducer{
		rank: rk, cfg: cfg, events: eventPool{factory: rk.Device},
		calls: callQueue{wake: make(chan struct{}, 1)}, fail: breaker{aborted: make(chan struct{})},
		watch: watcher{ch: make(chan pending, 4096), done: make(chan struct{}), epoch: time.Now()}, done: make(chan struct{}),
	}
	r.exec = &executor{grid: rk.Grid, dev: rk.Device, comms: rk.Comms, layout: layout, skipWait: -1}
	r.router = newRouter(rk.Grid, &r.cfg, &calibrator{r: r}, table)
	if rk.Board != nil && rk.Grid.Size() > 1 {
		r.board = newBulletin(r, rk.Board)
	}
	ready := make(chan error, 1)
	go r.engine(ready)
	go r.watchCalls()
	select {
	case err := <-ready:
		if err != nil {
			<-r.done
			return nil, err
		}
	case <-ctx.Done():
		// The engine goroutine is starting; shut it down before returning.
		_ = r.Close()
		return nil, ctx.Err()
	}
	cfg.logger.Debug("fairgo reducer ready", "grid", rk.Grid.String(), "slice_bytes", layout.SliceBytes,
		"staging_slots", layout.StagingSlots, "padding_slots", layout.PaddingSlots, "flat_threshold", cfg.flatThreshold)
	return r, nil
}

// Grid is this rank's place in the M × D grid.
func (r *Reducer) Grid() Grid { return r.rank.Grid }

// Device is the device this Reducer enqueues on.
func (r *Reducer) Device() backend.Device { return r.rank.Device }

// WorldRank is this rank's index in the world communicator (the launcher's
// global order).
func (r *Reducer) WorldRank() int { return r.rank.Comms.World.Rank() }

// SliceBytes is the effective slice size.
func (r *Reducer) SliceBytes() int64 { return r.exec.layout.SliceBytes }

// FlatThreshold is the effective flat threshold in bytes (FlatNever when off).
func (r *Reducer) FlatThreshold() int64 { return r.cfg.flatThreshold }

// AllReduce reduces t in place across all ranks with op. It returns a Work
// at once; Wait, Done or StreamWait observe the result.
//
// It is a collective, as every call of a Reducer is: every rank makes the
// same calls (kind, count, element type, op, root) in the same order, and
// every rank must have made a call before any rank waits on its Work. In a
// process that drives several ranks (a sim cluster, setup.NewLocal), call
// AllReduce on every rank first, then Wait: a Wait on one rank before the
// others have made the call blocks until its context or the WithTimeout
// watchdog ends it (a simulated cluster reports a stall after its
// StallTimeout, 30 s by default, as an error that matches fairgo.ErrTimeout
// and says which ranks never made the call). A call that differs between ranks fails
// with fairgo.ErrMismatch on every rank; invalid arguments complete the
// Work with an *fairgo.ArgError before anything is enqueued.
func (r *Reducer) AllReduce(ctx context.Context, t fairgo.Tensor, op fairgo.Op, opts ...CallOption) *Work {
	q := &request{kind: kindAllReduce, a: t, op: op}
	if err := t.Validate(); err != nil {
		return r.reject(q, err)
	}
	if !op.Valid() {
		return r.reject(
			q,
			&fairgo.ArgError{Arg: "op", Value: op, Reason: "unknown reduction operator", Err: fairgo.ErrUnknownOp},
		)
	}
	return r.submit(ctx, q, opts)
}

// ReduceScatter reduces send (M·D·c elements, blocks in grid order m·D+d)
// across ranks with op; the rank at grid position g receives block g in recv
// (c elements). Grid().Rank() is this rank's block index. A collective
// (see AllReduce): every rank makes the same calls in the same order, each
// before any rank waits on its Work.
func (r *Reducer) ReduceScatter(ctx context.Context, send, recv fairgo.Tensor, op fairgo.Op, opts ...CallOption) *Work {
	q := &request{kind: kindReduceScatter, a: send, b: recv, op: op}
	w := int64(r.rank.Grid.Size())
	if err := r.checkPair(send, recv); err != nil {
		return r.reject(q, err)
	}
	if send.Count%w != 0 {
		return r.reject(
			q,
			&fairgo.ArgError{
				Arg:    "send count",
				Value:  send.Count,
				Reason: fmt.Sprintf("not a multiple of the %d ranks", w),
			},
		)
	}
	if err := r.checkCounts(send, recv, send.Count/w, "reduce-scatter"); err != nil {
		return r.reject(q, err)
	}
	if !op.Valid() {
		return r.reject(
			q,
			&fairgo.ArgError{Arg: "op", Value: op, Reason: "unknown reduction operator", Err: fairgo.ErrUnknownOp},
		)
	}
	return r.submit(ctx, q, opts)
}

// AllGather gathers every rank's send (c elements) into recv (M·D·c
// elements, blocks in grid order m·D+d). A collective (see AllReduce):
// every rank makes the same calls in the same order, each before any rank
// waits on its Work.
func (r *Reducer) AllGather(ctx context.Context, send, recv fairgo.Tensor, opts ...CallOption) *Work {
	q := &request{kind: kindAllGather, a: send, b: recv}
	if err := r.checkPair(send, recv); err != nil {
		return r.reject(q, err)
	}
	w := int64(r.rank.Grid.Size())
	if send.Count > (1<<62)/w {
		return r.reject(
			q,
			&fairgo.ArgError{Arg: "send count", Value: send.Count, Reason: "times the world size overflows"},
		)
	}
	if err := r.checkCounts(send, recv, send.Count*w, "all-gather"); err != nil {
		return r.reject(q, err)
	}
	return r.submit(ctx, q, opts)
}

// Broadcast copies t of the world rank root to t of every rank (flat, on the
// world communicator). A collective (see AllReduce): every rank makes the
// same calls in the same order, each before any rank waits on its Work.
func (r *Reducer) Broadcast(ctx context.Context, t fairgo.Tensor, root int, opts ...CallOption) *Work {
	q := &request{kind: kindBroadcast, a: t, root: root}
	if err := t.Validate(); err != nil {
		return r.reject(q, err)
	}
	if root < 0 || root >= r.rank.Grid.Size() {
		return r.reject(
			q,
			&fairgo.ArgError{Arg: "root", Value: root, Reason: fmt.Sprintf("outside [0, %d)", r.rank.Grid.Size())},
		)
	}
	return r.submit(ctx, q, opts)
}

// AllToAll sends block k of send to world rank k, and receives block k of
// recv from world rank k (flat, on the world communicator). Both hold
// WorldSize × c elements. A collective (see AllReduce): every rank makes the
// same calls in the same order, each before any rank waits on its Work.
func (r *Reducer) AllToAll(ctx context.Context, send, recv fairgo.Tensor, opts ...CallOption) *Work {
	q := &request{kind: kindAllToAllv, a: send, b: recv}
	w := int64(r.rank.Grid.Size())
	if err := r.checkPair(send, recv); err != nil {
		return r.reject(q, err)
	}
	if err := r.checkCounts(send, recv, send.Count, "all-to-all"); err != nil {
		return r.reject(q, err)
	}
	if send.Count%w != 0 {
		return r.reject(
			q,
			&fairgo.ArgError{
				Arg:    "count",
				Value:  send.Count,
				Reason: fmt.Sprintf("not a multiple of the world size %d", w),
			},
		)
	}
	q.sendCounts = sameCounts(int(w), send.Count/w)
	q.recvCounts = q.sendCounts
	return r.submit(ctx, q, opts)
}

// AllToAllv sends sendCounts[k] elements to world rank k, taken from send
// one block after the other, and receives recvCounts[k] elements from world
// rank k into recv likewise (flat, on the world communicator). A collective
// (see AllReduce): every rank makes the same calls in the same order, each
// before any rank waits on its Work.
func (r *Reducer) AllToAllv(
	ctx context.Context,
	send fairgo.Tensor,
	sendCounts []int64,
	recv fairgo.Tensor,
	recvCounts []int64,
	opts ...CallOption,
) *Work {
	q := &request{kind: kindAllToAllv, a: send, b: recv}
	if err := r.checkPair(send, recv); err != nil {
		return r.reject(q, err)
	}
	for _, c := range []struct {
		name   string
		t      fairgo.Tensor
		counts []int64
	}{{"sendCounts", send, sendCounts}, {"recvCounts", recv, recvCounts}} {
		if len(c.counts) != r.rank.Grid.Size() {
			return r.reject(
				q,
				&fairgo.ArgError{
					Arg:    c.name,
					Value:  len(c.counts),
					Reason: fmt.Sprintf("needs one count per rank (%d)", r.rank.Grid.Size()),
				},
			)
		}
		var total int64
		for _, n := range c.counts {
			if n < 0 || total > c.t.Count-n {
				return r.reject(
					q,
					&fairgo.ArgError{
						Arg:    c.name,
						Value:  c.counts,
						Reason: fmt.Sprintf("negative, or more than the tensor's %d elements", c.t.Count),
					},
				)
			}
			total += n
		}
	}
	q.sendCounts, q.recvCounts = append([]int64(nil), sendCounts...), append([]int64(nil), recvCounts...)
	return r.submit(ctx, q, opts)
}

// checkPair validates a send/receive pair and its element type.
func (r *Reducer) checkPair(send, recv fairgo.Tensor) error {
	if err := send.Validate(); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	if err := recv.Validate(); err != nil {
		return fmt.Errorf("recv: %w", err)
	}
	if send.DType != recv.DType {
		return &fairgo.ArgError{
			Arg:    "recv dtype",
			Value:  recv.DType,
			Reason: fmt.Sprintf("differs from send's %s", send.DType),
		}
	}
	return nil
}

// checkCounts reports recv.Count != want.
func (r *Reducer) checkCounts(send, recv fairgo.Tensor, want int64, what string) error {
	if recv.Count != want || want < 0 {
		return &fairgo.ArgError{Arg: "recv count", Value: recv.Count,
			Reason: fmt.Sprintf(
				"send has %d elements; %s over %d ranks needs %d",
				send.Count,
				what,
				r.rank.Grid.Size(),
				want,
			)}
	}
	return nil
}

// errNilContext is the error of a call given a nil context.
var errNilContext = &fairgo.ArgError{Arg: "ctx", Value: nil, Reason: "a nil context; use context.Background()"}

// reject fails a call this rank refused. With peers, the call still takes
// its place in the call order and its check runs, marked rejected: peers
// that accepted it learn of it as a mismatch instead of waiting for data
// that will never come.
func (r *Reducer) reject(q *request, err error) *Work {
	w := failedWork(err)
	if r.rank.Grid.Size() == 1 {
		return w
	}
	q.work, q.rejected = w, err
	c := &r.calls
	c.mu.Lock()
	if c.closed || r.brokenCause() != nil {
		c.mu.Unlock()
		return w
	}
	c.seq++
	q.seq = c.seq
	c.items = append(c.items, q)
	c.mu.Unlock()
	r.kick()
	return w
}

// submit queues a validated request for the engine goroutine. A context
// already done, or nil, rejects the call with the context's cause (its
// error unless cancelled with a cause: context.WithCancelCause lets a
// caller refuse a call in its place in the call order with a reason of its
// own, which the peers then read); once a call is queued its device work is
// enqueued whatever happens to ctx later, so that the ranks stay in step.
func (r *Reducer) submit(ctx context.Context, q *request, opts []CallOption) *Work {
	if ctx == nil {
		return r.reject(q, errNilContext)
	}
	if ctx.Err() != nil {
		return r.reject(q, context.Cause(ctx))
	}
	for _, o := range opts {
		if o != nil {
			o(&q.cc)
		}
	}
	cc := q.cc
	q.ctx = ctx
	q.w.spin, q.w.r = r.cfg.spin, r
	q.work = &q.w
	c := &r.calls
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return failedWork(fmt.Errorf("hier: %v: %w", q, fairgo.ErrClosed))
	}
	if cause := r.brokenCause(); cause != nil {
		c.mu.Unlock()
		return failedWork(brokenErr(q, cause))
	}
	if r.inlineLocked(q) {
		// Nothing is queued before this one-collective call: enqueue it
		// here, on the caller's stream, without the engine's hand-off and
		// events; a detached call on the Reducer's first stream after an
		// event of the caller's.
		first := cc.after
		if first != nil && cc.detached {
			ev, err := r.afterEvent(first)
			if err != nil {
				c.mu.Unlock()
				return r.reject(q, fmt.Errorf("hier: %v: %w", q, err))
			}
			q.after, first = ev, nil
		}
		if first == nil {
			first = r.exec.first()
		}
		c.seq++
		q.seq = c.seq
		c.busy, c.busySince, c.busySeq = true, time.Now(), q.seq
		c.mu.Unlock()
		r.execute(q, first)
		r.hooks.inlined.Add(1)
		r.idle()
		return q.work
	}
	if cc.after != nil {
		// Recorded under the lock, so the capture happens before any later
		// call on this Reducer and in the caller's program order.
		ev, err := r.afterEvent(cc.after)
		if err != nil {
			c.mu.Unlock()
			return r.reject(q, fmt.Errorf("hier: %v: %w", q, err))
		}
		q.after = ev
	}
	c.seq++
	q.seq = c.seq
	c.items = append(c.items, q)
	c.mu.Unlock()
	r.kick()
	return q.work
}

// afterEvent records an event of the pool on s, the call's After stream.
func (r *Reducer) afterEvent(s streams.Stream) (streams.Event, error) {
	ev, err := r.events.get()
	if err == nil {
		err = ev.Record(s)
	}
	if err != nil {
		r.events.put(ev)
		return nil, fmt.Errorf("recording the After event: %w", err)
	}
	return ev, nil
}

// inlineLocked reports whether q may be enqueued on the calling goroutine
// (r.calls.mu held): WithInlineEnqueue is on, no earlier call waits for the
// engine, and q starts on the call's first stream (dispatch) with nothing
// collective to do before its data: an allreduce whose plan is known and
// takes it in one piece or one slice (router.inlineable), a broadcast,
// or a reduce-scatter or all-gather on one machine (executor.direct).
// The hierarchical reduce-scatter and all-gather, and an allreduce of
// several slices, go through the engine, which enqueues their slices while
// the caller goes on.
func (r *Reducer) inlineLocked(q *request) bool {
	c := &r.calls
	g := r.rank.Grid
	if !r.cfg.inline || len(c.items) > 0 || c.busy || g.Size() == 1 {
		return false
	}
	switch q.kind {
	case kindAllReduce:
		return q.a.Count > 0 && r.router.inlineable(q.a.ByteLen())
	case kindBroadcast:
		return q.a.Count > 0
	case kindReduceScatter:
		return q.b.Count > 0 && g.Machines == 1
	case kindAllGather:
		return q.a.Count > 0 && g.Machines == 1
	}
	return false
}

// idle ends the current execution (the engine goroutine's, or an inline
// caller's).
// The engine is woken only when it has something to do (a queued call,
// or Close waiting for the execution to end): waking it after every inline
// call would cost the caller a wake-up and the engine its spin.
func (r *Reducer) idle() {
	c := &r.calls
	c.mu.Lock()
	c.busy = false
	wake := len(c.items) > 0 || c.closed
	c.mu.Unlock()
	if wake {
		r.kick()
	}
}

func (r *Reducer) kick() { notify(r.calls.wake) }

// notify wakes the goroutine waiting on ch (a channel of capacity one)
// without blocking: a wake already pending is enough.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Close stops the Reducer. The checks of calls this rank refused still run
// (the peers run theirs: a call refused on every rank costs Close nothing);
// other calls not yet enqueued on the device fail with fairgo.ErrClosed; device work still running gets a short grace period and
// is then aborted, failing with an error that wraps fairgo.ErrClosed. Close
// frees the engine's device memory, and the device and communicators when the
// Rank said so. A second Close returns fairgo.ErrClosed. Closing destroys
// the world variants' communicators, which NCCL may do together with the
// peers: a process that drives several ranks closes them with CloseAll, not
// one after the other (one rank's Close could wait for a peer's that has
// not begun, until its grace period aborts it).
func (r *Reducer) Close() error {
	c := &r.calls
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fairgo.ErrClosed
	}
	c.closed = true
	// The calls this rank refused at the head of the queue keep their place:
	// their Works failed at the call, so a trainer that waited on every Work
	// closes with their checks still queued, while a peer's engine may
	// already have enqueued the same checks; dropping them left the peers'
	// checks waiting for this rank until Close's grace ran out and aborted
	// the communicators (4 s). The engine runs them before it exits. From
	// the first call this rank accepted on, calls fail with ErrClosed:
	// checks after a dropped call would meet the wrong calls on the peers.
	keep := 0
	for keep < len(c.items) && c.items[keep].rejected != nil {
		keep++
	}
	queued := c.items[keep:]
	c.items = c.items[:keep:keep]
	c.mu.Unlock()
	for _, q := range queued {
		q.work.finish(fmt.Errorf("hier: %v: %w", q, fairgo.ErrClosed))
		if q.after != nil {
			r.events.put(q.after)
		}
	}
	r.kick()
	select {
	case <-r.done:
	case <-time.After(2 * r.closeGrace()):
		// A call stuck in its enqueue (NCCL blocking the caller's thread)
		// keeps the engine from exiting: aborting ends it.
		r.abort(fmt.Errorf("%w: the Reducer was closed while a call was stuck in its enqueue", fairgo.ErrClosed))
		<-r.done
	}
	return r.closeErr
}

// abort aborts every communicator once; later calls fail with cause.
//
// The aborts run on goroutines of their own, all at once: ncclCommAbort
// may take its time (or hang) while a peer is dead, freeing memory can wait
// for another communicator's kernels until that one is aborted too, and the
// failure must reach the caller regardless. The engine waits for them (closeGrace at most) before
// it destroys the communicators.
func (r *Reducer) abort(cause error) {
	f := &r.fail
	f.mu.Lock()
	if f.cause != nil && reaction(f.cause) && !reaction(cause) {
		// A peer's abort reached this rank first; the root cause (the
		// mismatch or timeout it reacted to) is what Err reports.
		f.cause = cause
	}
	f.mu.Unlock()
	f.once.Do(func() {
		f.mu.Lock()
		if f.cause == nil { // else causeFirst recorded the cause ahead of this abort
			f.cause = cause
		}
		logged := f.cause
		f.mu.Unlock()
		r.postMismatch(logged) // before the communicators go, and the check's last pieces with them
		r.cfg.logger.Warn("fairgo: aborting communicators", "grid", r.rank.Grid.String(), "cause", logged)
		var wg sync.WaitGroup
		for _, c := range r.commList() {
			wg.Add(1)
			go func() { // all at once: one abort can wait on the device for the kernels of another communicator
				defer wg.Done()
				_ = c.Abort()
			}()
		}
		go func() {
			wg.Wait()
			close(r.fail.aborted)
		}()
	})
}

// causeFirst records cause as the Reducer's failure ahead of the abort
// that follows it (abort(cause)), unless a cause is recorded already.
func (r *Reducer) causeFirst(cause error) {
	r.fail.mu.Lock()
	defer r.fail.mu.Unlock()
	if r.fail.cause == nil {
		r.fail.cause = cause
	}
}

// abortsFinished waits, up to d, for the aborts abort started (true when
// none was started).
func (r *Reducer) abortsFinished(d time.Duration) bool {
	if r.brokenCause() == nil {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.fail.aborted:
		return true
	case <-t.C:
		return false
	}
}

// reaction reports whether err is only an abort (a communicator a peer
// aborted), not the cause that made a rank abort.
func reaction(err error) bool {
	return errors.Is(err, fairgo.ErrAborted) && !errors.Is(err, fairgo.ErrMismatch) &&
		!errors.Is(err, fairgo.ErrTimeout)
}

func (r *Reducer) brokenCause() error {
	r.fail.mu.Lock()
	defer r.fail.mu.Unlock()
	return r.fail.cause
}

// breaker is why the Reducer broke, once it did: the first cause of the
// communicators' abort (a root cause replaces a mere reaction to a peer's
// abort).
type breaker struct {
	mu      sync.Mutex
	cause   error
	once    sync.Once
	aborted chan struct{} // closed when abort's communicator aborts have returned
}

// Err reports why the Reducer is broken, or nil. A Reducer breaks when its
// communicators were aborted: a timeout (fairgo.ErrTimeout, here or on a
// peer), a failed peer or communicator (fairgo.ErrAborted), or calls that
// did not match across ranks (fairgo.ErrMismatch). A broken Reducer fails
// every later call at once with an error wrapping fairgo.ErrClosed and the
// cause; Close it and build a new one.
func (r *Reducer) Err() error { return r.brokenCause() }

// brokenErr is the error of a call made on a broken Reducer.
func brokenErr(q *request, cause error) error {
	return fmt.Errorf("hier: %v: the Reducer is broken: %w (%w)", q, fairgo.ErrClosed, cause)
}

// commList is the distinct non-nil communicators, with the world variants
// the router made (FlatRing, FlatTree): an abort must end their work too,
// or a call hung on one (ranks that disagreed on its count) blocks every
// later free of device memory.
func (r *Reducer) commList() []backend.Comm {
	return append(r.rank.Comms.Distinct(), r.router.worldComms()...)
}

// closeGrace is how long Close lets running device work finish before it
// aborts the communicators.
func (r *Reducer) closeGrace() time.Duration {
	if r.cfg.timeout > 0 && r.cfg.timeout < 2*time.Second {
		return r.cfg.timeout
	}
	return 2 * time.Second
}

// eventPool recycles events; safe for concurrent use.
type eventPool struct {
	factory streams.Factory
	mu      sync.Mutex
	free    []streams.Event
}

func (p *eventPool) get() (streams.Event, error) {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		ev := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return ev, nil
	}
	p.mu.Unlock()
	return p.factory.NewEvent()
}

func (p *eventPool) put(ev streams.Event) {
	if ev == nil {
		return
	}
	p.mu.Lock()
	p.free = append(p.free, ev)
	p.mu.Unlock()
}

// release destroys the pooled events.
func (p *eventPool) release() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, ev := range p.free {
		errs = append(errs, streams.Release(ev))
	}
	p.free = nil
	return errors.Join(errs...)
}

// CloseAll closes Reducers concurrently and joins their errors (a Reducer
// already closed is not an error). A process that drives several ranks
// closes them with it (see Close).
func CloseAll(rs []*Reducer) error {
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		if r == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Close(); err != nil && !errors.Is(err, fairgo.ErrClosed) {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Choices is the algorithm of every size class, ascending by MinBytes,
// starting at 0 (on one machine: Flat throughout). With Auto, a class is
// measured by the first call that falls in it.
func (r *Reducer) Choices() []Choice { return r.router.choices() }

// AlgorithmFor is the algorithm an allreduce of bytes bytes uses.
func (r *Reducer) AlgorithmFor(bytes int64) Algorithm { return r.ChoiceFor(bytes).Algorithm }

// ChoiceFor is the choice an allreduce of bytes bytes follows: its size
// class's, except where Auto's sliced rail would take the call in one
// slice, which runs as the hierarchy in one piece (RailAllReduce, with the
// class's Calibration).
func (r *Reducer) ChoiceFor(bytes int64) Choice { return r.router.choiceFor(bytes) }
