package report

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/fairgo/fairgo/bench"
)

// Plot writes every plot the records allow into dir, as PNG and SVG, and
// returns the files written:
//
//   - busbw_MxD_dtype[_label]: bus bandwidth against size, one line per
//     method, and the NIC-bound ideal when known (sweep and link records of
//     one grid, type, label and iteration count);
//   - speedup_Dgpus_dtype[_label]: every fairgo variant's speedup over flat
//     and naive against the machine count, one line per size (sweep
//     records of one type over several machine counts, as scale makes
//     them);
//   - overlap_MxD_dtype_KxB[_label]: the time of a round of buckets, one
//     bar per method (overlap records).
//
// Sim records get "(sim: not GPU timings)" in their titles, invalid ones
// "(INVALID: GPUs time-sliced)".
func Plot(dir string, recs []bench.Record) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("report: plots: %w", err)
	}
	var files []string
	save := func(p *plot.Plot, name string) error {
		for _, ext := range []string{".png", ".svg"} {
			f := filepath.Join(dir, name+ext)
			if err := p.Save(16*vg.Centimeter, 10*vg.Centimeter, f); err != nil {
				return fmt.Errorf("report: saving %s: %w", f, err)
			}
			files = append(files, f)
		}
		return nil
	}
	draws := []func([]bench.Record, func(*plot.Plot, string) error) error{busbwPlots, speedupPlots, overlapPlots}
	for _, draw := range draws {
		if err := draw(recs, save); err != nil {
			return files, err
		}
	}
	slices.Sort(files)
	return files, nil
}

// busbwPlots: busbw against size, one line per method, and the ideal.
func busbwPlots(recs []bench.Record, save func(*plot.Plot, string) error) error {
	groups := groupBy(recs, func(r bench.Record) (string, bool) {
		iters := ""
		if r.Iters > 1 {
			iters = fmt.Sprintf("_x%d", r.Iters)
		}
		key := fmt.Sprintf("busbw_%dx%d_%s%s%s", r.Machines, r.Devices, r.DType, iters, labelSuffix(r))
		return key, r.Kind == bench.KindSweep || r.Kind == bench.KindLink
	})
	for _, key := range slices.Sorted(maps.Keys(groups)) {
		group := groups[key]
		r0 := group[0]
		p := newPlot(
			fmt.Sprintf("allreduce busbw, %d×%d %s %s%s", r0.Machines, r0.Devices, r0.DType, r0.Op, notesOf(r0)),
			"size (bytes)",
			"busbw (GB/s)",
		)
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = sizeTicks(group)
		var lines []any
		for _, m := range methodsOf(group) {
			lines = append(lines, m, xys(group, func(r bench.Record) (float64, float64, bool) {
				return float64(r.Bytes), r.BusBW, r.Algorithm == m && r.Bytes > 0
			}))
		}
		ideal := xys(group, func(r bench.Record) (float64, float64, bool) {
			return float64(r.Bytes), r.IdealBusBW, r.IdealBusBW > 0 && r.Algorithm == group[0].Algorithm
		})
		if len(ideal) > 0 {
			lines = append(lines, "NIC-bound ideal", ideal)
		}
		if err := plotutil.AddLinePoints(p, lines...); err != nil {
			return fmt.Errorf("report: plot %s: %w", key, err)
		}
		if err := save(p, key); err != nil {
			return err
		}
	}
	return nil
}

// speedupPlots: each variant's speedup over every baseline against M.
func speedupPlots(recs []bench.Record, save func(*plot.Plot, string) error) error {
	groups := groupBy(recs, func(r bench.Record) (string, bool) {
		return fmt.Sprintf("speedup_%dgpus_%s%s", r.Devices, r.DType, labelSuffix(r)), r.Kind == bench.KindSweep
	})
	for _, key := range slices.Sorted(maps.Keys(groups)) {
		group := groups[key]
		ms := map[int]bool{}
		sizes := map[int64]bool{}
		for _, r := range group {
			ms[r.Machines] = true
			sizes[r.Bytes] = true
		}
		if len(ms) < 2 {
			continue
		}
		p := newPlot(fmt.Sprintf("fairgo speedup, D=%d %s%s", group[0].Devices, group[0].DType, notesOf(group[0])),
			"machines M", "time(other) / time(fairgo)")
		var lines []any
		for _, v := range variantNames(group) {
			for _, size := range sortedKeys(sizes) {
				for _, other := range bench.Baselines {
					var pts plotter.XYs
					for _, m := range sortedKeys(ms) {
						f, okf := find(group, m, size, v)
						o, oko := find(group, m, size, other)
						if okf && oko && f.TimeUS > 0 {
							pts = append(pts, plotter.XY{X: float64(m), Y: o.TimeUS / f.TimeUS})
						}
					}
					if len(pts) > 0 {
						lines = append(lines, fmt.Sprintf("%s vs %s, %s", v, other, bench.FormatSize(size)), pts)
					}
				}
			}
		}
		if len(lines) == 0 {
			continue
		}
		if err := plotutil.AddLinePoints(p, lines...); err != nil {
			return fmt.Errorf("report: plot %s: %w", key, err)
		}
		if err := save(p, key); err != nil {
			return err
		}
	}
	return nil
}

