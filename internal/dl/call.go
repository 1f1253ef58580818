package dl

import "github.com/ebitengine/purego"

// MaxKernelParams is the most parameters CtxFuncs.Launch passes to a kernel.
const MaxKernelParams = 64

// CtxFuncs are the CUDA driver's cuCtxGetCurrent and cuCtxSetCurrent.
// Their calls make a context current on the calling thread for one driver
// call and restore the thread's previous context afterwards, so that a
// goroutine need not be locked to its thread:
//
//	prev = NULL
//	r = cuCtxGetCurrent(&prev); if r != 0: return r
//	if prev != ctx: r = cuCtxSetCurrent(ctx); if r != 0: return r
//	r = fn(args...)
//	if prev != ctx: cuCtxSetCurrent(prev)
//	return r
type CtxFuncs struct {
	Get, Set uintptr
}

// CallPtr calls the C function fn with up to 3 integer or pointer arguments
// and returns its pointer-sized result (a C string, say). It is the slower
// purego.SyscallN, for calls off the hot path.
//
//go:uintptrescapes
func CallPtr(fn, a1, a2, a3 uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, a1, a2, a3)
	return r
}
