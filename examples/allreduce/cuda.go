//go:build cuda

package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/cuda"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/hier/setup"
	"github.com/fairgo/fairgo/rendezvous"
)

func init() { openers["cuda"] = openCUDA }

// cudaBed holds this process's ranks on GPUs: one, under a launcher
// (fairrun, torchrun), or every rank of the declared -machines × -devices
// grid over the first GPUs, without one.
type cudaBed struct {
	ranks    []int
	reducers []*hier.Reducer
	local    []hier.Rank    // without a launcher: what NewLocalRanks made
	devs     []*cuda.Device // without a launcher: the devices opened here
}

// openCUDA: under a launcher, setup.New with the cuda backend (topology is
// discovered, the Reducer owns its device and communicators); otherwise one
// process drives M·D GPUs with the grid declared by the flags.
//
//	fairrun --nproc-per-node 4 --emulate-machines 2 -- allreduce -backend cuda
//	allreduce -backend cuda -machines 1 -devices 2
func openCUDA(ctx context.Context, f flags, opts []hier.Option) (testbed, error) {
	if _, err := rendezvous.FromEnv(); err == nil {
		r, err := setup.New(ctx, nil, cuda.Backend{}, setup.WithReducer(opts...))
		if err != nil {
			return nil, err
		}
		fmt.Printf("rank %d: grid %v on %v\n", r.WorldRank(), r.Grid(), r.Device())
		return &cudaBed{ranks: []int{r.WorldRank()}, reducers: []*hier.Reducer{r}}, nil
	} else if !errors.Is(err, rendezvous.ErrNoLaunchEnv) {
		return nil, err
	}

	b := &cudaBed{}
	n := f.machines * f.devices
	for i := range n {
		d, err := cuda.Open(i)
		if err != nil {
			_ = b.Close()
			return nil, fmt.Errorf("%d×%d ranks need %d GPUs: %w", f.machines, f.devices, n, err)
		}
		b.devs = append(b.devs, d)
	}
	var err error
	if b.local, err = cuda.NewLocalRanks(b.devs, f.machines, f.devices); err != nil {
		_ = b.Close()
		return nil, err
	}
	for g, rk := range b.local {
		r, err := hier.NewReducer(ctx, rk, opts...)
		if err != nil {
			_ = b.Close()
			return nil, err
		}
		b.ranks = append(b.ranks, g)
		b.reducers = append(b.reducers, r)
	}
	return b, nil
}

func (b *cudaBed) Ranks() ([]int, []*hier.Reducer) { return b.ranks, b.reducers }

func (b *cudaBed) device(rank int) (*cuda.Device, error) {
	for i, g := range b.ranks {
		if g == rank {
			if d, ok := b.reducers[i].Device().(*cuda.Device); ok {
				return d, nil
			}
		}
	}
	return nil, fmt.Errorf("rank %d is not held by this process", rank)
}

func (b *cudaBed) Upload(rank int, data []byte, dt fairgo.DType) (fairgo.Tensor, error) {
	d, err := b.device(rank)
	if err != nil {
		return fairgo.Tensor{}, err
	}
	t, err := d.AllocTensor(int64(len(data)/dt.Size()), dt)
	if err != nil || len(data) == 0 {
		return t, err
	}
	return t, d.Upload(t.Ptr, data)
}

func (b *cudaBed) Download(rank int, t fairgo.Tensor) ([]byte, error) {
	d, err := b.device(rank)
	if err != nil {
		return nil, err
	}
	out := make([]byte, t.ByteLen())
	if len(out) == 0 {
		return out, nil
	}
	return out, d.Download(out, t.Ptr)
}

// Close closes the Reducers (under a launcher they release the device and
// communicators), then what was built here.
func (b *cudaBed) Close() error {
	errs := []error{hier.CloseAll(b.reducers)}
	if b.local != nil {
		errs = append(errs, cuda.CloseRanks(b.local))
	}
	for _, d := range b.devs {
		errs = append(errs, d.Close())
	}
	return errors.Join(errs...)
}
