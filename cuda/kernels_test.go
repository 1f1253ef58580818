package cuda

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/fairgo/fairgo"
)

// typeRef is the host reference of one element type: how to load into the
// accumulator, combine, finish and store, as the kernels define it.
type typeRef[T, A any] struct {
	load    func(T) A
	store   func(A) T
	term    func(fairgo.Op, A, int64) A
	combine func(fairgo.Op, A, A) A
	finish  func(fairgo.Op, A, int64) A
	eq      func(T, T) bool
	gen     func(r *rand.Rand, i int64, k int) T
}

type float interface{ float32 | float64 }

type integer interface {
	int8 | uint8 | int32 | uint32 | int64 | uint64
}

func fcombine[A float](op fairgo.Op, a, b A) A {
	switch op {
	case fairgo.Sum, fairgo.Avg:
		return a + b
	case fairgo.Prod:
		return a * b
	case fairgo.Max:
		if a > b || a != a {
			return a
		}
		return b
	default:
		if a < b || a != a {
			return a
		}
		return b
	}
}

// fterm scales every term of a floating-point Avg by 1/d before it sums,
// as the kernel does; nothing is left for ffinish.
func fterm[A float](op fairgo.Op, x A, d int64) A {
	if op == fairgo.Avg {
		return x * (1 / A(d))
	}
	return x
}

func ffinish[A float](_ fairgo.Op, a A, _ int64) A { return a }

func iterm[T integer](_ fairgo.Op, x T, _ int64) T { return x }

func feq[A float](a, b A) bool { return a == b || (a != a && b != b) }

func icombine[T integer](op fairgo.Op, a, b T) T {
	switch op {
	case fairgo.Sum, fairgo.Avg:
		return a + b
	case fairgo.Prod:
		return a * b
	case fairgo.Max:
		return max(a, b)
	default:
		return min(a, b)
	}
}

func ifinish[T integer](op fairgo.Op, a T, d int64) T {
	if op != fairgo.Avg {
		return a
	}
	var zero T
	if zero-1 < 0 { // signed
		return T(int64(a) / d)
	}
	return T(uint64(a) / uint64(d))
}

func intRef[T integer]() typeRef[T, T] {
	return typeRef[T, T]{
		load: func(v T) T { return v }, store: func(v T) T { return v },
		term: iterm[T], combine: icombine[T], finish: ifinish[T], eq: func(a, b T) bool { return a == b },
		gen: func(r *rand.Rand, _ int64, _ int) T { return T(r.Uint64()) },
	}
}

// nanAt puts a NaN into the second source now and then, for the NaN rules.
func nanAt(i int64, k int) bool { return k == 1 && i%997 == 5 }

func floatRef[A float](scale float64) typeRef[A, A] {
	return typeRef[A, A]{
		load: func(v A) A { return v }, store: func(v A) A { return v },
		term: fterm[A], combine: fcombine[A], finish: ffinish[A], eq: feq[A],
		gen: func(r *rand.Rand, i int64, k int) A {
			if nanAt(i, k) {
				return A(nan())
			}
			return A(float64(r.IntN(2000)-1000) * scale)
		},
	}
}

func nan() float64 { var z float64; return z / z }

func halfRef(toF32 func(uint16) float32, fromF32 func(float32) uint16, scale float32) typeRef[uint16, float32] {
	return typeRef[uint16, float32]{
		load: toF32, store: fromF32, term: fterm[float32], combine: fcombine[float32], finish: ffinish[float32],
		eq: func(a, b uint16) bool { return feq(toF32(a), toF32(b)) },
		gen: func(r *rand.Rand, i int64, k int) uint16 {
			if nanAt(i, k) {
				return fromF32(float32(nan()))
			}
			return fromF32(float32(r.IntN(2000)-1000) * scale)
		},
	}
}

var reduceCounts = []int64{0, 1, 7, 4097, 1<<20 + 3}

