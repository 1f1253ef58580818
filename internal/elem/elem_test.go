package elem

import (
	"math"
	"testing"

	"github.com/fairgo/fairgo"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// vals builds a buffer of dt holding vs (rounded/wrapped by Set).
func vals(dt fairgo.DType, vs ...float64) []byte {
	b := make([]byte, len(vs)*dt.Size())
	for i, v := range vs {
		Set(dt, b, i, v)
	}
	return b
}

func all(dt fairgo.DType, b []byte) []float64 {
	out := make([]float64, len(b)/dt.Size())
	for i := range out {
		out[i] = Get(dt, b, i)
	}
	return out
}

func TestSetGet(t *testing.T) {
	for _, tc := range []struct {
		dt   fairgo.DType
		in   float64
		want float64
	}{
		{fairgo.Float16, 0.1, 0.0999755859375},
		{fairgo.Float16, 1e6, math.Inf(1)},
		{fairgo.BFloat16, 1.00390625, 1},
		{fairgo.Float32, 0.1, float64(float32(0.1))},
		{fairgo.Float64, 0.1, 0.1},
		{fairgo.Int8, 300, 44},
		{fairgo.Int8, -129, 127},
		{fairgo.Int8, -2.9, -2},
		{fairgo.Uint8, -1, 255},
		{fairgo.Uint8, 255.9, 255},
		{fairgo.Int32, 1 << 31, math.MinInt32},
		{fairgo.Uint32, 1 << 32, 0},
		{fairgo.Int64, 1 << 63, math.MinInt64},
		{fairgo.Uint64, 1 << 63, 1 << 63},
		{fairgo.Int32, math.NaN(), 0},
		{fairgo.Uint8, math.Inf(1), 0},
	} {
		b := make([]byte, 3*tc.dt.Size())
		Set(tc.dt, b, 1, tc.in)
		require.Equal(t, tc.want, Get(tc.dt, b, 1), "%v %v", tc.dt, tc.in)
		require.Zero(t, Get(tc.dt, b, 0))
		require.Zero(t, Get(tc.dt, b, 2))
	}
	require.True(t, math.IsNaN(Get(fairgo.DType(0), []byte{0}, 0)))
}

func TestExactIntegers(t *testing.T) {
	b := make([]byte, 16)
	SetInt(fairgo.Int64, b, 0, math.MaxInt64)
	SetUint(fairgo.Uint64, b, 1, math.MaxUint64)
	require.Equal(t, int64(math.MaxInt64), GetInt(fairgo.Int64, b, 0))
	require.Equal(t, uint64(math.MaxUint64), GetUint(fairgo.Uint64, b, 1))
	require.Equal(t, int64(-1), GetInt(fairgo.Uint64, b, 1))
	Set(fairgo.Uint64, b, 0, -1)
	require.Equal(t, uint64(math.MaxUint64), GetUint(fairgo.Uint64, b, 0))
	SetInt(fairgo.Int8, b, 0, -1)
	require.Equal(t, int64(-1), GetInt(fairgo.Int8, b, 0))
	require.Equal(t, uint64(math.MaxUint64), GetUint(fairgo.Int8, b, 0))
	SetInt(fairgo.Float32, b, 0, 1<<40+1)
	require.Equal(t, int64(1<<40), GetInt(fairgo.Float32, b, 0))
	Set(fairgo.Float64, b, 0, -1e300)
	require.Equal(t, int64(math.MinInt64), GetInt(fairgo.Float64, b, 0))
}

func TestSetGetIndexProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		dt := rapid.SampledFrom(fairgo.DTypes).Draw(t, "dt")
		n := rapid.IntRange(1, 64).Draw(t, "n")
		b := rapid.SliceOfN(rapid.Byte(), n*dt.Size(), n*dt.Size()).Draw(t, "bytes")
		before := append([]byte(nil), b...)
		i := rapid.IntRange(0, n-1).Draw(t, "i")
		v := rapid.Float64Range(-1e6, 1e6).Draw(t, "v")
		Set(dt, b, i, v)
		got := Get(dt, b, i)
		switch {
		case dt.IsFloat():
			// Rounded to nearest: within half an ulp (relative), or the format's overflow.
			// Within half an ulp: relative in the normal range, half the
			// smallest denormal below it; or the format overflowed.
			tiny := map[fairgo.DType]float64{fairgo.Float16: 0x1p-25, fairgo.BFloat16: 0x1p-134,
				fairgo.Float32: 0x1p-150, fairgo.Float64: 0}[dt]
			if !math.IsInf(got, 0) && math.Abs(got-v) > max(math.Abs(v)*dt.Epsilon(), tiny) {
				t.Fatalf("%v: set %v, got %v", dt, v, got)
			}
		default:
			if want := wrapFloat(v); GetUint(dt, b, i)&mask(dt) != want&mask(dt) {
				t.Fatalf("%v: set %v, got %v", dt, v, got)
			}
		}
		sz := dt.Size()
		require.Equal(t, before[:i*sz], b[:i*sz])
		require.Equal(t, before[(i+1)*sz:], b[(i+1)*sz:])
	})
}

