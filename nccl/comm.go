package nccl

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/internal/poll"
)

// NoColor is NCCL_SPLIT_NOCOLOR: the rank joins no communicator in Split.
const NoColor = -1

const (
	stateLive int32 = iota
	stateAborted
	stateDestroyed
)

// Comm is an NCCL communicator. Its enqueueing calls return once the work is
// on the stream; like NCCL, they must not be called concurrently on one
// communicator, except Abort and GetAsyncError, which may be called from any
// goroutine at any time.
//
// What holds: NCCL frees a communicator in ncclCommAbort, and a call inside
// NCCL on it meanwhile reads freed memory (on NCCL 2.28, a blocking
// communicator's ncclGroupEnd that was connecting to a peer crashed its
// process when another thread aborted it). So every call counts itself in
// inFlight while it is inside NCCL, and Abort, once it has marked the
// communicator aborted (a call that enters afterwards fails with ErrAborted
// without touching it), waits for the calls inside to leave before it
// calls ncclCommAbort. On a non-blocking communicator no call stays long
// (a connection or a launch that waits is NCCL's thread's, polled by
// WaitReady between calls); a blocking one's call may never leave, and
// Abort goes ahead after abortDrain.
type Comm struct {
	lib         *dso
	h           commHandle
	nonblocking bool
	state       atomic.Int32
	inFlight    atomic.Int32
}

// abortDrain bounds Abort's wait for the calls inside NCCL to leave: a
// blocking communicator's call can stay there for good (a peer that never
// connects), and only the abort ends it.
const abortDrain = 500 * time.Millisecond

// enter counts a call inside NCCL, or fails it with ErrAborted or
// ErrDestroyed. The count is raised before the state is read, and Abort
// writes the state before it reads the count, so that either the call sees
// the abort or the abort sees the call (both atomics are sequentially
// consistent).
func (c *Comm) enter() error {
	c.inFlight.Add(1)
	if err := c.live(); err != nil {
		c.inFlight.Add(-1)
		return err
	}
	return nil
}

func (c *Comm) leave() { c.inFlight.Add(-1) }

// Hold keeps Abort from freeing the communicator until Release: for a
// group, from the first call queued on it to the end of ncclGroupEnd, which
// runs the queued calls (Library.GroupEnd knows no communicator). It fails
// with ErrAborted or ErrDestroyed, holding nothing, once the communicator
// is gone.
func (c *Comm) Hold() error { return c.enter() }

// Release ends a Hold.
func (c *Comm) Release() { c.leave() }

func (l *dso) newComm(h commHandle, nonblocking bool) *Comm {
	l.acquire()
	return &Comm{lib: l, h: h, nonblocking: nonblocking}
}

// NonBlocking reports whether the communicator was made non-blocking
// (CommInitRankConfig).
func (c *Comm) NonBlocking() bool { return c.nonblocking }

func (c *Comm) live() error {
	switch c.state.Load() {
	case stateAborted:
		return ErrAborted
	case stateDestroyed:
		return ErrDestroyed
	}
	return nil
}

// call runs one NCCL function on the communicator; on a non-blocking
// communicator an ncclInProgress answer is waited out.
func (c *Comm) call(op string, s sym, f func() Result) error {
	if err := c.enter(); err != nil {
		return err
	}
	if err := c.lib.check(s); err != nil {
		c.leave()
		return err
	}
	r := f()
	if r == InProgress && c.nonblocking {
		c.leave()
		return c.WaitReady(context.Background())
	}
	err := c.lib.err(op, r, c.h) // ncclGetLastError reads the communicator: still inside
	c.leave()
	return err
}

