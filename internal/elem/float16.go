package elem

import "math"

// Float32ToFloat16 rounds f to the nearest IEEE 754 binary16 value (ties to
// even), returning its bits. Values beyond the largest finite half overflow to
// infinity, tiny values become half denormals or zero, and a NaN stays a NaN
// (quieted, keeping the top bits of its payload).
func Float32ToFloat16(f float32) uint16 { return f16FromBits(math.Float32bits(f)) }

// f16FromBits is Float32ToFloat16 on float32 bits, in integer arithmetic
// only (the bulk paths call it without float/bit conversions per element).
func f16FromBits(bits uint32) uint16 {
	sign := uint16(bits>>16) & 0x8000
	abs := bits &^ 0x80000000
	switch {
	case abs > 0x7f800000: // NaN
		return sign | 0x7e00 | uint16(abs>>13)&0x03ff
	case abs >= 0x47800000: // ≥ 2^16 or infinity
		return sign | 0x7c00
	case abs < 0x38800000: // below 2^-14: a denormal half or zero
		e := abs >> 23
		shift := 126 - e // the result counts units of 2^-24
		if shift > 25 {
			return sign
		}
		return sign | uint16(roundShift(uint64(abs&0x7fffff|0x800000), uint(shift)))
	}
	// Normal (after F. Giesen's float_to_half_fast3_rtne): rebias the
	// exponent and round to nearest even; a carry into the exponent, up to
	// infinity, is correct by construction.
	abs += 0xc8000fff + (abs>>13)&1
	return sign | uint16(abs>>13)
}

// Float64ToFloat16 rounds v to the nearest binary16 value (ties to even) in
// one step, without the double rounding of going through float32.
func Float64ToFloat16(v float64) uint16 { return uint16(encode(v, 5, 10)) }

// Float16ToFloat32 widens a binary16 value exactly (a NaN keeps its payload).
func Float16ToFloat32(h uint16) float32 { return math.Float32frombits(f16Bits(h)) }

// f16Bits is Float16ToFloat32 returning float32 bits, in integer arithmetic.
func f16Bits(h uint16) uint32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x03ff)
	switch {
	case exp == 0x1f:
		return sign | 0x7f800000 | mant<<13
	case exp != 0:
		return sign | (exp+112)<<23 | mant<<13
	case mant == 0:
		return sign
	}
	// A denormal, mant × 2^-24: normalize.
	e := uint32(113)
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return sign | e<<23 | (mant&0x03ff)<<13
}

// Float32ToBFloat16 rounds f to the nearest bfloat16 value (ties to even),
// returning its bits. Overflow gives infinity; a NaN stays a NaN (quieted,
// keeping the top bits of its payload).
func Float32ToBFloat16(f float32) uint16 { return bf16FromBits(math.Float32bits(f)) }

func bf16FromBits(bits uint32) uint16 {
	if bits&0x7f800000 == 0x7f800000 && bits&0x007fffff != 0 {
		return uint16(bits>>16) | 0x0040
	}
	bits += 0x7fff + (bits>>16)&1
	return uint16(bits >> 16)
}

// Float64ToBFloat16 rounds v to the nearest bfloat16 value (ties to even) in
// one step.
func Float64ToBFloat16(v float64) uint16 { return uint16(encode(v, 8, 7)) }

// BFloat16ToFloat32 widens a bfloat16 value exactly.
func BFloat16ToFloat32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// encode rounds v to the nearest value (ties to even) of a binary format with
// expBits exponent bits and mantBits fraction bits (at most 16 bits in all),
// and returns the encoding.
func encode(v float64, expBits, mantBits uint) uint64 {
	bits := math.Float64bits(v)
	signOut := (bits >> 63) << (expBits + mantBits)
	exp := int((bits >> 52) & 0x7ff)
	mant := bits & (1<<52 - 1)
	maxExp := uint64(1)<<expBits - 1
	inf := signOut | maxExp<<mantBits
	switch {
	case exp == 0x7ff && mant != 0: // NaN: quiet, keep the top payload bits
		return inf | 1<<(mantBits-1) | (mant>>(52-mantBits))&(1<<mantBits-1)
	case exp == 0x7ff:
		return inf
	case exp == 0: // zero or a float64 denormal, far below half the smallest target denormal
		return signOut
	}
	bias := 1<<(expBits-1) - 1
	e := exp - 1023
	m := mant | 1<<52 // value = m × 2^(e-52)
	minNormal := 1 - bias
	if e >= minNormal {
		outExp := uint64(e + bias)
		if outExp >= maxExp {
			return inf
		}
		r := roundShift(m, 52-mantBits) // in [2^mantBits, 2^(mantBits+1)]
		enc := outExp<<mantBits + r - 1<<mantBits
		if enc >= maxExp<<mantBits {
			return inf
		}
		return signOut | enc
	}
	shift := 52 - int(mantBits) + (minNormal - e)
	if shift > 60 {
		return signOut
	}
	// A denormal; a carry into the smallest normal encodes correctly by itself.
	return signOut | roundShift(m, uint(shift))
}

// roundShift returns m / 2^s rounded to the nearest integer, ties to even.
func roundShift(m uint64, s uint) uint64 {
	q := m >> s
	rem := m & (1<<s - 1)
	half := uint64(1) << (s - 1)
	if rem > half || (rem == half && q&1 == 1) {
		q++
	}
	return q
}
