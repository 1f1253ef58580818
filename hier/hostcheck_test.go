package hier_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/sim"
)

// warmUp makes n allreduces of one float32 on every rank of w and waits
// for them: the calls whose checks carry the agreement on shared memory
// when n is hier.SharedMemoryFirstCall − 1.
func warmUp(t require.TestingT, w *world, n int) {
	works := make([]*hier.Work, 0, n*len(w.reducers))
	ts := make([]fairgo.Tensor, len(w.reducers))
	for g := range ts {
		var err error
		ts[g], err = w.alloc(g, 1, fairgo.Float32)
		require.NoError(t, err)
	}
	for range n {
		for g, r := range w.reducers {
			works = append(works, r.AllReduce(context.Background(), ts[g], fairgo.Sum))
		}
	}
	for i, wk := range works {
		require.NoError(t, wk.Wait(context.Background()), "warm-up call %d", i/len(w.reducers)+1)
	}
}

const beforeSharedMemory = hier.SharedMemoryFirstCall - 1

// sumOnEveryRank allreduces one float32 per rank, world rank k holding
// k+1, and requires every local rank to end with the sum.
func sumOnEveryRank(t *testing.T, w *world) {
	t.Helper()
	data := make([][]byte, w.size())
	want := float32(0)
	for k := range data {
		data[k] = binary.LittleEndian.AppendUint32(nil, math.Float32bits(float32(k+1)))
		want += float32(k + 1)
	}
	ts := w.upload(t, fairgo.Float32, data)
	works := make([]*hier.Work, len(ts))
	for g, r := range w.reducers {
		works[g] = r.AllReduce(context.Background(), ts[g], fairgo.Sum)
	}
	for g, wk := range works {
		require.NoError(t, wk.Wait(context.Background()), "rank %d", w.rank(g))
	}
	for g, b := range w.download(t, ts) {
		require.Equal(t, want, math.Float32frombits(binary.LittleEndian.Uint32(b)), "rank %d", w.rank(g))
	}
}

// The ranks check through shared memory, whose files are gone once they
// have all mapped them: on one machine, and across machines through the
// relay; told to (WithSharedMemoryDir("")), through the collective.
func TestSharedMemoryCheckWhereItApplies(t *testing.T) {
	for _, tc := range []struct {
		name              string
		machines, devices int
		dir               bool // a directory of the test's own; false: ""
		shared            bool
	}{
		{"1×3", 1, 3, true, true},
		{"2×2", 2, 2, true, true},
		{"3×1", 3, 1, true, true},
		{"the mesh's most machines × 1", hier.RelayMeshMachines, 1, true, true},
		{"a star of 6×1", hier.RelayMeshMachines + 2, 1, true, true},
		{"a star of 5×2", hier.RelayMeshMachines + 1, 2, true, true},
		{"the relay's most machines × 1", hier.RelayMaxMachines, 1, true, true},
		{"beyond the relay's reach", hier.RelayMaxMachines + 1, 1, true, false},
		{"1×3, off", 1, 3, false, false},
		{"2×2, off", 2, 2, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := ""
			if tc.dir {
				dir = t.TempDir()
			}
			cfg := sim.Config{Machines: tc.machines, Devices: tc.devices, Seed: 1, StallTimeout: time.Minute}
			w := newWorld(t, cfg, hier.WithSharedMemoryDir(dir), hier.WithCheckHost("127.0.0.1"))
			sumOnEveryRank(t, w)
			for g, r := range w.reducers {
				require.False(t, hier.SharedMemoryCheck(r), "rank %d: before the agreement", g)
			}
			warmUp(t, w, beforeSharedMemory-1)
			sumOnEveryRank(t, w)
			for g, r := range w.reducers {
				require.Equal(t, tc.shared, hier.SharedMemoryCheck(r), "rank %d", g)
				require.Equal(t, tc.shared && tc.machines > 1, hier.RelayedCheck(r), "rank %d", g)
			}
			// Past the slots' first use: the peers' cursors must cross
			// for the slots to be reused.
			warmUp(t, w, 3*hier.SharedMemorySlots)
			sumOnEveryRank(t, w)
			if tc.dir {
				left, err := os.ReadDir(dir)
				require.NoError(t, err)
				require.Empty(t, left, "the region's file outlived the agreement")
			}
		})
	}
}

