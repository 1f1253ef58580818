package hier

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/internal/elem"
	"github.com/fairgo/fairgo/staging"
	"github.com/fairgo/fairgo/streams"
)

// Fingerprints: the check of a small allreduce carried in its own data. The
// separate check (check.go) is a second collective on a communicator of its
// own; on a call of a few hundred microseconds it ran beside the data across
// the same NICs and NCCL proxies, behind the data's packets, and cost 15–25%
// of a one-at-a-time flat call on 8 machines (bench/NOTES.md item 32), and
// more on a rail or pairwise route (item 99). A fingerprinted call instead
// reduces, by its own route (flat, pairwise, or the rail in one slice:
// executor.stagedPlan), with its own operator and element type, a staging
// copy of its data and, at the end of the copy, fpElems elements that
// encode the call's number and shape: each bit b as the pair (b, 1−b), 1 and 0 in
// the call's type. Every operator keeps a pair whose bit all ranks share at
// (nonzero, 0) or (0, nonzero), and turns a pair whose bit differs into
// (nonzero, nonzero) (sum, float avg, max) or (0, 0) (min, prod, integer
// avg): every rank sees the same reduced pairs, so all of them find a
// difference, and none can mistake it for a match.
//
// The copy's length is a whole number of the world's alignment units
// (stagedCount), so that a route of several exchanges cuts it with no tail:
// no padding slot and no second part in each exchange. The elements
// between the data and the fingerprint are whatever the staging buffer
// held; they are reduced and never read. Ranks whose counts differ by less
// than a unit stage copies of one length, their fingerprints meet, and
// every rank finds the difference in the reduced pairs.
//
// Ranks that disagree on the count or the element type otherwise give the
// data collective itself different sizes (on a route of several exchanges,
// exchanges that disagree: those end in the watchdog or an abort, like a
// flat collective's longer side). The rank with more elements waits for
// data that never comes (the watchdog's *TimeoutError, or the abort of a
// peer that found the mismatch), but the rank with fewer can finish, having
// reduced a peer's data where that peer's fingerprint should be. Nonzero
// data there marks both elements of a pair: a mismatch. Zeros leave the
// rank's own pairs standing, so the fingerprint starts with a presence
// element, 1 on every rank, which a sum reduces to exactly the number of
// ranks and a float average to 1: a peer whose zeros stand in its place
// leaves it short, and the call fails with a *MismatchError on its size.
// It comes first because a peer with more elements has its own data there,
// never its fingerprint's 1; the refusing rank's pairs, unmarked on every
// rank of a call all accepted, catch the peer's fingerprint where it lands
// later.
// Only those two operators (the gradients') are vouched for by the
// fingerprint alone, and only where the sum of ones is exact in the
// element type (fingerprintFits): under max, min or product a peer's data
// can stand in for its fingerprint without a trace. A call of another
// operator, of a count and element type a sum would fingerprint, is
// fingerprinted all the same, so that ranks whose operators differ run
// collectives of one shape and find the difference in the pairs, and it
// takes the separate check as well (fingerprintVouches): its pairs are
// decided as soon as its data is done, its check after them. Fingerprints
// apply with the watchdog armed; a mismatch
// of kind, operator, call number or acceptance is a *MismatchError, as with
// the separate check, but without the other ranks' values (the reduced bits
// do not say which rank had which).

const (
	fpHashBits  = 64                                  // a hash of the call's number and shape
	fpFieldBits = 8                                   // then a hash of each field, to name the one that differs
	fpBits      = fpHashBits + entryWords*fpFieldBits // 128
	// fpRankBits is the world rank of a rank that refused the call, bit by
	// bit after the fingerprint (refuserOf): enough for 2^20 ranks.
	fpRankBits = 20
	// fpPresence is the first element, 1 on every rank; the bits' pairs
	// follow it.
	fpPresence  = 0
	fpElems     = 1 + 2*(fpBits+fpRankBits) // each bit as a pair
	fpMaxElem   = 8                         // the widest element type, bytes
	fpHostBytes = fpElems * fpMaxElem
	// fpSlots is how many fingerprinted calls may be undecided at once; the
	// next waits for the oldest to be decided.
	fpSlots = 64
	// fpStages is how many staging buffers calls use in turn.
	fpStages = 2
	// stageAlign is the alignment of each staging buffer, bytes: that of
	// the device's allocations.
	stageAlign = 256
	// DefaultFingerprintMax is WithFingerprintMax's default:
	// allreduces up to 4 MiB carry their check.
	DefaultFingerprintMax = 4 << 20
)

