package hier_test

// Workers for fairrun: not tests on their own (they skip unless their
// variable is set, and their names do not start with TestGPU), but one rank
// each of a job that scripts/gpu.sh launches: the fault runs (a rank killed,
// a rank whose store connection is cut, a rank that stops calling) and the
// soak (mixed sizes, several calls in flight, every result checked, for a
// set time).

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/cuda"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/hier/setup"
	"github.com/fairgo/fairgo/internal/elem"
	"github.com/fairgo/fairgo/rendezvous"
)

// envDuration reads a duration variable, def when unset.
func envDuration(t testing.TB, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	require.NoError(t, err, "%s", name)
	return d
}

// envInt reads an integer variable, def when unset.
func envInt(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, "%s", name)
	return n
}

// The fault modes of TestWorkerGPUFault.
const (
	faultKill  = "kill"  // the victim SIGKILLs itself
	faultCut   = "cut"   // the victim closes its store connection, keeps calling (every result right), then stops calling
	faultStall = "stall" // the victim stops calling
)

// TestWorkerGPUFault is a worker of fairrun's fault runs (FAIRGO_FAULT_WORKER=1):
// every process builds its Reducer with setup.New (over the launcher's
// store, with WithTimeout(FAIRGO_FAULT_TIMEOUT)) and runs allreduces of 16
// MiB of ones, checking each result, until one fails. The rank named by
// FAIRGO_FAULT_RANK (default the last) is the victim; FAIRGO_FAULT_AFTER
// after the setup (the fault time), per FAIRGO_FAULT_MODE:
//
//   - kill (default): it SIGKILLs itself. Each survivor must see a typed error
//     (ErrTimeout or ErrAborted) within timeout + 5 s of the death.
//   - stall: it stops calling. Every rank, the victim included, must see a
//     *hier.TimeoutError within timeout + 5 s (the survivors from Wait, the
//     victim from Err, as the board tells it).
//   - cut: it closes its connection to the store and goes on calling for
//     FAIRGO_FAULT_CUT_RUN (3 s): every call must still complete and be
//     right (the store is not on the data path); then it stops calling, and
//     every survivor must see a *hier.TimeoutError within timeout + 5 s of
//     that (the victim, cut from the board, hears nothing and reports none).
//
// Each rank prints one "fault: rank R: ..." line of what it saw; it ignores
// SIGTERM meanwhile so that fairrun's grace period lets it report.
// scripts/gpu.sh's fault section gives the verdict.
func TestWorkerGPUFault(t *testing.T) {
	if os.Getenv("FAIRGO_FAULT_WORKER") != "1" {
		t.Skip("a worker for fairrun's fault runs (FAIRGO_FAULT_WORKER=1)")
	}
	mode := os.Getenv("FAIRGO_FAULT_MODE")
	if mode == "" {
		mode = faultKill
	}
	require.Contains(t, []string{faultKill, faultCut, faultStall}, mode, "FAIRGO_FAULT_MODE")
	after := envDuration(t, "FAIRGO_FAULT_AFTER", envDuration(t, "FAIRGO_FAULT_KILL_AFTER", 4*time.Second))
	timeout := envDuration(t, "FAIRGO_FAULT_TIMEOUT", 10*time.Second)
	cutRun := envDuration(t, "FAIRGO_FAULT_CUT_RUN", 3*time.Second)
	ignoreTerm()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	l, err := rendezvous.FromEnv()
	require.NoError(t, err)
	victim := envInt(t, "FAIRGO_FAULT_RANK", envInt(t, "FAIRGO_FAULT_KILL_RANK", l.WorldSize-1))
	store, err := rendezvous.Open(ctx, l)
	require.NoError(t, err)
	r, err := setup.New(ctx, store, cuda.Backend{}, setup.WithReducer(hier.WithTimeout(timeout)))
	require.NoError(t, err)
	rank, world := r.WorldRank(), r.Grid().Size()
	dev := r.Device().(*cuda.Device)
	const count = 4 << 20 // 16 MiB of float32
	buf, err := dev.AllocTensor(count, fairgo.Float32)
	require.NoError(t, err)
	ones := make([]byte, 4*count)
	for i := range count {
		elem.Set(fairgo.Float32, ones, i, 1)
	}
	// check reads the first and the last element of a result.
	check := func() error {
		for _, i := range []int64{0, count - 1} {
			b := make([]byte, 4)
			if err := dev.Download(b, buf.Ptr+uintptr(4*i)); err != nil {
				return err
			}
			if v := elem.Get(fairgo.Float32, b, 0); v != float64(world) {
				return fmt.Errorf("element %d is %v, want %d", i, v, world)
			}
		}
		return nil
	}
	start := time.Now()
	faultAt := start.Add(after) // the victim's fault; the survivors time from here
	if mode == faultCut {
		faultAt = faultAt.Add(cutRun) // the survivors' trouble starts when the victim stops calling
	}
	report := func(what string, calls int, err error) {
		var te *hier.TimeoutError
		typed := errors.Is(err, fairgo.ErrTimeout) || errors.Is(err, fairgo.ErrAborted)
		fmt.Printf(
			"fault: rank %d: %s after %d allreduces, %.2f s after the fault (mode %s, "+
				"timeout %v): typed=%v timeout=%v aborted=%v timeouterror=%v: %v\n",
			rank,
			what,
			calls,
			time.Since(faultAt).Seconds(),
			mode,
			timeout,
			typed,
			errors.Is(err, fairgo.ErrTimeout),
			errors.Is(err, fairgo.ErrAborted),
			errors.As(err, &te),
			err,
		)
	}
	cut := false
	for i := 0; ; i++ {
		if rank == victim && time.Now().After(start.Add(after)) {
			switch {
			case mode == faultKill:
				fmt.Printf("fault: rank %d: killing itself after %d allreduces\n", rank, i)
				_ = killSelf()
			case mode == faultCut && !cut:
				require.NoError(t, store.Close())
				cut = true
				fmt.Printf("fault: rank %d: cut its store connection after %d allreduces\n", rank, i)
			case mode == faultCut && time.Now().After(faultAt):
				fmt.Printf(
					"fault: rank %d: stops calling after %d allreduces, every one right (%v of them after the cut)\n",
					rank,
					i,
					cutRun,
				)
				// Cut from the board, it hears of nobody's timeout; its
				// peers may still be aborting: wait, leave it open.
				time.Sleep(timeout + 8*time.Second)
				fmt.Printf("fault: rank %d: the victim's own state at the end: %v\n", rank, r.Err())
				return
			case mode == faultStall:
				fmt.Printf("fault: rank %d: stops calling after %d allreduces\n", rank, i)
				deadline := time.Now().Add(timeout + 10*time.Second)
				for r.Err() == nil && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				err := r.Err()
				report("Err set", i, err)
				var te *hier.TimeoutError
				require.ErrorAs(t, err, &te, "the victim's Reducer was not told of the timeout")
				require.Less(t, time.Since(faultAt), timeout+5*time.Second, "the victim heard too late")
				return
			}
		}
		require.NoError(t, dev.Upload(buf.Ptr, ones))
		err := r.AllReduce(ctx, buf, fairgo.Sum).Wait(ctx)
		if err == nil {
			if cerr := check(); cerr != nil {
				t.Fatalf("fault: rank %d: allreduce %d wrong: %v", rank, i, cerr)
			}
			continue
		}
		report("Wait returned", i, err)
		if rank == victim {
			t.Fatalf("the victim's own call failed: %v", err)
		}
		if mode == faultKill {
			require.True(
				t,
				errors.Is(err, fairgo.ErrTimeout) || errors.Is(err, fairgo.ErrAborted),
				"untyped error: %v",
				err,
			)
		} else {
			var te *hier.TimeoutError
			require.ErrorAs(t, err, &te, "not a *hier.TimeoutError")
		}
		require.Less(t, time.Since(faultAt), timeout+5*time.Second, "the survivor took too long")
		_ = hier.CloseAll([]*hier.Reducer{r})
		_ = store.Close()
		return
	}
}

