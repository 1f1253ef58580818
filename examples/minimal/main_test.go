package main

import (
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/internal/cli"
	"github.com/fairgo/fairgo/internal/cli/clitest"
)

// TestMinimal runs the program and checks what it prints.
func TestMinimal(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	stdout := os.Stdout
	os.Stdout = w
	defer func() { os.Stdout = stdout }()
	main()
	require.NoError(t, w.Close())
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	require.Equal(
		t,
		"rank 0 average [1.5 1]\nrank 1 average [1.5 1]\nrank 2 average [1.5 1]\nrank 3 average [1.5 1]\n",
		string(out),
	)
}

// TestCLIRules: minimal takes no flags or arguments; -h is its usage on
// stdout, anything else a bad command line.
func TestCLIRules(t *testing.T) {
	run := func(args []string, stdout, stderr io.Writer) int {
		code, done := checkArgs(args, stdout, stderr)
		if !done {
			return -1 // the program would run
		}
		return code
	}
	clitest.Check(t, "minimal", run, []clitest.Case{
		{Name: "-h", Args: []string{"-h"}, Code: cli.ExitOK, Stdout: []string{"usage: minimal", "no flags"}},
		{Name: "--help", Args: []string{"--help"}, Code: cli.ExitOK, Stdout: []string{"usage: minimal"}},
		{Name: "-help", Args: []string{"-help"}, Code: cli.ExitOK, Stdout: []string{"usage: minimal"}},
		clitest.Usage("minimal", "a flag", "-machines 3", `minimal: unexpected argument "-machines"`),
		clitest.Usage("minimal", "an argument", "extra", `unexpected argument "extra"`),
		clitest.Usage("minimal", "help and more", "-h extra", `unexpected argument "-h"`),
	})
	require.Equal(t, -1, run(nil, io.Discard, io.Discard), "no argument: the program runs")
}
