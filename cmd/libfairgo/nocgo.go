//go:build !cgo

package main

// libfairgo is a C ABI: its exported functions, its types and its
// per-thread error text are cgo's (//export, C types, -buildmode=c-shared),
// so the library needs cgo and a C compiler, unlike the rest of fairgo
// (whose GPU backend calls the CUDA driver and NCCL without cgo). Built
// with CGO_ENABLED=0, the package is only the program that says what it is
// and how to build the library.

import "os"

func main() { os.Exit(runAsProgram(os.Stderr)) }
