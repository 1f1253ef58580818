package cuda

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/logging"
	"github.com/fairgo/fairgo/nccl"
	"github.com/fairgo/fairgo/rendezvous"
	"github.com/fairgo/fairgo/streams"
)

var _ backend.Comm = (*Comm)(nil)

// Comm is one rank's NCCL communicator on a Device, as backend.Comm.
type Comm struct {
	d          *Device
	lib        *nccl.Library
	c          *nccl.Comm
	name       string
	size, rank int
}

// NewComm wraps an NCCL communicator made for d's GPU; the Comm owns it
// (Close destroys it).
func NewComm(d *Device, c *nccl.Comm, name string) (*Comm, error) {
	lib, err := d.nccl()
	if err != nil {
		return nil, err
	}
	size, err := c.Count()
	if err != nil {
		return nil, err
	}
	rank, err := c.UserRank()
	if err != nil {
		return nil, err
	}
	return &Comm{d: d, lib: lib, c: c, name: name, size: size, rank: rank}, nil
}

// NCCL returns the underlying communicator.
func (c *Comm) NCCL() *nccl.Comm { return c.c }

// Device returns the communicator's device.
func (c *Comm) Device() *Device { return c.d }

// Size is the number of ranks.
func (c *Comm) Size() int { return c.size }

// Rank is this rank's index.
func (c *Comm) Rank() int { return c.rank }

// Name identifies the communicator in errors and logs.
func (c *Comm) Name() string { return c.name }

func (c *Comm) String() string {
	return fmt.Sprintf("%s (rank %d of %d on %v)", c.name, c.rank, c.size, c.d)
}

func (c *Comm) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("cuda: %s on %s: %w", op, c.name, err)
}

// enqueue runs one NCCL call with the device's context current and the
// stream's handle.
func (c *Comm) enqueue(op string, s streams.Stream, call func(stream uintptr) error) error {
	cs, err := c.d.stream(s)
	if err != nil {
		return err
	}
	return c.wrap(op, c.d.do(func() error {
		if err := c.d.group.hold(c); err != nil {
			return err
		}
		return call(cs.Handle())
	}))
}

func (c *Comm) types(dt fairgo.DType, op fairgo.Op, withOp bool) (nccl.DataType, nccl.RedOp, error) {
	ndt, err := c.lib.DataType(dt)
	if err != nil || !withOp {
		return ndt, 0, err
	}
	nop, err := c.lib.RedOp(op)
	return ndt, nop, err
}

// AllReduce enqueues ncclAllReduce.
func (c *Comm) AllReduce(send, recv uintptr, count int64, dt fairgo.DType, op fairgo.Op, s streams.Stream) error {
	ndt, nop, err := c.types(dt, op, true)
	if err != nil {
		return err
	}
	return c.enqueue("all-reduce", s, func(st uintptr) error { return c.c.AllReduce(send, recv, count, ndt, nop, st) })
}

// ReduceScatter enqueues ncclReduceScatter.
func (c *Comm) ReduceScatter(send, recv uintptr, recvCount int64, dt fairgo.DType, op fairgo.Op, s streams.Stream) error {
	ndt, nop, err := c.types(dt, op, true)
	if err != nil {
		return err
	}
	return c.enqueue(
		"reduce-scatter",
		s,
		func(st uintptr) error { return c.c.ReduceScatter(send, recv, recvCount, ndt, nop, st) },
	)
}

// AllGather enqueues ncclAllGather.
func (c *Comm) AllGather(send, recv uintptr, sendCount int64, dt fairgo.DType, s streams.Stream) error {
	ndt, _, err := c.types(dt, 0, false)
	if err != nil {
		return err
	}
	return c.enqueue("all-gather", s, func(st uintptr) error { return c.c.AllGather(send, recv, sendCount, ndt, st) })
}

// Broadcast enqueues ncclBroadcast.
func (c *Comm) Broadcast(send, recv uintptr, count int64, dt fairgo.DType, root int, s streams.Stream) error {
	ndt, _, err := c.types(dt, 0, false)
	if err != nil {
		return err
	}
	return c.enqueue("broadcast", s, func(st uintptr) error { return c.c.Broadcast(send, recv, count, ndt, root, st) })
}

