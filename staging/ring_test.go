package staging_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/sim"
	"github.com/fairgo/fairgo/staging"
)

// countingAllocator is a sim device that counts its allocations and can
// be told to refuse the next one.
type countingAllocator struct {
	*sim.Device
	allocs, frees int
	refuse        bool
}

var errRefused = errors.New("refused")

func (a *countingAllocator) Alloc(n int64) (uintptr, error) {
	if a.refuse {
		a.refuse = false
		return 0, errRefused
	}
	a.allocs++
	return a.Device.Alloc(n)
}

func (a *countingAllocator) Free(p uintptr) error {
	a.frees++
	return a.Device.Free(p)
}

// A slot's memory comes at its first use: a call that needs one slot
// allocates one, a refused allocation fails that Next only, and Close frees
// exactly what was allocated.
func TestRingAllocatesSlotsAtFirstUse(t *testing.T) {
	c, err := sim.NewCluster(sim.Config{Machines: 1, Devices: 1})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	dev := &countingAllocator{Device: c.Device(0)}
	r, err := staging.NewRing(dev, 4, 1<<10)
	require.NoError(t, err)
	require.Zero(t, dev.allocs, "nothing allocated before the first Next")

	s0, err := r.Next()
	require.NoError(t, err)
	require.Equal(t, 1, dev.allocs)
	require.NoError(t, dev.CheckRange(s0.Ptr, s0.Bytes))

	dev.refuse = true
	_, err = r.Next()
	require.ErrorIs(t, err, errRefused)
	s1, err := r.Next() // the same slot again: the refusal did not advance the ring
	require.NoError(t, err)
	require.Equal(t, 1, s1.Index)

	seen := map[int]uintptr{0: s0.Ptr, 1: s1.Ptr}
	for range 6 {
		s, err := r.Next()
		require.NoError(t, err)
		if p, ok := seen[s.Index]; ok {
			require.Equal(t, p, s.Ptr, "slot %d keeps its memory", s.Index)
		}
		seen[s.Index] = s.Ptr
	}
	require.Equal(t, 4, dev.allocs, "one allocation per slot")
	require.NoError(t, r.Close())
	require.Equal(t, 4, dev.frees)
	require.NoError(t, r.Close(), "a second Close frees nothing more")
	require.Equal(t, 4, dev.frees)
}

// A ring never made (the engine makes it at first use) closes as nothing.
func TestNilRingCloses(t *testing.T) {
	var r *staging.Ring
	require.NoError(t, r.Close())
}
