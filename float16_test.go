package fairgo_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/internal/elem"
)

// TestSixteenBitKnownPatterns: the public conversions give the bit
// patterns IEEE 754 and bfloat16 define, for the values where rounding is
// easiest to get wrong (ties, the largest finite value, subnormals, NaN).
func TestSixteenBitKnownPatterns(t *testing.T) {
	f := math.Float32frombits
	for _, tc := range []struct {
		name     string
		in       float32
		half, bf uint16
	}{
		{"zero", 0, 0x0000, 0x0000},
		{"negative zero", float32(math.Copysign(0, -1)), 0x8000, 0x8000},
		{"one", 1, 0x3c00, 0x3f80},
		{"minus two", -2, 0xc000, 0xc000},
		{"+Inf", float32(math.Inf(1)), 0x7c00, 0x7f80},
		{"-Inf", float32(math.Inf(-1)), 0xfc00, 0xff80},
		{"largest half", 65504, 0x7bff, 0x4780},
		{"half overflows past 65520", 65520, 0x7c00, 0x4780},
		{"rounds down to 65504", 65519, 0x7bff, 0x4780},
		{"smallest normal half 2^-14", f(0x38800000), 0x0400, 0x3880},
		{"smallest subnormal half 2^-24", f(0x33800000), 0x0001, 0x3380},
		{"2^-25 ties to even zero", f(0x33000000), 0x0000, 0x3300},
		{"1.5 × 2^-25 rounds up", f(0x33400000), 0x0001, 0x3340},
		{"1 + 2^-11 ties to even 1", f(0x3f801000), 0x3c00, 0x3f80},
		{"1 + 3 × 2^-11 ties to even up", f(0x3f803000), 0x3c02, 0x3f80},
		{"bf16 tie 1 + 2^-8 to even 1", f(0x3f808000), 0x3c04, 0x3f80},
		{"bf16 tie 1 + 3 × 2^-8 up", f(0x3f818000), 0x3c0c, 0x3f82},
		{"bf16 above tie rounds up", f(0x3f808001), 0x3c04, 0x3f81},
		{"largest float32 overflows", math.MaxFloat32, 0x7c00, 0x7f80},
		{"smallest float32 subnormal", math.SmallestNonzeroFloat32, 0x0000, 0x0000},
		{"float32 subnormal 2^-127 in bfloat16", f(0x00400000), 0x0000, 0x0040},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equalf(t, tc.half, fairgo.Float32ToFloat16(tc.in), "float16 of %g: %#04x", tc.in, fairgo.Float32ToFloat16(tc.in))
			require.Equalf(t, tc.bf, fairgo.Float32ToBFloat16(tc.in), "bfloat16 of %g: %#04x", tc.in, fairgo.Float32ToBFloat16(tc.in))
		})
	}
	nan := float32(math.NaN())
	require.True(t, math.IsNaN(float64(fairgo.Float16ToFloat32(fairgo.Float32ToFloat16(nan)))))
	require.True(t, math.IsNaN(float64(fairgo.BFloat16ToFloat32(fairgo.Float32ToBFloat16(nan)))))
	// A NaN whose payload lies only in the bits rounding drops stays a
	// NaN, not infinity.
	low := f(0x7f800001)
	require.Equal(t, uint16(0x7e00), fairgo.Float32ToFloat16(low))
	require.Equal(t, uint16(0x7fc0), fairgo.Float32ToBFloat16(low))
}

// TestSixteenBitWidenExact: widening every one of the 65536 patterns is
// exact (it matches internal/elem, which the reductions use, bit for bit,
// NaN payloads included) and narrowing the result gives the pattern back.
func TestSixteenBitWidenExact(t *testing.T) {
	for b := range 1 << 16 {
		h := uint16(b)
		half, bf := fairgo.Float16ToFloat32(h), fairgo.BFloat16ToFloat32(h)
		require.Equal(t, math.Float32bits(elem.Float16ToFloat32(h)), math.Float32bits(half), "float16 %#04x", h)
		require.Equal(t, math.Float32bits(elem.BFloat16ToFloat32(h)), math.Float32bits(bf), "bfloat16 %#04x", h)
		if !math.IsNaN(float64(half)) {
			require.Equal(t, h, fairgo.Float32ToFloat16(half), "float16 %#04x round trip", h)
		}
		if !math.IsNaN(float64(bf)) {
			require.Equal(t, h, fairgo.Float32ToBFloat16(bf), "bfloat16 %#04x round trip", h)
		}
	}
}

