//go:build cuda

package gpu

// The C of the training kernels: module loading, a generic launch and
// asynchronous host copies. Every call runs with the device's primary
// context current on a locked thread (cuda.Device.Bind), so the shims take
// no context.

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>

#define FG_T_MAX_ARGS 12

static CUresult fg_t_module_load(CUmodule* m, const void* image, char* log, unsigned logsize) {
	CUjit_option opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void* vals[2] = {log, (void*)(uintptr_t)logsize};
	return cuModuleLoadDataEx(m, image, 2, opts, vals);
}

// Each kernel parameter is passed in an 8-byte slot, little-endian: the
// driver reads as many bytes as the parameter has (4 for int and float, 8
// for pointers and 64-bit integers), so a 4-byte value sits in the slot's
// low half.
static CUresult fg_t_launch(CUfunction f, unsigned gx, unsigned gy, unsigned bx, unsigned by,
                            uintptr_t s, int n, const uint64_t* vals) {
	uint64_t slots[FG_T_MAX_ARGS];
	void* args[FG_T_MAX_ARGS];
	if (n > FG_T_MAX_ARGS) return CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < n; i++) {
		slots[i] = vals[i];
		args[i] = &slots[i];
	}
	return cuLaunchKernel(f, gx, gy, 1, bx, by, 1, 0, (CUstream)s, args, NULL);
}

static CUresult fg_t_htod_async(uintptr_t dst, const void* src, size_t n, uintptr_t s) {
	return cuMemcpyHtoDAsync((CUdeviceptr)dst, src, n, (CUstream)s);
}
static CUresult fg_t_dtoh_async(void* dst, uintptr_t src, size_t n, uintptr_t s) {
	return cuMemcpyDtoHAsync(dst, (CUdeviceptr)src, n, (CUstream)s);
}
static CUresult fg_t_stream_sync(uintptr_t s) { return cuStreamSynchronize((CUstream)s); }
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/fairgo/fairgo"
)

const maxKernelArgs = C.FG_T_MAX_ARGS

type (
	cModule   = C.CUmodule
	cFunction = C.CUfunction
)

// driverError is a failed driver call; CUDA_ERROR_INVALID_VALUE also wraps
// fairgo.ErrInvalidArgument.
type driverError struct {
	op   string
	code int
}

func (e *driverError) Error() string {
	var name *C.char
	C.cuGetErrorName(C.CUresult(e.code), &name)
	return fmt.Sprintf("%s: %s (%d)", e.op, C.GoString(name), e.code)
}

func (e *driverError) Unwrap() error {
	if e.code == C.CUDA_ERROR_INVALID_VALUE {
		return fairgo.ErrInvalidArgument
	}
	return nil
}

func check(op string, r C.CUresult) error {
	if r == C.CUDA_SUCCESS {
		return nil
	}
	return &driverError{op: op, code: int(r)}
}

// moduleLoad has the driver JIT-compile a PTX image; the log explains a
// failure.
func moduleLoad(image string) (cModule, string, error) {
	var m C.CUmodule
	img := C.CString(image)
	defer C.free(unsafe.Pointer(img))
	const logSize = 16 << 10
	log := (*C.char)(C.calloc(logSize, 1))
	defer C.free(unsafe.Pointer(log))
	err := check("cuModuleLoadDataEx", C.fg_t_module_load(&m, unsafe.Pointer(img), log, logSize))
	return m, C.GoString(log), err
}

func moduleUnload(m cModule) error { return check("cuModuleUnload", C.cuModuleUnload(m)) }

func moduleFunction(m cModule, name string) (cFunction, error) {
	var f C.CUfunction
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	return f, check("cuModuleGetFunction("+name+")", C.cuModuleGetFunction(&f, m, n))
}

func ctxSync() error { return check("cuCtxSynchronize", C.cuCtxSynchronize()) }

func launchKernel(f cFunction, name string, gx, gy, bx, by int, stream uintptr, args []uint64) error {
	if len(args) == 0 || len(args) > maxKernelArgs {
		return check("cuLaunchKernel("+name+")", C.CUDA_ERROR_INVALID_VALUE)
	}
	return check("cuLaunchKernel("+name+")", C.fg_t_launch(f, C.uint(gx), C.uint(gy), C.uint(bx), C.uint(by), C.uintptr_t(stream),
		C.int(len(args)), (*C.uint64_t)(unsafe.Pointer(&args[0]))))
}

// htodAsync and dtohAsync pass Go memory to the driver: both return only
// once the driver is done with it when it is pageable (which Go memory is),
// so the cgo pointer rules hold.
func htodAsync(dst uintptr, src []byte, stream uintptr) error {
	return check("cuMemcpyHtoDAsync", C.fg_t_htod_async(C.uintptr_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src)), C.uintptr_t(stream)))
}

func dtohAsync(dst []byte, src uintptr, stream uintptr) error {
	return check("cuMemcpyDtoHAsync", C.fg_t_dtoh_async(unsafe.Pointer(&dst[0]), C.uintptr_t(src), C.size_t(len(dst)), C.uintptr_t(stream)))
}

func streamSync(stream uintptr) error {
	return check("cuStreamSynchronize", C.fg_t_stream_sync(C.uintptr_t(stream)))
}
