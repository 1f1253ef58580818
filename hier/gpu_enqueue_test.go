package hier_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/cuda"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/hier/setup"
	"github.com/fairgo/fairgo/streams"
)

// BenchmarkGPUEnqueueFloor is T6's floor under a launcher
// (FAIRGO_ENQUEUE_WORKER=1, one rank per process, a fixed -test.benchtime):
// the host time of NCCL's own allreduce enqueue on the world communicator
// of setup.New's Reducer ("nccl"), and of that enqueue plus the event
// record every call needs for its completion ("nccl+event"), with the
// calls of BenchmarkGPUEnqueueJob (64 KiB and 1 MiB of float32, 32 back
// to back, then a wait). What fairgo's enqueue costs beyond these is its
// own. Two more cases load the host as the Reducer's other goroutines do,
// every fourth call: "side=poll" polls the call's completion event from
// another goroutine (the watcher), "side=check" then also enqueues a small
// allreduce on the check communicator and polls it (the checker), so that
// what the check costs the caller's enqueue can be told apart. One call at
// a time (batch=1, ns/op the whole call), two more cases weigh how a
// fingerprint could travel with the data: "side=fp-concat" reduces the
// data and a fingerprint's 297 elements as one allreduce (the staged copy's
// length, without its copies), "side=fp-group" the data and then the
// fingerprint, in mapped host memory, as a second allreduce in the same
// NCCL group.
// It opens its own job: run it in a process of its own, not with
// BenchmarkGPUEnqueueJob (two jobs of one store prefix in one process are
// refused).
func BenchmarkGPUEnqueueFloor(b *testing.B) {
	_, comms, dev, grid := enqueueWorkerJob(b)
	sizes := func(batch int, sides ...string) {
		for _, size := range []int64{64 << 10, 1 << 20} {
			for _, side := range sides {
				name := "nccl+event"
				if side != "" {
					name += "/side=" + side
				}
				b.Run(fmt.Sprintf("%s/%s/%dKiB/batch=%d", grid, name, size>>10, batch), func(b *testing.B) {
					benchNCCLEnqueue(b, dev, comms, size, side, batch)
				})
			}
		}
	}
	sizes(32, "", "poll", "check")
	b.Run(grid+"/nccl/64KiB/batch=32", func(b *testing.B) { benchNCCLEnqueue(b, dev, comms, 64<<10, "none", 32) })
	sizes(1, "", "fp-concat", "fp-group") // one call at a time: each waited for before the next
}

