// Package clitest checks a command against the rules of package cli, for
// the commands' table tests.
package clitest

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/internal/cli"
)

// Run is a command's main without the exit: it runs the command line args
// and returns the exit status.
type Run func(args []string, stdout, stderr io.Writer) int

// Case is one command line and what the rules make of it.
type Case struct {
	Name string
	Args []string
	// Code is the exit status: cli.ExitOK for help (the usage on stdout,
	// nothing on stderr), cli.ExitUsage for a bad command line (nothing on
	// stdout, one message on stderr that starts with the command's name
	// once).
	Code int
	// Stdout must all appear on stdout.
	Stdout []string
	// Stderr must all appear on stderr, each exactly once.
	Stderr []string
	// NotStderr must not appear on stderr.
	NotStderr []string
}

// Check runs every case with run and checks it. name is the prefix of the
// command's messages.
func Check(t *testing.T, name string, run Run, cases []Case) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.Args, &stdout, &stderr)
			so, se := stdout.String(), stderr.String()
			require.Equal(t, tc.Code, code, "%s %q\nstdout:\n%s\nstderr:\n%s", name, tc.Args, so, se)
			switch tc.Code {
			case cli.ExitOK:
				require.Empty(t, se, "help writes nothing on stderr")
				require.Contains(t, strings.ToLower(so), "usage", "help writes the usage on stdout")
			case cli.ExitUsage:
				require.Empty(t, so, "a bad command line writes nothing on stdout")
				require.True(t, strings.HasPrefix(se, name+": "), "the message starts with %q:\n%s", name+": ", se)
				require.Equal(t, 1, strings.Count(se, name+": "), "one message, one prefix:\n%s", se)
				for _, l := range strings.Split(se, "\n") {
					require.False(
						t,
						strings.HasPrefix(strings.TrimSpace(l), "-") && strings.HasPrefix(l, "  "),
						"no list of flags on stderr:\n%s",
						se,
					)
				}
			}
			for _, s := range tc.Stdout {
				require.Contains(t, so, s)
			}
			for _, s := range tc.Stderr {
				require.Equal(t, 1, strings.Count(se, s), "%q once on stderr:\n%s", s, se)
			}
			for _, s := range tc.NotStderr {
				require.NotContains(t, se, s)
			}
		})
	}
}

// Usage is the case of a bad command line of program: args split at
// blanks, exit cli.ExitUsage, the messages in stderr followed by the hint
// to run "program -h".
func Usage(program, name, args string, stderr ...string) Case {
	return Case{Name: name, Args: strings.Fields(args), Code: cli.ExitUsage,
		Stderr: append(stderr, `run "`+program+` -h" for usage`)}
}
