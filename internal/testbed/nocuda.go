//go:build !cuda

package testbed

import "context"

// CUDABuilt reports whether this build has the GPU openers.
const CUDABuilt = false

// OpenCUDALocal needs the cuda build.
func OpenCUDALocal(Spec) (*Testbed, error) { return nil, ErrNoCUDA }

// OpenCUDAProcess needs the cuda build.
func OpenCUDAProcess(context.Context) (*Testbed, error) { return nil, ErrNoCUDA }
