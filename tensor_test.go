package fairgo_test

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
)

// A slice inside its tensor's memory is a tensor of its own; one outside
// never becomes a tensor that any call accepts: Validate (which every
// collective and the host copies run) refuses it with an *ArgError that
// names the bounds, and it holds no memory before or after its parent's.
func TestSliceBounds(t *testing.T) {
	dev := simDevice(t)
	two, err := fairgo.Upload(dev, []float32{1, 2}) // 8 bytes
	require.NoError(t, err)
	roomy := two
	roomy.Count = 1 // owns 8 bytes, holds 1 element: slices may reach its Bytes
	for _, tc := range []struct {
		name      string
		t         fairgo.Tensor
		from, n   int64
		ok        bool
		wantValue string
	}{
		{"whole", two, 0, 2, true, ""},
		{"second element", two, 1, 1, true, ""},
		{"empty at the end", two, 2, 0, true, ""},
		{"within Bytes past Count", roomy, 1, 1, true, ""},
		{"past the end", two, 5, 10, false, "[5, 15)"},
		{"one too long", two, 1, 2, false, "[1, 3)"},
		{"before the start", two, -1, 1, false, "[-1, 0)"},
		{"negative length", two, 1, -1, false, "[1, 0)"},
		{"from past the end", two, 3, 0, false, "[3, 3)"},
		{"overflowing end", two, 1, math.MaxInt64, false, "[1, 1+9223372036854775807)"},
		{"huge from", two, math.MaxInt64 / 2, 1, false, "[4611686018427387903, 4611686018427387904)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.t.Slice(tc.from, tc.n)
			err := s.Validate()
			if tc.ok {
				require.NoError(t, err)
				require.Equal(t, tc.t.Ptr+uintptr(4*tc.from), s.Ptr)
				require.Equal(t, 4*tc.n, s.Bytes)
				return
			}
			require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
			var ae *fairgo.ArgError
			require.True(t, errors.As(err, &ae))
			require.Equal(t, "slice", ae.Arg)
			require.Equal(t, tc.wantValue, ae.Value)
			require.Contains(t, err.Error(), "outside the tensor's elements [0, 2) (8 bytes of float32)")
			require.Equal(t, tc.t.Ptr, s.Ptr, "an invalid slice points at its parent, nowhere else")
			require.Zero(t, s.Bytes)
			// Every use of the tensor refuses it, a slice of it too.
			_, err = fairgo.Download[float32](dev, s)
			require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
			require.ErrorIs(t, fairgo.Write(dev, s, []float32{}), fairgo.ErrInvalidArgument)
			require.ErrorIs(t, s.Slice(0, 0).Validate(), fairgo.ErrInvalidArgument)
			require.Contains(t, s.Slice(0, 0).Validate().Error(), "invalid slice")
		})
	}
}

// A tensor whose address is not a multiple of its element size is refused
// at the call: a GPU kernel that read one of its elements would fault and
// take the process's CUDA context with it. Bytes need no such alignment,
// and neither does an empty tensor's address.
func TestValidateRefusesMisalignedElements(t *testing.T) {
	for _, tc := range []struct {
		name string
		t    fairgo.Tensor
		ok   bool
	}{
		{"float32 at 4", fairgo.Tensor{Ptr: 0x1004, Bytes: 8, Count: 2, DType: fairgo.Float32}, true},
		{"float32 at 2", fairgo.Tensor{Ptr: 0x1002, Bytes: 8, Count: 2, DType: fairgo.Float32}, false},
		{"float64 at 4", fairgo.Tensor{Ptr: 0x1004, Bytes: 8, Count: 1, DType: fairgo.Float64}, false},
		{"bfloat16 at 1", fairgo.Tensor{Ptr: 0x1001, Bytes: 2, Count: 1, DType: fairgo.BFloat16}, false},
		{"uint8 at 1", fairgo.Tensor{Ptr: 0x1001, Bytes: 3, Count: 3, DType: fairgo.Uint8}, true},
		{"empty float32 at 2", fairgo.Tensor{Ptr: 0x1002, Bytes: 0, Count: 0, DType: fairgo.Float32}, true},
	} {
		err := tc.t.Validate()
		if tc.ok {
			require.NoError(t, err, tc.name)
			continue
		}
		var ae *fairgo.ArgError
		require.ErrorAs(t, err, &ae, tc.name)
		require.ErrorIs(t, err, fairgo.ErrInvalidArgument, tc.name)
		require.Equal(t, "ptr", ae.Arg, tc.name)
		require.Contains(t, err.Error(), "not a multiple of its", tc.name)
	}
}

// Valid is true for exactly the element types that have a name, a size
// and a place in DTypes.
func TestDTypeValidIsTheDeclaredTypes(t *testing.T) {
	for d := fairgo.DType(-3); d < 20; d++ {
		_, err := fairgo.ParseDType(d.String())
		require.Equal(t, err == nil, d.Valid(), "%v", d)
		require.Equal(t, slices.Contains(fairgo.DTypes, d), d.Valid(), "%v", d)
	}
}
