//go:build cgo && !fairgo_sim

package main

import (
	"errors"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/cmd/libfairgo/internal/capi"
	"github.com/fairgo/fairgo/cuda"
	"github.com/fairgo/fairgo/nccl"
	"github.com/fairgo/fairgo/streams"
)

// gpuBackend is cuda.Backend with the caller's streams wrapped by
// cuda.(*Device).ForeignStream.
type gpuBackend struct{ cuda.Backend }

func (gpuBackend) ForeignStream(dev backend.Device, handle uintptr) (streams.Stream, error) {
	d, ok := dev.(*cuda.Device)
	if !ok {
		return nil, &fairgo.ArgError{Arg: "device", Value: dev, Reason: "not a *cuda.Device"}
	}
	s, err := d.ForeignStream(handle)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return s, nil
}

// ncclErrors are the NCCL failures reported as FAIRGO_ERR_NCCL (its
// timeout, abort and destroy errors wrap fairgo's sentinels and are
// classified by those).
var ncclErrors = []error{
	nccl.ErrNotFound, nccl.ErrNotSupported, nccl.ErrUnhandledCuda, nccl.ErrSystem, nccl.ErrInternal,
	nccl.ErrInvalidArgument, nccl.ErrInvalidUsage, nccl.ErrRemote, nccl.ErrInProgress,
}

func isNCCL(err error) bool {
	var ne *nccl.Error
	if errors.As(err, &ne) {
		return true
	}
	for _, s := range ncclErrors {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

func backendConfig() capi.Config {
	return capi.Config{
		Backend: gpuBackend{},
		Classes: capi.Classes{Backend: []capi.Class{
			capi.Is(cuda.ErrCUDA, capi.CUDA),
			{Code: capi.NCCL, Match: isNCCL},
		}},
	}
}
