package bench

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/fairgo/fairgo/bench/model"
)

// ModelOptions steer ModelReport.
type ModelOptions struct {
	// Intra and Net override the links fitted from link records when their
	// bandwidth is set.
	Intra, Net    model.Link
	NetPerMachine float64 // bytes/s cap of a machine's network; 0: none
	NetTotal      float64 // bytes/s cap of all machines' network together; 0: none
	KernelBW      float64 // bytes/s of the add kernel; 0: free
	// PeerAlpha is the all-to-all's per-peer cost in seconds; negative:
	// fitted from fairgo records on 3 machines or more, else Net.Alpha.
	PeerAlpha   float64
	Devices     int       // D of the predictions
	Machines    []int     // M of the predictions
	Sizes       []float64 // bytes of the predictions
	Parallelism int       // fairgo's parallelism in the predictions
	IncludeSim  bool      // use sim records too (their times are not GPU times)
}

// ModelParams fits the model's links to the link records (and the per-peer
// all-to-all cost to the fairgo records), with o's overrides, and describes
// where each parameter came from.
func ModelParams(recs []Record, o ModelOptions) (model.Params, []string, error) {
	var notes []string
	p := model.Params{Intra: o.Intra, Net: o.Net, NetPerMachine: o.NetPerMachine, NetTotal: o.NetTotal, KernelBW: o.KernelBW, PeerAlpha: o.PeerAlpha}
	fit := func(link string, dst *model.Link) error {
		if dst.BW > 0 {
			notes = append(notes, fmt.Sprintf("%s: %v (given)", link, *dst))
			return nil
		}
		var pts []model.Point
		var src []string
		for _, r := range recs {
			if r.Kind == KindLink && r.Link == link && r.Algorithm == Flat.String() && (o.IncludeSim || !r.SimTimings) {
				pts = append(pts, model.Point{Bytes: float64(r.Bytes), Seconds: r.TimeUS / 1e6})
				src = append(src, r.Backend)
			}
		}
		l, err := model.FitLink(pts)
		if err != nil {
			return fmt.Errorf("%s link: %w (run fairbench -mode links, or give the link's α and bandwidth)", link, err)
		}
		*dst = l
		var worst float64
		for _, pt := range pts {
			worst = math.Max(worst, math.Abs(model.LinkTime(l, pt.Bytes)/pt.Seconds-1))
		}
		notes = append(notes, fmt.Sprintf("%s: %v (fit of %d points from %s; worst point off by %.0f%%)", link, l, len(pts), strings.Join(uniq(src), ","), worst*100))
		return nil
	}
	if err := errors.Join(fit("nvlink", &p.Intra), fit("net", &p.Net)); err != nil {
		return p, notes, err
	}
	if p.PeerAlpha < 0 {
		if a, ok := p.FitPeerAlpha(measurements(recs, o.IncludeSim)); ok {
			p.PeerAlpha = a
			notes = append(notes, fmt.Sprintf("all-to-all per-peer cost: %.2f µs (fit to fairgo points on ≥ 3 machines)", a*1e6))
		} else {
			p.PeerAlpha = p.Net.Alpha
			notes = append(notes, fmt.Sprintf("all-to-all per-peer cost: %.2f µs = the network α (assumed: no fairgo points on ≥ 3 machines)", p.Net.Alpha*1e6))
		}
	} else {
		notes = append(notes, fmt.Sprintf("all-to-all per-peer cost: %.2f µs (given)", p.PeerAlpha*1e6))
	}
	if p.NetPerMachine > 0 {
		notes = append(notes, fmt.Sprintf("network cap per machine: %.2f GB/s (given)", p.NetPerMachine/1e9))
	}
	if p.NetTotal > 0 {
		notes = append(notes, fmt.Sprintf("network cap of all machines together: %.2f GB/s (given)", p.NetTotal/1e9))
	}
	return p, notes, p.Validate()
}

// measurements converts sweep and overlap records for the model.
func measurements(recs []Record, includeSim bool) []model.Measurement {
	var out []model.Measurement
	for _, r := range recs {
		if (r.Kind != KindSweep && r.Kind != KindOverlap) || (r.SimTimings && !includeSim) || r.TimeUS <= 0 {
			continue
		}
		out = append(out, model.Measurement{
			Grid: model.Grid{M: r.Machines, D: r.Devices}, Algorithm: r.Algorithm, Bytes: float64(r.Bytes), Buckets: r.Buckets,
			Seconds: r.TimeUS / 1e6, Slice: float64(r.SliceBytes), Parallelism: r.Parallelism, FlatThreshold: float64(r.FlatThresh),
			Label: fmt.Sprintf("%s %s", r.DType, r.Label),
		})
	}
	return out
}

