package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/internal/cli"
)

// TestVersion: fairbench --version (or version, or a command's -version)
// prints fairgo's version on stdout and exits 0.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"-version"}, {"version"}, {"sweep", "-version"}} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, cli.ExitOK, run(context.Background(), args, &stdout, &stderr), "%q", args)
		require.Equal(t, cli.VersionLine("fairbench")+"\n", stdout.String())
		require.Empty(t, stderr.String())
	}
	var stdout, stderr bytes.Buffer
	require.Equal(t, cli.ExitUsage, run(context.Background(), []string{"version", "x"}, &stdout, &stderr))
}
