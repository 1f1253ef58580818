package hier_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/reftest"
	"github.com/fairgo/fairgo/sim"
	"github.com/fairgo/fairgo/streams"
)

// customWorld is newWorld with each rank's backend.Rank adjusted by
// mutate before its Reducer is built.
func customWorld(t testing.TB, cfg sim.Config, mutate func(g int, rk *backend.Rank), opts ...hier.Option) *world {
	t.Helper()
	c, err := sim.NewCluster(cfg)
	require.NoError(t, err)
	rs := make([]*hier.Reducer, c.Size())
	var eg errgroup.Group
	for g := range rs {
		eg.Go(func() error {
			rk := c.Rank(g)
			if mutate != nil {
				mutate(g, &rk)
			}
			var err error
			rs[g], err = hier.NewReducer(context.Background(), rk, opts...)
			return err
		})
	}
	if err := eg.Wait(); err != nil {
		_ = hier.CloseAll(rs)
		_ = c.Close()
		require.NoError(t, err)
	}
	devs := make([]testDevice, c.Size())
	for g := range devs {
		devs[g] = c.Device(g)
	}
	w := &world{cluster: c, devs: devs, reducers: rs, m: cfg.Machines, d: cfg.Devices, closeFn: func() { _ = c.Close() }}
	t.Cleanup(w.close)
	return w
}

// slowComm is a communicator whose calls wait d on their stream first:
// every collective (all), or its all-to-alls only. It makes the routes
// over it slow where a test wants another candidate to win.
type slowComm struct {
	backend.Comm
	dev *sim.Device
	d   time.Duration
	all bool
}

func (c slowComm) wait(s streams.Stream, all bool) error {
	if !all {
		return nil
	}
	return c.dev.DelayAsync(c.d, s)
}

func (c slowComm) AllReduce(send, recv uintptr, count int64, dt fairgo.DType, op fairgo.Op, s streams.Stream) error {
	if err := c.wait(s, c.all); err != nil {
		return err
	}
	return c.Comm.AllReduce(send, recv, count, dt, op, s)
}

func (c slowComm) ReduceScatter(send, recv uintptr, n int64, dt fairgo.DType, op fairgo.Op, s streams.Stream) error {
	if err := c.wait(s, c.all); err != nil {
		return err
	}
	return c.Comm.ReduceScatter(send, recv, n, dt, op, s)
}

func (c slowComm) AllGather(send, recv uintptr, n int64, dt fairgo.DType, s streams.Stream) error {
	if err := c.wait(s, c.all); err != nil {
		return err
	}
	return c.Comm.AllGather(send, recv, n, dt, s)
}

func (c slowComm) AllToAllv(send uintptr, sendCounts, sendDispls []int64, recv uintptr, recvCounts,
	recvDispls []int64, dt fairgo.DType, s streams.Stream) error {
	if err := c.wait(s, true); err != nil {
		return err
	}
	return c.Comm.AllToAllv(send, sendCounts, sendDispls, recv, recvCounts, recvDispls, dt, s)
}

// treeFastest makes every candidate but NCCL's tree slow on the
// simulator: NCCL's default and its ring (the world's all-reduces and the
// ring variant's, Config's delays), the rails' collectives (the hierarchy's
// forms) and the world's all-to-alls (halving-doubling's steps).
func treeFastest(cfg sim.Config, d time.Duration) (sim.Config, func(int, *backend.Rank)) {
	cfg.WorldDelay = d
	cfg.AlgoDelay = map[backend.NCCLAlgo]time.Duration{backend.AlgoRing: d}
	return cfg, func(_ int, rk *backend.Rank) {
		dev := rk.Device.(*sim.Device)
		rk.Comms.World = slowComm{Comm: rk.Comms.World, dev: dev, d: d / 2}
		if rk.Comms.RailCollect != nil {
			rk.Comms.RailCollect = slowComm{Comm: rk.Comms.RailCollect, dev: dev, d: d, all: true}
			rk.Comms.RailDiffuse = slowComm{Comm: rk.Comms.RailDiffuse, dev: dev, d: d, all: true}
		}
	}
}

