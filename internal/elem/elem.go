// Package elem is fairgo's host-side element arithmetic: conversions between
// float32 and the 16-bit float formats, little-endian element access, and the
// reductions of one NCCL ring hop (Combine) and of the add-stage kernel
// (ReduceShards) with their exact rounding. The simulated backend computes
// with it, and tests everywhere build inputs and references with it.
package elem

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/fairgo/fairgo"
)

// Get reads element i of b as float64 (64-bit integers beyond 2^53 lose
// precision: use GetInt or GetUint for exact values). It returns NaN for an
// invalid type. Like slice indexing, i must be in range.
func Get(dt fairgo.DType, b []byte, i int) float64 {
	switch dt {
	case fairgo.Float16:
		return float64(Float16ToFloat32(binary.LittleEndian.Uint16(b[2*i:])))
	case fairgo.BFloat16:
		return float64(BFloat16ToFloat32(binary.LittleEndian.Uint16(b[2*i:])))
	case fairgo.Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	case fairgo.Float64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	case fairgo.Int8, fairgo.Int32, fairgo.Int64:
		return float64(GetInt(dt, b, i))
	case fairgo.Uint8, fairgo.Uint32, fairgo.Uint64:
		return float64(GetUint(dt, b, i))
	}
	return math.NaN()
}

// Set writes v into element i of b. Floating-point types round to nearest
// (ties to even, in one step); integer types truncate toward zero and wrap
// modulo 2^bits (NaN and infinities write 0). Invalid types write nothing.
func Set(dt fairgo.DType, b []byte, i int, v float64) {
	switch dt {
	case fairgo.Float16:
		binary.LittleEndian.PutUint16(b[2*i:], Float64ToFloat16(v))
	case fairgo.BFloat16:
		binary.LittleEndian.PutUint16(b[2*i:], Float64ToBFloat16(v))
	case fairgo.Float32:
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
	case fairgo.Float64:
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	default:
		SetUint(dt, b, i, wrapFloat(v))
	}
}

// wrapFloat truncates v toward zero and reduces it modulo 2^64.
func wrapFloat(v float64) uint64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	r := math.Mod(math.Trunc(v), 1<<64) // exact, |r| < 2^64
	if r < 0 {
		return -uint64(-r)
	}
	return uint64(r)
}

