package hier_test

// Issue 12's checks on GPUs: mismatches caught by the check communicator,
// 16-bit values near the maximum, dependencies of calls with nothing to do,
// no leaks over many Reducers and many calls, the host cost of an enqueue,
// and a fault-injection worker for fairrun.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/cuda"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/elem"
	"github.com/fairgo/fairgo/internal/reftest"
)

// Counts that differ only in the tail fail on every rank with ErrMismatch,
// through the NCCL check communicator, on every grid and algorithm (the
// last rank's count is one more). A world of one rank has nobody to differ
// from: on one GPU these cases run under a launcher.
func TestGPUMismatchedCounts(t *testing.T) {
	n := sized(1<<20+1, 1<<16+1)
	for _, tc := range gpuAlgoGrids(t, algoGrid{1, 2, hier.Flat}, algoGrid{2, 1, hier.RailAllToAll},
		algoGrid{2, 1, hier.RailRSAG}) {
		if tc.m*tc.d == 1 {
			t.Logf("%s: one rank, nothing to mismatch (the launcher form runs these cases on one GPU)", tc)
			continue
		}
		t.Run(tc.String(), func(t *testing.T) {
			// A mismatch aborts the communicators: build them for this test.
			w := freshGPUWorld(
				t,
				tc.m,
				tc.d,
				hier.WithFlatThreshold(hier.FlatNever),
				hier.WithAlgorithm(tc.algo),
				hier.WithTimeout(30*time.Second),
			)
			in := make([][]byte, w.size())
			for g := range in {
				in[g] = make([]byte, 4*n)
			}
			in[len(in)-1] = make([]byte, 4*(n+1))
			ts := w.upload(t, fairgo.Float32, in)
			var works []*hier.Work
			for g, r := range w.reducers {
				works = append(works, r.AllReduce(context.Background(), ts[g], fairgo.Sum))
			}
			for g, wk := range works {
				err := wk.Wait(context.Background())
				require.ErrorIs(t, err, fairgo.ErrMismatch, "rank %d", w.rank(g))
				t.Logf("rank %d: %v", w.rank(g), err)
			}
		})
	}
}

// Past the calls that carry the agreement, the ranks check through shared
// memory, on one machine and across up to RelayMaxMachines machines (the
// relay bringing the other machines' images; beyond, through the
// fingerprints), one process per GPU under a launcher or all in one:
// results are right, also past the slots' first use, and the maximum on
// the last rank, among sums, fails on every rank with ErrMismatch. Where
// fingerprints check, that rank alone also runs the separate check
// (TestGPUOperatorDifferingFailsFast).
func TestGPUSharedMemoryCheck(t *testing.T) {
	for _, tc := range gpuAlgoGrids(t, algoGrid{1, 2, hier.Flat}, algoGrid{2, 1, hier.Flat}) {
		if tc.m*tc.d < 2 {
			t.Logf("%s: the check needs several ranks", tc)
			continue
		}
		t.Run(tc.String(), func(t *testing.T) {
			w := freshGPUWorld(t, tc.m, tc.d, hier.WithTimeout(30*time.Second))
			warmUp(t, w, beforeSharedMemory)
			sumOnEveryRank(t, w)
			shared := tc.m <= hier.RelayMaxMachines // beyond, the collective and the fingerprints
			for g, r := range w.reducers {
				require.Equal(t, shared, hier.SharedMemoryCheck(r), "rank %d", w.rank(g))
				require.Equal(t, shared && tc.m > 1, hier.RelayedCheck(r), "rank %d", w.rank(g))
			}
			warmUp(t, w, 2*hier.SharedMemorySlots)
			sumOnEveryRank(t, w)
			works := maxAmongSums(t, w)
			fields := []string{"operator"}
			if !shared {
				fields = append(fields, "shape") // a fingerprint's field hash that collided
			}
			for g, wk := range works {
				err := wk.Wait(context.Background())
				require.ErrorIs(t, err, fairgo.ErrMismatch, "rank %d", w.rank(g))
				var mm *hier.MismatchError
				require.ErrorAs(t, err, &mm)
				require.Contains(t, fields, mm.Field)
				t.Logf("rank %d: %v", w.rank(g), err)
			}
		})
	}
}

