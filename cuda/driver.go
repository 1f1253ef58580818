//go:build cuda

package cuda

// This file holds the package's C: thin shims over the CUDA driver API for
// what gorgonia.org/cu does not offer, or offers only on the calling
// thread's current context. Each shim that needs a context takes it, makes
// it current for the duration of the one C call, and restores what was
// current, so that a goroutine need not be locked to its thread for it (a
// goroutine cannot move between threads during one cgo call).

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

#include "fg_ctx.h"

static CUresult fg_primary_retain(int ordinal, CUdevice* dev, CUcontext* ctx) {
	CUresult r = cuDeviceGet(dev, ordinal);
	if (r != CUDA_SUCCESS) return r;
	return cuDevicePrimaryCtxRetain(ctx, *dev);
}
static CUresult fg_primary_release(CUdevice dev) { return cuDevicePrimaryCtxRelease(dev); }
static CUresult fg_ctx_get(CUcontext* ctx) { return cuCtxGetCurrent(ctx); }
static CUresult fg_ctx_set(CUcontext ctx) { return cuCtxSetCurrent(ctx); }
static CUresult fg_ctx_sync(CUcontext ctx) { FG_IN_CTX(ctx, cuCtxSynchronize()) }
static CUresult fg_priority_range(CUcontext ctx, int* least, int* greatest) {
	FG_IN_CTX(ctx, cuCtxGetStreamPriorityRange(least, greatest))
}

static CUresult fg_stream_create(CUcontext ctx, CUstream* s, int priority) {
	FG_IN_CTX(ctx, cuStreamCreateWithPriority(s, CU_STREAM_NON_BLOCKING, priority))
}
static CUresult fg_stream_destroy(CUcontext ctx, CUstream s) { FG_IN_CTX(ctx, cuStreamDestroy(s)) }
static CUresult fg_stream_sync(CUcontext ctx, CUstream s) { FG_IN_CTX(ctx, cuStreamSynchronize(s)) }
static CUresult fg_stream_wait(CUcontext ctx, CUstream s, CUevent e) { FG_IN_CTX(ctx, cuStreamWaitEvent(s, e, 0)) }

static CUresult fg_event_create(CUcontext ctx, CUevent* e, unsigned flags) { FG_IN_CTX(ctx, cuEventCreate(e, flags)) }
static CUresult fg_event_destroy(CUcontext ctx, CUevent e) { FG_IN_CTX(ctx, cuEventDestroy(e)) }
static CUresult fg_event_record(CUcontext ctx, CUevent e, CUstream s) { FG_IN_CTX(ctx, cuEventRecord(e, s)) }
static CUresult fg_event_query(CUcontext ctx, CUevent e) { FG_IN_CTX(ctx, cuEventQuery(e)) }
static CUresult fg_event_sync(CUcontext ctx, CUevent e) { FG_IN_CTX(ctx, cuEventSynchronize(e)) }
static CUresult fg_event_elapsed(CUcontext ctx, float* ms, CUevent a, CUevent b) { FG_IN_CTX(ctx, cuEventElapsedTime(ms, a, b)) }

static CUresult fg_mem_alloc_host(CUcontext ctx, void** p, size_t n) { FG_IN_CTX(ctx, cuMemAllocHost(p, n)) }
static CUresult fg_mem_free_host(CUcontext ctx, void* p) { FG_IN_CTX(ctx, cuMemFreeHost(p)) }
static CUresult fg_pinned_htod(CUcontext ctx, uintptr_t dst, void* src, size_t n, CUstream s) {
	FG_IN_CTX(ctx, cuMemcpyHtoDAsync((CUdeviceptr)dst, src, n, s))
}
static CUresult fg_pinned_dtoh(CUcontext ctx, void* dst, uintptr_t src, size_t n, CUstream s) {
	FG_IN_CTX(ctx, cuMemcpyDtoHAsync(dst, (CUdeviceptr)src, n, s))
}
static CUresult fg_copy_async(CUcontext ctx, uintptr_t dst, uintptr_t src, size_t n, CUstream s) {
	FG_IN_CTX(ctx, cuMemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src, n, s))
}
static CUresult fg_copy2d_async(CUcontext ctx, uintptr_t dst, size_t dpitch, uintptr_t src, size_t spitch,
                                size_t width, size_t height, CUstream s) {
	CUDA_MEMCPY2D p;
	memset(&p, 0, sizeof p);
	p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
	p.srcDevice = (CUdeviceptr)src;
	p.srcPitch = spitch;
	p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	p.dstDevice = (CUdeviceptr)dst;
	p.dstPitch = dpitch;
	p.WidthInBytes = width;
	p.Height = height;
	FG_IN_CTX(ctx, cuMemcpy2DAsync(&p, s))
}

