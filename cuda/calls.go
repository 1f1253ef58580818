package cuda

// This file calls the CUDA driver without cgo: dlopen and dlsym through
// package internal/dl, and each driver function through its resolved
// pointer. fg_cuda.h declares the functions (FG_CU_SYMBOLS, in the order of
// the sym constants below) and the constants; TestDeclarationsMatchCUDAHeader
// checks it against a real cuda.h and TestGoMatchesHeader checks this file
// against it.
//
// Each call that needs a context goes through dl.CtxFuncs, which makes the
// context current for the duration of the one driver call and restores what
// was current, so that a goroutine need not be locked to its thread for it:
// on amd64 all of that is one C call (as in the cgo shims this replaces);
// elsewhere the goroutine is locked to its thread for the sequence. Device
// pointers and handles are uintptr; int arguments are widened, CUresult is
// read from the low 32 bits.

import (
	"runtime"
	"structs"
	"time"
	"unsafe"

	"github.com/fairgo/fairgo/internal/dl"
)

// CUDA result codes and constants the Go side tests for (fg_cuda.h's).
const (
	cudaSuccess      = 0
	cudaInvalidValue = 1
	cudaStubLibrary  = 34
	cudaNoDevice     = 100
	cudaNotReady     = 600
	memoryTypeDevice = 0x2
	maxKernelArgs    = dl.MaxKernelParams

	cuStreamNonBlocking             = 0x1
	cuEventDefault                  = 0x0
	cuEventDisableTiming            = 0x2
	cuDeviceAttrMaxPitch            = 11
	cuDeviceAttrMultiprocessorCount = 16
	cuDeviceAttrUnifiedAddressing   = 41
	cuPointerAttrContext            = 1
	cuPointerAttrMemoryType         = 2
	cuPointerAttrDeviceOrdinal      = 9
	cuPointerAttrRangeStartAddr     = 11
	cuPointerAttrRangeSize          = 12
	cuJitErrorLogBuffer             = 5
	cuJitErrorLogBufferSizeBytes    = 6
)

// Handles of the driver API.
type (
	cContext  uintptr // CUcontext
	cDevice   int32   // CUdevice
	cStream   uintptr // CUstream
	cEvent    uintptr // CUevent
	cModule   uintptr // CUmodule
	cFunction uintptr // CUfunction
)

// sym indexes the driver's function table (the order of FG_CU_SYMBOLS).
type sym int

const (
	symInit sym = iota
	symDriverGetVersion
	symGetErrorName
	symGetErrorString
	symDeviceGetCount
	symDeviceGet
	symDeviceGetName
	symDeviceGetAttribute
	symDevicePrimaryCtxRetain
	symDevicePrimaryCtxRelease
	symCtxGetCurrent
	symCtxSetCurrent
	symCtxSynchronize
	symCtxGetStreamPriorityRange
	symCtxCreate
	symCtxDestroy
	symCtxPopCurrent
	symStreamCreateWithPriority
	symStreamDestroy
	symStreamSynchronize
	symStreamWaitEvent
	symStreamGetCtx
	symEventCreate
	symEventDestroy
	symEventRecord
	symEventQuery
	symEventSynchronize
	symEventElapsedTime
	symMemAlloc
	symMemFree
	symMemAllocHost
	symMemFreeHost
	symMemGetInfo
	symMemcpyHtoD
	symMemcpyDtoH
	symMemsetD8
	symMemcpyHtoDAsync
	symMemcpyDtoHAsync
	symMemcpyDtoDAsync
	symMemcpy2DAsync
	symPointerGetAttributes
	symModuleLoadDataEx
	symModuleUnload
	symModuleGetFunction
	symModuleGetGlobal
	symLaunchKernel
	nsym
)

