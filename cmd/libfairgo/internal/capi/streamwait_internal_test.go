package capi

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/reftest"
	"github.com/fairgo/fairgo/sim"
	"github.com/fairgo/fairgo/streams"
)

// TestStreamWaitOfAnEnqueuedCallIsFree: the C ABI's stream wait of a call
// already enqueued (an inline call on the caller's stream, as a trainer's
// allreduce through the C ABI usually is) allocates nothing and starts no
// goroutine: no timer, no watcher of its own, nothing that wakes a thread
// on the caller's path.
func TestStreamWaitOfAnEnqueuedCallIsFree(t *testing.T) {
	c, err := sim.NewCluster(sim.Config{Machines: 1, Devices: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rs, err := c.Reducers(ctx, hier.WithInlineEnqueue(true))
	require.NoError(t, err)
	t.Cleanup(func() { _ = hier.CloseAll(rs) })
	var works []*hier.Work
	s := make([]streams.Stream, len(rs))
	for g, r := range rs {
		st, err := c.Device(g).NewStream()
		require.NoError(t, err)
		s[g] = st
		tn, err := c.Device(g).AllocTensor(256, fairgo.Float32)
		require.NoError(t, err)
		works = append(works, r.AllReduce(ctx, tn, fairgo.Sum, hier.After(st)))
	}
	for g, w := range works {
		<-w.Enqueued()
		allocs := testing.AllocsPerRun(100, func() {
			require.NoError(t, streamWait(w, s[g], time.Second))
		})
		require.Zero(t, allocs, "rank %d: a timer or a goroutine on the caller's path", g)
	}
	require.NoError(t, reftest.WaitAll(works))
}
