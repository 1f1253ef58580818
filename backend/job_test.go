package backend_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/rendezvous"
)

// grid2x2 is a 2 × 2 placement with global ranks in a shuffled order.
func grid2x2() backend.Placement {
	at := func(m, d int) fairgo.Grid { return fairgo.Grid{Machines: 2, Devices: 2, Machine: m, Local: d} }
	return backend.Placement{at(1, 0), at(0, 1), at(0, 0), at(1, 1)}
}

func TestPlacement(t *testing.T) {
	p := grid2x2()
	require.NoError(t, p.Validate())
	require.Equal(t, 4, p.WorldSize())
	require.Equal(t, fairgo.Grid{Machines: 2, Devices: 2, Machine: 0, Local: 1}, p.GridOf(1))
	for r, g := range p {
		require.Equal(t, r, p.RankAt(g.Machine, g.Local))
	}
	require.Equal(t, -1, p.RankAt(2, 0))
}

func TestPlacementInvalid(t *testing.T) {
	twice := grid2x2()
	twice[3] = twice[0]
	shape := grid2x2()
	shape[1].Devices = 1
	for name, p := range map[string]backend.Placement{
		"empty":          nil,
		"too few ranks":  grid2x2()[:3],
		"a cell twice":   twice,
		"another shape":  shape,
		"outside a grid": {{Machines: 1, Devices: 1, Machine: 1}},
	} {
		t.Run(name, func(t *testing.T) {
			require.ErrorIs(t, p.Validate(), fairgo.ErrInvalidArgument)
		})
	}
}

// The leader's value reaches every rank; the leader makes it once.
func TestShare(t *testing.T) {
	store := rendezvous.NewMemoryStore()
	var made int
	got := make([][]byte, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[r], errs[r] = backend.Share(context.Background(), store, "id", r == 0, func() ([]byte, error) {
				made++
				return []byte("unique"), nil
			})
		}()
	}
	wg.Wait()
	for r := range 4 {
		require.NoError(t, errs[r])
		require.Equal(t, []byte("unique"), got[r])
	}
	require.Equal(t, 1, made)
}

func TestShareErrors(t *testing.T) {
	store := rendezvous.NewMemoryStore()
	boom := errors.New("no id")
	_, err := backend.Share(context.Background(), store, "id", true, func() ([]byte, error) { return nil, boom })
	require.ErrorIs(t, err, boom)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = backend.Share(ctx, store, "never", false, nil)
	require.ErrorIs(t, err, context.Canceled)
}