// reduceAll runs one allreduce of random data of count elements on every
// rank and checks it against the reference.
func reduceAll(t *testing.T, w *world, rng *rand.Rand, dt fairgo.DType, op fairgo.Op, count int) {
	t.Helper()
	in := reftest.RandomInputs(rng, dt, op, w.size(), count)
	out, err := w.allReduce(t, dt, op, in)
	require.NoError(t, err)
	require.NoError(t, reftest.CheckResults(dt, reftest.ComputeReference(dt, op, in), out))
}

// requireSameChoices asserts that every rank reports rank 0's choices
// (what each rank's own clock measured aside).
func requireSameChoices(t *testing.T, w *world) {
	t.Helper()
	for g, r := range w.reducers[1:] {
		require.Equal(t, withoutCosts(w.reducers[0].Choices()), withoutCosts(r.Choices()), "rank %d", g+1)
	}
}

// With every candidate but NCCL's tree slowed on the simulator, Auto
// chooses the tree for the small classes on every grid, one device per
// machine and one machine included, alike on every rank, and the calls'
// results stay right; the calibration reports what making the variants
// cost.
func TestAutoChoosesTheFastestOnEveryGrid(t *testing.T) {
	const delay = 30 * time.Millisecond
	for _, g := range [][2]int{{4, 1}, {8, 1}, {2, 2}, {1, 4}} {
		t.Run(fmt.Sprintf("%dx%d", g[0], g[1]), func(t *testing.T) {
			cfg, slow := treeFastest(sim.Config{Machines: g[0], Devices: g[1], Seed: 11, Jitter: 10 * time.Microsecond},
				delay)
			w := customWorld(t, cfg, slow)
			rng := rand.New(rand.NewPCG(uint64(g[0]), uint64(g[1])))
			for _, count := range []int{20 << 10, 40 << 10, 20<<10 + 1} { // 80 KB, 160 KB: two classes
				reduceAll(t, w, rng, fairgo.Float32, fairgo.Sum, count)
			}
			requireSameChoices(t, w)
			for _, bytes := range []int64{80 << 10, 160 << 10} {
				c := w.reducers[0].ChoiceFor(bytes)
				require.Equal(t, hier.FlatTree, c.Algorithm, "%d bytes: %+v", bytes, c.Calibration)
				require.True(t, c.Measured)
				require.Contains(t, c.Calibration.Times, "flat")
				require.Contains(t, c.Calibration.Times, "flat-ring")
				if g[0]*g[1] >= 4 {
					require.Contains(t, c.Calibration.Times, "halving-doubling")
				}
				if g[1] == 1 {
					require.Contains(t, c.Calibration.Times, "rail-a2a-serial")
				}
				require.Less(t, c.Calibration.Cost, 10*time.Second)
			}
			first := w.reducers[0].ChoiceFor(80 << 10).Calibration
			require.Positive(t, first.Setup, "the first class made the variants")
			require.Less(t, first.Setup, first.Cost)
			require.Zero(t, w.reducers[0].ChoiceFor(160<<10).Calibration.Setup, "made once")
			require.Equal(t, hier.Flat, w.reducers[0].AlgorithmFor(64<<10-1), "below the smallest class")
		})
	}
}

// hostClockDevice is a device without timing events: the calibration
// times its candidates by the host's clock.
type hostClockDevice struct{ backend.Device }

