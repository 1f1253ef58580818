package hier

import (
	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/staging"
	"github.com/fairgo/fairgo/streams"
)

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
	recvBuf *staging.Slot // D = 1 RailAllToAll: the staging slot received into
	pad     *staging.Slot // the padding slot, when the slice has a tail
	padBase uintptr       // the padding part's cells
	tail    uintptr       // the caller's tail elements
	tailLen int64         // their bytes
}

// stageOps are the operators of the stages for one call's op and dtype.
type stageOps struct {
	intra      fairgo.Op // stage 1 (NCCL reduce-scatter inside the machine)
	rail       fairgo.Op // RailRSAG's rail reduce-scatter (NCCL)
	add        fairgo.Op // RailAllToAll's reduction kernel
	addDivisor int       // its Avg divisor
	divideBy   int       // RailRSAG: divide the rail's result by this in the add stage (integer Avg); 1: nothing
}

// stageOps gives each stage its operator. Floating-point Avg averages at
// every level (NCCL's Avg pre-multiplies each input by 1/n, and the kernel
// divides its float32 sum by M), so that no partial sum overflows where a
// flat average would not; integer Avg sums and truncates once, by the world
// size, as flat NCCL does.
func (r *Reducer) stageOps(op fairgo.Op, dt fairgo.DType) stageOps {
	switch {
	case op != fairgo.Avg:
		return stageOps{intra: op, rail: op, add: op, addDivisor: 1, divideBy: 1}
	case dt.IsFloat():
		return stageOps{intra: fairgo.Avg, rail: fairgo.Avg, add: fairgo.Avg, addDivisor: r.grid.Machines, divideBy: 1}
	default:
		w := r.grid.Size()
		return stageOps{intra: fairgo.Sum, rail: fairgo.Sum, add: fairgo.Avg, addDivisor: w, divideBy: w}
	}
}

// lanes are the streams one call's stages run on and the communicators
// they talk on: normally a stream and a communicator per stage; with a
// serial rail, the diffuse runs on the collect's stream and communicator,
// so that the two rail exchanges of all slices go over the network one
// after the other instead of side by side; RailAllReduce, in one piece,
// runs every stage on the first stream, with one communicator per level.
type lanes struct {
	st               [streams.NumStages]streams.Stream
	intraRS, intraAG backend.Comm
	collect, diffuse backend.Comm
}

func (r *Reducer) lanesFor(rt route) lanes {
	var l lanes
	for s := range streams.NumStages {
		l.st[s] = r.chain.Stream(s)
	}
	c := r.comms
	l.intraRS, l.intraAG, l.collect, l.diffuse = c.IntraReduceScatter, c.IntraAllGather, c.RailCollect, c.RailDiffuse
	switch {
	case rt.algo == RailAllReduce:
		for s := range streams.NumStages {
			l.st[s] = l.st[streams.ReduceScatter]
		}
		l.intraAG, l.diffuse = l.intraRS, l.collect
	case rt.serial:
		l.st[streams.Diffuse] = l.st[streams.Collect]
		l.diffuse = l.collect
	}
	return l
}

// pass hands a slice from stage from to the next on l: the hand-off event
// recorded on from's stream, waited for on the next one's (unless both are
// one stream, or the test hook drops that wait).
func (r *Reducer) pass(l *lanes, from streams.Stage) error {
	on, to := l.st[from], l.st[from+1]
	if on == to {
		return nil
	}
	if err := r.chain.RecordOn(from, on); err != nil {
		return err
	}
	if r.skipWait == from+1 {
		return nil
	}
	return r.chain.WaitOn(from+1, to)
}

// allReduce enqueues the five-stage pipeline for every slice of t (M > 1)
// with the rail phase of rt.algo (RailAllToAll or RailRSAG), slices of at
// most sliceBytes (the layout's; RailRSAG, which needs no staging slot, may
// take larger ones), on the lanes rt asks for.
func (r *Reducer) allReduce(t fairgo.Tensor, op fairgo.Op, rt route, sliceBytes int64) (streams.Stream, error) {
	ops := r.stageOps(op, t.DType)
	es := t.DType.Size()
	l := r.lanesFor(rt)
	for sl := range staging.Slices(t.Count, es, r.grid.Size(), sliceBytes) {
		p, err := r.planSlice(t, sl, rt.algo)
		if err != nil {
			return nil, err
		}
		if err := r.runSlice(p, t.DType, ops, rt.algo, &l); err != nil {
			return nil, err
		}
	}
	return l.st[streams.AllGather], nil
}

