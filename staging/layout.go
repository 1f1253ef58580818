// Package staging holds the layout arithmetic of fairgo's pipeline (slice
// size, shard and padding geometry, how many staging and padding slots fit a
// memory budget) as pure functions, and the ring of staging slots.
//
// Everything that decides where an element of a slice goes is computed here
// and nowhere else, so the fuzz tests of this package cover it.
package staging

import (
	"fmt"
	"iter"

	"github.com/fairgo/fairgo"
)

// Align is the byte alignment of slices and shards: 16 bytes, the width of
// the reduce kernels' vector loads.
const Align = 16

// MaxSlots caps the number of slots a ring holds, whatever the budget.
const MaxSlots = 64

// Params are the inputs of Plan.
type Params struct {
	Machines, Devices int   // the grid, M × D
	SliceBytes        int64 // requested slice size
	StagingBytes      int64 // memory budget of the staging ring
	PaddingBytes      int64 // memory budget of the padding ring
	Parallelism       int   // minimum number of staging slots (slices in flight)
}

// Layout is the outcome of Plan. A staging slot holds one slice
// (SliceBytes) followed by the receive area of the padding of a D = 1 slice
// (M × Align bytes). A padding slot is laid out [D][M][p] with p·elementSize
// ≤ Align, so it takes M·D·Align bytes whatever the element type.
type Layout struct {
	Machines, Devices int
	SliceBytes        int64 // multiple of M·D·Align
	StagingSlots      int
	StagingSlotBytes  int64
	PaddingSlots      int
	PaddingSlotBytes  int64
}

// World is M·D.
func (l Layout) World() int { return l.Machines * l.Devices }

// PaddingReceiveOffset is where the padding receive area starts inside a
// staging slot.
func (l Layout) PaddingReceiveOffset() int64 { return l.SliceBytes }

// Plan derives the layout from the parameters. The slice size is rounded
// down to a multiple of M·D·Align (and is at least one such unit); when the
// staging budget cannot hold Parallelism slots of that size, the slice
// shrinks until it can. A budget too small even for the smallest slice is an
// *fairgo.ArgError naming the parameter (its Params field) to raise.
func Plan(p Params) (Layout, error) {
	if p.Machines < 1 || p.Devices < 1 {
		return Layout{}, &fairgo.ArgError{
			Arg:    "grid",
			Value:  fmt.Sprintf("%d×%d", p.Machines, p.Devices),
			Reason: "needs at least one machine and one device",
		}
	}
	if p.Parallelism < 1 {
		return Layout{}, &fairgo.ArgError{Arg: "Parallelism", Value: p.Parallelism, Reason: "must be at least 1"}
	}
	w := int64(p.Machines) * int64(p.Devices)
	unit := w * Align
	recvPad := int64(p.Machines) * Align
	slice := p.SliceBytes / unit * unit
	if slice < unit {
		slice = unit
	}
	par := int64(p.Parallelism)
	if p.StagingBytes < par*(slice+recvPad) {
		slice = (p.StagingBytes/par - recvPad) / unit * unit
		if slice < unit {
			return Layout{}, &fairgo.ArgError{Arg: "StagingBytes", Value: p.StagingBytes,
				Reason: fmt.Sprintf(
					"%d slots in flight of at least %d bytes each need %d bytes; raise it or lower the parallelism",
					par,
					unit+recvPad,
					par*(unit+recvPad),
				)}
		}
	}
	l := Layout{
		Machines:         p.Machines,
		Devices:          p.Devices,
		SliceBytes:       slice,
		StagingSlotBytes: slice + recvPad,
		PaddingSlotBytes: unit,
	}
	l.StagingSlots = int(min(p.StagingBytes/l.StagingSlotBytes, max(MaxSlots, par)))
	if p.PaddingBytes < unit {
		return Layout{}, &fairgo.ArgError{Arg: "PaddingBytes", Value: p.PaddingBytes,
			Reason: fmt.Sprintf("one padding slot of a %d×%d grid needs %d bytes", p.Machines, p.Devices, unit)}
	}
	l.PaddingSlots = int(min(p.PaddingBytes/unit, MaxSlots))
	return l, nil
}

// Slice is one slice of an allreduce: Count elements from Offset, of which
// the first M·D·Shard fill the [D][M][Shard] grid and the Tail elements
// after them go through a padding slot laid out [D][M][PadShard].
type Slice struct {
	Offset   int64 // first element
	Count    int64 // elements in the slice
	Shard    int64 // elements per grid cell, a multiple of Align/elementSize
	Tail     int64 // elements past the grid, < M·D·Align/elementSize
	PadShard int64 // elements per padding cell: ceil(Tail / (M·D)), 0 without tail
}

// Slices cuts count elements of elemSize bytes into the slices of an
// allreduce over a grid of world ranks, each at most sliceBytes.
func Slices(count int64, elemSize int, world int, sliceBytes int64) iter.Seq[Slice] {
	return func(yield func(Slice) bool) {
		es := int64(elemSize)
		w := int64(world)
		alignElems := Align / es
		sliceElems := sliceBytes / es
		if sliceElems < w*alignElems {
			sliceElems = w * alignElems
		}
		for off := int64(0); off < count; off += sliceElems {
			n := min(sliceElems, count-off)
			shard := n / (w * alignElems) * alignElems
			tail := n - w*shard
			s := Slice{Offset: off, Count: n, Shard: shard, Tail: tail}
			if tail > 0 {
				s.PadShard = (tail + w - 1) / w
			}
			if !yield(s) {
				return
			}
		}
	}
}

// Block is one slice of a ReduceScatter or AllGather: elements [Offset,
// Offset+Count) of every rank's block.
type Block struct {
	Offset, Count int64
}

// Blocks cuts a per-rank block of count elements into slices so that the
// world ranks' parts of one slice together take at most sliceBytes (and each
// part is a multiple of Align bytes, except the last).
func Blocks(count int64, elemSize int, world int, sliceBytes int64) iter.Seq[Block] {
	return func(yield func(Block) bool) {
		es := int64(elemSize)
		alignElems := Align / es
		step := sliceBytes / es / int64(world) / alignElems * alignElems
		if step < alignElems {
			step = alignElems
		}
		for off := int64(0); off < count; off += step {
			if !yield(Block{Offset: off, Count: min(step, count-off)}) {
				return
			}
		}
	}
}
