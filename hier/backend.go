package hier

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/streams"
)

// Device is one GPU as the engine drives it: memory, asynchronous copies, the
// reduction kernel of the add stage, and the streams and events of the stage
// chain. The CUDA backend and the simulated cluster implement it.
//
// Calls may come from any goroutine, one at a time per stream: the engine's
// (after Bind), a caller's that enqueues a flat call inline, and the
// checker's; NewEvent and the methods of events from any goroutine at any
// time (a call's After option records an event on the caller's stream).
type Device interface {
	streams.Factory

	// Bind prepares the calling goroutine to enqueue much work for this
	// device (the CUDA backend locks the OS thread and makes the device's
	// primary context current; its calls also work unbound). The engine
	// calls it once, from its own goroutine, and calls release when it
	// exits.
	Bind() (release func(), err error)

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
	ReduceAsync(
		dst, src uintptr,
		n int,
		stride, count int64,
		dt fairgo.DType,
		op fairgo.Op,
		divisor int,
		s streams.Stream,
	) error

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
	AllToAllv(
		send uintptr,
		sendCounts, sendDispls []int64,
		recv uintptr,
		recvCounts, recvDispls []int64,
		dt fairgo.DType,
		s streams.Stream,
	) error

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

// Grid is the M × D arrangement of ranks and one rank's place in it (the
// root package defines it, so that topology, which computes it, and the
// engine share it without importing each other).
type Grid = fairgo.Grid

// Comms are the six communicators of one rank. Intra communicators hold
// the D ranks of this machine ranked by local index; rail communicators hold
// the M ranks with this local index ranked by machine index. Each pipeline
// stage that talks has its own communicator so that stages of different
// slices run concurrently without NCCL ordering deadlocks; the check
// communicator carries the cross-rank consistency check of every call,
// beside the data.
type Comms struct {
	World              Comm // all ranks, in the launcher's global order
	IntraReduceScatter Comm // stage 1 (and flat work inside a machine)
	IntraAllGather     Comm // stage 5
	RailCollect        Comm // stage 2
	RailDiffuse        Comm // stage 4
	Check              Comm // all ranks, any order: the consistency check
}

// Board is a small key-value board shared by the ranks of a job, where a
// Reducer leaves word of a failure for its peers (which rank timed out, how
// far each rank got). A rendezvous store satisfies it. Get blocks until the
// key exists or ctx ends.
type Board interface {
	Set(ctx context.Context, key string, value []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
}

// Rank bundles what the engine needs for one rank: its device, its place in
// the grid and its communicators. The caller keeps ownership of the device
// and the communicators unless OwnsResources is set, in which case the
// Reducer releases them on Close (Release).
type Rank struct {
	Grid          Grid
	Device        Device
	Comms         Comms
	OwnsResources bool
	// Board, when set, lets the Reducers of a job tell each other why they
	// failed: a timeout on one rank then reads as a timeout on all, with
	// the call each rank reached. Nil: each rank knows only its own cause.
	// Every rank of a job must be given the same board, or none.
	Board Board
	// Closers run after the communicators and the device are closed, when
	// OwnsResources is set (setup code hands over the store it opened).
	Closers []func() error
}

// Release closes the rank's distinct communicators, then its device, then
// runs its Closers, and joins their errors.
func (r Rank) Release() error {
	var errs []error
	for _, c := range r.Comms.distinct() {
		errs = append(errs, c.Close())
	}
	if r.Device != nil {
		errs = append(errs, r.Device.Close())
	}
	for _, fn := range r.Closers {
		errs = append(errs, fn())
	}
	return errors.Join(errs...)
}

// distinct is the non-nil communicators, each once.
func (c Comms) distinct() []Comm {
	var out []Comm
	for _, cm := range []Comm{c.World, c.IntraReduceScatter, c.IntraAllGather, c.RailCollect, c.RailDiffuse, c.Check} {
		if cm != nil && !slices.Contains(out, cm) {
			out = append(out, cm)
		}
	}
	return out
}

func (r Rank) validate() error {
	if err := r.Grid.Validate(); err != nil {
		return err
	}
	if r.Device == nil {
		return &fairgo.ArgError{Arg: "rank device", Value: nil, Reason: "missing"}
	}
	c := r.Comms
	check := func(name string, cm Comm, size, rank int) error {
		if cm == nil {
			if size == 1 {
				return nil // a one-rank communicator may be omitted
			}
			return &fairgo.ArgError{Arg: name + " communicator", Value: nil, Reason: "missing"}
		}
		if cm.Size() != size || cm.Rank() != rank {
			return &fairgo.ArgError{
				Arg:    name + " communicator",
				Value:  fmt.Sprintf("rank %d of %d", cm.Rank(), cm.Size()),
				Reason: fmt.Sprintf("grid %v needs rank %d of %d", r.Grid, rank, size),
			}
		}
		return nil
	}
	g := r.Grid
	if c.World == nil || c.World.Size() != g.Size() {
		return &fairgo.ArgError{
			Arg:    "world communicator",
			Value:  c.World,
			Reason: fmt.Sprintf("must hold %d ranks", g.Size()),
		}
	}
	if g.Size() > 1 && (c.Check == nil || c.Check.Size() != g.Size() || c.Check == c.World) {
		return &fairgo.ArgError{
			Arg:    "check communicator",
			Value:  c.Check,
			Reason: fmt.Sprintf("must hold the %d ranks, apart from the world communicator", g.Size()),
		}
	}
	for _, x := range []struct {
		name       string
		cm         Comm
		size, rank int
	}{
		{"intra reduce-scatter", c.IntraReduceScatter, g.Devices, g.Local},
		{"intra all-gather", c.IntraAllGather, g.Devices, g.Local},
		{"rail collect", c.RailCollect, g.Machines, g.Machine},
		{"rail diffuse", c.RailDiffuse, g.Machines, g.Machine},
	} {
		if err := check(x.name, x.cm, x.size, x.rank); err != nil {
			return err
		}
	}
	return nil
}