// A rank with no address for its relay (here: one it cannot listen on)
// makes every rank of every machine check through the collective, which
// still finds a mismatch; no region's file is left.
func TestRelayFallsBackWhenARankHasNoAddress(t *testing.T) {
	dir := t.TempDir()
	foreign := notLocal(t)
	w := worldOf(t, sim.Config{Machines: 2, Devices: 2, Seed: 3, StallTimeout: time.Minute},
		func(g int, _ *backend.Rank) []hier.Option {
			host := "127.0.0.1"
			if g == 3 {
				host = foreign // no interface of this host has it: nothing to listen on
			}
			return []hier.Option{hier.WithSharedMemoryDir(dir), hier.WithCheckHost(host)}
		})
	warmUp(t, w, beforeSharedMemory)
	sumOnEveryRank(t, w)
	for g, r := range w.reducers {
		require.False(t, hier.SharedMemoryCheck(r), "rank %d", g)
	}
	left, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, left)
	mismatchOnEveryRank(t, w, 1)
}

// A rank whose relay loses its connections (its peers' images no longer
// come in, its own no longer go out) leaves its calls and its peers'
// undecided: the watchdog ends them with an error on every rank, none
// returns nil and none hangs.
func TestRelayCutFailsTheCallsOnEveryRank(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 2, Devices: 1, Seed: 4, StallTimeout: time.Minute},
		hier.WithSharedMemoryDir(t.TempDir()), hier.WithCheckHost("127.0.0.1"), hier.WithTimeout(2*time.Second))
	warmUp(t, w, beforeSharedMemory)
	sumOnEveryRank(t, w)
	for g, r := range w.reducers {
		require.True(t, hier.RelayedCheck(r), "rank %d", g)
	}
	hier.CutRelay(w.reducers[1])
	ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 64), make([]byte, 64)})
	works := make([]*hier.Work, len(ts))
	for g, r := range w.reducers {
		works[g] = r.AllReduce(context.Background(), ts[g], fairgo.Sum)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for g, wk := range works {
		err := wk.Wait(ctx)
		require.Error(t, err, "rank %d", g)
		var te *hier.TimeoutError
		require.ErrorAs(t, err, &te, "rank %d: the watchdog's, not the Wait's own deadline", g)
	}
}

// A rank that cannot map the region (here: it was told another directory,
// as a rank on another host would not find the file) makes every rank
// check through the collective, which still finds a mismatch.
func TestSharedMemoryCheckFallsBackWhenARankCannotMapIt(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir()}
	w := worldOf(t, sim.Config{Machines: 1, Devices: 3, Seed: 2, StallTimeout: time.Minute},
		func(g int, _ *backend.Rank) []hier.Option {
			return []hier.Option{hier.WithSharedMemoryDir(dirs[min(g, 1)])}
		})
	warmUp(t, w, beforeSharedMemory)
	sumOnEveryRank(t, w)
	for g, r := range w.reducers {
		require.False(t, hier.SharedMemoryCheck(r), "rank %d", g)
	}
	for _, dir := range dirs {
		left, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.Empty(t, left)
	}
	mismatchOnEveryRank(t, w, 2)
}

// notLocal is an IPv4 address of the documentation ranges that no
// interface of this host has.
func notLocal(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, c := range []string{"192.0.2.123", "198.51.100.123", "203.0.113.123"} {
		if !slices.ContainsFunc(addrs, func(a net.Addr) bool { return strings.HasPrefix(a.String(), c+"/") }) {
			return c
		}
	}
	t.Skip("every documentation address tried is this host's")
	return ""
}

