package cuda

// This file holds the package's C code: dlopen and dlsym of the CUDA
// driver (through the helpers of internal/dl/fg_dl.h, shared with package
// nccl), the table of its resolved functions (fg_cuda.h lists them), and
// one small shim per use. Each shim that needs a context takes it, makes it
// current for the duration of the one C call, and restores what was
// current, so that a goroutine need not be locked to its thread for it (a
// goroutine cannot move between threads during one cgo call). Device
// pointers and stream handles cross as uintptr_t.

/*
#cgo CFLAGS: -I${SRCDIR}/../internal/dl
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fg_cuda.h"
#include "fg_dl.h"

#define FG_CU_NAME(id, sym, plain, ret, params) #sym,
static const char* fg_cu_names[FG_CU_NSYM] = {FG_CU_SYMBOLS(FG_CU_NAME)};
#undef FG_CU_NAME

static int fg_cu_nsym(void) { return FG_CU_NSYM; }
static const char* fg_cu_name(int i) { return fg_cu_names[i]; }

// The driver's functions, copied in once by fg_cu_commit when the driver
// has loaded and initialised; read-only afterwards.
static void* fg_cu[FG_CU_NSYM];
static void fg_cu_commit(void** t) { memcpy(fg_cu, t, sizeof fg_cu); }

#define FG(id) ((fg_pfn_##id)fg_cu[FG_CU_##id])
#define FGT(t, id) ((fg_pfn_##id)(t)[FG_CU_##id])

// Load-time calls, through a table not yet committed.
static fg_CUresult fg_t_init(void** t) { return FGT(t, Init)(0); }
static fg_CUresult fg_t_version(void** t, int* v) { return FGT(t, DriverGetVersion)(v); }
static const char* fg_t_error_name(void** t, fg_CUresult r) {
	const char* s = NULL;
	if (FGT(t, GetErrorName)(r, &s) != FG_CUDA_SUCCESS) return NULL;
	return s;
}
static const char* fg_t_error_string(void** t, fg_CUresult r) {
	const char* s = NULL;
	if (FGT(t, GetErrorString)(r, &s) != FG_CUDA_SUCCESS) return NULL;
	return s;
}

// FG_IN_CTX makes ctx current for one driver call, returns the call's
// result, and restores the previous context.
#define FG_IN_CTX(ctx, call)                                   \
	fg_CUcontext fg_prev = NULL;                               \
	fg_CUresult fg_r = FG(CtxGetCurrent)(&fg_prev);            \
	if (fg_r != FG_CUDA_SUCCESS) return fg_r;                  \
	if (fg_prev != (ctx)) {                                    \
		fg_r = FG(CtxSetCurrent)(ctx);                         \
		if (fg_r != FG_CUDA_SUCCESS) return fg_r;              \
	}                                                          \
	fg_r = (call);                                             \
	if (fg_prev != (ctx)) FG(CtxSetCurrent)(fg_prev);          \
	return fg_r;

static fg_CUresult fg_device_count(int* n) { return FG(DeviceGetCount)(n); }
static fg_CUresult fg_device_info(int ordinal, fg_CUdevice* dev, char* name, int len, int* sms, int* pitch, int* uva) {
	fg_CUresult r = FG(DeviceGet)(dev, ordinal);
	if (r == FG_CUDA_SUCCESS) r = FG(DeviceGetName)(name, len, *dev);
	if (r == FG_CUDA_SUCCESS) r = FG(DeviceGetAttribute)(sms, FG_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, *dev);
	if (r == FG_CUDA_SUCCESS) r = FG(DeviceGetAttribute)(pitch, FG_CU_DEVICE_ATTRIBUTE_MAX_PITCH, *dev);
	if (r == FG_CUDA_SUCCESS) r = FG(DeviceGetAttribute)(uva, FG_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, *dev);
	return r;
}
static fg_CUresult fg_primary_retain(fg_CUdevice dev, fg_CUcontext* ctx) {
	return FG(DevicePrimaryCtxRetain)(ctx, dev);
}
static fg_CUresult fg_primary_release(fg_CUdevice dev) { return FG(DevicePrimaryCtxRelease)(dev); }
static fg_CUresult fg_ctx_get(fg_CUcontext* ctx) { return FG(CtxGetCurrent)(ctx); }
static fg_CUresult fg_ctx_set(fg_CUcontext ctx) { return FG(CtxSetCurrent)(ctx); }
static fg_CUresult fg_ctx_sync(fg_CUcontext ctx) { FG_IN_CTX(ctx, FG(CtxSynchronize)()) }
// A context of its own on dev, not the primary one. cuCtxCreate makes it
// current on the calling thread; it is popped again in the same call, which
// makes the thread's previous context current again.
static fg_CUresult fg_ctx_create(fg_CUdevice dev, fg_CUcontext* ctx) {
	*ctx = NULL;
	fg_CUcontext made = NULL, popped = NULL;
	fg_CUresult r = FG(CtxCreate)(&made, 0, dev);
	if (r != FG_CUDA_SUCCESS) return r;
	r = FG(CtxPopCurrent)(&popped);
	if (r != FG_CUDA_SUCCESS) {
		FG(CtxDestroy)(made);
		return r;
	}
	*ctx = made;
	return r;
}
static fg_CUresult fg_ctx_destroy(fg_CUcontext ctx) { return FG(CtxDestroy)(ctx); }
static fg_CUresult fg_priority_range(fg_CUcontext ctx, int* least, int* greatest) {
	FG_IN_CTX(ctx, FG(CtxGetStreamPriorityRange)(least, greatest))
}

static fg_CUresult fg_stream_create(fg_CUcontext ctx, fg_CUstream* s, int priority) {
	FG_IN_CTX(ctx, FG(StreamCreateWithPriority)(s, FG_CU_STREAM_NON_BLOCKING, priority))
}
static fg_CUresult fg_stream_destroy(fg_CUcontext ctx, fg_CUstream s) { FG_IN_CTX(ctx, FG(StreamDestroy)(s)) }
static fg_CUresult fg_stream_sync(fg_CUcontext ctx, fg_CUstream s) { FG_IN_CTX(ctx, FG(StreamSynchronize)(s)) }
static fg_CUresult fg_stream_wait(fg_CUcontext ctx, fg_CUstream s, fg_CUevent e) {
	FG_IN_CTX(ctx, FG(StreamWaitEvent)(s, e, 0))
}
// The context of stream s, with ctx current (so that the special handles
// NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD name ctx's own default streams).
static fg_CUresult fg_stream_ctx(fg_CUcontext ctx, fg_CUstream s, fg_CUcontext* out) {
	FG_IN_CTX(ctx, FG(StreamGetCtx)(s, out))
}

static fg_CUresult fg_event_create(fg_CUcontext ctx, fg_CUevent* e, unsigned flags) {
	FG_IN_CTX(ctx, FG(EventCreate)(e, flags))
}
static fg_CUresult fg_event_destroy(fg_CUcontext ctx, fg_CUevent e) { FG_IN_CTX(ctx, FG(EventDestroy)(e)) }
static fg_CUresult fg_event_record(fg_CUcontext ctx, fg_CUevent e, fg_CUstream s) {
	FG_IN_CTX(ctx, FG(EventRecord)(e, s))
}
static fg_CUresult fg_event_query(fg_CUcontext ctx, fg_CUevent e) { FG_IN_CTX(ctx, FG(EventQuery)(e)) }
static fg_CUresult fg_event_sync(fg_CUcontext ctx, fg_CUevent e) { FG_IN_CTX(ctx, FG(EventSynchronize)(e)) }
static fg_CUresult fg_event_elapsed(fg_CUcontext ctx, float* ms, fg_CUevent a, fg_CUevent b) {
	FG_IN_CTX(ctx, FG(EventElapsedTime)(ms, a, b))
}

static fg_CUresult fg_mem_alloc_raw(uintptr_t* p, size_t n) {
	fg_CUdeviceptr d = 0;
	fg_CUresult r = FG(MemAlloc)(&d, n);
	*p = (uintptr_t)d;
	return r;
}
static fg_CUresult fg_mem_alloc(fg_CUcontext ctx, uintptr_t* p, size_t n) { FG_IN_CTX(ctx, fg_mem_alloc_raw(p, n)) }
static fg_CUresult fg_mem_free(fg_CUcontext ctx, uintptr_t p) { FG_IN_CTX(ctx, FG(MemFree)((fg_CUdeviceptr)p)) }
static fg_CUresult fg_mem_alloc_host(fg_CUcontext ctx, void** p, size_t n) { FG_IN_CTX(ctx, FG(MemAllocHost)(p, n)) }
static fg_CUresult fg_mem_free_host(fg_CUcontext ctx, void* p) { FG_IN_CTX(ctx, FG(MemFreeHost)(p)) }
static fg_CUresult fg_mem_info(fg_CUcontext ctx, size_t* free_bytes, size_t* total_bytes) {
	FG_IN_CTX(ctx, FG(MemGetInfo)(free_bytes, total_bytes))
}

// Synchronous copies and memset: each waits for the whole context afterwards.
static fg_CUresult fg_htod_sync_raw(uintptr_t dst, const void* src, size_t n) {
	fg_CUresult r = FG(MemcpyHtoD)((fg_CUdeviceptr)dst, src, n);
	return r != FG_CUDA_SUCCESS ? r : FG(CtxSynchronize)();
}
static fg_CUresult fg_htod_sync(fg_CUcontext ctx, uintptr_t dst, const void* src, size_t n) {
	FG_IN_CTX(ctx, fg_htod_sync_raw(dst, src, n))
}
static fg_CUresult fg_dtoh_sync_raw(void* dst, uintptr_t src, size_t n) {
	fg_CUresult r = FG(CtxSynchronize)();
	return r != FG_CUDA_SUCCESS ? r : FG(MemcpyDtoH)(dst, (fg_CUdeviceptr)src, n);
}
static fg_CUresult fg_dtoh_sync(fg_CUcontext ctx, void* dst, uintptr_t src, size_t n) {
	FG_IN_CTX(ctx, fg_dtoh_sync_raw(dst, src, n))
}
static fg_CUresult fg_memset_sync_raw(uintptr_t dst, unsigned char b, size_t n) {
	fg_CUresult r = FG(MemsetD8)((fg_CUdeviceptr)dst, b, n);
	return r != FG_CUDA_SUCCESS ? r : FG(CtxSynchronize)();
}
static fg_CUresult fg_memset_sync(fg_CUcontext ctx, uintptr_t dst, unsigned char b, size_t n) {
	FG_IN_CTX(ctx, fg_memset_sync_raw(dst, b, n))
}

// Copies ordered on a stream.
static fg_CUresult fg_htod_async(fg_CUcontext ctx, uintptr_t dst, const void* src, size_t n, uintptr_t s) {
	FG_IN_CTX(ctx, FG(MemcpyHtoDAsync)((fg_CUdeviceptr)dst, src, n, (fg_CUstream)s))
}
static fg_CUresult fg_dtoh_async(fg_CUcontext ctx, void* dst, uintptr_t src, size_t n, uintptr_t s) {
	FG_IN_CTX(ctx, FG(MemcpyDtoHAsync)(dst, (fg_CUdeviceptr)src, n, (fg_CUstream)s))
}
static fg_CUresult fg_dtod_async(fg_CUcontext ctx, uintptr_t dst, uintptr_t src, size_t n, uintptr_t s) {
	FG_IN_CTX(ctx, FG(MemcpyDtoDAsync)((fg_CUdeviceptr)dst, (fg_CUdeviceptr)src, n, (fg_CUstream)s))
}
static fg_CUresult fg_copy2d_async(fg_CUcontext ctx, uintptr_t dst, size_t dpitch, uintptr_t src, size_t spitch,
                                   size_t width, size_t height, uintptr_t s) {
	struct fg_memcpy2d p;
	memset(&p, 0, sizeof p);
	p.srcMemoryType = FG_CU_MEMORYTYPE_DEVICE;
	p.srcDevice = (fg_CUdeviceptr)src;
	p.srcPitch = spitch;
	p.dstMemoryType = FG_CU_MEMORYTYPE_DEVICE;
	p.dstDevice = (fg_CUdeviceptr)dst;
	p.dstPitch = dpitch;
	p.WidthInBytes = width;
	p.Height = height;
	FG_IN_CTX(ctx, FG(Memcpy2DAsync)(&p, (fg_CUstream)s))
}

// The context attribute is NULL for memory that belongs to no context
// (virtual memory management mappings).
static fg_CUresult fg_pointer_attrs_raw(uintptr_t ptr, unsigned* memtype, int* ordinal, uintptr_t* start,
                                        size_t* size, fg_CUcontext* owner) {
	fg_CUpointer_attribute attrs[5] = {FG_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, FG_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
	                                   FG_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, FG_CU_POINTER_ATTRIBUTE_RANGE_SIZE,
	                                   FG_CU_POINTER_ATTRIBUTE_CONTEXT};
	fg_CUdeviceptr st = 0;
	*memtype = 0;
	*ordinal = -1;
	*size = 0;
	*owner = NULL;
	void* data[5] = {memtype, ordinal, &st, size, owner};
	fg_CUresult r = FG(PointerGetAttributes)(5, attrs, data, (fg_CUdeviceptr)ptr);
	*start = (uintptr_t)st;
	return r;
}
static fg_CUresult fg_pointer_attrs(fg_CUcontext ctx, uintptr_t ptr, unsigned* memtype, int* ordinal,
                                    uintptr_t* start, size_t* size, fg_CUcontext* owner) {
	FG_IN_CTX(ctx, fg_pointer_attrs_raw(ptr, memtype, ordinal, start, size, owner))
}

static fg_CUresult fg_module_load_raw(fg_CUmodule* m, const void* image, char* log, unsigned logsize) {
	fg_CUjit_option opts[2] = {FG_CU_JIT_ERROR_LOG_BUFFER, FG_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void* vals[2] = {log, (void*)(uintptr_t)logsize};
	return FG(ModuleLoadDataEx)(m, image, 2, opts, vals);
}
static fg_CUresult fg_module_load(fg_CUcontext ctx, fg_CUmodule* m, const void* image, char* log, unsigned logsize) {
	FG_IN_CTX(ctx, fg_module_load_raw(m, image, log, logsize))
}
static fg_CUresult fg_module_unload(fg_CUcontext ctx, fg_CUmodule m) { FG_IN_CTX(ctx, FG(ModuleUnload)(m)) }
static fg_CUresult fg_module_function(fg_CUcontext ctx, fg_CUfunction* f, fg_CUmodule m, const char* name) {
	FG_IN_CTX(ctx, FG(ModuleGetFunction)(f, m, name))
}
static fg_CUresult fg_module_global_raw(uintptr_t* p, size_t* n, fg_CUmodule m, const char* name) {
	fg_CUdeviceptr d = 0;
	fg_CUresult r = FG(ModuleGetGlobal)(&d, n, m, name);
	*p = (uintptr_t)d;
	return r;
}
static fg_CUresult fg_module_global(fg_CUcontext ctx, uintptr_t* p, size_t* n, fg_CUmodule m, const char* name) {
	FG_IN_CTX(ctx, fg_module_global_raw(p, n, m, name))
}

// Kernel launches. Each parameter is passed in an 8-byte slot: the driver
// reads as many bytes from a slot as the kernel's parameter has (4 for an
// int or a float), which on a little-endian host are the value's.
#define FG_MAX_ARGS 64
static fg_CUresult fg_launch_raw(fg_CUfunction f, const unsigned* dims, unsigned shared, uintptr_t s, int n,
                                 const uint64_t* vals) {
	uint64_t slots[FG_MAX_ARGS];
	void* args[FG_MAX_ARGS];
	if (n < 0 || n > FG_MAX_ARGS) return FG_CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < n; i++) {
		slots[i] = vals[i];
		args[i] = &slots[i];
	}
	return FG(LaunchKernel)(f, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], shared, (fg_CUstream)s,
	                        n ? args : NULL, NULL);
}
static fg_CUresult fg_launch(fg_CUcontext ctx, fg_CUfunction f, const unsigned* dims, unsigned shared, uintptr_t s,
                             int n, const uint64_t* vals) {
	FG_IN_CTX(ctx, fg_launch_raw(f, dims, shared, s, n, vals))
}

static fg_CUstream fg_stream_from(uintptr_t h) { return (fg_CUstream)h; }

static const char* fg_error_name(fg_CUresult r) { return fg_t_error_name(fg_cu, r); }
static const char* fg_error_string(fg_CUresult r) { return fg_t_error_string(fg_cu, r); }
*/
import "C"

