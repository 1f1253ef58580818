package backend

import (
	"fmt"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/streams"
)

// Device is one GPU as the engine drives it: memory, asynchronous copies, the
// reduction kernel of the add stage, and the streams and events of the stage
// chain. The CUDA backend and the simulated cluster implement it.
//
// Calls may come from any goroutine, one at a time per stream: the engine's,
// or a caller's that enqueues a flat call inline; NewEvent and
// the methods of events from any goroutine at any time (a call's After
// option records an event on the caller's stream, the checker polls its
// events).
type Device interface {
	streams.Factory

	// Alloc allocates device memory; Free releases it.
	Alloc(bytes int64) (uintptr, error)
	Free(ptr uintptr) error

	// Upload copies src from the host to device memory at dst, and
	// Download copies device memory at src into dst on the host. Both are
	// synchronous and do not wait for the device's streams.
	Upload(dst uintptr, src []byte) error
	Download(dst []byte, src uintptr) error

	// AllocHost allocates host memory that CopyFromHostAsync and
	// CopyToHostAsync move to and from the device without blocking the
	// host (page-locked on a GPU); FreeHost releases it. The bytes of an
	// enqueued copy must not be touched until its stream has run it.
	AllocHost(bytes int) ([]byte, error)
	FreeHost(b []byte) error
	CopyFromHostAsync(dst uintptr, src []byte, s streams.Stream) error
	CopyToHostAsync(dst []byte, src uintptr, s streams.Stream) error

	// CheckRange returns an error wrapping fairgo.ErrInvalidArgument when
	// [ptr, ptr+bytes) is not memory of this device.
	CheckRange(ptr uintptr, bytes int64) error

	// CopyAsync enqueues a device-to-device copy of bytes on s.
	CopyAsync(dst, src uintptr, bytes int64, s streams.Stream) error

	// Copy2DAsync enqueues height copies of width bytes, row i from
	// src+i·srcPitch to dst+i·dstPitch.
	Copy2DAsync(dst uintptr, dstPitch int64, src uintptr, srcPitch int64, width, height int64, s streams.Stream) error

	// ReduceAsync enqueues the add stage's kernel on s:
	//   dst[i] = op over k in [0, n) of src[k·stride + i]   for i in [0, count)
	// and, for Avg, the sum divided by divisor (integers: truncated toward
	// zero). Float16 and bfloat16 accumulate in float32 and round once; the
	// other types accumulate in their own type. Strides and counts are in
	// elements. dst may equal a source exactly (an in-place division with
	// n = 1) but must not partly overlap any.
	ReduceAsync(dst, src uintptr, n int, stride, count int64, dt fairgo.DType, op fairgo.Op, divisor int,
		s streams.Stream) error

	// Group runs fn with communicator calls fused into one launch
	// (ncclGroupStart/ncclGroupEnd on NCCL).
	Group(fn func() error) error

	// Close releases the device's resources (streams, events, the engine's
	// allocations). It does not free memory the caller owns.
	Close() error
}

// Comm is one rank's handle on a communicator (NCCL semantics). Every call
// enqueues on s and returns at once; every rank of the communicator must
// enqueue the same calls in the same order. Counts and displacements are in
// elements.
type Comm interface {
	Size() int
	Rank() int
	// Name identifies the communicator in errors and logs ("rail-collect/local=1").
	Name() string

	AllReduce(send, recv uintptr, count int64, dt fairgo.DType, op fairgo.Op, s streams.Stream) error
	// ReduceScatter: send holds Size()·recvCount elements; rank r receives
	// the reduction of block r. In place when recv == send + Rank()·recvCount.
	ReduceScatter(send, recv uintptr, recvCount int64, dt fairgo.DType, op fairgo.Op, s streams.Stream) error
	// AllGather: recv holds Size()·sendCount elements, block r from rank r.
	// In place when send == recv + Rank()·sendCount.
	AllGather(send, recv uintptr, sendCount int64, dt fairgo.DType, s streams.Stream) error
	Broadcast(send, recv uintptr, count int64, dt fairgo.DType, root int, s streams.Stream) error
	// AllToAllv sends sendCounts[k] elements from send+sendDispls[k] to
	// rank k, and receives recvCounts[k] elements from rank k into
	// recv+recvDispls[k]. Sends may overlap each other (a displacement
	// repeated sends the same data twice); receives must not.
	AllToAllv(send uintptr, sendCounts, sendDispls []int64, recv uintptr, recvCounts, recvDispls []int64,
		dt fairgo.DType, s streams.Stream) error

	// Err reports an asynchronous failure of the communicator (a peer that
	// failed, a mismatch, an abort), or nil. It may be called from any
	// goroutine.
	Err() error
	// Abort stops the communicator's pending work, which then fails; it
	// never blocks on peers and may be called from any goroutine.
	Abort() error
	// Close destroys the communicator.
	Close() error
}

