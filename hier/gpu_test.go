package hier_test

// The engine's tests on the GPU backend, in two forms (gpu_world_test.go):
// one process drives the GPUs of the test machine, with the grid declared as
// 1 machine × 2 devices and as 2 machines × 1 device where there are two
// (1 × 1 on one GPU); or, under a launcher, each process drives its own
// rank of the job's grid, e.g. on one GPU:
//
//	fairrun --emulate-machines 4 --nproc-per-node 8 --nic-gbit 10 --mps on -- bin/hier.test -test.run '^TestGPU'
//
// They skip only where there is no GPU driver or no GPU (fairgo.ErrNoDevice).

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/cuda"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/elem"
	"github.com/fairgo/fairgo/internal/reftest"
	"github.com/fairgo/fairgo/staging"
)

// gpus holds the in-process form's devices and ranks (gpu_world_test.go).
var gpus struct {
	once  sync.Once
	devs  []*cuda.Device
	err   error
	mu    sync.Mutex
	ranks map[[2]int][]backend.Rank
}

func TestMain(m *testing.M) {
	code := m.Run()
	gpus.mu.Lock()
	for _, rs := range gpus.ranks {
		_ = cuda.CloseRanks(rs)
	}
	gpus.mu.Unlock()
	for _, d := range gpus.devs {
		_ = d.Close()
	}
	closeJob()
	os.Exit(code)
}