import (
	"time"
	"unsafe"

	_ "github.com/fairgo/fairgo/internal/dl" // the header the preamble includes, for go mod vendor
)

// CUDA result codes and constants the Go side tests for.
const (
	cudaSuccess      = C.FG_CUDA_SUCCESS
	cudaInvalidValue = C.FG_CUDA_ERROR_INVALID_VALUE
	cudaStubLibrary  = C.FG_CUDA_ERROR_STUB_LIBRARY
	cudaNoDevice     = C.FG_CUDA_ERROR_NO_DEVICE
	cudaNotReady     = C.FG_CUDA_ERROR_NOT_READY
	memoryTypeDevice = C.FG_CU_MEMORYTYPE_DEVICE
	maxKernelArgs    = C.FG_MAX_ARGS
)

type (
	cContext  = C.fg_CUcontext
	cDevice   = C.fg_CUdevice
	cStream   = C.fg_CUstream
	cEvent    = C.fg_CUevent
	cModule   = C.fg_CUmodule
	cFunction = C.fg_CUfunction
)

// sym indexes the driver's function table (the order of FG_CU_SYMBOLS).
type sym int

func numSyms() int { return int(C.fg_cu_nsym()) }

func symName(s sym) string { return C.GoString(C.fg_cu_name(C.int(s))) }

