package hier

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/streams"
)

// Fingerprints: the cross-rank check of a flat call carried in the data's
// own NCCL launch. The separate check (check.go) is a second launch on a
// communicator of its own, with a copy to the device, a copy back and an
// event: on one machine it cost a flat call about 36 µs of host time
// beside NCCL's own 19, and on eight machines it ran beside the data
// across the same NICs and proxies. A fingerprinted call instead puts two
// small allreduces in the same NCCL group as its data, on the same
// communicator and stream, ahead of it:
//
//   - the image: the call's number and shape and their negations, reduced
//     with Max, which gives every rank the lowest and highest value of each
//     field (the separate check's image, check.go);
//   - the sums: two independent 64-bit hashes of each field, reduced with
//     Sum, which a match leaves at exactly W times this rank's own.
//
// Both live in page-locked host memory that NCCL reads and writes in place
// (backend.HostMapper): no copy, no event of their own; the watcher reads
// them once the call's completion event has fired. Where the device cannot
// map host memory, they go through device memory with a copy each way.
//
// Why the sums: ranks that disagree on the count (or on the bytes of the
// element type) give NCCL different sizes inside one launch, so its steps
// no longer line up: the launch may hang (the watchdog then ends it with a
// *TimeoutError, and fingerprints are used only with the watchdog armed) or
// finish with another task's bytes in the check. Max over foreign bytes
// can look like a match (negative floats read as integers are below any
// field); a Sum of hashes equals W times this rank's only if every term is
// this rank's hash, up to a 2^-128 collision. Any other difference of
// shape (operator, element type of the same size, kind, call number,
// acceptance) leaves NCCL's steps aligned and the image names the field and
// the ranks' range, as the separate check does.

const (
	// sumWords are the sums' words: two hashes of each entry word (the
	// call number, then each field of checkFields).
	sumWords  = 2 * entryWords
	fpWords   = imageWords + sumWords
	fpBytes   = 8 * fpWords
	fpSlotLen = 256 // each slot starts on its own 256 bytes
	// fpSlots is how many fingerprinted calls may be undecided at once; the
	// next waits for the oldest to be decided. The watcher decides a call
	// only after its completion event, polled, so the slots must outlast a
	// burst of calls enqueued faster than the watcher completes them
	// (256 KiB of page-locked memory).
	fpSlots = 1024
	// DefaultFingerprintMax is the largest flat allreduce, in bytes, that
	// carries its check in its own launch when the watchdog is armed
	// (WithFingerprintMax). A rank that refused such a call still runs its
	// collective, on a scratch buffer of this size.
	DefaultFingerprintMax = 4 << 20
	// FingerprintMinRanks is the smallest world whose calls carry their
	// check by default.
	FingerprintMinRanks = 2
)

// sums is the Sum part of a fingerprint: two hashes of each entry word.
type sums [sumWords]int64

func sumsOf(q *request) sums {
	sh := shapeOf(q)
	var vals [entryWords]int64
	vals[0] = int64(q.seq)
	copy(vals[1:], sh[:])
	var s sums
	for w, v := range vals {
		s[2*w] = int64(mix(uint64(w)<<1, uint64(v)))
		s[2*w+1] = int64(mix(uint64(w)<<1|1, uint64(v)))
	}
	return s
}