func mask(dt fairgo.DType) uint64 {
	if dt.Size() == 8 {
		return math.MaxUint64
	}
	return 1<<(8*dt.Size()) - 1
}

func TestCombine(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name   string
		dt     fairgo.DType
		op     fairgo.Op
		acc, x []float64
		want   []float64
	}{
		{"float16 rounds every hop", fairgo.Float16, fairgo.Sum, []float64{2048, 2050}, []float64{1, 1},
			[]float64{2048, 2052}},
		{"bfloat16 sum", fairgo.BFloat16, fairgo.Sum, []float64{256}, []float64{1}, []float64{256}},
		{"avg combines as sum", fairgo.Float32, fairgo.Avg, []float64{1, 2}, []float64{3, 4}, []float64{4, 6}},
		{"float64 prod", fairgo.Float64, fairgo.Prod, []float64{1.5, -2}, []float64{4, 8}, []float64{6, -16}},
		{"int8 wraps", fairgo.Int8, fairgo.Sum, []float64{100, -100}, []float64{100, -100}, []float64{-56, 56}},
		{"uint8 prod wraps", fairgo.Uint8, fairgo.Prod, []float64{200}, []float64{2}, []float64{144}},
		{"int32 max", fairgo.Int32, fairgo.Max, []float64{-5, 7}, []float64{3, -9}, []float64{3, 7}},
		{"uint32 min", fairgo.Uint32, fairgo.Min, []float64{5, 7}, []float64{3, 9}, []float64{3, 7}},
		{"int64 avg as sum", fairgo.Int64, fairgo.Avg, []float64{-3}, []float64{1}, []float64{-2}},
		{"uint64 sum wraps", fairgo.Uint64, fairgo.Sum, []float64{1 << 63}, []float64{1 << 63}, []float64{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acc := vals(tc.dt, tc.acc...)
			require.NoError(t, Combine(tc.dt, tc.op, acc, vals(tc.dt, tc.x...)))
			require.Equal(t, tc.want, all(tc.dt, acc))
		})
	}
	for _, dt := range []fairgo.DType{fairgo.Float16, fairgo.BFloat16, fairgo.Float32, fairgo.Float64} {
		for _, op := range []fairgo.Op{fairgo.Max, fairgo.Min} {
			acc := vals(dt, nan, 1, 2, nan)
			require.NoError(t, Combine(dt, op, acc, vals(dt, 1, nan, 1, nan)))
			got := all(dt, acc)
			require.True(
				t,
				math.IsNaN(got[0]) && math.IsNaN(got[1]) && math.IsNaN(got[3]),
				"%v %v: NaN must propagate: %v",
				dt,
				op,
				got,
			)
			require.Equal(t, map[fairgo.Op]float64{fairgo.Max: 2, fairgo.Min: 1}[op], got[2])
		}
	}
}