// A device without timing events (backend.EventTimer) is calibrated by the
// host's clock, and Auto still finds the fastest candidate.
func TestAutoTimesByTheHostClockWithoutTimingEvents(t *testing.T) {
	cfg, slow := treeFastest(sim.Config{Machines: 4, Devices: 1, Seed: 13}, 30*time.Millisecond)
	w := customWorld(t, cfg, func(g int, rk *backend.Rank) {
		slow(g, rk)
		_, timed := rk.Device.(backend.EventTimer)
		require.True(t, timed, "the simulator has timing events")
		rk.Device = hostClockDevice{rk.Device}
	})
	reduceAll(t, w, rand.New(rand.NewPCG(4, 1)), fairgo.Float32, fairgo.Sum, 20<<10)
	requireSameChoices(t, w)
	c := w.reducers[0].ChoiceFor(80 << 10)
	require.Equal(t, hier.FlatTree, c.Algorithm, "%+v", c.Calibration)
	for name, d := range c.Calibration.Times {
		require.Positive(t, d, name)
	}
}

// Where NCCL's allreduces and the rail's all-to-all are all slow, Auto
// chooses halving-doubling on 8 machines of one device. Its six steps are
// six meetings of every rank on the simulator, which under the race
// detector on a loaded host took up to 95 ms a call: the others wait more
// than twice that.
func TestAutoChoosesHalvingDoublingWhereItIsFastest(t *testing.T) {
	const delay = 250 * time.Millisecond
	cfg := sim.Config{Machines: 8, Devices: 1, Seed: 12, WorldDelay: delay,
		AlgoDelay: map[backend.NCCLAlgo]time.Duration{backend.AlgoRing: delay, backend.AlgoTree: delay}}
	w := customWorld(t, cfg, func(_ int, rk *backend.Rank) {
		dev := rk.Device.(*sim.Device)
		rk.Comms.RailCollect = slowComm{Comm: rk.Comms.RailCollect, dev: dev, d: delay}
		rk.Comms.RailDiffuse = slowComm{Comm: rk.Comms.RailDiffuse, dev: dev, d: delay}
	})
	rng := rand.New(rand.NewPCG(8, 1))
	for _, op := range []fairgo.Op{fairgo.Sum, fairgo.Avg} {
		reduceAll(t, w, rng, fairgo.Float32, op, 20<<10+3)
	}
	requireSameChoices(t, w)
	ch := w.reducers[0].ChoiceFor(80 << 10)
	require.Equal(t, hier.HalvingDoubling, ch.Algorithm, "%+v", ch.Calibration)
}

// Every new algorithm matches the reference for every element type and
// operator, on worlds of 2 to 9 ranks (powers of two or not, one device
// per machine or several), for counts of 0, 1, fewer than the ranks, odd
// ones and a few thousand; halving-doubling and recursive doubling also on
// a buffer that is not aligned to its elements and in pieces (a call
// larger than its chunk).
func TestNewAlgorithmsMatchTheReference(t *testing.T) {
	t.Parallel() // its own simulated worlds; CPU-bound, it overlaps the other parallel tests
	type gridCase struct{ m, d int }
	grids := []gridCase{{2, 1}, {3, 1}, {4, 1}, {5, 1}, {2, 3}, {7, 1}, {8, 1}, {3, 3}}
	for _, algo := range []hier.Algorithm{hier.HalvingDoubling, hier.RecursiveDoubling, hier.FlatRing, hier.FlatTree,
		hier.RailAllToAll} {
		for _, g := range grids {
			pairwise := algo == hier.HalvingDoubling || algo == hier.RecursiveDoubling
			if !pairwise && g.m*g.d%3 != 2 && g.m*g.d != 9 {
				continue // NCCL's own collectives on other communicators: a few worlds suffice
			}
			if algo == hier.RailAllToAll && g.d != 1 {
				continue // the rail all-to-all with one device per machine, newly a candidate
			}
			t.Run(fmt.Sprintf("%v/%dx%d", algo, g.m, g.d), func(t *testing.T) {
				w := newWorld(t, sim.Config{Machines: g.m, Devices: g.d, Seed: int64(g.m), Jitter: 5 * time.Microsecond},
					hier.WithAlgorithm(algo), hier.WithFlatThreshold(1))
				for _, r := range w.reducers {
					hier.SetHalvingChunk(r, 4<<10)
				}
				n := w.size()
				counts := []int{0, 1, n - 1, 2*n + 1, 1001, 3001} // 3001 × 4 bytes and more: in pieces
				var batch []allReduceJob
				rng := rand.New(rand.NewPCG(uint64(n), uint64(algo)))
				for _, dt := range fairgo.DTypes {
					for _, op := range fairgo.Ops {
						for _, count := range counts {
							batch = append(batch, allReduceJob{dt: dt, op: op,
								in: reftest.RandomInputs(rng, dt, op, n, count)})
						}
					}
				}
				batch = append(batch, allReduceJob{dt: fairgo.Float32, op: fairgo.Avg, offset: 4,
					in: reftest.RandomInputs(rng, fairgo.Float32, fairgo.Avg, n, 777)})
				runBatch(t, w, batch)
				for _, r := range w.reducers {
					require.Equal(t, algo, r.AlgorithmFor(1<<20))
				}
			})
		}
	}
}

