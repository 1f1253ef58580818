package report

import (
	"cmp"
	"fmt"
	"image/color"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/fairgo/fairgo/bench"
	"github.com/fairgo/fairgo/bench/model"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/harness"
)

// The real cluster the nodes report extrapolates to: 64 machines of 8 GPUs,
// NVLink at 450 GB/s each way between the GPUs of a machine, one 400 Gbit/s
// NIC (50 GB/s each way) per GPU, 3 µs a hop on NVLink and 5 µs a hop
// between machines (NCCL's step on each link, as α; β = 1/B). These are a
// cluster's nominal figures, not measured here.
var (
	RealGrid  = model.Grid{M: 64, D: 8}
	RealLinks = model.Params{
		Intra:     model.Link{Alpha: 3e-6, BW: 450e9},
		Net:       model.Link{Alpha: 5e-6, BW: 400e9 / 8},
		PeerAlpha: -1,
	}
)

// DefaultNodesGbit is the NIC rate of the node-count sweeps (scripts/gpu.sh
// nodes).
const DefaultNodesGbit = 10

// NodesOptions steer NodeCurves.
type NodesOptions struct {
	Variant string // the fairgo variant compared; "" is bench.DefaultVariant
	// NICGbit is the testbed's NIC rate whose layouts are compared; 0 is
	// DefaultNodesGbit.
	NICGbit float64
	// Intra and Net replace the fitted links when their bandwidth is set.
	Intra, Net  model.Link
	Parallelism int  // fairgo's in the predictions; 0: hier's default
	IncludeSim  bool // use sim records too (their times are not GPU times)
	// Real and RealGrid are the cluster predicted at real link speeds;
	// zero: RealLinks and RealGrid.
	Real     model.Params
	RealGrid model.Grid
}

func (o NodesOptions) defaults() NodesOptions {
	if o.Variant == "" {
		o.Variant = bench.DefaultVariant
	}
	if o.NICGbit == 0 {
		o.NICGbit = DefaultNodesGbit
	}
	if o.Parallelism == 0 {
		o.Parallelism = hier.DefaultParallelism
	}
	if o.Real.Intra.BW == 0 {
		o.Real = RealLinks
	}
	if o.RealGrid.M == 0 {
		o.RealGrid = RealGrid
	}
	return o
}

// Curve is one curve of the nodes plot: fairgo's time against the best
// baseline's, by size, for one layout, measured or as the model predicts.
type Curve struct {
	Name   string
	Grid   model.Grid
	Model  bool // the model's prediction; else measured
	Real   bool // the model's prediction at real link speeds (NodesOptions.Real)
	Points []CurvePoint
}

// CurvePoint is one size of a Curve.
type CurvePoint struct {
	Bytes int64
	// Ratio is time(best)/time(fairgo): above 1 fairgo is faster.
	Ratio float64
	// Best names the fastest baseline: a method measured (flat,
	// flat-ring, flat-tree, naive), or the model's ring, tree or naive.
	Best string
	// Route is fairgo's: what the record says it chose, or the model's
	// pick.
	Route            string
	FairgoUS, BestUS float64
}

