package hier

import (
	"errors"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/padding"
	"github.com/fairgo/fairgo/staging"
	"github.com/fairgo/fairgo/streams"
)

// executor enqueues the device work of one call at a time on the stage
// chain: an allreduce as its plan says (the algorithm, the slice), the
// hierarchical reduce-scatter and all-gather, and the flat collectives. It
// belongs to the engine goroutine, or to an inline caller while that holds
// the queue's busy flag.
type executor struct {
	grid     Grid
	dev      backend.Device
	comms    backend.Comms
	layout   staging.Layout
	chain    *streams.Chain
	stagingR *staging.Ring // made at first use
	paddingR *padding.Ring // made at first use
	hd       hdState       // the pairwise algorithms' scratch (HalvingDoubling, RecursiveDoubling), made at first use
	skipWait streams.Stage // test hook (export_test.go): a stage whose hand-off wait is dropped; -1: none
}

// release frees the chain's streams, the slot rings and the
// pairwise algorithms' scratch.
func (ex *executor) release() error {
	return errors.Join(ex.chain.Release(), ex.stagingR.Close(), ex.paddingR.Close(), ex.hd.release(ex.dev))
}

// singleComm is the communicator of all ranks that carries an allreduce
// by plan p as ONE allreduce on the call's first stream, nil for a plan
// that is not one collective: the world communicator for Flat, the world
// variant the router attached to the plan for FlatRing and FlatTree (nil
// where it could not be made: p.commErr says why). flatAllReduce enqueues
// its allreduce on exactly this communicator, so that a caller may put
// more of the call's work (the cross-rank check) in the same NCCL group
// on it. Plans of router.route have their communicator attached.
func (ex *executor) singleComm(p plan) backend.Comm {
	impl := p.algo.impl()
	switch {
	case impl == nil || !impl.single():
		return nil
	case p.algo == Flat:
		return ex.comms.World
	}
	return p.comm
}

// stagedPlan is p, the plan of an allreduce of bytes, for the staged copy
// of a fingerprinted call (the data, then its fingerprint: staged bytes)
// in one piece, so that the fingerprint rides in the data's own exchanges
// and costs no exchange of its own. ok is false where that cannot be: a
// world variant without its communicator, a plan that cuts the call into
// slices (the fingerprint would add a slice, a whole exchange more), or a
// staged copy larger than the staging slot its rail receives into.
func (ex *executor) stagedPlan(p plan, bytes, staged int64) (plan, bool) {
	impl := p.algo.impl()
	switch {
	case impl == nil:
		return p, false
	case impl.single():
		p.slice = staged
		return p, ex.singleComm(p) != nil
	case !impl.whole() && p.slice < bytes:
		return p, false
	case impl.stagedReceive(ex.grid) && staged > ex.layout.SliceBytes:
		return p, false
	}
	p.slice = staged
	return p, true
}

// first is the stream a call's first work goes on.
func (ex *executor) first() streams.Stream { return ex.chain.Stream(streams.ReduceScatter) }

// allReduce enqueues an allreduce of t by plan p, flat work on first, and
// returns the stream its last work is on.
func (ex *executor) allReduce(t fairgo.Tensor, op fairgo.Op, p plan, first streams.Stream) (streams.Stream, error) {
	return p.algo.impl().allReduce(ex, t, op, p, first)
}

// part is one [D][M][n] part of a slice: the grid part in the caller's
// buffer, or the padding part in a padding slot. recv is where the
// all-to-all collect stage of RailAllToAll receives the M shards of row d.
type part struct {
	cells staging.Cells
	recv  uintptr
}

// slicePlan is what the stages of one slice of an allreduce work on.
type slicePlan struct {
	parts   []part        // the non-empty parts, grid first
	recvBuf *staging.Slot // a staged receive (railStep.stagedReceive): the staging slot received into
	pad     *staging.Slot // the padding slot, when the slice has a tail
	padBase uintptr       // the padding part's cells
	tail    uintptr       // the caller's tail elements
	tailLen int64         // their bytes
}

// sliceCall is what a rail step's stages need of one slice: the slice's
// parts, the lanes, the element type and the stages' operators.
type sliceCall struct {
	dev  backend.Device
	grid Grid
	p    *slicePlan
	l    *lanes
	dt   fairgo.DType
	ops  stageOps
}