// symNames are the exported names (what the CUDA 11.8 header maps each
// plain name to: cuMemAlloc is cuMemAlloc_v2, and so on).
var symNames = [nsym]string{
	"cuInit", "cuDriverGetVersion", "cuGetErrorName", "cuGetErrorString", "cuDeviceGetCount", "cuDeviceGet",
	"cuDeviceGetName", "cuDeviceGetAttribute", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2",
	"cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxSynchronize", "cuCtxGetStreamPriorityRange",
	"cuCtxCreate_v2", "cuCtxDestroy_v2", "cuCtxPopCurrent_v2",
	"cuStreamCreateWithPriority", "cuStreamDestroy_v2", "cuStreamSynchronize", "cuStreamWaitEvent", "cuStreamGetCtx",
	"cuEventCreate", "cuEventDestroy_v2", "cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuEventElapsedTime",
	"cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocHost_v2", "cuMemFreeHost", "cuMemGetInfo_v2",
	"cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemsetD8_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2",
	"cuMemcpyDtoDAsync_v2", "cuMemcpy2DAsync_v2", "cuPointerGetAttributes",
	"cuModuleLoadDataEx", "cuModuleUnload", "cuModuleGetFunction", "cuModuleGetGlobal_v2", "cuLaunchKernel",
}

func numSyms() int { return int(nsym) }

func symName(s sym) string { return symNames[s] }

// symTable holds the resolved driver functions.
type symTable [nsym]uintptr

// table is a resolved function table.
type table = *symTable

// The committed table: written once by commit when the driver has loaded
// and initialised (under Load's lock, before any Device exists), read-only
// afterwards.
var (
	cu    symTable
	cuCtx dl.CtxFuncs // cuCtxGetCurrent and cuCtxSetCurrent of cu
)

// dlopen opens the library at path, or returns the loader's text.
func dlopen(path string) (uintptr, string) { return dl.Open(path) }

func dlclose(h uintptr) { dl.Close(h) }

// resolve looks up every function of the table; it returns the table and
// the first missing symbol with the loader's text.
func resolve(h uintptr) (t table, missing, text string) {
	t = new(symTable)
	for i := range nsym {
		p, text := dl.Sym(h, symName(i))
		if p == 0 {
			return t, symName(i), text
		}
		t[i] = p
	}
	return t, "", ""
}

func freeTable(table) {}

// origin is the file the table's functions were loaded from, or "".
func origin(t table) string { return dl.Origin(t[0]) }

func tableInit(t table) int { return int(dl.Call(t[symInit], 0, 0, 0, 0, 0, 0, 0)) }

func tableVersion(t table) (int, int) {
	var v int32
	r := dl.Call(t[symDriverGetVersion], uintptr(unsafe.Pointer(&v)), 0, 0, 0, 0, 0, 0)
	return int(v), int(r)
}

// tableErrorName is cuGetErrorName and cuGetErrorString: each returns a
// pointer to a static string of the driver, copied here.
func tableErrorName(t table, code int) (name, text string) {
	var p uintptr
	if dl.Call(t[symGetErrorName], uintptr(code), uintptr(unsafe.Pointer(&p)), 0, 0, 0, 0, 0) == cudaSuccess {
		name = dl.GoString(p)
	}
	p = 0
	if dl.Call(t[symGetErrorString], uintptr(code), uintptr(unsafe.Pointer(&p)), 0, 0, 0, 0, 0) == cudaSuccess {
		text = dl.GoString(p)
	}
	return name, text
}

// commit makes t the table every other call of this file uses.
func commit(t table) {
	cu = *t
	cuCtx = dl.CtxFuncs{Get: cu[symCtxGetCurrent], Set: cu[symCtxSetCurrent]}
}

// errorName is cuGetErrorName and cuGetErrorString through the committed
// table.
func errorName(code int) (name, text string) { return tableErrorName(&cu, code) }

func check(op string, r int32) error {
	if r == cudaSuccess {
		return nil
	}
	return newError(op, int(r))
}

// call calls a committed driver function that needs no context. Like
// dl.Call, it moves what its uintptr arguments point to onto the heap and
// keeps it alive for the call.
//
//go:uintptrescapes
func call(s sym, a1, a2, a3 uintptr) int32 { return dl.Call(cu[s], a1, a2, a3, 0, 0, 0, 0) }

func deviceCount() (int, error) {
	var n int32
	err := check("cuDeviceGetCount", call(symDeviceGetCount, uintptr(unsafe.Pointer(&n)), 0, 0))
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
	var dev int32
	var name [256]byte
	var sms, pitch, uva int32
	r := call(symDeviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(ordinal), 0)
	if r == cudaSuccess {
		r = call(symDeviceGetName, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)), uintptr(dev))
	}
	for _, a := range []struct {
		out  *int32
		attr uintptr
	}{{&sms, cuDeviceAttrMultiprocessorCount}, {&pitch, cuDeviceAttrMaxPitch}, {&uva, cuDeviceAttrUnifiedAddressing}} {
		if r == cudaSuccess {
			r = call(symDeviceGetAttribute, uintptr(unsafe.Pointer(a.out)), a.attr, uintptr(dev))
		}
	}
	err := check("cuDeviceGet/cuDeviceGetName/cuDeviceGetAttribute", r)
	n := 0
	for n < len(name) && name[n] != 0 {
		n++
	}
	return deviceInfo{dev: cDevice(dev), name: string(name[:n]), sms: int(sms), maxPitch: int64(pitch), uva: uva != 0}, err
}

