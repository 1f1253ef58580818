package cuda

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/internal/poll"
	"github.com/fairgo/fairgo/nccl"
	"github.com/fairgo/fairgo/streams"
)

var (
	_ backend.Device    = (*Device)(nil)
	_ fairgo.HostCopier = (*Device)(nil) // fairgo.Upload and Download
)

// Device is one GPU, driven through its primary context (the context the
// CUDA runtime, and so PyTorch, uses), so buffers and streams interoperate
// with other libraries in the process. Its methods may be called from any
// goroutine: each driver call makes the primary context current on the
// calling thread for its duration. Bind is for code that calls CUDA itself
// (NCCL does) and wants the context current for longer.
//
// A Device is its context: streams, events, modules and memory of another
// context, even one of the same GPU, are another device's (CUDA does not
// let a kernel of one context touch another context's memory).
type Device struct {
	ordinal  int
	dev      cDevice
	ctx      cContext
	ownCtx   bool // ctx is a context of its own (openOwnContext), destroyed by Close; else the retained primary context
	name     string
	sms      int
	maxPitch int64
	uva      bool // page-locked host memory is addressed alike by the host and the device (DevicePointer)
	priority int  // the highest stream priority
	kernels  *kernels

	closed atomic.Bool
	mu     sync.Mutex
	owned  map[any]struct{} // streams and events made here, destroyed by Close
	allocs map[uintptr]int64

	modules map[*Module]struct{} // loaded by LoadModule, unloaded by Close

	ncclMu  sync.Mutex
	ncclLib *nccl.Library

	group  groupState
	host   hostAllocs // page-locked host memory from AllocHost
	ranges rangeCache // allocations CheckRange has seen, to skip the driver on the hot path
}

// Open loads the CUDA driver (Load) if this is its first use, retains the
// primary context of GPU ordinal, creates nothing on it but the reduce
// kernels' module, and returns the device. Close releases it. Without a
// driver or a GPU it returns a *LoadError that matches fairgo.ErrNoDevice.
func Open(ordinal int) (*Device, error) { return openDevice(ordinal, false) }

// openOwnContext is Open over a CUDA context of its own (cuCtxCreate)
// instead of the primary one: to the package, another device on the same
// GPU. Tests use it to stand for a second GPU where there is one GPU; its
// Close destroys the context.
func openOwnContext(ordinal int) (*Device, error) { return openDevice(ordinal, true) }

func openDevice(ordinal int, ownCtx bool) (*Device, error) {
	n, err := Count()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, &fairgo.ArgError{Arg: "device ordinal", Value: ordinal, Reason: fmt.Sprintf("outside [0, %d)", n)}
	}
	info, err := getDeviceInfo(ordinal)
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: %w", ordinal, err)
	}
	var ctx cContext
	if ownCtx {
		ctx, err = ctxCreate(info.dev)
	} else {
		ctx, err = primaryRetain(info.dev)
	}
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: %w", ordinal, err)
	}
	d := &Device{
		ordinal: ordinal, dev: info.dev, ctx: ctx, ownCtx: ownCtx, name: info.name, sms: info.sms, maxPitch: info.maxPitch, uva: info.uva,
		owned: map[any]struct{}{}, allocs: map[uintptr]int64{}, modules: map[*Module]struct{}{},
	}
	fail := func(err error) (*Device, error) {
		_ = d.releaseCtx()
		return nil, err
	}
	_, greatest, err := priorityRange(ctx)
	if err != nil {
		return fail(err)
	}
	d.priority = greatest
	if d.kernels, err = loadKernels(d); err != nil {
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

func (d *Device) String() string {
	if d.ownCtx {
		return fmt.Sprintf("cuda:%d (%s, a context of its own)", d.ordinal, d.name)
	}
	return fmt.Sprintf("cuda:%d (%s)", d.ordinal, d.name)
}

// releaseCtx releases the primary context, or destroys a context of its own.
func (d *Device) releaseCtx() error {
	if d.ownCtx {
		return ctxDestroy(d.ctx)
	}
	return primaryRelease(d.dev)
}

func (d *Device) alive() error {
	if d.closed.Load() {
		return ErrDeviceClosed
	}
	return nil
}

// do runs fn on a locked OS thread with the device's context current, for
// NCCL calls, which use the thread's context.
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

// Bind locks the calling goroutine to its OS thread and makes the device's
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

// Synchronize waits for all work on the device's context.
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
	if err := d.alive(); err != nil {
		return 0, err
	}
	p, err := memAlloc(d.ctx, bytes)
	if err != nil {
		return 0, fmt.Errorf("cuda: allocating %d bytes on %v: %w", bytes, d, err)
	}
	d.mu.Lock()
	d.allocs[p] = bytes
	d.mu.Unlock()
	return p, nil
}

