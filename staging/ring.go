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

// Ring is a ring of equal slots handed out round-robin, each allocated at
// its first use: a call that needs one slot pays for one, not for the
// whole budget. It is not safe for concurrent use: the engine goroutine of
// a device owns it.
type Ring struct {
	dev       Allocator
	slotBytes int64
	slots     []Slot // Ptr 0: not allocated yet
	next      int
}

// NewRing makes a ring of n slots of slotBytes each, with one guard event
// per slot; the memory comes at each slot's first use (Next).
func NewRing(dev Allocator, n int, slotBytes int64) (*Ring, error) {
	if n < 1 || slotBytes < 1 {
		return nil, fmt.Errorf(
			"staging: a ring needs at least one slot of at least one byte, got %d × %d",
			n,
			slotBytes,
		)
	}
	r := &Ring{dev: dev, slotBytes: slotBytes, slots: make([]Slot, n)}
	for i := range r.slots {
		ev, err := dev.NewEvent()
		if err != nil {
			return nil, errors.Join(fmt.Errorf("staging: creating slot event: %w", err), r.Close())
		}
		r.slots[i] = Slot{Index: i, Bytes: slotBytes, Guard: ev}
	}
	return r, nil
}

// Len is the number of slots.
func (r *Ring) Len() int { return len(r.slots) }

// Next returns the next slot in round-robin order, allocating its memory
// at its first use.
func (r *Ring) Next() (Slot, error) {
	s := &r.slots[r.next]
	if s.Ptr == 0 {
		p, err := r.dev.Alloc(r.slotBytes)
		if err != nil {
			return Slot{}, fmt.Errorf("staging: allocating slot %d of %d bytes: %w", s.Index, r.slotBytes, err)
		}
		s.Ptr = p
	}
	r.next = (r.next + 1) % len(r.slots)
	return *s, nil
}

// Close frees the ring's memory and events. The caller must have waited
// for the work that used it. A nil Ring has nothing to free.
func (r *Ring) Close() error {
	if r == nil {
		return nil
	}
	var errs []error
	for i := range r.slots {
		s := &r.slots[i]
		if s.Ptr != 0 {
			errs = append(errs, r.dev.Free(s.Ptr))
			s.Ptr = 0
		}
		if s.Guard != nil {
			errs = append(errs, streams.Release(s.Guard))
			s.Guard = nil
		}
	}
	return errors.Join(errs...)
}