// AllToAllv enqueues, in one NCCL group, a send of sendCounts[k] elements
// from send+sendDispls[k] to each rank k and a receive of recvCounts[k]
// elements into recv+recvDispls[k] from it; zero counts are skipped.
func (c *Comm) AllToAllv(send uintptr, sendCounts, sendDispls []int64, recv uintptr, recvCounts, recvDispls []int64,
	dt fairgo.DType, s streams.Stream) error {
	ndt, _, err := c.types(dt, 0, false)
	if err != nil {
		return err
	}
	for _, a := range []struct {
		name string
		v    []int64
	}{{"sendCounts", sendCounts}, {"sendDispls", sendDispls}, {"recvCounts", recvCounts}, {"recvDispls", recvDispls}} {
		if len(a.v) != c.size {
			return &fairgo.ArgError{
				Arg:    a.name,
				Value:  len(a.v),
				Reason: fmt.Sprintf("needs one entry per rank (%d)", c.size),
			}
		}
		for k, x := range a.v {
			if x < 0 {
				return &fairgo.ArgError{Arg: fmt.Sprintf("%s[%d]", a.name, k), Value: x, Reason: "negative"}
			}
		}
	}
	size := int64(dt.Size())
	return c.d.Group(func() error {
		return c.enqueue("all-to-all", s, func(st uintptr) error {
			for k := 0; k < c.size; k++ {
				if n := sendCounts[k]; n > 0 {
					if err := c.c.Send(send+uintptr(sendDispls[k]*size), n, ndt, k, st); err != nil {
						return err
					}
				}
				if n := recvCounts[k]; n > 0 {
					if err := c.c.Recv(recv+uintptr(recvDispls[k]*size), n, ndt, k, st); err != nil {
						return err
					}
				}
			}
			return nil
		})
	})
}

// Err reports an asynchronous failure of the communicator
// (ncclCommGetAsyncError), ErrAborted-wrapping errors after Abort, or nil.
func (c *Comm) Err() error {
	st, err := c.c.GetAsyncError()
	if err != nil {
		return c.wrap("async error", err)
	}
	if st == nccl.Success || st == nccl.InProgress {
		return nil
	}
	return c.wrap("async error", &nccl.Error{Code: st, Op: "ncclCommGetAsyncError", Text: c.lib.GetErrorString(st)})
}

// Abort calls ncclCommAbort; it never waits for peers.
func (c *Comm) Abort() error { return c.wrap("abort", c.c.Abort()) }

// Close destroys the communicator (nothing to do after Abort).
func (c *Comm) Close() error {
	if c.d.alive() != nil { // NCCL selects the device itself
		return c.wrap("destroy", c.c.Destroy())
	}
	return c.wrap("destroy", c.d.do(c.c.Destroy))
}

// groupState remembers the communicators used inside a Device.Group: each
// is held (nccl.Comm.Hold) from its first call queued in the group to the
// end of ncclGroupEnd, which runs the queued calls on it, so that an abort
// from another goroutine waits for them rather than free the communicator
// under them (abortDrain at most: a blocking communicator's ncclGroupEnd
// that waits for a peer's connection ends only by the abort); the
// non-blocking ones are waited for once ncclGroupEnd leaves them in
// progress.
type groupState struct {
	mu    sync.Mutex
	depth int
	held  []*Comm
}

// hold holds c for the group under way, once (nothing outside a group).
func (g *groupState) hold(c *Comm) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.depth == 0 || slices.Contains(g.held, c) {
		return nil
	}
	if err := c.c.Hold(); err != nil {
		return err
	}
	g.held = append(g.held, c)
	return nil
}

// Group runs fn between ncclGroupStart and ncclGroupEnd on one locked OS
// thread with the device's context current, so the communicator calls fn
// makes are fused into one launch. ncclGroupEnd runs even when fn fails.
func (d *Device) Group(fn func() error) error {
	lib, err := d.nccl()
	if err != nil {
		return err
	}
	return d.do(func() error {
		if err := lib.GroupStart(); err != nil {
			return err
		}
		d.group.mu.Lock()
		d.group.depth++
		d.group.mu.Unlock()
		ferr := fn()
		d.group.mu.Lock()
		d.group.depth--
		var held []*Comm
		if d.group.depth == 0 {
			held, d.group.held = d.group.held, nil
		}
		d.group.mu.Unlock()
		eerr := lib.GroupEnd()
		for _, c := range held {
			c.c.Release() // WaitReady polls between calls: an abort may come meanwhile
		}
		if errors.Is(eerr, nccl.ErrInProgress) {
			eerr = nil
			for _, c := range held {
				if c.c.NonBlocking() {
					eerr = errors.Join(eerr, c.c.WaitReady(context.Background()))
				}
			}
		}
		return errors.Join(ferr, eerr)
	})
}

// Duplicate makes, for each of comms (this process's ranks of one
// communicator, each on a device of its own), a new communicator of the
// same ranks in the same order, named name: ncclCommSplit(color 0, key =
// rank) on every rank at once, each on a locked OS thread with its device
// current, as Backend makes its communicators. Every rank of the
// communicator, in every process, must call it. NCCL reads its tuning
// variables (NCCL_ALGO, NCCL_PROTO, ...) when it initialises a
// communicator, so a copy made while they have other values than at the
// original's making behaves differently: a flat ring baseline is the world
// communicator duplicated under NCCL_ALGO=Ring. It needs ncclCommSplit
// (NCCL 2.18 or newer). On error nothing is left: the copies made are
// aborted. DuplicateAlgo sets NCCL_ALGO for the copies itself.
func Duplicate(ctx context.Context, comms []*Comm, name string) ([]*Comm, error) {
	return duplicate(ctx, comms, name, "")
}