static CUresult fg_pointer_attrs(CUcontext ctx, uintptr_t ptr, unsigned* memtype, int* ordinal,
                                 uintptr_t* start, size_t* size) {
	CUpointer_attribute attrs[4] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
	                                CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
	CUdeviceptr st = 0;
	*memtype = 0; *ordinal = -1; *size = 0;
	void* data[4] = {memtype, ordinal, &st, size};
	CUresult r;
	{
		CUcontext prev = NULL;
		r = cuCtxGetCurrent(&prev);
		if (r != CUDA_SUCCESS) return r;
		if (prev != ctx && (r = cuCtxSetCurrent(ctx)) != CUDA_SUCCESS) return r;
		r = cuPointerGetAttributes(4, attrs, data, (CUdeviceptr)ptr);
		if (prev != ctx) cuCtxSetCurrent(prev);
	}
	*start = (uintptr_t)st;
	return r;
}

static CUresult fg_module_load(CUcontext ctx, CUmodule* m, const void* image, char* log, unsigned logsize) {
	CUjit_option opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void* vals[2] = {log, (void*)(uintptr_t)logsize};
	FG_IN_CTX(ctx, cuModuleLoadDataEx(m, image, 2, opts, vals))
}
static CUresult fg_module_unload(CUcontext ctx, CUmodule m) { FG_IN_CTX(ctx, cuModuleUnload(m)) }
static CUresult fg_module_function(CUcontext ctx, CUfunction* f, CUmodule m, const char* name) {
	FG_IN_CTX(ctx, cuModuleGetFunction(f, m, name))
}

static CUresult fg_launch_reduce(CUcontext ctx, CUfunction f, unsigned grid, unsigned block, CUstream s,
                                 uintptr_t dst, uintptr_t src, long long n, long long stride, long long count,
                                 long long divisor) {
	void* args[6] = {&dst, &src, &n, &stride, &count, &divisor};
	FG_IN_CTX(ctx, cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, s, args, NULL))
}
static CUresult fg_launch_fill(CUcontext ctx, CUfunction f, unsigned grid, unsigned block, CUstream s,
                               uintptr_t dst, long long count, double offset, double scale, long long modulus) {
	void* args[5] = {&dst, &count, &offset, &scale, &modulus};
	FG_IN_CTX(ctx, cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, s, args, NULL))
}
static CUresult fg_launch_delay(CUcontext ctx, CUfunction f, CUstream s, unsigned long long ns) {
	void* args[1] = {&ns};
	FG_IN_CTX(ctx, cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, NULL))
}

static CUstream fg_stream_from(uintptr_t h) { return (CUstream)h; }

static const char* fg_error_name(CUresult r) {
	const char* s = NULL;
	if (cuGetErrorName(r, &s) != CUDA_SUCCESS) return NULL;
	return s;
}
static const char* fg_error_string(CUresult r) {
	const char* s = NULL;
	if (cuGetErrorString(r, &s) != CUDA_SUCCESS) return NULL;
	return s;
}
*/
import "C"

import (
	"time"
	"unsafe"
)

// CUDA result codes the package tests for.
const (
	cudaSuccess      = 0
	cudaNotReady     = 600 // CUDA_ERROR_NOT_READY
	memoryTypeDevice = 2   // CU_MEMORYTYPE_DEVICE
)