// overlapPlots: the time of a round of buckets, one bar per method.
func overlapPlots(recs []bench.Record, save func(*plot.Plot, string) error) error {
	groups := groupBy(recs, func(r bench.Record) (string, bool) {
		key := fmt.Sprintf("overlap_%dx%d_%s_%dx%s%s",
			r.Machines, r.Devices, r.DType, r.Buckets, bench.FormatSize(r.Bytes), labelSuffix(r))
		return key, r.Kind == bench.KindOverlap
	})
	for _, key := range slices.Sorted(maps.Keys(groups)) {
		group := groups[key]
		r0 := group[0]
		p := newPlot(
			fmt.Sprintf(
				"%d buckets × %s, %d×%d %s%s",
				r0.Buckets,
				bench.FormatSize(r0.Bytes),
				r0.Machines,
				r0.Devices,
				r0.DType,
				notesOf(r0),
			),
			"",
			"time per round (ms)",
		)
		names := methodsOf(group)
		vals := make(plotter.Values, len(names))
		for i, m := range names {
			for _, r := range group {
				if r.Algorithm == m {
					vals[i] = r.TimeUS / 1e3
				}
			}
		}
		bars, err := plotter.NewBarChart(vals, vg.Points(20))
		if err != nil {
			return fmt.Errorf("report: plot %s: %w", key, err)
		}
		p.Add(bars)
		p.NominalX(names...)
		if err := save(p, key); err != nil {
			return err
		}
	}
	return nil
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	return p
}

// notesOf marks a plot's title.
func notesOf(r bench.Record) string {
	switch {
	case r.Invalid != "":
		return " (INVALID: GPUs time-sliced)"
	case r.SimTimings:
		return " (sim: not GPU timings)"
	case r.Testbed.NICGbit > 0:
		return fmt.Sprintf(" (testbed: %g Gbit/s NIC per machine)", r.Testbed.NICGbit)
	}
	return ""
}

func labelSuffix(r bench.Record) string {
	if r.Label == "" {
		return ""
	}
	clean := strings.Map(func(c rune) rune {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' {
			return c
		}
		return '_'
	}, r.Label)
	return "_" + clean
}

// groupBy splits the records that key accepts by key, keeping their order.
func groupBy(recs []bench.Record, key func(bench.Record) (string, bool)) map[string][]bench.Record {
	out := map[string][]bench.Record{}
	for _, r := range recs {
		if k, ok := key(r); ok {
			out[k] = append(out[k], r)
		}
	}
	return out
}

// methodsOf lists the methods of recs: the baselines measured (flat,
// flat-ring, flat-tree, naive), then the variants in the order they appear.
func methodsOf(recs []bench.Record) []string {
	var out []string
	for _, m := range bench.Baselines {
		if slices.ContainsFunc(recs, func(r bench.Record) bool { return r.Algorithm == m }) {
			out = append(out, m)
		}
	}
	return append(out, variantNames(recs)...)
}

// xys collects the points pick accepts, sorted by x.
func xys(recs []bench.Record, pick func(bench.Record) (x, y float64, ok bool)) plotter.XYs {
	var out plotter.XYs
	for _, r := range recs {
		if x, y, ok := pick(r); ok {
			out = append(out, plotter.XY{X: x, Y: y})
		}
	}
	slices.SortFunc(out, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
	return out
}

func find(recs []bench.Record, machines int, bytes int64, alg string) (bench.Record, bool) {
	for _, r := range recs {
		if r.Machines == machines && r.Bytes == bytes && r.Algorithm == alg {
			return r, true
		}
	}
	return bench.Record{}, false
}

func sortedKeys[K cmp.Ordered](m map[K]bool) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// sizeTicks labels the sizes measured, thinned to at most 8 ticks.
func sizeTicks(recs []bench.Record) plot.Ticker {
	seen := map[int64]bool{}
	for _, r := range recs {
		if r.Bytes > 0 {
			seen[r.Bytes] = true
		}
	}
	sizes := sortedKeys(seen)
	step := int(math.Ceil(float64(len(sizes)) / 8))
	var ticks plot.ConstantTicks
	for i, s := range sizes {
		label := ""
		if i%max(step, 1) == 0 {
			label = bench.FormatSize(s)
		}
		ticks = append(ticks, plot.Tick{Value: float64(s), Label: label})
	}
	return ticks
}
