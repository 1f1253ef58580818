package main

import (
	"fmt"
	"io"
	"os"
	"testing"
)

// The command line is checked here, before main, so that main.go stays the
// program the README shows: minimal takes no flags and no arguments, and
// follows the rules of fairgo's commands (internal/cli): -h, -help and
// --help print the usage on stdout and exit 0; anything else is a bad
// command line, one message on stderr and exit status 2.
func init() {
	if testing.Testing() { // the test binary's -test.* flags are not minimal's
		return
	}
	if code, done := checkArgs(os.Args[1:], os.Stdout, os.Stderr); done {
		os.Exit(code)
	}
}

// checkArgs returns done with the exit status when args is not empty.
func checkArgs(args []string, stdout, stderr io.Writer) (code int, done bool) {
	switch {
	case len(args) == 0:
		return 0, false
	case len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help"):
		fmt.Fprint(
			stdout,
			"usage: minimal\n\nminimal runs one AllReduce (Avg) on a simulated cluster of 2 machines × 2 "+
				"devices\nand prints every rank's result. It takes no flags and no arguments.\n",
		)
		return 0, true
	}
	fmt.Fprintf(
		stderr,
		"minimal: unexpected argument %q (minimal takes no flags and no arguments)\nrun \"minimal -h\" for usage\n",
		args[0],
	)
	return 2, true
}
