package cuda

// The communicator tests (TestLocalRanks, TestCommArgs, TestCommAbort,
// TestDuplicate) have two forms, as hier's GPU tests do:
//
//   - in one process (no launcher): every rank of a grid in this process,
//     one GPU each (NewLocalRanks): 1×2 and 2×1 where there are two GPUs or
//     more, 1×1 (a one-rank world communicator) on one GPU.
//   - under a launcher (WORLD_SIZE, RANK, ... set: fairrun, torchrun):
//     this process drives its own rank of the launcher's job, whose
//     communicators setup.New makes with Backend over the launcher's store
//     (fairrun --emulate-machines M --nproc-per-node N runs N ranks on one
//     GPU under MPS, each rank its own NCCL host and device identity).
//
// Which cases run follows from the grid alone, so every rank issues the
// same collectives in the same order. A test skips only where there is no
// GPU at all (fairgo.ErrNoDevice) or no NCCL.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier/setup"
	"github.com/fairgo/fairgo/internal/launchjob"
)

// job is this process's rank of a launcher's job (the launcher form).
var job struct {
	*launchjob.Job
	once sync.Once
	err  error
	seq  int // store keys of barriers and fresh communicators, in call order (the same on every rank)
}

// jobPrefix is the store prefix of the test binary's own keys.
const jobPrefix = "cuda-gpu-tests"

// jobStoreTimeout bounds each wait on the store or NCCL for the other ranks.
const jobStoreTimeout = 3 * time.Minute

// launched reports whether this test binary runs as one rank of a
// launcher's job.
func launched() bool { return launchjob.Launched() }

// openJob sets up this process's rank of the launcher's job once: the
// launcher's store, then setup.Connect with Backend (the device and
// communicators the tests share). It skips the test where there is no GPU
// (every rank alike: they share the host's driver).
func openJob(t testing.TB) {
	t.Helper()
	job.once.Do(func() {
		if _, err := Count(); err != nil {
			job.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		job.Job, job.err = launchjob.Open(ctx, Backend{}, jobPrefix+"/setup")
	})
	if errors.Is(job.err, fairgo.ErrNoDevice) {
		t.Skip(job.err.Error()) // no driver or no GPU here
	}
	require.NoError(t, job.err)
}

// closeJob releases the launcher form's rank and leaves the store (from
// TestMain).
func closeJob() { _ = job.Close() }

// commGrids returns the grids the communicator tests run: the launcher's
// grid under a launcher; in one process 1×2 and 2×1 over two GPUs or more,
// else 1×1. It skips the test where there is no GPU or no NCCL.
func commGrids(t testing.TB) [][2]int {
	t.Helper()
	if launched() {
		openJob(t)
		g := job.Rank.Grid
		return [][2]int{{g.Machines, g.Devices}}
	}
	n := gpuCount(t)
	needNCCL(t)
	if n >= 2 {
		return [][2]int{{1, 2}, {2, 1}}
	}
	return [][2]int{{1, 1}}
}

// commRanks returns the ranks this process drives of an M×D grid (one of
// commGrids): under a launcher its own rank of the job's shared
// communicators; in one process every rank, over the first M·D GPUs, with
// communicators of the test's own (NewLocalRanks, destroyed at its end).
func commRanks(t testing.TB, m, d int) []backend.Rank {
	t.Helper()
	if launched() {
		openJob(t)
		g := job.Rank.Grid
		require.Equal(t, [2]int{m, d}, [2]int{g.Machines, g.Devices}, "the launcher's grid (use commGrids)")
		return []backend.Rank{{Grid: g, Device: job.Rank.Device, Comms: job.Rank.Comms, Variants: job.Rank.Variants}}
	}
	return localRanks(t, m, d)
}

// freshCommRanks is commRanks over communicators of the test's own, for
// tests that abort them: NewLocalRanks in one process, a setup.Connect of
// its own under a launcher (released at the end of the test). Every rank
// must call it at the same point.
func freshCommRanks(t testing.TB, m, d int) []backend.Rank {
	t.Helper()
	if !launched() {
		return localRanks(t, m, d)
	}
	openJob(t)
	job.seq++
	ctx, cancel := context.WithTimeout(context.Background(), jobStoreTimeout)
	defer cancel()
	rks, err := setup.Connect(
		ctx,
		job.Store,
		Backend{},
		nil,
		setup.WithStorePrefix(fmt.Sprintf("%s/fresh/%d", jobPrefix, job.seq)),
	)
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := rks[0].Release(); err != nil {
			t.Errorf("releasing the fresh rank: %v", err)
		}
	})
	g := rks[0].Grid
	require.Equal(t, [2]int{m, d}, [2]int{g.Machines, g.Devices}, "the launcher's grid (use commGrids)")
	return []backend.Rank{{Grid: g, Device: rks[0].Device, Comms: rks[0].Comms, Variants: rks[0].Variants}}
}

func localRanks(t testing.TB, m, d int) []backend.Rank {
	t.Helper()
	devs := devices(t, m*d)
	ranks, err := NewLocalRanks(devs, m, d)
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := CloseRanks(ranks); err != nil {
			t.Errorf("CloseRanks: %v", err)
		}
	})
	return ranks
}

// jobBarrier returns once every rank of the launcher's job has reached it
// (no-op in one process).
func jobBarrier(t testing.TB) {
	t.Helper()
	if !launched() {
		return
	}
	openJob(t)
	job.seq++
	ctx, cancel := context.WithTimeout(context.Background(), jobStoreTimeout)
	defer cancel()
	prefix := fmt.Sprintf("%s/barrier/%d/", jobPrefix, job.seq)
	require.NoError(t, job.Store.Set(ctx, prefix+strconv.Itoa(job.Launch.Rank), nil))
	for p := range job.Launch.WorldSize {
		_, err := job.Store.Get(ctx, prefix+strconv.Itoa(p))
		require.NoError(t, err, "barrier %d: process %d", job.seq, p)
	}
}

// rankDevices are the devices of ranks, in order.
func rankDevices(ranks []backend.Rank) []*Device {
	out := make([]*Device, len(ranks))
	for i, rk := range ranks {
		out[i] = rk.Device.(*Device)
	}
	return out
}

// rankStreams makes a stream on each rank's device.
func rankStreams(t testing.TB, ranks []backend.Rank) []*Stream {
	out := make([]*Stream, len(ranks))
	for i, d := range rankDevices(ranks) {
		out[i] = stream(t, d)
	}
	return out
}

// collectiveCount is the element count of testCollectives' buffers: smaller
// under a launcher, where the ranks share one GPU over sockets.
func collectiveCount() int {
	if launched() {
		return 1<<18 + 3
	}
	return 1<<20 + 3
}