// mismatchOnEveryRank allreduces 16 float32 on every rank of w, with Max
// on rank deviant and Sum elsewhere, and requires ErrMismatch everywhere.
func mismatchOnEveryRank(t *testing.T, w *world, deviant int) {
	t.Helper()
	data := make([][]byte, len(w.reducers))
	for g := range data {
		data[g] = make([]byte, 64)
	}
	ts := w.upload(t, fairgo.Float32, data)
	works := make([]*hier.Work, len(ts))
	for g, r := range w.reducers {
		op := fairgo.Sum
		if g == deviant {
			op = fairgo.Max
		}
		works[g] = r.AllReduce(context.Background(), ts[g], op)
	}
	for g, wk := range works {
		require.ErrorIs(t, wk.Wait(context.Background()), fairgo.ErrMismatch, "rank %d", g)
	}
}

func TestSharedMemoryDirMustExist(t *testing.T) {
	err := hier.ValidateOptions(hier.WithSharedMemoryDir(t.TempDir() + "/missing"))
	var ae *fairgo.ArgError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "WithSharedMemoryDir", ae.Arg)
	require.NoError(t, hier.ValidateOptions(hier.WithSharedMemoryDir("")))
	require.NoError(t, hier.ValidateOptions(hier.WithSharedMemoryDir(t.TempDir())))
}

