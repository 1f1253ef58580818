package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/internal/cli"
	"github.com/fairgo/fairgo/internal/cli/clitest"
)

// TestTorchrunCommandLines: what torchrun users type is taken, or refused
// with one message naming the flag as typed and exit status 2.
func TestTorchrunCommandLines(t *testing.T) {
	clitest.Check(t, "fairrun", runFairrun, []clitest.Case{
		{Name: "an elastic range", Args: []string{"--nnodes", "1:2", "--", "p"}, Code: cli.ExitUsage,
			Stderr: []string{
				`invalid value "1:2" for flag --nnodes: elastic ranges MIN:MAX are not supported: ` +
					`fairrun runs a fixed number of nodes (--nnodes 2, or 2:2)`,
			}},
		{Name: "an unknown flag as typed", Args: []string{"--bogus", "--", "p"}, Code: cli.ExitUsage,
			Stderr: []string{"flag provided but not defined: --bogus"}},
		{Name: "a rendezvous backend fairrun lacks", Args: []string{"--rdzv_backend", "etcd", "--", "p"},
			Code: cli.ExitUsage, Stderr: []string{`for flag --rdzv_backend: not one of c10d, static`}},
		{Name: "another node without its rank",
			Args: []string{"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "192.0.2.1:29400", "--", "p"},
			Code: cli.ExitUsage, Stderr: []string{"give this node's --node-rank in [1, 2)"}},
	})
	// --no-python and one worker by default: the program runs as given.
	var stdout, stderr bytes.Buffer
	code := runFairrun([]string{"--no-python", "--max-restarts", "1", "--", "sh", "-c", `echo "$RANK/$WORLD_SIZE"`},
		&stdout, &stderr)
	require.Equal(t, cli.ExitOK, code, stderr.String())
	require.Equal(t, "[0] 0/1\n", stdout.String())
}
