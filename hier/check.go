package hier

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/streams"
)

// The cross-rank check. Every call's shape (kind, element type, operator,
// root, counts, and whether this rank accepted it) is compared across
// ranks by an allreduce with Max of the shapes and their negations on the
// check communicator, on a stream of its own: the data never waits for it,
// and a Work completes only once both its data and its check are done. A
// mismatch ends the Work with a *MismatchError on every rank alike (they
// all see the same maxima) and aborts the communicators, since mismatched
// collectives may never finish.
//
// A check goes out once a pending call is due: its data is done (or it has
// none: a rejected call, a call with nothing to do), checkBatch calls are
// pending, or the oldest has waited checkDelay. So the check runs after
// the data rather than beside it, where its communicator's threads would
// compete with the data's for the host (on NCCL's socket transport they
// spin while an operation is in flight), and one check covers the calls
// made meanwhile; the delay bounds how long a mismatch whose data hangs
// goes unnoticed. A Work completes once its data and its check are done;
// StreamWait orders the caller's stream after the data alone.
// Ranks may batch differently: entry i of every rank's batch is the i-th
// call not yet decided (the same call on every rank, since all ranks decide
// alike), tagged with its number; a call is decided once every rank has put
// it in a batch, and is carried over to the next batch otherwise. Every
// batch is one allreduce of the same size, so the k-th batches of all ranks
// meet.
//
// A rank that skips a call whose shape equals the next one's cannot be told
// apart by shapes: its calls pair up with the wrong ones and the last call
// of the other ranks never meets a peer. That ends in the watchdog's
// timeout (WithTimeout), whose error says which call each rank reached.

// checkFields are the fields of a call's shape, in the order encoded.
var checkFields = [...]string{"kind", "element type", "operator", "root", "count", "receive count", "acceptance"}

const (
	nFields    = len(checkFields)
	entryWords = 1 + nFields // the call's number, then its shape
	checkBatch = 32          // calls per batch
	batchWords = 2 * checkBatch * entryWords
	// checkDelay is how long a call waits for its check when its data is
	// not done yet.
	checkDelay = 5 * time.Millisecond
)

// shape is what the check compares: a call's fields, each encoded so that 0
// means "not part of this call". The last field tells a call this rank
// accepted from one it rejected (invalid arguments, a context already
// done): ranks that disagree on it would otherwise wait on each other.
type shape [nFields]int64

func shapeOf(q *request) shape {
	s := shape{int64(q.kind) + 1, int64(q.a.DType) + 1}
	if q.rejected == nil {
		s[6] = 1
	}
	switch q.kind {
	case kindAllReduce:
		s[2], s[4] = int64(q.op)+1, q.a.Count
	case kindReduceScatter:
		s[2], s[4], s[5] = int64(q.op)+1, q.a.Count, q.b.Count
	case kindAllGather:
		s[4], s[5] = q.a.Count, q.b.Count
	case kindBroadcast:
		s[3], s[4] = int64(q.root)+1, q.a.Count
	case kindAllToAllv:
		// Per-pair counts differ between ranks by design; NCCL and the sim
		// match each send with its receive.
	}
	return s
}

// batch is the host image of one check: checkBatch entries of the call
// number and shape, then their negations.
type batch []byte

func (b batch) word(neg bool, entry, w int) int {
	i := entry*entryWords + w
	if neg {
		i += checkBatch * entryWords
	}
	return 8 * i
}

func (b batch) get(neg bool, entry, w int) int64 {
	return int64(binary.LittleEndian.Uint64(b[b.word(neg, entry, w):]))
}

func (b batch) set(neg bool, entry, w int, v int64) {
	binary.LittleEndian.PutUint64(b[b.word(neg, entry, w):], uint64(v))
}

// put writes call q's entry (and its negation); an unused entry is zero.
func (b batch) put(entry int, q *request) {
	sh := shapeOf(q)
	vals := append([]int64{int64(q.seq)}, sh[:]...)
	for w, v := range vals {
		b.set(false, entry, w, v)
		b.set(true, entry, w, -v)
	}
}

