package elem

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestFloat16RoundTripEveryPattern(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		f := Float16ToFloat32(h)
		if h&0x7c00 == 0x7c00 && h&0x03ff != 0 {
			require.True(t, math.IsNaN(float64(f)), "%#04x", h)
			back := Float32ToFloat16(f)
			require.True(t, back&0x7c00 == 0x7c00 && back&0x03ff != 0, "NaN %#04x came back as %#04x", h, back)
			continue
		}
		require.Equal(t, h, Float32ToFloat16(f), "%#04x -> %v", h, f)
		require.Equal(t, h, Float64ToFloat16(float64(f)), "%#04x -> %v", h, f)
	}
}

func TestBFloat16RoundTripEveryPattern(t *testing.T) {
	for i := range 1 << 16 {
		b := uint16(i)
		f := BFloat16ToFloat32(b)
		if b&0x7f80 == 0x7f80 && b&0x007f != 0 {
			require.True(t, math.IsNaN(float64(f)), "%#04x", b)
			back := Float32ToBFloat16(f)
			require.True(t, back&0x7f80 == 0x7f80 && back&0x007f != 0, "NaN %#04x came back as %#04x", b, back)
			continue
		}
		require.Equal(t, b, Float32ToBFloat16(f), "%#04x -> %v", b, f)
		require.Equal(t, b, Float64ToBFloat16(float64(f)), "%#04x -> %v", b, f)
	}
}

func TestFloat16KnownValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   float64
		want uint16
	}{
		{"one", 1, 0x3c00},
		{"minus two", -2, 0xc000},
		{"negative zero", math.Copysign(0, -1), 0x8000},
		{"tenth", 0.1, 0x2e66},
		{"max finite", 65504, 0x7bff},
		{"just below overflow threshold", 65519.99, 0x7bff},
		{"overflow threshold ties to inf", 65520, 0x7c00},
		{"huge", 1e10, 0x7c00},
		{"minus huge", -1e10, 0xfc00},
		{"inf", math.Inf(1), 0x7c00},
		{"tie to even down", 1 + 1.0/2048, 0x3c00},
		{"tie to even up", 1 + 3.0/2048, 0x3c02},
		{"above tie", 1 + 1.0/2048 + 1.0/(1<<40), 0x3c01}, // float32 first would double-round to 0x3c00
		{"smallest denormal", 1.0 / (1 << 24), 0x0001},
		{"half smallest denormal ties to zero", 1.0 / (1 << 25), 0x0000},
		{"above half smallest denormal", 1.5 / (1 << 25), 0x0001},
		{"largest denormal", 1023.0 / (1 << 24), 0x03ff},
		{"denormal rounds up to smallest normal", 1023.75 / (1 << 24), 0x0400},
		{"smallest normal", 1.0 / (1 << 14), 0x0400},
		{"float32 denormal", 1e-40, 0x0000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, Float64ToFloat16(tc.in), "%#04x", Float64ToFloat16(tc.in))
			if f32 := float32(tc.in); float64(f32) == tc.in {
				require.Equal(t, tc.want, Float32ToFloat16(f32))
			}
		})
	}
	require.True(t, math.IsNaN(float64(Float16ToFloat32(Float32ToFloat16(float32(math.NaN()))))))
	require.Equal(t, float32(1.0/(1<<24)), Float16ToFloat32(1))
	require.Equal(t, float32(-65504), Float16ToFloat32(0xfbff))
}

func TestBFloat16KnownValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   float64
		want uint16
	}{
		{"one", 1, 0x3f80},
		{"minus one", -1, 0xbf80},
		{"tie to even down", 1 + 1.0/256, 0x3f80},
		{"tie to even up", 1 + 3.0/256, 0x3f82},
		{"max finite", float64(math.Float32frombits(0x7f7f0000)), 0x7f7f},
		{"overflow", math.MaxFloat32, 0x7f80},
		{"inf", math.Inf(-1), 0xff80},
		{"float32 denormal", float64(math.Float32frombits(0x00010000)), 0x0001},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, Float64ToBFloat16(tc.in))
			require.Equal(t, tc.want, Float32ToBFloat16(float32(tc.in)))
		})
	}
	require.True(t, math.IsNaN(float64(BFloat16ToFloat32(Float32ToBFloat16(float32(math.NaN()))))))
}