// allReduceJob is one allreduce of a batch: its inputs (by rank), and the
// byte offset of its buffer in an allocation (a multiple of the element
// size, which Validate requires, but not of 16: the kernels' vector paths
// do not apply).
type allReduceJob struct {
	dt     fairgo.DType
	op     fairgo.Op
	in     [][]byte
	offset int
}

// runBatch makes every job's allreduce on every rank, each on a buffer of
// its own, before waiting for any, and checks each against its reference.
func runBatch(t *testing.T, w *world, batch []allReduceJob) {
	t.Helper()
	bufs := make([][]fairgo.Tensor, len(batch))
	works := make([]*hier.Work, 0, len(batch)*len(w.reducers))
	for j, job := range batch {
		bufs[j] = make([]fairgo.Tensor, len(w.reducers))
		for g := range w.reducers {
			b := job.in[w.rank(g)]
			raw, err := w.alloc(g, int64(len(b)+job.offset), fairgo.Uint8)
			require.NoError(t, err)
			tn := fairgo.Tensor{Ptr: raw.Ptr + uintptr(job.offset), Bytes: int64(len(b)),
				Count: int64(len(b) / job.dt.Size()), DType: job.dt}
			if len(b) > 0 {
				require.NoError(t, w.devs[g].Upload(tn.Ptr, b))
			} else {
				tn.Ptr = raw.Ptr
			}
			bufs[j][g] = tn
		}
	}
	for j, job := range batch {
		for g, r := range w.reducers {
			works = append(works, r.AllReduce(context.Background(), bufs[j][g], job.op))
		}
	}
	require.NoError(t, reftest.WaitAll(works))
	for j, job := range batch {
		out := w.download(t, bufs[j])
		err := reftest.CheckResults(job.dt, reftest.ComputeReference(job.dt, job.op, job.in), out)
		require.NoError(t, err, "%v %v of %d elements at offset %d", job.dt, job.op,
			len(job.in[0])/job.dt.Size(), job.offset)
	}
}

// countingVariants counts, per NCCL algorithm, the world variants a rank
// made and closed.
type countingVariants struct {
	inner  backend.Variants
	counts *variantCounts
}

type variantCounts struct {
	mu           sync.Mutex
	made, closed map[backend.NCCLAlgo]int
}

func newVariantCounts() *variantCounts {
	return &variantCounts{made: map[backend.NCCLAlgo]int{}, closed: map[backend.NCCLAlgo]int{}}
}

func (c *variantCounts) get() (made, closed map[backend.NCCLAlgo]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.made), maps.Clone(c.closed)
}

func (v countingVariants) World(ctx context.Context, algo backend.NCCLAlgo) (backend.Comm, error) {
	c, err := v.inner.World(ctx, algo)
	if err != nil {
		return nil, err
	}
	v.counts.mu.Lock()
	v.counts.made[algo]++
	v.counts.mu.Unlock()
	return &countingComm{Comm: c, algo: algo, counts: v.counts}, nil
}