// decide reads entry i of a reduced batch for call q: decided is false when
// some rank had not made the call yet; otherwise err is nil or the
// mismatch.
func (b batch) decide(entry int, q *request) (decided bool, err error) {
	seqHi, seqLo := b.get(false, entry, 0), -b.get(true, entry, 0)
	if seqHi != int64(q.seq) || seqLo != int64(q.seq) {
		return false, nil
	}
	mine := shapeOf(q)
	for f := range nFields {
		hi, lo := b.get(false, entry, 1+f), -b.get(true, entry, 1+f)
		if hi != lo {
			return true, &MismatchError{Seq: q.seq, Call: q.String(), Field: checkFields[f],
				This: fieldValue(f, mine[f]), Low: fieldValue(f, lo), High: fieldValue(f, hi)}
		}
	}
	return true, nil
}

// fieldValue renders an encoded field.
func fieldValue(i int, v int64) string {
	switch {
	case i == 6 && v == 1:
		return "accepted"
	case i == 6:
		return "rejected"
	case i >= 4:
		return fmt.Sprint(v)
	case v == 0:
		return "none"
	case i == 0 && int(v-1) < len(kindNames):
		return kindNames[v-1]
	case i == 1:
		return fairgo.DType(v - 1).String()
	case i == 2:
		return fairgo.Op(v - 1).String()
	}
	return fmt.Sprint(v - 1)
}

// MismatchError reports a call whose shape differs between ranks. Every
// rank reports it for the same call, with the same range of values. It
// wraps fairgo.ErrMismatch.
type MismatchError struct {
	Seq       uint64 // the call's number in this Reducer's call order, from 1
	Call      string // this rank's call
	Field     string // the first field that differs: "count", "operator", ...
	This      string // this rank's value
	Low, High string // the lowest and highest value among the ranks
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf(
		"hier: call %d (%s) mismatched across ranks: they disagree on the %s: this rank has %s, the ranks have %s to %s",
		e.Seq,
		e.Call,
		e.Field,
		e.This,
		e.Low,
		e.High,
	)
}

// Unwrap returns fairgo.ErrMismatch.
func (e *MismatchError) Unwrap() error { return fairgo.ErrMismatch }

// ticket is the outcome of one call's check.
type ticket struct {
	done  chan struct{}
	err   error
	since time.Time // when the call reached the checker
}

func (t *ticket) finish(err error) {
	t.err = err
	close(t.done)
}

// checker runs the checks of one Reducer, in call order, on a goroutine of
// its own.
type checker struct {
	r      *Reducer
	comm   backend.Comm
	stream streams.Stream
	dev    uintptr // one batch on the device
	host   batch   // its twin in host memory the device copies without blocking
	ev     streams.Event

	mu      sync.Mutex
	pending []*request // submitted and not decided, in call order
	due     uint64     // the highest call whose check is wanted now
	closing bool
	wake    chan struct{}
	stopped chan struct{}
}

