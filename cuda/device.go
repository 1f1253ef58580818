//go:build cuda

// Package cuda is fairgo's GPU backend: a hier.Device over a GPU's primary
// context (streams, events, memory, the reduce kernels from embedded PTX) and
// a hier.Comm over NCCL, built on gorgonia.org/cu and the driver API.
// It needs the `cuda` build tag, CUDA headers to build, and a driver to run.
package cuda

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/nccl"
	"github.com/fairgo/fairgo/streams"
)

var _ hier.Device = (*Device)(nil)

// Count is the number of CUDA devices.
func Count() (int, error) { return cu.NumDevices() }

// Device is one GPU, driven through its primary context (the context the
// CUDA runtime, and so PyTorch, uses), so buffers and streams interoperate
// with other libraries in the process. Its methods may be called from any
// goroutine: each driver call makes the primary context current on the
// calling thread for its duration. Bind is for code that calls CUDA itself
// (NCCL does) and wants the context current for longer.
type Device struct {
	ordinal  int
	dev      cDevice
	ctx      cContext
	name     string
	sms      int
	maxPitch int64
	priority int // the highest stream priority
	kernels  *kernels

	closed atomic.Bool
	mu     sync.Mutex
	owned  map[any]struct{} // streams and events made here, destroyed by Close
	allocs map[uintptr]int64

	ncclMu  sync.Mutex
	ncclLib *nccl.Library

	group groupState
	host  hostAllocs // page-locked host memory from AllocHost
}

// Open retains the primary context of GPU ordinal, creates nothing on it
// but the kernel module, and returns the device. Close releases it.
func Open(ordinal int) (*Device, error) {
	n, err := Count()
	if err != nil {
		return nil, fmt.Errorf("cuda: counting devices: %w", err)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, &fairgo.ArgError{Arg: "device ordinal", Value: ordinal, Reason: fmt.Sprintf("outside [0, %d)", n)}
	}
	cd := cu.Device(ordinal)
	name, err := cd.Name()
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d name: %w", ordinal, err)
	}
	sms, err := cd.Attribute(cu.MultiprocessorCount)
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: %w", ordinal, err)
	}
	pitch, err := cd.Attribute(cu.MaxPitch)
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: %w", ordinal, err)
	}
	dev, ctx, err := primaryRetain(ordinal)
	if err != nil {
		return nil, err
	}
	d := &Device{
		ordinal: ordinal, dev: dev, ctx: ctx, name: name, sms: sms, maxPitch: int64(pitch),
		owned: map[any]struct{}{}, allocs: map[uintptr]int64{},
	}
	fail := func(err error) (*Device, error) {
		_ = primaryRelease(dev)
		return nil, err
	}
	_, greatest, err := priorityRange(ctx)
	if err != nil {
		return fail(err)
	}
	d.priority = greatest
	if d.kernels, err = loadKernels(ctx); err != nil {
		return fail(fmt.Errorf("cuda: device %d: %w", ordinal, err))
	}
	return d, nil
}

// Ordinal is the device's CUDA ordinal.
func (d *Device) Ordinal() int { return d.ordinal }

// Name is the device's product name.
func (d *Device) Name() string { return d.name }

// Multiprocessors is the device's SM count.
func (d *Device) Multiprocessors() int { return d.sms }

func (d *Device) String() string { return fmt.Sprintf("cuda:%d (%s)", d.ordinal, d.name) }

func (d *Device) alive() error {
	if d.closed.Load() {
		return ErrDeviceClosed
	}
	return nil
}

// do runs fn on a locked OS thread with the primary context current, for
// gorgonia.org/cu and NCCL calls that use the thread's context.
func (d *Device) do(fn func() error) error {
	if err := d.alive(); err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prev, err := ctxGet()
	if err != nil {
		return err
	}
	if prev != d.ctx {
		if err := ctxSet(d.ctx); err != nil {
			return err
		}
		defer ctxSet(prev)
	}
	return fn()
}

// Bind locks the calling goroutine to its OS thread and makes the primary
// context current there; release restores the previous context and unlocks.
// Call release from the same goroutine.
func (d *Device) Bind() (release func(), err error) {
	if err := d.alive(); err != nil {
		return nil, err
	}
	runtime.LockOSThread()
	prev, err := ctxGet()
	if err == nil {
		err = ctxSet(d.ctx)
	}
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			_ = ctxSet(prev)
			runtime.UnlockOSThread()
		})
	}, nil
}

// Synchronize waits for all work on the device's primary context.
func (d *Device) Synchronize() error {
	if err := d.alive(); err != nil {
		return err
	}
	return ctxSync(d.ctx)
}