// eachPart runs fn for every part of the slice inside one communicator
// group.
func (c *sliceCall) eachPart(fn func(pt part) error) error {
	return c.dev.Group(func() error {
		for _, pt := range c.p.parts {
			if err := fn(pt); err != nil {
				return err
			}
		}
		return nil
	})
}

// divide enqueues, for an integer Avg of an NCCL rail, the division by
// the world size of each part's result: the n elements at where(cells).
func (c *sliceCall) divide(where func(x staging.Cells) (ptr uintptr, n int64)) error {
	if c.ops.divideBy <= 1 {
		return nil
	}
	for _, pt := range c.p.parts {
		p, n := where(pt.cells)
		if err := c.dev.ReduceAsync(p, p, 1, n, n, c.dt, fairgo.Avg, c.ops.divideBy, c.l.st[streams.Add]); err != nil {
			return err
		}
	}
	return nil
}

// stageOps are the operators of the stages for one call's op and dtype.
type stageOps struct {
	intra      fairgo.Op // stage 1 (NCCL reduce-scatter inside the machine)
	rail       fairgo.Op // the rail's NCCL reduction (RailRSAG, RailAllReduce)
	add        fairgo.Op // RailAllToAll's reduction kernel
	addDivisor int       // its Avg divisor
	divideBy   int       // NCCL rails: divide the rail's result by this in the add stage (integer Avg); 1: nothing
}

// stageOps gives each stage its operator. Floating-point Avg averages at
// every level (NCCL's Avg pre-multiplies each input by 1/n, and the kernel
// divides its float32 sum by M), so that no partial sum overflows where a
// flat average would not; integer Avg sums and truncates once, by the world
// size, as flat NCCL does.
func (ex *executor) stageOps(op fairgo.Op, dt fairgo.DType) stageOps {
	switch {
	case op != fairgo.Avg:
		return stageOps{intra: op, rail: op, add: op, addDivisor: 1, divideBy: 1}
	case dt.IsFloat():
		return stageOps{intra: fairgo.Avg, rail: fairgo.Avg, add: fairgo.Avg, addDivisor: ex.grid.Machines, divideBy: 1}
	default:
		w := ex.grid.Size()
		return stageOps{intra: fairgo.Sum, rail: fairgo.Sum, add: fairgo.Avg, addDivisor: w, divideBy: w}
	}
}

// lanes are the streams one call's stages run on and the communicators
// they talk on: by default a stream and a communicator per stage; the rail
// step rearranges them (railStep.lanes): a serial rail runs the diffuse on
// the collect's stream and communicator, so that the two rail exchanges
// of all slices go over the network one after the other; RailAllReduce,
// in one piece, runs every stage on the first stream.
type lanes struct {
	st               [streams.NumStages]streams.Stream
	intraRS, intraAG backend.Comm
	collect, diffuse backend.Comm
}

func (ex *executor) lanesFor(rail railStep, serial bool, first streams.Stream) lanes {
	var l lanes
	for s := range streams.NumStages {
		l.st[s] = ex.chain.Stream(s)
	}
	l.st[streams.ReduceScatter] = first
	c := ex.comms
	l.intraRS, l.intraAG, l.collect, l.diffuse = c.IntraReduceScatter, c.IntraAllGather, c.RailCollect, c.RailDiffuse
	rail.lanes(&l, serial)
	return l
}

// pass hands a slice from stage from to the next on l: the hand-off event
// recorded on from's stream, waited for on the next one's (unless both are
// one stream, or the test hook drops that wait).
func (ex *executor) pass(l *lanes, from streams.Stage) error {
	on, to := l.st[from], l.st[from+1]
	if on == to {
		return nil
	}
	if err := ex.chain.RecordOn(from, on); err != nil {
		return err
	}
	if ex.skipWait == from+1 {
		return nil
	}
	return ex.chain.WaitOn(from+1, to)
}