// AllocTensor allocates a tensor of count elements.
func (d *Device) AllocTensor(count int64, dt fairgo.DType) (fairgo.Tensor, error) {
	t := fairgo.Tensor{Count: count, DType: dt, Bytes: count * int64(dt.Size())}
	t.Ptr = 256 // validated below before the real pointer is known: aligned for every element type
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
		return &fairgo.ArgError{
			Arg:    "ptr",
			Value:  fmt.Sprintf("%#x", ptr),
			Reason: fmt.Sprintf("not allocated by Alloc on %v (or already freed)", d),
		}
	}
	d.ranges.forget(ptr)
	if err := d.alive(); err != nil {
		return err
	}
	return memFree(d.ctx, ptr)
}

// WrapDevicePtr describes count elements at a caller's device pointer as a
// tensor, with no copy; fairgo never frees it.
func WrapDevicePtr(ptr uintptr, count int64, dt fairgo.DType) fairgo.Tensor {
	return fairgo.Tensor{Ptr: ptr, Bytes: count * int64(dt.Size()), Count: count, DType: dt}
}

// CheckRange returns an error wrapping fairgo.ErrInvalidArgument unless
// [ptr, ptr+bytes) lies inside one device allocation of this GPU and of the
// device's context (so host memory, another GPU's memory, memory of another
// context of this GPU, which this context's kernels and NCCL cannot reach,
// unknown addresses and buffers shorter than bytes are refused). Memory of
// no context (virtual memory management mappings) is judged by its GPU.
func (d *Device) CheckRange(ptr uintptr, bytes int64) error {
	if err := d.alive(); err != nil {
		return err
	}
	if ok, err := someBytes(bytes); !ok {
		return err
	}
	if d.ranges.covers(ptr, bytes) {
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
	if a.ctx != 0 && a.ctx != d.ctx {
		return bad(fmt.Sprintf("memory of another CUDA context of GPU %d than %v's", a.ordinal, d))
	}
	if ptr < a.start || uint64(ptr-a.start)+uint64(bytes) > uint64(a.size) {
		return bad(fmt.Sprintf("the allocation [%#x, +%d) is too short", a.start, a.size))
	}
	d.ranges.add(a.start, a.size)
	return nil
}

// rangeCache remembers the last allocations CheckRange validated (a
// trainer passes the same buckets every step). Free forgets an allocation;
// memory another allocator frees and reuses keeps its entry, which is still
// memory of this device (addresses are unique across devices), so the
// check stays a check of the device, at worst of a stale size.
type rangeCache struct {
	mu      sync.Mutex
	entries [32]struct {
		start uintptr
		size  int64
	}
	next int
}

func (c *rangeCache) covers(ptr uintptr, bytes int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if e.size > 0 && ptr >= e.start && uint64(ptr-e.start)+uint64(bytes) <= uint64(e.size) {
			return true
		}
	}
	return false
}

func (c *rangeCache) add(start uintptr, size int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries[c.next] = struct {
		start uintptr
		size  int64
	}{start, size}
	c.next = (c.next + 1) % len(c.entries)
}

// forget drops the entries of the allocation at start.
func (c *rangeCache) forget(start uintptr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.entries {
		if c.entries[i].start == start {
			c.entries[i].size = 0
		}
	}
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
	if ok, err := someBytes(bytes); !ok {
		return err
	}
	return copyAsync(d.ctx, dst, src, bytes, cs.h)
}

// someBytes checks a byte count: an error where it is negative, ok false
// (nothing to do) where it is 0.
func someBytes(bytes int64) (ok bool, err error) {
	if bytes < 0 {
		return false, &fairgo.ArgError{Arg: "bytes", Value: bytes, Reason: "negative"}
	}
	return bytes > 0, nil
}