// layouts: 0 = 16-byte aligned pointers and stride (vector path), 1 = an
// odd stride, 2 = pointers one element off alignment (both scalar).
var layoutNames = []string{"aligned", "odd-stride", "offset"}

func testReduceType[T, A any](t *testing.T, d *Device, s *Stream, dt fairgo.DType, tr typeRef[T, A]) {
	size := int64(dt.Size())
	V := 16 / size
	rng := rand.New(rand.NewPCG(uint64(dt), 7))
	for _, count := range reduceCounts {
		ns := []int{1, 3}
		if count == 4097 {
			ns = append(ns, 8)
		}
		for _, n := range ns {
			for layout := range layoutNames {
				stride := (count+V-1)/V*V + V
				if layout == 1 {
					stride = count + 1
				}
				off := int64(0)
				if layout == 2 {
					off = 1
				}
				srcHost := make([]T, int64(n)*stride+off)
				for k := 0; k < n; k++ {
					for i := int64(0); i < count; i++ {
						srcHost[off+int64(k)*stride+i] = tr.gen(rng, i, k)
					}
				}
				srcBuf := alloc(t, d, max(1, int64(len(srcHost)))*size)
				upload(t, d, srcBuf, srcHost)
				dstLen := count + 2*V + 2
				dstBuf := alloc(t, d, dstLen*size)
				divisor := int64(n + 2)
				for _, op := range fairgo.Ops {
					name := fmt.Sprintf("%v/%v/n=%d/count=%d/%s", dt, op, n, count, layoutNames[layout])
					if err := d.Memset(dstBuf, 0xab, dstLen*size); err != nil {
						t.Fatal(err)
					}
					src, dst := srcBuf+uintptr(off*size), dstBuf+uintptr(off*size)
					if err := d.ReduceAsync(dst, src, n, stride, count, dt, op, int(divisor), s); err != nil {
						t.Fatalf("%s: ReduceAsync: %v", name, err)
					}
					if err := s.Synchronize(); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					got := download[T](t, d, dstBuf, int(dstLen))
					bad := 0
					for i := int64(0); i < count && bad < 5; i++ {
						acc := tr.term(op, tr.load(srcHost[off+i]), divisor)
						for k := 1; k < n; k++ {
							acc = tr.combine(op, acc, tr.term(op, tr.load(srcHost[off+int64(k)*stride+i]), divisor))
						}
						want := tr.store(tr.finish(op, acc, divisor))
						if !tr.eq(got[off+i], want) {
							t.Errorf("%s: element %d = %v, want %v", name, i, got[off+i], want)
							bad++
						}
					}
					// Nothing outside [dst, dst+count) may be written.
					raw := asBytes(got)
					for j := int64(0); j < off*size; j++ {
						if raw[j] != 0xab {
							t.Fatalf("%s: byte %d before dst was written", name, j-off*size)
						}
					}
					for j := (off + count) * size; j < dstLen*size; j++ {
						if raw[j] != 0xab {
							t.Fatalf("%s: byte %d after dst's %d elements was written", name, j-(off+count)*size, count)
						}
					}
				}
				_ = d.Free(srcBuf)
				_ = d.Free(dstBuf)
			}
		}
	}
}

