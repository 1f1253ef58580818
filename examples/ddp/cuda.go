//go:build cuda

package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/cuda"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/rendezvous"
)

func init() { backends["cuda"] = openCUDA }

// cudaCluster is this process's ranks on GPUs: one per process under a
// launcher, or -devices GPUs of one machine driven by one process.
type cudaCluster struct {
	reducers []*hier.Reducer
}

// openCUDA builds the Reducers with hier.New (under fairrun, torchrun,
// Slurm or Open MPI: one process per GPU, the grid comes from topology
// discovery) or hier.NewLocal (no launcher: one machine of -devices GPUs):
//
//	fairrun --nproc-per-node 4 --emulate-machines 2 -- ddp -backend cuda
//	ddp -backend cuda -machines 1 -devices 2
//
// The model still computes on the host; gradients and parameters go
// through each rank's GPU.
func openCUDA(ctx context.Context, o options, hopts []hier.Option) (cluster, error) {
	if _, err := rendezvous.FromEnv(); err == nil {
		r, err := hier.New(ctx, nil, cuda.Backend{}, hopts...)
		if err != nil {
			return nil, err
		}
		return &cudaCluster{reducers: []*hier.Reducer{r}}, nil
	} else if !errors.Is(err, rendezvous.ErrNoLaunchEnv) {
		return nil, err
	}
	if o.machines != 1 {
		return nil, fmt.Errorf("without a launcher the cuda backend drives one machine (-machines 1 -devices N); emulate %d machines with fairrun --emulate-machines", o.machines)
	}
	devices := make([]int, o.devices)
	for i := range devices {
		devices[i] = i
	}
	opts := append([]hier.Option{hier.WithLaunch(rendezvous.Launch{WorldSize: 1, LocalWorldSize: 1})}, hopts...)
	rs, err := hier.NewLocal(ctx, nil, cuda.Backend{}, devices, opts...)
	if err != nil {
		return nil, err
	}
	return &cudaCluster{reducers: rs}, nil
}

func (c *cudaCluster) Ranks() ([]*hier.Reducer, []Memory) {
	mems := make([]Memory, len(c.reducers))
	for i, r := range c.reducers {
		d, _ := r.Device().(*cuda.Device)
		mems[i] = cudaMemory{d}
	}
	return c.reducers, mems
}

// Close closes the Reducers, which own their devices and communicators.
func (c *cudaCluster) Close() error { return hier.CloseAll(c.reducers) }

// cudaMemory adapts *cuda.Device to Memory. Its Upload and Download wait
// for the whole device to be idle, so on GPUs a bucket's upload waits for
// the allreduces already in flight: the overlap needs the gradients
// computed (or copied asynchronously) on a stream of the GPU.
type cudaMemory struct{ d *cuda.Device }

func (m cudaMemory) AllocTensor(count int64, dt fairgo.DType) (fairgo.Tensor, error) {
	if m.d == nil {
		return fairgo.Tensor{}, errors.New("ddp: the Reducer's device is not a *cuda.Device")
	}
	return m.d.AllocTensor(count, dt)
}
func (m cudaMemory) Free(ptr uintptr) error                  { return m.d.Free(ptr) }
func (m cudaMemory) Upload(ptr uintptr, data []byte) error   { return m.d.Upload(ptr, data) }
func (m cudaMemory) Download(ptr uintptr, data []byte) error { return m.d.Download(data, ptr) }
