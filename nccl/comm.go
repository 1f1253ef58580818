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
type Comm struct {
	lib         *dso
	h           commHandle
	nonblocking bool
	state       atomic.Int32
}

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
	if err := c.live(); err != nil {
		return err
	}
	if err := c.lib.check(s); err != nil {
		return err
	}
	r := f()
	if r == InProgress && c.nonblocking {
		return c.WaitReady(context.Background())
	}
	return c.lib.err(op, r, c.h)
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
	if err := c.live(); err != nil {
		return 0, err
	}
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
// of the parent must call it (concurrently, or inside a group).
func (c *Comm) Split(color, key int, cfg *Config) (*Comm, error) {
	if err := c.live(); err != nil {
		return nil, err
	}
	if err := c.lib.check(symCommSplit); err != nil {
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
	h, r := cCommSplit(c.lib.table, c.h, color, key, cc)
	if r != Success && !(r == InProgress && c.nonblocking) {
		return nil, c.lib.err("ncclCommSplit", r, c.h)
	}
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
	if r == InProgress {
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
// not waited for. It may be called from any goroutine, also while another
// call is blocked in NCCL; later calls fail with ErrAborted.
func (c *Comm) Abort() error {
	if !c.state.CompareAndSwap(stateLive, stateAborted) {
		return nil
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