func primaryRetain(dev cDevice) (cContext, error) {
	var ctx uintptr
	err := check("cuDevicePrimaryCtxRetain", call(symDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&ctx)), uintptr(dev), 0))
	return cContext(ctx), err
}

func primaryRelease(dev cDevice) error {
	return check("cuDevicePrimaryCtxRelease", call(symDevicePrimaryCtxRelease, uintptr(dev), 0, 0))
}

func ctxGet() (cContext, error) {
	var c uintptr
	err := check("cuCtxGetCurrent", call(symCtxGetCurrent, uintptr(unsafe.Pointer(&c)), 0, 0))
	return cContext(c), err
}

func ctxSet(c cContext) error {
	return check("cuCtxSetCurrent", call(symCtxSetCurrent, uintptr(c), 0, 0))
}

// in calls the driver function s with c current (dl.CtxFuncs). Like
// dl.Call, it moves what its uintptr arguments point to onto the heap and
// keeps it alive for the call.
//
//go:uintptrescapes
func in(c cContext, s sym, a1, a2, a3, a4, a5, a6 uintptr) int32 {
	return cuCtx.Call(uintptr(c), cu[s], a1, a2, a3, a4, a5, a6)
}

func ctxSync(c cContext) error {
	return check("cuCtxSynchronize", in(c, symCtxSynchronize, 0, 0, 0, 0, 0, 0))
}

// ctxCreate makes a context of its own on dev (cuCtxCreate), current on no
// thread; ctxDestroy destroys it. cuCtxCreate makes it current on the
// calling thread; it is popped again right away, on the same thread, which
// makes the thread's previous context current again.
func ctxCreate(dev cDevice) (cContext, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var made, popped uintptr
	r := call(symCtxCreate, uintptr(unsafe.Pointer(&made)), 0, uintptr(dev))
	if r == cudaSuccess {
		if r = call(symCtxPopCurrent, uintptr(unsafe.Pointer(&popped)), 0, 0); r != cudaSuccess {
			call(symCtxDestroy, made, 0, 0)
			made = 0
		}
	} else {
		made = 0
	}
	return cContext(made), check("cuCtxCreate", r)
}

func ctxDestroy(c cContext) error {
	return check("cuCtxDestroy", call(symCtxDestroy, uintptr(c), 0, 0))
}

func priorityRange(c cContext) (least, greatest int, err error) {
	var l, g int32
	err = check("cuCtxGetStreamPriorityRange",
		in(c, symCtxGetStreamPriorityRange, uintptr(unsafe.Pointer(&l)), uintptr(unsafe.Pointer(&g)), 0, 0, 0, 0))
	return int(l), int(g), err
}

func cStreamFromHandle(h uintptr) cStream { return cStream(h) }

func handleOfStream(s cStream) uintptr { return uintptr(s) }

func streamCreate(c cContext, priority int) (cStream, error) {
	var s uintptr
	err := check("cuStreamCreateWithPriority", in(c, symStreamCreateWithPriority,
		uintptr(unsafe.Pointer(&s)), cuStreamNonBlocking, uintptr(priority), 0, 0, 0))
	return cStream(s), err
}

func streamDestroy(c cContext, s cStream) error {
	return check("cuStreamDestroy", in(c, symStreamDestroy, uintptr(s), 0, 0, 0, 0, 0))
}

func streamSync(c cContext, s cStream) error {
	return check("cuStreamSynchronize", in(c, symStreamSynchronize, uintptr(s), 0, 0, 0, 0, 0))
}

func streamWait(c cContext, s cStream, e cEvent) error {
	return check("cuStreamWaitEvent", in(c, symStreamWaitEvent, uintptr(s), uintptr(e), 0, 0, 0, 0))
}