// The property: on one machine, past the agreement, a run of calls (allreduces of random
// sizes and operators, broadcasts from random roots), in which one rank
// may deviate at one call (another operator, another root, a refusal),
// ends alike whether the ranks check through shared memory or through the
// collective: every call before the deviation returns nil, the deviating
// call fails on every rank with the same mismatch (call, field, range of
// values), and no call after it returns nil. Runs longer than the shared
// memory's slots reuse them.
func TestSharedMemoryCheckDecidesAsTheCollective(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		machines := rapid.SampledFrom([]int{1, 2, hier.RelayMeshMachines + 2}).Draw(rt, "machines") // one, the mesh, a star
		devices := rapid.IntRange(max(2/machines, 1), max(4/machines, 1)).Draw(rt, "devices")
		size := machines * devices
		n := rapid.IntRange(1, 150).Draw(rt, "calls")
		at := rapid.IntRange(-1, n-1).Draw(rt, "deviation") // -1: none
		deviant := rapid.IntRange(0, size-1).Draw(rt, "deviant")
		how := rapid.SampledFrom([]string{"operator", "root", "refusal"}).Draw(rt, "how")
		type call struct {
			count int64
			op    fairgo.Op
			root  int // -1: an allreduce
		}
		calls := make([]call, n)
		for i := range calls {
			calls[i] = call{
				count: int64(rapid.IntRange(1, 64).Draw(rt, "count")),
				op:    rapid.SampledFrom([]fairgo.Op{fairgo.Sum, fairgo.Max, fairgo.Min}).Draw(rt, "op"),
				root:  rapid.IntRange(-1, size-1).Draw(rt, "root"),
			}
		}
		if at >= 0 && how == "operator" {
			calls[at].root = -1 // an allreduce, whose operator can differ
		}
		if at >= 0 && how == "root" {
			calls[at].root = max(calls[at].root, 0) // a broadcast
		}
		// outcome runs the calls, and returns each rank's errors.
		outcome := func(dir string) [][]error {
			w, err := tryWorld(sim.Config{Machines: machines, Devices: devices, Seed: 7, StallTimeout: time.Minute},
				hier.WithSharedMemoryDir(dir), hier.WithTimeout(time.Minute), hier.WithFingerprintMax(0),
				hier.WithCheckHost("127.0.0.1"))
			require.NoError(rt, err)
			defer w.close()
			warmUp(rt, w, beforeSharedMemory)
			bufs := make([]fairgo.Tensor, size)
			for g := range bufs {
				bufs[g], err = w.alloc(g, 64, fairgo.Float32)
				require.NoError(rt, err)
			}
			cancelled, cancel := context.WithCancel(context.Background())
			cancel()
			works := make([][]*hier.Work, size)
			for i, c := range calls {
				for g, r := range w.reducers {
					ctx, op, root := context.Background(), c.op, c.root
					if i == at && g == deviant {
						switch how {
						case "operator":
							op = fairgo.Prod
						case "root":
							root = (root + 1) % size
						case "refusal":
							ctx = cancelled
						}
					}
					tn := bufs[g]
					tn.Count, tn.Bytes = c.count, 4*c.count
					if root < 0 {
						works[g] = append(works[g], r.AllReduce(ctx, tn, op))
					} else {
						works[g] = append(works[g], r.Broadcast(ctx, tn, root))
					}
				}
			}
			errs := make([][]error, size)
			for g := range works {
				for _, wk := range works[g] {
					errs[g] = append(errs[g], wk.Wait(context.Background()))
				}
			}
			for g, r := range w.reducers {
				require.Equal(rt, dir != "", hier.SharedMemoryCheck(r), "rank %d", g)
			}
			return errs
		}
		shared, collective := outcome(t.TempDir()), outcome("")
		deviating := uint64(hier.SharedMemoryFirstCall + at) // the deviating call's number
		for g := range size {
			for i := range n {
				s, c := shared[g][i], collective[g][i]
				switch {
				case at < 0 || i < at:
					// The shared memory's verdicts come in call order: an
					// earlier call is complete before a later one aborts.
					// The collective's may come first, and a call the
					// watcher had yet to complete then reports the abort
					// (the mismatch, or a peer's reaction to it). Across
					// machines the same holds of the shared memory: a
					// peer's abort can reach this rank before the relay
					// has brought in its peers' images of an earlier call.
					// Either way the earlier call reports the abort, never
					// a mismatch of its own.
					if s != nil && machines > 1 {
						abortOf(rt, s, deviating, "rank %d, call %d, shared memory", g, i+1)
						s = nil
					}
					require.NoError(rt, s, "rank %d, call %d, shared memory", g, i+1)
					if c != nil {
						abortOf(rt, c, deviating, "rank %d, call %d, collective", g, i+1)
					}
				case i > at:
					require.Error(rt, s, "rank %d, call %d after the mismatch, shared memory", g, i+1)
					require.Error(rt, c, "rank %d, call %d after the mismatch, collective", g, i+1)
				case g == deviant && how == "refusal":
					require.ErrorIs(rt, s, context.Canceled)
					require.ErrorIs(rt, c, context.Canceled)
				default:
					var sm, cm *hier.MismatchError
					require.ErrorAs(rt, s, &sm, "rank %d, call %d, shared memory", g, i+1)
					require.ErrorAs(rt, c, &cm, "rank %d, call %d, collective", g, i+1)
					require.Equal(rt, *cm, *sm, "rank %d, call %d: the shared memory's mismatch against the collective's", g, i+1)
				}
			}
		}
	})
}

// abortOf requires err to be what a call before the deviating one reports
// when the abort reaches it before its verdict: a peer's reaction to the
// abort (fairgo.ErrAborted), or the deviating call's mismatch, never one
// of its own.
func abortOf(t require.TestingT, err error, deviating uint64, msgAndArgs ...any) {
	var mm *hier.MismatchError
	if errors.As(err, &mm) {
		require.Equal(t, deviating, mm.Seq, msgAndArgs...)
		return
	}
	require.ErrorIs(t, err, fairgo.ErrAborted, msgAndArgs...)
}

