package hier_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/sim"
	"github.com/fairgo/fairgo/streams"
)

// opLog is the communicator operations one rank submitted, in order.
type opLog struct {
	mu  sync.Mutex
	ops []string
}

func (l *opLog) add(op string) {
	l.mu.Lock()
	l.ops = append(l.ops, op)
	l.mu.Unlock()
}

func (l *opLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ops...)
}

// recordingComm logs each collective submitted on a communicator, by the
// communicator's role in backend.Comms, then submits it.
type recordingComm struct {
	backend.Comm
	role string
	log  *opLog
}

func (c recordingComm) AllReduce(send, recv uintptr, n int64, dt fairgo.DType, op fairgo.Op, s streams.Stream) error {
	c.log.add(fmt.Sprintf("%s allreduce %d", c.role, n))
	return c.Comm.AllReduce(send, recv, n, dt, op, s)
}

func (c recordingComm) ReduceScatter(send, recv uintptr, n int64, dt fairgo.DType, op fairgo.Op, s streams.Stream) error {
	c.log.add(fmt.Sprintf("%s reduce-scatter %d", c.role, n))
	return c.Comm.ReduceScatter(send, recv, n, dt, op, s)
}

func (c recordingComm) AllGather(send, recv uintptr, n int64, dt fairgo.DType, s streams.Stream) error {
	c.log.add(fmt.Sprintf("%s all-gather %d", c.role, n))
	return c.Comm.AllGather(send, recv, n, dt, s)
}

func (c recordingComm) Broadcast(send, recv uintptr, n int64, dt fairgo.DType, root int, s streams.Stream) error {
	c.log.add(fmt.Sprintf("%s broadcast %d", c.role, n))
	return c.Comm.Broadcast(send, recv, n, dt, root, s)
}

// recordingReducers makes a sim cluster of cfg and a Reducer with opts on
// each of its ranks, every communicator of which logs what is submitted on
// it (recordingComm; roles world, intra-rs, intra-ag, rail-collect,
// rail-diffuse and check), one log per rank.
func recordingReducers(t *testing.T, cfg sim.Config, opts ...hier.Option) (*sim.Cluster, []*hier.Reducer, []*opLog) {
	c, err := sim.NewCluster(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	logs := make([]*opLog, c.Size())
	rs := make([]*hier.Reducer, c.Size())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var eg errgroup.Group
	for g := range rs {
		logs[g] = &opLog{}
		rk := c.Rank(g)
		wrap := func(cm *backend.Comm, role string) { *cm = recordingComm{Comm: *cm, role: role, log: logs[g]} }
		wrap(&rk.Comms.World, "world")
		wrap(&rk.Comms.IntraReduceScatter, "intra-rs")
		wrap(&rk.Comms.IntraAllGather, "intra-ag")
		wrap(&rk.Comms.RailCollect, "rail-collect")
		wrap(&rk.Comms.RailDiffuse, "rail-diffuse")
		wrap(&rk.Comms.Check, "check")
		eg.Go(func() error {
			var err error
			rs[g], err = hier.NewReducer(ctx, rk, opts...)
			return err
		})
	}
	require.NoError(t, eg.Wait())
	t.Cleanup(func() { require.NoError(t, hier.CloseAll(rs)) })
	return c, rs, logs
}

// TestCheckKeepsItsPlaceAmongTheData: NCCL asks that operations of
// communicators used at once be submitted in the same order on every rank,
// or a GPU that runs one before the other may hang. Every rank submits the
// same sequence of data and check operations, whatever the streams' delays,
// with calls back to back, waited for late, and a call every rank refuses.
func TestCheckKeepsItsPlaceAmongTheData(t *testing.T) {
	c, rs, logs := recordingReducers(t, sim.Config{Machines: 2, Devices: 2, Seed: 3, Jitter: 300 * time.Microsecond},
		hier.WithAlgorithm(hier.RailRSAG), hier.WithFlatThreshold(4<<10), hier.WithFingerprintMax(0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	counts := []int64{100, 5000, 1 << 14, 7, 40000, 1000}
	bufs := make([][]fairgo.Tensor, len(rs))
	for g := range rs {
		for _, n := range counts {
			tn, err := c.Device(g).AllocTensor(n, fairgo.Float32)
			require.NoError(t, err)
			bufs[g] = append(bufs[g], tn)
		}
	}
	var works []*hier.Work
	for round := range 3 {
		for g, r := range rs {
			for i, tn := range bufs[g] {
				works = append(works, r.AllReduce(ctx, tn, fairgo.Sum))
				if round == 1 && i == 2 {
					require.Error(t, r.AllReduce(ctx, tn, fairgo.Op(99)).Wait(ctx), "refused on every rank")
				}
			}
		}
	}
	for _, w := range works {
		require.NoError(t, w.Wait(ctx))
	}
	want := logs[0].get()
	checks := 0
	for _, op := range want {
		if op == "check allreduce 19" { // the image: 2 × 8 words of the shape, the refusing rank, the agreement's two
			checks++
		}
	}
	require.Equal(t, 3*len(counts)+1, checks, "one check per call, the refused one too")
	for g := 1; g < len(logs); g++ {
		require.Equal(t, want, logs[g].get(), "rank %d submitted its operations in another order than rank 0", g)
	}
}
