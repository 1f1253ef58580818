package dl

import (
	"strings"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

func libcSym(t testing.TB, name string) uintptr {
	t.Helper()
	h, text := Open("libc.so.6")
	if h == 0 {
		t.Fatalf("dlopen libc.so.6: %s", text)
	}
	p, text := Sym(h, name)
	if p == 0 {
		t.Fatalf("dlsym %s: %s", name, text)
	}
	return p
}

func TestOpenAndSymErrors(t *testing.T) {
	h, text := Open("/nonexistent/libfairgo-missing.so.1")
	if h != 0 || !strings.Contains(text, "libfairgo-missing.so.1") {
		t.Fatalf("Open of a missing file = %#x, %q", h, text)
	}
	lc, text := Open("libc.so.6")
	if lc == 0 {
		t.Fatalf("dlopen libc.so.6: %s", text)
	}
	defer Close(lc)
	if p, text := Sym(lc, "fairgoNoSuchSymbol"); p != 0 || !strings.Contains(text, "fairgoNoSuchSymbol") {
		t.Fatalf("Sym of a missing symbol = %#x, %q", p, text)
	}
}

func TestCallAndStrings(t *testing.T) {
	labs := libcSym(t, "labs")
	n := -42
	if r := Call(labs, uintptr(n), 0, 0, 0, 0, 0, 0); r != 42 {
		t.Errorf("labs(-42) = %d", r)
	}
	// Seven arguments: the seventh goes on the stack on amd64 (variadic: AL
	// is 0, no vector registers).
	snprintf := libcSym(t, "snprintf")
	buf := make([]byte, 64)
	format := append([]byte("%d %d %d %d|"), 0)
	r := Call(snprintf, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(unsafe.Pointer(&format[0])),
		1, uintptr(0xffffffff), 3, 4)
	got := GoString(uintptr(unsafe.Pointer(&buf[0])))
	if got != "1 -1 3 4|" || int32(r) != int32(len(got)) {
		t.Errorf("snprintf wrote %q, returned %d", got, int32(r))
	}
	s := CString("fairgo")
	defer Free(s)
	if GoString(uintptr(s)) != "fairgo" || string(Bytes(uintptr(s), 3)) != "fai" {
		t.Errorf("CString/GoString/Bytes round trip failed: %q", GoString(uintptr(s)))
	}
	if GoString(0) != "" || Bytes(0, 3) != nil {
		t.Error("GoString(0) or Bytes(0) not empty")
	}
	if o := Origin(labs); !strings.Contains(o, "libc") {
		t.Errorf("Origin(labs) = %q, want the C library's file", o)
	}
	if Origin(0) != "" {
		t.Error("Origin(0) not empty")
	}
}

// fakeDriver simulates the driver's per-thread current context with Go
// callbacks, recording every call.
type fakeDriver struct {
	cur      uintptr // the thread's current context
	getErr   uintptr
	setErr   uintptr
	log      []string
	seenCtx  uintptr
	seenArgs []uintptr
	funcs    CtxFuncs
	fn       uintptr
	launch   uintptr
}

var fake fakeDriver

func init() {
	fake.funcs.Get = purego.NewCallback(func(p *uintptr) uintptr {
		fake.log = append(fake.log, "get")
		if fake.getErr != 0 {
			return fake.getErr
		}
		*p = fake.cur
		return 0
	})
	fake.funcs.Set = purego.NewCallback(func(c uintptr) uintptr {
		fake.log = append(fake.log, "set")
		if fake.setErr != 0 {
			return fake.setErr
		}
		fake.cur = c
		return 0
	})
	fake.fn = purego.NewCallback(func(a1, a2, a3, a4, a5, a6 uintptr) uintptr {
		fake.log = append(fake.log, "fn")
		fake.seenCtx = fake.cur
		fake.seenArgs = []uintptr{a1, a2, a3, a4, a5, a6}
		return 77
	})
	fake.launch = purego.NewCallback(func(k, gx, gy, gz, bx, by, bz, shared, stream, params, extra uintptr) uintptr {
		fake.log = append(fake.log, "launch")
		fake.seenCtx = fake.cur
		fake.seenArgs = []uintptr{k, gx, gy, gz, bx, by, bz, shared, stream, params, extra}
		if params != 0 {
			for i := range 3 {
				slot := *(*uintptr)(unsafe.Add(ptr(params), 8*i))
				fake.seenArgs = append(fake.seenArgs, uintptr(*(*uint64)(ptr(slot))))
			}
		}
		return 0
	})
}

func TestCtxFuncs(t *testing.T) {
	const ctxA, ctxB = 0xa000, 0xb000
	cases := []struct {
		name           string
		cur, ctx       uintptr
		getErr, setErr uintptr
		want           uintptr
		log            string
		after          uintptr
	}{
		{"already current", ctxA, ctxA, 0, 0, 77, "get fn", ctxA},
		{"switch and restore", ctxB, ctxA, 0, 0, 77, "get set fn set", ctxB},
		{"none current", 0, ctxA, 0, 0, 77, "get set fn set", 0},
		{"get fails", ctxB, ctxA, 201, 0, 201, "get", ctxB},
		{"set fails", ctxB, ctxA, 0, 202, 202, "get set", ctxB},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fake.cur, fake.getErr, fake.setErr, fake.log, fake.seenCtx = c.cur, c.getErr, c.setErr, nil, 0
			r := fake.funcs.Call(c.ctx, fake.fn, 1, 2, 3, 4, 5, 6)
			if int32(r) != int32(c.want) || strings.Join(fake.log, " ") != c.log || fake.cur != c.after {
				t.Fatalf("result %d, calls %q, current %#x after; want %d, %q, %#x",
					int32(r), fake.log, fake.cur, c.want, c.log, c.after)
			}
			if c.want == 77 {
				if fake.seenCtx != c.ctx {
					t.Errorf("the call ran with %#x current, want %#x", fake.seenCtx, c.ctx)
				}
				for i, a := range fake.seenArgs {
					if a != uintptr(i+1) {
						t.Errorf("argument %d = %d", i+1, a)
					}
				}
			}
		})
	}
}