const errBufLen = 1024

// table is a C array of the resolved driver functions, one per sym.
type table = *unsafe.Pointer

// dlopen opens the library at path, or returns the loader's text.
func dlopen(path string) (unsafe.Pointer, string) {
	var buf [errBufLen]C.char
	if h := C.fg_dlopen(path, &buf[0], errBufLen); h != nil {
		return h, ""
	}
	return nil, C.GoString(&buf[0])
}

func dlclose(h unsafe.Pointer) { C.fg_dlclose(h) }

// resolve looks up every function of the table; it returns the table (C
// memory: freeTable) and the first missing symbol with the loader's text.
func resolve(h unsafe.Pointer) (t table, missing, text string) {
	n := numSyms()
	t = (table)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(unsafe.Pointer(nil)))))
	slots := unsafe.Slice(t, n)
	for i := range n {
		var buf [errBufLen]C.char
		p := C.fg_dl_sym(h, C.fg_cu_name(C.int(i)), &buf[0], errBufLen)
		if p == nil {
			return t, symName(sym(i)), C.GoString(&buf[0])
		}
		slots[i] = p
	}
	return t, "", ""
}

func freeTable(t table) { C.free(unsafe.Pointer(t)) }

// origin is the file the table's functions were loaded from, or "".
func origin(t table) string {
	var buf [4096]C.char
	if C.fg_origin(*t, &buf[0], C.size_t(len(buf))) != 0 {
		return ""
	}
	return C.GoString(&buf[0])
}

