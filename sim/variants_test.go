package sim

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
)

// variantWorlds calls every rank's Variants.World(ctx, algo), each on a
// goroutine of its own as hier's engines do, and returns the handles by
// global rank and the errors.
func variantWorlds(ctx context.Context, c *Cluster, algo backend.NCCLAlgo, ranks ...int) ([]*Comm, []error) {
	if ranks == nil {
		ranks = seq(c.Size())
	}
	comms, errs := make([]*Comm, c.Size()), make([]error, c.Size())
	var wg sync.WaitGroup
	for _, g := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cm, err := c.Rank(g).Variants.World(ctx, algo)
			if cm != nil {
				comms[g] = cm.(*Comm)
			}
			errs[g] = err
		}()
	}
	wg.Wait()
	return comms, errs
}

func requireVariantWorlds(t *testing.T, c *Cluster, algo backend.NCCLAlgo) []*Comm {
	t.Helper()
	comms, errs := variantWorlds(context.Background(), c, algo)
	for g, err := range errs {
		require.NoError(t, err, "rank %d", g)
	}
	return comms
}

// Each World call gives every rank its member of a world communicator of
// its own: global order whatever the grid order, a sequence of its own,
// right sums; the k-th call of an algorithm makes the k-th communicator.
// Closing a handle closes that handle only; closing the cluster fails them
// all.
func TestVariantsWorld(t *testing.T) {
	c := newCluster(t, Config{Machines: 2, Devices: 2, RankOrder: []int{3, 1, 0, 2}})
	tree := requireVariantWorlds(t, c, backend.AlgoTree)
	ring := requireVariantWorlds(t, c, backend.AlgoRing)
	tree2 := requireVariantWorlds(t, c, backend.AlgoTree)
	ss := make([]*Stream, 4)
	ts := make([]fairgo.Tensor, 4)
	for g := range 4 {
		for _, x := range []struct {
			cm   *Comm
			name string
		}{{tree[g], "flat-tree"}, {ring[g], "flat-ring"}, {tree2[g], "flat-tree#1"}} {
			require.Equal(t, x.name, x.cm.Name())
			require.Equal(t, [2]int{g, 4}, [2]int{x.cm.Rank(), x.cm.Size()}, "%s of rank %d", x.name, g)
			require.Same(t, c.Device(g), x.cm.Device())
		}
		require.NotSame(t, tree[g].g, tree2[g].g, "the second call makes another communicator")
		require.NotSame(t, c.Comms(g).World.(*Comm).g, tree[g].g)
		ss[g] = mkStream(t, c.Device(g))
		ts[g] = tensorOf(t, c.Device(g), fairgo.Float32, float64(g+1), float64(10*g))
		// A call on the world communicator first: the variant does not
		// share its sequence (a shared one would stall or mismatch).
		require.NoError(t, c.Comms(g).World.AllReduce(ts[g].Ptr, ts[g].Ptr, 2, fairgo.Float32, fairgo.Sum, ss[g]))
		require.Equal(t, uint64(0), tree[g].Seq())
		require.NoError(t, tree[g].AllReduce(ts[g].Ptr, ts[g].Ptr, 2, fairgo.Float32, fairgo.Sum, ss[g]))
		require.NoError(t, tree2[g].AllReduce(ts[g].Ptr, ts[g].Ptr, 2, fairgo.Float32, fairgo.Avg, ss[g]))
	}
	for g := range 4 {
		require.NoError(t, syncStream(t, ss[g]))
		require.Equal(t, []float64{40, 240}, values(t, c.Device(g), ts[g]), "rank %d: summed twice, averaged", g)
		require.Equal(t, uint64(1), tree[g].Seq())
	}
	require.NoError(t, tree[0].Close())
	err := tree[0].AllReduce(ts[0].Ptr, ts[0].Ptr, 2, fairgo.Float32, fairgo.Sum, ss[0])
	require.ErrorIs(t, err, fairgo.ErrClosed, "a closed handle")
	require.NoError(t, tree[1].Err(), "the other handles live on")
	require.NoError(t, c.Close())
	require.ErrorIs(t, ring[1].Err(), fairgo.ErrClosed)
	_, err = c.Rank(0).Variants.World(context.Background(), backend.AlgoTree)
	require.ErrorIs(t, err, fairgo.ErrClosed)
}

func TestVariantsWorldUnknownAlgo(t *testing.T) {
	c := newCluster(t, Config{Machines: 1, Devices: 2})
	for _, a := range []backend.NCCLAlgo{"", "Tree", "nvls"} {
		_, err := c.Rank(0).Variants.World(context.Background(), a)
		var ae *fairgo.ArgError
		require.ErrorAs(t, err, &ae, "%q", a)
		_, err = c.NewAlgoWorld(a)
		require.ErrorAs(t, err, &ae, "%q", a)
	}
	// Refused calls are not counted: the next call of every rank meets.
	comms := requireVariantWorlds(t, c, backend.AlgoTree)
	require.Equal(t, "flat-tree", comms[0].Name())
}

