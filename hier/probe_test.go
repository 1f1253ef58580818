package hier_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/reftest"
	"github.com/fairgo/fairgo/sim"
)

// The link probe opens each link with an untimed allreduce of its large
// size, then alternates small and large timed ones: a small first run
// would leave a socket transport's windows for the timed small runs to
// open, and the fit's α would come out too large. Every rank probes alike,
// before Auto times a route, and the call's result is right.
func TestLinkProbeOpensEachLinkWithItsLargeSize(t *testing.T) {
	c, rs, logs := recordingReducers(t, sim.Config{Machines: 2, Devices: 2, Seed: 4}, hier.WithFlatThreshold(64<<10))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a probe and a calibration on a loaded host
	defer cancel()

	const count = 1 << 19 // 2 MiB of float32: probes the links, then calibrates
	rng := rand.New(rand.NewPCG(4, 5))
	in := reftest.RandomInputs(rng, fairgo.Float32, fairgo.Sum, len(rs), count)
	bufs := make([]fairgo.Tensor, len(rs))
	for g := range rs {
		var err error
		bufs[g], err = c.Device(g).AllocTensor(count, fairgo.Float32)
		require.NoError(t, err)
		require.NoError(t, c.Device(g).Upload(bufs[g].Ptr, in[g]))
	}
	var eg errgroup.Group
	for g, r := range rs {
		eg.Go(func() error { return r.AllReduce(ctx, bufs[g], fairgo.Sum).Wait(ctx) })
	}
	require.NoError(t, eg.Wait())
	out := make([][]byte, len(rs))
	for g := range rs {
		out[g] = make([]byte, count*4)
		require.NoError(t, c.Device(g).Download(out[g], bufs[g].Ptr))
	}
	require.NoError(t, reftest.CheckResults(fairgo.Float32, reftest.ComputeReference(fairgo.Float32, fairgo.Sum, in), out))

	large := fmt.Sprint(hier.ProbeLarge / 4)
	small := fmt.Sprint(hier.ProbeSmall / 4)
	want := []string{large}
	for range hier.ProbeRuns {
		want = append(want, small, large)
	}
	for g, l := range logs {
		ops := l.get()
		for _, role := range []string{"intra-rs", "rail-collect"} {
			var sizes []string
			for _, op := range ops {
				if n, ok := strings.CutPrefix(op, role+" allreduce "); ok {
					sizes = append(sizes, n)
				}
			}
			require.GreaterOrEqual(t, len(sizes), len(want), "rank %d, %s: %v", g, role, ops)
			require.Equal(t, want, sizes[:len(want)], "rank %d, %s: the probe's allreduces", g, role)
		}
	}
}
