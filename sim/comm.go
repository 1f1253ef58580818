package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/internal/elem"
	"github.com/fairgo/fairgo/streams"
)

type kind int

const (
	kAllReduce kind = iota + 1
	kReduceScatter
	kAllGather
	kBroadcast
	kAllToAll
)

var kindNames = map[kind]string{
	kAllReduce: "all-reduce", kReduceScatter: "reduce-scatter", kAllGather: "all-gather",
	kBroadcast: "broadcast", kAllToAll: "all-to-all",
}

// call is what one rank enqueued.
type call struct {
	kind       kind
	rank       int
	dev        *Device
	send, recv uintptr
	count      int64 // all-reduce and broadcast: count; reduce-scatter: recvCount; all-gather: sendCount
	dt         fairgo.DType
	op         fairgo.Op
	root       int
	sendCounts []int64
	sendDispls []int64
	recvCounts []int64
	recvDispls []int64
}

func (c *call) String() string {
	switch c.kind {
	case kAllReduce:
		return fmt.Sprintf("all-reduce %v of %d %v", c.op, c.count, c.dt)
	case kReduceScatter:
		return fmt.Sprintf("reduce-scatter %v of %d %v per rank", c.op, c.count, c.dt)
	case kAllGather:
		return fmt.Sprintf("all-gather of %d %v per rank", c.count, c.dt)
	case kBroadcast:
		return fmt.Sprintf("broadcast of %d %v from root %d", c.count, c.dt, c.root)
	}
	var total int64
	for _, n := range c.sendCounts {
		total += n
	}
	return fmt.Sprintf(
		"all-to-all of %d %v (send counts %v, receive counts %v)",
		total,
		c.dt,
		c.sendCounts,
		c.recvCounts,
	)
}

// group is a communicator: its members and the meeting points of its calls.
type group struct {
	name    string
	members []*Device // by communicator rank
	stall   time.Duration
	delay   time.Duration // before each all-reduce (Config.WorldDelay, AlgoDelay)

	// enqueued counts each rank's calls enqueued on the communicator (by
	// communicator rank): a missing rank whose count has not passed a
	// stalled call's number never made the call.
	enqueued []atomic.Uint64

	mu       sync.Mutex
	meetings map[uint64]*meeting
	err      error         // sticky failure (mismatch, stall, illegal address, abort, close)
	failed   chan struct{} // closed when err is first set

	// connectFirst (Config.ConnectAtFirstCall): each handle's first call
	// blocks its caller until every handle has made one. joined marks
	// the handles (by communicator rank) that have, under mu; connected
	// is closed when all have.
	connectFirst bool
	joined       []bool
	connected    chan struct{}

	// hangOnMismatch (Config.HangOnMismatch): a meeting whose calls
	// differ is never executed; its ranks wait as for a missing peer.
	hangOnMismatch bool
}

// meeting gathers the ranks of one call (one sequence number).
type meeting struct {
	seq     uint64
	calls   []*call
	arrived int
	done    chan struct{} // closed after the data movement (or its failure)
	err     error
	hung    bool // every rank arrived, with calls that differ, and the group hangs on a mismatch (under mu)
}

func newGroup(name string, members []*Device, stall time.Duration) *group {
	return &group{
		name:      name,
		members:   members,
		stall:     stall,
		enqueued:  make([]atomic.Uint64, len(members)),
		meetings:  map[uint64]*meeting{},
		failed:    make(chan struct{}),
		joined:    make([]bool, len(members)),
		connected: make(chan struct{}),
	}
}

func (g *group) size() int { return len(g.members) }

// fail records err as the communicator's failure unless it already failed.
func (g *group) fail(err error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.failLocked(err)
}

func (g *group) failLocked(err error) error {
	if g.err == nil {
		g.err = err
		close(g.failed)
	}
	return g.err
}