// ignoreTerm keeps the process alive through fairrun's SIGTERM, so that a
// fault worker can report what its Wait returned.
func ignoreTerm() {
	c := make(chan os.Signal, 4)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		for s := range c {
			fmt.Printf("fault: got %v, reporting first\n", s)
		}
	}()
}

func killSelf() error { return syscall.Kill(os.Getpid(), syscall.SIGKILL) }

// soakBucket is one call of a soak round: every rank draws the same.
type soakBucket struct {
	dt    fairgo.DType
	op    fairgo.Op
	count int
	seed  uint64
}

// soakSlotBytes is the device buffer of one soak bucket.
const soakSlotBytes = 16 << 20

// soakRound draws a round's buckets from (seed, round): 2 to 8 calls of
// mixed dtypes, ops and sizes, log-uniform from one element to 16 MiB
// (soakSlotBytes), a quarter of them exactly 4 MiB (bench/NOTES.md item 6).
func soakRound(seed uint64, round int) []soakBucket {
	rng := rand.New(rand.NewPCG(seed, uint64(round)))
	dts := []fairgo.DType{fairgo.Float32, fairgo.BFloat16, fairgo.Float16, fairgo.Int32, fairgo.Int64}
	out := make([]soakBucket, 2+rng.IntN(7))
	for k := range out {
		dt := dts[rng.IntN(len(dts))]
		ops := []fairgo.Op{fairgo.Sum, fairgo.Max}
		if dt.IsFloat() {
			ops = append(ops, fairgo.Avg)
		}
		count := max(1, int(math.Exp2(rng.Float64()*24))/dt.Size())
		if rng.IntN(4) == 0 {
			count = 4 << 20 / dt.Size()
		}
		out[k] = soakBucket{dt: dt, op: ops[rng.IntN(len(ops))], count: count, seed: rng.Uint64()}
	}
	return out
}