// hashValue is input element i of rank g: a pure function, so large inputs
// are generated in parallel.
func hashValue(seed uint64, g, i int) uint64 {
	x := seed ^ uint64(g)*0x9e3779b97f4a7c15 ^ uint64(i)*0xbf58476d1ce4e5b9
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func parallelChunks(n int, fn func(lo, hi int) error) error {
	workers := runtime.GOMAXPROCS(0)
	chunk := max(1<<16, (n+workers-1)/workers)
	var wg sync.WaitGroup
	errs := make([]error, (n+chunk-1)/chunk)
	for c := 0; c*chunk < n; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[c] = fn(c*chunk, min(n, (c+1)*chunk))
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func hashInputs(dt fairgo.DType, op fairgo.Op, ranks, count int, seed uint64) [][]byte {
	es := dt.Size()
	out := make([][]byte, ranks)
	for g := range out {
		b := make([]byte, count*es)
		_ = parallelChunks(count, func(lo, hi int) error {
			for i := lo; i < hi; i++ {
				h := hashValue(seed, g, i)
				if !dt.IsFloat() {
					for k := 0; k < es; k++ {
						b[i*es+k] = byte(h >> (8 * k))
					}
					continue
				}
				u := float64(h>>11) / (1 << 53)
				v := 2*u - 1
				if op == fairgo.Prod {
					v = 0.9 + 0.2*u
					if h&1 == 1 {
						v = -v
					}
				}
				elem.Set(dt, b, i, v)
			}
			return nil
		})
		out[g] = b
	}
	return out
}

// checkParallel checks outputs against the reference in chunks.
func checkParallel(dt fairgo.DType, op fairgo.Op, in, out [][]byte) error {
	es := dt.Size()
	n := len(in[0]) / es
	return parallelChunks(n, func(lo, hi int) error {
		sub := func(bs [][]byte) [][]byte {
			s := make([][]byte, len(bs))
			for g := range bs {
				s[g] = bs[g][lo*es : hi*es]
			}
			return s
		}
		if err := reftest.CheckResults(dt, reftest.ComputeReference(dt, op, sub(in)), sub(out)); err != nil {
			return fmt.Errorf("elements [%d, %d): %w", lo, hi, err)
		}
		return nil
	})
}

// Every dtype × op at counts {0, 1, 7, 4097, 1 Mi + 3} on 1×2 (flat) and on
// 2×1 with both rail forms, and 64 Mi elements for the float types' Sum and
// Avg; under a launcher, on its grid with flat and both rail forms, with
// the two largest counts smaller (64 Ki + 3 and 2 Mi + 1).
func TestGPUMatrix(t *testing.T) {
	for _, g := range gpuAlgoGrids(t, algoGrid{1, 2, hier.Flat}, algoGrid{2, 1, hier.RailAllToAll},
		algoGrid{2, 1, hier.RailRSAG}) {
		t.Run(g.String(), func(t *testing.T) {
			w := gpuWorld(
				t,
				g.m,
				g.d,
				hier.WithFlatThreshold(hier.FlatNever),
				hier.WithAlgorithm(g.algo),
				hier.WithTimeout(2*time.Minute),
			)
			start := time.Now()
			runs := 0
			for _, dt := range fairgo.DTypes {
				for _, op := range fairgo.Ops {
					counts := []int{0, 1, 7, 4097, sized(1<<20+3, 1<<16+3)}
					if dt.IsFloat() && (op == fairgo.Sum || op == fairgo.Avg) {
						counts = append(counts, sized(64<<20, 2<<20+1))
					}
					for _, n := range counts {
						in := hashInputs(dt, op, w.size(), n, uint64(n)*31+uint64(dt)*7+uint64(op))
						out, err := w.allReduce(t, dt, op, in)
						require.NoError(t, err, "%s %s n=%d", dt, op, n)
						require.NoError(t, checkParallel(dt, op, in, out), "%s %s n=%d", dt, op, n)
						runs++
						w.freeAllocs()
					}
				}
			}
			t.Logf(
				"grid %s: %d allreduces (10 dtypes × 5 ops) all correct in %v",
				g,
				runs,
				time.Since(start).Round(time.Millisecond),
			)
		})
	}
}

// The same property test as on sim, on GPUs. Under a launcher every rank
// draws the same cases and agrees each verdict, so that all fail (and
// report) the same case.
func TestGPUProperty(t *testing.T) {
	for _, g := range gpuGrids(t, [2]int{1, 2}, [2]int{2, 1}) {
		t.Run(fmt.Sprintf("%dx%d", g[0], g[1]), func(t *testing.T) {
			sameRapidSeed(t)
			rapid.Check(t, func(rt *rapid.T) {
				dt := rapid.SampledFrom(fairgo.DTypes).Draw(rt, "dtype")
				op := rapid.SampledFrom(fairgo.Ops).Draw(rt, "op")
				count := rapid.OneOf(rapid.IntRange(0, 100), rapid.IntRange(100, sized(3<<20, 1<<18))).Draw(rt, "count")
				bytes := int64(max(1, count*dt.Size()))
				unit := int64(g[0]*g[1]) * staging.Align
				par := rapid.IntRange(1, 6).Draw(rt, "parallelism")
				slice := rapid.Int64Range(max(unit, bytes/32), 2*bytes+unit).Draw(rt, "slice")
				w := gpuWorld(
					t,
					g[0],
					g[1],
					hier.WithSliceSize(slice),
					hier.WithParallelism(par),
					hier.WithAlgorithm(
						rapid.SampledFrom([]hier.Algorithm{hier.Auto, hier.RailAllToAll, hier.RailRSAG}).
							Draw(rt, "algorithm"),
					),
					hier.WithInlineEnqueue(rapid.Bool().Draw(rt, "inline")),
					hier.WithStagingMemory(int64(par)*(slice+unit+int64(g[0])*staging.Align)),
					hier.WithFlatThreshold(rapid.SampledFrom([]int64{hier.FlatNever, 0, bytes / 2}).Draw(rt, "flat")),
					hier.WithTimeout(time.Minute),
				)
				defer w.close()
				in := hashInputs(dt, op, w.size(), count, rapid.Uint64().Draw(rt, "seed"))
				out, err := w.allReduce(t, dt, op, in)
				var bad error
				if err == nil {
					bad = checkParallel(dt, op, in, out)
				}
				if !w.agree(t, err == nil && bad == nil) {
					rt.Fatalf("a rank failed; this one: allreduce %v, result %v", err, bad)
				}
			})
		})
	}
}

// Under a launcher (one rank per process) the calls are enqueued inline
// where they can be (one machine), as setup.New's Reducers enqueue them;
// in one process one goroutine drives every rank, which inline enqueue
// does not allow (WithInlineEnqueue).
func TestGPUReduceScatterAllGather(t *testing.T) {
	inline := launched()
	for _, g := range gpuGrids(t, [2]int{1, 2}, [2]int{2, 1}) {
		for _, dt := range []fairgo.DType{fairgo.Float32, fairgo.BFloat16, fairgo.Int64} {
			for _, c := range []int{1, 7, 4097, sized(1<<18+3, 1<<16+3)} {
				name := fmt.Sprintf("%dx%d/%s/%d", g[0], g[1], dt, c)
				t.Run(name, func(t *testing.T) {
					w := gpuWorld(t, g[0], g[1], hier.WithSliceSize(1<<20), hier.WithTimeout(time.Minute),
						hier.WithInlineEnqueue(inline))
					W := w.size()
					es := dt.Size()
					in := hashInputs(dt, fairgo.Sum, W, W*c, uint64(c))
					block := func(bs [][]byte, q int) [][]byte {
						out := make([][]byte, len(bs))
						for k := range bs {
							out[k] = bs[k][q*c*es : (q+1)*c*es]
						}
						return out
					}
					send := w.upload(t, dt, in)
					recv := make([]fairgo.Tensor, len(w.reducers))
					var works []*hier.Work
					for i, r := range w.reducers {
						var err error
						recv[i], err = w.alloc(i, int64(c), dt)
						require.NoError(t, err)
						works = append(works, r.ReduceScatter(context.Background(), send[i], recv[i], fairgo.Sum))
					}
					require.NoError(t, reftest.WaitAll(works))
					out := w.download(t, recv)
					for i, r := range w.reducers {
						gr := r.Grid().Rank()
						require.NoError(
							t,
							reftest.CheckResults(
								dt,
								reftest.ComputeReference(dt, fairgo.Sum, block(in, gr)),
								[][]byte{out[i]},
							),
							"rank %d",
							w.rank(i),
						)
					}
					// all-gather the reduced blocks back: every rank gets the
					// same W blocks, block q being grid rank q's reduced block
					full := make([]fairgo.Tensor, len(w.reducers))
					works = nil
					for i, r := range w.reducers {
						var err error
						full[i], err = w.alloc(i, int64(W*c), dt)
						require.NoError(t, err)
						works = append(works, r.AllGather(context.Background(), recv[i], full[i]))
					}
					require.NoError(t, reftest.WaitAll(works))
					if inline && g[0] == 1 {
						for i, r := range w.reducers {
							require.Equal(t, uint64(2), hier.InlineCalls(r), "rank %d: the reduce-scatter and the all-gather went inline", w.rank(i))
						}
					}
					gathered := w.download(t, full)
					w.allSame(t, "all-gather", gathered)
					for i, r := range w.reducers {
						gr := r.Grid().Rank()
						require.Equal(t, out[i], block(gathered[i:i+1], gr)[0], "rank %d: its own block", w.rank(i))
						for q := range W {
							require.NoError(
								t,
								reftest.CheckResults(
									dt,
									reftest.ComputeReference(dt, fairgo.Sum, block(in, q)),
									block(gathered[i:i+1], q),
								),
								"rank %d: block %d",
								w.rank(i),
								q,
							)
						}
					}
				})
			}
		}
	}
}

// Bad input on the GPU path is rejected before anything is enqueued; when
// every rank makes the same bad calls, the Reducers stay usable. Another
// GPU's pointer is among the cases where this process drives two GPUs.
func TestGPUBadInput(t *testing.T) {
	g := gpuGrid(t)
	w := gpuWorld(t, g[0], g[1], hier.WithFlatThreshold(hier.FlatNever), hier.WithTimeout(time.Minute))
	ctx := context.Background()
	host := make([]float32, 1024)
	mine := make([]fairgo.Tensor, len(w.reducers))
	for i := range mine {
		var err error
		mine[i], err = w.alloc(i, 1024, fairgo.Float32)
		require.NoError(t, err)
	}
	for i, r := range w.reducers {
		type badCase struct {
			name string
			t    fairgo.Tensor
		}
		cases := []badCase{
			{
				"host pointer",
				fairgo.Tensor{Ptr: uintptr(unsafe.Pointer(&host[0])), Bytes: 4096, Count: 1024, DType: fairgo.Float32},
			},
			{
				"buffer shorter than count",
				fairgo.Tensor{Ptr: mine[i].Ptr, Bytes: 4096, Count: 1025, DType: fairgo.Float32},
			},
			{
				"range past the allocation",
				fairgo.Tensor{Ptr: mine[i].Ptr + 2048, Bytes: 4096, Count: 1024, DType: fairgo.Float32},
			},
		}
		if len(w.reducers) > 1 {
			cases = append(cases, badCase{"other GPU's pointer", mine[(i+1)%len(mine)]})
		}
		for _, tc := range cases {
			err := r.AllReduce(ctx, tc.t, fairgo.Sum).Wait(ctx)
			require.ErrorIs(t, err, fairgo.ErrInvalidArgument, tc.name)
			t.Logf("rank %d, %s: %v", w.rank(i), tc.name, err)
		}
	}
	runtime.KeepAlive(host)
	// Nothing was enqueued: a valid call on every rank still matches up.
	in := hashInputs(fairgo.Float32, fairgo.Sum, w.size(), 1000, 5)
	out, err := w.allReduce(t, fairgo.Float32, fairgo.Sum, in)
	require.NoError(t, err)
	require.NoError(t, checkParallel(fairgo.Float32, fairgo.Sum, in, out))
}

// bfloat16 error of fairgo is no worse than that of a flat ncclAllReduce on
// the same data in the same process, within bfloat16RoundingSpread: where a
// route is NCCL's own reduce-scatter and all-gather over the whole world
// (the rail's, one device per machine), the two errors differ by the order
// of the same roundings only (6 × 1, an average: 619.79 against 619.72).
func TestGPUBFloat16VersusFlatNCCL(t *testing.T) {
	n := sized(1<<22+3, 1<<20+3)
	dt := fairgo.BFloat16
	g := gpuGrid(t)
	for _, tc := range []struct {
		op   fairgo.Op
		algo hier.Algorithm
	}{{fairgo.Sum, hier.RailAllToAll}, {fairgo.Avg, hier.RailAllToAll}, {fairgo.Sum, hier.RailRSAG},
		{fairgo.Avg, hier.RailRSAG}} {
		op := tc.op
		w := gpuWorld(
			t,
			g[0],
			g[1],
			hier.WithFlatThreshold(hier.FlatNever),
			hier.WithAlgorithm(tc.algo),
			hier.WithTimeout(time.Minute),
		)
		W := w.size()
		in := hashInputs(dt, op, W, n, 77)
		got, err := w.allReduce(t, dt, op, in)
		require.NoError(t, err)
		flat := w.upload(t, dt, in)
		flatRun(t, w, func(i int, s *cuda.Stream) error {
			if W == 1 {
				return nil // a world of one has no communicator: its flat result is its input
			}
			return w.flat[i].AllReduce(flat[i].Ptr, flat[i].Ptr, int64(n), dt, op, s)
		})
		flatOut := w.download(t, flat)
		want := make([]float64, n)
		_ = parallelChunks(n, func(lo, hi int) error {
			for i := lo; i < hi; i++ {
				for k := range W {
					want[i] += elem.Get(dt, in[k], i)
				}
				if op == fairgo.Avg {
					want[i] /= float64(W)
				}
			}
			return nil
		})
		errOf := func(out []byte) float64 {
			var total float64
			for i := 0; i < n; i++ {
				total += math.Abs(elem.Get(dt, out, i) - want[i])
			}
			return total
		}
		for i := range w.reducers {
			fe, ne := errOf(got[i]), errOf(flatOut[i])
			t.Logf(
				"rank %d: bfloat16 %s of %d elements on %dx%d (%s): total abs error fairgo %.6g, flat NCCL %.6g",
				w.rank(i),
				op,
				n,
				g[0],
				g[1],
				tc.algo,
				fe,
				ne,
			)
			require.LessOrEqual(t, fe, ne*(1+bfloat16RoundingSpread))
		}
	}
}

// bfloat16RoundingSpread is how far two sums of a million bfloat16
// roundings in different orders may differ, relatively: each element's
// error is a rounding of its own, and a total of 10^6 of them varies by
// about 1/sqrt(10^6) = 0.1% with the order; five times that. Precision a
// route keeps or loses shows far beyond it: the rail all-to-all, which
// adds in float32, errs half as much as NCCL (6 × 1, a sum: 1660 against
// 3376).
const bfloat16RoundingSpread = 5e-3

// flatRun runs fn for every rank on its own goroutine, bound to its device,
// on a fresh stream, and waits for the streams.
func flatRun(t testing.TB, w *world, fn func(g int, s *cuda.Stream) error) {
	var wg sync.WaitGroup
	errs := make([]error, len(w.reducers))
	for g := range w.reducers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev := w.devs[g].(*cuda.Device)
			release, err := dev.Bind()
			if err != nil {
				errs[g] = err
				return
			}
			defer release()
			s, err := dev.CreateStream()
			if err != nil {
				errs[g] = err
				return
			}
			defer s.Close()
			if err := fn(g, s); err != nil {
				errs[g] = err
				return
			}
			errs[g] = s.Synchronize()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
}

type timing struct {
	Grid   string  `json:"grid"`
	Bytes  int64   `json:"bytes"`
	Algo   string  `json:"algo"`
	Median float64 `json:"median_us"`
	Min    float64 `json:"min_us"`
	Max    float64 `json:"max_us"`
	BusBW  float64 `json:"busbw_gbps"`
}

// A first timing table: fairgo vs flat ncclAllReduce, float32, same process
// and buffers, CUDA events, median of 25 after 5 warm-ups (under a launcher,
// 10 after 2, at 64 KiB and 1 MiB only: the ranks share one GPU over
// sockets, and the timings say so little that only process 0 writes them).
func TestGPUTiming(t *testing.T) {
	warm, iters := sized(5, 2), sized(25, 10)
	sizes := []int64{64, 256, 1 << 10, 16 << 10, 64 << 10, 256 << 10}
	if launched() {
		sizes = []int64{64, 1 << 10}
	}
	var rows []timing
	for _, g := range gpuGrids(t, [2]int{1, 2}, [2]int{2, 1}) {
		w := gpuWorld(t, g[0], g[1], hier.WithTimeout(time.Minute))
		inline := gpuWorld(t, g[0], g[1], hier.WithTimeout(time.Minute), hier.WithInlineEnqueue(true))
		unchecked := gpuWorld(t, g[0], g[1], hier.WithTimeout(time.Minute), hier.WithInlineEnqueue(true))
		for _, r := range unchecked.reducers {
			hier.SkipCheck(r)
		}
		a2a := gpuWorld(t, g[0], g[1], hier.WithTimeout(time.Minute), hier.WithAlgorithm(hier.RailAllToAll))
		rsag := gpuWorld(t, g[0], g[1], hier.WithTimeout(time.Minute), hier.WithAlgorithm(hier.RailRSAG))
		algos := []string{"flat", "fairgo", "fairgo-inline", "inline-nocheck", "rail-a2a", "rail-rsag"}
		if w.size() == 1 {
			algos = algos[1:] // a world of one has no NCCL communicator
		}
		for _, kib := range sizes {
			n := kib << 10 / 4
			in := hashInputs(fairgo.Float32, fairgo.Sum, w.size(), int(n), 3)
			ts := w.upload(t, fairgo.Float32, in)
			W := float64(w.size())
			for _, algo := range algos {
				var samples []float64
				for it := 0; it < warm+iters; it++ {
					var d time.Duration
					switch algo {
					case "flat":
						d = timeFlat(t, w, ts)
					case "fairgo":
						d = timeFairgo(t, w, ts)
					case "fairgo-inline":
						d = timeFairgo(t, inline, ts)
					case "inline-nocheck":
						d = timeFairgo(t, unchecked, ts)
					case "rail-a2a":
						d = timeFairgo(t, a2a, ts)
					default:
						d = timeFairgo(t, rsag, ts)
					}
					if it >= warm {
						samples = append(samples, float64(d.Nanoseconds())/1e3)
					}
				}
				sort.Float64s(samples)
				med := samples[len(samples)/2]
				algbw := float64(kib<<10) / (med * 1e-6) / 1e9
				rows = append(rows, timing{Grid: fmt.Sprintf("%dx%d", g[0], g[1]), Bytes: kib << 10, Algo: algo,
					Median: med, Min: samples[0], Max: samples[len(samples)-1], BusBW: algbw * 2 * (W - 1) / W})
			}
		}
	}
	t.Logf("%-5s %10s %-14s %12s %12s %12s %10s", "grid", "bytes", "algo", "median(us)", "min(us)", "max(us)", "busbw")
	for _, r := range rows {
		t.Logf("%-5s %10d %-14s %12.1f %12.1f %12.1f %10.1f", r.Grid, r.Bytes, r.Algo, r.Median, r.Min, r.Max, r.BusBW)
	}
	if dir := os.Getenv("FAIRGO_OUT"); dir != "" && (!launched() || job.Launch.Rank == 0) {
		name := "gpu-timing.json"
		if launched() {
			name = fmt.Sprintf("gpu-timing-launched-%s.json", rows[0].Grid)
		}
		b, _ := json.MarshalIndent(rows, "", " ")
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
	}
}

// timeFlat times one ncclAllReduce per rank with CUDA events; the slowest rank.
func timeFlat(t testing.TB, w *world, ts []fairgo.Tensor) time.Duration {
	ds := make([]time.Duration, len(w.reducers))
	flatRun(t, w, func(g int, s *cuda.Stream) error {
		dev := w.devs[g].(*cuda.Device)
		d, err := dev.TimeRegion(s, func() error {
			return w.flat[g].AllReduce(
				ts[g].Ptr,
				ts[g].Ptr,
				ts[g].Count,
				fairgo.Float32,
				fairgo.Sum,
				s,
			)
		})
		ds[g] = d
		return err
	})
	return slices.Max(ds)
}

// timeFairgo times one fairgo AllReduce per rank between two events on a
// caller stream (After and StreamWait), each rank on a goroutine of its own
// (inline enqueueing needs that); the slowest rank.
func timeFairgo(t testing.TB, w *world, ts []fairgo.Tensor) time.Duration {
	ctx := context.Background()
	ds := make([]time.Duration, len(w.reducers))
	errs := make([]error, len(w.reducers))
	var wg sync.WaitGroup
	for g, r := range w.reducers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev := w.devs[g].(*cuda.Device)
			s, err := dev.CreateStream()
			if err != nil {
				errs[g] = err
				return
			}
			defer s.Close()
			var wk *hier.Work
			ds[g], errs[g] = dev.TimeRegion(s, func() error {
				wk = r.AllReduce(ctx, ts[g], fairgo.Sum, hier.After(s))
				return wk.StreamWait(ctx, s)
			})
			if errs[g] == nil {
				// The Reducers of a test share the rank's communicators:
				// this call's check must be over before another Reducer
				// sends one, or the ranks' checks could meet out of order.
				errs[g] = wk.Wait(ctx)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return slices.Max(ds)
}