// streamCtx is the context stream s belongs to, asked with c current (so
// that the special handles NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD
// name c's own default streams).
func streamCtx(c cContext, s cStream) (cContext, error) {
	var out uintptr
	err := check("cuStreamGetCtx", in(c, symStreamGetCtx, uintptr(s), uintptr(unsafe.Pointer(&out)), 0, 0, 0, 0))
	return cContext(out), err
}

func eventCreate(c cContext, timing bool) (cEvent, error) {
	var e uintptr
	flags := uintptr(cuEventDisableTiming)
	if timing {
		flags = cuEventDefault
	}
	err := check("cuEventCreate", in(c, symEventCreate, uintptr(unsafe.Pointer(&e)), flags, 0, 0, 0, 0))
	return cEvent(e), err
}

func eventDestroy(c cContext, e cEvent) error {
	return check("cuEventDestroy", in(c, symEventDestroy, uintptr(e), 0, 0, 0, 0, 0))
}

func eventRecord(c cContext, e cEvent, s cStream) error {
	return check("cuEventRecord", in(c, symEventRecord, uintptr(e), uintptr(s), 0, 0, 0, 0))
}

// eventQuery returns the raw result: cudaSuccess, cudaNotReady or an error.
func eventQuery(c cContext, e cEvent) int {
	return int(in(c, symEventQuery, uintptr(e), 0, 0, 0, 0, 0))
}

func eventSync(c cContext, e cEvent) error {
	return check("cuEventSynchronize", in(c, symEventSynchronize, uintptr(e), 0, 0, 0, 0, 0))
}

