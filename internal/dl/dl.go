package dl

import (
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Open loads the library at path (dlopen with RTLD_NOW | RTLD_LOCAL) and
// returns its handle, or 0 and the loader's text.
func Open(path string) (handle uintptr, text string) {
	// dlerror's text belongs to the thread that made the failed call.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		text = err.Error()
		if text == "" {
			text = "dlopen failed"
		}
		return 0, text
	}
	return h, ""
}

// Sym resolves name in the library of handle h, or returns 0 and the
// loader's text.
func Sym(h uintptr, name string) (uintptr, string) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p, err := purego.Dlsym(h, name)
	if err != nil || p == 0 {
		text := "symbol not found"
		if err != nil && err.Error() != "" {
			text = err.Error()
		}
		return 0, text
	}
	return p, ""
}

// Close unloads a library opened by Open (dlclose).
func Close(h uintptr) { _ = purego.Dlclose(h) }

// libc holds the few C library functions the package calls itself.
var libc struct {
	once                 sync.Once
	calloc, free, dladdr uintptr
}

func loadLibc() {
	libc.once.Do(func() {
		// RTLD_DEFAULT finds them in whatever the process has loaded (libc,
		// and libdl for dladdr before glibc 2.34); the named libraries are
		// the fallback.
		var hs []uintptr
		hs = append(hs, purego.RTLD_DEFAULT)
		for _, n := range []string{"libc.so.6", "libdl.so.2"} {
			if h, err := purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_LOCAL); err == nil {
				hs = append(hs, h)
			}
		}
		find := func(name string) uintptr {
			for _, h := range hs {
				if p, err := purego.Dlsym(h, name); err == nil && p != 0 {
					return p
				}
			}
			return 0
		}
		libc.calloc, libc.free, libc.dladdr = find("calloc"), find("free"), find("dladdr")
	})
}

// Calloc allocates n zeroed bytes of C memory (calloc), for memory that C
// keeps or writes after a call returns, or that holds pointers. It panics
// when the C library has no calloc or is out of memory.
func Calloc(n uintptr) unsafe.Pointer {
	loadLibc()
	if libc.calloc == 0 {
		panic("dl: calloc not found")
	}
	p := CallPtr(libc.calloc, 1, n, 0)
	if p == 0 {
		panic("dl: out of C memory")
	}
	return ptr(p)
}

// Free releases memory from Calloc; nil is ignored.
func Free(p unsafe.Pointer) {
	if p == nil {
		return
	}
	loadLibc()
	Call(libc.free, uintptr(p), 0, 0, 0, 0, 0, 0)
}

// CString copies s into C memory with a terminating NUL (free with Free).
func CString(s string) unsafe.Pointer {
	p := Calloc(uintptr(len(s)) + 1)
	copy(unsafe.Slice((*byte)(p), len(s)), s)
	return p
}

// Origin is the file that the resolved symbol p came from (dladdr: the real
// path of a library found through the loader's search), or "".
func Origin(p uintptr) string {
	loadLibc()
	if p == 0 || libc.dladdr == 0 {
		return ""
	}
	// Dl_info: dli_fname, dli_fbase, dli_sname, dli_saddr.
	info := (*[4]uintptr)(Calloc(4 * unsafe.Sizeof(uintptr(0))))
	defer Free(unsafe.Pointer(info))
	if Call(libc.dladdr, p, uintptr(unsafe.Pointer(info)), 0, 0, 0, 0, 0) == 0 {
		return ""
	}
	return GoString(info[0])
}

// GoString copies the NUL-terminated C string at p; "" for 0. The memory
// must stay valid during the copy (a static string of the library, or one
// it keeps for the caller).
func GoString(p uintptr) string {
	if p == 0 {
		return ""
	}
	base := ptr(p)
	n := 0
	for *(*byte)(unsafe.Add(base, n)) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(base), n))
}

// Bytes is the n bytes of C memory at p, as a slice that aliases them.
func Bytes(p uintptr, n int) []byte {
	if p == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(ptr(p)), n)
}

// ptr turns an address of C memory into an unsafe.Pointer. It goes through
// memory rather than a conversion of a uintptr expression, which go vet
// flags: the address is of C memory, never of a Go object, so no rule of
// unsafe.Pointer is at stake.
func ptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }
