//go:build !fairgo_dl_generic

package dl

import "unsafe"

// frame is the trampoline's argument block (call_amd64.s reads it through
// the offsets of go_asm.h). It lives on the calling goroutine's stack, and
// the trampoline copies it to the system stack before anything else, so
// that nothing is read from or written to the goroutine's stack during the
// call: should the C code call back into Go and that callback grow the
// stack, the stack moves (cgo's own calls guard against the same with
// _cgo_topofstack). runtime.cgocall's prologue, which may grow the stack
// before the call, adjusts the frame's address (its parameter is an
// unsafe.Pointer). No field may point into a stack: the exported functions
// are //go:uintptrescapes, which moves what their arguments point to onto
// the heap. The result comes back in runtime.cgocall's int32.
type frame struct {
	fn    uintptr     // the function
	a     [11]uintptr // its arguments: a[0:6] in registers, a[6:11] on the stack
	get   uintptr     // cuCtxGetCurrent, or 0: no context switch
	set   uintptr     // cuCtxSetCurrent
	ctx   uintptr     // the context to make current
	vals  uintptr     // Launch: the kernel's parameter slots (8 bytes each)
	nvals uintptr     // Launch: how many; a[9] becomes an array of their addresses
}

// The trampoline copies exactly this many bytes.
const _ = uint(unsafe.Sizeof(frame{})-136) + uint(136-unsafe.Sizeof(frame{}))

// trampolineABI0 is the address of the trampoline of call_amd64.s, a
// function of the C calling convention that takes a *frame.
var trampolineABI0 uintptr

// runtime_cgocall switches to the system stack and calls fn(arg) with the C
// calling convention, as cgo's calls do (purego.SyscallN uses it too).
//
//go:linkname runtime_cgocall runtime.cgocall
//go:noescape
func runtime_cgocall(fn uintptr, arg unsafe.Pointer) int32

// Call calls the C function fn with up to 7 integer or pointer arguments
// (pass 0 for the unused ones) and returns its int result.
//
//go:uintptrescapes
func Call(fn, a1, a2, a3, a4, a5, a6, a7 uintptr) int32 {
	f := frame{fn: fn}
	f.a[0], f.a[1], f.a[2], f.a[3], f.a[4], f.a[5], f.a[6] = a1, a2, a3, a4, a5, a6, a7
	return runtime_cgocall(trampolineABI0, unsafe.Pointer(&f))
}

// Call calls the driver function fn with up to 6 arguments, with ctx
// current on the thread for the call (see CtxFuncs).
//
//go:uintptrescapes
func (c *CtxFuncs) Call(ctx, fn, a1, a2, a3, a4, a5, a6 uintptr) int32 {
	f := frame{fn: fn, get: c.Get, set: c.Set, ctx: ctx}
	f.a[0], f.a[1], f.a[2], f.a[3], f.a[4], f.a[5] = a1, a2, a3, a4, a5, a6
	return runtime_cgocall(trampolineABI0, unsafe.Pointer(&f))
}

// Launch calls cuLaunchKernel (fn) with ctx current: kernel function k,
// grid gx×gy×gz, block bx×by×bz, shared bytes and stream, and as
// kernelParams an array of the addresses of the nvals 8-byte slots at vals
// (each parameter in its own slot; the driver reads as many bytes of a slot
// as the parameter has). The array is built on the system stack during the
// call. It panics when nvals > MaxKernelParams.
//
//go:uintptrescapes
func (c *CtxFuncs) Launch(ctx, fn, k, gx, gy, gz, bx, by, bz, shared, stream, vals, nvals uintptr) int32 {
	if nvals > MaxKernelParams {
		panic("dl: too many kernel parameters")
	}
	f := frame{fn: fn, get: c.Get, set: c.Set, ctx: ctx, vals: vals, nvals: nvals}
	f.a = [11]uintptr{k, gx, gy, gz, bx, by, bz, shared, stream, 0, 0}
	return runtime_cgocall(trampolineABI0, unsafe.Pointer(&f))
}