func eventElapsed(c cContext, start, end cEvent) (time.Duration, error) {
	var ms float32
	if err := check("cuEventElapsedTime",
		in(c, symEventElapsedTime, uintptr(unsafe.Pointer(&ms)), uintptr(start), uintptr(end), 0, 0, 0)); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

func memAlloc(c cContext, n int64) (uintptr, error) {
	var p uint64 // CUdeviceptr
	err := check("cuMemAlloc", in(c, symMemAlloc, uintptr(unsafe.Pointer(&p)), uintptr(n), 0, 0, 0, 0))
	return uintptr(p), err
}

func memFree(c cContext, p uintptr) error {
	return check("cuMemFree", in(c, symMemFree, p, 0, 0, 0, 0, 0))
}

// memAllocHost allocates n bytes of page-locked host memory (C memory).
func memAllocHost(c cContext, n int) ([]byte, error) {
	var p uintptr
	if err := check("cuMemAllocHost", in(c, symMemAllocHost, uintptr(unsafe.Pointer(&p)), uintptr(n), 0, 0, 0, 0)); err != nil {
		return nil, err
	}
	return dl.Bytes(p, n), nil
}

func memFreeHost(c cContext, b []byte) error {
	return check("cuMemFreeHost", in(c, symMemFreeHost, uintptr(unsafe.Pointer(unsafe.SliceData(b))), 0, 0, 0, 0, 0))
}

func memInfo(c cContext) (free, total int64, err error) {
	var f, t uintptr
	err = check("cuMemGetInfo",
		in(c, symMemGetInfo, uintptr(unsafe.Pointer(&f)), uintptr(unsafe.Pointer(&t)), 0, 0, 0, 0))
	return int64(f), int64(t), err
}

// uploadSync, downloadSync and memsetSync move bytes between Go memory and
// the device and wait for the whole context (download: before, upload and
// memset: after). The driver is done with the Go memory when they return.
func uploadSync(c cContext, dst uintptr, src []byte) error {
	r := in(c, symMemcpyHtoD, dst, uintptr(unsafe.Pointer(unsafe.SliceData(src))), uintptr(len(src)), 0, 0, 0)
	runtime.KeepAlive(src)
	if r == cudaSuccess {
		r = in(c, symCtxSynchronize, 0, 0, 0, 0, 0, 0)
	}
	return check("cuMemcpyHtoD", r)
}

func downloadSync(c cContext, dst []byte, src uintptr) error {
	r := in(c, symCtxSynchronize, 0, 0, 0, 0, 0, 0)
	if r == cudaSuccess {
		r = in(c, symMemcpyDtoH, uintptr(unsafe.Pointer(unsafe.SliceData(dst))), src, uintptr(len(dst)), 0, 0, 0)
		runtime.KeepAlive(dst)
	}
	return check("cuMemcpyDtoH", r)
}

func memsetSync(c cContext, dst uintptr, b byte, n int64) error {
	r := in(c, symMemsetD8, dst, uintptr(b), uintptr(n), 0, 0, 0)
	if r == cudaSuccess {
		r = in(c, symCtxSynchronize, 0, 0, 0, 0, 0, 0)
	}
	return check("cuMemsetD8", r)
}

// htodAsync and dtohAsync copy between host memory and the device on s.
// With page-locked host memory (memAllocHost, C memory) they return at
// once. With Go (pageable) memory the driver is done with it when they
// return: it stages the bytes of a host-to-device copy before returning,
// and completes a device-to-host copy before returning; so the pointer
// rules of C calls hold either way.
func htodAsync(c cContext, dst uintptr, src []byte, s cStream) error {
	r := in(c, symMemcpyHtoDAsync, dst, uintptr(unsafe.Pointer(unsafe.SliceData(src))), uintptr(len(src)), uintptr(s), 0, 0)
	runtime.KeepAlive(src)
	return check("cuMemcpyHtoDAsync", r)
}

func dtohAsync(c cContext, dst []byte, src uintptr, s cStream) error {
	r := in(c, symMemcpyDtoHAsync, uintptr(unsafe.Pointer(unsafe.SliceData(dst))), src, uintptr(len(dst)), uintptr(s), 0, 0)
	runtime.KeepAlive(dst)
	return check("cuMemcpyDtoHAsync", r)
}

func copyAsync(c cContext, dst, src uintptr, n int64, s cStream) error {
	return check("cuMemcpyDtoDAsync", in(c, symMemcpyDtoDAsync, dst, src, uintptr(n), uintptr(s), 0, 0))
}

// memcpy2D is CUDA_MEMCPY2D (struct fg_memcpy2d of fg_cuda.h; the header
// tests check both layouts).
type memcpy2D struct {
	_             structs.HostLayout
	srcXInBytes   uintptr
	srcY          uintptr
	srcMemoryType int32
	srcHost       uintptr
	srcDevice     uint64
	srcArray      uintptr
	srcPitch      uintptr
	dstXInBytes   uintptr
	dstY          uintptr
	dstMemoryType int32
	dstHost       uintptr
	dstDevice     uint64
	dstArray      uintptr
	dstPitch      uintptr
	WidthInBytes  uintptr
	Height        uintptr
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
	p := &memcpy2D{
		srcMemoryType: memoryTypeDevice, srcDevice: uint64(src), srcPitch: uintptr(spitch),
		dstMemoryType: memoryTypeDevice, dstDevice: uint64(dst), dstPitch: uintptr(dpitch),
		WidthInBytes: uintptr(width), Height: uintptr(height),
	}
	return check("cuMemcpy2DAsync", in(c, symMemcpy2DAsync, uintptr(unsafe.Pointer(p)), uintptr(s), 0, 0, 0, 0))
}

type ptrAttrs struct {
	memType uint
	ordinal int
	start   uintptr
	size    int64
	ctx     cContext // the context it was allocated in; 0 for memory of no context
}

// ptrAttrQuery is the argument block of cuPointerGetAttributes: the
// attributes, and the addresses the driver writes each one to. It holds
// pointers, so it is C memory.
type ptrAttrQuery struct {
	_       structs.HostLayout
	attrs   [5]int32
	data    [5]uintptr
	memType uint32
	ordinal int32
	start   uint64
	size    uintptr
	owner   uintptr
}

// pointerAttrs asks for the attributes of ptr. The context attribute is 0
// for memory that belongs to no context (virtual memory management
// mappings).
func pointerAttrs(c cContext, ptr uintptr) (ptrAttrs, error) {
	q := (*ptrAttrQuery)(dl.Calloc(unsafe.Sizeof(ptrAttrQuery{})))
	defer dl.Free(unsafe.Pointer(q))
	q.attrs = [5]int32{cuPointerAttrMemoryType, cuPointerAttrDeviceOrdinal, cuPointerAttrRangeStartAddr,
		cuPointerAttrRangeSize, cuPointerAttrContext}
	q.data = [5]uintptr{uintptr(unsafe.Pointer(&q.memType)), uintptr(unsafe.Pointer(&q.ordinal)),
		uintptr(unsafe.Pointer(&q.start)), uintptr(unsafe.Pointer(&q.size)), uintptr(unsafe.Pointer(&q.owner))}
	q.ordinal = -1
	r := in(c, symPointerGetAttributes, 5, uintptr(unsafe.Pointer(&q.attrs[0])), uintptr(unsafe.Pointer(&q.data[0])),
		ptr, 0, 0)
	return ptrAttrs{memType: uint(q.memType), ordinal: int(q.ordinal), start: uintptr(q.start), size: int64(q.size),
		ctx: cContext(q.owner)}, check("cuPointerGetAttributes", r)
}

// moduleLoadQuery is the option block of cuModuleLoadDataEx: the JIT's
// error log buffer and its size. The values point to the log, so it is C
// memory, as is the log, which the driver writes during the call.
type moduleLoadQuery struct {
	_    structs.HostLayout
	opts [2]int32
	vals [2]uintptr
	log  [16 << 10]byte
}

// moduleLoad has the driver load a PTX or cubin image (JIT-compiling PTX);
// the log explains a failure.
func moduleLoad(c cContext, image []byte) (cModule, string, error) {
	var m uintptr
	img := append(image[:len(image):len(image)], 0) // PTX is text: NUL-terminated
	q := (*moduleLoadQuery)(dl.Calloc(unsafe.Sizeof(moduleLoadQuery{})))
	defer dl.Free(unsafe.Pointer(q))
	q.opts = [2]int32{cuJitErrorLogBuffer, cuJitErrorLogBufferSizeBytes}
	q.vals = [2]uintptr{uintptr(unsafe.Pointer(&q.log[0])), uintptr(len(q.log))}
	r := in(c, symModuleLoadDataEx, uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&img[0])), 2,
		uintptr(unsafe.Pointer(&q.opts[0])), uintptr(unsafe.Pointer(&q.vals[0])), 0)
	runtime.KeepAlive(img)
	return cModule(m), dl.GoString(uintptr(unsafe.Pointer(&q.log[0]))), check("cuModuleLoadDataEx", r)
}

