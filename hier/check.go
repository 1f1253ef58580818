package hier

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/streams"
)

// The cross-rank check. Every call's shape (kind, element type, operator,
// root, counts, and whether this rank accepted it) is compared across
// ranks (on one machine, from call hostFirstCall, through shared memory:
// hostcheck.go) by an allreduce with Max of the shape and its negation on the check
// communicator, on a stream of its own (in page-locked host memory that the
// collective reduces in place, where the device maps it: no copy each way):
// the data never waits for it, and a
// Work completes only once both its data and its check are done. A
// mismatch ends the Work with a *MismatchError on every rank alike (they
// all see the same maxima) and aborts the communicators, since mismatched
// collectives may never finish.
//
// Every rank submits a call's check after the call's data and before the
// next call's device work, so that the check communicator's operations sit
// at the same place among the data communicators' ones on every rank. NCCL
// asks for that of communicators used at once ("operations submitted in the
// same order across ranks"): a check sent at a time of the rank's own
// choosing (a batch when a call's data is done, or after a delay) met a
// data operation in one order on one rank and in the other on another, and
// on a shared GPU that hung now and then (bench/NOTES.md items 27 and 30).
//
// The goroutine that executes the call (the engine's, or an inline
// caller's) submits its check right after its data: the check's NCCL
// launch is on the call's path, but the check runs beside the data from
// its start on every rank. Left to a goroutine of its own, woken for each
// call, the check started as late as the slowest rank's wake-up, which
// on a busy host (several ranks per GPU under MPS) held calls up by
// hundreds of µs (bench/NOTES.md item 87). The check's host side after
// its launch (the wait for its event and the verdict) runs on the
// checker's goroutine, in call order; a Wait that helps (watch.go) and
// finds the check done and matched decides it in its place
// (decideEarly), so that the goroutine's wake-up is not on the call's path.
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
	// refuserWord follows the entry and its negation: W − the world rank of
	// a rank that refused the call, 0 on a rank that accepted it; its
	// maximum names the lowest refusing rank. It is not compared: every
	// rank's differs when several refuse.
	refuserWord = 2 * entryWords
	// tokenWord and mappedWord carry the agreement on a one-machine job's
	// shared memory (hostcheck.go) in the checks of two calls; 0 in the
	// others. Neither is compared.
	tokenWord  = refuserWord + 1
	failedWord = refuserWord + 2
	imageWords = refuserWord + 3
	// checkSlots is how many checks may be in flight: the call after that
	// many undecided ones waits for the oldest to be decided.
	checkSlots = 64
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

// image is the host image of one call's check: the call's number and
// shape, then their negations.
type image []byte

func (b image) word(neg bool, w int) int {
	if neg {
		w += entryWords
	}
	return 8 * w
}

func (b image) get(neg bool, w int) int64 {
	return int64(binary.LittleEndian.Uint64(b[b.word(neg, w):]))
}

func (b image) set(neg bool, w int, v int64) {
	binary.LittleEndian.PutUint64(b[b.word(neg, w):], uint64(v))
}

// put writes call q's entry and its negation, and whether this rank (world
// rank rank of size) refused it.
func (b image) put(q *request, rank, size int) {
	b.set(false, 0, int64(q.seq))
	b.set(true, 0, -int64(q.seq))
	for f, v := range shapeOf(q) {
		b.set(false, 1+f, v)
		b.set(true, 1+f, -v)
	}
	var refuser int64
	if q.rejected != nil {
		refuser = int64(size - rank)
	}
	binary.LittleEndian.PutUint64(b[8*refuserWord:], uint64(refuser))
}

// decide reads a reduced image for call q in a world of size ranks: nil,
// or the mismatch. The ranks' call numbers differ only when one made a
// check out of turn, which the check's order rules out; it is reported all
// the same. Where some ranks refused the call and others accepted it, the
// mismatch names the lowest refusing rank (its Refusal, without the
// reason: the checker reads that from the Board).
func (b image) decide(q *request, size int) error {
	err := b.compare(q)
	if err == nil { // the common case, without the mismatch's allocation
		return nil
	}
	var mm *MismatchError
	if errors.As(err, &mm) && mm.Field != "call number" {
		acc := 1 + slices.Index(checkFields[:], "acceptance")
		refuser := int64(binary.LittleEndian.Uint64(b[8*refuserWord:]))
		if b.get(false, acc) != -b.get(true, acc) && refuser > 0 && refuser <= int64(size) {
			mm.Refusal = &Refusal{Rank: size - int(refuser)}
		}
	}
	return err
}