// A rank whose operator differs on a fingerprinted call (a maximum among
// sums) fails with its peers, long before the watchdog, though it alone
// runs a separate check on the check communicator: every rank connected
// that communicator at call 1, so NCCL does not hold the maximum's launch
// for peers that never join it. The check goes through the collective and
// the fingerprints (no shared memory), on communicators made for the test.
func TestGPUOperatorDifferingFailsFast(t *testing.T) {
	const timeout = 30 * time.Second
	for _, tc := range checkGrids(t) {
		t.Run(fmt.Sprintf("%dx%d", tc.m, tc.d), func(t *testing.T) {
			w := freshGPUWorld(t, tc.m, tc.d, hier.WithTimeout(timeout), hier.WithSharedMemoryDir(""))
			warmUp(t, w, 3)
			sumOnEveryRank(t, w)
			start := time.Now()
			requireMismatchesWithin(t, w, maxAmongSums(t, w), start, timeout/3)
		})
	}
}

// float16 and bfloat16 Avg of values near the maximum, and Sum whose total
// fits, come out finite and right on every algorithm.
func TestGPUSixteenBitNearTheMaximum(t *testing.T) {
	count := sized(1<<20+5, 1<<16+5)
	for _, tc := range gpuAlgoGrids(t, algoGrid{1, 2, hier.Flat}, algoGrid{2, 1, hier.RailAllToAll},
		algoGrid{2, 1, hier.RailRSAG}) {
		for _, dt := range []fairgo.DType{fairgo.Float16, fairgo.BFloat16} {
			t.Run(fmt.Sprintf("%s/%s", tc, dt), func(t *testing.T) {
				w := gpuWorld(
					t,
					tc.m,
					tc.d,
					hier.WithFlatThreshold(hier.FlatNever),
					hier.WithAlgorithm(tc.algo),
					hier.WithTimeout(30*time.Second),
				)
				W := w.size()
				maxv := 65504.0
				if dt == fairgo.BFloat16 {
					maxv = 3.3e38
				}
				for _, op := range []fairgo.Op{fairgo.Avg, fairgo.Sum} {
					in := make([][]byte, W)
					for g := range in {
						in[g] = make([]byte, 2*count)
						for i := range count {
							frac := float64(hashValue(uint64(op), g, i)%1000) / 1000
							v := maxv * (0.26 + 0.65*frac)
							if op == fairgo.Sum {
								v = maxv / float64(W) * (0.5 + 0.45*frac) // the total fits
							}
							elem.Set(dt, in[g], i, v)
						}
					}
					out, err := w.allReduce(t, dt, op, in)
					require.NoError(t, err)
					for k := range out {
						for i := range count {
							v := elem.Get(dt, out[k], i)
							require.False(
								t,
								math.IsInf(v, 0) || math.IsNaN(v),
								"%v rank %d element %d is %v",
								op,
								w.rank(k),
								i,
								v,
							)
						}
					}
					require.NoError(t, checkParallel(dt, op, in, out), "%v", op)
					w.freeAllocs()
				}
			})
		}
	}
}