// fingerprint is the bits a call encodes: the hash of its number and shape,
// then each field's hash (field 0 the call number, then checkFields).
type fingerprint [fpBits]bool

func fingerprintOf(q *request) fingerprint {
	sh := shapeOf(q)
	var vals [entryWords]int64
	vals[0] = int64(q.seq)
	copy(vals[1:], sh[:])
	var fp fingerprint
	all := uint64(fnvOffset)
	for _, v := range vals {
		all = fnvWord(all, v)
	}
	for i := range fpHashBits {
		fp[i] = all>>i&1 == 1
	}
	for f, v := range vals {
		fh := fnvWord(fnvWord(fnvOffset, int64(f)), v)
		for j := range fpFieldBits {
			fp[fpHashBits+f*fpFieldBits+j] = fh>>j&1 == 1
		}
	}
	return fp
}

// FNV-1a, 64 bits, over a word's little-endian bytes.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvWord(h uint64, v int64) uint64 {
	for i := range 8 {
		h ^= uint64(v) >> (8 * i) & 0xff
		h *= fnvPrime
	}
	return h
}

// pairAt is the first element of bit i's pair (the refusing rank's bit j
// is bit fpBits+j).
func pairAt(i int) int { return 1 + 2*i }

// fpLayout is an element type as the fingerprint writes and reads it: its
// size, its 1, and the bits that make an element nonzero (all of them but
// a floating-point sign bit, so that a -0 is zero and a NaN is not).
// Elements are loaded and stored as one little-endian word each: a call's
// fingerprint is written before its data's launch and read in its Wait,
// both on the caller's way to its next call.
type fpLayout struct {
	size int
	one  uint64
	mask uint64
}

func layoutOf(dt fairgo.DType) fpLayout {
	size := dt.Size()
	l := fpLayout{size: size, one: 1, mask: math.MaxUint64 >> (64 - 8*size)}
	switch dt {
	case fairgo.Float16:
		l.one = 0x3c00
	case fairgo.BFloat16:
		l.one = 0x3f80
	case fairgo.Float32:
		l.one = 0x3f800000
	case fairgo.Float64:
		l.one = 0x3ff0000000000000
	}
	if dt.IsFloat() {
		l.mask &^= 1 << (8*size - 1)
	}
	return l
}

// load is element i of b.
func (l fpLayout) load(b []byte, i int) uint64 {
	switch l.size {
	case 1:
		return uint64(b[i])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b[2*i:]))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return binary.LittleEndian.Uint64(b[8*i:])
}