// Copy2DAsync enqueues height rows of width bytes, from src+i·srcPitch to
// dst+i·dstPitch, as one cuMemcpy2DAsync (or one flat copy when the rows are
// contiguous, or a copy per row when a pitch exceeds the device's limit).
func (d *Device) Copy2DAsync(dst uintptr, dstPitch int64, src uintptr, srcPitch int64, width, height int64,
	s streams.Stream) error {
	cs, err := d.stream(s)
	switch {
	case err != nil:
		return err
	case width < 0 || height < 0:
		return &fairgo.ArgError{Arg: "2D copy shape", Value: fmt.Sprintf("%d×%d", width, height), Reason: "negative"}
	case height > 1 && (dstPitch < width || srcPitch < width):
		return &fairgo.ArgError{
			Arg:    "2D copy pitch",
			Value:  fmt.Sprintf("dst %d, src %d", dstPitch, srcPitch),
			Reason: fmt.Sprintf("shorter than the width %d", width),
		}
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
// idle (a helper for tests and examples; fairgo.Upload takes typed slices).
func (d *Device) Upload(dst uintptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if err := d.alive(); err != nil {
		return err
	}
	if err := uploadSync(d.ctx, dst, src); err != nil {
		return fmt.Errorf("cuda: upload to %v: %w", d, err)
	}
	return nil
}

// Download waits for the device to be idle and copies device memory into
// dst (a helper for tests and examples; fairgo.Download gives typed slices).
func (d *Device) Download(dst []byte, src uintptr) error {
	if len(dst) == 0 {
		return nil
	}
	if err := d.alive(); err != nil {
		return err
	}
	if err := downloadSync(d.ctx, dst, src); err != nil {
		return fmt.Errorf("cuda: download from %v: %w", d, err)
	}
	return nil
}

// UploadAsync enqueues on s (a stream of d) a copy of src, Go memory, to
// device memory at dst. The driver stages the bytes before it returns, so
// src may be reused at once; the call may wait for s's earlier work, and
// unlike a copy from AllocHost memory (CopyFromHostAsync) it does not
// overlap the host. Unlike Upload it does not synchronise the device.
func (d *Device) UploadAsync(dst uintptr, src []byte, s streams.Stream) error {
	cs, ok, err := d.goMemoryCopy(s, src, dst, true)
	if !ok {
		return err
	}
	if err := htodAsync(d.ctx, dst, src, cs.h); err != nil {
		return fmt.Errorf("cuda: upload on %v: %w", cs, err)
	}
	return nil
}

// DownloadAfter copies len(dst) bytes of device memory at src into dst, Go
// memory, after the work enqueued on s (a stream of d), and returns once dst
// holds them. It waits for s only, not for the whole device as Download
// does.
func (d *Device) DownloadAfter(dst []byte, src uintptr, s streams.Stream) error {
	cs, ok, err := d.goMemoryCopy(s, dst, src, false)
	if !ok {
		return err
	}
	err = errors.Join(dtohAsync(d.ctx, dst, src, cs.h), streamSync(d.ctx, cs.h))
	if err != nil {
		return fmt.Errorf("cuda: download on %v: %w", cs, err)
	}
	return nil
}

// goMemoryCopy checks a copy on s between b, Go memory, and device memory
// at addr: from b to addr where up (UploadAsync), else from addr to b
// (DownloadAfter). It returns s's *Stream, or ok false where there is
// nothing to copy (b empty) or err.
func (d *Device) goMemoryCopy(s streams.Stream, b []byte, addr uintptr, up bool) (cs *Stream, ok bool, err error) {
	host, dev, pinned := "dst", "src", "CopyToHostAsync"
	if up {
		host, dev, pinned = "src", "dst", "CopyFromHostAsync"
	}
	if cs, err = d.stream(s); err != nil {
		return nil, false, err
	}
	switch {
	case len(b) == 0:
		return nil, false, nil
	case addr == 0:
		return nil, false, &fairgo.ArgError{Arg: dev, Value: "0", Reason: "null device address"}
	case d.host.owns(b):
		reason := "page-locked memory from AllocHost: use " + pinned
		return nil, false, &fairgo.ArgError{Arg: host, Value: len(b), Reason: reason}
	}
	return cs, true, nil
}

// Close waits for the device's work, destroys the streams and events made
// by it, frees what Alloc and AllocHost allocated and is still live, unloads
// the modules (the reduce kernels' and those of LoadModule) and releases the
// primary context. Memory the caller owns is not touched.
func (d *Device) Close() error {
	if !d.closed.CompareAndSwap(false, true) {
		return nil
	}
	var errs []error
	errs = append(errs, ctxSync(d.ctx))
	d.mu.Lock()
	owned, allocs, modules := d.owned, d.allocs, d.modules
	d.owned, d.allocs, d.modules = map[any]struct{}{}, map[uintptr]int64{}, map[*Module]struct{}{}
	d.mu.Unlock()
	for o := range owned {
		if r, ok := o.(resource); ok {
			errs = append(errs, r.destroy())
		}
	}
	for p := range allocs {
		errs = append(errs, memFree(d.ctx, p))
	}
	for _, b := range d.host.drain() {
		errs = append(errs, memFreeHost(d.ctx, b))
	}
	for m := range modules {
		errs = append(errs, m.unload())
	}
	d.ncclMu.Lock()
	if d.ncclLib != nil {
		errs = append(errs, d.ncclLib.Close())
		d.ncclLib = nil
	}
	d.ncclMu.Unlock()
	errs = append(errs, d.releaseCtx())
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
func waitCtx(ctx context.Context, query func() (bool, error)) error {
	var b poll.Backoff
	for {
		done, err := query()
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
		b.Wait()
	}
}