func TestReduceShards(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dt      fairgo.DType
		op      fairgo.Op
		srcs    [][]float64
		divisor int
		want    []float64
	}{
		{"float16 accumulates in float32", fairgo.Float16, fairgo.Sum, [][]float64{{2048}, {1}, {1}}, 0, []float64{2050}},
		{"bfloat16 accumulates in float32", fairgo.BFloat16, fairgo.Sum, [][]float64{{256}, {1}, {1}}, 0, []float64{258}},
		{"float16 avg divides in float32", fairgo.Float16, fairgo.Avg, [][]float64{{2048}, {1}, {1}}, 3,
			[]float64{float64(Float16ToFloat32(Float32ToFloat16(2050.0 / 3)))}},
		{"float32 accumulates in float32", fairgo.Float32, fairgo.Sum, [][]float64{{1 << 24}, {1}, {1}}, 0,
			[]float64{1 << 24}},
		{"float64 avg", fairgo.Float64, fairgo.Avg, [][]float64{{1, 10}, {2, 20}}, 2, []float64{1.5, 15}},
		{"int avg truncates toward zero", fairgo.Int32, fairgo.Avg, [][]float64{{-7, 7}, {0, 0}}, 2, []float64{-3, 3}},
		{"uint8 avg after wrapping sum", fairgo.Uint8, fairgo.Avg, [][]float64{{200}, {100}}, 2, []float64{22}},
		{"int8 avg with a divisor beyond int8", fairgo.Int8, fairgo.Avg, [][]float64{{-100}, {-20}}, 200, []float64{0}},
		{"int8 avg of wrapped sum", fairgo.Int8, fairgo.Avg, [][]float64{{100}, {100}}, 2, []float64{-28}},
		{"int64 prod", fairgo.Int64, fairgo.Prod, [][]float64{{3}, {-4}, {5}}, 0, []float64{-60}},
		{"uint64 max", fairgo.Uint64, fairgo.Max, [][]float64{{3}, {1 << 63}, {5}}, 0, []float64{1 << 63}},
		{"one source", fairgo.Float32, fairgo.Avg, [][]float64{{3}}, 1, []float64{3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var srcs [][]byte
			for _, s := range tc.srcs {
				srcs = append(srcs, vals(tc.dt, s...))
			}
			dst := make([]byte, len(srcs[0]))
			require.NoError(t, ReduceShards(tc.dt, tc.op, dst, srcs, tc.divisor))
			require.Equal(t, tc.want, all(tc.dt, dst))
		})
	}
}

func TestScaleAndPreMul(t *testing.T) {
	b := vals(fairgo.Int64, -7, 7, math.MinInt64)
	require.NoError(t, Scale(fairgo.Int64, b, 2))
	require.Equal(
		t,
		[]int64{-3, 3, math.MinInt64 / 2},
		[]int64{GetInt(fairgo.Int64, b, 0), GetInt(fairgo.Int64, b, 1), GetInt(fairgo.Int64, b, 2)},
	)
	b = vals(fairgo.Float16, 1, 3)
	require.NoError(t, Scale(fairgo.Float16, b, 3))
	require.Equal(t, []float64{float64(Float16ToFloat32(Float32ToFloat16(1.0 / 3))), 1}, all(fairgo.Float16, b))

	// NCCL's Avg: x × round(1/n), rounded in the element type.
	b = vals(fairgo.Float16, 3, 1)
	require.NoError(t, PreMulInverse(fairgo.Float16, b, 3))
	third := float64(Float16ToFloat32(0x3555))
	require.Equal(
		t,
		[]float64{float64(Float16ToFloat32(Float32ToFloat16(float32(3 * third)))), third},
		all(fairgo.Float16, b),
	)
	b = vals(fairgo.Float64, 3)
	require.NoError(t, PreMulInverse(fairgo.Float64, b, 3))
	require.Equal(t, []float64{3 * (1.0 / 3)}, all(fairgo.Float64, b))
	require.ErrorIs(t, PreMulInverse(fairgo.Int32, vals(fairgo.Int32, 3), 3), fairgo.ErrInvalidArgument)
}