// planSlice lays out one slice: its grid part in place, its tail in a
// padding slot, and where the all-to-all collect receives: the neighbour's
// row, dead after the reduce-scatter (D ≥ 2), or a staging slot (D = 1).
func (r *Reducer) planSlice(t fairgo.Tensor, sl staging.Slice, algo Algorithm) (*slicePlan, error) {
	g := r.grid
	D, d := g.Devices, g.Local
	es := int64(t.DType.Size())
	base := t.Ptr + uintptr(sl.Offset*es)
	p := &slicePlan{}
	var gridRecv, padRecv uintptr
	if D == 1 && algo == RailAllToAll {
		ring, err := r.stagingRing()
		if err != nil {
			return nil, err
		}
		s, err := ring.Next()
		if err != nil {
			return nil, err
		}
		p.recvBuf = &s
		gridRecv = s.Ptr
		padRecv = s.Ptr + uintptr(r.layout.PaddingReceiveOffset())
	}
	grid := staging.Cells{Base: base, Devices: D, Machines: g.Machines, N: sl.Shard, ElemSize: es}
	if sl.Shard > 0 {
		if p.recvBuf == nil {
			gridRecv = grid.Row((d + 1) % D)
		}
		p.parts = append(p.parts, part{cells: grid, recv: gridRecv})
	}
	if sl.PadShard > 0 {
		ring, err := r.paddingRing()
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

// eachPart runs fn for every part of p inside one communicator group.
func (r *Reducer) eachPart(p *slicePlan, fn func(pt part) error) error {
	return r.dev.Group(func() error {
		for _, pt := range p.parts {
			if err := fn(pt); err != nil {
				return err
			}
		}
		return nil
	})
}

// runSlice enqueues the five stages of one slice.
func (r *Reducer) runSlice(p *slicePlan, dt fairgo.DType, ops stageOps, algo Algorithm, l *lanes) error {
	g := r.grid
	M, D, m, d := g.Machines, g.Devices, g.Machine, g.Local
	rs, col, add := l.st[streams.ReduceScatter], l.st[streams.Collect], l.st[streams.Add]
	dif, ag := l.st[streams.Diffuse], l.st[streams.AllGather]

	// 1 reduce-scatter inside the machine: row d gets the machine's sum.
	if p.pad != nil {
		if err := rs.WaitEvent(p.pad.Guard); err != nil {
			return err
		}
		if err := r.dev.CopyAsync(p.padBase, p.tail, p.tailLen, rs); err != nil {
			return err
		}
	}
	if D > 1 {
		if err := r.eachPart(p, func(pt part) error {
			x := pt.cells
			return l.intraRS.ReduceScatter(x.Base, x.Row(d), x.RowCount(), dt, ops.intra, rs)
		}); err != nil {
			return err
		}
	}
	if err := r.pass(l, streams.ReduceScatter); err != nil {
		return err
	}

	// 2 collect on the rail: cell [d][k] to machine k, or NCCL's
	// reduce-scatter of row d leaving cell [d][m] reduced, or (in one
	// piece) NCCL's allreduce of the whole row.
	if p.recvBuf != nil {
		if err := col.WaitEvent(p.recvBuf.Guard); err != nil {
			return err
		}
	}
	if err := r.eachPart(p, func(pt part) error {
		x := pt.cells
		switch algo {
		case RailRSAG:
			return l.collect.ReduceScatter(x.Row(d), x.Cell(d, m), x.N, dt, ops.rail, col)
		case RailAllReduce:
			return l.collect.AllReduce(x.Row(d), x.Row(d), x.RowCount(), dt, ops.rail, col)
		}
		counts, displs := sameCounts(M, x.N), strided(M, x.N)
		return l.collect.AllToAllv(x.Row(d), counts, displs, pt.recv, counts, displs, dt, col)
	}); err != nil {
		return err
	}
	if err := r.pass(l, streams.Collect); err != nil {
		return err
	}

	// 3 add: reduce the M received shards into cell [d][m] (RailRSAG:
	// only integer Avg's division is left, of the cell; RailAllReduce: of
	// the row).
	for _, pt := range p.parts {
		x := pt.cells
		var err error
		switch {
		case algo == RailAllToAll:
			err = r.dev.ReduceAsync(x.Cell(d, m), pt.recv, M, x.N, x.N, dt, ops.add, ops.addDivisor, add)
		case ops.divideBy > 1 && algo == RailAllReduce:
			err = r.dev.ReduceAsync(
				x.Row(d),
				x.Row(d),
				1,
				x.RowCount(),
				x.RowCount(),
				dt,
				fairgo.Avg,
				ops.divideBy,
				add,
			)
		case ops.divideBy > 1:
			err = r.dev.ReduceAsync(x.Cell(d, m), x.Cell(d, m), 1, x.N, x.N, dt, fairgo.Avg, ops.divideBy, add)
		}
		if err != nil {
			return err
		}
	}
	if p.recvBuf != nil {
		if err := p.recvBuf.Guard.Record(add); err != nil {
			return err
		}
	}
	if err := r.pass(l, streams.Add); err != nil {
		return err
	}

	// 4 diffuse on the rail: cell [d][m] to every other machine, filling
	// row d (in one piece, the allreduce did it).
	if algo != RailAllReduce {
		if err := r.eachPart(p, func(pt part) error {
			x := pt.cells
			if algo == RailRSAG {
				return l.diffuse.AllGather(x.Cell(d, m), x.Row(d), x.N, dt, dif)
			}
			sendCounts := withoutPeer(sameCounts(M, x.N), m)
			return l.diffuse.AllToAllv(x.Cell(d, m), sendCounts, make([]int64, M),
				x.Row(d), sendCounts, strided(M, x.N), dt, dif)
		}); err != nil {
			return err
		}
	}
	if err := r.pass(l, streams.Diffuse); err != nil {
		return err
	}

	// 5 all-gather inside the machine, then the tail back from padding.
	if D > 1 {
		if err := r.eachPart(p, func(pt part) error {
			x := pt.cells
			return l.intraAG.AllGather(x.Row(d), x.Base, x.RowCount(), dt, ag)
		}); err != nil {
			return err
		}
	}
	if p.pad != nil {
		if err := r.dev.CopyAsync(p.tail, p.padBase, p.tailLen, ag); err != nil {
			return err
		}
		if err := p.pad.Guard.Record(ag); err != nil {
			return err
		}
	}
	return nil
}

// reduceScatter enqueues a hierarchical reduce-scatter: per slice of the
// blocks, the gather of every rank's part into a [D][M][n] staging slot, an
// intra-machine reduce-scatter, a rail all-to-all and the add kernel
// writing straight into recv.
func (r *Reducer) reduceScatter(send, recv fairgo.Tensor, op fairgo.Op) (streams.Stream, error) {
	g := r.grid
	M, D, d := g.Machines, g.Devices, g.Local
	dt := send.DType
	es := int64(dt.Size())
	c := recv.Count
	rs, col, add, _, ag := r.stages()
	switch {
	case c == 0:
		return nil, nil
	case g.Size() == 1:
		if send.Ptr == recv.Ptr {
			return nil, nil
		}
		return rs, r.dev.CopyAsync(recv.Ptr, send.Ptr, c*es, rs)
	case M == 1:
		return rs, r.comms.IntraReduceScatter.ReduceScatter(send.Ptr, recv.Ptr, c, dt, op, rs)
	}
	ops := r.stageOps(op, dt)
	ring, err := r.stagingRing()
	if err != nil {
		return nil, err
	}
	for b := range staging.Blocks(c, int(es), g.Size(), r.layout.SliceBytes) {
		n := b.Count
		st, err := ring.Next()
		if err != nil {
			return nil, err
		}
		out := recv.Ptr + uintptr(b.Offset*es)
		x := staging.Cells{Base: st.Ptr, Devices: D, Machines: M, N: n, ElemSize: es}
		counts := sameCounts(M, n)
		if D > 1 {
			if err := rs.WaitEvent(st.Guard); err != nil {
				return nil, err
			}
			if err := r.transpose(x, send.Ptr+uintptr(b.Offset*es), c, true, rs); err != nil {
				return nil, err
			}
			if err := r.comms.IntraReduceScatter.ReduceScatter(x.Base, x.Row(d), x.RowCount(), dt, ops.intra, rs); err != nil {
				return nil, err
			}
			if err := r.handoff(streams.ReduceScatter); err != nil {
				return nil, err
			}
			nb := x.Row((d + 1) % D)
			if err := r.comms.RailCollect.AllToAllv(x.Row(d), counts, strided(M, n),
				nb, counts, strided(M, n), dt, col); err != nil {
				return nil, err
			}
			if err := r.handoff(streams.Collect); err != nil {
				return nil, err
			}
			if err := r.dev.ReduceAsync(out, nb, M, n, n, dt, ops.add, ops.addDivisor, add); err != nil {
				return nil, err
			}
		} else {
			if err := r.handoff(streams.ReduceScatter); err != nil {
				return nil, err
			}
			if err := col.WaitEvent(st.Guard); err != nil {
				return nil, err
			}
			sendDispls := strided(M, c)
			for k := range sendDispls {
				sendDispls[k] += b.Offset
			}
			if err := r.comms.RailCollect.AllToAllv(send.Ptr, counts, sendDispls,
				st.Ptr, counts, strided(M, n), dt, col); err != nil {
				return nil, err
			}
			if err := r.handoff(streams.Collect); err != nil {
				return nil, err
			}
			if err := r.dev.ReduceAsync(out, st.Ptr, M, n, n, dt, ops.add, ops.addDivisor, add); err != nil {
				return nil, err
			}
		}
		if err := st.Guard.Record(add); err != nil {
			return nil, err
		}
		if err := r.handoffsFrom(streams.Add); err != nil {
			return nil, err
		}
	}
	return ag, nil
}

// allGather enqueues a hierarchical all-gather: per slice, a rail
// all-to-all of this rank's part, an intra-machine all-gather of the
// [D][M][n] slice, and a strided copy into recv's blocks.
func (r *Reducer) allGather(send, recv fairgo.Tensor) (streams.Stream, error) {
	g := r.grid
	M, D, d := g.Machines, g.Devices, g.Local
	dt := send.DType
	es := int64(dt.Size())
	c := send.Count
	rs, _, _, dif, ag := r.stages()
	self := recv.Ptr + uintptr(int64(g.Rank())*c*es) // this rank's block in recv
	switch {
	case c == 0:
		return nil, nil
	case g.Size() == 1:
		if send.Ptr == recv.Ptr {
			return nil, nil
		}
		return rs, r.dev.CopyAsync(recv.Ptr, send.Ptr, c*es, rs)
	case M == 1:
		return rs, r.comms.IntraAllGather.AllGather(send.Ptr, recv.Ptr, c, dt, rs)
	}
	var ring *staging.Ring
	if D > 1 {
		var err error
		if ring, err = r.stagingRing(); err != nil {
			return nil, err
		}
	}
	for b := range staging.Blocks(c, int(es), g.Size(), r.layout.SliceBytes) {
		n := b.Count
		src := send.Ptr + uintptr(b.Offset*es)
		if err := r.handoffsFrom(streams.ReduceScatter); err != nil {
			return nil, err
		}
		counts := sameCounts(M, n)
		if D > 1 {
			st, err := ring.Next()
			if err != nil {
				return nil, err
			}
			x := staging.Cells{Base: st.Ptr, Devices: D, Machines: M, N: n, ElemSize: es}
			if err := dif.WaitEvent(st.Guard); err != nil {
				return nil, err
			}
			if err := r.comms.RailDiffuse.AllToAllv(src, counts, make([]int64, M),
				x.Row(d), counts, strided(M, n), dt, dif); err != nil {
				return nil, err
			}
			if err := r.handoff(streams.Diffuse); err != nil {
				return nil, err
			}
			if err := r.comms.IntraAllGather.AllGather(x.Row(d), x.Base, x.RowCount(), dt, ag); err != nil {
				return nil, err
			}
			if err := r.transpose(x, recv.Ptr+uintptr(b.Offset*es), c, false, ag); err != nil {
				return nil, err
			}
			if err := st.Guard.Record(ag); err != nil {
				return nil, err
			}
			continue
		}
		// D = 1: receive straight into recv's blocks; in place, this rank's
		// own block is already there.
		if self == send.Ptr {
			counts = withoutPeer(counts, g.Machine)
		}
		recvDispls := strided(M, c)
		for k := range recvDispls {
			recvDispls[k] += b.Offset
		}
		if err := r.comms.RailDiffuse.AllToAllv(src, counts, make([]int64, M),
			recv.Ptr, counts, recvDispls, dt, dif); err != nil {
			return nil, err
		}
		if err := r.handoff(streams.Diffuse); err != nil {
			return nil, err
		}
	}
	return ag, nil
}

func (r *Reducer) stages() (rs, col, add, dif, ag streams.Stream) {
	c := r.chain
	return c.Stream(streams.ReduceScatter), c.Stream(streams.Collect), c.Stream(streams.Add),
		c.Stream(streams.Diffuse), c.Stream(streams.AllGather)
}

// transpose copies a slice of x.N elements of every rank's block between the
// caller's buffer, where blocks of c elements stand in grid order (m·D+d,
// machine-major), and the [D][M][n] cells x (device-major): one strided copy
// per local index. gather copies buffer → cells; otherwise cells → buffer.
func (r *Reducer) transpose(x staging.Cells, buf uintptr, c int64, gather bool, s streams.Stream) error {
	D := int64(x.Devices)
	width := x.N * x.ElemSize
	for d := range x.Devices {
		row := x.Row(d)                             // [d][0] in the cells
		col := buf + uintptr(int64(d)*c*x.ElemSize) // block of grid rank 0·D+d
		dst, dstPitch, src, srcPitch := row, width, col, D*c*x.ElemSize
		if !gather {
			dst, dstPitch, src, srcPitch = col, D*c*x.ElemSize, row, width
		}
		if err := r.dev.Copy2DAsync(dst, dstPitch, src, srcPitch, width, int64(x.Machines), s); err != nil {
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