func (g *group) failure() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// run is a collective as its stream executes it: wait for this handle's
// previous call (NCCL runs a communicator's calls in order), wait out the
// communicator's delay, then meet the other ranks.
func (g *group) run(ctx context.Context, seq uint64, c *call, prev <-chan struct{}) error {
	if prev != nil {
		select {
		case <-prev:
		case <-g.failed:
			return g.failure()
		case <-ctx.Done():
			return c.dev.closedErr()
		}
	}
	if g.delay > 0 && c.kind == kAllReduce {
		t := time.NewTimer(g.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-g.failed:
			return g.failure()
		case <-ctx.Done():
			return c.dev.closedErr()
		}
	}
	return g.arrive(ctx, seq, c)
}

func (g *group) arrive(ctx context.Context, seq uint64, c *call) error {
	n := g.size()
	g.mu.Lock()
	if g.err != nil {
		defer g.mu.Unlock()
		return g.err
	}
	m := g.meetings[seq]
	if m == nil {
		m = &meeting{seq: seq, calls: make([]*call, n), done: make(chan struct{})}
		g.meetings[seq] = m
	}
	m.calls[c.rank] = c
	m.arrived++
	if m.arrived == n && g.hangOnMismatch && g.check(m) != nil {
		m.hung = true // nobody executes it: every rank waits below, as NCCL's would
	}
	if m.arrived == n && !m.hung {
		delete(g.meetings, seq)
		g.mu.Unlock()
		err := g.check(m)
		if err == nil {
			err = g.execute(m)
		}
		if err != nil {
			g.fail(err)
		}
		m.err = err
		close(m.done)
		return err
	}
	g.mu.Unlock()

	timer := time.NewTimer(g.stall)
	defer timer.Stop()
	var failure error
	select {
	case <-m.done:
		return m.err
	case <-ctx.Done():
		failure = c.dev.closedErr()
	case <-g.failed:
	case <-timer.C:
	}
	g.mu.Lock()
	if m.arrived == n && !m.hung { // complete and being executed: its outcome wins
		g.mu.Unlock()
		<-m.done
		return m.err
	}
	if failure == nil {
		failure = g.failLocked(g.stallError(m))
	}
	g.mu.Unlock()
	return failure
}

// stallError describes m; the caller holds g.mu.
func (g *group) stallError(m *meeting) *StallError {
	e := &StallError{Comm: g.name, Seq: m.seq, Timeout: g.stall}
	for r, c := range m.calls {
		if c == nil {
			e.Missing = append(e.Missing, r)
			if g.enqueued[r].Load() <= m.seq {
				e.NotCalled = append(e.NotCalled, r)
			}
		} else {
			e.Arrived = append(e.Arrived, r)
			e.Calls = append(e.Calls, c.String())
		}
	}
	return e
}

// check verifies that every rank enqueued the same call.
func (g *group) check(m *meeting) error {
	c0 := m.calls[0]
	ok := true
	for _, c := range m.calls[1:] {
		if c.kind != c0.kind || c.dt != c0.dt {
			ok = false
			break
		}
		switch c.kind {
		case kAllReduce, kReduceScatter:
			ok = c.count == c0.count && c.op == c0.op
		case kAllGather:
			ok = c.count == c0.count
		case kBroadcast:
			ok = c.count == c0.count && c.root == c0.root
		}
		if !ok {
			break
		}
	}
	if ok && c0.kind == kAllToAll {
		for r, c := range m.calls {
			for k, peer := range m.calls {
				if c.sendCounts[k] != peer.recvCounts[r] {
					ok = false
				}
			}
		}
	}
	if ok {
		return nil
	}
	e := &MismatchError{Comm: g.name, Seq: m.seq}
	for _, c := range m.calls {
		e.Calls = append(e.Calls, c.String())
	}
	return e
}

// execute moves the data of a complete, consistent call for every rank:
// all reads into temporaries first, then all writes (so in-place
// reduce-scatter and all-gather are correct).
func (g *group) execute(m *meeting) error {
	c0 := m.calls[0]
	x := exchange{m: m, n: g.size(), size: int64(c0.dt.Size()),
		what: fmt.Sprintf("%s on %s seq %d", kindNames[c0.kind], g.name, m.seq)}
	switch c0.kind {
	case kAllReduce, kReduceScatter:
		return x.reduce()
	case kAllGather:
		return x.allGather()
	case kBroadcast:
		root := m.calls[c0.root]
		data, err := x.read(root, root.send, c0.count)
		if err != nil {
			return err
		}
		return x.writeAll(data)
	case kAllToAll:
		return x.allToAll()
	}
	return nil
}