// TestWorkerGPUSoak is a worker of scripts/gpu.sh's soak (FAIRGO_SOAK_WORKER=1):
// every process builds its Reducer with setup.New (Auto, the cross-rank
// check on, WithTimeout(FAIRGO_SOAK_TIMEOUT, 60 s)) and runs rounds for
// FAIRGO_SOAK_SECONDS (600): each round issues 2 to 8 allreduces of mixed
// dtypes and sizes back to back, so that several are in flight, then waits
// for them and checks every result against the reference of the whole
// world (inputs are pure functions of seed, rank and index). The ranks
// agree when to stop by an allreduce of their votes (Max), so that each
// runs the same calls. A wrong result fails the rank at once; a hang ends
// in the Reducer's timeout (or the script's). Each rank prints its progress
// every 30 s and ends with "soak: rank R: PASS".
func TestWorkerGPUSoak(t *testing.T) {
	if os.Getenv("FAIRGO_SOAK_WORKER") != "1" {
		t.Skip("a worker for scripts/gpu.sh's soak (FAIRGO_SOAK_WORKER=1)")
	}
	dur := time.Duration(envInt(t, "FAIRGO_SOAK_SECONDS", 600)) * time.Second
	timeout := envDuration(t, "FAIRGO_SOAK_TIMEOUT", time.Minute)
	seed := uint64(envInt(t, "FAIRGO_SOAK_SEED", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	r, err := setup.New(ctx, nil, cuda.Backend{}, setup.WithReducer(hier.WithTimeout(timeout)))
	cancel()
	require.NoError(t, err)
	defer func() { _ = r.Close() }()
	ctx = context.Background()
	rank, world := r.WorldRank(), r.Grid().Size()
	dev := r.Device().(*cuda.Device)
	var slots []fairgo.Tensor
	defer func() {
		for _, s := range slots {
			_ = dev.Free(s.Ptr)
		}
	}()
	vote, err := dev.AllocTensor(1, fairgo.Int32)
	require.NoError(t, err)
	defer func() { _ = dev.Free(vote.Ptr) }()
	start, lastNote := time.Now(), time.Now()
	var calls, bytes int64
	for round := 0; ; round++ {
		// Stop when any rank's time is up (Max of the votes).
		mine := make([]byte, 4)
		if time.Since(start) >= dur {
			elem.Set(fairgo.Int32, mine, 0, 1)
		}
		require.NoError(t, dev.Upload(vote.Ptr, mine))
		require.NoError(
			t,
			r.AllReduce(ctx, vote, fairgo.Max).Wait(ctx),
			"soak: rank %d: round %d: the vote",
			rank,
			round,
		)
		require.NoError(t, dev.Download(mine, vote.Ptr))
		if elem.Get(fairgo.Int32, mine, 0) != 0 {
			fmt.Printf("soak: rank %d: PASS %d rounds, %d allreduces, %.1f GiB reduced in %v on %v, no wrong result\n",
				rank, round, calls, float64(bytes)/(1<<30), time.Since(start).Round(time.Second), r.Grid())
			return
		}
		buckets := soakRound(seed, round)
		for len(slots) < len(buckets) {
			s, err := dev.AllocTensor(soakSlotBytes, fairgo.Uint8)
			require.NoError(t, err)
			slots = append(slots, s)
		}
		ins := make([][][]byte, len(buckets))
		works := make([]*hier.Work, len(buckets))
		for k, b := range buckets {
			ins[k] = hashInputs(b.dt, b.op, world, b.count, b.seed)
			tn := fairgo.Tensor{
				Ptr:   slots[k].Ptr,
				Bytes: int64(b.count * b.dt.Size()),
				Count: int64(b.count),
				DType: b.dt,
			}
			require.NoError(t, dev.Upload(tn.Ptr, ins[k][rank]))
			works[k] = r.AllReduce(ctx, tn, b.op) // issued back to back: several in flight
		}
		for k, wk := range works {
			require.NoError(
				t,
				wk.Wait(ctx),
				"soak: rank %d: round %d bucket %d (%s %s of %d)",
				rank,
				round,
				k,
				buckets[k].dt,
				buckets[k].op,
				buckets[k].count,
			)
		}
		for k, b := range buckets {
			out := make([]byte, b.count*b.dt.Size())
			require.NoError(t, dev.Download(out, slots[k].Ptr))
			if err := checkParallel(b.dt, b.op, ins[k], [][]byte{out}); err != nil {
				fmt.Printf(
					"soak: rank %d: WRONG round %d bucket %d (%s %s of %d): %v\n",
					rank,
					round,
					k,
					b.dt,
					b.op,
					b.count,
					err,
				)
				t.FailNow()
			}
			calls++
			bytes += int64(len(out))
		}
		if time.Since(lastNote) >= 30*time.Second {
			lastNote = time.Now()
			fmt.Printf(
				"soak: rank %d: %v: %d rounds, %d allreduces, all right; routes %v\n",
				rank,
				time.Since(start).Round(time.Second),
				round+1,
				calls,
				r.Choices(),
			)
		}
	}
}

// Every bucket of a soak round fits its slot, and the rounds reach both
// ends of the size range (a bucket of 32 MiB failed the first soak's upload).
func TestSoakRoundsFitTheirSlots(t *testing.T) {
	var smallest, largest int
	smallest = math.MaxInt
	for round := range 2000 {
		for _, b := range soakRound(1, round) {
			n := b.count * b.dt.Size()
			require.LessOrEqual(t, n, soakSlotBytes, "round %d: %v", round, b)
			require.Positive(t, b.count)
			smallest, largest = min(smallest, n), max(largest, n)
		}
	}
	require.LessOrEqual(t, smallest, 8)
	require.Greater(t, largest, 8<<20)
}
