package hier_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
)

// variantWorld is gpuWorld with each rank's world variants (the
// launcher's rank keeps the Variants setup.Connect gave it); variants
// reports whether the ranks have them (alike on every rank: they share one
// backend).
func variantWorld(t testing.TB, m, d int, opts ...hier.Option) (w *world, variants bool) {
	t.Helper()
	rs := gpuRanks(t, m, d)
	w = &world{m: m, d: d, closeFn: func() {}, worldSize: m * d}
	for _, rk := range rs {
		if launched() {
			rk.Variants = job.Rank.Variants
		}
		variants = rk.Variants != nil
		w.addReducer(t, rk, opts...)
	}
	t.Cleanup(w.close)
	return w, variants
}

// The new algorithms on GPUs, each fixed: every dtype × op at counts of 0,
// 1, fewer than the ranks, odd ones and large ones (halving-doubling's
// steps through NCCL's grouped sends and receives and the add kernel on a
// scratch buffer; NCCL's ring and tree on world variants of their own).
func TestGPUNewAlgorithms(t *testing.T) {
	for _, g := range gpuGrids(t, [2]int{2, 1}, [2]int{1, 2}) {
		for _, algo := range []hier.Algorithm{hier.HalvingDoubling, hier.RecursiveDoubling, hier.FlatRing, hier.FlatTree} {
			t.Run(fmt.Sprintf("%dx%d/%v", g[0], g[1], algo), func(t *testing.T) {
				w, variants := variantWorld(t, g[0], g[1], hier.WithAlgorithm(algo), hier.WithFlatThreshold(1),
					hier.WithTimeout(2*time.Minute))
				if (algo == hier.FlatRing || algo == hier.FlatTree) && !variants {
					t.Skip("the backend makes no world variants here")
				}
				n := w.size()
				start := time.Now()
				runs := 0
				for _, dt := range fairgo.DTypes {
					for _, op := range fairgo.Ops {
						for _, count := range []int{0, 1, max(n-1, 0), 2*n + 1, 4097, sized(1<<20+3, 1<<16+3)} {
							in := hashInputs(dt, op, n, count, uint64(count)*131+uint64(dt)*7+uint64(op))
							out, err := w.allReduce(t, dt, op, in)
							require.NoError(t, err, "%s %s n=%d", dt, op, count)
							require.NoError(t, checkParallel(dt, op, in, out), "%s %s n=%d", dt, op, count)
							runs++
							w.freeAllocs()
						}
					}
				}
				t.Logf("grid %dx%d, %v: %d allreduces correct in %v", g[0], g[1], algo, runs,
					time.Since(start).Round(time.Millisecond))
			})
		}
	}
}

// Auto on the GPUs' grid measures its classes from 64 KiB, whatever the
// grid, with NCCL's ring and tree and halving-doubling among the
// candidates (and the sliced rail in fine slices from 4 MiB where machines
// have several devices), and every rank chooses alike; the log gives what
// each class measured and what it cost.
func TestGPUAutoMeasuresEveryGrid(t *testing.T) {
	g := gpuGrid(t)
	w, variants := variantWorld(t, g[0], g[1], hier.WithTimeout(2*time.Minute))
	n := w.size()
	for _, count := range []int{24 << 10, 48 << 10, 96 << 10, 192 << 10, 384 << 10, 768 << 10, 2 << 20} { // 96 KiB .. 8 MiB
		in := hashInputs(fairgo.Float32, fairgo.Sum, n, count, uint64(count))
		out, err := w.allReduce(t, fairgo.Float32, fairgo.Sum, in)
		require.NoError(t, err)
		require.NoError(t, checkParallel(fairgo.Float32, fairgo.Sum, in, out))
		w.freeAllocs()
	}
	var report []string
	for _, c := range w.reducers[0].Choices() {
		line := fmt.Sprintf("%d: %s", c.MinBytes, c.String())
		if cal := c.Calibration; cal != nil {
			var names []string
			for name := range cal.Times {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				line += fmt.Sprintf(" %s=%dx%v", name, cal.Samples[name], cal.Times[name].Round(time.Microsecond))
			}
			line += fmt.Sprintf(" cost=%v setup=%v", cal.Cost.Round(time.Millisecond), cal.Setup.Round(time.Millisecond))
		}
		report = append(report, line)
	}
	t.Logf("grid %dx%d (variants: %v):\n%s", g[0], g[1], variants, strings.Join(report, "\n"))
	if n == 1 {
		return
	}
	var names []string
	for _, c := range w.reducers[0].Choices() {
		names = append(names, fmt.Sprintf("%d:%s:%v", c.MinBytes, c.String(), c.Measured))
	}
	w.allSame(t, "the choices", [][]byte{[]byte(strings.Join(names, " "))})
	c := w.reducers[0].ChoiceFor(96 << 10)
	require.True(t, c.Measured, "the 64 KiB class is measured on %dx%d", g[0], g[1])
	if variants {
		require.Contains(t, c.Calibration.Times, "flat-tree")
	}
	if n >= 4 {
		require.Contains(t, c.Calibration.Times, "halving-doubling")
	}
	if g[0] > 1 && g[1] > 1 { // the links measured: the rail in the model's slices and in fine ones
		big := w.reducers[0].ChoiceFor(8 << 20)
		require.True(t, big.Measured, "the 8 MiB class is measured")
		require.Contains(t, big.Calibration.Times, "rail-rsag-serial-fine")
	}
}