func tableInit(t table) int { return int(C.fg_t_init(t)) }

func tableVersion(t table) (int, int) {
	var v C.int
	r := C.fg_t_version(t, &v)
	return int(v), int(r)
}

func tableErrorName(t table, code int) (name, text string) {
	if p := C.fg_t_error_name(t, C.fg_CUresult(code)); p != nil {
		name = C.GoString(p)
	}
	if p := C.fg_t_error_string(t, C.fg_CUresult(code)); p != nil {
		text = C.GoString(p)
	}
	return name, text
}

// commit makes t the table every other call of this file uses.
func commit(t table) { C.fg_cu_commit(t) }

// errorName is cuGetErrorName and cuGetErrorString through the committed
// table.
func errorName(code int) (name, text string) {
	if p := C.fg_error_name(C.fg_CUresult(code)); p != nil {
		name = C.GoString(p)
	}
	if p := C.fg_error_string(C.fg_CUresult(code)); p != nil {
		text = C.GoString(p)
	}
	return name, text
}

func check(op string, r C.fg_CUresult) error {
	if r == cudaSuccess {
		return nil
	}
	return newError(op, int(r))
}

func deviceCount() (int, error) {
	var n C.int
	err := check("cuDeviceGetCount", C.fg_device_count(&n))
	return int(n), err
}

