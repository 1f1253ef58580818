//go:build !cuda

package main

import (
	"context"

	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/testbed"
)

// trainGPU needs the cuda build (the cuda backend's testbed does too).
func trainGPU(context.Context, Config, *hier.Reducer, Memory, func(EpochStats)) (*Result, error) {
	return nil, testbed.ErrNoCUDA
}
