package elem

import (
	"math"
	"unsafe"

	"github.com/fairgo/fairgo"
)

// littleEndian reports whether the host stores numbers little-endian, in
// which case element bytes can be viewed as typed slices.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// view returns b as a []T when the host is little-endian and b is aligned
// for T (the fast paths); ok is false otherwise, and callers fall back to
// element-by-element decoding.
func view[T number | uint16](b []byte) (v []T, ok bool) {
	var zero T
	if !littleEndian || len(b) == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%unsafe.Alignof(zero) != 0 {
		return nil, false
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(zero))), true
}

// combineFast is acc[i] = op(acc[i], x[i]) on typed slices of equal length.
func combineFast[T number](op fairgo.Op, acc, x []T) {
	x = x[:len(acc)]
	switch op {
	case fairgo.Sum, fairgo.Avg:
		for i := range acc {
			acc[i] += x[i]
		}
	case fairgo.Prod:
		for i := range acc {
			acc[i] *= x[i]
		}
	default:
		f := opFunc[T](op)
		for i := range acc {
			acc[i] = f(acc[i], x[i])
		}
	}
}

// tryCombine runs Combine's fast path; false means it did not apply.
func tryCombine[T number](op fairgo.Op, accB, xB []byte) bool {
	acc, ok1 := view[T](accB)
	x, ok2 := view[T](xB)
	if !ok1 || !ok2 {
		return false
	}
	combineFast(op, acc, x)
	return true
}

// tryReduce runs ReduceShards' fast path for types that accumulate in their
// own type: source by source into dst (element-wise the same order).
func tryReduce[T number](op fairgo.Op, dstB []byte, srcsB [][]byte, div func(T) T) bool {
	dst, ok := view[T](dstB)
	if !ok {
		return false
	}
	srcs := make([][]T, len(srcsB))
	for k, b := range srcsB {
		if srcs[k], ok = view[T](b); !ok {
			return false
		}
	}
	copy(dst, srcs[0])
	for _, s := range srcs[1:] {
		combineFast(op, dst, s)
	}
	if op == fairgo.Avg {
		for i := range dst {
			dst[i] = div(dst[i])
		}
	}
	return true
}

// tryAvgFloat runs ReduceShards' fast path for a floating-point Avg: every
// term is scaled by 1/divisor in T before it sums, as the kernel does.
func tryAvgFloat[T float32 | float64](dstB []byte, srcsB [][]byte, divisor int) bool {
	dst, ok := view[T](dstB)
	if !ok {
		return false
	}
	inv := T(1) / T(divisor)
	for k, b := range srcsB {
		s, ok := view[T](b)
		if !ok {
			return false
		}
		for i := range dst {
			if k == 0 {
				dst[i] = s[i] * inv
			} else {
				dst[i] += s[i] * inv
			}
		}
	}
	return true
}

// tryScale runs Scale's fast path.
func tryScale[T number](b []byte, div func(T) T) bool {
	v, ok := view[T](b)
	if !ok {
		return false
	}
	for i := range v {
		v[i] = div(v[i])
	}
	return true
}

// bitsOf views float32 values as their bits (same size and alignment).
func bitsOf(f []float32) []uint32 {
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(f))), len(f))
}

// widen16 converts 16-bit floats (bfloat16 when bf) to float32.
func widen16(dst []float32, src []uint16, bf bool) {
	d := bitsOf(dst)
	src = src[:len(d)]
	if bf {
		for i := range d {
			d[i] = uint32(src[i]) << 16
		}
		return
	}
	for i := range d {
		d[i] = f16Bits(src[i])
	}
}

// narrow16 rounds float32 values to 16-bit floats (bfloat16 when bf).
func narrow16(dst []uint16, src []float32, bf bool) {
	s := bitsOf(src)[:len(dst)]
	if bf {
		for i := range dst {
			dst[i] = bf16FromBits(s[i])
		}
		return
	}
	for i := range dst {
		dst[i] = f16FromBits(s[i])
	}
}

// load16 reads 16-bit float elements, through a typed view when possible.
func load16(dst []float32, b []byte, bf bool) {
	if v, ok := view[uint16](b); ok {
		widen16(dst, v, bf)
		return
	}
	ld := ldF16
	if bf {
		ld = ldBF16
	}
	for i := range dst {
		dst[i] = ld(b, i)
	}
}

// store16 writes 16-bit float elements, through a typed view when possible.
func store16(b []byte, src []float32, bf bool) {
	if v, ok := view[uint16](b); ok {
		narrow16(v, src, bf)
		return
	}
	st := stF16
	if bf {
		st = stBF16
	}
	for i, x := range src {
		st(b, i, x)
	}
}

