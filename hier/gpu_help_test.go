package hier_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/cuda"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/streams"
)

// TestGPUWaitsAfterABurst enqueues 20 calls back to back, lets the GPUs
// finish them, and waits for each in call order, the watchers held: every
// result is right, and the Waits ask the driver at most twice a rank (the
// oldest call's event, then the newest's on the same stream), not once a
// call.
func TestGPUWaitsAfterABurst(t *testing.T) {
	for _, grid := range gpuGrids(t, [2]int{1, 2}, [2]int{2, 1}) {
		t.Run(fmt.Sprintf("%dx%d", grid[0], grid[1]), func(t *testing.T) {
			w := gpuWorld(t, grid[0], grid[1], hier.WithAlgorithm(hier.Flat), hier.WithTimeout(30*time.Second))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			sumOnEveryRank(t, w) // past the first call's agreements
			// The watchers held: the Waits alone complete the calls.
			for _, r := range w.reducers {
				hier.HoldWatcher(r, true)
			}
			t.Cleanup(func() {
				for _, r := range w.reducers {
					hier.HoldWatcher(r, false)
				}
			})
			const calls, count = 20, 16384
			tensors := make([][]fairgo.Tensor, calls)
			works := make([][]*hier.Work, calls)
			for i := range calls {
				data := make([][]byte, w.size())
				for g := range data {
					data[g] = int32s(count, int32(100*i+g+1))
				}
				tensors[i] = w.upload(t, fairgo.Int32, data)
				for g, r := range w.reducers {
					works[i] = append(works[i], r.AllReduce(ctx, tensors[i][g], fairgo.Sum))
				}
			}
			queries := make([]uint64, len(w.reducers))
			for g, r := range w.reducers {
				queries[g] = hier.HelpQueries(r)
				// Every call enqueued (the engine goes in call order), and
				// done on the device.
				s, err := w.devs[g].NewStream()
				require.NoError(t, err)
				require.NoError(t, works[calls-1][g].StreamWait(ctx, s))
				require.NoError(t, w.devs[g].(*cuda.Device).Synchronize())
				require.NoError(t, streams.Release(s))
			}
			for g, r := range w.reducers {
				for i := range calls {
					require.NoError(t, works[i][g].Wait(ctx), "call %d, rank %d", i, w.rank(g))
				}
				require.LessOrEqual(t, hier.HelpQueries(r)-queries[g], uint64(2), "rank %d", w.rank(g))
			}
			for i := range calls {
				var want int32
				for g := range w.size() {
					want += int32(100*i + g + 1)
				}
				for g, got := range w.download(t, tensors[i]) {
					require.Equal(t, int32s(count, want), got, "call %d, rank %d", i, w.rank(g))
				}
			}
		})
	}
}