// WaitReady polls ncclCommGetAsyncError until the communicator is no longer
// in progress (a non-blocking init, split or call), ctx is done (ctx.Err()
// is returned unchanged), or the communicator failed.
func (c *Comm) WaitReady(ctx context.Context) error {
	// A non-blocking communicator's call returns while a thread of NCCL's
	// launches it, tens of microseconds: naps stay short.
	b := poll.Backoff{Max: 100 * time.Microsecond}
	for {
		st, err := c.GetAsyncError()
		if err != nil {
			return err
		}
		switch st {
		case Success:
			return nil
		case InProgress:
		default:
			return c.lib.err("ncclCommGetAsyncError", st, c.h)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		b.Wait()
	}
}

// GetAsyncError calls ncclCommGetAsyncError: the communicator's state
// (Success, InProgress, or the code of an asynchronous failure). The error
// is for a failure of the query itself.
func (c *Comm) GetAsyncError() (Result, error) {
	if err := c.enter(); err != nil {
		return 0, err
	}
	defer c.leave()
	st, r := cCommGetAsyncError(c.lib.table, c.h)
	if r != Success {
		return 0, c.lib.err("ncclCommGetAsyncError", r, c.h)
	}
	return st, nil
}

// Count calls ncclCommCount.
func (c *Comm) Count() (int, error) {
	var n int
	err := c.call("ncclCommCount", symCommCount, func() Result {
		var r Result
		n, r = cCommCount(c.lib.table, c.h)
		return r
	})
	return n, err
}

// UserRank calls ncclCommUserRank.
func (c *Comm) UserRank() (int, error) {
	var n int
	err := c.call("ncclCommUserRank", symCommUserRank, func() Result {
		var r Result
		n, r = cCommUserRank(c.lib.table, c.h)
		return r
	})
	return n, err
}

// Split calls ncclCommSplit (NCCL 2.18+): ranks passing the same color form a
// communicator, ordered by key. With color NoColor the rank joins none and
// gets (nil, nil). A nil cfg inherits the parent's configuration. Every rank
// of the parent must call it (concurrently, or inside a group; on a
// non-blocking parent not inside a group: Split waits for the split).
func (c *Comm) Split(color, key int, cfg *Config) (*Comm, error) {
	if err := c.enter(); err != nil {
		return nil, err
	}
	if err := c.lib.check(symCommSplit); err != nil {
		c.leave()
		return nil, err
	}
	var cc *cConfig
	if cfg != nil {
		b := -1
		if c.nonblocking {
			b = 0
		}
		cc = newCConfig(cfg, b)
		defer cc.free()
	}
	slot, r := cCommSplit(c.lib.table, c.h, color, key, cc)
	if r != Success && !(r == InProgress && c.nonblocking) {
		err := c.lib.err("ncclCommSplit", r, c.h)
		c.leave()
		return nil, err
	}
	c.leave()
	if c.nonblocking {
		// On a non-blocking parent NCCL returns at once (ncclSuccess, as
		// of 2.28), learns whether this rank has a child (every rank's
		// color) in the split's job, and writes the child only when the
		// job ends, which the parent's state reports.
		if err := c.WaitReady(context.Background()); err != nil {
			return nil, fmt.Errorf("nccl: ncclCommSplit: %w", err)
		}
	}
	h := slot.take()
	if h == 0 {
		if color == NoColor {
			return nil, nil
		}
		return nil, fmt.Errorf(
			"nccl: ncclCommSplit returned no communicator (called between GroupStart and GroupEnd? creating "+
				"communicators inside a group is not supported): %w",
			ErrNotSupported,
		)
	}
	child := c.lib.newComm(h, c.nonblocking)
	if c.nonblocking {
		if err := child.WaitReady(context.Background()); err != nil {
			_ = child.Abort()
			return nil, err
		}
	}
	return child, nil
}

// Destroy calls ncclCommDestroy, which waits for the communicator's pending
// work. It must not race with other calls on c; after Abort it does nothing.
func (c *Comm) Destroy() error {
	if !c.state.CompareAndSwap(stateLive, stateDestroyed) {
		return nil
	}
	r := cCommDestroy(c.lib.table, c.h)
	err := c.lib.err("ncclCommDestroy", r, 0)
	_ = c.lib.release()
	return err
}

// Abort calls ncclCommAbort: pending work is stopped and fails, peers are
// not waited for. It may be called from any goroutine; later calls fail
// with ErrAborted. It first waits for the calls inside NCCL to leave
// (abortDrain at most: see Comm).
func (c *Comm) Abort() error {
	if !c.state.CompareAndSwap(stateLive, stateAborted) {
		return nil
	}
	nap := poll.Backoff{Max: time.Millisecond}
	for deadline := time.Now().Add(abortDrain); c.inFlight.Load() > 0 && time.Now().Before(deadline); {
		nap.Wait()
	}
	r := cCommAbort(c.lib.table, c.h)
	err := c.lib.err("ncclCommAbort", r, 0)
	_ = c.lib.release()
	return err
}

func checkCount(name string, n int64) error {
	if n < 0 {
		return &fairgo.ArgError{Arg: name, Value: n, Reason: "negative"}
	}
	return nil
}

func (c *Comm) checkPeer(name string, p int) error {
	n, err := c.Count()
	if err != nil {
		return err
	}
	if p < 0 || p >= n {
		return &fairgo.ArgError{Arg: name, Value: p, Reason: fmt.Sprintf("outside [0, %d)", n)}
	}
	return nil
}

// AllReduce calls ncclAllReduce.
func (c *Comm) AllReduce(send, recv uintptr, count int64, dt DataType, op RedOp, stream uintptr) error {
	if err := checkCount("count", count); err != nil {
		return err
	}
	return c.call("ncclAllReduce", symAllReduce, func() Result {
		return cReduce(c.lib.table, symAllReduce, send, recv, count, dt, op, c.h, stream)
	})
}

// ReduceScatter calls ncclReduceScatter; recvCount is per rank.
func (c *Comm) ReduceScatter(send, recv uintptr, recvCount int64, dt DataType, op RedOp, stream uintptr) error {
	if err := checkCount("recvCount", recvCount); err != nil {
		return err
	}
	return c.call("ncclReduceScatter", symReduceScatter, func() Result {
		return cReduce(c.lib.table, symReduceScatter, send, recv, recvCount, dt, op, c.h, stream)
	})
}

// AllGather calls ncclAllGather; sendCount is per rank.
func (c *Comm) AllGather(send, recv uintptr, sendCount int64, dt DataType, stream uintptr) error {
	if err := checkCount("sendCount", sendCount); err != nil {
		return err
	}
	return c.call("ncclAllGather", symAllGather, func() Result {
		return cAllGather(c.lib.table, send, recv, sendCount, dt, c.h, stream)
	})
}

// Broadcast calls ncclBroadcast.
func (c *Comm) Broadcast(send, recv uintptr, count int64, dt DataType, root int, stream uintptr) error {
	if err := checkCount("count", count); err != nil {
		return err
	}
	if err := c.checkPeer("root", root); err != nil {
		return err
	}
	return c.call("ncclBroadcast", symBroadcast, func() Result {
		return cBroadcast(c.lib.table, send, recv, count, dt, root, c.h, stream)
	})
}

// Send calls ncclSend.
func (c *Comm) Send(buf uintptr, count int64, dt DataType, peer int, stream uintptr) error {
	if err := checkCount("count", count); err != nil {
		return err
	}
	return c.call("ncclSend", symSend, func() Result {
		return cSend(c.lib.table, buf, count, dt, peer, c.h, stream)
	})
}

// Recv calls ncclRecv.
func (c *Comm) Recv(buf uintptr, count int64, dt DataType, peer int, stream uintptr) error {
	if err := checkCount("count", count); err != nil {
		return err
	}
	return c.call("ncclRecv", symRecv, func() Result {
		return cRecv(c.lib.table, buf, count, dt, peer, c.h, stream)
	})
}