// Each rank driven by a goroutine of its own with inline enqueue (as
// setup.New runs them): calls on the caller's goroutine and on the engine's
// post to shared memory in turn, and every result is right.
func TestSharedMemoryCheckWithInlineCalls(t *testing.T) {
	const ranks, calls = 3, 2 * hier.SharedMemoryFirstCall
	w := newWorld(t, sim.Config{Machines: 1, Devices: ranks, Seed: 5, StallTimeout: time.Minute},
		hier.WithInlineEnqueue(true), hier.WithTimeout(time.Minute))
	data := make([][]byte, ranks)
	for g := range data {
		for range 16 {
			data[g] = binary.LittleEndian.AppendUint32(data[g], math.Float32bits(float32(g+1)))
		}
	}
	ts := w.upload(t, fairgo.Float32, data)
	errs := make([]error, ranks)
	var wg sync.WaitGroup
	for g, r := range w.reducers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				tn := ts[g]
				if i%3 == 2 { // now and then a size of its own: a class Auto measures on the engine
					tn.Count, tn.Bytes = 8, 32
				}
				wk := r.AllReduce(context.Background(), tn, fairgo.Max)
				if i%7 == 0 { // one at a time now and then, back to back otherwise
					if errs[g] = wk.Wait(context.Background()); errs[g] != nil {
						return
					}
				}
			}
			errs[g] = r.AllReduce(context.Background(), ts[g], fairgo.Max).Wait(context.Background())
		}()
	}
	wg.Wait()
	for g, err := range errs {
		require.NoError(t, err, "rank %d", g)
		require.True(t, hier.SharedMemoryCheck(w.reducers[g]), "rank %d", g)
		require.Positive(t, hier.InlineCalls(w.reducers[g]), "rank %d", g)
	}
	for g, b := range w.download(t, ts) {
		for i := range 16 {
			require.Equal(t, float32(ranks), math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])), "rank %d, element %d", g, i)
		}
	}
}

// A rank that closes while its relay starts does not wait for it: here
// its peer's checker is held, so the peer never acknowledges the hello,
// and the closing rank's first call waits for its check, which waits for
// the relay. Close abandons the start; the call's check then falls back
// as where a peer is out of reach, and the peer, released, closes too.
func TestCloseAbandonsTheRelaysStart(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 2, Devices: 1, Seed: 5, StallTimeout: time.Minute},
		hier.WithSharedMemoryDir(t.TempDir()), hier.WithCheckHost("127.0.0.1"), hier.WithTimeout(20*time.Second))
	hier.HoldChecker(w.reducers[0], true)
	t.Cleanup(func() { hier.HoldChecker(w.reducers[0], false) }) // before the world's Close
	ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 4), make([]byte, 4)})
	works := make([]*hier.Work, len(ts))
	for g, r := range w.reducers {
		works[g] = r.AllReduce(context.Background(), ts[g], fairgo.Sum) // call 1: it carries the relay's addresses
	}
	time.Sleep(100 * time.Millisecond) // rank 1's checker dials rank 0 meanwhile
	start := time.Now()
	err := w.reducers[1].Close()
	require.Less(t, time.Since(start), 5*time.Second, "Close waited for the relay's start (10 s)")
	require.NoError(t, err)
	hier.HoldChecker(w.reducers[0], false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for g, wk := range works {
		require.NoError(t, wk.Wait(ctx), "rank %d: the call's data and check were both done", g)
	}
}