type deviceInfo struct {
	dev      cDevice
	name     string
	sms      int
	maxPitch int64
	uva      bool // unified addressing: page-locked host memory has one address on the host and the device
}

func getDeviceInfo(ordinal int) (deviceInfo, error) {
	var dev C.fg_CUdevice
	var name [256]C.char
	var sms, pitch, uva C.int
	err := check(
		"cuDeviceGet/cuDeviceGetName/cuDeviceGetAttribute",
		C.fg_device_info(C.int(ordinal), &dev, &name[0], C.int(len(name)), &sms, &pitch, &uva),
	)
	return deviceInfo{dev: dev, name: C.GoString(&name[0]), sms: int(sms), maxPitch: int64(pitch), uva: uva != 0}, err
}

func primaryRetain(dev cDevice) (cContext, error) {
	var ctx C.fg_CUcontext
	err := check("cuDevicePrimaryCtxRetain", C.fg_primary_retain(dev, &ctx))
	return ctx, err
}

func primaryRelease(dev cDevice) error {
	return check("cuDevicePrimaryCtxRelease", C.fg_primary_release(dev))
}

func ctxGet() (cContext, error) {
	var c C.fg_CUcontext
	err := check("cuCtxGetCurrent", C.fg_ctx_get(&c))
	return c, err
}