// TestSixteenBitNarrowAgainstReference: narrowing agrees with a one-step
// round to nearest even from the exact float64 (internal/elem's encoder,
// an implementation of its own) over float32 patterns spread across every
// exponent, and with every pattern next to a 16-bit value's ties.
func TestSixteenBitNarrowAgainstReference(t *testing.T) {
	check := func(bits uint32) {
		f := math.Float32frombits(bits)
		if math.IsNaN(float64(f)) {
			require.True(t, math.IsNaN(float64(fairgo.Float16ToFloat32(fairgo.Float32ToFloat16(f)))))
			require.True(t, math.IsNaN(float64(fairgo.BFloat16ToFloat32(fairgo.Float32ToBFloat16(f)))))
			return
		}
		require.Equal(t, elem.Float64ToFloat16(float64(f)), fairgo.Float32ToFloat16(f), "float16 of %#08x", bits)
		require.Equal(t, elem.Float64ToBFloat16(float64(f)), fairgo.Float32ToBFloat16(f), "bfloat16 of %#08x", bits)
	}
	for bits := uint64(0); bits < 1<<32; bits += 65521 { // a prime stride: every exponent, scattered mantissas
		check(uint32(bits))
	}
	for h := range 1 << 15 { // around each positive half's tie with the next and each bfloat16's
		hb := math.Float32bits(fairgo.Float16ToFloat32(uint16(h)))
		bb := uint32(h) << 16
		for _, d := range []uint32{0x0fff, 0x1000, 0x1001} {
			check(hb + d)
			check(hb + d | 0x80000000)
		}
		for _, d := range []uint32{0x7fff, 0x8000, 0x8001} {
			check(bb + d)
		}
	}
}

// TestSixteenBitSlices: the slice forms convert element by element.
func TestSixteenBitSlices(t *testing.T) {
	in := []float32{1, -2.5, 65504, 1e-8, float32(math.Inf(1))}
	bf, half := fairgo.Float32sToBFloat16(in), fairgo.Float32sToFloat16(in)
	require.Len(t, bf, len(in))
	for i, v := range in {
		require.Equal(t, fairgo.Float32ToBFloat16(v), bf[i])
		require.Equal(t, fairgo.Float32ToFloat16(v), half[i])
	}
	require.Equal(t, []float32{1, -2.5, 65504, 0, float32(math.Inf(1))}, fairgo.Float16sToFloat32(half))
	require.Equal(t, []float32{1, -2.5, 65536, fairgo.BFloat16ToFloat32(bf[3]), float32(math.Inf(1))}, fairgo.BFloat16sToFloat32(bf))
	require.Empty(t, fairgo.Float32sToFloat16(nil))
	require.Empty(t, fairgo.BFloat16sToFloat32(nil))
}

// TestUpload16: 16-bit bits go to the device and back unchanged; other
// element types are refused with an *ArgError.
func TestUpload16(t *testing.T) {
	dev := simDevice(t)
	for _, dt := range []fairgo.DType{fairgo.Float16, fairgo.BFloat16} {
		bits := []uint16{0x3c00, 0x8001, 0x7e00, 0xffff}
		tn, err := fairgo.Upload16(dev, dt, bits)
		require.NoError(t, err)
		require.Equal(t, dt, tn.DType)
		require.Equal(t, int64(len(bits)), tn.Count)
		got, err := fairgo.Download16(dev, tn)
		require.NoError(t, err)
		require.Equal(t, bits, got)
	}
	var ae *fairgo.ArgError
	_, err := fairgo.Upload16(dev, fairgo.Float32, []uint16{1})
	require.ErrorAs(t, err, &ae)
	f32, err := fairgo.Upload(dev, []float32{1})
	require.NoError(t, err)
	_, err = fairgo.Download16(dev, f32)
	require.ErrorAs(t, err, &ae)
}