// NodeCurves computes the nodes report's curves: for every layout measured
// on the testbed at o.NICGbit (sweeps of one call at a time, the first run
// among them; ranks sharing GPUs under MPS count as machines of their
// own), fairgo/best as measured and as the model fitted to those records
// predicts it, and the model's prediction for o.RealGrid at o.Real's
// links. Best is the fastest baseline at each point (bench.Baselines), in
// the model the fastest of NCCL's ring, its tree and the hand-built
// hierarchy. The model predicts fairgo on the route the record says it
// took (its size class's choice), else, and on the real cluster, on the
// route the model finds fastest (flat, or either rail form at its best
// slice; flat where hier has nothing to choose: one machine, or one GPU
// per machine). The notes say where the model's links came from; a model
// that cannot be fitted leaves the layouts without predictions and says
// why, and the real cluster's curve is drawn all the same.
func NodeCurves(recs []bench.Record, o NodesOptions) ([]Curve, []string, error) {
	o = o.defaults()
	usable := ModelOptions{IncludeSim: o.IncludeSim}.usable
	onTestbed := func(r bench.Record) bool {
		return r.Kind == bench.KindSweep && r.Iters == 1 && usable(r) && r.Testbed.NICGbit == o.NICGbit &&
			(r.Devices == 1 || r.Testbed.Intra != harness.IntraLoopback)
	}
	var run string
	var found bool
	for _, r := range recs {
		if onTestbed(r) {
			run, found = r.Run, true
			break
		}
	}
	var notes []string
	var fit []bench.Record
	for _, r := range recs {
		if r.Kind == bench.KindLink || r.Run == run && (r.Testbed.NICGbit == 0 || r.Testbed.NICGbit == o.NICGbit) {
			fit = append(fit, r)
		}
	}
	p, fitNotes, err := FitModel(fit, ModelOptions{Intra: o.Intra, Net: o.Net, IncludeSim: o.IncludeSim})
	notes = append(notes, fitNotes...)
	fitted := err == nil
	if !fitted {
		notes = append(notes, "no model of the testbed: "+strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	var curves []Curve
	var sizes []int64
	if found {
		order, ps := points(recs, func(r bench.Record) bool { return onTestbed(r) && r.Run == run })
		grids := map[model.Grid][]pointKey{}
		for _, k := range order {
			g := model.Grid{M: k.m, D: k.d}
			grids[g] = append(grids[g], k)
		}
		for _, g := range slices.SortedFunc(maps.Keys(grids), compareGrids) {
			measured := Curve{Name: g.String() + " measured", Grid: g}
			predicted := Curve{Name: g.String() + " model", Grid: g, Model: true}
			for _, k := range grids[g] {
				pt := ps[k]
				if x := pt.vsBest(o.Variant); !math.IsNaN(x) {
					best, bt := pt.best()
					cp := CurvePoint{Bytes: k.bytes, Ratio: x, Best: best, FairgoUS: pt.time(o.Variant), BestUS: bt}
					if f := pt[o.Variant].Fairgo; f != nil {
						cp.Route = cmp.Or(f.Route, f.Chosen)
					}
					measured.Points = append(measured.Points, cp)
					if !slices.Contains(sizes, k.bytes) {
						sizes = append(sizes, k.bytes)
					}
				}
				if fitted {
					var route *bench.Record
					if r, ok := pt[o.Variant]; ok && r.Fairgo != nil {
						route = &r
					}
					predicted.Points = append(predicted.Points, predictPoint(p, g, k.bytes, route, o))
				}
			}
			for _, c := range []*Curve{&measured, &predicted} {
				slices.SortFunc(c.Points, func(a, b CurvePoint) int { return cmp.Compare(a.Bytes, b.Bytes) })
				if len(c.Points) > 0 {
					curves = append(curves, *c)
				}
			}
		}
		notes = append(notes, fmt.Sprintf("measured: run %q, %g Gbit/s NICs, one call at a time", run, o.NICGbit))
	} else {
		notes = append(notes, fmt.Sprintf("no sweep of one call at a time on the testbed at %g Gbit/s", o.NICGbit))
	}
	if len(sizes) == 0 {
		for s := int64(64 << 10); s <= 64<<20; s *= 4 {
			sizes = append(sizes, s)
		}
	}
	slices.Sort(sizes)
	real := Curve{Name: fmt.Sprintf("%v model, real links", o.RealGrid), Grid: o.RealGrid, Model: true, Real: true}
	for _, s := range sizes {
		real.Points = append(real.Points, predictPoint(o.Real, o.RealGrid, s, nil, o))
	}
	curves = append(curves, real)
	notes = append(notes, fmt.Sprintf(
		"%v at real links: NVLink α %.1f µs, B %.0f GB/s; one NIC per GPU, α %.1f µs, B %.0f GB/s (%.0f Gbit/s)",
		o.RealGrid, o.Real.Intra.Alpha*1e6, o.Real.Intra.BW/1e9, o.Real.Net.Alpha*1e6, o.Real.Net.BW/1e9,
		o.Real.Net.BW*8/1e9))
	return curves, notes, nil
}

// predictPoint is the model's fairgo/best of n bytes on g: fairgo on the
// route of its record when there is one the model knows, else on the
// fastest the model finds.
func predictPoint(p model.Params, g model.Grid, n int64, fairgo *bench.Record, o NodesOptions) CurvePoint {
	x := float64(n)
	best, name := p.Ring(g, x), "ring"
	if t := p.Tree(g, x); t < best {
		best, name = t, "tree"
	}
	if t := p.Naive(g, x); t < best {
		best, name = t, "naive"
	}
	f, route := math.NaN(), ""
	if fairgo != nil {
		ms := Measurements([]bench.Record{*fairgo}, ModelOptions{IncludeSim: true})
		if len(ms) == 1 {
			if t, err := p.Predict(ms[0]); err == nil {
				f, route = t, cmp.Or(ms[0].Chosen, hier.RailAllToAll.String())
			}
		}
	}
	if math.IsNaN(f) {
		f, route = p.Flat(g, x), hier.Flat.String()
		if g.M > 1 && g.D > 1 {
			for _, rail := range []hier.Algorithm{hier.RailAllToAll, hier.RailRSAG} {
				if _, t := p.BestSlice(g, x, rail, o.Parallelism); t < f {
					f, route = t, rail.String()
				}
			}
		}
	}
	return CurvePoint{Bytes: n, Ratio: best / f, Best: name, Route: route, FairgoUS: f * 1e6, BestUS: best * 1e6}
}

// compareGrids orders layouts by world size, then machines.
func compareGrids(a, b model.Grid) int {
	return cmp.Or(cmp.Compare(a.World(), b.World()), cmp.Compare(a.M, b.M))
}

// NodesReport prints the curves as a table: per layout and size, fairgo's
// time and the best baseline's, measured and predicted.
func NodesReport(w io.Writer, curves []Curve, notes []string) error {
	fmt.Fprintln(w, "# fairbench nodes: fairgo/best = time(best baseline)/time(fairgo) against size, per layout; "+
		"above 1 fairgo is faster")
	for _, n := range notes {
		fmt.Fprintln(w, "#   "+n)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "curve\tsize\tfairgo(us)\troute\tbest\tbest(us)\tfairgo/best\t")
	for _, c := range curves {
		for _, pt := range c.Points {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", c.Name, bench.FormatSize(pt.Bytes),
				fmtTime(pt.FairgoUS), orNone(pt.Route), pt.Best, fmtTime(pt.BestUS), fmtRatio(pt.Ratio))
		}
	}
	return tw.Flush()
}

// NodesPlotName is the nodes plot's file name, without its extension.
const NodesPlotName = "nodes_fairgo_vs_best"

// NodesPlot draws the curves into dir as NodesPlotName.png and .svg, and
// returns the files: fairgo/best against size, each layout's measured
// curve solid with its points, the model's prediction for it dashed in the
// same colour, the real cluster's prediction thick and black beneath them,
// and 1 (a tie with the best) dotted. Where the model's fairgo is flat (one
// GPU per machine: hier has nothing to choose) its curve lies on 1.
func NodesPlot(dir string, curves []Curve, title string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("report: plots: %w", err)
	}
	p := newPlot(title, "size (bytes)", "time(best) / time(fairgo)")
	p.X.Scale = plot.LogScale{}
	var all []CurvePoint
	for _, c := range curves {
		all = append(all, c.Points...)
	}
	p.X.Tick.Marker = curveTicks(all)
	colour := map[model.Grid]int{}
	for _, c := range curves {
		if _, ok := colour[c.Grid]; !ok {
			colour[c.Grid] = len(colour)
		}
	}
	lo, hi := math.Inf(1), math.Inf(-1)   // sizes
	ylo, yhi := math.Inf(1), math.Inf(-1) // ratios
	var under, over []plot.Plotter        // the real cluster's curve goes under the layouts'
	for _, c := range curves {
		var xys plotter.XYs
		for _, pt := range c.Points {
			if !math.IsNaN(pt.Ratio) && !math.IsInf(pt.Ratio, 0) {
				xys = append(xys, plotter.XY{X: float64(pt.Bytes), Y: pt.Ratio})
				lo, hi = min(lo, float64(pt.Bytes)), max(hi, float64(pt.Bytes))
				ylo, yhi = min(ylo, pt.Ratio), max(yhi, pt.Ratio)
			}
		}
		if len(xys) == 0 {
			continue
		}
		line, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, fmt.Errorf("report: nodes plot, %s: %w", c.Name, err)
		}
		i := colour[c.Grid]
		line.Color, pts.Color, pts.Shape = plotutil.Color(i), plotutil.Color(i), plotutil.Shape(i)
		line.Width = vg.Points(1.2)
		switch {
		case c.Real:
			line.Color, line.Width, line.Dashes = color.Black, vg.Points(2.5), []vg.Length{vg.Points(6), vg.Points(3)}
			under = append(under, line)
			p.Legend.Add(c.Name, line)
		case c.Model:
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			over = append(over, line)
			p.Legend.Add(c.Name, line)
		default:
			over = append(over, line, pts)
			p.Legend.Add(c.Name, line, pts)
		}
	}
	if lo <= hi {
		one, err := plotter.NewLine(plotter.XYs{{X: lo, Y: 1}, {X: hi, Y: 1}})
		if err != nil {
			return nil, fmt.Errorf("report: nodes plot: %w", err)
		}
		one.Color, one.Dashes = color.Gray{Y: 128}, []vg.Length{vg.Points(1), vg.Points(2)}
		under = append([]plot.Plotter{one}, under...)
	}
	p.Add(under...)
	p.Add(over...)
	p.Legend.Top, p.Legend.Left = true, false
	if ylo <= yhi {
		// The legend takes the top of the plot: the curves keep below it.
		ylo, yhi = min(ylo, 1), max(yhi, 1)
		span := max(yhi-ylo, 0.05)
		rows := float64(len(curves))
		p.Y.Min, p.Y.Max = ylo-0.05*span, yhi+span*rows/20
	}
	var files []string
	for _, ext := range []string{".png", ".svg"} {
		f := filepath.Join(dir, NodesPlotName+ext)
		if err := p.Save(20*vg.Centimeter, 16*vg.Centimeter, f); err != nil {
			return files, fmt.Errorf("report: saving %s: %w", f, err)
		}
		files = append(files, f)
	}
	return files, nil
}

// curveTicks labels the sizes of the points, thinned to at most 8 ticks.
func curveTicks(pts []CurvePoint) plot.Ticker {
	recs := make([]bench.Record, len(pts))
	for i, pt := range pts {
		recs[i].Bytes = pt.Bytes
	}
	return sizeTicks(recs)
}

// NodesTitle is the nodes plot's title for the testbed's NIC rate.
func NodesTitle(gbit float64) string {
	return fmt.Sprintf("fairgo / best across node counts (testbed: %g Gbit/s NIC per machine)", gbit)
}
