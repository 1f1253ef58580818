package main

import (
	"fmt"
	"io"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/internal/cli"
)

// programText is what libfairgo says when it is run: it is a library, and
// an executable built from it does nothing else.
const programText = `libfairgo %s is fairgo's C ABI (fairgo.h), for the PyTorch hook
(fairgo_torch) and other languages. It is a shared library, not a program:
build it with

    make libfairgo    # lib/libfairgo.so and lib/fairgo.h

(go build -buildmode=c-shared -o lib/libfairgo.so ./cmd/libfairgo), or
make wheel for the fairgo_torch wheel that carries it. The programs are
fairrun (go install ./cmd/...), fairbench and the examples.
`

// runAsProgram writes programText to w and returns the exit status: 2,
// whatever the arguments (-h included), so that a script that runs the
// program by mistake does not go on as if it had done something.
func runAsProgram(w io.Writer) int {
	fmt.Fprintf(w, programText, fairgo.Version)
	return cli.ExitUsage
}
