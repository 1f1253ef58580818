package hier_test

// The ranks a GPU test drives. Each GPU test is written once, against a
// world: the Reducers of the ranks this process drives, the world size, and
// each local Reducer's world rank. Inputs are pure functions of (seed, world
// rank, index), so a process computes every rank's input and the expected
// result of the whole world, and checks its own outputs.
//
// Two forms:
//
//   - in-process (no launcher): one process drives every rank, one GPU each
//     (cuda.NewLocalRanks), on the grids a test names that fit the GPUs; on a
//     host of one GPU that is the 1×1 grid.
//   - under a launcher (WORLD_SIZE, RANK, ... set: fairrun, torchrun, Slurm,
//     Open MPI): this process drives its own rank of the launcher's job,
//     whose grid topology discovery gives (setup.New over the launcher's
//     store; fairrun --emulate-machines M runs M×D on one GPU under MPS).
//     Every test then runs on that grid only, each rank issuing the same
//     collectives in the same order; cross-rank facts (identical outputs,
//     agreed verdicts, barriers) go through the launcher's store.
//
// Which cases a test runs is decided from the grid, never from local state,
// so every rank runs (or leaves out) the same ones. A GPU test skips only
// where there is no GPU at all (fairgo.ErrNoDevice).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/cuda"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/hier/setup"
	"github.com/fairgo/fairgo/internal/launchjob"
	"github.com/fairgo/fairgo/rendezvous"
)

// job is this process's rank of a launcher's job (the launcher form).
var job struct {
	*launchjob.Job
	once sync.Once
	err  error
	seq  int // store keys of barriers, exchanges and fresh worlds, in call order (the same on every rank)
}

// jobPrefix is the store prefix of the test binary's own keys.
const jobPrefix = "hier-gpu-tests"

// jobStoreTimeout bounds each wait on the store for the other ranks.
const jobStoreTimeout = 3 * time.Minute

// launched reports whether this test binary runs as one rank of a
// launcher's job.
func launched() bool { return launchjob.Launched() }

