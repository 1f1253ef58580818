package launchjob

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/rendezvous"
	"github.com/fairgo/fairgo/sim"
)

// clearLaunchEnv unsets every launcher's rank variable for the test.
func clearLaunchEnv(t *testing.T) {
	for _, k := range []string{"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "FAIRGO_RANK"} {
		if v, ok := os.LookupEnv(k); ok {
			t.Setenv(k, v) // restored at the end
			require.NoError(t, os.Unsetenv(k))
		}
	}
}

// Outside a launcher there is no job to join: Open says so with the
// launcher package's sentinel, and a nil Job closes as nothing.
func TestOutsideALauncher(t *testing.T) {
	clearLaunchEnv(t)
	require.False(t, Launched())
	j, err := Open(context.Background(), sim.NewBackend(sim.Config{}), "x")
	require.ErrorIs(t, err, rendezvous.ErrNoLaunchEnv)
	require.Nil(t, j)
	require.NoError(t, j.Close())
}

// A job of one rank (torchrun's variables, a store of its own): Open joins
// it and gives the rank its grid; Close releases it and leaves the store.
func TestOneRankJob(t *testing.T) {
	clearLaunchEnv(t)
	for k, v := range map[string]string{"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"} {
		t.Setenv(k, v)
	}
	require.True(t, Launched())
	b := sim.NewBackend(sim.Config{})
	defer b.Close()
	j, err := Open(context.Background(), b, "launchjob-test")
	require.NoError(t, err)
	require.Equal(t, 1, j.Rank.Grid.Size())
	require.NotNil(t, j.Rank.Device)
	require.NoError(t, j.Close())
}