// ModelReport fits the model to the records, prints its error against every
// measured sweep and overlap point, and its predictions at scale: time and
// busbw of flat (ring, tree), naive and fairgo (best slice) for every
// machine count and size, where fairgo starts to win, and the best slice
// size per machine count.
func ModelReport(w io.Writer, recs []Record, o ModelOptions) error {
	p, notes, err := ModelParams(recs, o)
	fmt.Fprintln(w, "# fairbench model: alpha-beta cost model (bench/model)")
	for _, n := range notes {
		fmt.Fprintln(w, "#   "+n)
	}
	if err != nil {
		return err
	}
	ms := measurements(recs, o.IncludeSim)
	errs, sums := p.Evaluate(ms)
	fmt.Fprintf(w, "#\n# error against %d measured points: (predicted − measured)/measured\n", len(errs))
	if len(errs) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "grid\tdata\talgorithm\tsize\tbuckets\tmeasured(us)\tpredicted(us)\terror\t")
		for _, e := range errs {
			fmt.Fprintf(tw, "%v\t%s\t%s\t%s\t%d\t%.1f\t%.1f\t%+.0f%%\t\n", e.Grid, strings.TrimSpace(e.Label), e.Algorithm,
				FormatSize(int64(e.Bytes)), max(e.Buckets, 1), e.Seconds*1e6, e.Predicted*1e6, e.Rel*100)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		keys := make([]string, 0, len(sums))
		for k := range sums {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			s := sums[k]
			fmt.Fprintf(w, "# %-7s n=%-3d median |error| %.0f%%, mean %.0f%%, max %.0f%% (%s)\n", k, s.N, s.MedianAbs*100, s.MeanAbs*100, s.MaxAbs*100, s.WorstLabel)
		}
	}
	par := o.Parallelism
	if par == 0 {
		par = 4
	}
	preds := p.Table(o.Devices, o.Machines, o.Sizes, par)
	fmt.Fprintf(w, "#\n# predictions for D = %d GPUs per machine (fairgo at its best slice, parallelism %d); busbw in GB/s\n", o.Devices, par)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "machines\tsize\tring(us)\ttree(us)\tnaive(us)\tfairgo(us)\tbest slice\tflat busbw\tfairgo busbw\tfairgo/flat\t")
	for _, pr := range preds {
		world := pr.Grid.World()
		tree := "-"
		if !math.IsInf(pr.Tree, 0) {
			tree = fmt.Sprintf("%.1f", pr.Tree*1e6)
		}
		fmt.Fprintf(tw, "%d\t%s\t%.1f\t%s\t%.1f\t%.1f\t%s\t%.1f\t%.1f\t%.2f\t\n", pr.Grid.M, FormatSize(int64(pr.Bytes)),
			pr.Ring*1e6, tree, pr.Naive*1e6, pr.Fairgo*1e6, FormatSize(int64(pr.BestSlice)),
			model.BusBW(pr.Bytes, pr.Flat, world)/1e9, model.BusBW(pr.Bytes, pr.Fairgo, world)/1e9, pr.Speedup)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "#\n# where fairgo wins (smallest size of 1K…4G, powers of 2, at which it beats the faster flat algorithm) and its best slice\n")
	var grid []float64
	for n := float64(1 << 10); n <= 1<<32; n *= 2 {
		grid = append(grid, n)
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "machines\tfairgo wins from\tstays ahead\tbest slice @256M\tbest slice @1G\tspeedup @1G\t")
	for _, m := range o.Machines {
		g := model.Grid{M: m, D: o.Devices}
		x, stays := p.Crossover(g, grid, par)
		from := "never"
		if x > 0 {
			from = FormatSize(int64(x))
		}
		s256, _ := p.BestSlice(g, 256<<20, par)
		s1g, t1g := p.BestSlice(g, 1<<30, par)
		sp := 0.0
		if t1g > 0 {
			sp = p.Flat(g, 1<<30) / t1g
		}
		fmt.Fprintf(tw, "%d\t%s\t%v\t%s\t%s\t%.2f\t\n", m, from, x > 0 && stays, FormatSize(int64(s256)), FormatSize(int64(s1g)), sp)
	}
	return tw.Flush()
}

func uniq(xs []string) []string {
	s := slices.Clone(xs)
	slices.Sort(s)
	return slices.Compact(s)
}
