package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/internal/cli"
)

// TestSimUnderLauncher: as one worker of a launcher's job, the simulated
// backend still runs, and says first that this process's cluster is its
// own; without a launcher it says nothing.
func TestSimUnderLauncher(t *testing.T) {
	for _, v := range []string{"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "FAIRGO_STORE_ADDR"} {
		t.Setenv(v, "")
	}
	args := []string{"-machines", "2", "-devices", "2", "-count", "100"}
	var stdout, stderr bytes.Buffer
	require.Equal(t, cli.ExitOK, run(args, &stdout, &stderr), stderr.String())
	require.Empty(t, stderr.String())

	for k, v := range map[string]string{"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"} {
		t.Setenv(k, v)
	}
	stdout.Reset()
	require.Equal(t, cli.ExitOK, run(args, &stdout, &stderr), stderr.String())
	require.Contains(t, stderr.String(), "allreduce: the simulated backend runs in one process: "+
		"this process is rank 1 of 2 under a launcher, and it runs a simulated 2×2 cluster of its own")
	require.Contains(t, stdout.String(), "on 2×2 ranks")
}
