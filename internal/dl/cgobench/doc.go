// Package cgobench compares the cost of one C call through package dl with
// the same call through cgo, the way packages cuda and nccl called the CUDA
// driver and NCCL before they went through dl:
//
//	go test -tags fairgo_cgobench -bench . ./internal/dl/cgobench
//
// Without the tag the package is empty, so that it needs no cgo.
package cgobench