func TestInvalidArguments(t *testing.T) {
	f := vals(fairgo.Float32, 1, 2)
	require.ErrorIs(t, Combine(fairgo.DType(99), fairgo.Sum, f, f), fairgo.ErrUnknownDType)
	require.ErrorIs(t, Combine(fairgo.Float32, fairgo.Op(0), f, f), fairgo.ErrUnknownOp)
	require.ErrorIs(t, Combine(fairgo.Float32, fairgo.Sum, f, f[:4]), fairgo.ErrInvalidArgument)
	require.ErrorIs(t, Combine(fairgo.Float32, fairgo.Sum, f[:3], f[:3]), fairgo.ErrInvalidArgument)
	require.ErrorIs(t, ReduceShards(fairgo.Float32, fairgo.Sum, f, nil, 1), fairgo.ErrInvalidArgument)
	require.ErrorIs(t, ReduceShards(fairgo.Float32, fairgo.Sum, f, [][]byte{f[:4]}, 1), fairgo.ErrInvalidArgument)
	require.ErrorIs(t, ReduceShards(fairgo.Float32, fairgo.Avg, f, [][]byte{f}, 0), fairgo.ErrInvalidArgument)
	require.ErrorIs(t, Scale(fairgo.Float32, f, 0), fairgo.ErrInvalidArgument)
	require.NoError(t, Combine(fairgo.Float32, fairgo.Sum, nil, nil))
}

// ReduceShards in source order equals a chain of Combine calls (then Scale
// for Avg) for every type that accumulates in its own type.
func TestReduceShardsMatchesCombineChain(t *testing.T) {
	own := []fairgo.DType{
		fairgo.Float32,
		fairgo.Float64,
		fairgo.Int8,
		fairgo.Uint8,
		fairgo.Int32,
		fairgo.Uint32,
		fairgo.Int64,
		fairgo.Uint64,
	}
	rapid.Check(t, func(t *rapid.T) {
		dt := rapid.SampledFrom(own).Draw(t, "dt")
		op := rapid.SampledFrom(fairgo.Ops).Draw(t, "op")
		n := rapid.IntRange(0, 16).Draw(t, "elems")
		k := rapid.IntRange(1, 6).Draw(t, "srcs")
		div := rapid.IntRange(1, 300).Draw(t, "divisor")
		srcs := make([][]byte, k)
		for j := range srcs {
			srcs[j] = rapid.SliceOfN(rapid.Byte(), n*dt.Size(), n*dt.Size()).Draw(t, "src")
		}
		dst := make([]byte, n*dt.Size())
		require.NoError(t, ReduceShards(dt, op, dst, srcs, div))
		if op == fairgo.Avg && dt.IsFloat() {
			// Every term is scaled by 1/div in its own type, then summed.
			scaled := make([][]byte, k)
			for j, s := range srcs {
				scaled[j] = append([]byte(nil), s...)
				if dt == fairgo.Float32 {
					mapInPlace(n, scaled[j], ldF32, stF32, floatScale[float32](div))
				} else {
					mapInPlace(n, scaled[j], ldF64, stF64, floatScale[float64](div))
				}
			}
			srcs, op = scaled, fairgo.Sum
		}
		acc := make([]byte, len(srcs[0]))
		copy(acc, srcs[0])
		for _, s := range srcs[1:] {
			require.NoError(t, Combine(dt, op, acc, s))
		}
		if op == fairgo.Avg {
			require.NoError(t, Scale(dt, acc, div))
		}
		require.Equal(t, acc, dst)
	})
}

