package bench

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Plot writes every plot the records allow into dir, as PNG and SVG, and
// returns the files written:
//
//   - busbw_MxD_dtype: bus bandwidth against size, one line per algorithm
//     (sweep records of one grid and type);
//   - speedup_Dgpus_dtype: fairgo's speedup over flat and naive against
//     the machine count, one line per size (sweep records of one type over
//     several machine counts, as scale mode makes them);
//   - overlap_MxD_dtype: the time of a round of buckets against fairgo's
//     parallelism, one line per algorithm (overlap records).
//
// Sim records get "(sim: not GPU timings)" in their titles.
func Plot(dir string, recs []Record) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: plots: %w", err)
	}
	var files []string
	save := func(p *plot.Plot, name string) error {
		for _, ext := range []string{".png", ".svg"} {
			f := filepath.Join(dir, name+ext)
			if err := p.Save(16*vg.Centimeter, 10*vg.Centimeter, f); err != nil {
				return fmt.Errorf("bench: saving %s: %w", f, err)
			}
			files = append(files, f)
		}
		return nil
	}
	// busbw vs size
	for key, group := range groupBy(recs, func(r Record) (string, bool) {
		return fmt.Sprintf("busbw_%dx%d_%s%s", r.Machines, r.Devices, r.DType, labelSuffix(r)), r.Kind == KindSweep || r.Kind == KindLink
	}) {
		p := newPlot(fmt.Sprintf("allreduce busbw, %d×%d %s %s%s", group[0].Machines, group[0].Devices, group[0].DType, group[0].Op, simNote(group[0])),
			"size (bytes)", "busbw (GB/s)")
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = sizeTicks(group)
		var lines []any
		for _, alg := range algorithmsOf(group) {
			var xys plotter.XYs
			for _, r := range group {
				if r.Algorithm == alg && r.Bytes > 0 {
					xys = append(xys, plotter.XY{X: float64(r.Bytes), Y: r.BusBW})
				}
			}
			slices.SortFunc(xys, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
			lines = append(lines, alg, xys)
		}
		if err := plotutil.AddLinePoints(p, lines...); err != nil {
			return files, fmt.Errorf("bench: plot %s: %w", key, err)
		}
		if err := save(p, key); err != nil {
			return files, err
		}
	}
	// speedup vs machine count
	for key, group := range groupBy(recs, func(r Record) (string, bool) {
		return fmt.Sprintf("speedup_%dgpus_%s%s", r.Devices, r.DType, labelSuffix(r)), r.Kind == KindSweep
	}) {
		ms := map[int]bool{}
		for _, r := range group {
			ms[r.Machines] = true
		}
		if len(ms) < 2 {
			continue
		}
		p := newPlot(fmt.Sprintf("fairgo speedup, D=%d %s%s", group[0].Devices, group[0].DType, simNote(group[0])),
			"machines M", "time(other) / time(fairgo)")
		var lines []any
		sizes := map[int64]bool{}
		for _, r := range group {
			sizes[r.Bytes] = true
		}
		for _, size := range sortedKeys(sizes) {
			for _, other := range []string{"flat", "naive"} {
				var xys plotter.XYs
				for _, m := range sortedKeys(ms) {
					f, okf := find(group, m, size, "fairgo")
					o, oko := find(group, m, size, other)
					if okf && oko && f.TimeUS > 0 {
						xys = append(xys, plotter.XY{X: float64(m), Y: o.TimeUS / f.TimeUS})
					}
				}
				if len(xys) > 0 {
					lines = append(lines, fmt.Sprintf("vs %s, %s", other, FormatSize(size)), xys)
				}
			}
		}
		if len(lines) == 0 {
			continue
		}
		if err := plotutil.AddLinePoints(p, lines...); err != nil {
			return files, fmt.Errorf("bench: plot %s: %w", key, err)
		}
		if err := save(p, key); err != nil {
			return files, err
		}
	}
	// time vs parallelism
	for key, group := range groupBy(recs, func(r Record) (string, bool) {
		return fmt.Sprintf("overlap_%dx%d_%s_%dx%s%s", r.Machines, r.Devices, r.DType, r.Buckets, FormatSize(r.Bytes), labelSuffix(r)), r.Kind == KindOverlap
	}) {
		r0 := group[0]
		p := newPlot(fmt.Sprintf("%d buckets × %s, %d×%d %s%s", r0.Buckets, FormatSize(r0.Bytes), r0.Machines, r0.Devices, r0.DType, simNote(r0)),
			"fairgo parallelism", "time per round (ms)")
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		var lines []any
		for _, alg := range algorithmsOf(group) {
			var xys plotter.XYs
			for _, r := range group {
				if r.Algorithm == alg {
					xys = append(xys, plotter.XY{X: float64(r.Parallelism), Y: r.TimeUS / 1e3})
				}
			}
			slices.SortFunc(xys, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
			lines = append(lines, alg, xys)
		}
		if err := plotutil.AddLinePoints(p, lines...); err != nil {
			return files, fmt.Errorf("bench: plot %s: %w", key, err)
		}
		if err := save(p, key); err != nil {
			return files, err
		}
	}
	slices.Sort(files)
	return files, nil
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

func simNote(r Record) string {
	if r.SimTimings {
		return " (sim: not GPU timings)"
	}
	return ""
}

func labelSuffix(r Record) string {
	if r.Label == "" {
		return ""
	}
	clean := strings.Map(func(c rune) rune {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' {
			return c
		}
		return '_'
	}, r.Label)
	return "_" + clean
}

// groupBy splits the records that key accepts by key, keeping their order.
func groupBy(recs []Record, key func(Record) (string, bool)) map[string][]Record {
	out := map[string][]Record{}
	for _, r := range recs {
		if k, ok := key(r); ok {
			out[k] = append(out[k], r)
		}
	}
	return out
}

func algorithmsOf(recs []Record) []string {
	var out []string
	for _, a := range Algorithms {
		for _, r := range recs {
			if r.Algorithm == a.String() {
				out = append(out, a.String())
				break
			}
		}
	}
	return out
}

func find(recs []Record, machines int, bytes int64, alg string) (Record, bool) {
	for _, r := range recs {
		if r.Machines == machines && r.Bytes == bytes && r.Algorithm == alg {
			return r, true
		}
	}
	return Record{}, false
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
func sizeTicks(recs []Record) plot.Ticker {
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
			label = FormatSize(s)
		}
		ticks = append(ticks, plot.Tick{Value: float64(s), Label: label})
	}
	return ticks
}