// A call with nothing to do on the device keeps its After dependency: the
// consumer ordered by StreamWait sees what the delayed producer wrote. On
// every grid a count of 0, and of 1024 (nothing to do on one rank; a real
// allreduce of the head of the buffer elsewhere, whose tail the consumer
// reads).
func TestGPUNoOpCallKeepsItsDependency(t *testing.T) {
	for _, g := range gpuGrids(t, [2]int{1, 1}, [2]int{1, 2}) {
		for _, count := range []int64{0, 1024} {
			t.Run(fmt.Sprintf("%dx%d/count=%d", g[0], g[1], count), func(t *testing.T) {
				w := gpuWorld(t, g[0], g[1], hier.WithTimeout(30*time.Second))
				const n = 1 << 20
				var works []*hier.Work
				outs := make([]fairgo.Tensor, len(w.reducers))
				consumers := make([]*cuda.Stream, len(w.reducers))
				for i, r := range w.reducers {
					dev := w.devs[i].(*cuda.Device)
					buf, err := w.alloc(i, n, fairgo.Float32)
					require.NoError(t, err)
					src, err := w.alloc(i, n, fairgo.Float32)
					require.NoError(t, err)
					outs[i], err = w.alloc(i, n, fairgo.Float32)
					require.NoError(t, err)
					ones := make([]byte, 4*n)
					for k := range n {
						elem.Set(fairgo.Float32, ones, k, 1)
					}
					require.NoError(t, dev.Upload(src.Ptr, ones))
					require.NoError(t, dev.Upload(buf.Ptr, make([]byte, 4*n)))
					producer, err := dev.CreateStream()
					require.NoError(t, err)
					require.NoError(t, dev.DelayAsync(200*time.Millisecond, producer))
					require.NoError(t, dev.CopyAsync(buf.Ptr, src.Ptr, 4*n, producer))
					wk := r.AllReduce(context.Background(), buf.Slice(0, count), fairgo.Sum, hier.After(producer))
					consumers[i], err = dev.CreateStream()
					require.NoError(t, err)
					require.NoError(t, wk.StreamWait(context.Background(), consumers[i]))
					require.NoError(t, dev.CopyAsync(outs[i].Ptr, buf.Ptr, 4*n, consumers[i]))
					works = append(works, wk)
				}
				require.NoError(t, reftest.WaitAll(works))
				for i := range w.reducers {
					require.NoError(t, consumers[i].Synchronize())
					out := make([]byte, 4*n)
					require.NoError(t, w.devs[i].Download(out, outs[i].Ptr))
					require.Equal(
						t,
						1.0,
						elem.Get(fairgo.Float32, out, n-1),
						"rank %d read the buffer before the producer wrote it",
						w.rank(i),
					)
					if count > 0 {
						require.Equal(
							t,
							float64(w.size()),
							elem.Get(fairgo.Float32, out, 0),
							"rank %d: the reduced head",
							w.rank(i),
						)
					}
				}
			})
		}
	}
}