// pipeline enqueues the five stages for every slice of t (M > 1) with the
// rail step rail, in slices of p.slice bytes, on the lanes the step asks
// for, the first stage on first: the engine's first stream, or an inline
// caller's (a call in one slice, router.inlineable), which then needs no
// event to order the call after the caller's work. Stages of two calls on
// different streams are ordered all the same: by the waits for calls in
// flight on the same memory (Reducer.waitOverlaps), by the slots' guards,
// and by NCCL, which runs a communicator's collectives in the order they
// were enqueued, whatever their streams.
func (ex *executor) pipeline(t fairgo.Tensor, op fairgo.Op, p plan, rail railStep, first streams.Stream) (streams.Stream, error) {
	c := sliceCall{dev: ex.dev, grid: ex.grid, dt: t.DType, ops: ex.stageOps(op, t.DType)}
	l := ex.lanesFor(rail, p.serial, first)
	c.l = &l
	staged := rail.stagedReceive(ex.grid)
	for sl := range staging.Slices(t.Count, t.DType.Size(), ex.grid.Size(), p.slice) {
		sp, err := ex.planSlice(t, sl, staged)
		if err != nil {
			return nil, err
		}
		c.p = sp
		if err := ex.runSlice(&c, rail); err != nil {
			return nil, err
		}
	}
	return l.st[streams.AllGather], nil
}

// planSlice lays out one slice: its grid part in place, its tail in a
// padding slot, and where a rail all-to-all receives: the neighbour's
// row, dead after the reduce-scatter (D ≥ 2), or a staging slot (staged).
func (ex *executor) planSlice(t fairgo.Tensor, sl staging.Slice, staged bool) (*slicePlan, error) {
	g := ex.grid
	D, d := g.Devices, g.Local
	es := int64(t.DType.Size())
	base := t.Ptr + uintptr(sl.Offset*es)
	p := &slicePlan{}
	var gridRecv, padRecv uintptr
	if staged {
		ring, err := ex.stagingRing()
		if err != nil {
			return nil, err
		}
		s, err := ring.Next()
		if err != nil {
			return nil, err
		}
		p.recvBuf = &s
		gridRecv = s.Ptr
		padRecv = s.Ptr + uintptr(ex.layout.PaddingReceiveOffset())
	}
	grid := staging.Cells{Base: base, Devices: D, Machines: g.Machines, N: sl.Shard, ElemSize: es}
	if sl.Shard > 0 {
		if p.recvBuf == nil {
			gridRecv = grid.Row((d + 1) % D)
		}
		p.parts = append(p.parts, part{cells: grid, recv: gridRecv})
	}
	if sl.PadShard > 0 {
		ring, err := ex.paddingRing()
		if err != nil {
			return nil, err
		}
		slot, cells, err := ring.Next(sl.PadShard, int(es))
		if err != nil {
			return nil, err
		}
		p.pad = &slot
		p.padBase = cells.Base
		p.tail = base + uintptr(grid.Bytes())
		p.tailLen = sl.Tail * es
		if p.recvBuf == nil {
			padRecv = cells.Row((d + 1) % D)
		}
		p.parts = append(p.parts, part{cells: cells, recv: padRecv})
	}
	return p, nil
}

// runSlice enqueues the five stages of one slice: the intra-machine
// reduce-scatter (row d gets the machine's sum), the rail step's collect,
// add and diffuse, and the intra-machine all-gather, with the tail in and
// out of its padding slot.
func (ex *executor) runSlice(c *sliceCall, rail railStep) error {
	p, l, d := c.p, c.l, ex.grid.Local
	rs, col, add, ag := l.st[streams.ReduceScatter], l.st[streams.Collect], l.st[streams.Add], l.st[streams.AllGather]
	if p.pad != nil {
		if err := rs.WaitEvent(p.pad.Guard); err != nil {
			return err
		}
		if err := ex.dev.CopyAsync(p.padBase, p.tail, p.tailLen, rs); err != nil {
			return err
		}
	}
	if ex.grid.Devices > 1 {
		if err := c.eachPart(func(pt part) error {
			x := pt.cells
			return l.intraRS.ReduceScatter(x.Base, x.Row(d), x.RowCount(), c.dt, c.ops.intra, rs)
		}); err != nil {
			return err
		}
	}
	if err := ex.pass(l, streams.ReduceScatter); err != nil {
		return err
	}
	if p.recvBuf != nil {
		if err := col.WaitEvent(p.recvBuf.Guard); err != nil {
			return err
		}
	}
	if err := rail.collect(c); err != nil {
		return err
	}
	if err := ex.pass(l, streams.Collect); err != nil {
		return err
	}
	if err := rail.add(c); err != nil {
		return err
	}
	if p.recvBuf != nil {
		if err := p.recvBuf.Guard.Record(add); err != nil {
			return err
		}
	}
	if err := ex.pass(l, streams.Add); err != nil {
		return err
	}
	if err := rail.diffuse(c); err != nil {
		return err
	}
	if err := ex.pass(l, streams.Diffuse); err != nil {
		return err
	}
	if ex.grid.Devices > 1 {
		if err := c.eachPart(func(pt part) error {
			x := pt.cells
			return l.intraAG.AllGather(x.Row(d), x.Base, x.RowCount(), c.dt, ag)
		}); err != nil {
			return err
		}
	}
	if p.pad != nil {
		if err := ex.dev.CopyAsync(p.tail, p.padBase, p.tailLen, ag); err != nil {
			return err
		}
		if err := p.pad.Guard.Record(ag); err != nil {
			return err
		}
	}
	return nil
}