// exchange is one meeting's data movement: its calls (one per rank, in
// rank order), their element size, and what errors call it.
type exchange struct {
	m    *meeting
	n    int
	size int64
	what string
}

func (x exchange) read(c *call, ptr uintptr, elems int64) ([]byte, error) {
	return c.dev.mem.read(x.what, ptr, elems*x.size)
}

func (x exchange) write(c *call, ptr uintptr, data []byte) error {
	return c.dev.mem.write(x.what, ptr, data)
}

// writeAll writes data to every rank's receive buffer.
func (x exchange) writeAll(data []byte) error {
	for _, c := range x.m.calls {
		if err := x.write(c, c.recv, data); err != nil {
			return err
		}
	}
	return nil
}

// reduce is an all-reduce or a reduce-scatter: every rank's input read
// (pre-multiplied by 1/n for a floating-point Avg, as NCCL does), reduced
// in ring order chunk by chunk.
func (x exchange) reduce() error {
	c0, n, size := x.m.calls[0], x.n, x.size
	dt, count := c0.dt, c0.count
	total := count
	if c0.kind == kReduceScatter {
		total = count * int64(n)
	}
	var frees []func()
	defer func() {
		for _, free := range frees {
			free()
		}
	}()
	scratch := func(bytes int64) []byte {
		b, free := newScratch(bytes)
		frees = append(frees, free)
		return b
	}
	inputs := make([][]byte, n)
	for r, c := range x.m.calls {
		b := scratch(total * size)
		if err := c.dev.mem.readInto(x.what, c.send, b); err != nil {
			return err
		}
		inputs[r] = b
	}
	if c0.op == fairgo.Avg && dt.IsFloat() {
		for _, b := range inputs {
			if err := elem.PreMulInverse(dt, b, n); err != nil {
				return err
			}
		}
	}
	if c0.kind == kReduceScatter {
		block := scratch(count * size)
		for b, c := range x.m.calls {
			if err := ringReduce(block, inputs, int64(b)*count*size, b, dt, c0.op); err != nil {
				return err
			}
			if err := x.write(c, c.recv, block); err != nil {
				return err
			}
		}
		return nil
	}
	// All-reduce: a ring reduce-scatter over n chunks, then every rank
	// receives the same bytes.
	result := scratch(total * size)
	for b := range n {
		lo, hi := total*int64(b)/int64(n), total*int64(b+1)/int64(n)
		if err := ringReduce(result[lo*size:hi*size], inputs, lo*size, b, dt, c0.op); err != nil {
			return err
		}
	}
	return x.writeAll(result)
}

// allGather concatenates every rank's input, in rank order, into every
// rank's receive buffer.
func (x exchange) allGather() error {
	count := x.m.calls[0].count
	block := count * x.size
	all, free := newScratch(int64(x.n) * block)
	defer free()
	for i, c := range x.m.calls {
		if err := c.dev.mem.readInto(x.what, c.send, all[int64(i)*block:int64(i+1)*block]); err != nil {
			return err
		}
	}
	return x.writeAll(all)
}

// allToAll moves block k of every rank's send to rank k.
func (x exchange) allToAll() error {
	n, size := x.n, x.size
	parts := make([][][]byte, n) // parts[from][to]
	for r, c := range x.m.calls {
		parts[r] = make([][]byte, n)
		for k := range n {
			b, err := x.read(c, c.send+uintptr(c.sendDispls[k]*size), c.sendCounts[k])
			if err != nil {
				return err
			}
			parts[r][k] = b
		}
	}
	for k, c := range x.m.calls {
		for r := range n {
			if err := x.write(c, c.recv+uintptr(c.recvDispls[r]*size), parts[r][k]); err != nil {
				return err
			}
		}
	}
	return nil
}

