package bench

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/sim"
	"github.com/fairgo/fairgo/streams"
)

// simBed holds every rank of a simulated cluster in this process.
type simBed struct {
	cluster *sim.Cluster
	ranks   []Rank
	info    Info
}

func openSim(_ context.Context, s TestbedSpec) (Testbed, error) {
	c, err := sim.NewCluster(sim.Config{Machines: s.Machines, Devices: s.Devices, Seed: s.Seed, Jitter: s.Jitter})
	if err != nil {
		return nil, fmt.Errorf("bench: sim cluster: %w", err)
	}
	b := &simBed{cluster: c}
	host, _ := os.Hostname()
	b.info = Info{Backend: "sim", Timing: "wall clock on the host (sim timings are not GPU timings)", SimTimings: true,
		Machines: s.Machines, Devices: s.Devices, Processes: 1, Host: host}
	for g := 0; g < c.Size(); g++ {
		dev := c.Device(g)
		st, err := dev.NewStream()
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("bench: sim stream: %w", err)
		}
		b.ranks = append(b.ranks, &simRank{dev: dev, rank: c.Rank(g), world: g, stream: st.(*sim.Stream)})
		b.info.GPUs = append(b.info.GPUs, dev.String())
	}
	return b, nil
}

func (b *simBed) Info() Info                    { return b.info }
func (b *simBed) Ranks() []Rank                 { return b.ranks }
func (b *simBed) Barrier(context.Context) error { return nil }
func (b *simBed) Root() bool                    { return true }
func (b *simBed) Gather(_ context.Context, _ string, blob []byte) ([][]byte, error) {
	return [][]byte{blob}, nil
}
func (b *simBed) Close() error { return b.cluster.Close() }

type simRank struct {
	dev    *sim.Device
	rank   hier.Rank
	world  int
	stream *sim.Stream
}

func (r *simRank) Hier() hier.Rank        { return r.rank }
func (r *simRank) WorldRank() int         { return r.world }
func (r *simRank) Stream() streams.Stream { return r.stream }
func (r *simRank) Alloc(count int64, dt fairgo.DType) (fairgo.Tensor, error) {
	return r.dev.AllocTensor(count, dt)
}
func (r *simRank) Upload(t fairgo.Tensor, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	return r.dev.Upload(t.Ptr, data)
}
func (r *simRank) Download(t fairgo.Tensor) ([]byte, error) {
	out := make([]byte, t.ByteLen())
	if len(out) == 0 {
		return out, nil
	}
	return out, r.dev.Download(out, t.Ptr)
}
func (r *simRank) Time(ctx context.Context, fn func() error) (time.Duration, error) {
	start := time.Now()
	if err := fn(); err != nil {
		return 0, err
	}
	if err := r.stream.Synchronize(ctx); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}
