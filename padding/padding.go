// Package padding handles the trailing elements of a slice that do not fill
// the M × D grid: they ride through the same collectives in a small padding
// slot laid out [D][M][p], taken from a ring of slots guarded by events.
//
// The geometry (p, the slot size) comes from package staging; this package
// addresses the cells of a slot and hands slots out.
package padding

import (
	"github.com/fairgo/fairgo/staging"
)

// View addresses the cells of one padding slot holding a [D][M][PadShard]
// array of ElemSize-byte elements at Base.
type View struct {
	Base              uintptr
	Machines, Devices int
	PadShard          int64 // elements per cell
	ElemSize          int64
}

// Cell is the address of cell [d][m].
func (v View) Cell(d, m int) uintptr {
	return v.Base + uintptr((int64(d)*int64(v.Machines)+int64(m))*v.PadShard*v.ElemSize)
}

// Row is the address of row [d], M cells long.
func (v View) Row(d int) uintptr { return v.Cell(d, 0) }

// Bytes is the size of the whole [D][M][PadShard] array.
func (v View) Bytes() int64 {
	return int64(v.Devices) * int64(v.Machines) * v.PadShard * v.ElemSize
}

// Ring is the ring of padding slots of one device.
type Ring struct {
	ring              *staging.Ring
	machines, devices int
}

// NewRing allocates the padding slots a layout asks for.
func NewRing(dev staging.Allocator, l staging.Layout) (*Ring, error) {
	r, err := staging.NewRing(dev, l.PaddingSlots, l.PaddingSlotBytes)
	if err != nil {
		return nil, err
	}
	return &Ring{ring: r, machines: l.Machines, devices: l.Devices}, nil
}

// Next hands out the next slot, viewed for a slice whose padding cells hold
// padShard elements of elemSize bytes. The caller waits on the slot's Guard
// before its first use and records it after its last.
func (r *Ring) Next(padShard int64, elemSize int) (staging.Slot, View) {
	s := r.ring.Next()
	return s, View{Base: s.Ptr, Machines: r.machines, Devices: r.devices, PadShard: padShard, ElemSize: int64(elemSize)}
}

// Close frees the slots.
func (r *Ring) Close() error { return r.ring.Close() }