// mix is a 64-bit hash of (key, v): splitmix64's finaliser over both.
func mix(key, v uint64) uint64 {
	z := v + 0x9e3779b97f4a7c15*(key+1)
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// fingerprints is a Reducer's slots for fingerprinted calls and the
// scratch a refused call reduces. The executing goroutine (engine or
// inline caller) enqueues; the watcher decides and frees the slot.
type fingerprints struct {
	r       *Reducer
	max     int64 // the largest fingerprinted call, bytes
	host    []byte
	mapped  uintptr // host's device address; 0: the slots go through dev
	dev     uintptr // device twins of the slots when host is not mapped
	scratch uintptr // max bytes: a refused call's stand-in buffer
	slots   [fpSlots]fpSlot
	slot    int // the slot of the next call
}

// fpSlot is one call's fingerprint: written before the call, read back
// reduced.
type fpSlot struct {
	host []byte
	ptr  uintptr       // where NCCL reduces it: host's device address, or its device twin
	free chan struct{} // holds a token while the slot is free
}

// fpCall is a fingerprinted call in flight.
type fpCall struct {
	slot *fpSlot
	own  sums
	w    int64 // the world size
}

// fingerprintable reports whether q's check travels in its own launch: an
// allreduce of at most the limit that runs as one collective of all ranks,
// with peers, the check on and the watchdog armed. It depends only on the
// call's shape and the route table, so every rank that agrees on the
// shape answers alike; a rank that refused the call answers from the shape
// it was given.
func (r *Reducer) fingerprintable(q *request) bool {
	if r.fps == nil || r.hooks.skipCheck || q.kind != kindAllReduce || q.a.Count <= 0 ||
		!q.a.DType.Valid() || !q.op.Valid() || q.a.Count > r.fps.max/int64(q.a.DType.Size()) {
		return false
	}
	return r.router.isFlat(q.a.ByteLen())
}

// newFingerprints allocates the slots and the scratch.
func (r *Reducer) newFingerprints() (*fingerprints, error) {
	f := &fingerprints{r: r, max: r.cfg.fingerprintMax}
	dev := r.rank.Device
	var err error
	if f.host, err = dev.AllocHost(fpSlots * fpSlotLen); err != nil {
		return nil, fmt.Errorf("hier: the fingerprints' host memory: %w", err)
	}
	if m, ok := dev.(backend.HostMapper); ok {
		f.mapped, err = m.DevicePointer(f.host)
		if err != nil && !errors.Is(err, errors.ErrUnsupported) {
			return nil, errors.Join(fmt.Errorf("hier: mapping the fingerprints' host memory: %w", err), f.release())
		}
	}
	if f.mapped == 0 {
		if f.dev, err = dev.Alloc(fpSlots * fpSlotLen); err != nil {
			return nil, errors.Join(fmt.Errorf("hier: the fingerprints' device memory: %w", err), f.release())
		}
	}
	if f.scratch, err = dev.Alloc(f.max); err != nil {
		return nil, errors.Join(fmt.Errorf("hier: the fingerprint scratch: %w", err), f.release())
	}
	for i := range f.slots {
		sl := &f.slots[i]
		sl.host = f.host[i*fpSlotLen : i*fpSlotLen+fpBytes : i*fpSlotLen+fpBytes]
		if f.mapped != 0 {
			sl.ptr = f.mapped + uintptr(i*fpSlotLen)
		} else {
			sl.ptr = f.dev + uintptr(i*fpSlotLen)
		}
		sl.free = make(chan struct{}, 1)
		sl.free <- struct{}{}
	}
	return f, nil
}

func (f *fingerprints) release() error {
	dev := f.r.rank.Device
	var errs []error
	if f.scratch != 0 {
		errs = append(errs, dev.Free(f.scratch))
	}
	return errors.Join(append(errs, freeMemory(dev, f.dev, f.host))...)
}

// enqueue enqueues q with its fingerprint on first: the two check
// reductions and then data (the call's own dispatch when withData, else an
// allreduce of the scratch in q's shape: a refused call still meets its
// peers' collective) in one group on comm. It sets q.fp; the watcher
// decides once first has passed the call. It returns the stream the call's
// last work is on.
func (f *fingerprints) enqueue(q *request, comm backend.Comm, first streams.Stream,
	data func() (streams.Stream, error)) (streams.Stream, error) {
	if comm == nil { // its route's world variant could not be made: the call fails as its data would
		return nil, fmt.Errorf("hier: %v: no communicator of all ranks for its route", q)
	}
	sl := &f.slots[f.slot]
	<-sl.free // the slot's last call is decided
	f.slot = (f.slot + 1) % fpSlots
	call := &fpCall{slot: sl, own: sumsOf(q), w: int64(comm.Size())}
	img := image(sl.host[:8*imageWords])
	img.put(q)
	for i, v := range call.own {
		binary.LittleEndian.PutUint64(sl.host[8*(imageWords+i):], uint64(v))
	}
	last, err := f.enqueueOn(q, sl, comm, first, data)
	if err != nil {
		sl.free <- struct{}{}
		return nil, err
	}
	q.fp = call
	f.r.hooks.fingerprinted.Add(1)
	return last, nil
}

func (f *fingerprints) enqueueOn(q *request, sl *fpSlot, comm backend.Comm, first streams.Stream,
	data func() (streams.Stream, error)) (last streams.Stream, err error) {
	dev := f.r.rank.Device
	if f.mapped == 0 {
		if err := dev.CopyFromHostAsync(sl.ptr, sl.host, first); err != nil {
			return nil, err
		}
	}
	err = dev.Group(func() error {
		if err := comm.AllReduce(sl.ptr, sl.ptr, int64(imageWords), fairgo.Int64, fairgo.Max, first); err != nil {
			return err
		}
		sumsAt := sl.ptr + uintptr(8*imageWords)
		if err := comm.AllReduce(sumsAt, sumsAt, int64(sumWords), fairgo.Int64, fairgo.Sum, first); err != nil {
			return err
		}
		if data == nil {
			last = first
			return comm.AllReduce(f.scratch, f.scratch, q.a.Count, q.a.DType, q.op, first)
		}
		var err error
		last, err = data()
		return err
	})
	if err != nil {
		return nil, err
	}
	if last != first {
		return nil, fmt.Errorf("hier: a fingerprinted call ended on another stream than its first")
	}
	if f.mapped == 0 {
		if err := dev.CopyToHostAsync(sl.host, sl.ptr, first); err != nil {
			return nil, err
		}
	}
	return last, nil
}

// decide reads the reduced fingerprint of q, its device work complete:
// the image's verdict, naming the field and the ranks' range, else the
// sums', which catch a launch whose steps did not line up.
func (c *fpCall) decide(q *request) error {
	if err := image(c.slot.host[:8*imageWords]).decide(q); err != nil {
		return err
	}
	for i, v := range c.own {
		got := int64(binary.LittleEndian.Uint64(c.slot.host[8*(imageWords+i):]))
		if got != c.w*v {
			return &MismatchError{Seq: q.seq, Call: q.String(), Field: "shape", This: q.String()}
		}
	}
	return nil
}

// free gives back the call's slot (the watcher, once the call is done).
func (c *fpCall) free() { c.slot.free <- struct{}{} }