// TestReduce checks every op × dtype at several counts, source counts and
// layouts against the host reference (bit-exact; NaN matches any NaN).
func TestReduce(t *testing.T) {
	d := devices(t, 1)[0]
	s := stream(t, d)
	for _, dt := range fairgo.DTypes {
		t.Run(dt.String(), func(t *testing.T) {
			switch dt {
			case fairgo.Float16:
				testReduceType(t, d, s, dt, halfRef(f16ToF32, f32ToF16, 1.0/128))
			case fairgo.BFloat16:
				testReduceType(t, d, s, dt, halfRef(bf16ToF32, f32ToBF16, 1.0/64))
			case fairgo.Float32:
				testReduceType(t, d, s, dt, floatRef[float32](1.0/1024))
			case fairgo.Float64:
				testReduceType(t, d, s, dt, floatRef[float64](1.0/3))
			case fairgo.Int8:
				testReduceType(t, d, s, dt, intRef[int8]())
			case fairgo.Uint8:
				testReduceType(t, d, s, dt, intRef[uint8]())
			case fairgo.Int32:
				testReduceType(t, d, s, dt, intRef[int32]())
			case fairgo.Uint32:
				testReduceType(t, d, s, dt, intRef[uint32]())
			case fairgo.Int64:
				testReduceType(t, d, s, dt, intRef[int64]())
			case fairgo.Uint64:
				testReduceType(t, d, s, dt, intRef[uint64]())
			default:
				t.Fatalf("no reference for %v", dt)
			}
		})
	}
}

// TestReduceFloat16Rounding pins the 16-bit rules on chosen values: one
// rounding at the end (fp32 accumulation), ties to even, overflow to inf,
// NaN from max/min.
func TestReduceFloat16Rounding(t *testing.T) {
	d := devices(t, 1)[0]
	s := stream(t, d)
	h := f32ToF16
	one, ulp := h(1), h(1.0/1024) // 1 + 2^-11 is halfway between 1 and the next half
	half := func(v float32) uint16 { return h(v) }
	cases := []struct {
		name string
		op   fairgo.Op
		srcs []uint16
		want uint16
	}{
		{
			"fp32 accumulation keeps small terms",
			fairgo.Sum,
			[]uint16{one, half(1.0 / 4096), half(1.0 / 4096), half(1.0 / 4096)},
			h(1 + 1.0/1024),
		},
		{"tie rounds to even", fairgo.Sum, []uint16{one, half(1.0 / 2048)}, one},
		{"overflow to inf", fairgo.Sum, []uint16{h(65504), h(65504)}, 0x7c00},
		{"max with NaN", fairgo.Max, []uint16{one, 0x7e00, h(2)}, 0x7e00},
		{"min with NaN first", fairgo.Min, []uint16{0x7e00, one}, 0x7e00},
		{"avg", fairgo.Avg, []uint16{h(1), h(2), h(4)}, h(7.0 / 3)},
		{"prod", fairgo.Prod, []uint16{h(3), h(-0.5), ulp}, h(-1.5 / 1024)},
	}
	buf := alloc(t, d, 64)
	out := alloc(t, d, 16)
	for _, c := range cases {
		upload(t, d, buf, c.srcs)
		div := len(c.srcs)
		if err := d.ReduceAsync(out, buf, len(c.srcs), 1, 1, fairgo.Float16, c.op, div, s); err != nil {
			t.Fatal(err)
		}
		got := download[uint16](t, d, out, 1)[0]
		if got != c.want && !(f16ToF32(got) != f16ToF32(got) && f16ToF32(c.want) != f16ToF32(c.want)) {
			t.Errorf("%s: got %#04x (%g), want %#04x (%g)", c.name, got, f16ToF32(got), c.want, f16ToF32(c.want))
		}
	}
}

// TestReduceInPlace checks dst equal to one of the sources.
func TestReduceInPlace(t *testing.T) {
	d := devices(t, 1)[0]
	s := stream(t, d)
	const n, count = 3, 10007
	host := make([]float32, n*count)
	for i := range host {
		host[i] = float32(i % 13)
	}
	buf := alloc(t, d, n*count*4)
	upload(t, d, buf, host)
	dst := buf + count*4 // source 1
	if err := d.ReduceAsync(dst, buf, n, count, count, fairgo.Float32, fairgo.Sum, 1, s); err != nil {
		t.Fatal(err)
	}
	got := download[float32](t, d, dst, count)
	for i := range count {
		if want := host[i] + host[count+i] + host[2*count+i]; got[i] != want {
			t.Fatalf("element %d = %v, want %v", i, got[i], want)
		}
	}
}

