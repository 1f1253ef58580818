package hier_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/cuda"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/hier/setup"
)

// BenchmarkGPUEnqueueFloor is T6's floor under a launcher
// (FAIRGO_ENQUEUE_WORKER=1, one rank per process, a fixed -test.benchtime):
// the host time of NCCL's own allreduce enqueue on the world communicator
// of setup.New's Reducer ("nccl"), and of that enqueue plus the event
// record every call needs for its completion ("nccl+event"), with the
// calls of BenchmarkGPUEnqueueJob (64 KiB and 1 MiB of float32, 32 back
// to back, then a wait). What fairgo's enqueue costs beyond these is its
// own. It opens its own job: run it in a process of its own, not with
// BenchmarkGPUEnqueueJob (two jobs of one store prefix in one process are
// refused).
func BenchmarkGPUEnqueueFloor(b *testing.B) {
	if os.Getenv("FAIRGO_ENQUEUE_WORKER") != "1" {
		b.Skip("a worker under a launcher (FAIRGO_ENQUEUE_WORKER=1, fixed -test.benchtime)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := setup.New(ctx, nil, cuda.Backend{}, setup.WithReducer(hier.WithTimeout(time.Minute)))
	require.NoError(b, err)
	b.Cleanup(func() { _ = r.Close() })
	dev := r.Device().(*cuda.Device)
	world := r.Comms().World
	grid := fmt.Sprintf("%dx%d", r.Grid().Machines, r.Grid().Devices)
	for _, size := range []int64{64 << 10, 1 << 20} {
		for _, withEvent := range []bool{false, true} {
			name := "nccl"
			if withEvent {
				name += "+event"
			}
			b.Run(fmt.Sprintf("%s/%s/%dKiB/batch=32", grid, name, size>>10), func(b *testing.B) {
				t, err := dev.AllocTensor(size/4, fairgo.Float32)
				require.NoError(b, err)
				b.Cleanup(func() { _ = dev.Free(t.Ptr) })
				s, err := dev.NewStream()
				require.NoError(b, err)
				evs := make([]*cuda.Event, 32)
				for i := range evs {
					evs[i], err = dev.CreateEvent(false)
					require.NoError(b, err)
				}
				b.Cleanup(func() {
					for _, ev := range evs {
						_ = ev.Close()
					}
				})
				// One untimed call: NCCL connects at its first use.
				require.NoError(b, world.AllReduce(t.Ptr, t.Ptr, t.Count, t.DType, fairgo.Sum, s))
				require.NoError(b, evs[0].Record(s))
				require.NoError(b, evs[0].Synchronize())
				var host time.Duration
				calls := 0
				b.SetBytes(size)
				for b.Loop() {
					start := time.Now()
					err := world.AllReduce(t.Ptr, t.Ptr, t.Count, t.DType, fairgo.Sum, s)
					if err == nil && withEvent {
						err = evs[calls%32].Record(s)
					}
					host += time.Since(start)
					require.NoError(b, err)
					if calls++; calls%32 == 0 {
						require.NoError(b, evs[0].Record(s))
						require.NoError(b, evs[0].Synchronize())
					}
				}
				require.NoError(b, evs[0].Record(s))
				require.NoError(b, evs[0].Synchronize())
				b.ReportMetric(float64(host.Nanoseconds())/float64(calls), "enqueue-ns/op")
			})
		}
	}
}
