package fairgo_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/sim"
)

func simDevice(t *testing.T) *sim.Device {
	t.Helper()
	c, err := sim.NewCluster(sim.Config{Machines: 1, Devices: 1})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c.Device(0)
}

func roundTrip[T fairgo.Element](t *testing.T, dev fairgo.HostCopier, dt fairgo.DType, vals []T) {
	t.Helper()
	require.Equal(t, dt, fairgo.DTypeOf[T]())
	tn, err := fairgo.Upload(dev, vals)
	require.NoError(t, err)
	require.Equal(t, dt, tn.DType)
	require.Equal(t, int64(len(vals)), tn.Count)
	got, err := fairgo.Download[T](dev, tn)
	require.NoError(t, err)
	require.Equal(t, vals, got)
}

// TestUploadDownload: every element type goes to the device and back
// unchanged, in the device's little-endian layout.
func TestUploadDownload(t *testing.T) {
	dev := simDevice(t)
	roundTrip(t, dev, fairgo.Float32, []float32{1.5, -2, float32(math.Inf(1)), math.SmallestNonzeroFloat32})
	roundTrip(t, dev, fairgo.Float64, []float64{math.Pi, -0.0, 1e300})
	roundTrip(t, dev, fairgo.Int8, []int8{-128, 0, 127})
	roundTrip(t, dev, fairgo.Uint8, []uint8{0, 255})
	roundTrip(t, dev, fairgo.Int32, []int32{math.MinInt32, -1, math.MaxInt32})
	roundTrip(t, dev, fairgo.Uint32, []uint32{0, math.MaxUint32})
	roundTrip(t, dev, fairgo.Int64, []int64{math.MinInt64, 7})
	roundTrip(t, dev, fairgo.Uint64, []uint64{math.MaxUint64})
	roundTrip(t, dev, fairgo.Float32, []float32{})

	tn, err := fairgo.Upload(dev, []uint32{0x04030201})
	require.NoError(t, err)
	raw := make([]byte, 4)
	require.NoError(t, dev.Download(raw, tn.Ptr))
	require.Equal(t, []byte{1, 2, 3, 4}, raw, "little-endian on the device")
}

// TestWriteAndErrors: Write fills a prefix of a tensor; a tensor of
// another type, too many values and invalid tensors are refused with an
// *fairgo.ArgError before the device is touched.
func TestWriteAndErrors(t *testing.T) {
	dev := simDevice(t)
	tn, err := dev.AllocTensor(4, fairgo.Int32)
	require.NoError(t, err)
	require.NoError(t, fairgo.Write(dev, tn, []int32{9, 9, 9, 9}))
	require.NoError(t, fairgo.Write(dev, tn, []int32{1, 2}))
	got, err := fairgo.Download[int32](dev, tn)
	require.NoError(t, err)
	require.Equal(t, []int32{1, 2, 9, 9}, got)
	require.NoError(t, fairgo.Write(dev, tn, []int32{}), "nothing to write")

	cases := []struct {
		name string
		err  error
	}{
		{"another type", fairgo.Write(dev, tn, []float32{1})},
		{"download as another type", func() error { _, err := fairgo.Download[uint32](dev, tn); return err }()},
		{"too many values", fairgo.Write(dev, tn, []int32{1, 2, 3, 4, 5})},
		{
			"invalid tensor",
			fairgo.Write(dev, fairgo.Tensor{Ptr: tn.Ptr, Count: 4, Bytes: 4, DType: fairgo.Int32}, []int32{1}),
		},
		{"unknown dtype", func() error { _, err := fairgo.Download[int8](dev, fairgo.Tensor{}); return err }()},
	}
	for _, c := range cases {
		var ae *fairgo.ArgError
		require.ErrorAs(t, c.err, &ae, c.name)
		require.ErrorIs(t, c.err, fairgo.ErrInvalidArgument, c.name)
	}
	_, err = fairgo.Download[int32](dev, fairgo.Tensor{Ptr: 12345, Count: 1, Bytes: 4, DType: fairgo.Int32})
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument, "memory of no allocation: the device refuses it")
}