type countingComm struct {
	backend.Comm
	algo   backend.NCCLAlgo
	counts *variantCounts
}

func (c *countingComm) Close() error {
	c.counts.mu.Lock()
	c.counts.closed[c.algo]++
	c.counts.mu.Unlock()
	return c.Comm.Close()
}

// The world variants are made once, at the first calibration, kept while
// a size class uses them, and closed once every class is measured and
// none chose them, or with the Reducer.
func TestWorldVariantsClosedWhenNoClassChoseThem(t *testing.T) {
	const delay = 40 * time.Millisecond
	for _, tc := range []struct {
		name   string
		cfg    sim.Config
		choice hier.Algorithm           // Auto: any but a world variant
		kept   map[backend.NCCLAlgo]int // closed only with the Reducer
	}{
		{"the variants slowest", sim.Config{Machines: 2, Devices: 2, Seed: 3,
			AlgoDelay: map[backend.NCCLAlgo]time.Duration{backend.AlgoRing: delay, backend.AlgoTree: delay}},
			hier.Auto, map[backend.NCCLAlgo]int{}},
		{"tree fastest", sim.Config{Machines: 2, Devices: 2, Seed: 3}, hier.FlatTree,
			map[backend.NCCLAlgo]int{backend.AlgoTree: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, slow := tc.cfg, func(int, *backend.Rank) {}
			if tc.choice == hier.FlatTree {
				cfg, slow = treeFastest(cfg, delay)
			}
			counts := make([]*variantCounts, cfg.Machines*cfg.Devices)
			w := customWorld(t, cfg, func(g int, rk *backend.Rank) {
				slow(g, rk)
				counts[g] = newVariantCounts()
				rk.Variants = countingVariants{inner: rk.Variants, counts: counts[g]}
			})
			for _, r := range w.reducers {
				hier.SetTopClass(r, 128<<10) // two classes: [64 KiB, 128 KiB) and from 128 KiB
			}
			rng := rand.New(rand.NewPCG(3, 3))
			both := map[backend.NCCLAlgo]int{backend.AlgoRing: 1, backend.AlgoTree: 1}
			reduceAll(t, w, rng, fairgo.Float32, fairgo.Sum, 20<<10)
			for g := range w.reducers {
				made, closed := counts[g].get()
				require.Equal(t, both, made, "rank %d: both made at the first class", g)
				require.Empty(t, closed, "rank %d: a class is left to measure", g)
				require.Equal(t, 2, hier.WorldVariants(w.reducers[g]))
			}
			reduceAll(t, w, rng, fairgo.Float32, fairgo.Sum, 64<<10)
			reduceAll(t, w, rng, fairgo.Float32, fairgo.Sum, 20<<10+5)
			requireSameChoices(t, w)
			for g, r := range w.reducers {
				for _, b := range []int64{80 << 10, 1 << 20} {
					if a := r.AlgorithmFor(b); tc.choice == hier.Auto { // whatever is not a variant
						require.NotContains(t, []hier.Algorithm{hier.FlatRing, hier.FlatTree}, a, "rank %d", g)
					} else {
						require.Equal(t, tc.choice, a, "rank %d, %d bytes", g, b)
					}
				}
				made, closed := counts[g].get()
				require.Equal(t, both, made, "rank %d: made once", g)
				want := map[backend.NCCLAlgo]int{}
				for a := range both {
					if tc.kept[a] == 0 {
						want[a] = 1
					}
				}
				require.Equal(t, want, closed, "rank %d: closed once every class was measured", g)
				require.Equal(t, len(tc.kept), hier.WorldVariants(r), "rank %d", g)
			}
			require.NoError(t, hier.CloseAll(w.reducers))
			for g := range w.reducers {
				_, closed := counts[g].get()
				require.Equal(t, both, closed, "rank %d: all closed with the Reducer", g)
			}
		})
	}
}