// ringReduce reduces bytes [off, off+len(acc)) of every input into acc the
// way a ring does for the chunk owned by rank owner: starting at rank
// owner+1, each hop combines the next rank's data, rounded in the element
// type, ending at the owner. Integer Avg divides the wrapped sum at the end
// (float Avg inputs were pre-multiplied by 1/n).
func ringReduce(acc []byte, inputs [][]byte, off int64, owner int, dt fairgo.DType, op fairgo.Op) error {
	n, length := len(inputs), int64(len(acc))
	copy(acc, inputs[(owner+1)%n][off:off+length])
	for j := 2; j <= n; j++ {
		if err := elem.Combine(dt, op, acc, inputs[(owner+j)%n][off:off+length]); err != nil {
			return err
		}
	}
	if op == fairgo.Avg && !dt.IsFloat() {
		if err := elem.Scale(dt, acc, n); err != nil {
			return err
		}
	}
	return nil
}

// Comm is one rank's handle on a simulated NCCL communicator. Calls are
// validated, numbered (a per-handle sequence assigned when enqueued) and
// enqueued on the given stream, which must belong to the handle's device.
// When the stream reaches a call, it waits for the handle's previous call,
// then for every rank to reach the same sequence number; the last to arrive
// checks that all enqueued the same call (else every rank fails with a
// *MismatchError), moves the data for everyone with NCCL's ring arithmetic,
// and releases them. Ranks missing for Config.StallTimeout make the others
// fail with a *StallError. Any failure is sticky for the whole communicator
// (Err reports it; later calls fail with it).
type Comm struct {
	g    *group
	rank int
	dev  *Device

	mu     sync.Mutex
	seq    uint64
	tail   chan struct{} // closed when the last enqueued call has finished
	closed bool
	joined bool // its first call was made (Config.ConnectAtFirstCall)

	aborted   chan struct{} // closed by this handle's Abort
	abortOnce sync.Once
}

var _ backend.Comm = (*Comm)(nil)

// Size is the number of ranks.
func (c *Comm) Size() int { return c.g.size() }

// Rank is this handle's rank.
func (c *Comm) Rank() int { return c.rank }

// Name identifies the communicator ("world", "intra-rs/machine=1",
// "intra-ag/machine=1", "rail-collect/local=0", "rail-diffuse/local=0").
func (c *Comm) Name() string { return c.g.name }

// Device is the device of this rank.
func (c *Comm) Device() *Device { return c.dev }

// Seq is the sequence number the next call will get.
func (c *Comm) Seq() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seq
}

func (c *Comm) String() string { return fmt.Sprintf("%s rank %d", c.g.name, c.rank) }

func (c *Comm) badArg(arg string, v any, why string) error {
	return &fairgo.ArgError{Arg: arg, Value: v, Reason: fmt.Sprintf("%s on %s", why, c)}
}

// enqueue numbers cl and enqueues it on st.
func (c *Comm) enqueue(st streams.Stream, cl *call) error {
	s, err := c.dev.stream(st)
	if err != nil {
		return err
	}
	if !cl.dt.Valid() {
		return &fairgo.ArgError{Arg: "dtype", Value: cl.dt, Reason: "unknown element type", Err: fairgo.ErrUnknownDType}
	}
	if (cl.kind == kAllReduce || cl.kind == kReduceScatter) && !cl.op.Valid() {
		return &fairgo.ArgError{Arg: "op", Value: cl.op, Reason: "unknown reduction operator", Err: fairgo.ErrUnknownOp}
	}
	if cl.count < 0 || cl.count > math.MaxInt64/int64(8*c.g.size()) {
		return c.badArg("count", cl.count, "out of range")
	}
	cl.rank, cl.dev = c.rank, c.dev
	if err := c.connect(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("sim: %s: %w", c, fairgo.ErrClosed)
	}
	seq, prev, mine := c.seq, c.tail, make(chan struct{})
	g := c.g
	err = s.enqueue(op{
		name: fmt.Sprintf("%s on %s seq %d", kindNames[cl.kind], g.name, seq),
		run:  func(ctx context.Context) error { return g.run(ctx, seq, cl, prev) },
		done: func(error) { close(mine) },
	})
	if err != nil {
		return err
	}
	c.seq++
	c.tail = mine
	g.enqueued[c.rank].Store(c.seq)
	return nil
}