// HostMapper is a Device whose AllocHost memory device work reads and
// writes in place: a communicator call may take DevicePointer(b) as its
// send or receive buffer, with no copy to or from device memory. On a GPU
// that is page-locked memory under unified addressing, which the device
// reaches over PCIe (slow for bulk data, cheap for a few hundred bytes that
// would otherwise cost two copies and their driver calls).
type HostMapper interface {
	// DevicePointer is the device address of b, memory from AllocHost. It
	// fails with an error wrapping fairgo.ErrInvalidArgument for memory
	// that is not, and with one wrapping errors.ErrUnsupported where the
	// device cannot address host memory.
	DevicePointer(b []byte) (uintptr, error)
}

// PairCopier is a Device that enqueues two copies as one operation (one
// kernel on a GPU): a copy costs a driver call and a step of the stream
// each, which for a small call's staging is more than the bytes moved.
// With a HostMapper, either side of either copy may be host memory at its
// DevicePointer.
type PairCopier interface {
	// CopyPairAsync enqueues on s the copies of n1 bytes from src1 to dst1
	// and of n2 bytes from src2 to dst2. No destination may overlap a
	// source or the other destination (an error wrapping
	// fairgo.ErrInvalidArgument).
	CopyPairAsync(dst1, src1 uintptr, n1 int64, dst2, src2 uintptr, n2 int64, s streams.Stream) error
}

// CheckCopyPair validates PairCopier.CopyPairAsync's arguments: sizes
// not negative, no null address for bytes to copy, no destination
// overlapping a source or the other destination.
func CheckCopyPair(dst1, src1 uintptr, n1 int64, dst2, src2 uintptr, n2 int64) error {
	type span struct {
		name string
		at   uintptr
		n    int64
	}
	spans := [4]span{{"dst1", dst1, n1}, {"src1", src1, n1}, {"dst2", dst2, n2}, {"src2", src2, n2}}
	for _, a := range spans {
		switch {
		case a.n < 0:
			return &fairgo.ArgError{Arg: "bytes", Value: a.n, Reason: "negative"}
		case a.n > 0 && a.at == 0:
			return &fairgo.ArgError{Arg: a.name, Value: "0", Reason: "null address"}
		}
	}
	for i, a := range spans {
		if a.name[0] != 'd' {
			continue
		}
		for j, b := range spans {
			if i != j && a.n > 0 && b.n > 0 && a.at < b.at+uintptr(b.n) && b.at < a.at+uintptr(a.n) {
				return &fairgo.ArgError{Arg: a.name, Value: fmt.Sprintf("%#x", a.at),
					Reason: fmt.Sprintf("overlaps %s at %#x", b.name, b.at)}
			}
		}
	}
	return nil
}

// EventTimer is a Device that times work between two events by its own
// clock (CUDA's timing events): the time from the moment its stream
// reached start to the moment a stream reached end, whenever the host
// looks. A measurement that waited for the work from the host would add
// the host's delay in seeing it end, which a wait that naps makes as large
// as a small call.
type EventTimer interface {
	// NewTimingEvent creates an event that Elapsed can read.
	NewTimingEvent() (streams.Event, error)
	// Elapsed is the time between two completed timing events of the
	// device, start recorded before end.
	Elapsed(start, end streams.Event) (time.Duration, error)
}
