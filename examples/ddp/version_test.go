package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/internal/cli"
)

// TestVersion: --version prints fairgo's version on stdout and exits 0,
// before any check of the other flags.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"-version"}, {"-epochs", "1", "--version"}} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, cli.ExitOK, run(args, &stdout, &stderr), "%q", args)
		require.Equal(t, cli.VersionLine("ddp")+"\n", stdout.String())
		require.Empty(t, stderr.String())
	}
}