func ctxSet(c cContext) error { return check("cuCtxSetCurrent", C.fg_ctx_set(c)) }

func ctxSync(c cContext) error { return check("cuCtxSynchronize", C.fg_ctx_sync(c)) }

// ctxCreate makes a context of its own on dev (cuCtxCreate), current on no
// thread; ctxDestroy destroys it.
func ctxCreate(dev cDevice) (cContext, error) {
	var c C.fg_CUcontext
	err := check("cuCtxCreate", C.fg_ctx_create(dev, &c))
	return c, err
}

func ctxDestroy(c cContext) error { return check("cuCtxDestroy", C.fg_ctx_destroy(c)) }

func priorityRange(c cContext) (least, greatest int, err error) {
	var l, g C.int
	err = check("cuCtxGetStreamPriorityRange", C.fg_priority_range(c, &l, &g))
	return int(l), int(g), err
}

func cStreamFromHandle(h uintptr) cStream { return C.fg_stream_from(C.uintptr_t(h)) }

func handleOfStream(s cStream) uintptr { return uintptr(unsafe.Pointer(s)) }

func streamCreate(c cContext, priority int) (cStream, error) {
	var s C.fg_CUstream
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

// streamCtx is the context stream s belongs to, asked with c current.
func streamCtx(c cContext, s cStream) (cContext, error) {
	var out C.fg_CUcontext
	err := check("cuStreamGetCtx", C.fg_stream_ctx(c, s, &out))
	return out, err
}

func eventCreate(c cContext, timing bool) (cEvent, error) {
	var e C.fg_CUevent
	flags := C.uint(C.FG_CU_EVENT_DISABLE_TIMING)
	if timing {
		flags = C.FG_CU_EVENT_DEFAULT
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

func memAlloc(c cContext, n int64) (uintptr, error) {
	var p C.uintptr_t
	err := check("cuMemAlloc", C.fg_mem_alloc(c, &p, C.size_t(n)))
	return uintptr(p), err
}

func memFree(c cContext, p uintptr) error {
	return check("cuMemFree", C.fg_mem_free(c, C.uintptr_t(p)))
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

func memInfo(c cContext) (free, total int64, err error) {
	var f, t C.size_t
	err = check("cuMemGetInfo", C.fg_mem_info(c, &f, &t))
	return int64(f), int64(t), err
}

// uploadSync, downloadSync and memsetSync move bytes between Go memory and
// the device and wait for the whole context (download: before, upload and
// memset: after). The driver is done with the Go memory when they return.
func uploadSync(c cContext, dst uintptr, src []byte) error {
	return check(
		"cuMemcpyHtoD",
		C.fg_htod_sync(c, C.uintptr_t(dst), unsafe.Pointer(unsafe.SliceData(src)), C.size_t(len(src))),
	)
}

func downloadSync(c cContext, dst []byte, src uintptr) error {
	return check(
		"cuMemcpyDtoH",
		C.fg_dtoh_sync(c, unsafe.Pointer(unsafe.SliceData(dst)), C.uintptr_t(src), C.size_t(len(dst))),
	)
}

func memsetSync(c cContext, dst uintptr, b byte, n int64) error {
	return check("cuMemsetD8", C.fg_memset_sync(c, C.uintptr_t(dst), C.uchar(b), C.size_t(n)))
}

// htodAsync and dtohAsync copy between host memory and the device on s.
// With page-locked host memory (memAllocHost, C memory) they return at
// once. With Go (pageable) memory the driver is done with it when they
// return: it stages the bytes of a host-to-device copy before returning,
// and completes a device-to-host copy before returning; so cgo's pointer
// rules hold either way.
func htodAsync(c cContext, dst uintptr, src []byte, s cStream) error {
	return check(
		"cuMemcpyHtoDAsync",
		C.fg_htod_async(
			c,
			C.uintptr_t(dst),
			unsafe.Pointer(unsafe.SliceData(src)),
			C.size_t(len(src)),
			C.uintptr_t(handleOfStream(s)),
		),
	)
}

func dtohAsync(c cContext, dst []byte, src uintptr, s cStream) error {
	return check(
		"cuMemcpyDtoHAsync",
		C.fg_dtoh_async(
			c,
			unsafe.Pointer(unsafe.SliceData(dst)),
			C.uintptr_t(src),
			C.size_t(len(dst)),
			C.uintptr_t(handleOfStream(s)),
		),
	)
}

func copyAsync(c cContext, dst, src uintptr, n int64, s cStream) error {
	return check(
		"cuMemcpyDtoDAsync",
		C.fg_dtod_async(c, C.uintptr_t(dst), C.uintptr_t(src), C.size_t(n), C.uintptr_t(handleOfStream(s))),
	)
}

func copy2DAsync(
	c cContext,
	dst uintptr,
	dpitch int64,
	src uintptr,
	spitch int64,
	width, height int64,
	s cStream,
) error {
	return check("cuMemcpy2DAsync", C.fg_copy2d_async(c, C.uintptr_t(dst), C.size_t(dpitch), C.uintptr_t(src),
		C.size_t(spitch), C.size_t(width), C.size_t(height), C.uintptr_t(handleOfStream(s))))
}

type ptrAttrs struct {
	memType uint
	ordinal int
	start   uintptr
	size    int64
	ctx     cContext // the context it was allocated in; nil for memory of no context
}

func pointerAttrs(c cContext, ptr uintptr) (ptrAttrs, error) {
	var mt C.uint
	var ord C.int
	var start C.uintptr_t
	var size C.size_t
	var owner C.fg_CUcontext
	err := check("cuPointerGetAttributes", C.fg_pointer_attrs(c, C.uintptr_t(ptr), &mt, &ord, &start, &size, &owner))
	return ptrAttrs{memType: uint(mt), ordinal: int(ord), start: uintptr(start), size: int64(size), ctx: owner}, err
}

// moduleLoad has the driver load a PTX or cubin image (JIT-compiling PTX);
// the log explains a failure.
func moduleLoad(c cContext, image []byte) (cModule, string, error) {
	var m C.fg_CUmodule
	img := C.CBytes(append(image[:len(image):len(image)], 0)) // PTX is text: NUL-terminated
	defer C.free(img)
	const logSize = 16 << 10
	log := (*C.char)(C.calloc(logSize, 1))
	defer C.free(unsafe.Pointer(log))
	err := check("cuModuleLoadDataEx", C.fg_module_load(c, &m, img, log, logSize))
	return m, C.GoString(log), err
}

func moduleUnload(c cContext, m cModule) error {
	return check("cuModuleUnload", C.fg_module_unload(c, m))
}

func moduleFunction(c cContext, m cModule, name string) (cFunction, error) {
	var f C.fg_CUfunction
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	err := check("cuModuleGetFunction("+name+")", C.fg_module_function(c, &f, m, n))
	return f, err
}

func moduleGlobal(c cContext, m cModule, name string) (uintptr, int64, error) {
	var p C.uintptr_t
	var size C.size_t
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	err := check("cuModuleGetGlobal("+name+")", C.fg_module_global(c, &p, &size, m, n))
	return uintptr(p), int64(size), err
}

// launch enqueues f on s with grid and block dimensions dims (x, y, z of
// each) and one 8-byte slot per kernel parameter.
func launch(c cContext, f cFunction, name string, dims [6]uint32, shared uint32, s cStream, args []uint64) error {
	var cdims [6]C.uint
	for i, d := range dims {
		cdims[i] = C.uint(d)
	}
	var vals *C.uint64_t
	if len(args) > 0 {
		vals = (*C.uint64_t)(unsafe.Pointer(&args[0]))
	}
	return check(
		"cuLaunchKernel("+name+")",
		C.fg_launch(c, f, &cdims[0], C.uint(shared), C.uintptr_t(handleOfStream(s)), C.int(len(args)), vals),
	)
}