// GetInt reads element i of an integer type exactly, sign-extending signed
// types (an unsigned 64-bit value above MaxInt64 reads as its two's
// complement). Floating-point elements are truncated toward zero and
// saturated to the int64 range (NaN reads as 0).
func GetInt(dt fairgo.DType, b []byte, i int) int64 {
	switch dt {
	case fairgo.Int8:
		return int64(int8(b[i]))
	case fairgo.Uint8:
		return int64(b[i])
	case fairgo.Int32:
		return int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	case fairgo.Uint32:
		return int64(binary.LittleEndian.Uint32(b[4*i:]))
	case fairgo.Int64, fairgo.Uint64:
		return int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	v := math.Trunc(Get(dt, b, i))
	switch {
	case math.IsNaN(v):
		return 0
	case v >= math.MaxInt64:
		return math.MaxInt64
	case v <= math.MinInt64:
		return math.MinInt64
	}
	return int64(v)
}

// GetUint reads element i of an integer type exactly as a uint64: unsigned
// types zero-extend, signed types sign-extend (two's complement).
// Floating-point elements read as uint64(GetInt(...)).
func GetUint(dt fairgo.DType, b []byte, i int) uint64 {
	switch dt {
	case fairgo.Uint8:
		return uint64(b[i])
	case fairgo.Uint32:
		return uint64(binary.LittleEndian.Uint32(b[4*i:]))
	case fairgo.Uint64:
		return binary.LittleEndian.Uint64(b[8*i:])
	}
	return uint64(GetInt(dt, b, i))
}

// SetInt writes v into element i, wrapping for integer types and rounding to
// nearest for floating-point types.
func SetInt(dt fairgo.DType, b []byte, i int, v int64) {
	if dt.IsFloat() {
		Set(dt, b, i, float64(v))
		return
	}
	SetUint(dt, b, i, uint64(v))
}

// SetUint writes the low bits of v into element i of an integer type
// (wrapping); for floating-point types it rounds float64(v) to nearest.
func SetUint(dt fairgo.DType, b []byte, i int, v uint64) {
	switch dt {
	case fairgo.Int8, fairgo.Uint8:
		b[i] = byte(v)
	case fairgo.Int32, fairgo.Uint32:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	case fairgo.Int64, fairgo.Uint64:
		binary.LittleEndian.PutUint64(b[8*i:], v)
	case fairgo.Float16, fairgo.BFloat16, fairgo.Float32, fairgo.Float64:
		Set(dt, b, i, float64(v))
	}
}

// Combine computes acc[i] = op(acc[i], x[i]) for every element, rounded in
// the element type (16-bit floats are widened to float32, combined and
// rounded back every time): one hop of an NCCL ring. Avg combines as Sum
// (its division is separate); integers wrap. Max and Min propagate NaN: if
// either operand is NaN the result is NaN (CUDA's fmaxf would return the
// other operand).
func Combine(dt fairgo.DType, op fairgo.Op, acc, x []byte) error {
	if err := check(dt, op, len(acc)); err != nil {
		return err
	}
	if len(x) != len(acc) {
		return fmt.Errorf("elem: combine of %d bytes with %d bytes: %w", len(acc), len(x), fairgo.ErrInvalidArgument)
	}
	if fastCombine(dt, op, acc, x) {
		return nil
	}
	n := len(acc) / dt.Size()
	switch dt {
	case fairgo.Float32:
		combine(n, acc, x, ldF32, stF32, opFunc[float32](op))
	case fairgo.Float64:
		combine(n, acc, x, ldF64, stF64, opFunc[float64](op))
	case fairgo.Int8:
		combine(n, acc, x, ldI8, stI8, opFunc[int8](op))
	case fairgo.Uint8:
		combine(n, acc, x, ldU8, stU8, opFunc[uint8](op))
	case fairgo.Int32:
		combine(n, acc, x, ldI32, stI32, opFunc[int32](op))
	case fairgo.Uint32:
		combine(n, acc, x, ldU32, stU32, opFunc[uint32](op))
	case fairgo.Int64:
		combine(n, acc, x, ldI64, stI64, opFunc[int64](op))
	case fairgo.Uint64:
		combine(n, acc, x, ldU64, stU64, opFunc[uint64](op))
	}
	return nil
}

// ReduceShards computes dst[i] = op over k of srcs[k][i] with the semantics
// of the add-stage kernel: float16 and bfloat16 accumulate in float32 and
// round once at the end; float32 and float64 accumulate in their own type;
// integers wrap in their own type; sources are combined in order. For Avg
// of floats every term is multiplied by 1/divisor in the accumulation type
// before it sums (so no partial sum overflows where the average would not);
// integer Avg truncates the wrapping sum toward zero. Every source must be
// as long as dst; dst may alias srcs[0].
func ReduceShards(dt fairgo.DType, op fairgo.Op, dst []byte, srcs [][]byte, divisor int) error {
	if err := check(dt, op, len(dst)); err != nil {
		return err
	}
	if len(srcs) == 0 {
		return fmt.Errorf("elem: reduce of no sources: %w", fairgo.ErrInvalidArgument)
	}
	for k, s := range srcs {
		if len(s) != len(dst) {
			return fmt.Errorf(
				"elem: reduce source %d has %d bytes, destination %d: %w",
				k,
				len(s),
				len(dst),
				fairgo.ErrInvalidArgument,
			)
		}
	}
	if op == fairgo.Avg && divisor < 1 {
		return fmt.Errorf("elem: avg divisor %d must be at least 1: %w", divisor, fairgo.ErrInvalidArgument)
	}
	if fastReduce(dt, op, dst, srcs, divisor) {
		return nil
	}
	avg := op == fairgo.Avg
	n := len(dst) / dt.Size()
	switch dt {
	case fairgo.Float32:
		reduce(n, dst, srcs, ldF32, stF32, opFunc[float32](op), when(avg, floatScale[float32](divisor)), nil)
	case fairgo.Float64:
		reduce(n, dst, srcs, ldF64, stF64, opFunc[float64](op), when(avg, floatScale[float64](divisor)), nil)
	case fairgo.Int8:
		reduce(n, dst, srcs, ldI8, stI8, opFunc[int8](op), nil, when(avg, intDiv[int8](divisor)))
	case fairgo.Uint8:
		reduce(n, dst, srcs, ldU8, stU8, opFunc[uint8](op), nil, when(avg, uintDiv[uint8](divisor)))
	case fairgo.Int32:
		reduce(n, dst, srcs, ldI32, stI32, opFunc[int32](op), nil, when(avg, intDiv[int32](divisor)))
	case fairgo.Uint32:
		reduce(n, dst, srcs, ldU32, stU32, opFunc[uint32](op), nil, when(avg, uintDiv[uint32](divisor)))
	case fairgo.Int64:
		reduce(n, dst, srcs, ldI64, stI64, opFunc[int64](op), nil, when(avg, intDiv[int64](divisor)))
	case fairgo.Uint64:
		reduce(n, dst, srcs, ldU64, stU64, opFunc[uint64](op), nil, when(avg, uintDiv[uint64](divisor)))
	}
	return nil
}

// when returns f if cond holds, else nil.
func when[T any](cond bool, f func(T) T) func(T) T {
	if cond {
		return f
	}
	return nil
}

// Scale divides every element of b by divisor in place, as Avg does after a
// sum: 16-bit floats divide in float32 and round back, float32 and float64
// divide in their own type, integers truncate toward zero.
func Scale(dt fairgo.DType, b []byte, divisor int) error {
	if err := check(dt, fairgo.Sum, len(b)); err != nil {
		return err
	}
	if divisor < 1 {
		return fmt.Errorf("elem: divisor %d must be at least 1: %w", divisor, fairgo.ErrInvalidArgument)
	}
	if fastScale(dt, b, divisor) {
		return nil
	}
	n := len(b) / dt.Size()
	switch dt {
	case fairgo.Float32:
		mapInPlace(n, b, ldF32, stF32, floatDiv[float32](divisor))
	case fairgo.Float64:
		mapInPlace(n, b, ldF64, stF64, floatDiv[float64](divisor))
	case fairgo.Int8:
		mapInPlace(n, b, ldI8, stI8, intDiv[int8](divisor))
	case fairgo.Uint8:
		mapInPlace(n, b, ldU8, stU8, uintDiv[uint8](divisor))
	case fairgo.Int32:
		mapInPlace(n, b, ldI32, stI32, intDiv[int32](divisor))
	case fairgo.Uint32:
		mapInPlace(n, b, ldU32, stU32, uintDiv[uint32](divisor))
	case fairgo.Int64:
		mapInPlace(n, b, ldI64, stI64, intDiv[int64](divisor))
	case fairgo.Uint64:
		mapInPlace(n, b, ldU64, stU64, uintDiv[uint64](divisor))
	}
	return nil
}

// PreMulInverse multiplies every element of a floating-point b by 1/ranks, the
// way NCCL's Avg prepares each rank's input: the scalar is rounded to the
// element type (through float32 for the 16-bit types, as NCCL does), and
// every product is rounded in the element type.
func PreMulInverse(dt fairgo.DType, b []byte, ranks int) error {
	if err := check(dt, fairgo.Sum, len(b)); err != nil {
		return err
	}
	if ranks < 1 {
		return fmt.Errorf("elem: rank count %d must be at least 1: %w", ranks, fairgo.ErrInvalidArgument)
	}
	inv := 1.0 / float64(ranks)
	n := len(b) / dt.Size()
	switch dt {
	case fairgo.Float16:
		s := Float16ToFloat32(Float32ToFloat16(float32(inv)))
		mapInPlace(n, b, ldF16, stF16, func(v float32) float32 { return v * s })
	case fairgo.BFloat16:
		s := BFloat16ToFloat32(Float32ToBFloat16(float32(inv)))
		mapInPlace(n, b, ldBF16, stBF16, func(v float32) float32 { return v * s })
	case fairgo.Float32:
		s := float32(inv)
		mapInPlace(n, b, ldF32, stF32, func(v float32) float32 { return v * s })
	case fairgo.Float64:
		mapInPlace(n, b, ldF64, stF64, func(v float64) float64 { return v * inv })
	default:
		return fmt.Errorf("elem: pre-multiplying %v elements: %w", dt, fairgo.ErrInvalidArgument)
	}
	return nil
}

func check(dt fairgo.DType, op fairgo.Op, n int) error {
	if !dt.Valid() {
		return fmt.Errorf("elem: element type %v: %w", dt, fairgo.ErrUnknownDType)
	}
	if !op.Valid() {
		return fmt.Errorf("elem: operator %v: %w", op, fairgo.ErrUnknownOp)
	}
	if n%dt.Size() != 0 {
		return fmt.Errorf("elem: %d bytes is not a whole number of %v elements: %w", n, dt, fairgo.ErrInvalidArgument)
	}
	return nil
}
