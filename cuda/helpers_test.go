package cuda

import (
	"errors"
	"math"
	"os"
	"testing"
	"unsafe"

	"github.com/fairgo/fairgo"
)

// gpuCount is the number of GPUs; it skips the test when there is no
// driver or no GPU at all (fairgo.ErrNoDevice), and fails it when the
// driver is there but unusable.
func gpuCount(t testing.TB) int {
	t.Helper()
	n, err := Count()
	if errors.Is(err, fairgo.ErrNoDevice) {
		t.Skip(err.Error())
	}
	if err != nil {
		t.Fatalf("counting GPUs: %v", err)
	}
	return n
}

// devices opens the first n GPUs, or skips the test when there are fewer.
func devices(t testing.TB, n int) []*Device {
	t.Helper()
	have := gpuCount(t)
	if have < n {
		t.Skipf("needs %d GPUs, found %d", n, have)
	}
	devs := make([]*Device, n)
	for i := range devs {
		d, err := Open(i)
		if err != nil {
			t.Fatalf("Open(%d): %v", i, err)
		}
		devs[i] = d
		t.Cleanup(func() {
			if err := d.Close(); err != nil {
				t.Errorf("closing %v: %v", d, err)
			}
		})
	}
	return devs
}

// ownContext opens GPU ordinal over a CUDA context of its own
// (openOwnContext), closed at the end of the test.
func ownContext(t testing.TB, ordinal int) *Device {
	t.Helper()
	d, err := openOwnContext(ordinal)
	if err != nil {
		t.Fatalf("openOwnContext(%d): %v", ordinal, err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("closing %v: %v", d, err)
		}
	})
	return d
}

// otherDevice is a device other than the one a cross-device test starts
// from, named for its subtest.
type otherDevice struct {
	name string
	d    *Device
}

// othersOf returns the devices a cross-device test checks d against: on
// every host with a GPU, d's GPU over a CUDA context of its own ("other
// context": to CUDA and to the package another device, whose memory,
// streams and modules are not d's); where there are two GPUs or more,
// another GPU as well ("other GPU"). One GPU is enough for every check.
func othersOf(t testing.TB, d *Device) []otherDevice {
	t.Helper()
	out := []otherDevice{{"other context", ownContext(t, d.Ordinal())}}
	if n := gpuCount(t); n >= 2 {
		o, err := Open((d.Ordinal() + 1) % n)
		if err != nil {
			t.Fatalf("Open(%d): %v", (d.Ordinal()+1)%n, err)
		}
		t.Cleanup(func() {
			if err := o.Close(); err != nil {
				t.Errorf("closing %v: %v", o, err)
			}
		})
		out = append(out, otherDevice{"other GPU", o})
	}
	return out
}

func stream(t testing.TB, d *Device) *Stream {
	t.Helper()
	s, err := d.CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func event(t testing.TB, d *Device) *Event {
	t.Helper()
	e, err := d.CreateEvent(false)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func alloc(t testing.TB, d *Device, bytes int64) uintptr {
	t.Helper()
	p, err := d.Alloc(bytes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Free(p) })
	return p
}

// asBytes views a slice's elements as bytes (no copy).
func asBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
}

func upload[T any](t testing.TB, d *Device, dst uintptr, src []T) {
	t.Helper()
	if err := d.Upload(dst, asBytes(src)); err != nil {
		t.Fatal(err)
	}
}

func download[T any](t testing.TB, d *Device, src uintptr, n int) []T {
	t.Helper()
	out := make([]T, n)
	if err := d.Download(asBytes(out), src); err != nil {
		t.Fatal(err)
	}
	return out
}

func isInvalid(err error) bool { return err != nil && errorsIs(err, fairgo.ErrInvalidArgument) }

func TestMain(m *testing.M) {
	// NVLink multicast must stay off on the shared test hosts.
	if os.Getenv("NCCL_NVLS_ENABLE") == "" {
		os.Setenv("NCCL_NVLS_ENABLE", "0")
	}
	code := m.Run()
	closeJob() // the launcher form's rank, if any
	os.Exit(code)
}

// f16ToF32 and friends mirror reduce.cu's conversions (round to nearest even).
func f16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	e := uint32(h>>10) & 0x1f
	m := uint32(h) & 0x3ff
	switch {
	case e == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | m<<13)
	case e == 0:
		v := float32(m) * (1.0 / (1 << 24))
		return math.Float32frombits(sign | math.Float32bits(v))
	}
	return math.Float32frombits(sign | (e+112)<<23 | m<<13)
}

func f32ToF16(f float32) uint16 {
	x := math.Float32bits(f)
	sign := (x >> 16) & 0x8000
	ax := x & 0x7fffffff
	switch {
	case ax >= 0x7f800000:
		if ax > 0x7f800000 {
			return uint16(sign | 0x7c00 | 0x200 | (ax>>13)&0x3ff)
		}
		return uint16(sign | 0x7c00)
	case ax >= 0x477ff000:
		return uint16(sign | 0x7c00)
	case ax >= 0x38800000:
		r := (ax - 0x38000000) >> 13
		rem := ax & 0x1fff
		if rem > 0x1000 || (rem == 0x1000 && r&1 != 0) {
			r++
		}
		return uint16(sign | r)
	case ax < 0x33000000:
		return uint16(sign)
	}
	e := ax >> 23
	m := ax&0x7fffff | 0x800000
	shift := 126 - e
	r := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && r&1 != 0) {
		r++
	}
	return uint16(sign | r)
}

func bf16ToF32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

func f32ToBF16(f float32) uint16 {
	x := math.Float32bits(f)
	if x&0x7fffffff > 0x7f800000 {
		return uint16(x>>16 | 0x40)
	}
	x += 0x7fff + (x>>16)&1
	return uint16(x >> 16)
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }
