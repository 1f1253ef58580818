package cuda

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
)

// windowVar is the variable the window tests hold; NCCL_ALGO itself stays
// untouched.
const windowVar = "FAIRGO_CUDA_TEST_WINDOW"

// setBefore makes windowVar set to *v, or unset for nil, for the test.
func setBefore(t *testing.T, v *string) {
	t.Helper()
	t.Setenv(windowVar, "x") // restored by the test's cleanup
	if v == nil {
		require.NoError(t, os.Unsetenv(windowVar))
		return
	}
	require.NoError(t, os.Setenv(windowVar, *v))
}

// requireEnv checks windowVar against want (nil: unset).
func requireEnv(t *testing.T, want *string, msg string) {
	t.Helper()
	v, ok := os.LookupEnv(windowVar)
	require.Equal(t, want != nil, ok, "%s: set", msg)
	if want != nil {
		require.Equal(t, *want, v, msg)
	}
}

func ptr[T any](v T) *T { return &v }

// The window holds the value while anyone is inside and restores exactly
// what was there (set, empty or unset) when the last one leaves.
func TestEnvWindowRestores(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before *string
	}{
		{"unset before", nil},
		{"set before", ptr("Ring")},
		{"empty before", ptr("")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setBefore(t, tc.before)
			w := &envWindow{name: windowVar}
			ctx := context.Background()
			require.NoError(t, w.enter(ctx, "allreduce:tree"))
			requireEnv(t, ptr("allreduce:tree"), "first inside")
			require.NoError(t, w.enter(ctx, "allreduce:tree"))
			require.NoError(t, w.leave())
			requireEnv(t, ptr("allreduce:tree"), "one still inside")
			require.NoError(t, w.leave())
			requireEnv(t, tc.before, "after the last left")
			require.Error(t, w.leave(), "leaving a closed window")

			// Opened again, it restores the same, not what it set before.
			err := w.within(ctx, "allreduce:ring", func() error {
				requireEnv(t, ptr("allreduce:ring"), "within")
				return fairgo.ErrAborted
			})
			require.ErrorIs(t, err, fairgo.ErrAborted, "fn's error comes back")
			requireEnv(t, tc.before, "after within")
		})
	}
}

// The users of one value are inside at once, as the ranks of one process
// must be (each one's split waits for the others): a window that admitted
// one at a time would leave them waiting here.
func TestEnvWindowSharesAValue(t *testing.T) {
	setBefore(t, nil)
	w := &envWindow{name: windowVar}
	const n = 4
	var inside sync.WaitGroup
	inside.Add(n)
	all := make(chan struct{})
	go func() { inside.Wait(); close(all) }()
	errs := make(chan error, n)
	for range n {
		go func() {
			errs <- w.within(context.Background(), "allreduce:tree", func() error {
				inside.Done()
				select {
				case <-all:
					return nil
				case <-time.After(10 * time.Second):
					return fmt.Errorf("not all %d users were let in together", n)
				}
			})
		}()
	}
	for range n {
		require.NoError(t, <-errs)
	}
	requireEnv(t, nil, "after")
}

// Users of different values never overlap, each sees its own value for as
// long as it is inside, and the variable ends as it began.
func TestEnvWindowNeverOverlaps(t *testing.T) {
	for _, before := range []*string{nil, ptr("Tree")} {
		t.Run(fmt.Sprintf("before=%v", before != nil), func(t *testing.T) {
			setBefore(t, before)
			w := &envWindow{name: windowVar}
			values := []string{"allreduce:ring", "allreduce:tree", "Ring"}
			var in [3]atomic.Int32 // users inside, by value
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for g := range 12 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 1))
					for range 20 {
						k := rng.IntN(len(values))
						err := w.within(context.Background(), values[k], func() error {
							in[k].Add(1)
							defer in[k].Add(-1)
							for range 3 {
								if v := os.Getenv(windowVar); v != values[k] {
									return fmt.Errorf("inside the window of %q the variable is %q", values[k], v)
								}
								for o := range in {
									if o != k && in[o].Load() != 0 {
										return fmt.Errorf("%q is inside with %q", values[o], values[k])
									}
								}
								time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
							}
							return nil
						})
						if err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			requireEnv(t, before, "after")
		})
	}
}

// A user of another value waits until the window closes, or returns ctx's
// error without touching the variable.
func TestEnvWindowWaitsForAnotherValue(t *testing.T) {
	setBefore(t, ptr("Ring"))
	w := &envWindow{name: windowVar}
	require.NoError(t, w.enter(context.Background(), "allreduce:tree"))

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := w.enter(ctx, "allreduce:ring")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	requireEnv(t, ptr("allreduce:tree"), "after the waiter gave up")

	entered := make(chan error, 1)
	go func() { entered <- w.enter(context.Background(), "allreduce:ring") }()
	select {
	case err := <-entered:
		t.Fatalf("entered another value's open window: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	require.NoError(t, w.leave())
	require.NoError(t, <-entered)
	requireEnv(t, ptr("allreduce:ring"), "the waiter's value")
	require.NoError(t, w.leave())
	requireEnv(t, ptr("Ring"), "after")
}

func TestNCCLAlgoValue(t *testing.T) {
	for _, tc := range []struct {
		version int
		algo    backend.NCCLAlgo
		want    string
	}{
		{22803, backend.AlgoTree, "allreduce:tree"},
		{22400, backend.AlgoRing, "allreduce:ring"},
		{22304, backend.AlgoTree, "Tree"},
		{21800, backend.AlgoRing, "Ring"},
	} {
		got, err := ncclAlgoValue(tc.version, tc.algo)
		require.NoError(t, err)
		require.Equal(t, tc.want, got, "%d %s", tc.version, tc.algo)
	}
	for _, algo := range []backend.NCCLAlgo{"", "Tree", "nvls", "tree;broadcast:ring"} {
		_, err := ncclAlgoValue(22803, algo)
		var ae *fairgo.ArgError
		require.ErrorAs(t, err, &ae, "%q", algo)
		require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	}
}

// TestVariants makes every rank's flat-tree and flat-ring copies of its
// world communicator through Rank.Variants, each rank on a goroutine of its
// own as hier's engines call it, and runs every collective on the tree
// copy. NCCL_ALGO is as it was afterwards, and an unknown algorithm is an
// *fairgo.ArgError before any NCCL call.
func TestVariants(t *testing.T) {
	g := commGrids(t)[0]
	if !launched() {
		g = [2]int{1, min(gpuCount(t), 2)}
	}
	ranks := commRanks(t, g[0], g[1])
	before, had := os.LookupEnv("NCCL_ALGO")
	ctx, cancel := context.WithTimeout(context.Background(), jobStoreTimeout)
	defer cancel()
	algos := []backend.NCCLAlgo{backend.AlgoTree, backend.AlgoRing}
	made := make([][]backend.Comm, len(ranks)) // by rank, then algo
	errs := make([]error, len(ranks))
	free0, _, err := rankDevices(ranks)[0].MemInfo()
	require.NoError(t, err)
	start := time.Now()
	var wg sync.WaitGroup
	for i, rk := range ranks {
		require.NotNil(t, rk.Variants, "rank %d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, a := range algos {
				c, err := rk.Variants.World(ctx, a)
				if err != nil {
					errs[i] = fmt.Errorf("World(%s): %w", a, err)
					return
				}
				made[i] = append(made[i], c)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if free1, _, err := rankDevices(ranks)[0].MemInfo(); err == nil {
		t.Logf("%d copies of the %d-rank world communicator per rank in %v; %.1f MiB of device memory each on rank 0",
			len(algos), ranks[0].Comms.World.Size(), took, float64(free0-free1)/float64(len(algos))/(1<<20))
	}
	defer func() {
		for i, cs := range made {
			for _, c := range cs {
				if err := c.Close(); err != nil {
					t.Errorf("rank %d: closing %v: %v", i, c, err)
				}
			}
		}
	}()
	for i, err := range errs {
		require.NoError(t, err, "rank %d", i)
	}
	v, ok := os.LookupEnv("NCCL_ALGO")
	require.Equal(t, [2]any{had, before}, [2]any{ok, v}, "NCCL_ALGO afterwards")
	for i, rk := range ranks {
		w := rk.Comms.World.(*Comm)
		for k, a := range algos {
			c := made[i][k].(*Comm)
			require.Equal(t, "flat-"+string(a), c.Name())
			require.Equal(t, [2]int{w.Size(), w.Rank()}, [2]int{c.Size(), c.Rank()}, "%v of %v", c, w)
			require.Same(t, w.Device(), c.Device())
			require.NotSame(t, w.NCCL(), c.NCCL())
		}
	}
	tree := func(rk backend.Rank) backend.Comm {
		for i := range ranks {
			if ranks[i].Device == rk.Device {
				return made[i][0]
			}
		}
		return nil
	}
	testCollectives(t, ranks, rankStreams(t, ranks), tree, collectiveCount())
	_, err = ranks[0].Variants.World(ctx, "nvls")
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)

	// DuplicateAlgo splits all of this process's ranks at once (the
	// harness's baselines).
	worlds := make([]*Comm, len(ranks))
	for i, rk := range ranks {
		worlds[i] = rk.Comms.World.(*Comm)
	}
	dups, err := DuplicateAlgo(ctx, worlds, backend.AlgoRing, "flat-ring-all")
	require.NoError(t, err)
	for i, c := range dups {
		require.Equal(t, [2]int{worlds[i].Size(), worlds[i].Rank()}, [2]int{c.Size(), c.Rank()})
		require.NoError(t, c.Close())
	}
	v, ok = os.LookupEnv("NCCL_ALGO")
	require.Equal(t, [2]any{had, before}, [2]any{ok, v}, "NCCL_ALGO after DuplicateAlgo")
}
