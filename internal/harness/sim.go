package harness

import (
	"context"
	"fmt"
	"time"

	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/sim"
)

// OpenSim opens every rank of a simulated cluster of s.Machines ×
// s.Devices in this process. Its timings are wall clock on the host, not GPU
// timings, and Info says so.
func OpenSim(s Spec) (*Testbed, error) {
	c, err := sim.NewCluster(sim.Config{Machines: s.Machines, Devices: s.Devices, Seed: s.Seed, Jitter: s.Jitter})
	if err != nil {
		return nil, fmt.Errorf("testbed: sim cluster: %w", err)
	}
	t := &Testbed{
		info: Info{Backend: "sim", Timing: "wall clock on the host (sim timings are not GPU timings)", SimTimings: true,
			NCCLEnv: NCCLEnv(), Machines: s.Machines, Devices: s.Devices, Processes: 1, Host: hostname(),
			Placement: Placement{RanksPerGPU: 1}},
	}
	t.onClose(c.Close)
	t.newAlgo = func(_ context.Context, algo backend.NCCLAlgo) ([]backend.Comm, error) {
		cs, err := c.NewAlgoWorld(algo)
		if err != nil {
			return nil, err
		}
		out := make([]backend.Comm, len(cs))
		for g, cm := range cs {
			out[g] = cm
		}
		return out, nil
	}
	for g := 0; g < c.Size(); g++ {
		dev := c.Device(g)
		st, err := dev.NewStream()
		if err != nil {
			return nil, t.closeOnError(fmt.Errorf("testbed: sim stream: %w", err))
		}
		s := st.(*sim.Stream)
		t.ranks = append(t.ranks, &Rank{Hier: c.Rank(g), Device: dev, WorldRank: g, Stream: s, timer: wallTimer{s}})
		t.info.GPUs = append(t.info.GPUs, dev.String())
	}
	return t, nil
}

// wallTimer times a simulated stream's work by the wall clock until the
// stream is idle.
type wallTimer struct{ s *sim.Stream }

func (w wallTimer) time(ctx context.Context, fn func() error) (time.Duration, error) {
	start := time.Now()
	if err := fn(); err != nil {
		return 0, err
	}
	if err := w.s.Synchronize(ctx); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func (w wallTimer) close() error { return w.s.Destroy() }