// compare reads the entry of a reduced image: nil, or the first field the
// ranks disagree on.
func (b image) compare(q *request) error {
	seqHi, seqLo := b.get(false, 0), -b.get(true, 0)
	if seqHi != int64(q.seq) || seqLo != int64(q.seq) {
		return &MismatchError{Seq: q.seq, Call: q.String(), Field: "call number",
			This: fmt.Sprint(q.seq), Low: fmt.Sprint(seqLo), High: fmt.Sprint(seqHi), reduced: slices.Clone(b)}
	}
	mine := shapeOf(q)
	for f := range nFields {
		hi, lo := b.get(false, 1+f), -b.get(true, 1+f)
		if hi != lo {
			return &MismatchError{Seq: q.seq, Call: q.String(), Field: checkFields[f],
				This: fieldValue(f, mine[f]), Low: fieldValue(f, lo), High: fieldValue(f, hi), reduced: slices.Clone(b)}
		}
	}
	return nil
}

// valueOf is call q's value of a MismatchError's field, as a check that
// found it there renders it; false for a field no check names.
func valueOf(q *request, field string) (string, bool) {
	switch field {
	case "call number":
		return fmt.Sprint(q.seq), true
	case "size":
		return fmt.Sprintf("%d bytes", q.a.ByteLen()), true
	case "shape":
		return q.String(), true
	}
	if f := slices.Index(checkFields[:], field); f >= 0 {
		return fieldValue(f, shapeOf(q)[f]), true
	}
	return "", false
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
// rank reports it for the same call, with the same range of values where
// a check decided it (Low and High say otherwise). It wraps
// fairgo.ErrMismatch.
type MismatchError struct {
	Seq   uint64 // the call's number in this Reducer's call order, from 1
	Call  string // this rank's call
	Field string // the first field that differs: "count", "operator", ...; "size" where a fingerprint found a peer's collective of another size
	This  string // this rank's value
	// Low and High are the lowest and highest value among the ranks; both
	// empty when a fingerprint found it (WithFingerprintMax). Where no
	// check could decide the call and its rank compared it with rank 0's
	// on the Board instead (a call whose misaligned exchanges hang), they
	// are the values of those two ranks.
	Low, High string
	// Refusal, when some ranks refused the call (an invalid argument, a
	// context already done) and others accepted it, is the rank that
	// refused it and why: the error then reads as that refusal.
	Refusal *Refusal

	// reduced is the reduced check image the mismatch was read from (nil
	// where a fingerprint found it): the abort leaves it on the Board for
	// the peers whose own check never ends (postMismatch).
	reduced image
}

// Refusal is a rank that refused a call its peers accepted.
type Refusal struct {
	// Rank is the lowest world rank that refused the call; -1 when a
	// fingerprint (WithFingerprintMax) saw several refuse and cannot tell
	// their numbers apart.
	Rank int
	// Reason is the refusing rank's own error, as it left it on the Board;
	// "" without a Board, or when the Board did not answer in time.
	Reason string
}

func (e *MismatchError) Error() string {
	if f := e.Refusal; f != nil {
		who := fmt.Sprintf("rank %d", f.Rank)
		if f.Rank < 0 {
			who = "several ranks"
		}
		reason := f.Reason
		switch {
		case reason != "":
		case f.Rank < 0:
			reason = "each refusing rank's own error says why (no Board carried the reasons here)"
		default:
			reason = "that rank's own error says why (no Board carried the reason here)"
		}
		return fmt.Sprintf("hier: %s refused call %d (%s): %s", who, e.Seq, e.Call, reason)
	}
	if e.Low == "" && e.High == "" {
		return fmt.Sprintf(
			"hier: call %d (%s) mismatched across ranks: they disagree on the %s: this rank has %s (found by the call's fingerprint, which does not carry the other ranks' values)",
			e.Seq, e.Call, e.Field, e.This)
	}
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
	done chan struct{}
	err  error
	slot *checkSlot // where the check was enqueued; nil when it never was
}

func (t *ticket) finish(err error) {
	t.err = err
	close(t.done)
}

// finished reports whether the check is decided.
func (t *ticket) finished() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// checker runs the checks of one Reducer: submit enqueues a call's check
// on the executing goroutine; the checker's goroutine waits for each
// check's event and decides the call. Both go in call order.
type checker struct {
	r       *Reducer
	comm    backend.Comm
	stream  streams.Stream
	dev     uintptr // checkSlots checks on the device, unless mapped
	host    []byte  // their twins in host memory the device copies without blocking
	mapped  bool    // the device reduces host in place (backend.HostMapper): dev is unused
	slots   [checkSlots]checkSlot
	next    int              // the slot of the next call
	queue   chan queuedCheck // enqueued checks, in call order, for the goroutine; closed by stop
	stopped chan struct{}    // closed when the goroutine has exited
	// decideMu is held by whoever decides a check, the goroutine or a
	// helping Wait (decideEarly), so that each check is finished once. A
	// slot is freed only once its check is finished: whoever holds
	// decideMu with the check undecided may read the slot.
	decideMu sync.Mutex
	// agreement, on one machine, agrees on the shared memory that checks
	// the calls after the first ones (hostcheck.go); nil elsewhere.
	agreement *hostAgreement
	// The agreement's gather buffer across machines (allocGather): its
	// host memory, the device memory it is copied through unless mapped,
	// and the pointer the collective reduces.
	gatherHost []byte
	gatherDev  uintptr
	gatherPtr  uintptr
	abortedAt  time.Time // when await first saw the Reducer broken (the goroutine's)
	// dataEnded is the last call whose data the watcher saw complete, and
	// dataWake tells the goroutine it moved: a check is polled once its
	// call's data is done (or after checkAlone), so that one goroutine, not
	// two, polls the device for a call at any time.
	dataEnded atomic.Uint64
	dataWake  chan struct{}
	alone     *time.Timer // paces awaitData; the goroutine's, made at its first use
}

// checkAlone is how long the checker waits for a call's data before it
// polls the call's check by itself: a check whose data hangs (the ranks'
// shapes differ) is decided that late, and a call's data and check are
// polled together only for a call longer than this.
const checkAlone = time.Millisecond

// aloneAfter is the checker's wait for a call's data: checkAlone unless a
// test set another.
func (c *checker) aloneAfter() time.Duration {
	if d := c.r.cfg.checkAlone; d > 0 {
		return d
	}
	return checkAlone
}

// queuedCheck is a call whose check is enqueued in slot.
type queuedCheck struct {
	q    *request
	slot *checkSlot
}

// checkSlot is the memory and event of one check in flight.
type checkSlot struct {
	dev  uintptr
	host image
	ev   streams.Event
	free chan struct{} // holds a token while the slot is free
}

// startChecker allocates the check slots and starts the checker's
// goroutine; the engine goroutine calls it.
func (r *Reducer) startChecker() error {
	c := &checker{r: r, comm: r.rank.Comms.Check, queue: make(chan queuedCheck, checkSlots),
		stopped: make(chan struct{}), dataWake: make(chan struct{}, 1)}
	const slotBytes = 8 * imageWords
	var err error
	if c.stream, err = r.rank.Device.NewStream(); err != nil {
		return fmt.Errorf("hier: the check stream: %w", err)
	}
	if c.host, err = r.rank.Device.AllocHost(checkSlots * slotBytes); err != nil {
		return errors.Join(fmt.Errorf("hier: the check buffer's host memory: %w", err), c.release())
	}
	// Where the device reaches page-locked memory in place, the check's
	// collective reduces the host slots themselves: no copy each way.
	base := uintptr(0)
	if m, ok := r.rank.Device.(backend.HostMapper); ok {
		if base, err = m.DevicePointer(c.host); err != nil && !errors.Is(err, errors.ErrUnsupported) {
			return errors.Join(fmt.Errorf("hier: mapping the check buffer's host memory: %w", err), c.release())
		}
		c.mapped = base != 0
	}
	if !c.mapped {
		if c.dev, err = r.rank.Device.Alloc(int64(checkSlots * slotBytes)); err != nil {
			return errors.Join(fmt.Errorf("hier: the check buffer: %w", err), c.release())
		}
		base = c.dev
	}
	for i := range c.slots {
		sl := &c.slots[i]
		sl.dev = base + uintptr(i*slotBytes)
		sl.host = image(c.host[i*slotBytes : (i+1)*slotBytes : (i+1)*slotBytes])
		sl.free = make(chan struct{}, 1)
		sl.free <- struct{}{}
		if sl.ev, err = r.rank.Device.NewEvent(); err != nil {
			return errors.Join(fmt.Errorf("hier: the check events: %w", err), c.release())
		}
	}
	if r.hostCheckable() {
		c.agreement = r.newHostAgreement()
		if c.agreement.relayed {
			if err := c.allocGather(); err != nil {
				return errors.Join(err, c.release())
			}
		}
	}
	r.checker = c
	go c.run()
	return nil
}

// carriesAgreement reports whether call q's collective check carries the
// agreement on shared memory: it must then run (no fingerprint instead).
func (c *checker) carriesAgreement(q *request) bool {
	return c != nil && c.agreement != nil && (q.seq == hostTokenCall || q.seq == hostAgreeCall)
}

// agreementDue is c's agreement on shared memory when call q is the one to
// take its outcome at; nil otherwise (and for a nil c).
func (c *checker) agreementDue(q *request) *hostAgreement {
	if c == nil || c.agreement == nil || c.agreement.taken || q.seq < hostFirstCall || c.r.hooks.skipCheck {
		return nil
	}
	return c.agreement
}

// submit enqueues call q's check, right before q's data (after it for a
// fingerprinted call that its fingerprint does not vouch for): the
// executing goroutine calls it, before any device work of the next call.
func (c *checker) submit(q *request) {
	q.check = &ticket{done: make(chan struct{})}
	c.enqueue(q)
}

// enqueue enqueues call q's check on the check stream and queues it for
// the checker's goroutine. It waits for a free slot when checkSlots checks
// are undecided.
func (c *checker) enqueue(q *request) {
	if cause := c.r.brokenCause(); cause != nil {
		q.check.finish(fmt.Errorf("hier: the call's check did not run: %w", cause))
		return
	}
	sl := &c.slots[c.next]
	<-sl.free // the slot's last check is decided, or failed
	c.next = (c.next + 1) % checkSlots
	clear(sl.host)
	sl.host.put(q, c.r.WorldRank(), c.r.rank.Grid.Size())
	if c.agreement != nil {
		c.agreement.offer(q.seq, sl.host)
	}
	err := c.launchImage(sl, c.agreement.gathers(q.seq))
	if err != nil {
		err = fmt.Errorf("%w: hier: the consistency check of %v could not be enqueued: %w",
			fairgo.ErrAborted, q, c.r.withBreakCause(err))
		c.r.abort(err)
		q.check.finish(err)
		sl.free <- struct{}{}
		return
	}
	q.check.slot = sl
	c.queue <- queuedCheck{q, sl} // never blocks: it holds at most checkSlots calls, one per slot taken
}

// launchImage enqueues the check collective of the image in sl's host
// memory on the check stream (through device memory unless the host
// memory is mapped), the reduced image back, the agreement's gather
// buffer likewise when gather, and sl's event after it.
func (c *checker) launchImage(sl *checkSlot, gather bool) error {
	err := c.reduceMax(sl.dev, sl.host)
	if err == nil && gather {
		err = c.reduceMax(c.gatherPtr, c.gatherHost)
	}
	if err == nil {
		err = sl.ev.Record(c.stream)
	}
	return err
}

// reduceMax enqueues the maximum across ranks of the int64 words of host,
// in place, reduced at ptr: the host memory itself where mapped, else
// device memory copied from and back to it.
func (c *checker) reduceMax(ptr uintptr, host []byte) error {
	var err error
	if !c.mapped {
		err = c.r.rank.Device.CopyFromHostAsync(ptr, host, c.stream)
	}
	if err == nil {
		err = c.comm.AllReduce(ptr, ptr, int64(len(host)/8), fairgo.Int64, fairgo.Max, c.stream)
	}
	if err == nil && !c.mapped {
		err = c.r.rank.Device.CopyToHostAsync(host, ptr, c.stream)
	}
	return err
}

// allocGather allocates the agreement's gather buffer, mapped where the
// check slots are.
func (c *checker) allocGather() error {
	dev := c.r.rank.Device
	bytes := 8 * gatherWords * c.r.rank.Grid.Size()
	var err error
	if c.gatherHost, err = dev.AllocHost(bytes); err != nil {
		return fmt.Errorf("hier: the check's gather buffer: %w", err)
	}
	c.agreement.gather = image(c.gatherHost)
	if c.mapped {
		c.gatherPtr, err = dev.(backend.HostMapper).DevicePointer(c.gatherHost)
	} else if c.gatherDev, err = dev.Alloc(int64(bytes)); err == nil {
		c.gatherPtr = c.gatherDev
	}
	if err != nil {
		return fmt.Errorf("hier: the check's gather buffer: %w", err)
	}
	return nil
}

// enqueueTimed enqueues, for a calibration, a check collective as a call's
// runs beside its data (on the check stream, from a slot of its own, its
// event recorded after it) and returns the slot, to give back (release)
// once the calibration has waited for the check. Nothing is decided. Every
// rank calibrates alike, so the check communicator's operations stay in
// the same place among the data's on every rank.
func (c *checker) enqueueTimed() (*checkSlot, error) {
	sl := &c.slots[c.next]
	<-sl.free // the slot's last check is decided
	c.next = (c.next + 1) % checkSlots
	clear(sl.host)
	err := c.launchImage(sl, false)
	if err != nil {
		sl.free <- struct{}{}
		return nil, err
	}
	return sl, nil
}

// release gives back a slot that enqueueTimed took.
func (sl *checkSlot) release() { sl.free <- struct{}{} }

// stop ends the checker and frees its resources. The engine calls it after
// the watcher has finished, once no call can be submitted: checks still
// undecided then (the Reducer broke) fail with its cause.
func (c *checker) stop() error {
	close(c.queue)
	<-c.stopped
	return c.release()
}

func (c *checker) release() error {
	errs := []error{streams.Release(c.stream), c.agreement.release()}
	for i := range c.slots {
		errs = append(errs, streams.Release(c.slots[i].ev))
	}
	errs = append(errs, freeMemory(c.r.rank.Device, c.dev, c.host), freeMemory(c.r.rank.Device, c.gatherDev, c.gatherHost))
	return errors.Join(errs...)
}

// freeMemory frees device memory at ptr and pinned host memory host, each
// when allocated.
func freeMemory(dev backend.Device, ptr uintptr, host []byte) error {
	var errs []error
	if ptr != 0 {
		errs = append(errs, dev.Free(ptr))
	}
	if host != nil {
		errs = append(errs, dev.FreeHost(host))
	}
	return errors.Join(errs...)
}

// run decides the checks in call order until stop. It is not locked to an
// OS thread (nor is the engine): it only polls events, and a goroutine
// locked to its OS thread that polls
// (yielding between queries) makes the Go scheduler hand processors between
// threads at every yield, which cost the enqueueing caller 50–150 µs a call
// on the GPU (bench/NOTES.md item 23).
func (c *checker) run() {
	defer close(c.stopped)
	for qc := range c.queue {
		q, sl := qc.q, qc.slot
		for c.r.hooks.checkerHeld.Load() {
			time.Sleep(time.Millisecond)
		}
		if !q.check.finished() { // else a Wait decided it (decideEarly)
			c.decide(q, sl, c.verdict(q, sl))
		}
		sl.free <- struct{}{}
	}
}

// decide finishes q's check with err, unless a Wait decided it meanwhile;
// a mismatch aborts.
func (c *checker) decide(q *request, sl *checkSlot, err error) {
	c.decideMu.Lock()
	defer c.decideMu.Unlock()
	if q.check.finished() {
		return
	}
	if errors.Is(err, fairgo.ErrMismatch) {
		c.r.explainRefusal(q, err)
		c.r.abort(err)
	}
	if c.agreement != nil && err == nil {
		c.agreement.learn(q.seq, sl.host) // before the slot is free: see hostcheck.go
	}
	q.check.finish(err)
}

// decideEarly decides q's check on the goroutine of a Wait that helps
// (watch.go), when the check's collective is done and the ranks' calls
// matched, and reports whether q's check is decided. Otherwise, and
// where the goroutine is deciding, it leaves the check to the goroutine,
// which is woken only once the call's data is done and would add its
// wake-up to the call's. It never blocks. The checks that carry the
// agreement on shared memory are the goroutine's (agreement.learn).
func (c *checker) decideEarly(q *request) bool {
	t := q.check
	if c == nil || t.slot == nil || c.carriesAgreement(q) || !c.decideMu.TryLock() {
		return false
	}
	defer c.decideMu.Unlock()
	if t.finished() {
		return true
	}
	if done, err := t.slot.ev.Query(); !done || err != nil || c.r.brokenCause() != nil {
		return false
	}
	if t.slot.host.decide(q, c.r.rank.Grid.Size()) != nil {
		return false // a mismatch: the goroutine explains it and aborts
	}
	c.r.hooks.checksDecidedEarly.Add(1)
	t.finish(nil)
	return true
}

// dataDone tells the checker that call seq's data is complete (the
// watcher's, in call order), or that it has none (a refused call's); nothing
// for a nil c.
func (c *checker) dataDone(seq uint64) {
	if c == nil {
		return
	}
	for { // only forward: the engine tells of a refused call out of the watcher's order
		last := c.dataEnded.Load()
		if last >= seq || c.dataEnded.CompareAndSwap(last, seq) {
			break
		}
	}
	notify(c.dataWake)
}

// awaitData waits until the watcher has seen call seq's data complete, or
// for checkAlone. Each poll of an event costs a driver call that contends
// with the rank's launches and, on a GPU that several processes share
// (MPS), with its peers' (bench/NOTES.md item 74).
func (c *checker) awaitData(seq uint64) {
	if c.dataEnded.Load() >= seq {
		return
	}
	if c.alone == nil {
		c.alone = time.NewTimer(c.aloneAfter())
	} else {
		c.alone.Reset(c.aloneAfter())
	}
	defer c.alone.Stop()
	for c.dataEnded.Load() < seq {
		select {
		case <-c.dataWake:
		case <-c.alone.C:
			return
		}
	}
}

// verdict waits for q's check in sl and reads it (judge). For a call this
// rank refused it also asks the Board, once the check has waited
// refusalGrace, whether a peer accepted the call and learnt of the
// refusal there (boardVerdict): its peers then never join the check.
func (c *checker) verdict(q *request, sl *checkSlot) error {
	if done, _ := sl.ev.Query(); !done {
		c.awaitData(q.seq)
	}
	var unheard error
	var ask func() bool
	if q.rejected != nil {
		ask = func() bool { unheard = c.r.boardVerdict(q, false); return unheard != nil }
	}
	if err := c.await(sl.ev, ask); err != nil {
		if unheard == nil && c.r.brokenCause() == nil {
			// A peer's abort ended the check: why, where no check said.
			unheard = c.r.boardVerdict(q, false)
		}
		if unheard != nil {
			return unheard
		}
		return fmt.Errorf("hier: the call's check did not complete: %w", err)
	}
	return judge(sl.host.decide(q, c.r.rank.Grid.Size()), c.r.brokenCause())
}

// judge is a check's outcome from what its slot decided and the Reducer's
// broken cause when it was read. After an abort the check's collective may
// have ended early, leaving in the slot this rank's own shape, another
// call's or a half-reduced one: then only a mismatch whose call numbers
// agree is believed (the Work fails either way), and anything else reports
// the abort's cause, never a match.
func judge(decided, cause error) error {
	var mm *MismatchError
	if cause == nil || errors.As(decided, &mm) && mm.Field != "call number" {
		return decided
	}
	return fmt.Errorf("hier: the call's check did not complete: %w", cause)
}

// await waits for a check's event; after an abort it gives the device work
// abortGrace to end, counted from the abort for every check: the checks
// still queued then fail together, not a grace each.
//
// ask, when not nil, is asked once refusalGrace has passed, and again at
// that pace, while the Reducer is not broken: true ends the wait
// (errAnswered).
func (c *checker) await(ev streams.Event, ask func() bool) error {
	abortedAt := &c.abortedAt
	var asked time.Time
	for start := time.Now(); ; {
		// Asked first: a check the checker reaches late is often done, and
		// then costs no timer.
		if done, err := ev.Query(); done {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), watchPoll)
		_ = ev.Wait(ctx)
		cancel()
		if done, err := ev.Query(); done {
			return err
		}
		cause := c.r.brokenCause()
		if cause != nil {
			if abortedAt.IsZero() {
				*abortedAt = time.Now()
			} else if time.Since(*abortedAt) > abortGrace {
				return fmt.Errorf("hier: a check did not end within %v of the abort: %w", abortGrace, cause)
			}
		}
		if now := time.Now(); ask != nil && cause == nil && now.Sub(start) >= refusalGrace && now.Sub(asked) >= refusalGrace {
			asked = now
			if ask() {
				return errAnswered
			}
		}
	}
}

// errAnswered ends a checker's wait whose question was answered.
var errAnswered = errors.New("hier: answered")