// store sets element i of b to v, which fits the element.
func (l fpLayout) store(b []byte, i int, v uint64) {
	switch l.size {
	case 1:
		b[i] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(b[2*i:], uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	default:
		binary.LittleEndian.PutUint64(b[8*i:], v)
	}
}

// isZero reports whether element i of b is zero.
func (l fpLayout) isZero(b []byte, i int) bool { return l.load(b, i)&l.mask == 0 }

// encode writes fp into b as fpElems elements of dt: its pairs, the
// refusing rank's pairs unmarked (encodeRefuser marks them), and the
// presence element.
func (fp *fingerprint) encode(dt fairgo.DType, b []byte) {
	l := layoutOf(dt)
	clear(b[:fpElems*l.size])
	for i, bit := range fp {
		at := pairAt(i)
		if !bit {
			at++
		}
		l.store(b, at, l.one)
	}
	l.store(b, fpPresence, l.one)
}

// present reports whether the reduced presence element in b shows all
// ranks of the world: exactly ranks under a sum, 1 under a float average
// (within half of one rank's share, which the rounding of the sum of
// ranks shares stays under where fingerprintFits). A float average among
// more ranks than that is fingerprinted all the same (its pairs still
// show a field that differs) and checked apart as well
// (fingerprintVouches): its presence element tells nothing, and present
// reports true, as for the other operators.
func present(dt fairgo.DType, op fairgo.Op, ranks int, b []byte) bool {
	v := elem.Get(dt, b, fpPresence)
	switch {
	case op == fairgo.Sum:
		return v == float64(ranks)
	case op == fairgo.Avg && dt.IsFloat() && fingerprintFits(dt, op, ranks):
		return math.Abs(v-1) < 0.5/float64(ranks)
	}
	return true
}

// markedByAll reports whether op reduces ranks' pair elements as an AND
// (min, prod, integer avg: an element stays nonzero only where every rank
// has it nonzero) rather than an OR (sum, max, float avg).
func markedByAll(dt fairgo.DType, op fairgo.Op) bool {
	return op == fairgo.Min || op == fairgo.Prod || op == fairgo.Avg && !dt.IsFloat()
}

// encodeRefuser writes after the fingerprint the world rank of this rank
// when it refused the call (rank < 0: it accepted), each bit b as a pair
// whose element b marks it. A mark is a 1 where op reduces as an OR and a 0
// where it reduces as an AND, so that a rank that accepted the call, whose
// pairs are all unmarked, leaves the refusing ranks' marks as they are.
func encodeRefuser(dt fairgo.DType, op fairgo.Op, rank int, b []byte) {
	l := layoutOf(dt)
	and := markedByAll(dt, op)
	for i := range fpRankBits {
		for half := range 2 {
			marked := rank >= 0 && (rank>>i&1 == 1) == (half == 0)
			var v uint64
			if marked != and { // an OR's mark or an AND's unmarked element: 1
				v = l.one
			}
			l.store(b, pairAt(fpBits+i)+half, v)
		}
	}
}

// refuserOf reads the rank encodeRefuser's pairs name in a reduced b: ok
// false when no rank refused; rank -1 when several with different numbers
// did (a pair with both elements marked).
func refuserOf(dt fairgo.DType, op fairgo.Op, b []byte) (rank int, ok bool) {
	l, and := layoutOf(dt), markedByAll(dt, op)
	marked := func(at int) bool { return l.isZero(b, at) == and }
	for i := range fpRankBits {
		one, zero := marked(pairAt(fpBits+i)), marked(pairAt(fpBits+i)+1)
		switch {
		case one && zero:
			return -1, true
		case one:
			rank |= 1 << i
			ok = true
		case zero:
			ok = true
		}
	}
	return rank, ok
}

// decide reads the reduced fingerprint in b (elements of dt) for call q
// in a world of ranks, whose own fingerprint is fp: nil when every rank
// had fp, else the mismatch, naming the first field whose hash differs
// ("shape" when only the whole hash does, "size" when the pairs agree but
// a rank's fingerprint was missing or out of place: the ranks' collectives
// had different sizes).
func (fp *fingerprint) decide(q *request, dt fairgo.DType, ranks int, b []byte) error {
	l := layoutOf(dt)
	bad, field := false, -1
	for i, bit := range fp {
		x, y := !l.isZero(b, pairAt(i)), !l.isZero(b, pairAt(i)+1)
		if x == bit && y == !bit {
			continue
		}
		bad = true
		if i >= fpHashBits {
			field = (i - fpHashBits) / fpFieldBits
			break
		}
	}
	if !bad {
		_, refused := refuserOf(dt, q.fpOp(), b)
		if !present(dt, q.fpOp(), ranks, b) || refused && q.rejected == nil {
			return fingerprintMismatch(q, "size")
		}
		return nil
	}
	switch {
	case field == 0:
		return fingerprintMismatch(q, "call number")
	case field > 0:
		return fingerprintMismatch(q, checkFields[field-1])
	}
	return fingerprintMismatch(q, "shape")
}

// fingerprintMismatch is the mismatch a fingerprint found in field of
// call q: this rank's value, no range (the fingerprint carries no other
// rank's).
func fingerprintMismatch(q *request, field string) *MismatchError {
	this, _ := valueOf(q, field)
	return &MismatchError{Seq: q.seq, Call: q.String(), Field: field, This: this}
}

// fingerprints is a Reducer's staging buffers and host slots for
// fingerprinted calls. The executing goroutine (engine or inline caller)
// enqueues; the watcher decides and frees the slot.
type fingerprints struct {
	r      *Reducer
	max    int64 // the largest fingerprinted call, bytes
	dev    uintptr
	stages [fpStages]fpStage
	next   int // the stage of the next call
	host   []byte
	slots  [fpSlots]fpSlot
	slot   int // the slot of the next call
	// pair stages a call's data and its fingerprint's host bytes in one
	// operation each way, where the device copies pairs and maps host
	// memory (the slots' mapped addresses set); nil: four copies a call.
	pair backend.PairCopier
}

// fpStage is one staging buffer: the call's data, then its fingerprint.
type fpStage struct {
	ptr  uintptr
	ev   streams.Event  // recorded after the buffer's last use
	last streams.Stream // the stream of that use; nil before the first
}

// fpSlot is one call's fingerprint in host memory the device copies without
// blocking: written before the call, read back reduced.
type fpSlot struct {
	host   []byte
	mapped uintptr       // host's device address where f.pair is set
	free   chan struct{} // holds a token while the slot is free
}

// fpCall is a fingerprinted call in flight.
type fpCall struct {
	slot *fpSlot
	fp   fingerprint
	dt   fairgo.DType
	op   fairgo.Op
	size int // the world's ranks
}

// fingerprintPlan returns the plan of q's fingerprinted allreduce, and
// whether q is fingerprinted: an allreduce of at most the limit whose
// element type a fingerprint fits in this world (fingerprintFits under a
// sum, whatever q's operator), with peers, the check on and the watchdog
// armed, whose route is known (router.planned) and takes the staged copy
// in one piece (executor.stagedPlan). It depends on neither the operator
// nor anything else but the call's count and element type and the route
// table, so ranks that agree on those run collectives of one shape, also
// where their operators differ: had a rank that sums fingerprinted its call
// and a peer that takes the maximum not, their collectives would differ in
// size and hang until the watchdog; instead every rank finds the operators'
// difference in the reduced pairs. A rank that rejected the call answers
// from the shape it was given. Whether the fingerprint alone vouches for
// the call is fingerprintVouches.
func (r *Reducer) fingerprintPlan(q *request) (plan, bool) {
	if r.fps == nil || r.host != nil && !r.checksByRoute() || r.hooks.skipCheck || r.checker.carriesAgreement(q) ||
		q.kind != kindAllReduce || q.a.Count <= 0 ||
		!q.a.DType.Valid() || !q.fpOp().Valid() || q.a.Count > r.fps.max/int64(q.a.DType.Size()) {
		return plan{}, false
	}
	n := q.a.ByteLen()
	if !fingerprintFits(q.a.DType, fairgo.Sum, r.rank.Grid.Size()) || !r.router.planned(n) {
		return plan{}, false
	}
	p, ok := r.exec.stagedPlan(r.router.route(n), n, stagedBytes(q.a, r.rank.Grid.Size()))
	if ok && r.host != nil && !p.algo.impl().single() {
		return plan{}, false // a route of several exchanges: the relay checks it (checksByRoute)
	}
	return p, ok
}

// checksByRoute reports whether, once the check is through shared memory,
// a call's route chooses its check: past relayMeshMachines machines (the
// relay's star) a call on a route of one collective carries a fingerprint,
// and a call on a route of several exchanges is posted for the relay. A
// fingerprint costs one collective nothing measurable and a route of many
// steps 10–20% on the one-GPU testbed of 16 machines; the relay the
// reverse (bench/NOTES.md items 150 and 153). Every rank knows the grid
// and the route, so every rank checks a call alike. A call the
// fingerprint does not vouch for (fingerprintVouches) is posted as well,
// as elsewhere it takes the separate check.
func (r *Reducer) checksByRoute() bool { return r.rank.Grid.Machines > relayMeshMachines }

// fingerprintVouches reports whether q's fingerprint alone checks it: a
// sum, or a float average (fingerprintFits). Under max, min or product a
// peer's data can stand in for its fingerprint without a trace (a count
// that differs), so such a call is fingerprinted (its pairs still show an
// operator, a kind or a call number that differs) and checked by the
// separate check as well (checkLater), which every rank that takes the
// same operator runs alike.
//
// Call connectCall never is: its separate check runs on every rank, so
// that the check communicator is connected by a collective they all make.
// NCCL connects a communicator at its first collective and blocks the
// enqueuing thread until every peer has made one; a rank whose first
// separate check were the one its peers never run (its operator differs)
// would block there, before its call reaches the watcher that finds the
// difference in the pairs, until its watchdog.
func (r *Reducer) fingerprintVouches(q *request) bool {
	return q.seq != connectCall && fingerprintFits(q.a.DType, q.fpOp(), r.rank.Grid.Size())
}

// connectCall is the call whose separate check every rank runs
// (fingerprintVouches).
const connectCall = 1

// stagedBytes is the size of the fingerprinted copy of t among world
// ranks (stagedCount's elements).
func stagedBytes(t fairgo.Tensor, world int) int64 {
	return stagedCount(t.Count, t.DType.Size(), world) * int64(t.DType.Size())
}

// stagedCount is the element count of the fingerprinted copy of count
// elements of elemSize bytes among world ranks: the data and then the
// fingerprint, rounded up to a multiple of world alignment units
// (staging.Align bytes), which staging.Slices cuts into a grid with no
// tail. The fingerprint takes its last fpElems elements.
func stagedCount(count int64, elemSize, world int) int64 {
	unit := int64(world) * max(1, staging.Align/int64(elemSize))
	return (count + int64(fpElems) + unit - 1) / unit * unit
}

// stageRoom is the bytes of one staging buffer: the largest staged copy
// of at most limit bytes of data among world ranks, in whole device
// alignment units.
func stageRoom(limit int64, world int) int64 {
	room := limit + int64(fpHostBytes) + int64(world)*staging.Align
	return (room + stageAlign - 1) / stageAlign * stageAlign
}

// fpOp is the operator q's fingerprinted collective reduces with: q's, or
// a sum where this rank refused q for an unknown operator. Its peers run a
// collective of the same shape whatever their operator
// (fingerprintPlan), and find the refusal in it at once.
func (q *request) fpOp() fairgo.Op {
	if q.rejected != nil && !q.op.Valid() {
		return fairgo.Sum
	}
	return q.op
}

// fingerprintFits reports whether a fingerprint vouches for a call of op
// on dt among ranks: op is a sum whose sum of ranks ones is exact in dt
// (every partial sum an integer the type holds), or a float average whose
// presence element, the sum of ranks shares of 1 each rounded at every
// step, stays within half a share of 1 (ranks² × the type's rounding error
// under 1/2).
func fingerprintFits(dt fairgo.DType, op fairgo.Op, ranks int) bool {
	var exact, avg int // the largest world for a sum, and for an average
	switch dt {
	case fairgo.Int8:
		exact = 127
	case fairgo.Uint8:
		exact = 255
	case fairgo.BFloat16:
		exact, avg = 256, 8
	case fairgo.Float16:
		exact, avg = 2048, 16
	case fairgo.Float32:
		exact, avg = 1<<24, 2048
	case fairgo.Float64:
		exact, avg = 1<<52, 1<<24
	case fairgo.Int32, fairgo.Uint32, fairgo.Int64, fairgo.Uint64:
		exact = math.MaxInt32
	}
	switch op {
	case fairgo.Sum:
		return ranks <= exact
	case fairgo.Avg:
		return ranks <= avg
	}
	return false
}

// newFingerprints allocates the staging buffers and slots.
func (r *Reducer) newFingerprints() (*fingerprints, error) {
	f := &fingerprints{r: r, max: r.cfg.fingerprintMax}
	dev := r.rank.Device
	stageBytes := stageRoom(f.max, r.rank.Grid.Size())
	var err error
	if f.dev, err = dev.Alloc(fpStages * stageBytes); err != nil {
		return nil, fmt.Errorf("hier: the fingerprint staging: %w", err)
	}
	if f.host, err = dev.AllocHost(fpSlots * fpHostBytes); err != nil {
		return nil, errors.Join(fmt.Errorf("hier: the fingerprints' host memory: %w", err), f.release())
	}
	for i := range f.stages {
		f.stages[i].ptr = f.dev + uintptr(int64(i)*stageBytes)
		if f.stages[i].ev, err = dev.NewEvent(); err != nil {
			return nil, errors.Join(fmt.Errorf("hier: the fingerprint events: %w", err), f.release())
		}
	}
	mapped, err := f.mapHost()
	if err != nil {
		return nil, errors.Join(err, f.release())
	}
	for i := range f.slots {
		sl := &f.slots[i]
		sl.host = f.host[i*fpHostBytes : (i+1)*fpHostBytes : (i+1)*fpHostBytes]
		if mapped != 0 {
			sl.mapped = mapped + uintptr(i*fpHostBytes)
		}
		sl.free = make(chan struct{}, 1)
		sl.free <- struct{}{}
	}
	return f, nil
}

// mapHost sets f.pair and returns the device address of f.host where the
// device copies pairs and reaches host memory in place: then a call is
// staged in by one operation (its data and its fingerprint) and out by one,
// instead of four copies, two of them across PCIe (bench/NOTES.md, "The
// fingerprint staged by pairs"). 0 and no error where it cannot.
func (f *fingerprints) mapHost() (uintptr, error) {
	dev := f.r.rank.Device
	pc, ok := dev.(backend.PairCopier)
	m, mok := dev.(backend.HostMapper)
	if !ok || !mok {
		return 0, nil
	}
	base, err := m.DevicePointer(f.host)
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("hier: mapping the fingerprints' host memory: %w", err)
	}
	f.pair = pc
	return base, nil
}