// direct enqueues what a reduce-scatter or all-gather of c elements per
// rank does without the pipeline, on first (the first stage's stream, or
// an inline caller's): nothing (c = 0), a copy on one rank (unless in
// place), or the intra communicator's own collective on one machine
// (intra). done is false when the call needs the hierarchy.
func (ex *executor) direct(send, recv fairgo.Tensor, c int64, first streams.Stream, intra func(s streams.Stream) error) (
	last streams.Stream, done bool, err error,
) {
	g, rs := ex.grid, first
	switch {
	case c == 0:
		return nil, true, nil
	case g.Size() == 1:
		if send.Ptr == recv.Ptr {
			return nil, true, nil
		}
		return rs, true, ex.dev.CopyAsync(recv.Ptr, send.Ptr, c*int64(send.DType.Size()), rs)
	case g.Machines == 1:
		return rs, true, intra(rs)
	}
	return nil, false, nil
}

// reduceScatter enqueues a hierarchical reduce-scatter: per slice of the
// blocks, the gather of every rank's part into a [D][M][n] staging slot, an
// intra-machine reduce-scatter, a rail all-to-all and the add kernel
// writing straight into recv.
func (ex *executor) reduceScatter(send, recv fairgo.Tensor, op fairgo.Op, first streams.Stream) (streams.Stream, error) {
	c := recv.Count
	last, done, err := ex.direct(send, recv, c, first, func(s streams.Stream) error {
		return ex.comms.IntraReduceScatter.ReduceScatter(send.Ptr, recv.Ptr, c, send.DType, op, s)
	})
	if done {
		return last, err
	}
	ops := ex.stageOps(op, send.DType)
	ring, err := ex.stagingRing()
	if err != nil {
		return nil, err
	}
	es := int64(send.DType.Size())
	for b := range staging.Blocks(c, int(es), ex.grid.Size(), ex.layout.SliceBytes) {
		st, err := ring.Next()
		if err != nil {
			return nil, err
		}
		blk := rsBlock{send: send, out: recv.Ptr + uintptr(b.Offset*es), c: c, b: b, slot: st, ops: ops}
		if ex.grid.Devices > 1 {
			err = ex.reduceScatterStaged(blk)
		} else {
			err = ex.reduceScatterDirect(blk)
		}
		if err == nil {
			err = st.Guard.Record(ex.chain.Stream(streams.Add))
		}
		if err == nil {
			err = ex.handoffsFrom(streams.Add)
		}
		if err != nil {
			return nil, err
		}
	}
	return ex.chain.Stream(streams.AllGather), nil
}

// rsBlock is one slice of a reduce-scatter: block b of every rank's c
// elements of send, reduced into out through the staging slot.
type rsBlock struct {
	send fairgo.Tensor
	out  uintptr
	c    int64
	b    staging.Block
	slot staging.Slot
	ops  stageOps
}

// reduceScatterStaged (D > 1) gathers every rank's part of the block into
// the slot's [D][M][n] cells, reduce-scatters them inside the machine,
// exchanges row d on the rail into the neighbour's row and adds the M
// shards into out.
func (ex *executor) reduceScatterStaged(blk rsBlock) error {
	g, dt, n := ex.grid, blk.send.DType, blk.b.Count
	M, d := g.Machines, g.Local
	es := int64(dt.Size())
	rs, col, add, _, _ := ex.stages()
	x := staging.Cells{Base: blk.slot.Ptr, Devices: g.Devices, Machines: M, N: n, ElemSize: es}
	counts := sameCounts(M, n)
	if err := rs.WaitEvent(blk.slot.Guard); err != nil {
		return err
	}
	if err := ex.transpose(x, blk.send.Ptr+uintptr(blk.b.Offset*es), blk.c, true, rs); err != nil {
		return err
	}
	intra := ex.comms.IntraReduceScatter
	if err := intra.ReduceScatter(x.Base, x.Row(d), x.RowCount(), dt, blk.ops.intra, rs); err != nil {
		return err
	}
	if err := ex.handoff(streams.ReduceScatter); err != nil {
		return err
	}
	nb := x.Row((d + 1) % g.Devices)
	displs := strided(M, n)
	if err := ex.comms.RailCollect.AllToAllv(x.Row(d), counts, displs, nb, counts, displs, dt, col); err != nil {
		return err
	}
	if err := ex.handoff(streams.Collect); err != nil {
		return err
	}
	return ex.dev.ReduceAsync(blk.out, nb, M, n, n, dt, blk.ops.add, blk.ops.addDivisor, add)
}

