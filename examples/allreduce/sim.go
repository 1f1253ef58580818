package main

import (
	"context"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/sim"
)

// simBed holds every rank of a simulated cluster in this process.
type simBed struct {
	cluster  *sim.Cluster
	reducers []*hier.Reducer
}

func openSim(ctx context.Context, f flags, opts []hier.Option) (testbed, error) {
	c, err := sim.NewCluster(sim.Config{Machines: f.machines, Devices: f.devices, Seed: int64(f.seed), Jitter: f.jitter})
	if err != nil {
		return nil, err
	}
	rs, err := c.Reducers(ctx, opts...)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return &simBed{cluster: c, reducers: rs}, nil
}

func (b *simBed) Ranks() ([]int, []*hier.Reducer) {
	ranks := make([]int, len(b.reducers))
	for i := range ranks {
		ranks[i] = i
	}
	return ranks, b.reducers
}

func (b *simBed) Upload(rank int, data []byte, dt fairgo.DType) (fairgo.Tensor, error) {
	dev := b.cluster.Device(rank)
	t, err := dev.AllocTensor(int64(len(data)/dt.Size()), dt)
	if err != nil {
		return t, err
	}
	if len(data) > 0 {
		err = dev.Upload(t.Ptr, data)
	}
	return t, err
}

func (b *simBed) Download(rank int, t fairgo.Tensor) ([]byte, error) {
	out := make([]byte, t.ByteLen())
	if len(out) == 0 {
		return out, nil
	}
	return out, b.cluster.Device(rank).Download(out, t.Ptr)
}

func (b *simBed) Close() error {
	for _, r := range b.reducers {
		_ = r.Close()
	}
	return b.cluster.Close()
}