// Close and recreate a Reducer 100 times: device memory returns to where
// it started (±1%) and goroutines do not pile up; then 10,000 allreduces on
// one Reducer leave device memory and goroutines flat (device memory
// exactly where the process has its GPU to itself; within 1% under a
// launcher, whose other ranks share it: every rank measures between two
// barriers, with the job quiet).
func TestGPUNoLeaks(t *testing.T) {
	g := gpuGrid(t)
	rs := gpuRanks(t, g[0], g[1])
	dev0 := rs[0].Device.(*cuda.Device)
	zeros := func(w *world, bytes int) [][]byte {
		in := make([][]byte, w.size())
		for k := range in {
			in[k] = make([]byte, bytes)
		}
		return in
	}
	cycle := func() {
		w := gpuWorld(t, g[0], g[1], hier.WithTimeout(30*time.Second))
		ts := w.upload(t, fairgo.Float32, zeros(w, sized(4<<20, 1<<20)))
		var works []*hier.Work
		for i, r := range w.reducers {
			works = append(works, r.AllReduce(context.Background(), ts[i], fairgo.Sum))
		}
		require.NoError(t, reftest.WaitAll(works))
		w.close()
	}
	quiet := &world{worldSize: g[0] * g[1]} // for barriers
	memInfo := func() (free, total int64) {
		quiet.barrier(t)
		free, total, err := dev0.MemInfo()
		require.NoError(t, err)
		quiet.barrier(t)
		return free, total
	}
	cycle() // NCCL connects lazily: the first use allocates its buffers
	runtime.GC()
	freeBefore, total := memInfo()
	goBefore := runtime.NumGoroutine()
	const cycles = 100
	began := time.Now()
	for i := range cycles {
		cycle()
		if (i+1)%20 == 0 { // a minute of cycles says it is alive (a silent log reads as a stall)
			t.Logf("%d of %d Reducers made and closed, %v", i+1, cycles, time.Since(began).Round(time.Millisecond))
		}
	}
	runtime.GC()
	time.Sleep(100 * time.Millisecond)
	freeAfter, _ := memInfo()
	drift := float64(freeBefore-freeAfter) / float64(freeBefore)
	t.Logf(
		"%d Reducers made and closed on %dx%d: device free memory %d → %d of %d bytes (drift %.4f%%), goroutines %d → %d",
		cycles,
		g[0],
		g[1],
		freeBefore,
		freeAfter,
		total,
		100*drift,
		goBefore,
		runtime.NumGoroutine(),
	)
	require.Less(t, math.Abs(drift), 0.01)
	require.LessOrEqual(t, runtime.NumGoroutine(), goBefore+5)

	w := gpuWorld(t, g[0], g[1], hier.WithTimeout(30*time.Second), hier.WithAlgorithm(hier.RailAllToAll))
	bytes := sized(1<<20, 64<<10)
	ts := w.upload(t, fairgo.Float32, zeros(w, bytes))
	run := func(calls int) {
		for c := 0; c < calls; c += 100 {
			var works []*hier.Work
			for range 100 {
				for i, r := range w.reducers {
					works = append(works, r.AllReduce(context.Background(), ts[i], fairgo.Sum))
				}
			}
			require.NoError(t, reftest.WaitAll(works))
		}
	}
	run(1000) // reach the steady state: pools, rings and NCCL's buffers
	free1, _ := memInfo()
	var heap1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&heap1)
	g1 := runtime.NumGoroutine()
	start := time.Now()
	run(10000)
	free2, _ := memInfo()
	var heap2 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&heap2)
	t.Logf(
		"10000 allreduces of %d KiB on %dx%d in %v: device free %d → %d bytes, Go heap %d → %d bytes, "+
			"goroutines %d → %d",
		bytes>>10,
		g[0],
		g[1],
		time.Since(start).Round(time.Millisecond),
		free1,
		free2,
		heap1.HeapInuse,
		heap2.HeapInuse,
		g1,
		runtime.NumGoroutine(),
	)
	if sharedGPU() {
		require.Less(t, math.Abs(float64(free1-free2))/float64(free1), 0.01, "device memory moved over 10000 calls")
	} else {
		require.Equal(t, free1, free2, "device memory grew over 10000 calls")
	}
	require.Less(t, float64(heap2.HeapInuse), 1.5*float64(heap1.HeapInuse)+8<<20)
	require.LessOrEqual(t, runtime.NumGoroutine(), g1+2)
}

// BenchmarkGPUEnqueue is BenchmarkEnqueue on the GPUs: the host time of one
// single-slice collective (target T6).
func BenchmarkGPUEnqueue(b *testing.B) {
	inline := []hier.Option{hier.WithInlineEnqueue(true)}
	for _, tc := range []struct {
		name string
		m, d int
		opts []hier.Option
		coll collective
	}{
		{"1x2/flat/inline", 1, 2, inline, allReduceCall},
		{"1x2/flat/engine", 1, 2, nil, allReduceCall},
		{"2x1/flat/inline", 2, 1, inline, allReduceCall}, // check on: the fingerprint, across machines
		{"2x1/halving-doubling", 2, 1, fixedAlgorithm(hier.HalvingDoubling), allReduceCall},
		{"2x1/halving-doubling/inline", 2, 1, append(fixedAlgorithm(hier.HalvingDoubling), inline...), allReduceCall},
		{"2x1/rail-a2a", 2, 1, fixedAlgorithm(hier.RailAllToAll), allReduceCall},
		{"2x1/rail-a2a/inline", 2, 1, append(fixedAlgorithm(hier.RailAllToAll), inline...), allReduceCall},
		{"2x1/rail-rsag", 2, 1, fixedAlgorithm(hier.RailRSAG), allReduceCall},
		{"2x1/rail-rsag/inline", 2, 1, append(fixedAlgorithm(hier.RailRSAG), inline...), allReduceCall},
		{"1x2/reduce-scatter/inline", 1, 2, inline, reduceScatterCall},
		{"1x2/reduce-scatter/engine", 1, 2, nil, reduceScatterCall},
		{"1x2/all-gather/inline", 1, 2, inline, allGatherCall},
		{"1x2/broadcast/inline", 1, 2, inline, broadcastCall},
	} {
		for _, check := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/check=%v", tc.name, check), func(b *testing.B) {
				if !gridHere(b, tc.m, tc.d) {
					b.Skipf("grid %dx%d is not here (a benchmark of one process over its GPUs)", tc.m, tc.d)
				}
				w := gpuWorld(b, tc.m, tc.d, append([]hier.Option{hier.WithTimeout(time.Minute)}, tc.opts...)...)
				if !check {
					for _, r := range w.reducers {
						hier.SkipCheck(r)
					}
				}
				benchEnqueue(b, w.reducers, w.devs, 1<<16, 32, tc.coll)
			})
		}
	}
}

