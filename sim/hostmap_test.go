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