func TestReduceArgs(t *testing.T) {
	devs := devices(t, 1)
	d := devs[0]
	s := stream(t, d)
	buf := alloc(t, d, 1<<12)
	for _, c := range []struct {
		name          string
		dst, src      uintptr
		n             int
		stride, count int64
		dt            fairgo.DType
		op            fairgo.Op
		divisor       int
	}{
		{"no sources", buf, buf + 1024, 0, 16, 16, fairgo.Float32, fairgo.Sum, 1},
		{"bad dtype", buf, buf + 1024, 1, 16, 16, fairgo.DType(0), fairgo.Sum, 1},
		{"bad op", buf, buf + 1024, 1, 16, 16, fairgo.Float32, fairgo.Op(42), 1},
		{"negative count", buf, buf + 1024, 1, 16, -1, fairgo.Float32, fairgo.Sum, 1},
		{"negative stride", buf, buf + 1024, 2, -16, 16, fairgo.Float32, fairgo.Sum, 1},
		{"avg divisor 0", buf, buf + 1024, 2, 16, 16, fairgo.Float32, fairgo.Avg, 0},
		{"partial overlap", buf + 8, buf, 2, 16, 16, fairgo.Float32, fairgo.Sum, 1},
		{"null", 0, buf, 1, 16, 16, fairgo.Float32, fairgo.Sum, 1},
	} {
		err := d.ReduceAsync(c.dst, c.src, c.n, c.stride, c.count, c.dt, c.op, c.divisor, s)
		if !isInvalid(err) {
			t.Errorf("%s: error %v, want one wrapping fairgo.ErrInvalidArgument", c.name, err)
		}
	}
	if err := d.ReduceAsync(buf, buf+1024, 2, 16, 0, fairgo.Float32, fairgo.Sum, 1, s); err != nil {
		t.Errorf("count 0: %v", err)
	}
	if err := d.ReduceAsync(buf, buf+1024, 1, 16, 16, fairgo.Float32, fairgo.Sum, 1, fakeStream{}); !isInvalid(err) {
		t.Errorf("foreign stream: %v", err)
	}
}