// connect is NCCL's connection of a communicator at its first collective
// (NCCL_RUNTIME_CONNECT, on by default since NCCL 2.22), where
// Config.ConnectAtFirstCall asks for it: the handle's first call blocks
// its caller until every handle of the communicator has made its first
// call, this handle is aborted (only its own Abort: NCCL's blocked
// connection does not hear of a peer's), or the stall timeout passes.
// A rank that alone makes a collective on a communicator no peer has used
// yet blocks there, before anything reaches its stream.
func (c *Comm) connect() error {
	g := c.g
	if !g.connectFirst {
		return nil
	}
	c.mu.Lock()
	first := !c.joined && !c.closed // a closed handle fails at once (enqueue)
	c.joined = c.joined || first
	c.mu.Unlock()
	if !first {
		return nil
	}
	g.mu.Lock()
	g.joined[c.rank] = true
	if !slices.Contains(g.joined, false) {
		close(g.connected)
	}
	g.mu.Unlock()
	t := time.NewTimer(g.stall)
	defer t.Stop()
	select {
	case <-g.connected:
		return nil
	case <-c.aborted:
		return fmt.Errorf("sim: %s: connecting at its first call: aborted by this rank: %w", c, fairgo.ErrAborted)
	case <-c.dev.ctx.Done():
		return c.dev.closedErr()
	case <-t.C:
	}
	e := &StallError{Comm: g.name, Timeout: g.stall}
	g.mu.Lock()
	for r, j := range g.joined {
		if j {
			e.Arrived = append(e.Arrived, r)
			e.Calls = append(e.Calls, "its first call")
		} else {
			e.Missing = append(e.Missing, r)
			e.NotCalled = append(e.NotCalled, r)
		}
	}
	g.mu.Unlock()
	return e
}

// inPlaceOK checks the only overlap NCCL defines between a collective's
// buffers: big[at:at+smallBytes] == small exactly.
func (c *Comm) inPlaceOK(what string, big uintptr, bigBytes int64, small uintptr, smallBytes int64, at uintptr) error {
	if overlaps(big, bigBytes, small, smallBytes) && small != at {
		return c.badArg("buffers", fmt.Sprintf("%#x/%#x", big, small), what+" buffers overlap without being in place")
	}
	return nil
}

// AllReduce enqueues a ring all-reduce of count elements (in place when
// send == recv). Every rank receives bit-identical results.
func (c *Comm) AllReduce(send, recv uintptr, count int64, dt fairgo.DType, op fairgo.Op, s streams.Stream) error {
	b := count * int64(dt.Size())
	if err := c.inPlaceOK("all-reduce", recv, b, send, b, recv); err != nil {
		return err
	}
	return c.enqueue(s, &call{kind: kAllReduce, send: send, recv: recv, count: count, dt: dt, op: op})
}

// ReduceScatter enqueues a ring reduce-scatter: send holds Size()·recvCount
// elements, rank r receives the reduction of block r. In place when
// recv == send + Rank()·recvCount.
func (c *Comm) ReduceScatter(send, recv uintptr, recvCount int64, dt fairgo.DType, op fairgo.Op, s streams.Stream) error {
	b := recvCount * int64(dt.Size())
	if err := c.inPlaceOK("reduce-scatter", send, b*int64(c.Size()), recv, b, send+uintptr(int64(c.rank)*b)); err != nil {
		return err
	}
	return c.enqueue(s, &call{kind: kReduceScatter, send: send, recv: recv, count: recvCount, dt: dt, op: op})
}