type (
	cContext  = C.CUcontext
	cDevice   = C.CUdevice
	cStream   = C.CUstream
	cEvent    = C.CUevent
	cModule   = C.CUmodule
	cFunction = C.CUfunction
)

func check(op string, r C.CUresult) error {
	if r == cudaSuccess {
		return nil
	}
	return newError(op, int(r))
}

func errorName(code int) (name, text string) {
	if p := C.fg_error_name(C.CUresult(code)); p != nil {
		name = C.GoString(p)
	}
	if p := C.fg_error_string(C.CUresult(code)); p != nil {
		text = C.GoString(p)
	}
	return name, text
}

func cStreamFromHandle(h uintptr) cStream { return C.fg_stream_from(C.uintptr_t(h)) }

func handleOfStream(s cStream) uintptr { return uintptr(unsafe.Pointer(s)) }

func primaryRetain(ordinal int) (cDevice, cContext, error) {
	var dev C.CUdevice
	var ctx C.CUcontext
	err := check("cuDevicePrimaryCtxRetain", C.fg_primary_retain(C.int(ordinal), &dev, &ctx))
	return dev, ctx, err
}

func primaryRelease(dev cDevice) error {
	return check("cuDevicePrimaryCtxRelease", C.fg_primary_release(dev))
}

func ctxGet() (cContext, error) {
	var c C.CUcontext
	err := check("cuCtxGetCurrent", C.fg_ctx_get(&c))
	return c, err
}

func ctxSet(c cContext) error { return check("cuCtxSetCurrent", C.fg_ctx_set(c)) }

func ctxSync(c cContext) error { return check("cuCtxSynchronize", C.fg_ctx_sync(c)) }

func priorityRange(c cContext) (least, greatest int, err error) {
	var l, g C.int
	err = check("cuCtxGetStreamPriorityRange", C.fg_priority_range(c, &l, &g))
	return int(l), int(g), err
}

func streamCreate(c cContext, priority int) (cStream, error) {
	var s C.CUstream
	err := check("cuStreamCreateWithPriority", C.fg_stream_create(c, &s, C.int(priority)))
	return s, err
}

func streamDestroy(c cContext, s cStream) error {
	return check("cuStreamDestroy", C.fg_stream_destroy(c, s))
}

func streamSync(c cContext, s cStream) error {
	return check("cuStreamSynchronize", C.fg_stream_sync(c, s))
}

func streamWait(c cContext, s cStream, e cEvent) error {
	return check("cuStreamWaitEvent", C.fg_stream_wait(c, s, e))
}

func eventCreate(c cContext, timing bool) (cEvent, error) {
	var e C.CUevent
	flags := C.uint(C.CU_EVENT_DISABLE_TIMING)
	if timing {
		flags = C.CU_EVENT_DEFAULT
	}
	err := check("cuEventCreate", C.fg_event_create(c, &e, flags))
	return e, err
}

func eventDestroy(c cContext, e cEvent) error {
	return check("cuEventDestroy", C.fg_event_destroy(c, e))
}

func eventRecord(c cContext, e cEvent, s cStream) error {
	return check("cuEventRecord", C.fg_event_record(c, e, s))
}

// eventQuery returns the raw result: cudaSuccess, cudaNotReady or an error.
func eventQuery(c cContext, e cEvent) int { return int(C.fg_event_query(c, e)) }

func eventSync(c cContext, e cEvent) error { return check("cuEventSynchronize", C.fg_event_sync(c, e)) }

func eventElapsed(c cContext, start, end cEvent) (time.Duration, error) {
	var ms C.float
	if err := check("cuEventElapsedTime", C.fg_event_elapsed(c, &ms, start, end)); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// memAllocHost allocates n bytes of page-locked host memory.
func memAllocHost(c cContext, n int) ([]byte, error) {
	var p unsafe.Pointer
	if err := check("cuMemAllocHost", C.fg_mem_alloc_host(c, &p, C.size_t(n))); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), n), nil
}