func TestFill(t *testing.T) {
	d := devices(t, 1)[0]
	s := stream(t, d)
	for _, dt := range fairgo.DTypes {
		tn, err := d.AllocTensor(1000, dt)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.FillAsync(tn, -3, 0.5, 10, s); err != nil {
			t.Fatal(err)
		}
		raw := make([]byte, tn.ByteLen())
		if err := d.Download(raw, tn.Ptr); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 1000; i++ {
			v := -3 + 0.5*float64(i%10)
			var got, want float64
			switch dt {
			case fairgo.Float16:
				got, want = float64(f16ToF32(*(*uint16)(unsafe.Pointer(&raw[2*i])))), v
			case fairgo.BFloat16:
				got, want = float64(bf16ToF32(*(*uint16)(unsafe.Pointer(&raw[2*i])))), v
			case fairgo.Float32:
				got, want = float64(*(*float32)(unsafe.Pointer(&raw[4*i]))), v
			case fairgo.Float64:
				got, want = *(*float64)(unsafe.Pointer(&raw[8*i])), v
			case fairgo.Int8:
				got, want = float64(int8(raw[i])), float64(int8(int64(v)))
			case fairgo.Uint8:
				got, want = float64(raw[i]), float64(uint8(int64(v)))
			case fairgo.Int32:
				got, want = float64(*(*int32)(unsafe.Pointer(&raw[4*i]))), float64(int32(int64(v)))
			case fairgo.Uint32:
				got, want = float64(*(*uint32)(unsafe.Pointer(&raw[4*i]))), float64(uint32(int64(v)))
			case fairgo.Int64:
				got, want = float64(*(*int64)(unsafe.Pointer(&raw[8*i]))), float64(int64(v))
			case fairgo.Uint64:
				got, want = float64(*(*uint64)(unsafe.Pointer(&raw[8*i]))), float64(uint64(int64(v)))
			}
			if got != want {
				t.Fatalf("%v element %d = %v, want %v", dt, i, got, want)
			}
		}
		if err := d.Free(tn.Ptr); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReduceBandwidth compares the reduce kernel's memory throughput
// ((n+1)·bytes moved) with a device-to-device copy of the same bytes
// (2·bytes moved). The target is 80% of the copy; below 50% fails.
func TestReduceBandwidth(t *testing.T) {
	if testing.Short() {
		t.Skip("bandwidth measurement skipped in -short mode")
	}
	d := devices(t, 1)[0]
	s := stream(t, d)
	const count = 64 << 20
	const iters = 20
	measure := func(fn func() error) time.Duration {
		for range 3 {
			if err := fn(); err != nil {
				t.Fatal(err)
			}
		}
		el, err := d.TimeRegion(s, func() error {
			for range iters {
				if err := fn(); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return el / iters
	}
	var report strings.Builder
	for _, c := range []struct {
		dt fairgo.DType
		op fairgo.Op
		n  int
	}{{fairgo.Float32, fairgo.Sum, 2}, {fairgo.Float32, fairgo.Sum, 4}, {fairgo.BFloat16, fairgo.Avg, 2},
		{fairgo.Float16, fairgo.Sum, 8}} {
		bytes := int64(count * c.dt.Size())
		src := alloc(t, d, int64(c.n)*bytes)
		dst := alloc(t, d, bytes)
		if err := d.FillAsync(
			fairgo.Tensor{Ptr: src, Bytes: int64(c.n) * bytes, Count: int64(c.n) * count, DType: c.dt}, 1, 1, 100, s,
		); err != nil {
			t.Fatal(err)
		}
		red := measure(func() error {
			return d.ReduceAsync(dst, src, c.n, count, count, c.dt, c.op, c.n, s)
		})
		cp := measure(func() error { return d.CopyAsync(dst, src, bytes, s) })
		redBW := float64(int64(c.n+1)*bytes) / red.Seconds() / 1e9
		cpBW := float64(2*bytes) / cp.Seconds() / 1e9
		ratio := redBW / cpBW
		line := fmt.Sprintf("reduce %v %v n=%d, %d MiB per source: %v = %.0f GB/s; copy %v = %.0f GB/s; ratio %.2f",
			c.dt, c.op, c.n, bytes>>20, red, redBW, cp, cpBW, ratio)
		fmt.Fprintln(&report, line)
		switch {
		case ratio < 0.5:
			t.Errorf("%s: below half of the copy's bandwidth", line)
		case ratio < 0.8:
			t.Logf("BELOW TARGET (80%%): %s", line)
		}
		_ = d.Free(src)
		_ = d.Free(dst)
	}
	t.Logf("%v\n%s", d, report.String())
}

// CopyPairAsync stages a call the way a fingerprint does: device data and
// a few hundred bytes of mapped host memory into one device buffer, and
// back. Every width of the kernel's copy is reached by the sizes and
// offsets; the bytes around each destination stay as they were.
func TestCopyPair(t *testing.T) {
	d := devices(t, 1)[0]
	s := stream(t, d)
	const room, tailRoom, guard = 1<<20 + 64, 4096, 0xa5
	data, stage := alloc(t, d, room), alloc(t, d, room+tailRoom)
	host, err := d.AllocHost(tailRoom)
	if err != nil {
		t.Fatal(err)
	}
	defer d.FreeHost(host)
	mapped, err := d.DevicePointer(host)
	if err != nil {
		t.Fatal(err)
	}
	src := make([]byte, room)
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	for _, n := range []int64{0, 1, 6, 1000, 65536, 1<<20 + 2} {
		for _, off := range []int64{0, 2, 8} {
			for _, tail := range []int64{0, 3, 2376} {
				name := fmt.Sprintf("data %d, offset %d, tail %d", n, off, tail)
				upload(t, d, data, src)
				upload(t, d, stage, make([]byte, room+tailRoom))
				for i := range host {
					host[i] = byte(i*5 + 1)
				}
				at := stage + uintptr(off)
				if err := d.CopyPairAsync(at, data+uintptr(off), n, at+uintptr(n), mapped+uintptr(off), tail, s); err != nil {
					t.Fatalf("%s: in: %v", name, err)
				}
				if err := s.Synchronize(); err != nil {
					t.Fatal(err)
				}
				got := download[byte](t, d, stage, int(room+tailRoom))
				for i, b := range got {
					k := int64(i) - off
					want := byte(0)
					switch {
					case k >= 0 && k < n:
						want = src[i]
					case k >= n && k < n+tail:
						want = host[off+k-n]
					}
					if b != want {
						t.Fatalf("%s: in: stage byte %d = %#x, want %#x", name, i, b, want)
					}
				}
				// Out: the stage back over the data (cleared first) and the
				// tail into host memory (a guard pattern first).
				upload(t, d, data, make([]byte, room))
				for i := range host {
					host[i] = guard
				}
				if err := d.CopyPairAsync(data+uintptr(off), at, n, mapped+uintptr(off), at+uintptr(n), tail, s); err != nil {
					t.Fatalf("%s: out: %v", name, err)
				}
				if err := s.Synchronize(); err != nil {
					t.Fatal(err)
				}
				back := download[byte](t, d, data, room)
				for i, b := range back {
					k := int64(i) - off
					want := byte(0)
					if k >= 0 && k < n {
						want = src[i]
					}
					if b != want {
						t.Fatalf("%s: out: data byte %d = %#x, want %#x", name, i, b, want)
					}
				}
				for i, b := range host {
					k := int64(i) - off
					want := byte(guard)
					if k >= 0 && k < tail {
						want = got[off+n+k]
					}
					if b != want {
						t.Fatalf("%s: out: host byte %d = %#x, want %#x", name, i, b, want)
					}
				}
			}
		}
	}
}

func TestCopyPairArgs(t *testing.T) {
	d := devices(t, 1)[0]
	s := stream(t, d)
	buf := alloc(t, d, 1<<12)
	for _, c := range []struct {
		name                   string
		dst1, src1, dst2, src2 uintptr
		n1, n2                 int64
	}{
		{"negative", buf, buf + 1024, buf + 2048, buf + 3072, -1, 8},
		{"null source", buf, 0, buf + 2048, buf + 3072, 8, 8},
		{"null destination", buf, buf + 1024, 0, buf + 3072, 8, 8},
		{"destination over its source", buf, buf + 4, buf + 2048, buf + 3072, 8, 8},
		{"destinations overlap", buf, buf + 1024, buf + 4, buf + 3072, 8, 8},
		{"destination over the other source", buf, buf + 1024, buf + 2048, buf + 4, 8, 8},
	} {
		if err := d.CopyPairAsync(c.dst1, c.src1, c.n1, c.dst2, c.src2, c.n2, s); !isInvalid(err) {
			t.Errorf("%s: error %v, want one wrapping fairgo.ErrInvalidArgument", c.name, err)
		}
	}
	if err := d.CopyPairAsync(0, 0, 0, 0, 0, 0, s); err != nil {
		t.Errorf("nothing to copy: %v", err)
	}
	if err := d.CopyPairAsync(buf, buf+1024, 8, 0, 0, 0, s); err != nil {
		t.Errorf("one copy: %v", err)
	}
	if err := d.CopyPairAsync(buf, buf+1024, 8, 0, 0, 0, fakeStream{}); !isInvalid(err) {
		t.Errorf("foreign stream: %v", err)
	}
}
