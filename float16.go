package fairgo

import (
	"fmt"
	"math"
)

// 16-bit floats have no Go type, so tensors of Float16 and BFloat16 hold
// their bits as uint16. These conversions are the ones fairgo's own
// reductions use: narrowing rounds to the nearest value, ties to even (as
// CUDA's __float2half_rn and __float2bfloat16_rn do), so that a host
// reference agrees bit for bit with what the GPUs compute; widening is
// exact.

// Float32ToBFloat16 rounds f to the nearest bfloat16 value (ties to even)
// and returns its bits. Values beyond the largest finite bfloat16 become
// infinity; a NaN stays a NaN (quieted, keeping the top of its payload).
func Float32ToBFloat16(f float32) uint16 {
	bits := math.Float32bits(f)
	if bits&0x7f800000 == 0x7f800000 && bits&0x007fffff != 0 { // NaN: truncating could make it infinity
		return uint16(bits>>16) | 0x0040
	}
	bits += 0x7fff + (bits>>16)&1
	return uint16(bits >> 16)
}

// BFloat16ToFloat32 widens the bfloat16 value of bits b exactly.
func BFloat16ToFloat32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// Float32ToFloat16 rounds f to the nearest IEEE 754 binary16 value (ties to
// even) and returns its bits. Values beyond the largest finite half (65504)
// that round past it become infinity, values below the smallest normal
// become subnormals or zero, and a NaN stays a NaN (quieted, keeping the
// top of its payload).
func Float32ToFloat16(f float32) uint16 {
	bits := math.Float32bits(f)
	sign := uint16(bits>>16) & 0x8000
	abs := bits &^ 0x80000000
	switch {
	case abs > 0x7f800000: // NaN
		return sign | 0x7e00 | uint16(abs>>13)&0x03ff
	case abs >= 0x47800000: // ≥ 2^16, or infinity
		return sign | 0x7c00
	case abs < 0x38800000: // below 2^-14: a subnormal half, or zero
		shift := 126 - abs>>23 // the result counts units of 2^-24
		if shift > 25 {
			return sign
		}
		m := abs&0x7fffff | 0x800000
		q, r, half := m>>shift, m&(1<<shift-1), uint32(1)<<(shift-1)
		if r > half || r == half && q&1 == 1 {
			q++
		}
		return sign | uint16(q)
	}
	// A normal half: rebias the exponent and round to nearest even; a carry
	// into the exponent, up to infinity, is right by construction.
	abs += 0xc8000fff + (abs>>13)&1
	return sign | uint16(abs>>13)
}

// Float16ToFloat32 widens the binary16 value of bits h exactly (a NaN keeps
// its payload).
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x03ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// A subnormal, mant × 2^-24: normalise.
	e := uint32(113)
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (mant&0x03ff)<<13)
}

// Float32sToBFloat16 is Float32ToBFloat16 of every element of src: the bits
// to Upload as a BFloat16 tensor's.
func Float32sToBFloat16(src []float32) []uint16 { return narrow(src, Float32ToBFloat16) }

// BFloat16sToFloat32 is BFloat16ToFloat32 of every element of src.
func BFloat16sToFloat32(src []uint16) []float32 { return widen(src, BFloat16ToFloat32) }

// Float32sToFloat16 is Float32ToFloat16 of every element of src: the bits
// to Upload as a Float16 tensor's.
func Float32sToFloat16(src []float32) []uint16 { return narrow(src, Float32ToFloat16) }

// Float16sToFloat32 is Float16ToFloat32 of every element of src.
func Float16sToFloat32(src []uint16) []float32 { return widen(src, Float16ToFloat32) }

func narrow(src []float32, f func(float32) uint16) []uint16 {
	out := make([]uint16, len(src))
	for i, v := range src {
		out[i] = f(v)
	}
	return out
}

func widen(src []uint16, f func(uint16) float32) []float32 {
	out := make([]float32, len(src))
	for i, v := range src {
		out[i] = f(v)
	}
	return out
}

// Upload16 allocates a tensor of len(bits) elements of dt, Float16 or
// BFloat16, on dev and copies bits into it: Upload for the 16-bit floats,
// which have no Go type (Float32sToBFloat16 and Float32sToFloat16 make the
// bits).
func Upload16(dev HostCopier, dt DType, bits []uint16) (Tensor, error) {
	if dt != Float16 && dt != BFloat16 {
		return Tensor{}, &ArgError{Arg: "dtype", Value: dt, Reason: "not float16 or bfloat16"}
	}
	t, err := dev.AllocTensor(int64(len(bits)), dt)
	if err != nil {
		return Tensor{}, err
	}
	if len(bits) == 0 {
		return t, nil
	}
	b := make([]byte, 2*len(bits))
	for i, v := range bits {
		b[2*i], b[2*i+1] = byte(v), byte(v>>8) // little-endian, as devices store them
	}
	if err := dev.Upload(t.Ptr, b); err != nil {
		return Tensor{}, fmt.Errorf("fairgo: uploading %d %v: %w", len(bits), dt, err)
	}
	return t, nil
}

// Download16 copies the bits of t, a Float16 or BFloat16 tensor of dev,
// into a new slice (BFloat16sToFloat32 and Float16sToFloat32 widen them).
// It waits as Download does.
func Download16(dev HostCopier, t Tensor) ([]uint16, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if t.DType != Float16 && t.DType != BFloat16 {
		return nil, &ArgError{Arg: "tensor", Value: t.DType, Reason: "holds neither float16 nor bfloat16"}
	}
	out := make([]uint16, t.Count)
	if t.Count == 0 {
		return out, nil
	}
	b := make([]byte, t.ByteLen())
	if err := dev.Download(b, t.Ptr); err != nil {
		return nil, fmt.Errorf("fairgo: downloading %d %v: %w", t.Count, t.DType, err)
	}
	for i := range out {
		out[i] = uint16(b[2*i]) | uint16(b[2*i+1])<<8
	}
	return out, nil
}
