package elem

import (
	"encoding/binary"
	"math"

	"github.com/fairgo/fairgo"
)

// number is a type elements are computed in.
type number interface {
	~int8 | ~uint8 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~float32 | ~float64
}

type (
	loader[T number] func(b []byte, i int) T
	storer[T number] func(b []byte, i int, v T)
)

func combine[T number](n int, acc, x []byte, ld loader[T], st storer[T], f func(a, b T) T) {
	for i := range n {
		st(acc, i, f(ld(acc, i), ld(x, i)))
	}
}

// reduce combines the sources element by element: term is applied to every
// loaded value (nil: none), fin to the result (nil: none).
func reduce[T number](
	n int,
	dst []byte,
	srcs [][]byte,
	ld loader[T],
	st storer[T],
	f func(a, b T) T,
	term, fin func(T) T,
) {
	if term == nil {
		term = func(v T) T { return v }
	}
	for i := range n {
		acc := term(ld(srcs[0], i))
		for _, s := range srcs[1:] {
			acc = f(acc, term(ld(s, i)))
		}
		if fin != nil {
			acc = fin(acc)
		}
		st(dst, i, acc)
	}
}

func floatScale[T float32 | float64](d int) func(T) T {
	inv := T(1) / T(d)
	return func(v T) T { return v * inv }
}

func mapInPlace[T number](n int, b []byte, ld loader[T], st storer[T], f func(T) T) {
	for i := range n {
		st(b, i, f(ld(b, i)))
	}
}

func isNaN[T number](v T) bool { return v != v }

func opFunc[T number](op fairgo.Op) func(a, b T) T {
	switch op {
	case fairgo.Prod:
		return func(a, b T) T { return a * b }
	case fairgo.Max:
		return func(a, b T) T {
			switch {
			case isNaN(a):
				return a
			case isNaN(b), b > a:
				return b
			}
			return a
		}
	case fairgo.Min:
		return func(a, b T) T {
			switch {
			case isNaN(a):
				return a
			case isNaN(b), b < a:
				return b
			}
			return a
		}
	}
	return func(a, b T) T { return a + b } // Sum and Avg
}

func floatDiv[T float32 | float64](d int) func(T) T {
	q := T(d)
	return func(v T) T { return v / q }
}

func intDiv[T int8 | int32 | int64](d int) func(T) T {
	q := int64(d)
	return func(v T) T { return T(int64(v) / q) }
}

func uintDiv[T uint8 | uint32 | uint64](d int) func(T) T {
	q := uint64(d)
	return func(v T) T { return T(uint64(v) / q) }
}

func ldF16(b []byte, i int) float32 { return Float16ToFloat32(binary.LittleEndian.Uint16(b[2*i:])) }
func stF16(b []byte, i int, v float32) {
	binary.LittleEndian.PutUint16(b[2*i:], Float32ToFloat16(v))
}
func ldBF16(b []byte, i int) float32 { return BFloat16ToFloat32(binary.LittleEndian.Uint16(b[2*i:])) }
func stBF16(b []byte, i int, v float32) {
	binary.LittleEndian.PutUint16(b[2*i:], Float32ToBFloat16(v))
}
func ldF32(b []byte, i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) }
func stF32(b []byte, i int, v float32) {
	binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
}
func ldF64(b []byte, i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:])) }
func stF64(b []byte, i int, v float64) {
	binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
}
func ldI8(b []byte, i int) int8       { return int8(b[i]) }
func stI8(b []byte, i int, v int8)    { b[i] = byte(v) }
func ldU8(b []byte, i int) uint8      { return b[i] }
func stU8(b []byte, i int, v uint8)   { b[i] = v }
func ldI32(b []byte, i int) int32     { return int32(binary.LittleEndian.Uint32(b[4*i:])) }
func stI32(b []byte, i int, v int32)  { binary.LittleEndian.PutUint32(b[4*i:], uint32(v)) }
func ldU32(b []byte, i int) uint32    { return binary.LittleEndian.Uint32(b[4*i:]) }
func stU32(b []byte, i int, v uint32) { binary.LittleEndian.PutUint32(b[4*i:], v) }
func ldI64(b []byte, i int) int64     { return int64(binary.LittleEndian.Uint64(b[8*i:])) }
func stI64(b []byte, i int, v int64)  { binary.LittleEndian.PutUint64(b[8*i:], uint64(v)) }
func ldU64(b []byte, i int) uint64    { return binary.LittleEndian.Uint64(b[8*i:]) }
func stU64(b []byte, i int, v uint64) { binary.LittleEndian.PutUint64(b[8*i:], v) }