// A rank that never asks ends the others' wait in their ctx's error, or
// after the stall timeout in a *StallError, or when the cluster closes;
// a rank that gave up fails the set for every rank, those that come later
// too.
func TestVariantsWorldMissingRank(t *testing.T) {
	t.Run("ctx", func(t *testing.T) {
		c := newCluster(t, Config{Machines: 1, Devices: 3})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		other := make(chan error, 1)
		go func() {
			_, err := c.Rank(1).Variants.World(context.Background(), backend.AlgoTree)
			other <- err
		}()
		_, err := c.Rank(0).Variants.World(ctx, backend.AlgoTree)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, <-other, fairgo.ErrAborted, "the rank that waited with it")
		_, err = c.Rank(2).Variants.World(context.Background(), backend.AlgoTree)
		require.ErrorIs(t, err, fairgo.ErrAborted, "the latecomer")
		// The next set is a fresh one.
		comms := requireVariantWorlds(t, c, backend.AlgoTree)
		require.Equal(t, "flat-tree#1", comms[2].Name())
	})
	t.Run("stall", func(t *testing.T) {
		c := newCluster(t, Config{Machines: 2, Devices: 1, StallTimeout: 20 * time.Millisecond})
		_, err := c.Rank(1).Variants.World(context.Background(), backend.AlgoRing)
		var se *StallError
		require.ErrorAs(t, err, &se)
		require.Equal(t, "flat-ring", se.Comm)
		require.Equal(t, []int{0}, se.Missing)
		require.Equal(t, []int{1}, se.Arrived)
	})
	t.Run("close", func(t *testing.T) {
		c := newCluster(t, Config{Machines: 2, Devices: 1})
		done := make(chan error, 1)
		go func() {
			_, err := c.Rank(0).Variants.World(context.Background(), backend.AlgoRing)
			done <- err
		}()
		time.Sleep(10 * time.Millisecond)
		require.NoError(t, c.Close())
		select {
		case err := <-done:
			require.ErrorIs(t, err, fairgo.ErrClosed)
		case <-time.After(10 * time.Second):
			t.Fatal("World still waits after the cluster closed")
		}
	})
}

// AlgoDelay slows the all-reduces of that algorithm's communicators and
// WorldDelay those of the world communicator, by at least the delay each;
// other algorithms, and the other collectives, keep their pace.
func TestAlgoDelay(t *testing.T) {
	const delay = 150 * time.Millisecond
	c := newCluster(t, Config{Machines: 1, Devices: 2, WorldDelay: delay,
		AlgoDelay: map[backend.NCCLAlgo]time.Duration{backend.AlgoTree: delay}})
	tree := requireVariantWorlds(t, c, backend.AlgoTree)
	ring := requireVariantWorlds(t, c, backend.AlgoRing)
	base, err := c.NewAlgoWorld(backend.AlgoTree)
	require.NoError(t, err)
	require.Equal(t, "flat-tree", base[0].Name())
	ss := []*Stream{mkStream(t, c.Device(0)), mkStream(t, c.Device(1))}
	ts := []fairgo.Tensor{tensorOf(t, c.Device(0), fairgo.Float32, 1), tensorOf(t, c.Device(1), fairgo.Float32, 2)}
	for _, tc := range []struct {
		name    string
		comm    func(g int) backend.Comm
		reduce  bool // all-reduce, else broadcast
		delayed bool
	}{
		{"tree all-reduce", func(g int) backend.Comm { return tree[g] }, true, true},
		{"tree baseline all-reduce", func(g int) backend.Comm { return base[g] }, true, true},
		{"world all-reduce", func(g int) backend.Comm { return c.Comms(g).World }, true, true},
		{"ring all-reduce", func(g int) backend.Comm { return ring[g] }, true, false},
		{"tree broadcast", func(g int) backend.Comm { return tree[g] }, false, false},
		{"check all-reduce", func(g int) backend.Comm { return c.Comms(g).Check }, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			for g := range 2 {
				cm, p := tc.comm(g), ts[g].Ptr
				if tc.reduce {
					require.NoError(t, cm.AllReduce(p, p, 1, fairgo.Float32, fairgo.Max, ss[g]))
				} else {
					require.NoError(t, cm.Broadcast(p, p, 1, fairgo.Float32, 1, ss[g]))
				}
			}
			for g := range 2 {
				require.NoError(t, syncStream(t, ss[g]))
				require.Equal(t, []float64{2}, values(t, c.Device(g), ts[g]))
			}
			took := time.Since(start)
			if tc.delayed {
				require.GreaterOrEqual(t, took, delay)
			} else {
				require.Less(t, took, delay)
			}
		})
	}
}

func TestAlgoDelayIsCopied(t *testing.T) {
	m := map[backend.NCCLAlgo]time.Duration{backend.AlgoTree: time.Second}
	c := newCluster(t, Config{Machines: 1, Devices: 1, AlgoDelay: m})
	m[backend.AlgoTree] = 0
	require.Equal(t, time.Second, c.Config().AlgoDelay[backend.AlgoTree])
	c.Config().AlgoDelay[backend.AlgoTree] = 0
	require.Equal(t, time.Second, c.Config().AlgoDelay[backend.AlgoTree])
}