func moduleUnload(c cContext, m cModule) error {
	return check("cuModuleUnload", in(c, symModuleUnload, uintptr(m), 0, 0, 0, 0, 0))
}

// cstring is s with a terminating NUL, as Go memory to pass to one call.
func cstring(s string) []byte { return append([]byte(s), 0) }

func moduleFunction(c cContext, m cModule, name string) (cFunction, error) {
	var f uintptr
	n := cstring(name)
	r := in(c, symModuleGetFunction, uintptr(unsafe.Pointer(&f)), uintptr(m), uintptr(unsafe.Pointer(&n[0])), 0, 0, 0)
	runtime.KeepAlive(n)
	return cFunction(f), check("cuModuleGetFunction("+name+")", r)
}

func moduleGlobal(c cContext, m cModule, name string) (uintptr, int64, error) {
	var p uint64
	var size uintptr
	n := cstring(name)
	r := in(c, symModuleGetGlobal, uintptr(unsafe.Pointer(&p)), uintptr(unsafe.Pointer(&size)), uintptr(m),
		uintptr(unsafe.Pointer(&n[0])), 0, 0)
	runtime.KeepAlive(n)
	return uintptr(p), int64(size), check("cuModuleGetGlobal("+name+")", r)
}

// launch enqueues f on s with grid and block dimensions dims (x, y, z of
// each) and one 8-byte slot per kernel parameter: the driver reads as many
// bytes from a slot as the kernel's parameter has (4 for an int or a
// float), which on a little-endian host are the value's.
func launch(c cContext, f cFunction, name string, dims [6]uint32, shared uint32, s cStream, args []uint64) error {
	if len(args) > maxKernelArgs {
		return check("cuLaunchKernel("+name+")", cudaInvalidValue)
	}
	// The slots' address is converted in the call expression itself, so
	// that dl's //go:uintptrescapes keeps them on the heap for the call.
	r := cuCtx.Launch(uintptr(c), cu[symLaunchKernel], uintptr(f),
		uintptr(dims[0]), uintptr(dims[1]), uintptr(dims[2]), uintptr(dims[3]), uintptr(dims[4]), uintptr(dims[5]),
		uintptr(shared), uintptr(s), uintptr(unsafe.Pointer(unsafe.SliceData(args))), uintptr(len(args)))
	runtime.KeepAlive(args)
	return check("cuLaunchKernel("+name+")", r)
}