// duplicate is Duplicate with NCCL_ALGO=algoEnv held (algoWindow) around
// each rank's split, from before it starts until it has returned, even
// when ctx ends first; "" leaves the environment alone.
func duplicate(ctx context.Context, comms []*Comm, name, algoEnv string) ([]*Comm, error) {
	if len(comms) == 0 {
		return nil, &fairgo.ArgError{Arg: "communicators to duplicate", Value: 0, Reason: "none"}
	}
	devs := make([]*Device, len(comms))
	for i, c := range comms {
		if c == nil {
			return nil, &fairgo.ArgError{Arg: "communicators to duplicate", Value: i, Reason: "nil"}
		}
		devs[i] = c.d
	}
	if lib := comms[0].lib; !lib.Supports("ncclCommSplit") {
		return nil, fmt.Errorf(
			"cuda: duplicating %s needs ncclCommSplit (NCCL 2.18 or newer), not in %v",
			comms[0].name,
			lib,
		)
	}
	what := name + " (split of " + comms[0].name + ")"
	if algoEnv != "" {
		what += " under NCCL_ALGO=" + algoEnv
	}
	raw, err := eachRank(ctx, what, devs, func(i int) (c *nccl.Comm, err error) {
		split := func() error {
			c, err = comms[i].c.Split(0, comms[i].rank, nil)
			return err
		}
		if algoEnv == "" {
			err = split()
		} else {
			err = algoWindow.within(ctx, algoEnv, split)
		}
		if err == nil && c == nil {
			err = fmt.Errorf(
				"ncclCommSplit(color 0, key %d) of %s returned no communicator",
				comms[i].rank,
				comms[i].name,
			)
		}
		return c, err
	})
	if err != nil {
		return nil, err
	}
	out := make([]*Comm, len(raw))
	for i, r := range raw {
		cm, err := NewComm(devs[i], r, name)
		if err == nil && (cm.Size() != comms[i].size || cm.Rank() != comms[i].rank) {
			err = fmt.Errorf(
				"cuda: %s is rank %d of %d, its original %s rank %d of %d",
				name,
				cm.Rank(),
				cm.Size(),
				comms[i].name,
				comms[i].rank,
				comms[i].size,
			)
		}
		if err != nil {
			for _, c := range raw {
				_ = c.Abort()
			}
			return nil, err
		}
		out[i] = cm
	}
	return out, nil
}

// NewLocalRanks builds, in one process, a machines × perMachine grid over
// devs (rank r = m·perMachine + d runs on devs[r], each GPU once) and the
// six NCCL communicators of every rank, the way Backend makes them (a world
// communicator, then ncclCommSplit, or unique ids without it), with the
// grid declared instead of discovered. One-rank intra or rail communicators
// are left nil, as hier allows. Each rank gets Variants where NCCL has
// ncclCommSplit. The caller keeps the devices; CloseRanks destroys the
// communicators (not those Variants made: their callers close them).
func NewLocalRanks(devs []*Device, machines, perMachine int) ([]backend.Rank, error) {
	if machines < 1 || perMachine < 1 || len(devs) != machines*perMachine {
		return nil, &fairgo.ArgError{
			Arg:    "grid",
			Value:  fmt.Sprintf("%d×%d over %d devices", machines, perMachine, len(devs)),
			Reason: "needs machines, perMachine ≥ 1 and one device per rank",
		}
	}
	seen := map[int]bool{}
	for _, d := range devs {
		if d == nil || d.alive() != nil {
			return nil, &fairgo.ArgError{Arg: "device", Value: d, Reason: "nil or closed"}
		}
		if seen[d.ordinal] {
			return nil, &fairgo.ArgError{Arg: "device", Value: d, Reason: "used twice; one rank per GPU"}
		}
		seen[d.ordinal] = true
	}
	n := len(devs)
	places := make(backend.Placement, n)
	ranks := make([]int, n)
	for r := range devs {
		ranks[r] = r
		places[r] = fairgo.Grid{Machines: machines, Devices: perMachine, Machine: r / perMachine, Local: r % perMachine}
	}
	return connect(context.Background(), rendezvous.NewMemoryStore(), places, ranks, devs, false, logging.Default())
}

// CloseRanks destroys the communicators of ranks made by NewLocalRanks (the
// devices stay open). Each rank destroys its own on a goroutine of its own,
// all in the same order, in case the NCCL in use synchronises peers there.
func CloseRanks(ranks []backend.Rank) error {
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i := range ranks {
		wg.Add(1)
		go func(c *backend.Comms) {
			defer wg.Done()
			for _, p := range []*backend.Comm{&c.World, &c.IntraReduceScatter, &c.IntraAllGather, &c.RailCollect,
				&c.RailDiffuse, &c.Check} {
				if *p != nil {
					errs[i] = errors.Join(errs[i], (*p).Close())
					*p = nil
				}
			}
		}(&ranks[i].Comms)
	}
	wg.Wait()
	return errors.Join(errs...)
}