// WithAlgorithm(FlatRing or FlatTree) on a backend without world variants
// fails with an *fairgo.ArgError naming the option: at NewReducer where
// it checks its options against the rank, else at the first call, which
// fails on every rank before anything is enqueued.
func TestFixedWorldVariantWithoutVariantsFails(t *testing.T) {
	for _, algo := range []hier.Algorithm{hier.FlatRing, hier.FlatTree} {
		t.Run(algo.String(), func(t *testing.T) {
			c, err := sim.NewCluster(sim.Config{Machines: 2, Devices: 1})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			rs := make([]*hier.Reducer, c.Size())
			errs := make([]error, c.Size())
			var wg sync.WaitGroup
			for g := range rs {
				wg.Go(func() {
					rk := c.Rank(g)
					rk.Variants = nil
					rs[g], errs[g] = hier.NewReducer(context.Background(), rk, hier.WithAlgorithm(algo))
				})
			}
			wg.Wait()
			t.Cleanup(func() { _ = hier.CloseAll(rs) })
			// NewReducer refuses the option: nothing is built that a first call would fail.
			for g := range rs {
				var ae *fairgo.ArgError
				require.ErrorAs(t, errs[g], &ae, "rank %d", g)
				require.Equal(t, "WithAlgorithm", ae.Arg)
				require.ErrorIs(t, errs[g], fairgo.ErrInvalidArgument)
			}
		})
	}
}

// With one device per machine Auto measures its size classes as on any
// grid (the rail all-to-all and NCCL's variants among the candidates),
// alike on every rank; a call below the smallest class is flat and
// enqueued inline.
func TestAutoMeasuresWithOneDevicePerMachine(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 3, Devices: 1, Seed: 5}, hier.WithInlineEnqueue(true))
	rng := rand.New(rand.NewPCG(9, 9))
	for _, count := range []int{1000, 300000} {
		reduceAll(t, w, rng, fairgo.Float32, fairgo.Sum, count)
	}
	requireSameChoices(t, w)
	for g, r := range w.reducers {
		require.Equal(t, hier.Flat, r.AlgorithmFor(4000))
		require.Positive(t, hier.InlineCalls(r), "rank %d: the small call went inline", g)
		c := r.ChoiceFor(1200000)
		require.True(t, c.Measured)
		require.NotNil(t, c.Calibration)
		for _, name := range []string{"flat", "flat-ring", "flat-tree", "rail-a2a-serial"} {
			require.Contains(t, c.Calibration.Times, name, "rank %d", g)
		}
		require.NotContains(t, c.Calibration.Times, "halving-doubling", "3 ranks: no step to save")
		require.False(t, r.ChoiceFor(100000).Measured, "a class no call reached")
	}
}

// Recursive doubling leaves the same bits on every rank: partners add the
// same two operands at every step (floating point included, 16-bit types
// summed in float32 and rounded alike), and an extra rank of a world that
// is not a power of two gets its partner's copy.
func TestRecursiveDoublingGivesEveryRankTheSameBits(t *testing.T) {
	for _, m := range []int{5, 8} {
		w := newWorld(t, sim.Config{Machines: m, Devices: 1, Seed: 3},
			hier.WithAlgorithm(hier.RecursiveDoubling), hier.WithFlatThreshold(1))
		rng := rand.New(rand.NewPCG(uint64(m), 9))
		for _, dt := range []fairgo.DType{fairgo.Float32, fairgo.BFloat16, fairgo.Float16, fairgo.Float64} {
			for _, op := range []fairgo.Op{fairgo.Sum, fairgo.Avg} {
				in := reftest.RandomInputs(rng, dt, op, w.size(), 4099)
				out, err := w.allReduce(t, dt, op, in)
				require.NoError(t, err)
				require.NoError(t, reftest.CheckResults(dt, reftest.ComputeReference(dt, op, in), out))
				for r := range out {
					require.True(t, bytes.Equal(out[0], out[r]), "%d×1 %v %v: rank %d's bits differ from rank 0's",
						m, dt, op, r)
				}
			}
		}
	}
}
