package hier

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/streams"
)

// The cross-rank check. Every call's shape (kind, element type, operator,
// root and counts) is compared across ranks by a small allreduce of the
// shape and its negation with Max on the check communicator, on a stream of
// its own: the data never waits for it, and a Work completes only once both
// its data and its check are done. A mismatch ends the Work with a
// *MismatchError on every rank alike (they all see the same maxima), and
// aborts the communicators, since mismatched collectives may never finish.
//
// A rank that skips a call whose shape equals the next one's cannot be told
// apart by shapes: its calls pair up with the wrong ones and the last call
// of the other ranks never meets a peer. That ends in the watchdog's
// timeout (WithTimeout), whose error says which call each rank reached.

// checkFields are the fields of a call's shape, in the order encoded.
var checkFields = [...]string{"kind", "element type", "operator", "root", "count", "receive count", "acceptance"}

const (
	nFields       = len(checkFields)
	checkSlotSize = 2 * nFields * 8 // the shape and its negation, int64 each
	checkSlots    = 32              // checks in flight
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

// encode writes the shape and its negation.
func (s shape) encode(b []byte) {
	for i, v := range s {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
		binary.LittleEndian.PutUint64(b[8*(nFields+i):], uint64(-v))
	}
}

// verdict compares this rank's shape with the maxima of all ranks' shapes
// and negated shapes: every rank agrees when max == min for every field.
func (s shape) verdict(q *request, reduced []byte) error {
	for i, v := range s {
		hi := int64(binary.LittleEndian.Uint64(reduced[8*i:]))
		lo := -int64(binary.LittleEndian.Uint64(reduced[8*(nFields+i):]))
		if hi != lo {
			return &MismatchError{Seq: q.seq, Call: q.String(), Field: checkFields[i],
				This: fieldValue(i, v), Low: fieldValue(i, lo), High: fieldValue(i, hi)}
		}
	}
	return nil
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
	return fmt.Sprintf("hier: call %d (%s): the ranks disagree on the %s: this rank has %s, the ranks have %s to %s",
		e.Seq, e.Call, e.Field, e.This, e.Low, e.High)
}

// Unwrap returns fairgo.ErrMismatch.
func (e *MismatchError) Unwrap() error { return fairgo.ErrMismatch }

// ticket is the outcome of one call's check.
type ticket struct {
	done chan struct{}
	err  error
}

func (t *ticket) finish(err error) {
	t.err = err
	close(t.done)
}

// checker runs the checks of one Reducer in call order: a launcher enqueues
// each check on the check stream, a verifier reads the outcomes back as
// they complete.
type checker struct {
	r       *Reducer
	comm    Comm
	stream  streams.Stream
	base    uintptr // checkSlots slots of checkSlotSize bytes on the device
	host    []byte  // their twins in host memory the device copies without blocking
	events  []streams.Event
	free    chan int // slots not in use
	queue   chan *request
	landed  chan checkInFlight
	stopped chan struct{}
}

type checkInFlight struct {
	q    *request
	slot int
	s    shape
}

// startChecker allocates the check slots and starts the checker's
// goroutines; the engine goroutine calls it.
func (r *Reducer) startChecker() error {
	c := &checker{r: r, comm: r.comms.Check, free: make(chan int, checkSlots),
		queue: make(chan *request, 1<<16), landed: make(chan checkInFlight, checkSlots), stopped: make(chan struct{})}
	var err error
	if c.stream, err = r.dev.NewStream(); err != nil {
		return fmt.Errorf("hier: the check stream: %w", err)
	}
	if c.base, err = r.dev.Alloc(int64(checkSlots * checkSlotSize)); err != nil {
		return errors.Join(fmt.Errorf("hier: the check slots: %w", err), streams.Release(c.stream))
	}
	if c.host, err = r.dev.AllocHost(checkSlots * checkSlotSize); err != nil {
		return errors.Join(fmt.Errorf("hier: the check slots' host memory: %w", err), c.release())
	}
	for i := range checkSlots {
		ev, err := r.dev.NewEvent()
		if err != nil {
			return errors.Join(fmt.Errorf("hier: a check event: %w", err), c.release())
		}
		c.events = append(c.events, ev)
		c.free <- i
	}
	r.checker = c
	go c.launch()
	go c.verify()
	return nil
}

// submit hands a call to the checker; calls arrive in call order.
func (c *checker) submit(q *request) {
	q.check = &ticket{done: make(chan struct{})}
	c.queue <- q
}

// stop ends the checker once every submitted check is done, and frees its
// resources. The engine calls it after its last submit.
func (c *checker) stop() error {
	close(c.queue)
	<-c.stopped
	return c.release()
}

func (c *checker) release() error {
	errs := []error{streams.Release(c.stream)}
	for _, ev := range c.events {
		errs = append(errs, streams.Release(ev))
	}
	if c.base != 0 {
		errs = append(errs, c.r.dev.Free(c.base))
	}
	if c.host != nil {
		errs = append(errs, c.r.dev.FreeHost(c.host))
	}
	return errors.Join(errs...)
}

// slot is check slot i: its device address and its host twin.
func (c *checker) slot(i int) (uintptr, []byte) {
	return c.base + uintptr(i*checkSlotSize), c.host[i*checkSlotSize : (i+1)*checkSlotSize]
}

// launch enqueues the check of every call, in call order.
func (c *checker) launch() {
	defer close(c.landed)
	release, err := c.r.dev.Bind()
	if err != nil {
		c.failAll(fmt.Errorf("hier: binding the checker to the device: %w", err))
		return
	}
	defer release()
	for q := range c.queue {
		i := <-c.free // its previous check has been read back
		s := shapeOf(q)
		slot, host := c.slot(i)
		s.encode(host)
		err := c.r.dev.CopyFromHostAsync(slot, host, c.stream)
		if err == nil {
			err = c.comm.AllReduce(slot, slot, int64(2*nFields), fairgo.Int64, fairgo.Max, c.stream)
		}
		if err == nil {
			err = c.r.dev.CopyToHostAsync(host, slot, c.stream)
		}
		if err == nil {
			err = c.events[i].Record(c.stream)
		}
		if err != nil {
			err = fmt.Errorf("hier: %v: enqueueing its check: %w", q, err)
			c.r.abort(fmt.Errorf("%w: %w", fairgo.ErrAborted, err))
			q.check.finish(err)
			c.free <- i
			continue
		}
		c.landed <- checkInFlight{q: q, slot: i, s: s}
	}
}

// failAll fails every queued check with err.
func (c *checker) failAll(err error) {
	for q := range c.queue {
		q.check.finish(err)
	}
}

// verify reads back each check as it completes, in call order, and fails a
// mismatched call (aborting the communicators).
func (c *checker) verify() {
	defer close(c.stopped)
	for f := range c.landed {
		err := c.await(f)
		if err == nil {
			_, host := c.slot(f.slot)
			if err = f.s.verdict(f.q, host); err != nil {
				c.r.abort(err)
			}
		}
		f.q.check.finish(err)
		c.free <- f.slot
	}
}

// await waits for the check's event; after an abort it gives the device
// work abortGrace to end.
func (c *checker) await(f checkInFlight) error {
	ev := c.events[f.slot]
	var abortedAt time.Time
	for {
		ctx, cancel := context.WithTimeout(context.Background(), watchPoll)
		_ = ev.Wait(ctx)
		cancel()
		if done, err := ev.Query(); done {
			if err != nil {
				return fmt.Errorf("hier: %v: its check: %w", f.q, err)
			}
			return nil
		}
		if c.r.brokenCause() != nil {
			if abortedAt.IsZero() {
				abortedAt = time.Now()
			} else if time.Since(abortedAt) > abortGrace {
				return fmt.Errorf("hier: %v: its check did not end within %v of the abort: %w", f.q, abortGrace, c.r.brokenCause())
			}
		}
	}
}
