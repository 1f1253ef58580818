package padding_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/padding"
	"github.com/fairgo/fairgo/sim"
	"github.com/fairgo/fairgo/staging"
)

// The ring hands out its slots round robin, each viewed as the [D][M][p]
// cells of a slice's padding inside the slot.
func TestRingHandsOutSlotsAsCells(t *testing.T) {
	c, err := sim.NewCluster(sim.Config{Machines: 3, Devices: 2})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	l, err := staging.Plan(
		staging.Params{
			Machines:     3,
			Devices:      2,
			SliceBytes:   1 << 20,
			StagingBytes: 8 << 20,
			PaddingBytes: 3 * 6 * staging.Align,
			Parallelism:  2,
		},
	)
	require.NoError(t, err)
	require.Equal(t, 3, l.PaddingSlots)
	r, err := padding.NewRing(c.Device(0), l)
	require.NoError(t, err)
	var first staging.Slot
	for i := range 7 {
		s, cells, err := r.Next(int64(1+i%4), 4)
		require.NoError(t, err)
		require.Equal(t, i%3, s.Index)
		require.Equal(t, s.Ptr, cells.Base)
		require.Equal(t, 2, cells.Devices)
		require.Equal(t, 3, cells.Machines)
		require.LessOrEqual(t, cells.Bytes(), s.Bytes, "the cells of a padding of %d elements fit the slot", cells.N)
		require.NoError(t, c.Device(0).CheckRange(cells.Base, cells.Bytes()))
		if i == 0 {
			first = s
		}
		if i == 3 {
			require.Equal(t, first.Ptr, s.Ptr)
		}
	}
	require.NoError(t, r.Close())
}

// A ring never made (the engine makes it at first use) closes as nothing.
func TestNilRingCloses(t *testing.T) {
	var r *padding.Ring
	require.NoError(t, r.Close())
}