// reduceScatterDirect (D = 1) exchanges every rank's part of the block on
// the rail straight from send into the slot and adds the M shards into
// out.
func (ex *executor) reduceScatterDirect(blk rsBlock) error {
	M, dt, n := ex.grid.Machines, blk.send.DType, blk.b.Count
	_, col, add, _, _ := ex.stages()
	if err := ex.handoff(streams.ReduceScatter); err != nil {
		return err
	}
	if err := col.WaitEvent(blk.slot.Guard); err != nil {
		return err
	}
	sendDispls := strided(M, blk.c)
	for k := range sendDispls {
		sendDispls[k] += blk.b.Offset
	}
	counts := sameCounts(M, n)
	if err := ex.comms.RailCollect.AllToAllv(blk.send.Ptr, counts, sendDispls,
		blk.slot.Ptr, counts, strided(M, n), dt, col); err != nil {
		return err
	}
	if err := ex.handoff(streams.Collect); err != nil {
		return err
	}
	return ex.dev.ReduceAsync(blk.out, blk.slot.Ptr, M, n, n, dt, blk.ops.add, blk.ops.addDivisor, add)
}

// allGather enqueues a hierarchical all-gather: per slice, a rail
// all-to-all of this rank's part, an intra-machine all-gather of the
// [D][M][n] slice, and a strided copy into recv's blocks.
func (ex *executor) allGather(send, recv fairgo.Tensor, first streams.Stream) (streams.Stream, error) {
	c := send.Count
	last, done, err := ex.direct(send, recv, c, first, func(s streams.Stream) error {
		return ex.comms.IntraAllGather.AllGather(send.Ptr, recv.Ptr, c, send.DType, s)
	})
	if done {
		return last, err
	}
	var ring *staging.Ring
	if ex.grid.Devices > 1 {
		if ring, err = ex.stagingRing(); err != nil {
			return nil, err
		}
	}
	es := int64(send.DType.Size())
	for b := range staging.Blocks(c, int(es), ex.grid.Size(), ex.layout.SliceBytes) {
		if err := ex.handoffsFrom(streams.ReduceScatter); err != nil {
			return nil, err
		}
		if ring != nil {
			err = ex.allGatherStaged(send, recv, b, ring)
		} else {
			err = ex.allGatherDirect(send, recv, b)
		}
		if err != nil {
			return nil, err
		}
	}
	return ex.chain.Stream(streams.AllGather), nil
}

// allGatherStaged (D > 1) exchanges this rank's part of block b on the
// rail into row d of a staging slot's [D][M][n] cells, all-gathers the
// cells inside the machine and copies them into recv's blocks.
func (ex *executor) allGatherStaged(send, recv fairgo.Tensor, b staging.Block, ring *staging.Ring) error {
	g, dt, n, c := ex.grid, send.DType, b.Count, send.Count
	M, d := g.Machines, g.Local
	es := int64(dt.Size())
	_, _, _, dif, ag := ex.stages()
	st, err := ring.Next()
	if err != nil {
		return err
	}
	x := staging.Cells{Base: st.Ptr, Devices: g.Devices, Machines: M, N: n, ElemSize: es}
	if err := dif.WaitEvent(st.Guard); err != nil {
		return err
	}
	counts := sameCounts(M, n)
	src := send.Ptr + uintptr(b.Offset*es)
	if err := ex.comms.RailDiffuse.AllToAllv(src, counts, make([]int64, M), x.Row(d), counts, strided(M, n), dt,
		dif); err != nil {
		return err
	}
	if err := ex.handoff(streams.Diffuse); err != nil {
		return err
	}
	if err := ex.comms.IntraAllGather.AllGather(x.Row(d), x.Base, x.RowCount(), dt, ag); err != nil {
		return err
	}
	if err := ex.transpose(x, recv.Ptr+uintptr(b.Offset*es), c, false, ag); err != nil {
		return err
	}
	return st.Guard.Record(ag)
}