func TestLaunch(t *testing.T) {
	fake.cur, fake.getErr, fake.setErr, fake.log = 0xb000, 0, 0, nil
	vals := []uint64{11, 1 << 40, 33}
	r := fake.funcs.Launch(0xa000, fake.launch, 0x5, 1, 2, 3, 4, 5, 6, 7, 0x8,
		uintptr(unsafe.Pointer(&vals[0])), uintptr(len(vals)))
	want := []uintptr{5, 1, 2, 3, 4, 5, 6, 7, 8}
	if int32(r) != 0 || strings.Join(fake.log, " ") != "get set launch set" || fake.seenCtx != 0xa000 {
		t.Fatalf("result %d, calls %q, context %#x", int32(r), fake.log, fake.seenCtx)
	}
	for i, w := range want {
		if fake.seenArgs[i] != w {
			t.Errorf("argument %d = %d, want %d", i+1, fake.seenArgs[i], w)
		}
	}
	if fake.seenArgs[9] == 0 || fake.seenArgs[10] != 0 {
		t.Errorf("kernelParams %#x, extra %#x", fake.seenArgs[9], fake.seenArgs[10])
	}
	for i, v := range vals {
		if got := fake.seenArgs[11+i]; uint64(got) != v {
			t.Errorf("parameter %d = %d, want %d", i, got, v)
		}
	}
	fake.log = nil
	fake.funcs.Launch(0xb000, fake.launch, 0x5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0)
	if fake.seenArgs[9] != 0 || strings.Join(fake.log, " ") != "get launch" {
		t.Errorf("no parameters: kernelParams %#x, calls %q", fake.seenArgs[9], fake.log)
	}
}

func TestCallDoesNotAllocate(t *testing.T) {
	labs := libcSym(t, "labs")
	if n := testing.AllocsPerRun(100, func() { Call(labs, 3, 0, 0, 0, 0, 0, 0) }); n != 0 && fastPath {
		t.Errorf("Call allocates %v times", n)
	}
}

// The cost of one C call: BenchmarkCall (this package) and BenchmarkSyscallN
// (purego.SyscallN) call labs. go test -tags fairgo_cgobench adds the same
// call through cgo (cgo_bench_test.go), the way the GPU backend called C
// before.
func BenchmarkCall(b *testing.B) {
	labs := libcSym(b, "labs")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		Call(labs, uintptr(-i), 0, 0, 0, 0, 0, 0)
	}
}

func BenchmarkCall7(b *testing.B) {
	labs := libcSym(b, "labs")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		Call(labs, uintptr(-i), 1, 2, 3, 4, 5, 6)
	}
}

func BenchmarkSyscallN(b *testing.B) {
	labs := libcSym(b, "labs")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		purego.SyscallN(labs, uintptr(-i))
	}
}

func BenchmarkSyscallN7(b *testing.B) {
	labs := libcSym(b, "labs")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		purego.SyscallN(labs, uintptr(-i), 1, 2, 3, 4, 5, 6)
	}
}
