//go:build !amd64 || fairgo_dl_generic

package dl

import (
	"runtime"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Call calls the C function fn with up to 7 integer or pointer arguments
// (pass 0 for the unused ones) and returns its int result.
//
//go:uintptrescapes
func Call(fn, a1, a2, a3, a4, a5, a6, a7 uintptr) int32 {
	r, _, _ := purego.SyscallN(fn, a1, a2, a3, a4, a5, a6, a7)
	return int32(r)
}

// Call calls the driver function fn with up to 6 arguments, with ctx
// current on the thread for the call (see CtxFuncs). The goroutine stays
// on its thread from cuCtxGetCurrent to the restoring cuCtxSetCurrent.
//
//go:uintptrescapes
func (c *CtxFuncs) Call(ctx, fn, a1, a2, a3, a4, a5, a6 uintptr) int32 {
	return c.in(ctx, func() uintptr {
		r, _, _ := purego.SyscallN(fn, a1, a2, a3, a4, a5, a6)
		return r
	})
}

// Launch calls cuLaunchKernel (fn) with ctx current: kernel function k,
// grid gx×gy×gz, block bx×by×bz, shared bytes and stream, and as
// kernelParams an array of the addresses of the nvals 8-byte slots at vals.
// It panics when nvals > MaxKernelParams.
//
//go:uintptrescapes
func (c *CtxFuncs) Launch(ctx, fn, k, gx, gy, gz, bx, by, bz, shared, stream, vals, nvals uintptr) int32 {
	if nvals > MaxKernelParams {
		panic("dl: too many kernel parameters")
	}
	var params unsafe.Pointer
	if nvals > 0 {
		params = Calloc(nvals * 8)
		defer Free(params)
		p := unsafe.Slice((*uintptr)(params), nvals)
		for i := range p {
			p[i] = vals + 8*uintptr(i)
		}
	}
	return c.in(ctx, func() uintptr {
		r, _, _ := purego.SyscallN(fn, k, gx, gy, gz, bx, by, bz, shared, stream, uintptr(params), 0)
		return r
	})
}

func (c *CtxFuncs) in(ctx uintptr, call func() uintptr) int32 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prev := (*uintptr)(Calloc(8))
	defer Free(unsafe.Pointer(prev))
	r, _, _ := purego.SyscallN(c.Get, uintptr(unsafe.Pointer(prev)))
	if int32(r) != 0 {
		return int32(r)
	}
	if *prev != ctx {
		if r, _, _ := purego.SyscallN(c.Set, ctx); int32(r) != 0 {
			return int32(r)
		}
	}
	r = call()
	if *prev != ctx {
		purego.SyscallN(c.Set, *prev)
	}
	return int32(r)
}