// allGatherDirect (D = 1) receives every machine's part of block b
// straight into recv's blocks; in place, this rank's own block is already
// there.
func (ex *executor) allGatherDirect(send, recv fairgo.Tensor, b staging.Block) error {
	g, dt, n, c := ex.grid, send.DType, b.Count, send.Count
	M := g.Machines
	es := int64(dt.Size())
	dif := ex.chain.Stream(streams.Diffuse)
	counts := sameCounts(M, n)
	if self := recv.Ptr + uintptr(int64(g.Rank())*c*es); self == send.Ptr {
		counts = withoutPeer(counts, g.Machine)
	}
	recvDispls := strided(M, c)
	for k := range recvDispls {
		recvDispls[k] += b.Offset
	}
	src := send.Ptr + uintptr(b.Offset*es)
	if err := ex.comms.RailDiffuse.AllToAllv(src, counts, make([]int64, M), recv.Ptr, counts, recvDispls, dt,
		dif); err != nil {
		return err
	}
	return ex.handoff(streams.Diffuse)
}

func (ex *executor) stages() (rs, col, add, dif, ag streams.Stream) {
	c := ex.chain
	return c.Stream(streams.ReduceScatter), c.Stream(streams.Collect), c.Stream(streams.Add),
		c.Stream(streams.Diffuse), c.Stream(streams.AllGather)
}

// transpose copies a slice of x.N elements of every rank's block between the
// caller's buffer, where blocks of c elements stand in grid order (m·D+d,
// machine-major), and the [D][M][n] cells x (device-major): one strided copy
// per local index. gather copies buffer → cells; otherwise cells → buffer.
func (ex *executor) transpose(x staging.Cells, buf uintptr, c int64, gather bool, s streams.Stream) error {
	D := int64(x.Devices)
	width := x.N * x.ElemSize
	for d := range x.Devices {
		row := x.Row(d)                             // [d][0] in the cells
		col := buf + uintptr(int64(d)*c*x.ElemSize) // block of grid rank 0·D+d
		dst, dstPitch, src, srcPitch := row, width, col, D*c*x.ElemSize
		if !gather {
			dst, dstPitch, src, srcPitch = col, D*c*x.ElemSize, row, width
		}
		if err := ex.dev.Copy2DAsync(dst, dstPitch, src, srcPitch, width, int64(x.Machines), s); err != nil {
			return err
		}
	}
	return nil
}

// sameCounts is m counts of n elements: a rail all-to-all that exchanges n
// elements with every peer.
func sameCounts(m int, n int64) []int64 {
	counts := make([]int64, m)
	for k := range counts {
		counts[k] = n
	}
	return counts
}

// strided is the displacements of m blocks of stride elements: k·stride.
func strided(m int, stride int64) []int64 {
	displs := make([]int64, m)
	for k := range displs {
		displs[k] = int64(k) * stride
	}
	return displs
}

// withoutPeer zeroes the count of peer k (the exchange skips it).
func withoutPeer(counts []int64, k int) []int64 {
	counts[k] = 0
	return counts
}

// handoff records the end of stage from and makes the next stage wait on it
// (unless the test hook drops that wait).
func (ex *executor) handoff(from streams.Stage) error {
	if err := ex.chain.Record(from); err != nil {
		return err
	}
	if ex.skipWait == from+1 {
		return nil
	}
	return ex.chain.Wait(from + 1)
}

// handoffsFrom hands off from stage from to the end of the chain.
func (ex *executor) handoffsFrom(from streams.Stage) error {
	for s := from; s < streams.NumStages-1; s++ {
		if err := ex.handoff(s); err != nil {
			return err
		}
	}
	return nil
}

func (ex *executor) stagingRing() (*staging.Ring, error) {
	if ex.stagingR == nil {
		ring, err := staging.NewRing(ex.dev, ex.layout.StagingSlots, ex.layout.StagingSlotBytes)
		if err != nil {
			return nil, err
		}
		ex.stagingR = ring
	}
	return ex.stagingR, nil
}

func (ex *executor) paddingRing() (*padding.Ring, error) {
	if ex.paddingR == nil {
		ring, err := padding.NewRing(ex.dev, ex.layout)
		if err != nil {
			return nil, err
		}
		ex.paddingR = ring
	}
	return ex.paddingR, nil
}
