//go:build cgo && fairgo_cgobench

package cgobench

import (
	"testing"

	"github.com/ebitengine/purego"

	"github.com/fairgo/fairgo/internal/dl"
)

func labs(b *testing.B) uintptr {
	h, text := dl.Open("libc.so.6")
	if h == 0 {
		b.Fatal(text)
	}
	p, text := dl.Sym(h, "labs")
	if p == 0 {
		b.Fatal(text)
	}
	if cgoCallLabs(p, -3) != 3 || dl.Call(p, 1<<64-3, 0, 0, 0, 0, 0, 0) != 3 {
		b.Fatal("labs(-3) != 3")
	}
	return p
}

// BenchmarkCgo: the old path, a cgo shim calling through a function pointer.
func BenchmarkCgo(b *testing.B) {
	fn := labs(b)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		cgoCallLabs(fn, int64(-i))
	}
}

// BenchmarkDlCall: dl.Call, the path of every driver and NCCL call.
func BenchmarkDlCall(b *testing.B) {
	fn := labs(b)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		dl.Call(fn, uintptr(-i), 0, 0, 0, 0, 0, 0)
	}
}

// BenchmarkSyscallN: purego.SyscallN, for comparison.
func BenchmarkSyscallN(b *testing.B) {
	fn := labs(b)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		purego.SyscallN(fn, uintptr(-i))
	}
}

// BenchmarkRegisterFunc: purego.RegisterFunc (reflection), for comparison.
func BenchmarkRegisterFunc(b *testing.B) {
	var f func(int64) int64
	purego.RegisterFunc(&f, labs(b))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		f(int64(-i))
	}
}