func (f *fingerprints) release() error {
	var errs []error
	for i := range f.stages {
		errs = append(errs, streams.Release(f.stages[i].ev))
	}
	return errors.Join(append(errs, freeMemory(f.r.rank.Device, f.dev, f.host))...)
}

// enqueue enqueues q's fingerprinted allreduce by p (stagedPlan's),
// starting on first: the data into a staging buffer (withData; a rejected
// call reduces whatever the buffer holds, its peers failing anyway), the
// fingerprint after it, the allreduce of both by p's route, the data back
// and the reduced fingerprint to host memory. It sets q.fp and returns the
// stream the call's last work is on; the watcher decides once that stream
// has passed the call.
func (f *fingerprints) enqueue(q *request, p plan, first streams.Stream, withData bool) (streams.Stream, error) {
	// Counted before its enqueue, which may fail (NCCL's own launch may block
	// and then fail on the abort of a call whose count differs across ranks).
	f.r.hooks.fingerprinted.Add(1)
	sl := &f.slots[f.slot]
	<-sl.free // the slot's last call is decided
	f.slot = (f.slot + 1) % fpSlots
	call := &fpCall{slot: sl, fp: fingerprintOf(q), dt: q.a.DType, op: q.fpOp(), size: f.r.rank.Grid.Size()}
	last, err := f.enqueueOn(q, call, p, first, withData)
	if err != nil {
		sl.free <- struct{}{}
		return nil, err
	}
	q.fp = call
	return last, nil
}

