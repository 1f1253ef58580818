//go:build cuda

package cuda

// The C of the training kernels: a generic launch and asynchronous host
// copies, each making the context current for the one call (as driver.go's
// shims do).

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>
#include <stdint.h>

#include "fg_ctx.h"

#define FG_T_MAX_ARGS 12

// Each kernel parameter is passed in an 8-byte slot, little-endian: the
// driver reads as many bytes as the parameter has (4 for int and float, 8
// for pointers and 64-bit integers), so a 4-byte value sits in the slot's
// low half.
static CUresult fg_t_launch(CUcontext ctx, CUfunction f, unsigned gx, unsigned gy, unsigned bx, unsigned by,
                            CUstream s, int n, const uint64_t* vals) {
	uint64_t slots[FG_T_MAX_ARGS];
	void* args[FG_T_MAX_ARGS];
	if (n > FG_T_MAX_ARGS) return CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < n; i++) {
		slots[i] = vals[i];
		args[i] = &slots[i];
	}
	FG_IN_CTX(ctx, cuLaunchKernel(f, gx, gy, 1, bx, by, 1, 0, s, args, NULL))
}

static CUresult fg_t_htod_async(CUcontext ctx, uintptr_t dst, const void* src, size_t n, CUstream s) {
	FG_IN_CTX(ctx, cuMemcpyHtoDAsync((CUdeviceptr)dst, src, n, s))
}
static CUresult fg_t_dtoh_async(CUcontext ctx, void* dst, uintptr_t src, size_t n, CUstream s) {
	FG_IN_CTX(ctx, cuMemcpyDtoHAsync(dst, (CUdeviceptr)src, n, s))
}
*/
import "C"

import "unsafe"

const maxKernelArgs = C.FG_T_MAX_ARGS

func launchKernel(c cContext, f cFunction, name string, gx, gy, bx, by int, s cStream, args []uint64) error {
	if len(args) == 0 || len(args) > maxKernelArgs {
		return check("cuLaunchKernel("+name+")", C.CUDA_ERROR_INVALID_VALUE)
	}
	return check("cuLaunchKernel("+name+")", C.fg_t_launch(c, f, C.uint(gx), C.uint(gy), C.uint(bx), C.uint(by), s,
		C.int(len(args)), (*C.uint64_t)(unsafe.Pointer(&args[0]))))
}

// htodAsync and dtohAsync pass Go memory to the driver: both return only once
// the driver is done with it when it is pageable (which Go memory is), so the
// cgo pointer rules hold.
func htodAsync(c cContext, dst uintptr, src []byte, s cStream) error {
	return check("cuMemcpyHtoDAsync", C.fg_t_htod_async(c, C.uintptr_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src)), s))
}

func dtohAsync(c cContext, dst []byte, src uintptr, s cStream) error {
	return check("cuMemcpyDtoHAsync", C.fg_t_dtoh_async(c, unsafe.Pointer(&dst[0]), C.uintptr_t(src), C.size_t(len(dst)), s))
}