// enqueueWorkerJob is the job of an enqueue benchmark's worker: it skips
// the benchmark unless FAIRGO_ENQUEUE_WORKER=1 (a worker under a launcher),
// else returns a Reducer built as setup.New builds it (released at the
// end), its communicators, its GPU and its grid as "MxD".
func enqueueWorkerJob(b *testing.B) (*hier.Reducer, backend.Comms, *cuda.Device, string) {
	b.Helper()
	if os.Getenv("FAIRGO_ENQUEUE_WORKER") != "1" {
		b.Skip("a worker under a launcher (FAIRGO_ENQUEUE_WORKER=1, fixed -test.benchtime)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rks, err := setup.Connect(ctx, nil, cuda.Backend{}, nil)
	require.NoError(b, err)
	rk := rks[0]
	r, err := hier.NewReducer(ctx, rk, hier.WithInlineEnqueue(true), hier.WithTimeout(time.Minute))
	if err != nil {
		_ = rk.Release()
	}
	require.NoError(b, err)
	b.Cleanup(func() {
		_ = r.Close()
		_ = rk.Release()
	})
	g := r.Grid()
	return r, rk.Comms, rk.Device.(*cuda.Device), fmt.Sprintf("%dx%d", g.Machines, g.Devices)
}

// benchNCCLEnqueue times NCCL allreduce enqueues of size bytes on the
// world communicator, batch back to back and then waited for, with side
// load side ("": none, "none": not even the event record).
func benchNCCLEnqueue(b *testing.B, dev *cuda.Device, comms backend.Comms, size int64, side string, batch int) {
	count := size / 4
	if side == "fp-concat" { // the data and a fingerprint's elements, as one allreduce
		count += int64(hier.FingerprintElems)
	}
	t, err := dev.AllocTensor(count, fairgo.Float32)
	require.NoError(b, err)
	b.Cleanup(func() { _ = dev.Free(t.Ptr) })
	var fp uintptr // fp-group: the fingerprint's elements in mapped host memory
	if side == "fp-group" {
		fpHost, err := dev.AllocHost(hier.FingerprintElems * 4)
		require.NoError(b, err)
		b.Cleanup(func() { _ = dev.FreeHost(fpHost) })
		fp, err = dev.DevicePointer(fpHost)
		require.NoError(b, err)
	}
	chk, err := dev.Alloc(4096)
	require.NoError(b, err)
	b.Cleanup(func() { _ = dev.Free(chk) })
	s, err := dev.NewStream()
	require.NoError(b, err)
	sideStream, err := dev.NewStream()
	require.NoError(b, err)
	b.Cleanup(func() { _ = streams.Release(s); _ = streams.Release(sideStream) })
	evs := make([]*cuda.Event, 33)
	for i := range evs {
		evs[i], err = dev.CreateEvent(false)
		require.NoError(b, err)
	}
	b.Cleanup(func() {
		for _, ev := range evs {
			_ = ev.Close()
		}
	})
	drain := func() {
		require.NoError(b, evs[32].Record(s))
		require.NoError(b, evs[32].Synchronize())
	}
	// One untimed call on each communicator: NCCL connects at first use.
	require.NoError(b, comms.World.AllReduce(t.Ptr, t.Ptr, t.Count, t.DType, fairgo.Sum, s))
	require.NoError(b, comms.Check.AllReduce(chk, chk, 512, fairgo.Int64, fairgo.Max, s))
	drain()
	sideEv, err := dev.CreateEvent(false)
	require.NoError(b, err)
	b.Cleanup(func() { _ = sideEv.Close() })
	work := make(chan *cuda.Event, 64)
	var busy sync.WaitGroup // side work not done yet
	sideDone := make(chan error, 1)
	go func() { // the side load: every rank gets the same events, in order
		var err error
		for ev := range work {
			if err == nil {
				err = ev.Wait(ctx0)
			}
			if err == nil && side == "check" {
				err = comms.Check.AllReduce(chk, chk, 512, fairgo.Int64, fairgo.Max, sideStream)
				if err == nil {
					err = sideEv.Record(sideStream)
				}
				if err == nil {
					err = sideEv.Wait(ctx0)
				}
			}
			busy.Done()
		}
		sideDone <- err
	}()
	var host time.Duration
	calls := 0
	b.SetBytes(size)
	for b.Loop() {
		ev := evs[calls%32]
		if calls%32 == 0 {
			busy.Wait() // the side load of the previous batch is done before its events are reused
		}
		start := time.Now()
		var err error
		if side == "fp-group" { // the data, and a fingerprint in mapped host memory, in one NCCL group
			err = dev.Group(func() error {
				if err := comms.World.AllReduce(t.Ptr, t.Ptr, t.Count, t.DType, fairgo.Sum, s); err != nil {
					return err
				}
				return comms.World.AllReduce(fp, fp, int64(hier.FingerprintElems), fairgo.Float32, fairgo.Sum, s)
			})
		} else {
			err = comms.World.AllReduce(t.Ptr, t.Ptr, t.Count, t.DType, fairgo.Sum, s)
		}
		if err == nil && side != "none" {
			err = ev.Record(s)
		}
		host += time.Since(start)
		require.NoError(b, err)
		if side == "poll" || side == "check" {
			if calls%4 == 0 {
				busy.Add(1)
				work <- ev
			}
		}
		if calls++; calls%batch == 0 {
			drain()
		}
	}
	drain()
	close(work)
	require.NoError(b, <-sideDone)
	b.ReportMetric(float64(host.Nanoseconds())/float64(calls), "enqueue-ns/op")
}

var ctx0 = context.Background()
