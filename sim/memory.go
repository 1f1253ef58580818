package sim

import (
	"fmt"
	"sort"
	"sync"

	"github.com/fairgo/fairgo"
)

const (
	addrShift  = 40  // device i's addresses start at (i+1) << addrShift
	allocAlign = 256 // allocation alignment, as cudaMalloc's
	allocGap   = 256 // unmapped bytes between allocations, so overruns never land in a neighbour
)

// allocation is one Alloc: a span of a device's address space backed by
// host memory. mu guards data and freed; it is held only while bytes are
// copied in or out, and never together with another allocation's.
type allocation struct {
	base  uintptr
	size  int64
	mu    sync.Mutex
	data  []byte
	freed bool
	// release gives data back (newScratch's function; nil for host memory
	// mapped by DevicePointer, which its owner frees).
	release func()
}

// drop marks a freed and gives its memory back. The caller holds a.mu, so
// no copy is under way.
func (a *allocation) drop() {
	a.freed, a.data = true, nil
	if a.release != nil {
		a.release()
		a.release = nil
	}
}

// memory is a device's address space.
type memory struct {
	owner  *Device
	mu     sync.RWMutex
	allocs []*allocation // sorted by base
	next   uintptr
	used   int64             // bytes reserved, aligned
	limit  int64             // 0 = unlimited
	mapped map[*byte]uintptr // host memory mapped into the address space (DevicePointer), by its first byte
}

func alignUp(n int64) int64 { return (n + allocAlign - 1) &^ (allocAlign - 1) }

func (m *memory) base() uintptr      { return uintptr(m.owner.index+1) << addrShift }
func (m *memory) limitAddr() uintptr { return m.base() + 1<<addrShift - allocGap }

func (m *memory) alloc(bytes int64) (uintptr, error) {
	if bytes < 0 {
		return 0, &fairgo.ArgError{Arg: "bytes", Value: bytes, Reason: "negative allocation size"}
	}
	reserved := alignUp(max(bytes, 1))
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.limit > 0 && m.used+reserved > m.limit {
		return 0, fmt.Errorf(
			"%s: allocating %d bytes with %d of %d in use: %w",
			m.owner,
			bytes,
			m.used,
			m.limit,
			ErrOutOfMemory,
		)
	}
	addr := m.next
	if uint64(m.limitAddr()-addr) < uint64(reserved) {
		return 0, fmt.Errorf("%s: allocating %d bytes: address space exhausted: %w", m.owner, bytes, ErrOutOfMemory)
	}
	m.next = addr + uintptr(reserved) + allocGap
	m.used += reserved
	data, release := newScratch(bytes)
	m.allocs = append(m.allocs, &allocation{base: addr, size: bytes, data: data, release: release})
	return addr, nil
}

func (m *memory) free(ptr uintptr) error {
	if ptr == 0 {
		return nil
	}
	m.mu.Lock()
	i := m.find(ptr)
	if i < 0 || m.allocs[i].base != ptr {
		m.mu.Unlock()
		return &fairgo.ArgError{
			Arg:    "ptr",
			Value:  fmt.Sprintf("%#x", ptr),
			Reason: fmt.Sprintf("not the start of an allocation of %s%s", m.owner, m.owner.elsewhere(ptr)),
		}
	}
	a := m.allocs[i]
	m.allocs = append(m.allocs[:i], m.allocs[i+1:]...)
	m.used -= alignUp(max(a.size, 1))
	m.mu.Unlock()
	a.mu.Lock()
	a.drop()
	a.mu.Unlock()
	return nil
}

// find returns the index of the last allocation starting at or before ptr,
// or -1. The caller holds mu.
func (m *memory) find(ptr uintptr) int {
	return sort.Search(len(m.allocs), func(i int) bool { return m.allocs[i].base > ptr }) - 1
}

// lookup finds the allocation holding all of [ptr, ptr+bytes), bytes > 0,
// and the offset of ptr in it; the string explains a failure.
func (m *memory) lookup(ptr uintptr, bytes int64) (*allocation, int64, string) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	i := m.find(ptr)
	if i < 0 {
		return nil, 0, "not inside any allocation of " + m.owner.String() + m.owner.elsewhere(ptr)
	}
	a := m.allocs[i]
	off := int64(ptr - a.base)
	switch {
	case uint64(off) >= uint64(a.size) && !(bytes == 0 && off == a.size):
		return nil, 0, fmt.Sprintf("not inside any allocation of %s%s", m.owner, m.owner.elsewhere(ptr))
	case bytes > a.size-off:
		return nil, 0, fmt.Sprintf(
			"runs %d bytes past the end of the %d-byte allocation at %#x of %s",
			bytes-(a.size-off),
			a.size,
			a.base,
			m.owner,
		)
	}
	return a, off, ""
}

// checkRange is Device.CheckRange.
func (m *memory) checkRange(ptr uintptr, bytes int64) error {
	if bytes < 0 {
		return &fairgo.ArgError{Arg: "bytes", Value: bytes, Reason: "negative range length"}
	}
	if bytes == 0 && ptr == 0 {
		return nil
	}
	if _, _, why := m.lookup(ptr, bytes); why != "" {
		return &fairgo.ArgError{Arg: "device range", Value: fmt.Sprintf("[%#x, +%d bytes)", ptr, bytes), Reason: why}
	}
	return nil
}

// read copies [ptr, ptr+bytes) into a new slice, or fails as an illegal
// address of the operation op.
func (m *memory) read(op string, ptr uintptr, bytes int64) ([]byte, error) {
	if bytes == 0 {
		return nil, nil
	}
	a, off, why := m.lookup(ptr, bytes)
	if why != "" {
		return nil, m.illegal(op, ptr, bytes, why)
	}
	out := make([]byte, bytes)
	if err := m.copyOut(op, ptr, a, off, out); err != nil {
		return nil, err
	}
	return out, nil
}

// readInto copies [ptr, ptr+len(dst)) into dst, or fails as read does.
func (m *memory) readInto(op string, ptr uintptr, dst []byte) error {
	if len(dst) == 0 {
		return nil
	}
	bytes := int64(len(dst))
	a, off, why := m.lookup(ptr, bytes)
	if why != "" {
		return m.illegal(op, ptr, bytes, why)
	}
	return m.copyOut(op, ptr, a, off, dst)
}

// copyOut copies len(dst) bytes at offset off of a into dst.
func (m *memory) copyOut(op string, ptr uintptr, a *allocation, off int64, dst []byte) error {
	bytes := int64(len(dst))
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.freed {
		return m.illegal(op, ptr, bytes, "the allocation was freed")
	}
	copy(dst, a.data[off:off+bytes])
	return nil
}

// write copies data to ptr, or fails as an illegal address of op.
func (m *memory) write(op string, ptr uintptr, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	bytes := int64(len(data))
	a, off, why := m.lookup(ptr, bytes)
	if why != "" {
		return m.illegal(op, ptr, bytes, why)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.freed {
		return m.illegal(op, ptr, bytes, "the allocation was freed")
	}
	copy(a.data[off:], data)
	return nil
}

func (m *memory) illegal(op string, ptr uintptr, bytes int64, why string) error {
	return &IllegalAddressError{Device: m.owner.String(), Op: op, Ptr: ptr, Bytes: bytes, Reason: why}
}

func (m *memory) inUse() int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.used
}

// release frees every allocation (the cluster closed).
func (m *memory) release() {
	m.mu.Lock()
	allocs := m.allocs
	m.allocs, m.used = nil, 0
	m.mu.Unlock()
	for _, a := range allocs {
		a.mu.Lock()
		a.drop()
		a.mu.Unlock()
	}
}