// combine16 is Combine for the 16-bit floats: widen both operands, combine
// in float32, round back, element by element.
func combine16(op fairgo.Op, acc, x []byte, bf bool) {
	if a, ok := view[uint16](acc); ok && !bf && (op == fairgo.Sum || op == fairgo.Avg) {
		if y, ok := view[uint16](x); ok {
			// The hot path of a float16 ring hop, fused into one loop.
			y = y[:len(a)]
			for i := range a {
				a[i] = f16FromBits(
					math.Float32bits(math.Float32frombits(f16Bits(a[i])) + math.Float32frombits(f16Bits(y[i]))),
				)
			}
			return
		}
	}
	n := len(acc) / 2
	a, y := make([]float32, n), make([]float32, n)
	load16(a, acc, bf)
	load16(y, x, bf)
	combineFast(op, a, y)
	store16(acc, a, bf)
}

// reduce16 is ReduceShards for the 16-bit floats: accumulate in float32
// source by source (element-wise the same order), round once at the end;
// Avg scales every term by 1/divisor in float32 before it sums.
func reduce16(op fairgo.Op, dst []byte, srcs [][]byte, bf, avg bool, divisor int) {
	n := len(dst) / 2
	acc, tmp := make([]float32, n), make([]float32, n)
	inv := float32(1) / float32(divisor)
	load16(acc, srcs[0], bf)
	if avg {
		scaleBy(acc, inv)
	}
	for _, s := range srcs[1:] {
		load16(tmp, s, bf)
		if avg {
			scaleBy(tmp, inv)
		}
		combineFast(op, acc, tmp)
	}
	store16(dst, acc, bf)
}

func scaleBy[T float32 | float64](v []T, s T) {
	for i := range v {
		v[i] *= s
	}
}

// scale16 is Scale for the 16-bit floats.
func scale16(b []byte, divisor int, bf bool) {
	v := make([]float32, len(b)/2)
	load16(v, b, bf)
	q := float32(divisor)
	for i := range v {
		v[i] /= q
	}
	store16(b, v, bf)
}

func fastCombine(dt fairgo.DType, op fairgo.Op, acc, x []byte) bool {
	switch dt {
	case fairgo.Float16, fairgo.BFloat16:
		combine16(op, acc, x, dt == fairgo.BFloat16)
		return true
	case fairgo.Float32:
		return tryCombine[float32](op, acc, x)
	case fairgo.Float64:
		return tryCombine[float64](op, acc, x)
	case fairgo.Int8:
		return tryCombine[int8](op, acc, x)
	case fairgo.Uint8:
		return tryCombine[uint8](op, acc, x)
	case fairgo.Int32:
		return tryCombine[int32](op, acc, x)
	case fairgo.Uint32:
		return tryCombine[uint32](op, acc, x)
	case fairgo.Int64:
		return tryCombine[int64](op, acc, x)
	case fairgo.Uint64:
		return tryCombine[uint64](op, acc, x)
	}
	return false
}

func fastReduce(dt fairgo.DType, op fairgo.Op, dst []byte, srcs [][]byte, divisor int) bool {
	switch dt {
	case fairgo.Float16, fairgo.BFloat16:
		reduce16(op, dst, srcs, dt == fairgo.BFloat16, op == fairgo.Avg, divisor)
		return true
	case fairgo.Float32:
		if op == fairgo.Avg {
			return tryAvgFloat[float32](dst, srcs, divisor)
		}
		return tryReduce(op, dst, srcs, floatDiv[float32](divisor))
	case fairgo.Float64:
		if op == fairgo.Avg {
			return tryAvgFloat[float64](dst, srcs, divisor)
		}
		return tryReduce(op, dst, srcs, floatDiv[float64](divisor))
	case fairgo.Int8:
		return tryReduce(op, dst, srcs, intDiv[int8](divisor))
	case fairgo.Uint8:
		return tryReduce(op, dst, srcs, uintDiv[uint8](divisor))
	case fairgo.Int32:
		return tryReduce(op, dst, srcs, intDiv[int32](divisor))
	case fairgo.Uint32:
		return tryReduce(op, dst, srcs, uintDiv[uint32](divisor))
	case fairgo.Int64:
		return tryReduce(op, dst, srcs, intDiv[int64](divisor))
	case fairgo.Uint64:
		return tryReduce(op, dst, srcs, uintDiv[uint64](divisor))
	}
	return false
}

func fastScale(dt fairgo.DType, b []byte, divisor int) bool {
	switch dt {
	case fairgo.Float16, fairgo.BFloat16:
		scale16(b, divisor, dt == fairgo.BFloat16)
		return true
	case fairgo.Float32:
		return tryScale(b, floatDiv[float32](divisor))
	case fairgo.Float64:
		return tryScale(b, floatDiv[float64](divisor))
	case fairgo.Int8:
		return tryScale(b, intDiv[int8](divisor))
	case fairgo.Uint8:
		return tryScale(b, uintDiv[uint8](divisor))
	case fairgo.Int32:
		return tryScale(b, intDiv[int32](divisor))
	case fairgo.Uint32:
		return tryScale(b, uintDiv[uint32](divisor))
	case fairgo.Int64:
		return tryScale(b, intDiv[int64](divisor))
	case fairgo.Uint64:
		return tryScale(b, uintDiv[uint64](divisor))
	}
	return false
}
