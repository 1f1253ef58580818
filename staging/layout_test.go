package staging

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
)

// checkLayout verifies every invariant of a plan and of the slices and
// blocks it cuts for count elements of elemSize bytes.
func checkLayout(t require.TestingT, p Params, l Layout, count int64, elemSize int) {
	w := int64(p.Machines * p.Devices)
	unit := w * Align
	require.Zero(t, l.SliceBytes%unit, "slice size %d not a multiple of M·D·Align %d", l.SliceBytes, unit)
	require.GreaterOrEqual(t, l.SliceBytes, unit)
	require.LessOrEqual(t, l.SliceBytes, max(p.SliceBytes, unit), "slice grew past the request")
	require.GreaterOrEqual(t, l.StagingSlots, p.Parallelism, "fewer staging slots than the parallelism")
	require.LessOrEqual(t, int64(l.StagingSlots)*l.StagingSlotBytes, p.StagingBytes, "staging ring exceeds its budget")
	require.GreaterOrEqual(t, l.PaddingSlots, 1)
	require.LessOrEqual(t, int64(l.PaddingSlots)*l.PaddingSlotBytes, p.PaddingBytes, "padding ring exceeds its budget")
	require.Equal(t, l.StagingSlotBytes, l.SliceBytes+int64(p.Machines)*Align)

	es := int64(elemSize)
	alignElems := Align / es
	next := int64(0)
	for s := range Slices(count, elemSize, int(w), l.SliceBytes) {
		require.Equal(t, next, s.Offset, "gap or overlap before slice at %d", s.Offset)
		require.Positive(t, s.Count)
		require.LessOrEqual(t, s.Count*es, l.SliceBytes)
		require.Zero(t, (s.Offset*es)%Align, "slice start not aligned")
		require.Zero(t, s.Shard%alignElems, "shard not aligned")
		require.Equal(t, s.Count, w*s.Shard+s.Tail, "grid + tail must be the slice")
		require.Less(t, s.Tail, w*alignElems, "tail larger than one aligned row per rank")
		if s.Tail == 0 {
			require.Zero(t, s.PadShard)
		} else {
			require.GreaterOrEqual(t, w*s.PadShard, s.Tail, "padding slot too small for the tail")
			require.Less(t, w*(s.PadShard-1), s.Tail, "padding cell larger than needed")
		}
		require.LessOrEqual(t, w*s.PadShard*es, l.PaddingSlotBytes, "padding cells overflow the slot")
		require.LessOrEqual(
			t,
			int64(p.Machines)*s.PadShard*es,
			l.StagingSlotBytes-l.PaddingReceiveOffset(),
			"padding receive area overflows",
		)
		// D = 1 staging receives M shards of the slice.
		require.LessOrEqual(t, int64(p.Machines)*s.Shard*es, l.PaddingReceiveOffset())
		next += s.Count
	}
	require.Equal(t, count, next, "slices do not cover [0, n)")

	next = 0
	for b := range Blocks(count, elemSize, int(w), l.SliceBytes) {
		require.Equal(t, next, b.Offset)
		require.Positive(t, b.Count)
		require.Zero(t, (b.Offset*es)%Align)
		require.LessOrEqual(t, w*b.Count*es, l.SliceBytes, "a block slice of every rank must fit one staging slot")
		next += b.Count
	}
	require.Equal(t, count, next, "blocks do not cover [0, n)")
}

func paramsGen() *rapid.Generator[Params] {
	return rapid.Custom(func(t *rapid.T) Params {
		return Params{
			Machines:     rapid.IntRange(1, 64).Draw(t, "M"),
			Devices:      rapid.IntRange(1, 16).Draw(t, "D"),
			SliceBytes:   rapid.Int64Range(0, 1<<30).Draw(t, "slice"),
			StagingBytes: rapid.Int64Range(0, 1<<31).Draw(t, "staging"),
			PaddingBytes: rapid.Int64Range(0, 1<<22).Draw(t, "padding"),
			Parallelism:  rapid.IntRange(1, 100).Draw(t, "parallelism"),
		}
	})
}

func TestLayoutProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := paramsGen().Draw(t, "params")
		l, err := Plan(p)
		if err != nil {
			var ae *fairgo.ArgError
			require.ErrorAs(t, err, &ae)
			require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
			return
		}
		size := rapid.SampledFrom([]int{1, 2, 4, 8}).Draw(t, "elemSize")
		count := rapid.Int64Range(0, 4*l.SliceBytes/int64(size)+1000).Draw(t, "count")
		checkLayout(t, p, l, count, size)
	})
}

func TestPlanErrorsNameTheParameter(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Params
		arg  string
	}{
		{"staging too small",
			Params{Machines: 4, Devices: 2, SliceBytes: 1 << 20, StagingBytes: 100, PaddingBytes: 1 << 20, Parallelism: 4},
			"StagingBytes"},
		{"padding too small",
			Params{Machines: 4, Devices: 2, SliceBytes: 1 << 20, StagingBytes: 1 << 30, PaddingBytes: 64, Parallelism: 4},
			"PaddingBytes"},
		{"no parallelism", Params{Machines: 1, Devices: 1, Parallelism: 0}, "Parallelism"},
		{"no grid", Params{Machines: 0, Devices: 1, Parallelism: 1}, "grid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Plan(tc.p)
			var ae *fairgo.ArgError
			require.ErrorAs(t, err, &ae)
			require.Equal(t, tc.arg, ae.Arg)
		})
	}
}

func TestPlanShrinksSliceToFitParallelism(t *testing.T) {
	l, err := Plan(
		Params{
			Machines:     2,
			Devices:      1,
			SliceBytes:   64 << 20,
			StagingBytes: 64 << 20,
			PaddingBytes: 1 << 20,
			Parallelism:  4,
		},
	)
	require.NoError(t, err)
	require.Equal(t, 4, l.StagingSlots)
	require.Less(t, l.SliceBytes, int64(16<<20))
	require.Greater(t, l.SliceBytes, int64(15<<20))
}

func TestSlicesExamples(t *testing.T) {
	// 2 machines × 3 devices, float32 (4 elements per 16 bytes), 100 elements, slice of 96 B·... = 24 elements·4
	var got []Slice
	for s := range Slices(100, 4, 6, 6*16*4) { // slice of 96 elements
		got = append(got, s)
	}
	require.Equal(t, []Slice{
		{Offset: 0, Count: 96, Shard: 16, Tail: 0},
		{Offset: 96, Count: 4, Shard: 0, Tail: 4, PadShard: 1},
	}, got)
}

func FuzzLayout(f *testing.F) {
	f.Add(3, 5, int64(1<<20), int64(64<<20), int64(1<<20), 4, int64(1000003), 2)
	f.Add(1, 1, int64(0), int64(0), int64(0), 1, int64(0), 1)
	f.Add(8, 8, int64(17), int64(1<<30), int64(4096), 64, int64(65), 8)
	f.Fuzz(func(t *testing.T, m, d int, slice, stagingB, paddingB int64, par int, count int64, size int) {
		if m < 1 || m > 1024 || d < 1 || d > 64 || par < 1 || par > 256 || count < 0 || count > 1<<24 || slice < 0 ||
			stagingB < 0 ||
			paddingB < 0 {
			return
		}
		switch size {
		case 1, 2, 4, 8:
		default:
			return
		}
		p := Params{
			Machines:     m,
			Devices:      d,
			SliceBytes:   slice,
			StagingBytes: stagingB,
			PaddingBytes: paddingB,
			Parallelism:  par,
		}
		l, err := Plan(p)
		if err != nil {
			require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
			return
		}
		checkLayout(t, p, l, count, size)
	})
}
