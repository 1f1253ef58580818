//go:build !cuda

package main

// gpuCount is unknown without the cuda build.
func gpuCount() (int, bool) { return 0, false }