func memFreeHost(c cContext, b []byte) error {
	return check("cuMemFreeHost", C.fg_mem_free_host(c, unsafe.Pointer(unsafe.SliceData(b))))
}

// pinnedToDeviceAsync and pinnedToHostAsync copy between page-locked host memory (memAllocHost)
// and the device on s; the host bytes are C memory, so cgo's pointer rules
// are kept.
func pinnedToDeviceAsync(c cContext, dst uintptr, src []byte, s cStream) error {
	return check("cuMemcpyHtoDAsync", C.fg_pinned_htod(c, C.uintptr_t(dst), unsafe.Pointer(unsafe.SliceData(src)), C.size_t(len(src)), s))
}

func pinnedToHostAsync(c cContext, dst []byte, src uintptr, s cStream) error {
	return check("cuMemcpyDtoHAsync", C.fg_pinned_dtoh(c, unsafe.Pointer(unsafe.SliceData(dst)), C.uintptr_t(src), C.size_t(len(dst)), s))
}

func copyAsync(c cContext, dst, src uintptr, n int64, s cStream) error {
	return check("cuMemcpyDtoDAsync", C.fg_copy_async(c, C.uintptr_t(dst), C.uintptr_t(src), C.size_t(n), s))
}

func copy2DAsync(c cContext, dst uintptr, dpitch int64, src uintptr, spitch int64, width, height int64, s cStream) error {
	return check("cuMemcpy2DAsync", C.fg_copy2d_async(c, C.uintptr_t(dst), C.size_t(dpitch), C.uintptr_t(src),
		C.size_t(spitch), C.size_t(width), C.size_t(height), s))
}

type ptrAttrs struct {
	memType uint
	ordinal int
	start   uintptr
	size    int64
}

func pointerAttrs(c cContext, ptr uintptr) (ptrAttrs, error) {
	var mt C.uint
	var ord C.int
	var start C.uintptr_t
	var size C.size_t
	err := check("cuPointerGetAttributes", C.fg_pointer_attrs(c, C.uintptr_t(ptr), &mt, &ord, &start, &size))
	return ptrAttrs{memType: uint(mt), ordinal: int(ord), start: uintptr(start), size: int64(size)}, err
}

func moduleLoad(c cContext, image string) (cModule, string, error) {
	var m C.CUmodule
	img := C.CString(image)
	defer C.free(unsafe.Pointer(img))
	const logSize = 16 << 10
	log := (*C.char)(C.calloc(logSize, 1))
	defer C.free(unsafe.Pointer(log))
	err := check("cuModuleLoadDataEx", C.fg_module_load(c, &m, unsafe.Pointer(img), log, logSize))
	return m, C.GoString(log), err
}

func moduleUnload(c cContext, m cModule) error {
	return check("cuModuleUnload", C.fg_module_unload(c, m))
}

func moduleFunction(c cContext, m cModule, name string) (cFunction, error) {
	var f C.CUfunction
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	err := check("cuModuleGetFunction("+name+")", C.fg_module_function(c, &f, m, n))
	return f, err
}

func launchReduce(c cContext, f cFunction, grid, block int, s cStream, dst, src uintptr, n, stride, count, divisor int64) error {
	return check("cuLaunchKernel(reduce)", C.fg_launch_reduce(c, f, C.uint(grid), C.uint(block), s,
		C.uintptr_t(dst), C.uintptr_t(src), C.longlong(n), C.longlong(stride), C.longlong(count), C.longlong(divisor)))
}

func launchFill(c cContext, f cFunction, grid, block int, s cStream, dst uintptr, count int64, offset, scale float64, modulus int64) error {
	return check("cuLaunchKernel(fill)", C.fg_launch_fill(c, f, C.uint(grid), C.uint(block), s,
		C.uintptr_t(dst), C.longlong(count), C.double(offset), C.double(scale), C.longlong(modulus)))
}

func launchDelay(c cContext, f cFunction, s cStream, ns uint64) error {
	return check("cuLaunchKernel(delay)", C.fg_launch_delay(c, f, s, C.ulonglong(ns)))
}
