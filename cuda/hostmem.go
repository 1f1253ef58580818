package cuda

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/streams"
)

// hostAllocs are the page-locked buffers AllocHost handed out, by address,
// so that FreeHost and the async copies accept only those.
type hostAllocs struct {
	mu   sync.Mutex
	live map[*byte]int
}

func (h *hostAllocs) add(b []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.live == nil {
		h.live = map[*byte]int{}
	}
	h.live[&b[0]] = len(b)
}

// owns reports whether b lies inside one buffer AllocHost returned.
func (h *hostAllocs) owns(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	p := uintptr(unsafe.Pointer(&b[0]))
	for base, n := range h.live {
		lo := uintptr(unsafe.Pointer(base))
		if p >= lo && p+uintptr(len(b)) <= lo+uintptr(n) {
			return true
		}
	}
	return false
}

// drain forgets every buffer and returns them (Close frees them).
func (h *hostAllocs) drain() [][]byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out [][]byte
	for base, n := range h.live {
		out = append(out, unsafe.Slice(base, n))
	}
	h.live = nil
	return out
}

func (h *hostAllocs) remove(b []byte) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(b) == 0 {
		return false
	}
	if _, ok := h.live[&b[0]]; !ok {
		return false
	}
	delete(h.live, &b[0])
	return true
}

// AllocHost allocates page-locked host memory, which CopyFromHostAsync and
// CopyToHostAsync move to and from the device without blocking the host.
// Free it with FreeHost.
func (d *Device) AllocHost(bytes int) ([]byte, error) {
	if bytes < 1 {
		return nil, &fairgo.ArgError{Arg: "bytes", Value: bytes, Reason: "must be at least 1"}
	}
	if err := d.alive(); err != nil {
		return nil, err
	}
	b, err := memAllocHost(d.ctx, bytes)
	if err != nil {
		return nil, err
	}
	d.host.add(b)
	return b, nil
}

// FreeHost releases memory from AllocHost.
func (d *Device) FreeHost(b []byte) error {
	if !d.host.remove(b) {
		return &fairgo.ArgError{Arg: "host buffer", Value: len(b), Reason: "not from AllocHost, or freed already"}
	}
	if d.closed.Load() {
		return nil
	}
	return memFreeHost(d.ctx, b)
}

// CopyFromHostAsync enqueues a copy of src (memory from AllocHost) to dst on
// s. src must not change until s has run the copy.
func (d *Device) CopyFromHostAsync(dst uintptr, src []byte, s streams.Stream) error {
	cs, ok, err := d.pinnedCopy(s, "src", src)
	if !ok {
		return err
	}
	return htodAsync(d.ctx, dst, src, cs.h)
}

// CopyToHostAsync enqueues a copy of device memory at src into dst (memory
// from AllocHost) on s; dst holds the bytes once s has run the copy.
func (d *Device) CopyToHostAsync(dst []byte, src uintptr, s streams.Stream) error {
	cs, ok, err := d.pinnedCopy(s, "dst", dst)
	if !ok {
		return err
	}
	return dtohAsync(d.ctx, dst, src, cs.h)
}

// pinnedCopy checks a copy on s to or from b, memory from AllocHost (the
// argument arg). It returns s's *Stream, or ok false where there is nothing
// to copy (b empty) or err.
func (d *Device) pinnedCopy(s streams.Stream, arg string, b []byte) (cs *Stream, ok bool, err error) {
	if cs, err = d.stream(s); err != nil {
		return nil, false, err
	}
	if !d.host.owns(b) {
		return nil, false, &fairgo.ArgError{Arg: arg, Value: len(b), Reason: "host memory not from AllocHost"}
	}
	return cs, len(b) > 0, nil
}

// MemInfo returns the device's free and total memory in bytes
// (cuMemGetInfo), for leak checks.
func (d *Device) MemInfo() (free, total int64, err error) {
	if err := d.alive(); err != nil {
		return 0, 0, err
	}
	return memInfo(d.ctx)
}

// DevicePointer is the device address of b, page-locked memory from
// AllocHost: under unified addressing (every 64-bit Linux GPU since CUDA
// 4.0) the driver maps such memory into the device's address space at the
// host address, so kernels, NCCL's among them, read and write it in place.
func (d *Device) DevicePointer(b []byte) (uintptr, error) {
	if !d.uva {
		return 0, fmt.Errorf("cuda: %s has no unified addressing: %w", d.name, errors.ErrUnsupported)
	}
	if len(b) == 0 || !d.host.owns(b) {
		return 0, &fairgo.ArgError{Arg: "host buffer", Value: len(b), Reason: "not memory from AllocHost"}
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b))), nil
}