// fixedAlgorithm makes every allreduce of a benchmark's Reducers take a
// as its route.
func fixedAlgorithm(a hier.Algorithm) []hier.Option {
	return []hier.Option{hier.WithFlatThreshold(hier.FlatNever), hier.WithAlgorithm(a)}
}

// BenchmarkGPUEnqueueJob is BenchmarkGPUEnqueue for a job of one rank per
// process under a launcher (FAIRGO_ENQUEUE_WORKER=1, e.g. fairrun's testbed
// on a host of one GPU): setup.New's Reducer, which enqueues inline. Every
// rank must run the same iterations: use a fixed -test.benchtime (e.g. 1000x).
func BenchmarkGPUEnqueueJob(b *testing.B) {
	r, _, dev, grid := enqueueWorkerJob(b)
	for _, check := range []bool{true, false} {
		for _, size := range []int64{64 << 10, 1 << 20} {
			for _, batch := range []int{32, 1} {
				b.Run(fmt.Sprintf("%s/job/%dKiB/batch=%d/check=%v", grid, size>>10, batch, check), func(b *testing.B) {
					if !check {
						hier.SkipCheck(r)
					}
					benchEnqueue(b, []*hier.Reducer{r}, []testDevice{dev}, size/4, batch, allReduceCall)
				})
			}
		}
	}
}

// A call refused on one rank fails on every rank long before the watchdog
// where the peers' data is the first collective on communicators made for
// the test, whose connection NCCL makes at that call, holding the
// enqueuing thread until every peer has made one: the separate check goes
// before the data, the check in shared memory is read while the enqueue
// is held, and the abort that the mismatch causes ends the held
// connection. The calls before leave the data's communicators unused
// (their tensors are empty).
func TestGPURefusedAtTheFirstConnection(t *testing.T) {
	const timeout = 30 * time.Second
	for _, tc := range checkGrids(t) {
		for _, mode := range []struct {
			name   string
			warm   int
			shared bool
			opts   []hier.Option
		}{
			{"separate", 0, false, []hier.Option{hier.WithFingerprintMax(0), hier.WithSharedMemoryDir("")}},
			{"shared memory", beforeSharedMemory, true, nil},
		} {
			if mode.shared && tc.m > hier.RelayMaxMachines {
				t.Logf("%dx%d: no shared memory beyond %d machines", tc.m, tc.d, hier.RelayMaxMachines)
				continue
			}
			t.Run(fmt.Sprintf("%dx%d/%s", tc.m, tc.d, mode.name), func(t *testing.T) {
				w := freshGPUWorld(t, tc.m, tc.d, append(mode.opts, hier.WithTimeout(timeout))...)
				empty := fairgo.Tensor{DType: fairgo.Float32}
				for range mode.warm {
					require.NoError(t, reftest.WaitAll(callEveryRank(w, func(_ int, r *hier.Reducer) *hier.Work {
						return r.AllReduce(context.Background(), empty, fairgo.Sum)
					})))
				}
				ts := allocEach(t, w, 1024, fairgo.Float32)
				refuser := w.size() - 1
				done, cancel := context.WithCancel(context.Background())
				cancel()
				start := time.Now()
				works := callEveryRank(w, func(g int, r *hier.Reducer) *hier.Work {
					ctx := context.Background()
					if w.rank(g) == refuser {
						ctx = done
					}
					return r.AllReduce(ctx, ts[g], fairgo.Sum)
				})
				for g, wk := range works {
					err := wk.Wait(context.Background())
					t.Logf("rank %d after %v: %v", w.rank(g), time.Since(start).Round(time.Millisecond), err)
					if w.rank(g) == refuser {
						require.ErrorIs(t, err, context.Canceled)
						continue
					}
					require.ErrorIs(t, err, fairgo.ErrMismatch, "rank %d", w.rank(g))
					require.ErrorContains(t, err, fmt.Sprintf("rank %d refused call %d", refuser, 1+mode.warm))
					require.Less(t, time.Since(start), timeout/3, "rank %d", w.rank(g))
				}
				// The refusing rank's Wait returned before its engine ran the call.
				enginesIdle(t, w)
				for g, r := range w.reducers { // taken up at the refused call
					require.Equal(t, mode.shared, hier.SharedMemoryCheck(r), "rank %d", w.rank(g))
				}
			})
		}
	}
}

