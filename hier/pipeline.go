package hier

import (
	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/padding"
	"github.com/fairgo/fairgo/staging"
	"github.com/fairgo/fairgo/streams"
)

// allReduce enqueues the five-stage pipeline for every slice of t (M > 1).
func (r *Reducer) allReduce(t fairgo.Tensor, op fairgo.Op) (streams.Stream, error) {
	g := r.grid
	M, D, m, d := g.Machines, g.Devices, g.Machine, g.Local
	W := int64(g.Size())
	dt := t.DType
	es := int64(dt.Size())
	intraOp, addOp, div := r.stageOps(op)
	rs, col, add, dif, ag := r.stages()
	for sl := range staging.Slices(t.Count, int(es), g.Size(), r.layout.SliceBytes) {
		base := t.Ptr + uintptr(sl.Offset*es)
		S, P := sl.Shard, sl.PadShard
		cell := func(dd, mm int) uintptr { return base + uintptr((int64(dd)*int64(M)+int64(mm))*S*es) }
		tail := base + uintptr(W*S*es)

		// Where the collect stage receives: the neighbour's slot, dead after
		// the reduce-scatter (D ≥ 2), or a staging slot (D = 1).
		var st *staging.Slot
		recv := cell((d+1)%D, 0)
		var padRecv uintptr
		if D == 1 {
			ring, err := r.stagingRing()
			if err != nil {
				return nil, err
			}
			s := ring.Next()
			st = &s
			recv = s.Ptr
			padRecv = s.Ptr + uintptr(r.layout.PaddingReceiveOffset())
		}
		var pslot staging.Slot
		var pv padding.View
		if P > 0 {
			ring, err := r.paddingRing()
			if err != nil {
				return nil, err
			}
			pslot, pv = ring.Next(P, int(es))
			if D > 1 {
				padRecv = pv.Row((d + 1) % D)
			}
		}

		// 1 reduce-scatter inside the machine.
		if P > 0 {
			if err := rs.WaitEvent(pslot.Guard); err != nil {
				return nil, err
			}
			if err := r.dev.CopyAsync(pv.Base, tail, sl.Tail*es, rs); err != nil {
				return nil, err
			}
		}
		if D > 1 {
			c := r.comms.IntraReduceScatter
			if err := r.dev.Group(func() error {
				if S > 0 {
					if err := c.ReduceScatter(base, cell(d, 0), int64(M)*S, dt, intraOp, rs); err != nil {
						return err
					}
				}
				if P > 0 {
					return c.ReduceScatter(pv.Base, pv.Row(d), int64(M)*P, dt, intraOp, rs)
				}
				return nil
			}); err != nil {
				return nil, err
			}
		}
		if err := r.handoff(streams.ReduceScatter); err != nil {
			return nil, err
		}

		// 2 collect: shard [d][k] to machine k.
		if st != nil {
			if err := col.WaitEvent(st.Guard); err != nil {
				return nil, err
			}
		}
		if err := r.dev.Group(func() error {
			c := r.comms.RailCollect
			if S > 0 {
				counts, displs := uniform(M, S, S, -1)
				if err := c.AllToAllv(cell(d, 0), counts, displs, recv, counts, displs, dt, col); err != nil {
					return err
				}
			}
			if P > 0 {
				counts, displs := uniform(M, P, P, -1)
				return c.AllToAllv(pv.Row(d), counts, displs, padRecv, counts, displs, dt, col)
			}
			return nil
		}); err != nil {
			return nil, err
		}
		if err := r.handoff(streams.Collect); err != nil {
			return nil, err
		}

		// 3 add: reduce the M received shards into [d][m].
		if S > 0 {
			if err := r.dev.ReduceAsync(cell(d, m), recv, M, S, S, dt, addOp, div, add); err != nil {
				return nil, err
			}
		}
		if P > 0 {
			if err := r.dev.ReduceAsync(pv.Cell(d, m), padRecv, M, P, P, dt, addOp, div, add); err != nil {
				return nil, err
			}
		}
		if st != nil {
			if err := st.Guard.Record(add); err != nil {
				return nil, err
			}
		}
		if err := r.handoff(streams.Add); err != nil {
			return nil, err
		}

		// 4 diffuse: shard [d][m] to every other machine, into [d][k].
		if err := r.dev.Group(func() error {
			c := r.comms.RailDiffuse
			if S > 0 {
				sc, zero := uniform(M, S, 0, m)
				rc, rd := uniform(M, S, S, m)
				if err := c.AllToAllv(cell(d, m), sc, zero, cell(d, 0), rc, rd, dt, dif); err != nil {
					return err
				}
			}
			if P > 0 {
				sc, zero := uniform(M, P, 0, m)
				rc, rd := uniform(M, P, P, m)
				return c.AllToAllv(pv.Cell(d, m), sc, zero, pv.Row(d), rc, rd, dt, dif)
			}
			return nil
		}); err != nil {
			return nil, err
		}
		if err := r.handoff(streams.Diffuse); err != nil {
			return nil, err
		}

		// 5 all-gather inside the machine, then the tail back from padding.
		if D > 1 {
			c := r.comms.IntraAllGather
			if err := r.dev.Group(func() error {
				if S > 0 {
					if err := c.AllGather(cell(d, 0), base, int64(M)*S, dt, ag); err != nil {
						return err
					}
				}
				if P > 0 {
					return c.AllGather(pv.Row(d), pv.Base, int64(M)*P, dt, ag)
				}
				return nil
			}); err != nil {
				return nil, err
			}
		}
		if P > 0 {
			if err := r.dev.CopyAsync(tail, pv.Base, sl.Tail*es, ag); err != nil {
				return nil, err
			}
			if err := pslot.Guard.Record(ag); err != nil {
				return nil, err
			}
		}
	}
	return ag, nil
}

