//go:build cgo && fairgo_cgobench

package cgobench

/*
#include <stdint.h>
typedef long (*fg_labs_fn)(long);
static long fg_call_labs(uintptr_t fn, long x) { return ((fg_labs_fn)fn)(x); }
*/
import "C"

// cgoCallLabs calls labs through its pointer from a cgo shim.
func cgoCallLabs(fn uintptr, x int64) int64 { return int64(C.fg_call_labs(C.uintptr_t(fn), C.long(x))) }
