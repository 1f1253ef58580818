package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/internal/cli"
)

// TestRunAsProgram: built as a program, libfairgo says what it is and how
// to build the library, and fails.
func TestRunAsProgram(t *testing.T) {
	var out bytes.Buffer
	require.Equal(t, cli.ExitUsage, runAsProgram(&out))
	for _, want := range []string{"libfairgo " + fairgo.Version, "shared library, not a program", "make libfairgo"} {
		require.Contains(t, out.String(), want)
	}
}
