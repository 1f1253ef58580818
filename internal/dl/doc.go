// Package dl loads shared libraries and calls C functions without cgo, for
// the GPU backend (packages cuda and nccl): dlopen, dlsym and dladdr
// through github.com/ebitengine/purego, and calls through resolved function
// pointers.
//
// Calls take and return uintptr words, in C's integer calling convention:
// int and unsigned int arguments are passed widened, results are read from
// the low bits (int32(r) for an int result). No function called through
// this package takes or returns a floating-point value.
//
// On linux/amd64, Call, CtxFuncs.Call and CtxFuncs.Launch enter C once per
// call through a small assembly trampoline (runtime.cgocall, as cgo does),
// with their argument block on the goroutine's stack: no allocation, and
// the context switch of the CUDA driver (get, set, call, restore) happens
// inside that one C call, as it did in the cgo shims. On other platforms
// they use purego.SyscallN, locked to the OS thread for the context switch.
//
// Pointer rules: the functions are marked //go:uintptrescapes, so a Go
// pointer converted to uintptr in the call expression itself
// (dl.Call(fn, uintptr(unsafe.Pointer(&x)))) is moved to the heap and kept
// alive until the call returns. The pointed-to memory must not hold Go
// pointers, and C must not keep it after the call: memory that C writes
// later, or that holds pointers, comes from Calloc.
package dl