// 16-bit floats: ReduceShards equals the float32 accumulation rounded once.
func TestReduceShards16BitRoundsOnce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		dt := rapid.SampledFrom([]fairgo.DType{fairgo.Float16, fairgo.BFloat16}).Draw(t, "dt")
		k := rapid.IntRange(1, 8).Draw(t, "srcs")
		srcs := make([][]byte, k)
		var sum float32
		for j := range srcs {
			srcs[j] = vals(dt, rapid.Float64Range(-1000, 1000).Draw(t, "v"))
			if j == 0 {
				sum = float32(Get(dt, srcs[j], 0)) // not 0 + x: keeps a negative zero
			} else {
				sum += float32(Get(dt, srcs[j], 0))
			}
		}
		dst := make([]byte, 2)
		require.NoError(t, ReduceShards(dt, fairgo.Sum, dst, srcs, 1))
		want := make([]byte, 2)
		Set(dt, want, 0, float64(sum))
		require.Equal(t, want, dst)
	})
}

// unaligned copies b to an odd address, defeating the typed fast paths.
func unaligned(b []byte) []byte {
	buf := make([]byte, len(b)+1)
	copy(buf[1:], b)
	return buf[1:]
}

// The element-by-element paths (unaligned buffers) agree with the typed fast
// paths bit for bit.
func TestSlowAndFastPathsAgree(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		dt := rapid.SampledFrom(fairgo.DTypes).Draw(t, "dt")
		op := rapid.SampledFrom(fairgo.Ops).Draw(t, "op")
		n := rapid.IntRange(1, 12).Draw(t, "elems")
		k := rapid.IntRange(1, 4).Draw(t, "srcs")
		div := rapid.IntRange(1, 9).Draw(t, "divisor")
		srcs := make([][]byte, k)
		slow := make([][]byte, k)
		for j := range srcs {
			srcs[j] = make([]byte, n*dt.Size())
			copy(srcs[j], rapid.SliceOfN(rapid.Byte(), n*dt.Size(), n*dt.Size()).Draw(t, "src"))
			slow[j] = unaligned(srcs[j])
		}
		fast, sl := make([]byte, n*dt.Size()), unaligned(make([]byte, n*dt.Size()))
		require.NoError(t, ReduceShards(dt, op, fast, srcs, div))
		require.NoError(t, ReduceShards(dt, op, sl, slow, div))
		require.Equal(t, fast, []byte(sl), "reduce")

		acc, accSlow := append([]byte{}, srcs[0]...), unaligned(srcs[0])
		require.NoError(t, Combine(dt, op, acc, srcs[k-1]))
		require.NoError(t, Combine(dt, op, accSlow, slow[k-1]))
		require.Equal(t, acc, []byte(accSlow), "combine")

		require.NoError(t, Scale(dt, acc, div))
		require.NoError(t, Scale(dt, accSlow, div))
		require.Equal(t, acc, []byte(accSlow), "scale")
	})
}

// TestReduceShardsAvgScalesByTheReciprocal pins the case rapid once found
// for TestReduceShardsMatchesCombineChain (its failure file is gone: the
// draws it replayed no longer select float32): Avg over floats scales each
// term by 1/div in its own type, a multiply by the reciprocal and not a
// division. One float32 source, divisor 3, x with bits 0x02020000: x·(1/3)
// has bits 0x012d5556, where x/3 would give 0x012d5555.
func TestReduceShardsAvgScalesByTheReciprocal(t *testing.T) {
	src := []byte{0, 0, 0, 0, 0x00, 0x00, 0x02, 0x02} // 0 and 0x02020000, little-endian
	dst := make([]byte, len(src))
	require.NoError(t, ReduceShards(fairgo.Float32, fairgo.Avg, dst, [][]byte{src}, 3))
	require.Equal(t, []byte{0, 0, 0, 0, 0x56, 0x55, 0x2d, 0x01}, dst)
	x := math.Float32frombits(0x02020000)
	require.Equal(t, uint32(0x012d5555), math.Float32bits(x/3), "a division would round the other way")
}