// AllGather enqueues an all-gather: recv holds Size()·sendCount elements,
// block r from rank r. In place when send == recv + Rank()·sendCount.
func (c *Comm) AllGather(send, recv uintptr, sendCount int64, dt fairgo.DType, s streams.Stream) error {
	b := sendCount * int64(dt.Size())
	if err := c.inPlaceOK("all-gather", recv, b*int64(c.Size()), send, b, recv+uintptr(int64(c.rank)*b)); err != nil {
		return err
	}
	return c.enqueue(s, &call{kind: kAllGather, send: send, recv: recv, count: sendCount, dt: dt})
}

// Broadcast enqueues a broadcast of count elements from root's send to
// every rank's recv (send is ignored on other ranks).
func (c *Comm) Broadcast(send, recv uintptr, count int64, dt fairgo.DType, root int, s streams.Stream) error {
	if root < 0 || root >= c.Size() {
		return c.badArg("root", root, fmt.Sprintf("outside [0, %d)", c.Size()))
	}
	if root == c.rank {
		b := count * int64(dt.Size())
		if err := c.inPlaceOK("broadcast", recv, b, send, b, recv); err != nil {
			return err
		}
	}
	return c.enqueue(s, &call{kind: kBroadcast, send: send, recv: recv, count: count, dt: dt, root: root})
}

// AllToAllv enqueues an all-to-all: sendCounts[k] elements from
// send+sendDispls[k] go to rank k, recvCounts[k] elements from rank k land
// at recv+recvDispls[k]. Sends may overlap; receives must not (checked).
// Every rank's sendCounts[k] must equal rank k's recvCounts[r], else all
// fail with a *MismatchError.
func (c *Comm) AllToAllv(send uintptr, sendCounts, sendDispls []int64, recv uintptr, recvCounts, recvDispls []int64,
	dt fairgo.DType, s streams.Stream) error {
	n := c.Size()
	for _, x := range []struct {
		name string
		v    []int64
	}{{"sendCounts", sendCounts}, {"sendDispls", sendDispls}, {"recvCounts", recvCounts}, {"recvDispls", recvDispls}} {
		if len(x.v) != n {
			return c.badArg(x.name, x.v, fmt.Sprintf("needs %d entries", n))
		}
		for _, v := range x.v {
			if v < 0 || v > math.MaxInt64/16 {
				return c.badArg(x.name, x.v, "entries must be non-negative")
			}
		}
	}
	size := int64(dt.Size())
	for i := range n {
		for j := range i {
			if overlaps(
				recv+uintptr(recvDispls[i]*size),
				recvCounts[i]*size,
				recv+uintptr(recvDispls[j]*size),
				recvCounts[j]*size,
			) {
				return c.badArg(
					"recvDispls",
					recvDispls,
					fmt.Sprintf("the receives from ranks %d and %d overlap", j, i),
				)
			}
		}
	}
	return c.enqueue(s, &call{kind: kAllToAll, send: send, recv: recv, dt: dt,
		sendCounts: slices.Clone(sendCounts), sendDispls: slices.Clone(sendDispls),
		recvCounts: slices.Clone(recvCounts), recvDispls: slices.Clone(recvDispls)})
}

// Err returns the communicator's sticky failure (a mismatch, a stall, an
// illegal address in a collective, an abort, the cluster's close), or nil.
func (c *Comm) Err() error { return c.g.failure() }

// Abort fails the pending and future calls of the whole communicator (every
// rank's handle) with an error wrapping fairgo.ErrAborted, and ends this
// handle's wait at its first call (Config.ConnectAtFirstCall). It never
// blocks.
func (c *Comm) Abort() error {
	c.abortOnce.Do(func() { close(c.aborted) })
	g := c.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		g.failLocked(fmt.Errorf("sim: %s aborted by rank %d: %w", g.name, c.rank, fairgo.ErrAborted))
	} else if !isAborted(g.err) {
		g.err = fmt.Errorf("sim: %s aborted by rank %d after a failure (%w): %w", g.name, c.rank, g.err, fairgo.ErrAborted)
	}
	return nil
}

// Close destroys this handle: later calls on it fail with fairgo.ErrClosed.
// Calls already enqueued still run.
func (c *Comm) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func isAborted(err error) bool { return errors.Is(err, fairgo.ErrAborted) }