func (f *fingerprints) enqueueOn(q *request, call *fpCall, p plan, first streams.Stream, withData bool) (
	streams.Stream, error) {
	t := q.a
	st := &f.stages[f.next]
	f.next = (f.next + 1) % fpStages
	if st.last != nil && st.last != first {
		if err := first.WaitEvent(st.ev); err != nil {
			return nil, err
		}
	}
	n := t.ByteLen()
	tail := call.slot.host[:fpElems*t.DType.Size()]
	call.fp.encode(t.DType, tail)
	refuser := -1
	if q.rejected != nil {
		refuser = f.r.WorldRank()
	}
	encodeRefuser(t.DType, q.fpOp(), refuser, tail)
	data := n // the bytes of data staged: none for a rejected call
	if !withData {
		data = 0
	}
	es := int64(t.DType.Size())
	count := stagedCount(t.Count, t.DType.Size(), f.r.rank.Grid.Size())
	tailAt := st.ptr + uintptr((count-int64(fpElems))*es) // the fingerprint ends the copy
	staged := fairgo.Tensor{Ptr: st.ptr, Bytes: count * es, Count: count, DType: t.DType}
	last := first
	err := f.stageIn(st.ptr, t.Ptr, data, tailAt, call.slot, tail, first)
	if err == nil {
		last, err = f.r.exec.allReduce(staged, q.fpOp(), p, first)
	}
	if err == nil {
		err = f.stageOut(t.Ptr, st.ptr, data, tailAt, call.slot, tail, last)
	}
	if err == nil {
		err = st.ev.Record(last)
	}
	if err != nil {
		return nil, err
	}
	st.last = last
	return last, nil
}