// A rank that refuses a small call for an unknown element type runs
// neither its peers' fingerprinted collective nor a check they join: the
// peers read the refusal from the Board once their call has stayed
// undecided for a second, and the refusing rank reads there that they
// did. Every rank fails with ErrMismatch long before the watchdog.
func TestGPURefusalNoCheckCarries(t *testing.T) {
	const timeout = time.Minute
	for _, tc := range checkGrids(t) {
		t.Run(fmt.Sprintf("%dx%d", tc.m, tc.d), func(t *testing.T) {
			w := freshGPUWorld(t, tc.m, tc.d, hier.WithTimeout(timeout), hier.WithSharedMemoryDir(""))
			warmUp(t, w, 2)
			ts := allocEach(t, w, 1024, fairgo.Float32)
			refuser := w.size() - 1
			start := time.Now()
			works := callEveryRank(w, func(g int, r *hier.Reducer) *hier.Work {
				tn := ts[g]
				if w.rank(g) == refuser {
					tn.DType = fairgo.DType(99)
				}
				return r.AllReduce(context.Background(), tn, fairgo.Sum)
			})
			for g, wk := range works {
				err := wk.Wait(context.Background())
				t.Logf("rank %d after %v: %v", w.rank(g), time.Since(start).Round(time.Millisecond), err)
				if w.rank(g) == refuser {
					require.ErrorIs(t, err, fairgo.ErrUnknownDType)
					continue
				}
				require.ErrorIs(t, err, fairgo.ErrMismatch, "rank %d", w.rank(g))
				require.ErrorContains(t, err, fmt.Sprintf("rank %d refused call 3", refuser))
				require.ErrorContains(t, err, "unknown element type") // the reason, from the Board
				require.Less(t, time.Since(start), timeout/4, "rank %d", w.rank(g))
			}
			for g, r := range w.reducers {
				require.Eventually(t, func() bool { return errors.Is(r.Err(), fairgo.ErrMismatch) },
					timeout/4, 10*time.Millisecond, "rank %d: %v", w.rank(g), r.Err())
			}
		})
	}
}

// checkGrids are the grids of several ranks, each once, that the check's
// GPU tests run on: 1 × 2 and 2 × 1 where the GPUs allow, or the
// launcher's.
func checkGrids(t testing.TB) []algoGrid {
	seen := map[[2]int]bool{}
	var out []algoGrid
	for _, tc := range gpuAlgoGrids(t, algoGrid{1, 2, hier.Flat}, algoGrid{2, 1, hier.Flat}) {
		if tc.m*tc.d >= 2 && !seen[[2]int{tc.m, tc.d}] {
			seen[[2]int{tc.m, tc.d}] = true
			out = append(out, tc)
		}
	}
	return out
}
