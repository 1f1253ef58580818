package staging

import (
	"errors"
	"fmt"

	"github.com/fairgo/fairgo/streams"
)

// Allocator is the part of a device a Ring needs.
type Allocator interface {
	streams.Factory
	Alloc(bytes int64) (uintptr, error)
	Free(ptr uintptr) error
}

// Slot is one slot of a ring: Bytes of device memory at Ptr, and the event
// that guards it. The first stage that uses the slot waits on Guard; the
// last stage that uses it records Guard, so the slot is reused only after
// its previous slice is done with it.
type Slot struct {
	Index int
	Ptr   uintptr
	Bytes int64
	Guard streams.Event
}

// Ring is a ring of equal slots in one allocation, handed out round-robin.
// It is not safe for concurrent use: the engine goroutine of a device owns it.
type Ring struct {
	dev   Allocator
	base  uintptr
	slots []Slot
	next  int
}

// NewRing allocates n slots of slotBytes each and one guard event per slot.
func NewRing(dev Allocator, n int, slotBytes int64) (*Ring, error) {
	if n < 1 || slotBytes < 1 {
		return nil, fmt.Errorf("staging: a ring needs at least one slot of at least one byte, got %d × %d", n, slotBytes)
	}
	base, err := dev.Alloc(int64(n) * slotBytes)
	if err != nil {
		return nil, fmt.Errorf("staging: allocating %d slots of %d bytes: %w", n, slotBytes, err)
	}
	r := &Ring{dev: dev, base: base, slots: make([]Slot, n)}
	for i := range r.slots {
		ev, err := dev.NewEvent()
		if err != nil {
			return nil, errors.Join(fmt.Errorf("staging: creating slot event: %w", err), r.Close())
		}
		r.slots[i] = Slot{Index: i, Ptr: base + uintptr(int64(i)*slotBytes), Bytes: slotBytes, Guard: ev}
	}
	return r, nil
}

// Len is the number of slots.
func (r *Ring) Len() int { return len(r.slots) }

// Next returns the next slot in round-robin order.
func (r *Ring) Next() Slot {
	s := r.slots[r.next]
	r.next = (r.next + 1) % len(r.slots)
	return s
}

// Close frees the ring's memory. The caller must have waited for the work
// that used it.
func (r *Ring) Close() error {
	if r.base == 0 {
		return nil
	}
	errs := []error{r.dev.Free(r.base)}
	for _, s := range r.slots {
		errs = append(errs, streams.Release(s.Guard))
	}
	r.base = 0
	return errors.Join(errs...)
}
