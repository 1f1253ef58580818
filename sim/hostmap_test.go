package sim_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/sim"
)

// Host memory mapped with DevicePointer is read and written in place by
// device work, and FreeHost unmaps it.
func TestDevicePointerMapsHostMemory(t *testing.T) {
	c, err := sim.NewCluster(sim.Config{Machines: 1, Devices: 1})
	require.NoError(t, err)
	defer c.Close()
	d := c.Device(0)
	host, err := d.AllocHost(16)
	require.NoError(t, err)
	ptr, err := d.DevicePointer(host)
	require.NoError(t, err)
	again, err := d.DevicePointer(host)
	require.NoError(t, err)
	require.Equal(t, ptr, again)
	require.NoError(t, d.CheckRange(ptr, 16))

	dev, err := d.Alloc(16)
	require.NoError(t, err)
	require.NoError(t, d.Upload(dev, []byte("0123456789abcdef")))
	s, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, d.CopyAsync(ptr, dev, 16, s)) // the device writes the host memory
	require.NoError(t, s.(*sim.Stream).Synchronize(context.Background()))
	require.Equal(t, "0123456789abcdef", string(host))

	copy(host, "fedcba9876543210")
	require.NoError(t, d.CopyAsync(dev, ptr, 16, s)) // and reads it
	require.NoError(t, s.(*sim.Stream).Synchronize(context.Background()))
	out := make([]byte, 16)
	require.NoError(t, d.Download(out, dev))
	require.Equal(t, "fedcba9876543210", string(out))

	require.NoError(t, d.FreeHost(host))
	require.ErrorIs(t, d.CheckRange(ptr, 16), fairgo.ErrInvalidArgument)
	_, err = d.DevicePointer(nil)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
}

// CopyPairAsync moves device memory and mapped host memory in one
// operation, both ways, and refuses overlapping copies.
func TestCopyPairWithMappedHostMemory(t *testing.T) {
	c, err := sim.NewCluster(sim.Config{Machines: 1, Devices: 1})
	require.NoError(t, err)
	defer c.Close()
	d := c.Device(0)
	host, err := d.AllocHost(6)
	require.NoError(t, err)
	mapped, err := d.DevicePointer(host)
	require.NoError(t, err)
	data, err := d.Alloc(10)
	require.NoError(t, err)
	stage, err := d.Alloc(16)
	require.NoError(t, err)
	require.NoError(t, d.Upload(data, []byte("0123456789")))
	require.NoError(t, d.Upload(stage, make([]byte, 16)))
	copy(host, "abcdef")
	s, err := d.NewStream()
	require.NoError(t, err)
	sync := func() { require.NoError(t, s.(*sim.Stream).Synchronize(context.Background())) }

	require.NoError(t, d.CopyPairAsync(stage, data, 10, stage+10, mapped, 6, s))
	sync()
	out := make([]byte, 16)
	require.NoError(t, d.Download(out, stage))
	require.Equal(t, "0123456789abcdef", string(out))

	require.NoError(t, d.Upload(stage, []byte("ABCDEFGHIJuvwxyz")))
	require.NoError(t, d.CopyPairAsync(data, stage, 10, mapped, stage+10, 6, s))
	sync()
	require.Equal(t, "uvwxyz", string(host))
	back := make([]byte, 10)
	require.NoError(t, d.Download(back, data))
	require.Equal(t, "ABCDEFGHIJ", string(back))

	require.ErrorIs(t, d.CopyPairAsync(stage, stage+4, 8, mapped, data, 6, s), fairgo.ErrInvalidArgument)
	require.ErrorIs(t, d.CopyPairAsync(stage, data, -1, mapped, data, 6, s), fairgo.ErrInvalidArgument)
	require.NoError(t, d.CopyPairAsync(0, 0, 0, 0, 0, 0, s))
}
