// Package padding handles the trailing elements of a slice that do not fill
// the M × D grid: they ride through the same collectives in a small padding
// slot laid out [D][M][p], taken from a ring of slots guarded by events.
//
// The geometry (p, the slot size) comes from package staging, which also
// addresses the cells (staging.Cells); this package hands slots out.
package padding

import (
	"github.com/fairgo/fairgo/staging"
)

// Ring is the ring of padding slots of one device.
type Ring struct {
	ring              *staging.Ring
	machines, devices int
}

// NewRing makes the padding slots a layout asks for (each allocated at its
// first use).
func NewRing(dev staging.Allocator, l staging.Layout) (*Ring, error) {
	r, err := staging.NewRing(dev, l.PaddingSlots, l.PaddingSlotBytes)
	if err != nil {
		return nil, err
	}
	return &Ring{ring: r, machines: l.Machines, devices: l.Devices}, nil
}

// Next hands out the next slot, viewed as the [D][M][padShard] cells of a
// slice's padding, of elemSize-byte elements. The caller waits on the
// slot's Guard before its first use and records it after its last.
func (r *Ring) Next(padShard int64, elemSize int) (staging.Slot, staging.Cells, error) {
	s, err := r.ring.Next()
	if err != nil {
		return staging.Slot{}, staging.Cells{}, err
	}
	return s, staging.Cells{
		Base:     s.Ptr,
		Machines: r.machines,
		Devices:  r.devices,
		N:        padShard,
		ElemSize: int64(elemSize),
	}, nil
}

// Close frees the slots. A nil Ring has nothing to free.
func (r *Ring) Close() error {
	if r == nil {
		return nil
	}
	return r.ring.Close()
}