// Alloc allocates device memory with cuMemAlloc. Close frees what is still
// allocated.
func (d *Device) Alloc(bytes int64) (uintptr, error) {
	if bytes <= 0 {
		return 0, &fairgo.ArgError{Arg: "bytes", Value: bytes, Reason: "must be positive"}
	}
	var p cu.DevicePtr
	err := d.do(func() (err error) {
		p, err = cu.MemAlloc(bytes)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("cuda: allocating %d bytes on %v: %w", bytes, d, err)
	}
	d.mu.Lock()
	d.allocs[uintptr(p)] = bytes
	d.mu.Unlock()
	return uintptr(p), nil
}

// AllocTensor allocates a tensor of count elements.
func (d *Device) AllocTensor(count int64, dt fairgo.DType) (fairgo.Tensor, error) {
	t := fairgo.Tensor{Count: count, DType: dt, Bytes: count * int64(dt.Size())}
	t.Ptr = 1 // validated below before the real pointer is known
	if err := t.Validate(); err != nil {
		return fairgo.Tensor{}, err
	}
	p, err := d.Alloc(max(t.Bytes, 1))
	if err != nil {
		return fairgo.Tensor{}, err
	}
	t.Ptr = p
	return t, nil
}

// Free releases memory from Alloc. Other pointers are refused.
func (d *Device) Free(ptr uintptr) error {
	d.mu.Lock()
	_, ok := d.allocs[ptr]
	delete(d.allocs, ptr)
	d.mu.Unlock()
	if !ok {
		return &fairgo.ArgError{Arg: "ptr", Value: fmt.Sprintf("%#x", ptr), Reason: fmt.Sprintf("not allocated by Alloc on %v (or already freed)", d)}
	}
	return d.do(func() error { return cu.MemFree(cu.DevicePtr(ptr)) })
}

// WrapDevicePtr describes count elements at a caller's device pointer as a
// tensor, with no copy; fairgo never frees it.
func WrapDevicePtr(ptr cu.DevicePtr, count int64, dt fairgo.DType) fairgo.Tensor {
	return fairgo.Tensor{Ptr: uintptr(ptr), Bytes: count * int64(dt.Size()), Count: count, DType: dt}
}

// CheckRange returns an error wrapping fairgo.ErrInvalidArgument unless
// [ptr, ptr+bytes) lies inside one device allocation of this GPU (so host
// memory, another GPU's memory, unknown addresses and buffers shorter than
// bytes are refused).
func (d *Device) CheckRange(ptr uintptr, bytes int64) error {
	if err := d.alive(); err != nil {
		return err
	}
	if bytes < 0 {
		return &fairgo.ArgError{Arg: "bytes", Value: bytes, Reason: "negative"}
	}
	if bytes == 0 {
		return nil
	}
	bad := func(reason string) error {
		return &fairgo.ArgError{Arg: "device buffer", Value: fmt.Sprintf("[%#x, +%d)", ptr, bytes), Reason: reason}
	}
	a, err := pointerAttrs(d.ctx, ptr)
	if err != nil {
		return bad(fmt.Sprintf("not CUDA memory (%v)", err))
	}
	if a.memType != memoryTypeDevice {
		return bad(fmt.Sprintf("not device memory (CUDA memory type %d)", a.memType))
	}
	if a.ordinal != d.ordinal {
		return bad(fmt.Sprintf("memory of GPU %d, not of GPU %d", a.ordinal, d.ordinal))
	}
	if ptr < a.start || uint64(ptr-a.start)+uint64(bytes) > uint64(a.size) {
		return bad(fmt.Sprintf("the allocation [%#x, +%d) is too short", a.start, a.size))
	}
	return nil
}

func (d *Device) stream(s streams.Stream) (*Stream, error) {
	cs, ok := s.(*Stream)
	if !ok || cs == nil {
		return nil, &fairgo.ArgError{Arg: "stream", Value: fmt.Sprintf("%T", s), Reason: "not a *cuda.Stream"}
	}
	if cs.d != d {
		return nil, &fairgo.ArgError{Arg: "stream", Value: cs, Reason: fmt.Sprintf("belongs to %v, not %v", cs.d, d)}
	}
	if err := cs.alive(); err != nil {
		return nil, err
	}
	return cs, nil
}

// CopyAsync enqueues a device-to-device copy on s.
func (d *Device) CopyAsync(dst, src uintptr, bytes int64, s streams.Stream) error {
	cs, err := d.stream(s)
	if err != nil {
		return err
	}
	if bytes < 0 {
		return &fairgo.ArgError{Arg: "bytes", Value: bytes, Reason: "negative"}
	}
	if bytes == 0 {
		return nil
	}
	return copyAsync(d.ctx, dst, src, bytes, cs.h)
}

// Copy2DAsync enqueues height rows of width bytes, from src+i·srcPitch to
// dst+i·dstPitch, as one cuMemcpy2DAsync (or one flat copy when the rows are
// contiguous, or a copy per row when a pitch exceeds the device's limit).
func (d *Device) Copy2DAsync(dst uintptr, dstPitch int64, src uintptr, srcPitch int64, width, height int64, s streams.Stream) error {
	cs, err := d.stream(s)
	if err != nil {
		return err
	}
	switch {
	case width < 0 || height < 0:
		return &fairgo.ArgError{Arg: "2D copy shape", Value: fmt.Sprintf("%d×%d", width, height), Reason: "negative"}
	case height > 1 && (dstPitch < width || srcPitch < width):
		return &fairgo.ArgError{Arg: "2D copy pitch", Value: fmt.Sprintf("dst %d, src %d", dstPitch, srcPitch), Reason: fmt.Sprintf("shorter than the width %d", width)}
	case width == 0 || height == 0:
		return nil
	case height == 1 || (dstPitch == width && srcPitch == width):
		return copyAsync(d.ctx, dst, src, width*height, cs.h)
	case dstPitch > d.maxPitch || srcPitch > d.maxPitch:
		for i := int64(0); i < height; i++ {
			if err := copyAsync(d.ctx, dst+uintptr(i*dstPitch), src+uintptr(i*srcPitch), width, cs.h); err != nil {
				return err
			}
		}
		return nil
	}
	return copy2DAsync(d.ctx, dst, dstPitch, src, srcPitch, width, height, cs.h)
}

// Upload copies host bytes to device memory and waits for the device to be
// idle (a helper for tests and examples).
func (d *Device) Upload(dst uintptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return d.do(func() error {
		if err := cu.MemcpyHtoD(cu.DevicePtr(dst), unsafe.Pointer(&src[0]), int64(len(src))); err != nil {
			return fmt.Errorf("cuda: upload: %w", err)
		}
		return cu.Synchronize()
	})
}

// Download waits for the device to be idle and copies device memory into
// dst (a helper for tests and examples).
func (d *Device) Download(dst []byte, src uintptr) error {
	if len(dst) == 0 {
		return nil
	}
	return d.do(func() error {
		if err := cu.Synchronize(); err != nil {
			return err
		}
		if err := cu.MemcpyDtoH(unsafe.Pointer(&dst[0]), cu.DevicePtr(src), int64(len(dst))); err != nil {
			return fmt.Errorf("cuda: download: %w", err)
		}
		return nil
	})
}

// Memset sets bytes of device memory to b and waits for the device to be
// idle (a helper for tests and examples).
func (d *Device) Memset(ptr uintptr, b byte, bytes int64) error {
	if bytes <= 0 {
		return nil
	}
	return d.do(func() error {
		if err := cu.MemsetD8(cu.DevicePtr(ptr), b, bytes); err != nil {
			return fmt.Errorf("cuda: memset: %w", err)
		}
		return cu.Synchronize()
	})
}

// Close waits for the device's work, destroys the streams and events made
// by it, frees what Alloc allocated and is still live, unloads the kernels
// and releases the primary context. Memory the caller owns is not touched.
func (d *Device) Close() error {
	if !d.closed.CompareAndSwap(false, true) {
		return nil
	}
	var errs []error
	errs = append(errs, ctxSync(d.ctx))
	d.mu.Lock()
	owned, allocs := d.owned, d.allocs
	d.owned, d.allocs = map[any]struct{}{}, map[uintptr]int64{}
	d.mu.Unlock()
	for o := range owned {
		switch o := o.(type) {
		case *Stream:
			errs = append(errs, o.destroy())
		case *Event:
			errs = append(errs, o.destroy())
		}
	}
	runtime.LockOSThread()
	prev, err := ctxGet()
	errs = append(errs, err)
	if err == nil {
		errs = append(errs, ctxSet(d.ctx))
		for p := range allocs {
			errs = append(errs, cu.MemFree(cu.DevicePtr(p)))
		}
		for _, b := range d.host.drain() {
			errs = append(errs, memFreeHost(d.ctx, b))
		}
		errs = append(errs, ctxSet(prev))
	}
	runtime.UnlockOSThread()
	if d.kernels != nil {
		errs = append(errs, moduleUnload(d.ctx, d.kernels.module))
	}
	d.ncclMu.Lock()
	if d.ncclLib != nil {
		errs = append(errs, d.ncclLib.Close())
		d.ncclLib = nil
	}
	d.ncclMu.Unlock()
	errs = append(errs, primaryRelease(d.dev))
	return errors.Join(errs...)
}

// nccl returns the device's reference to the NCCL library, loading it on
// first use.
func (d *Device) nccl() (*nccl.Library, error) {
	d.ncclMu.Lock()
	defer d.ncclMu.Unlock()
	if err := d.alive(); err != nil {
		return nil, err
	}
	if d.ncclLib == nil {
		lib, err := nccl.Load()
		if err != nil {
			return nil, err
		}
		d.ncclLib = lib
	}
	return d.ncclLib, nil
}

func (d *Device) track(o any) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return ErrDeviceClosed
	}
	d.owned[o] = struct{}{}
	return nil
}

func (d *Device) untrack(o any) {
	d.mu.Lock()
	delete(d.owned, o)
	d.mu.Unlock()
}

// waitCtx is the context-aware wait shared by events and streams.
func waitCtx(ctx context.Context, poll func() (bool, error)) error {
	var b backoff
	for {
		done, err := poll()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		b.wait()
	}
}