// format describes a 16-bit float format for the nearest-value property.
type format struct {
	name       string
	toF32      func(uint16) float32
	fromF32    func(float32) uint16
	fromF64    func(float64) uint16
	inf        uint16  // +inf bits
	infAsValue float64 // where infinity sits for rounding: max finite + one ulp
}

var formats = []format{
	{"float16", Float16ToFloat32, Float32ToFloat16, Float64ToFloat16, 0x7c00, 65536},
	{"bfloat16", BFloat16ToFloat32, Float32ToBFloat16, Float64ToBFloat16, 0x7f80, math.Ldexp(1, 128)},
}

// checkNearest verifies that h is a nearest representable value of v, ties
// to even, comparing with both magnitude neighbours.
func checkNearest(t *rapid.T, f format, v float64, h uint16) {
	if math.IsInf(v, 0) {
		if h&0x7fff != f.inf {
			t.Fatalf("%s: %v became %#04x", f.name, v, h)
		}
		return
	}
	mag := h & 0x7fff
	if mag > f.inf {
		t.Fatalf("%s: %v became NaN %#04x", f.name, v, h)
	}
	if v != 0 && (h&0x8000 != 0) != (v < 0) {
		t.Fatalf("%s: %v became %#04x with the wrong sign", f.name, v, h)
	}
	value := func(m uint16) float64 {
		if m == f.inf {
			return f.infAsValue
		}
		return float64(f.toF32(m))
	}
	a := math.Abs(v)
	d := math.Abs(a - value(mag))
	for _, nb := range []int{int(mag) - 1, int(mag) + 1} {
		if nb < 0 || nb > int(f.inf) {
			continue
		}
		dn := math.Abs(a - value(uint16(nb)))
		if dn < d || (dn == d && mag&1 == 1) {
			t.Fatalf(
				"%s: %v became %#04x (%v) but %#04x (%v) is nearer or an even tie",
				f.name,
				v,
				h,
				value(mag),
				nb,
				value(uint16(nb)),
			)
		}
	}
}

func TestRoundingIsNearest(t *testing.T) {
	for _, f := range formats {
		t.Run(f.name+"/float32", rapid.MakeCheck(func(t *rapid.T) {
			x := math.Float32frombits(rapid.Uint32().Draw(t, "bits"))
			if math.IsNaN(float64(x)) {
				t.Skip("NaN")
			}
			checkNearest(t, f, float64(x), f.fromF32(x))
		}))
		t.Run(f.name+"/float64", rapid.MakeCheck(func(t *rapid.T) {
			// Mostly values near the format's range, with arbitrary low bits.
			x := math.Ldexp(rapid.Float64Range(-2, 2).Draw(t, "frac"), rapid.IntRange(-140, 130).Draw(t, "exp"))
			checkNearest(t, f, x, f.fromF64(x))
		}))
		t.Run(f.name+"/ties", rapid.MakeCheck(func(t *rapid.T) {
			// Exact midpoints between neighbours must go to the even one.
			m := rapid.Uint16Range(0, f.inf-1).Draw(t, "mag")
			lo, hi := float64(f.toF32(m)), f.infAsValue
			if m+1 < f.inf {
				hi = float64(f.toF32(m + 1))
			}
			mid := (lo + hi) / 2
			got := f.fromF64(mid)
			want := m
			if m&1 == 1 {
				want = m + 1
			}
			if got != want {
				t.Fatalf("%s: midpoint %v of %#04x and %#04x became %#04x", f.name, mid, m, m+1, got)
			}
		}))
	}
}
