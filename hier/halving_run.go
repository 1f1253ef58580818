package hier

import (
	"errors"
	"fmt"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/streams"
)

// halvingDoubling is Rabenseifner's allreduce on the world communicator:
// each step one pairwise exchange (an AllToAllv with a count for the
// partner only, which NCCL's backend enqueues as one group of a send and
// a receive) and the add kernel on two sources (the rank's own span and
// the received one, 16-bit floats summed in float32), every step on the
// call's first stream.
type halvingDoubling struct{}

func (halvingDoubling) allReduce(
	x *executor, t fairgo.Tensor, op fairgo.Op, _ plan, first streams.Stream,
) (streams.Stream, error) {
	return first, x.pairwise(t, op, first, hdPlan)
}

func (halvingDoubling) whole() bool { return true }

func (halvingDoubling) stagedReceive(Grid) bool { return false }

func (halvingDoubling) single() bool { return false }

// recursiveDoubling is recursive doubling on the world communicator
// (rdPlan): log2(W) pairwise exchanges of the whole call, each followed by
// the add kernel, on the call's first stream, with halvingDoubling's
// scratch and pieces.
type recursiveDoubling struct{ halvingDoubling }

func (recursiveDoubling) allReduce(
	x *executor, t fairgo.Tensor, op fairgo.Op, _ plan, first streams.Stream,
) (streams.Stream, error) {
	return first, x.pairwise(t, op, first, rdPlan)
}

// hdState is the scratch of the executor's pairwise algorithms
// (halving-doubling, recursive doubling): the receive buffer of the reduce
// steps, grown to the largest piece a call has needed, and the event after
// its last use.
type hdState struct {
	ptr     uintptr
	bytes   int64
	retired []uintptr // outgrown buffers, freed with the executor (work may still read them)
	ev      streams.Event
	last    streams.Stream // the stream of the last use; nil before it
	chunk   int64          // test hook (export_router_test.go): the largest piece; 0: hdMaxChunkBytes
}

// pairwise enqueues an allreduce of t on first by the pairwise schedule
// plan gives each rank (hdPlan, rdPlan), in pieces of at most
// hdMaxChunkBytes.
func (ex *executor) pairwise(t fairgo.Tensor, op fairgo.Op, first streams.Stream,
	plan func(w, r int, count int64) hdSchedule) error {
	world := ex.comms.World
	w, r := world.Size(), world.Rank()
	es := int64(t.DType.Size())
	chunk := max(ex.hdChunkBytes()/es, 1)
	stepOp, pre, post := hdOps(op, t.DType, w)
	for off := int64(0); off < t.Count; off += chunk {
		n := min(chunk, t.Count-off)
		sc := plan(w, r, n)
		base := t.Ptr + uintptr(off*es)
		recv, err := ex.hdScratch(sc.scratch()*es+es, first)
		if err != nil {
			return err
		}
		if pre > 1 { // Avg of floats: every input scaled by 1/w before anything is sent
			if err := ex.dev.ReduceAsync(base, base, 1, n, n, t.DType, fairgo.Avg, pre, first); err != nil {
				return err
			}
		}
		// The scratch receives at the offset that keeps it a whole
		// number of elements away from the buffer, whatever the
		// buffer's alignment: the add kernel takes both sources at one
		// stride.
		recv += uintptr(int64(base) % es)
		for i, st := range sc.steps {
			if err := ex.hdExchange(world, w, base, recv, st, t.DType, first); err != nil {
				return fmt.Errorf("pairwise step %d of %d: %w", i, len(sc.steps), err)
			}
			if st.reduce && st.recv.n > 0 {
				dst := base + uintptr(st.recv.lo*es)
				src, stride := min(dst, recv), int64(max(dst, recv)-min(dst, recv))/es
				if err := ex.dev.ReduceAsync(dst, src, 2, stride, st.recv.n, t.DType, stepOp, 1, first); err != nil {
					return err
				}
			}
			if i+1 == sc.reduced && post > 1 && sc.owned.n > 0 {
				p := base + uintptr(sc.owned.lo*es)
				if err := ex.dev.ReduceAsync(p, p, 1, sc.owned.n, sc.owned.n, t.DType, fairgo.Avg, post, first); err != nil {
					return err
				}
			}
		}
	}
	return ex.hdDone(first)
}

// hdChunkBytes is the largest piece of a call one run of the schedule
// takes: hdMaxChunkBytes, or less where a test says so.
func (ex *executor) hdChunkBytes() int64 {
	if ex.hd.chunk > 0 {
		return ex.hd.chunk
	}
	return hdMaxChunkBytes
}

// hdExchange enqueues one step: an AllToAllv on the world communicator
// with counts for the step's peer only, inside one device group (every
// rank takes part in every step, so that the steps pair up in order on
// any backend).
func (ex *executor) hdExchange(world backend.Comm, w int, base, scratch uintptr, st hdStep, dt fairgo.DType,
	s streams.Stream) error {
	sendCounts, sendDispls := make([]int64, w), make([]int64, w)
	recvCounts, recvDispls := make([]int64, w), make([]int64, w)
	recv := base
	if st.peer >= 0 {
		sendCounts[st.peer], sendDispls[st.peer] = st.send.n, st.send.lo
		recvCounts[st.peer], recvDispls[st.peer] = st.recv.n, st.recv.lo
		if st.reduce {
			recv, recvDispls[st.peer] = scratch, 0
		}
	}
	// One group: the send and the receive of a step must be posted
	// together, or two partners that each send first wait on each other
	// (NCCL's backend groups an AllToAllv itself; groups nest).
	return ex.dev.Group(func() error {
		return world.AllToAllv(base, sendCounts, sendDispls, recv, recvCounts, recvDispls, dt, s)
	})
}

// hdScratch is a scratch buffer of at least bytes for a call on first:
// the one the last call used when it is large enough (first then waits for
// that call's last use, where that was on another stream), else a new one
// of at least twice the size; the old one is kept until release, as work
// enqueued before may still read it.
func (ex *executor) hdScratch(bytes int64, first streams.Stream) (uintptr, error) {
	h := &ex.hd
	if h.ev == nil {
		ev, err := ex.dev.NewEvent()
		if err != nil {
			return 0, err
		}
		h.ev = ev
	}
	if bytes > h.bytes {
		size := max(bytes, 2*h.bytes, 64<<10)
		ptr, err := ex.dev.Alloc(size)
		if err != nil {
			return 0, fmt.Errorf("the halving-doubling scratch of %d bytes: %w", size, err)
		}
		if h.ptr != 0 {
			h.retired = append(h.retired, h.ptr)
		}
		h.ptr, h.bytes, h.last = ptr, size, nil
	}
	if h.last != nil && h.last != first {
		if err := first.WaitEvent(h.ev); err != nil {
			return 0, err
		}
	}
	return h.ptr, nil
}

// hdDone records the scratch's last use, on s.
func (ex *executor) hdDone(s streams.Stream) error {
	h := &ex.hd
	if h.ev == nil {
		return nil
	}
	if err := h.ev.Record(s); err != nil {
		return err
	}
	h.last = s
	return nil
}

// release frees the scratch buffers and the event.
func (h *hdState) release(dev backend.Device) error {
	var errs []error
	for _, p := range append(h.retired, h.ptr) {
		if p != 0 {
			errs = append(errs, dev.Free(p))
		}
	}
	if h.ev != nil {
		errs = append(errs, streams.Release(h.ev))
	}
	*h = hdState{chunk: h.chunk}
	return errors.Join(errs...)
}