// stageIn enqueues on s the copy of data bytes from src to the stage at
// at and of the fingerprint's host bytes tail (sl's) to tailAt: one pair
// copy, or two copies where the device has none.
func (f *fingerprints) stageIn(at, src uintptr, data int64, tailAt uintptr, sl *fpSlot, tail []byte,
	s streams.Stream) error {
	if f.pair != nil {
		return f.pair.CopyPairAsync(at, src, data, tailAt, sl.mapped, int64(len(tail)), s)
	}
	dev := f.r.rank.Device
	if data > 0 {
		if err := dev.CopyAsync(at, src, data, s); err != nil {
			return err
		}
	}
	return dev.CopyFromHostAsync(tailAt, tail, s)
}

// stageOut is stageIn's way back: the reduced data from the stage at at
// to dst, the reduced fingerprint from tailAt to tail.
func (f *fingerprints) stageOut(dst, at uintptr, data int64, tailAt uintptr, sl *fpSlot, tail []byte,
	s streams.Stream) error {
	if f.pair != nil {
		return f.pair.CopyPairAsync(dst, at, data, sl.mapped, tailAt, int64(len(tail)), s)
	}
	dev := f.r.rank.Device
	if data > 0 {
		if err := dev.CopyAsync(dst, at, data, s); err != nil {
			return err
		}
	}
	return dev.CopyToHostAsync(tail, tailAt, s)
}

