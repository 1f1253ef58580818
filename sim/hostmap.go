package sim

import (
	"fmt"
	"unsafe"

	"github.com/fairgo/fairgo"
)

// DevicePointer is the device address of b, memory from AllocHost, as a
// GPU maps page-locked memory under unified addressing: the first call
// makes b an allocation of this device's address space whose bytes are b
// itself, so that device work (copies, reductions, communicator calls)
// reads and writes b in place. The host must not touch b while enqueued
// work that uses it may run, as on a GPU. FreeHost drops the mapping.
func (d *Device) DevicePointer(b []byte) (uintptr, error) {
	if err := d.checkOpen(); err != nil {
		return 0, err
	}
	if len(b) == 0 {
		return 0, &fairgo.ArgError{Arg: "host buffer", Value: 0, Reason: "empty"}
	}
	return d.mem.mapHost(b)
}

// mapHost returns the address at which b is mapped, mapping it first.
func (m *memory) mapHost(b []byte) (uintptr, error) {
	key := unsafe.SliceData(b)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mapped == nil {
		m.mapped = map[*byte]uintptr{}
	}
	if addr, ok := m.mapped[key]; ok {
		if a := m.allocs[m.find(addr)]; a.size >= int64(len(b)) {
			return addr, nil
		}
		return 0, &fairgo.ArgError{Arg: "host buffer", Value: len(b), Reason: "longer than when it was first mapped"}
	}
	addr := m.next
	reserved := alignUp(int64(len(b)))
	if uint64(m.limitAddr()-addr) < uint64(reserved) {
		return 0, fmt.Errorf("%s: mapping %d bytes of host memory: address space exhausted: %w", m.owner, len(b), ErrOutOfMemory)
	}
	m.next = addr + uintptr(reserved) + allocGap
	m.allocs = append(m.allocs, &allocation{base: addr, size: int64(len(b)), data: b})
	m.mapped[key] = addr
	return addr, nil
}

// unmapHost drops b's mapping, if any (FreeHost).
func (m *memory) unmapHost(b []byte) {
	if len(b) == 0 {
		return
	}
	m.mu.Lock()
	addr, ok := m.mapped[unsafe.SliceData(b)]
	if ok {
		delete(m.mapped, unsafe.SliceData(b))
		i := m.find(addr)
		a := m.allocs[i]
		m.allocs = append(m.allocs[:i], m.allocs[i+1:]...)
		m.mu.Unlock()
		a.mu.Lock()
		a.freed, a.data = true, nil
		a.mu.Unlock()
		return
	}
	m.mu.Unlock()
}
