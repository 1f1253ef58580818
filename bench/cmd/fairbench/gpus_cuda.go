package main

import "github.com/fairgo/fairgo/cuda"

// gpuCount is the number of visible GPUs.
func gpuCount() (int, bool) {
	n, err := cuda.Count()
	return n, err == nil && n > 0
}