// Past relayMeshMachines the check through shared memory leaves a call on
// a route of one collective to its fingerprint and posts the others for
// the relay (checksByRoute): runs of either kind longer than the shared
// memory's slots, one after the other (a rank's cursor moves on the
// fingerprinted calls too, or its peers' next post would wait for it
// forever), give the reference's results; an operator that differs and a
// refusal fail on every rank, on either kind of route (the operators of a
// flat call the simulator's collective finds itself; on NCCL the
// fingerprint does: TestGPURouteChoosesTheCheck).
func TestRouteChoosesTheCheckPastTheMesh(t *testing.T) {
	const m = hier.RelayMeshMachines + 2
	const flatBelow = 4096 // bytes: calls below go flat (one collective), from it halving-doubling
	newStar := func(t *testing.T) *world {
		w := newWorld(t, sim.Config{Machines: m, Devices: 1, Seed: 5, StallTimeout: time.Minute},
			hier.WithSharedMemoryDir(t.TempDir()), hier.WithCheckHost("127.0.0.1"), hier.WithTimeout(time.Minute),
			hier.WithAlgorithm(hier.HalvingDoubling), hier.WithFlatThreshold(flatBelow))
		warmUp(t, w, beforeSharedMemory)
		sumOnEveryRank(t, w) // the first call checked through shared memory
		for g, r := range w.reducers {
			require.True(t, hier.RelayedCheck(r), "rank %d", g)
		}
		return w
	}
	t.Run("runs of each kind", func(t *testing.T) {
		w := newStar(t)
		rng := rand.New(rand.NewPCG(3, 4))
		fp0 := hier.FingerprintedCalls(w.reducers[0])
		flat := 0
		for run, n := range []int{16, 1500, 16, 1500, 700} { // elements: flat, halving-doubling, ...
			calls := hier.SharedMemorySlots + 3
			if run == 4 {
				calls = 5
			}
			for range calls {
				w.sumChecked(t, rng, n, "run %d", run)
				if 4*n < flatBelow {
					flat++
				}
			}
		}
		for g, r := range w.reducers {
			require.Equal(t, fp0+uint64(flat), hier.FingerprintedCalls(r), "rank %d: the flat calls, and only they", g)
		}
	})
	for _, tc := range []struct {
		name   string
		n      int       // elements: below flatBelow/4 the call is fingerprinted
		op     fairgo.Op // the odd rank's
		refuse bool
		field  string
	}{
		{"fingerprinted, average against sum", 16, fairgo.Avg, false, "operator"},
		{"fingerprinted and posted, max against sum", 16, fairgo.Max, false, "operator"},
		{"posted, average against sum", 1500, fairgo.Avg, false, "operator"},
		{"fingerprinted, refused", 16, fairgo.Sum, true, "acceptance"},
		{"posted, refused", 1500, fairgo.Sum, true, "acceptance"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newStar(t)
			in := make([][]byte, w.size())
			for g := range in {
				in[g] = make([]byte, 4*tc.n)
			}
			ts := w.upload(t, fairgo.Float32, in)
			const odd = m - 1
			done, cancel := context.WithCancel(context.Background())
			cancel()
			works := make([]*hier.Work, len(w.reducers))
			for g, r := range w.reducers {
				ctx, op := context.Background(), fairgo.Sum
				if g == odd {
					op = tc.op
					if tc.refuse {
						ctx = done
					}
				}
				works[g] = r.AllReduce(ctx, ts[g], op)
			}
			for g, wk := range works {
				err := wk.Wait(context.Background())
				if g == odd && tc.refuse {
					require.ErrorIs(t, err, context.Canceled)
					continue
				}
				require.ErrorIs(t, err, fairgo.ErrMismatch, "rank %d", g)
				if tc.field == "operator" && tc.n < flatBelow/4 {
					continue // the simulator's allreduce finds operators that differ itself, as NCCL does not
				}
				var me *hier.MismatchError
				require.ErrorAs(t, err, &me, "rank %d", g)
				require.Equal(t, tc.field, me.Field, "rank %d: %v", g, err)
				if tc.refuse {
					require.NotNil(t, me.Refusal, "rank %d", g)
					require.Equal(t, odd, me.Refusal.Rank, "rank %d", g)
				}
			}
		})
	}
	// Counts on either side of the flat threshold put one rank's call on a
	// fingerprint and the others' on the shared memory's check, and their
	// data on different routes: no rank's Work returns nil. (The simulator
	// finds the misaligned collectives itself; on NCCL they hang until
	// the watchdog, and a posted call is decided only once every rank has
	// posted it: hostCheck.read.)
	for _, odd := range []struct {
		name   string
		n, all int // elements: the odd rank's, everyone else's
	}{
		{"one rank posted, the rest fingerprinted", 1500, 16},
		{"one rank fingerprinted, the rest posted", 16, 1500},
	} {
		t.Run(odd.name, func(t *testing.T) {
			w := newStar(t)
			in := make([][]byte, w.size())
			for g := range in {
				in[g] = make([]byte, 4*odd.all)
			}
			in[m-1] = make([]byte, 4*odd.n)
			ts := w.upload(t, fairgo.Float32, in)
			works := make([]*hier.Work, len(w.reducers))
			for g, r := range w.reducers {
				works[g] = r.AllReduce(context.Background(), ts[g], fairgo.Sum)
			}
			for g, wk := range works {
				err := wk.Wait(context.Background())
				require.Error(t, err, "rank %d", g)
				var te *hier.TimeoutError
				require.True(t, errors.Is(err, fairgo.ErrMismatch) || errors.Is(err, fairgo.ErrAborted) || errors.As(err, &te),
					"rank %d: %v", g, err)
			}
		})
	}
}