// enqueueTimed enqueues, for a calibration, an allreduce of t as a
// fingerprinted sum runs by p (stagedPlan's: the staging copy, the
// fingerprint, the allreduce of both, the copy back and the fingerprint's
// read-back) and returns the slot it took, to give back (release) once the
// calibration has waited for the work, and the stream the work ends on.
// Nothing is decided. t must fit (t.ByteLen() ≤ f.max).
func (f *fingerprints) enqueueTimed(t fairgo.Tensor, p plan, first streams.Stream) (*fpSlot, streams.Stream, error) {
	q := &request{kind: kindAllReduce, a: t, op: fairgo.Sum}
	sl := &f.slots[f.slot]
	<-sl.free // the slot's last call is decided
	f.slot = (f.slot + 1) % fpSlots
	call := &fpCall{slot: sl, fp: fingerprintOf(q), dt: t.DType, op: q.op, size: f.r.rank.Grid.Size()}
	last, err := f.enqueueOn(q, call, p, first, true)
	if err != nil {
		sl.free <- struct{}{}
		return nil, nil, err
	}
	return sl, last, nil
}

// release gives back a slot that enqueueTimed took.
func (sl *fpSlot) release() { sl.free <- struct{}{} }

// decide reads the reduced fingerprint of q, its device work complete. A
// mismatch names the rank that refused the call where one did and this
// rank accepted it or the ranks disagree on the acceptance.
func (c *fpCall) decide(q *request) error {
	b := c.slot.host[:fpElems*c.dt.Size()]
	err := c.fp.decide(q, c.dt, c.size, b)
	var mm *MismatchError
	if !errors.As(err, &mm) || mm.Field == "call number" || q.rejected != nil && mm.Field != "acceptance" {
		return err
	}
	if rank, ok := refuserOf(c.dt, c.op, b); ok && rank < c.size {
		mm.Refusal = &Refusal{Rank: rank}
	}
	return err
}

// free gives back the call's slot (the watcher, once the call is done).
func (c *fpCall) free() { c.slot.free <- struct{}{} }