// reduceScatter enqueues a hierarchical reduce-scatter: per slice of the
// blocks, an intra-machine reduce-scatter of the gathered [D][M][n] slice, a
// rail all-to-all and the add kernel writing straight into recv.
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
	intraOp, addOp, div := r.stageOps(op)
	ring, err := r.stagingRing()
	if err != nil {
		return nil, err
	}
	for b := range staging.Blocks(c, int(es), g.Size(), r.layout.SliceBytes) {
		n := b.Count
		st := ring.Next()
		out := recv.Ptr + uintptr(b.Offset*es)
		if D > 1 {
			x := func(dd, mm int) uintptr { return st.Ptr + uintptr((int64(dd)*int64(M)+int64(mm))*n*es) }
			if err := rs.WaitEvent(st.Guard); err != nil {
				return nil, err
			}
			if err := r.transpose(x(0, 0), send.Ptr+uintptr(b.Offset*es), n, c, es, true, rs); err != nil {
				return nil, err
			}
			if err := r.comms.IntraReduceScatter.ReduceScatter(st.Ptr, x(d, 0), int64(M)*n, dt, intraOp, rs); err != nil {
				return nil, err
			}
			if err := r.handoff(streams.ReduceScatter); err != nil {
				return nil, err
			}
			counts, displs := uniform(M, n, n, -1)
			if err := r.comms.RailCollect.AllToAllv(x(d, 0), counts, displs, x((d+1)%D, 0), counts, displs, dt, col); err != nil {
				return nil, err
			}
			if err := r.handoff(streams.Collect); err != nil {
				return nil, err
			}
			if err := r.dev.ReduceAsync(out, x((d+1)%D, 0), M, n, n, dt, addOp, div, add); err != nil {
				return nil, err
			}
		} else {
			if err := r.handoff(streams.ReduceScatter); err != nil {
				return nil, err
			}
			if err := col.WaitEvent(st.Guard); err != nil {
				return nil, err
			}
			counts, recvDispls := uniform(M, n, n, -1)
			_, sendDispls := uniform(M, n, c, -1)
			for k := range sendDispls {
				sendDispls[k] += b.Offset
			}
			if err := r.comms.RailCollect.AllToAllv(send.Ptr, counts, sendDispls, st.Ptr, counts, recvDispls, dt, col); err != nil {
				return nil, err
			}
			if err := r.handoff(streams.Collect); err != nil {
				return nil, err
			}
			if err := r.dev.ReduceAsync(out, st.Ptr, M, n, n, dt, addOp, div, add); err != nil {
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
		if D > 1 {
			st := ring.Next()
			x := func(dd, mm int) uintptr { return st.Ptr + uintptr((int64(dd)*int64(M)+int64(mm))*n*es) }
			if err := dif.WaitEvent(st.Guard); err != nil {
				return nil, err
			}
			sc, zero := uniform(M, n, 0, -1)
			rc, rd := uniform(M, n, n, -1)
			if err := r.comms.RailDiffuse.AllToAllv(src, sc, zero, x(d, 0), rc, rd, dt, dif); err != nil {
				return nil, err
			}
			if err := r.handoff(streams.Diffuse); err != nil {
				return nil, err
			}
			if err := r.comms.IntraAllGather.AllGather(x(d, 0), st.Ptr, int64(M)*n, dt, ag); err != nil {
				return nil, err
			}
			if err := r.transpose(st.Ptr, recv.Ptr+uintptr(b.Offset*es), n, c, es, false, ag); err != nil {
				return nil, err
			}
			if err := st.Guard.Record(ag); err != nil {
				return nil, err
			}
			continue
		}
		// D = 1: receive straight into recv's blocks; skip the self copy
		// when the call is in place.
		skip := -1
		if self == send.Ptr {
			skip = g.Machine
		}
		sc, zero := uniform(M, n, 0, skip)
		rc, rd := uniform(M, n, c, skip)
		for k := range rd {
			rd[k] += b.Offset
		}
		if err := r.comms.RailDiffuse.AllToAllv(src, sc, zero, recv.Ptr, rc, rd, dt, dif); err != nil {
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
	return c.Stream(streams.ReduceScatter), c.Stream(streams.Collect), c.Stream(streams.Add), c.Stream(streams.Diffuse), c.Stream(streams.AllGather)
}

// transpose copies a slice of n elements of every rank's block between the
// caller's buffer, where blocks of c elements stand in grid order (m·D+d,
// machine-major), and a staging area laid out [D][M][n] (device-major): one
// strided copy per local index. gather copies buffer → staging; otherwise
// staging → buffer.
func (r *Reducer) transpose(stage, buf uintptr, n, c, es int64, gather bool, s streams.Stream) error {
	M, D := int64(r.grid.Machines), int64(r.grid.Devices)
	for d := int64(0); d < D; d++ {
		row := stage + uintptr(d*M*n*es) // [d][0] in staging
		col := buf + uintptr(d*c*es)     // block of grid rank 0·D+d
		var err error
		if gather {
			err = r.dev.Copy2DAsync(row, n*es, col, D*c*es, n*es, M, s)
		} else {
			err = r.dev.Copy2DAsync(col, D*c*es, row, n*es, n*es, M, s)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