// TestMismatchNamedThoughAPeerAbortsFirst: a rank whose check lacks a
// peer's image when another rank, having found the mismatch, aborts the
// communicators, sees the communicators fail before its check can decide
// (on GPUs past four machines, NCCL brings the abort before the relay's
// star brings the image). It still reports the mismatch, not the failure:
// the call's check is given its grace to decide. The relays of every rank
// but the first (the star's hub) hold what they receive until the first
// rank has failed its call and the others have seen the communicators
// fail; across the mesh and the star.
func TestMismatchNamedThoughAPeerAbortsFirst(t *testing.T) {
	for _, machines := range []int{3, hier.RelayMeshMachines + 2} {
		t.Run(fmt.Sprintf("%dx1", machines), func(t *testing.T) {
			w := newWorld(t, sim.Config{Machines: machines, Devices: 1, Seed: 4, StallTimeout: time.Minute},
				hier.WithSharedMemoryDir(t.TempDir()), hier.WithCheckHost("127.0.0.1"), hier.WithTimeout(time.Minute),
				// A route of several exchanges: past the mesh a flat call
				// carries its fingerprint instead (checksByRoute).
				hier.WithAlgorithm(hier.HalvingDoubling), hier.WithFlatThreshold(hier.FlatNever))
			warmUp(t, w, beforeSharedMemory)
			sumOnEveryRank(t, w)
			for g, r := range w.reducers {
				require.True(t, hier.SharedMemoryCheck(r), "rank %d", g)
			}
			held := w.reducers[1:]
			for _, r := range held {
				hier.HoldRelay(r, true)
			}
			t.Cleanup(func() {
				for _, r := range held {
					hier.HoldRelay(r, false)
				}
			})
			deviant := len(w.reducers) - 1
			ts := w.upload(t, fairgo.Float32, make([][]byte, len(w.reducers)))
			for g := range ts {
				ts[g], _ = w.alloc(g, 16, fairgo.Float32)
			}
			works := make([]*hier.Work, len(w.reducers))
			for g, r := range w.reducers {
				op := fairgo.Sum
				if g == deviant {
					op = fairgo.Max
				}
				works[g] = r.AllReduce(context.Background(), ts[g], op)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			require.ErrorIs(t, works[0].Wait(ctx), fairgo.ErrMismatch, "rank 0, which hears every image")
			time.Sleep(300 * time.Millisecond) // the held ranks see the communicators fail (their watchers look every 50 ms)
			for _, r := range held {
				hier.HoldRelay(r, false)
			}
			for g, wk := range works[1:] {
				var mm *hier.MismatchError
				require.ErrorAs(t, wk.Wait(ctx), &mm, "rank %d", g+1)
				require.Equal(t, "operator", mm.Field, "rank %d", g+1)
			}
		})
	}
}