// openJob sets up this process's rank of the launcher's job once: the
// launcher's store, then setup.Connect with the cuda backend (the device and
// communicators every test's Reducers share). It skips the
// test where there is no GPU (every rank of the job alike: they share the
// host's driver).
func openJob(t testing.TB) {
	t.Helper()
	job.once.Do(func() {
		if _, err := cuda.Count(); err != nil {
			job.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		job.Job, job.err = launchjob.Open(ctx, cuda.Backend{}, jobPrefix+"/setup")
	})
	if errors.Is(job.err, fairgo.ErrNoDevice) {
		t.Skip(job.err.Error()) // no driver or no GPU here
	}
	require.NoError(t, job.err)
}

// closeJob releases the launcher form's rank and leaves the store (from
// TestMain).
func closeJob() { _ = job.Close() }

// jobGrid is the launcher's grid, M × D.
func jobGrid(t testing.TB) [2]int {
	openJob(t)
	g := job.Rank.Grid
	return [2]int{g.Machines, g.Devices}
}

// localGPUs opens this host's GPUs once (the in-process form) and returns
// how many there are; it skips the test where there is none.
func localGPUs(t testing.TB) int {
	t.Helper()
	gpus.once.Do(func() {
		n, err := cuda.Count()
		if err != nil {
			gpus.err = err
			return
		}
		for i := 0; i < n; i++ {
			dev, err := cuda.Open(i)
			if err != nil {
				gpus.err = err
				return
			}
			gpus.devs = append(gpus.devs, dev)
		}
		gpus.ranks = map[[2]int][]backend.Rank{}
	})
	if errors.Is(gpus.err, fairgo.ErrNoDevice) {
		t.Skip(gpus.err.Error()) // no driver or no GPU here
	}
	require.NoError(t, gpus.err)
	return len(gpus.devs)
}

// gpuGrids returns the grids a test runs: under a launcher, the job's grid;
// in one process, those of want that fit the GPUs, else 1×1.
func gpuGrids(t testing.TB, want ...[2]int) [][2]int {
	t.Helper()
	if launched() {
		return [][2]int{jobGrid(t)}
	}
	n := localGPUs(t)
	var out [][2]int
	for _, g := range want {
		if g[0]*g[1] <= n {
			out = append(out, g)
		}
	}
	if len(out) == 0 {
		out = [][2]int{{1, 1}}
	}
	return out
}

// gpuGrid is the one grid of a test that runs on a single grid: the
// launcher's, else 2×1 where two GPUs are, else 1×1.
func gpuGrid(t testing.TB) [2]int { return gpuGrids(t, [2]int{2, 1})[0] }

// gridHere reports whether this process can drive an M×D grid: the
// launcher's grid, or one that fits the GPUs of the in-process form.
func gridHere(t testing.TB, m, d int) bool {
	t.Helper()
	if launched() {
		return jobGrid(t) == [2]int{m, d}
	}
	return localGPUs(t) >= m*d
}

// algoGrid is a grid and an algorithm to run on it.
type algoGrid struct {
	m, d int
	algo hier.Algorithm
}

func (a algoGrid) String() string { return fmt.Sprintf("%dx%d/%s", a.m, a.d, a.algo) }

// gpuAlgoGrids returns the (grid, algorithm) cases of a test: in one
// process those of want that fit the GPUs (else 1×1 flat); under a
// launcher, its grid with flat and both rail algorithms (flat alone on one
// machine, where every algorithm is flat).
func gpuAlgoGrids(t testing.TB, want ...algoGrid) []algoGrid {
	t.Helper()
	if launched() {
		g := jobGrid(t)
		if g[0] == 1 {
			return []algoGrid{{g[0], g[1], hier.Flat}}
		}
		return []algoGrid{{g[0], g[1], hier.Flat}, {g[0], g[1], hier.RailAllToAll}, {g[0], g[1], hier.RailRSAG}}
	}
	n := localGPUs(t)
	var out []algoGrid
	for _, c := range want {
		if c.m*c.d <= n {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		out = []algoGrid{{1, 1, hier.Flat}}
	}
	return out
}

// sized is n in one process and small under a launcher, where the ranks
// share one GPU over sockets and every process computes every rank's input.
func sized(n, small int) int {
	if launched() {
		return small
	}
	return n
}

// worldRankOf is a rank's world rank (0 in a world of one, which has no
// world communicator).
func worldRankOf(rk backend.Rank) int {
	if rk.Comms.World == nil {
		return 0
	}
	return rk.Comms.World.Rank()
}

// gpuRanks returns the ranks this process drives of an M×D grid: under a
// launcher its own rank of the job (whose grid must be M×D); in one process
// every rank, over the first M·D GPUs, built once per grid and kept for the
// whole test binary.
func gpuRanks(t testing.TB, m, d int) []backend.Rank {
	t.Helper()
	if launched() {
		if g := jobGrid(t); g != [2]int{m, d} {
			t.Fatalf("the launcher's grid is %dx%d; the test asked for %dx%d (use gpuGrids)", g[0], g[1], m, d)
		}
		return []backend.Rank{{Grid: job.Rank.Grid, Device: job.Rank.Device, Comms: job.Rank.Comms}}
	}
	if n := localGPUs(t); n < m*d {
		t.Fatalf("grid %dx%d on %d GPUs (use gpuGrids)", m, d, n)
	}
	gpus.mu.Lock()
	defer gpus.mu.Unlock()
	key := [2]int{m, d}
	if rs, ok := gpus.ranks[key]; ok {
		return rs
	}
	rs, err := cuda.NewLocalRanks(gpus.devs[:m*d], m, d)
	require.NoError(t, err)
	gpus.ranks[key] = rs
	return rs
}

// gpuWorld builds fresh Reducers over the cached ranks of an M×D grid.
func gpuWorld(t testing.TB, m, d int, opts ...hier.Option) *world {
	t.Helper()
	rs := gpuRanks(t, m, d)
	w := &world{m: m, d: d, closeFn: func() {}, worldSize: m * d}
	for _, rk := range rs {
		w.addReducer(t, rk, opts...)
	}
	t.Cleanup(w.close)
	return w
}

// addReducer builds rank rk's Reducer with opts and adds it to w.
func (w *world) addReducer(t testing.TB, rk backend.Rank, opts ...hier.Option) {
	t.Helper()
	r, err := hier.NewReducer(context.Background(), rk, opts...)
	require.NoError(t, err)
	w.reducers = append(w.reducers, r)
	w.devs = append(w.devs, rk.Device.(*cuda.Device))
	w.global = append(w.global, worldRankOf(rk))
	w.flat = append(w.flat, rk.Comms.World)
}

// freshGPUWorld is gpuWorld over communicators of its own, destroyed at the
// end of the test (for tests that abort them): cuda.NewLocalRanks in one
// process, a setup.Connect of its own under a launcher.
func freshGPUWorld(t testing.TB, m, d int, opts ...hier.Option) *world {
	t.Helper()
	w := &world{m: m, d: d, closeFn: func() {}, worldSize: m * d}
	if launched() {
		if g := jobGrid(t); g != [2]int{m, d} {
			t.Fatalf("the launcher's grid is %dx%d; the test asked for %dx%d (use gpuGrids)", g[0], g[1], m, d)
		}
		job.seq++
		ctx, cancel := context.WithTimeout(context.Background(), jobStoreTimeout)
		defer cancel()
		// setup.New enqueues inline by default; the in-process form does not.
		rks, err := setup.Connect(
			ctx,
			job.Store,
			cuda.Backend{},
			nil,
			setup.WithStorePrefix(fmt.Sprintf("%s/fresh/%d", jobPrefix, job.seq)),
		)
		require.NoError(t, err)
		rk := rks[0]
		rk.OwnsResources = true // the Reducer releases its communicators and device on Close
		r, err := hier.NewReducer(ctx, rk, opts...)
		if err != nil {
			_ = rk.Release()
		}
		require.NoError(t, err)
		w.reducers = []*hier.Reducer{r}
		w.devs = []testDevice{rk.Device.(*cuda.Device)}
		w.global = []int{r.WorldRank()}
		w.flat = []backend.Comm{rk.Comms.World}
		t.Cleanup(func() { closeAwaitingAborts(t, w) })
		return w
	}
	if n := localGPUs(t); n < m*d {
		t.Fatalf("grid %dx%d on %d GPUs (use gpuGrids)", m, d, n)
	}
	rs, err := cuda.NewLocalRanks(gpus.devs[:m*d], m, d)
	require.NoError(t, err)
	board := rendezvous.NewMemoryStore() // as a job's store is its ranks' (setup)
	for _, rk := range rs {
		rk.Board = board
		r, err := hier.NewReducer(context.Background(), rk, opts...)
		require.NoError(t, err)
		w.reducers = append(w.reducers, r)
		w.devs = append(w.devs, rk.Device.(*cuda.Device))
		w.global = append(w.global, worldRankOf(rk))
		w.flat = append(w.flat, rk.Comms.World)
	}
	t.Cleanup(func() {
		if closeAwaitingAborts(t, w) {
			require.NoError(t, cuda.CloseRanks(rs))
		}
	})
	return w
}

// abortsWait is how long a fresh world's cleanup waits for NCCL to finish
// the aborts its Reducers started.
const abortsWait = time.Minute

// closeAwaitingAborts closes w's Reducers and waits, abortsWait at most,
// for the communicator aborts they started: a Close whose aborts outlast
// its grace leaves them to NCCL, and the next test's communicators must
// not be made, nor these destroyed, while NCCL still aborts them (a
// process crashed in ncclCommAbort so, bench/NOTES.md item 103). It
// reports whether they all finished; else the test fails and the
// communicators are left alone.
func closeAwaitingAborts(t testing.TB, w *world) bool {
	w.close()
	for g, r := range w.reducers {
		if !hier.AbortsFinished(r, abortsWait) {
			t.Errorf("rank %d: its communicators still aborting %v after Close; left to NCCL", g, abortsWait)
			return false
		}
	}
	return true
}

// exchange publishes b and returns every rank's, by world rank (the
// launcher form; every rank calls it at the same point).
func exchange(t testing.TB, b []byte) [][]byte {
	t.Helper()
	job.seq++
	ctx, cancel := context.WithTimeout(context.Background(), jobStoreTimeout)
	defer cancel()
	me, n := job.Launch.Rank, job.Launch.WorldSize
	prefix := fmt.Sprintf("%s/exchange/%d/", jobPrefix, job.seq)
	require.NoError(t, job.Store.Set(ctx, prefix+strconv.Itoa(me), b))
	out := make([][]byte, n)
	for p := range n {
		v, err := job.Store.Get(ctx, prefix+strconv.Itoa(p))
		require.NoError(t, err, "exchange %d: process %d's value", job.seq, p)
		out[p] = v
	}
	return out
}

// barrier returns once every rank has reached it (no-op in one process).
func (w *world) barrier(t testing.TB) {
	t.Helper()
	if launched() {
		exchange(t, nil)
	}
}

// allSame fails the test unless every rank's outs (one per local rank) are
// identical bit for bit: compared directly in one process, by digest
// through the store under a launcher.
func (w *world) allSame(t testing.TB, what string, outs [][]byte) {
	t.Helper()
	for i := 1; i < len(outs); i++ {
		require.True(t, bytes.Equal(outs[0], outs[i]), "%s: rank %d differs from rank %d", what, w.rank(i), w.rank(0))
	}
	if !launched() || len(outs) == 0 {
		return
	}
	sum := sha256.Sum256(outs[0])
	for p, d := range exchange(t, sum[:]) {
		require.Equal(t, sum[:], d, "%s: process %d's result differs from this one's (rank %d)", what, p, w.rank(0))
	}
}

// agree returns whether ok holds on every rank (ok itself in one process).
func (w *world) agree(t testing.TB, ok bool) bool {
	t.Helper()
	if !launched() {
		return ok
	}
	mine := []byte{0}
	if ok {
		mine[0] = 1
	}
	for _, v := range exchange(t, mine) {
		if len(v) != 1 || v[0] != 1 {
			return false
		}
	}
	return true
}

// sameRapidSeed makes every rank's rapid draw the same cases: under a
// launcher, process 0's seed (its -rapid.seed, or one of its own) for all,
// no fail files, and no shrinking (its deadline differs by process). The
// property itself must agree its verdict across ranks (world.agree), so
// that every rank fails the same case.
func sameRapidSeed(t testing.TB) {
	t.Helper()
	if !launched() {
		return
	}
	seed := flag.Lookup("rapid.seed").Value.String()
	if seed == "0" {
		seed = strconv.FormatUint(uint64(time.Now().UnixNano())|1, 10)
	}
	seed = string(exchange(t, []byte(seed))[0])
	require.NoError(t, flag.Set("rapid.seed", seed))
	require.NoError(t, flag.Set("rapid.nofailfile", "true"))
	require.NoError(t, flag.Set("rapid.shrinktime", "1ns"))
	t.Logf("rapid seed %s on every rank", seed)
}

// sharedGPU reports whether other processes may use this process's GPU
// (the launcher form; on one GPU they all do): device memory figures then
// include theirs.
func sharedGPU() bool { return launched() }
