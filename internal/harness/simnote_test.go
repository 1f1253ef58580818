package harness

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSimUnderLauncher: the note appears only for the sim backend in a
// worker of a job of several processes, and names the worker and the
// cluster it runs alone.
func TestSimUnderLauncher(t *testing.T) {
	for _, v := range []string{"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "FAIRGO_STORE_ADDR", "RANK"} {
		t.Setenv(v, "")
	}
	spec := Spec{Machines: 2, Devices: 3}
	require.Empty(t, SimUnderLauncher("sim", spec), "no launcher")
	t.Setenv("WORLD_SIZE", "2")
	t.Setenv("RANK", "1")
	t.Setenv("LOCAL_RANK", "1")
	t.Setenv("LOCAL_WORLD_SIZE", "2")
	t.Setenv("MASTER_ADDR", "127.0.0.1")
	t.Setenv("MASTER_PORT", "29500")
	require.Empty(t, SimUnderLauncher("cuda", spec), "cuda runs one rank per process")
	note := SimUnderLauncher("sim", spec)
	require.Contains(t, note, "rank 1 of 2")
	require.Contains(t, note, "simulated 2×3 cluster of its own")
	require.Contains(t, note, "-backend cuda")
}