// startChecker allocates the check buffers and starts the checker's
// goroutine; the engine goroutine calls it.
func (r *Reducer) startChecker() error {
	c := &checker{r: r, comm: r.rank.Comms.Check, wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	var err error
	if c.stream, err = r.rank.Device.NewStream(); err != nil {
		return fmt.Errorf("hier: the check stream: %w", err)
	}
	if c.dev, err = r.rank.Device.Alloc(int64(8 * batchWords)); err != nil {
		return errors.Join(fmt.Errorf("hier: the check buffer: %w", err), c.release())
	}
	host, err := r.rank.Device.AllocHost(8 * batchWords)
	if err != nil {
		return errors.Join(fmt.Errorf("hier: the check buffer's host memory: %w", err), c.release())
	}
	c.host = host
	if c.ev, err = r.rank.Device.NewEvent(); err != nil {
		return errors.Join(fmt.Errorf("hier: the check event: %w", err), c.release())
	}
	r.checker = c
	go c.run()
	return nil
}

// submit hands a call to the checker; calls arrive in call order. A call
// this rank refused is due at once: its peers may be waiting in its data.
func (c *checker) submit(q *request) {
	q.check = &ticket{done: make(chan struct{}), since: time.Now()}
	c.mu.Lock()
	c.pending = append(c.pending, q)
	if q.rejected != nil {
		c.due = max(c.due, q.seq)
	}
	first := len(c.pending) == 1 || q.rejected != nil || len(c.pending) >= checkBatch
	c.mu.Unlock()
	if first { // the checker's timer starts with the oldest call, and a full batch goes at once
		c.kick()
	}
}

// want makes the checks of the calls up to seq due (the watcher found
// their data done).
func (c *checker) want(seq uint64) {
	c.mu.Lock()
	kick := seq > c.due
	c.due = max(c.due, seq)
	c.mu.Unlock()
	if kick {
		c.kick()
	}
}

func (c *checker) kick() { notify(c.wake) }

// stop ends the checker and frees its resources. The engine calls it after
// the watcher has finished: calls still undecided then (their peers never
// made them, or the Reducer broke) fail with ErrClosed.
func (c *checker) stop() error {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	c.kick()
	<-c.stopped
	return c.release()
}

func (c *checker) release() error {
	errs := []error{streams.Release(c.stream), streams.Release(c.ev)}
	if c.dev != 0 {
		errs = append(errs, c.r.rank.Device.Free(c.dev))
	}
	if c.host != nil {
		errs = append(errs, c.r.rank.Device.FreeHost(c.host))
	}
	return errors.Join(errs...)
}

// run sends out batches while calls are pending, and exits on stop. It
// does not Bind: its few calls per batch set the device's context each, and
// a goroutine locked to its OS thread that polls an event (yielding between
// queries) makes the Go scheduler hand processors between threads at every
// yield, which cost the enqueueing caller 50–150 µs a call on the GPU
// (bench/NOTES.md item 23).
func (c *checker) run() {
	defer close(c.stopped)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		c.mu.Lock()
		n, closing := len(c.pending), c.closing
		var wait time.Duration
		if n > 0 && c.pending[0].seq > c.due && n < checkBatch {
			wait = checkDelay - time.Since(c.pending[0].check.since)
		}
		c.mu.Unlock()
		switch {
		case closing || c.r.brokenCause() != nil && n > 0:
			c.failPending(fmt.Errorf("hier: the call's check did not complete: %w", c.closedCause()))
			if closing {
				return
			}
			continue
		case n > 0 && wait <= 0:
			if err := c.send(); err != nil {
				c.r.abort(fmt.Errorf("%w: hier: the consistency check failed: %w", fairgo.ErrAborted, err))
			}
			continue
		case n > 0:
			timer.Reset(wait)
			select {
			case <-c.wake:
			case <-timer.C:
			}
			timer.Stop()
			continue
		}
		<-c.wake
	}
}

// closedCause is what undecided checks fail with at the end.
func (c *checker) closedCause() error {
	if cause := c.r.brokenCause(); cause != nil {
		return cause
	}
	return fairgo.ErrClosed
}

func (c *checker) failPending(err error) {
	c.mu.Lock()
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	for _, q := range pending {
		q.check.finish(err)
	}
}

// send sends one batch, waits for it and settles the calls it decides.
func (c *checker) send() error {
	c.mu.Lock()
	calls := append([]*request(nil), c.pending[:min(len(c.pending), checkBatch)]...)
	c.mu.Unlock()
	clear(c.host)
	for i, q := range calls {
		c.host.put(i, q)
	}
	err := c.r.rank.Device.CopyFromHostAsync(c.dev, c.host, c.stream)
	if err == nil {
		err = c.comm.AllReduce(c.dev, c.dev, int64(batchWords), fairgo.Int64, fairgo.Max, c.stream)
	}
	if err == nil {
		err = c.r.rank.Device.CopyToHostAsync(c.host, c.dev, c.stream)
	}
	if err == nil {
		err = c.ev.Record(c.stream)
	}
	if err == nil {
		err = c.await()
	}
	if err != nil {
		return err
	}
	decided := 0
	for i, q := range calls {
		ok, verdict := c.host.decide(i, q)
		if !ok {
			break // later calls are missing on that rank too
		}
		decided++
		if verdict != nil {
			c.r.abort(verdict)
		}
		q.check.finish(verdict)
	}
	c.mu.Lock()
	c.pending = c.pending[decided:]
	c.mu.Unlock()
	return nil
}

// await waits for the batch's event; after an abort it gives the device
// work abortGrace to end.
func (c *checker) await() error {
	var abortedAt time.Time
	for {
		ctx, cancel := context.WithTimeout(context.Background(), watchPoll)
		_ = c.ev.Wait(ctx)
		cancel()
		if done, err := c.ev.Query(); done {
			return err
		}
		if cause := c.r.brokenCause(); cause != nil {
			if abortedAt.IsZero() {
				abortedAt = time.Now()
			} else if time.Since(abortedAt) > abortGrace {
				return fmt.Errorf("hier: a check did not end within %v of the abort: %w", abortGrace, cause)
			}
		}
	}
}
