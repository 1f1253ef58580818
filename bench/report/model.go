package report

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/fairgo/fairgo/bench"
	"github.com/fairgo/fairgo/bench/model"
	"github.com/fairgo/fairgo/hier"
)

// ModelOptions steer FitModel and ModelReport.
type ModelOptions struct {
	// Intra and Net replace the fitted links when their bandwidth is set.
	Intra, Net model.Link
	// The predictions: D GPUs per machine, machine counts, sizes, and
	// fairgo's parallelism (0: hier's default).
	Devices     int
	Machines    []int
	Sizes       []float64
	Parallelism int
	IncludeSim  bool // use sim records too (their times are not GPU times)
	// NICGbit keeps, of the records measured on fairrun's testbed, those
	// of this NIC rate (0: all, which must then share one rate).
	NICGbit float64
}

// usable reports whether a record may inform or test the model.
func (o ModelOptions) usable(r bench.Record) bool {
	return r.Invalid == "" && r.TimeUS > 0 && (o.IncludeSim || !r.SimTimings) &&
		(o.NICGbit <= 0 || r.Testbed.NICGbit <= 0 || r.Testbed.NICGbit == o.NICGbit)
}

// FitModel fits the model to records and says where each parameter came
// from. The NVLink pair comes from link records ("nvlink", from fairbench
// links) or else flat sweeps on 1 × 2; the network pair from link records
// ("net"), else flat sweeps on 2 × 1, else flat-ring sweeps on M × 1.
// When the network points come from fairrun's testbed (a NIC rate in the
// records) the machine's D GPUs share that one NIC. The all-to-all's
// per-peer cost is fitted to rail-a2a fairgo points on 3 machines or
// more, else α_n.
func FitModel(recs []bench.Record, o ModelOptions) (model.Params, []string, error) {
	rates := nicRates(recs, o)
	if len(rates) > 1 {
		return model.Params{}, nil, fmt.Errorf(
			"report: records of testbeds with NICs of %v Gbit/s: fit the model to one testbed's records",
			sortedKeys(rates),
		)
	}
	f := fitter{recs: recs, o: o}
	tb := model.Testbed{OneNICPerMachine: len(rates) == 1}
	var from [2]string
	tb.NVLink, from[0] = f.linkPoints("nvlink", 1, 2, false)
	tb.Net, from[1] = f.linkPoints("net", 2, 1, tb.OneNICPerMachine)
	intra, err1 := f.fitLink("NVLink pair", tb.NVLink, o.Intra, from[0])
	net, err2 := f.fitLink("network pair", tb.Net, o.Net, from[1])
	p := model.Params{Intra: intra, Net: net, PeerAlpha: -1}
	if err := errors.Join(err1, err2); err != nil {
		return p, f.notes, err
	}
	if tb.OneNICPerMachine {
		p.NetPerMachine = net.BW
		f.note(
			"one NIC per machine (fairrun --nic-gbit %g): a machine's D rails share %.3f GB/s",
			sortedKeys(rates)[0],
			net.BW/1e9,
		)
	}
	f.fitPeerAlpha(&p)
	return p, f.notes, p.Validate()
}

// nicRates are the NIC rates of the testbeds of the usable records.
func nicRates(recs []bench.Record, o ModelOptions) map[float64]bool {
	rates := map[float64]bool{}
	for _, r := range recs {
		if o.usable(r) && r.Testbed.NICGbit > 0 {
			rates[r.Testbed.NICGbit] = true
		}
	}
	return rates
}

// fitter fits the model's parameters to records, noting where each came
// from.
type fitter struct {
	recs  []bench.Record
	o     ModelOptions
	notes []string
}

// note adds a note, formatted as fmt.Sprintf.
func (f *fitter) note(format string, args ...any) {
	f.notes = append(f.notes, fmt.Sprintf(format, args...))
}

// linkPoints returns a link's points and where they came from: link
// records, else flat sweeps of one call at a time on m × d (on the testbed
// or off it, as testbed says), else, for a network pair (2 × 1) that was
// not swept, ringPairPoints.
func (f *fitter) linkPoints(link string, m, d int, testbed bool) ([]model.Point, string) {
	var links, flats []model.Point
	for _, r := range f.recs {
		if !f.o.usable(r) || r.Algorithm != bench.Flat || r.Buckets > 0 {
			continue
		}
		pt := model.Point{Bytes: float64(r.Bytes), Seconds: r.TimeUS / 1e6}
		switch {
		case r.Kind == bench.KindLink && r.Link == link:
			links = append(links, pt)
		case r.Kind == bench.KindSweep && r.Machines == m && r.Devices == d && r.Iters == 1 &&
			(r.Testbed.NICGbit > 0) == testbed:
			flats = append(flats, pt)
		}
	}
	switch {
	case len(links) > 0:
		return links, fmt.Sprintf("%d link records", len(links))
	case len(flats) == 0 && m == 2 && d == 1:
		if pts, src := f.ringPairPoints(testbed); len(pts) > 0 {
			return pts, src
		}
	}
	return flats, fmt.Sprintf("%d flat sweep points on %d×%d", len(flats), m, d)
}

// ringPairPoints are the network pair's points implied by the flat-ring
// sweeps (one call at a time) on the fewest machines of one GPU each, more
// than two: a ring over M ranks takes 2(M−1)(α + n/(M·B)), which is M−1
// times a pair's 2α + n'/B at n' = 2n/M, so each point (n, T) stands for
// the pair's (2n/M, T/(M−1)). A host of one GPU sweeps 8 × 1 and 16 × 1
// (every rank on it) and no pair.
func (f *fitter) ringPairPoints(testbed bool) ([]model.Point, string) {
	ring := func(r bench.Record) bool {
		return f.o.usable(r) && r.Kind == bench.KindSweep && r.Algorithm == bench.FlatRing && r.Buckets == 0 &&
			r.Iters == 1 && r.Devices == 1 && r.Machines > 2 && (r.Testbed.NICGbit > 0) == testbed
	}
	fewest := 0
	for _, r := range f.recs {
		if ring(r) && (fewest == 0 || r.Machines < fewest) {
			fewest = r.Machines
		}
	}
	var pts []model.Point
	for _, r := range f.recs {
		if ring(r) && r.Machines == fewest {
			m := float64(fewest)
			pts = append(pts, model.Point{Bytes: 2 * float64(r.Bytes) / m, Seconds: r.TimeUS / 1e6 / (m - 1)})
		}
	}
	return pts, fmt.Sprintf("%d flat-ring sweep points on %d×1, each as the pair its ring implies", len(pts), fewest)
}

// fitLink is the link given when its bandwidth is set, else the fit of
// T = 2α + n/B to pts (from src), noting its worst point.
func (f *fitter) fitLink(name string, pts []model.Point, given model.Link, src string) (model.Link, error) {
	if given.BW > 0 {
		f.note("%s: %v (given)", name, given)
		return given, nil
	}
	l, err := model.FitLink(pts)
	if err != nil {
		return l, fmt.Errorf("%s: %w (run fairbench links, or sweep flat on the pair)", name, err)
	}
	worst := 0.0
	for _, pt := range pts {
		worst = math.Max(worst, math.Abs(model.LinkTime(l, pt.Bytes)/pt.Seconds-1))
	}
	f.note("%s: %v (fit of T = 2α + n/B to %s; worst point off by %.0f%%)", name, l, src, worst*100)
	return l, nil
}

// fitPeerAlpha fits the all-to-all's per-peer cost to rail-a2a fairgo
// points on 3 machines or more; without them it stays α_n.
func (f *fitter) fitPeerAlpha(p *model.Params) {
	a, ok := p.FitPeerAlpha(Measurements(f.recs, f.o))
	if !ok {
		f.note(
			"all-to-all per-peer cost: %.2f µs = α_n (no %v fairgo points on ≥ 3 machines)",
			p.Net.Alpha*1e6,
			hier.RailAllToAll,
		)
		return
	}
	p.PeerAlpha = a
	f.note("all-to-all per-peer cost: %.2f µs (fit to %v fairgo points on ≥ 3 machines)", a*1e6, hier.RailAllToAll)
}

// Measurements converts the usable sweep and overlap records for the model.
func Measurements(recs []bench.Record, o ModelOptions) []model.Measurement {
	var out []model.Measurement
	for _, r := range recs {
		if (r.Kind != bench.KindSweep && r.Kind != bench.KindOverlap) || !o.usable(r) {
			continue
		}
		m := model.Measurement{
			Grid:      model.Grid{M: r.Machines, D: r.Devices},
			Algorithm: r.Algorithm,
			Bytes:     float64(r.Bytes),
			Buckets:   r.Buckets,
			Seconds:   r.TimeUS / 1e6,
			Label:     strings.TrimSpace(r.DType + " " + r.Label),
		}
		if f := r.Fairgo; f != nil {
			m.Algorithm, m.Chosen = "fairgo", f.Chosen
			m.Slice, m.Parallelism, m.FlatThreshold = float64(f.SliceBytes), f.Parallelism, float64(f.FlatThreshold)
			if f.FlatThreshold == hier.FlatNever {
				m.FlatThreshold = -1
			}
			m.Label = strings.TrimSpace(m.Label + " " + r.Algorithm)
		}
		out = append(out, m)
	}
	return out
}

// TestbedErrors are the model's errors at every usable point measured on
// fairrun's testbed (a NIC rate in the record).
func TestbedErrors(p model.Params, recs []bench.Record, o ModelOptions) []model.Error {
	var on []bench.Record
	for _, r := range recs {
		if r.Testbed.NICGbit > 0 {
			on = append(on, r)
		}
	}
	errs, _ := p.Evaluate(Measurements(on, o))
	return errs
}

// ModelReport fits the model to the records, prints its error against
// every measured sweep and overlap point (the testbed's marked), and its
// predictions for o.Machines × o.Devices with one NIC per GPU.
func ModelReport(w io.Writer, recs []bench.Record, o ModelOptions) error {
	p, notes, err := FitModel(recs, o)
	fmt.Fprintln(w, "# fairbench model: alpha-beta cost model (bench/model; its package doc has the formulas)")
	for _, n := range notes {
		fmt.Fprintln(w, "#   "+n)
	}
	if err != nil {
		return err
	}
	if err := printErrors(w, p, recs, o); err != nil {
		return err
	}
	return printPredictions(w, p, o)
}

func printErrors(w io.Writer, p model.Params, recs []bench.Record, o ModelOptions) error {
	errs, sums := p.Evaluate(Measurements(recs, o))
	testbedErrs := TestbedErrors(p, recs, o)
	fmt.Fprintf(
		w,
		"#\n# error against %d measured points: (predicted − measured)/measured; "+
			"T7 (≤ 15%%) counts the %d testbed points\n",
		len(errs),
		len(testbedErrs),
	)
	if len(errs) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "grid\tdata\talgorithm\tchosen\tsize\tbuckets\tmeasured(us)\tpredicted(us)\terror\t")
	for _, e := range errs {
		fmt.Fprintf(
			tw,
			"%v\t%s\t%s\t%s\t%s\t%d\t%.1f\t%.1f\t%+.1f%%\t\n",
			e.Grid,
			e.Label,
			e.Algorithm,
			orNone(e.Chosen),
			bench.FormatSize(int64(e.Bytes)),
			max(e.Buckets, 1),
			e.Seconds*1e6,
			e.Predicted*1e6,
			e.Rel*100,
		)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, k := range slices.Sorted(maps.Keys(sums)) {
		s := sums[k]
		fmt.Fprintf(
			w,
			"# %-7s n=%-3d median |error| %.1f%%, mean %.1f%%, max %.1f%% (%s)\n",
			k,
			s.N,
			s.MedianAbs*100,
			s.MeanAbs*100,
			s.MaxAbs*100,
			s.WorstLabel,
		)
	}
	if worst, ok := worstError(testbedErrs); ok {
		fmt.Fprintf(
			w,
			"# testbed points: worst |error| %.1f%% (%s %v %s)\n",
			math.Abs(worst.Rel)*100,
			worst.Algorithm,
			worst.Grid,
			bench.FormatSize(int64(worst.Bytes)),
		)
	}
	return nil
}

func worstError(errs []model.Error) (model.Error, bool) {
	if len(errs) == 0 {
		return model.Error{}, false
	}
	worst := slices.MaxFunc(errs, func(a, b model.Error) int { return cmp.Compare(math.Abs(a.Rel), math.Abs(b.Rel)) })
	return worst, true
}

func printPredictions(w io.Writer, fitted model.Params, o ModelOptions) error {
	par := o.Parallelism
	if par == 0 {
		par = hier.DefaultParallelism
	}
	p := fitted
	p.NetPerMachine = 0 // one NIC per GPU
	fmt.Fprintf(w, "#\n# predictions for M machines × D = %d GPUs, one NIC per GPU\n", o.Devices)
	fmt.Fprintf(
		w,
		"# assumed: every GPU has its own NIC with the fitted network pair's α_n %.1f µs and B_n %.3f GB/s "+
			"(so a machine has %d·B_n);\n",
		p.Net.Alpha*1e6,
		p.Net.BW/1e9,
		o.Devices,
	)
	fmt.Fprintf(
		w,
		"#   NVLink as the fitted pair (α_i %.2f µs, B_i %.1f GB/s); all-to-all per-peer cost %.2f µs; "+
			"a free add kernel;\n",
		p.Intra.Alpha*1e6,
		p.Intra.BW/1e9,
		peerAlpha(p)*1e6,
	)
	fmt.Fprintf(
		w,
		"#   ring: 2(W−1)·max(α_i + c/B_i, α_n + c/(D·B_n)), c = n/W; "+
			"tree: NCCL's double binary tree across machines,\n",
	)
	fmt.Fprintf(
		w,
		"#   2(⌈log2 M⌉α_n + (D−1)α_i) + max(f(M)·n/(D·B_n), 2(D−1)/D·n/B_i), "+
			"f(M) = max bytes a machine sends per byte (2 for M ≥ 4);\n",
	)
	fmt.Fprintf(
		w,
		"#   naive: intra RS + rail allreduce (ring or tree) + intra AG, one after another; fairgo: five stages per slice,\n",
	)
	fmt.Fprintf(w, "#   pipelined with parallelism %d, at its best slice (powers of 2 from 64K); busbw in GB/s\n", par)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(
		tw,
		"machines\tsize\tring(us)\ttree(us)\tnaive(us)\t%v(us)\tslice\t%v(us)\tslice\tflat busbw\t"+
			"naive busbw\tfairgo busbw\tfairgo/flat\t\n",
		hier.RailAllToAll,
		hier.RailRSAG,
	)
	for _, pr := range p.Table(o.Devices, o.Machines, o.Sizes, par) {
		world := pr.Grid.World()
		tree := "-"
		if !math.IsInf(pr.Tree, 0) {
			tree = fmt.Sprintf("%.1f", pr.Tree*1e6)
		}
		fmt.Fprintf(
			tw,
			"%d\t%s\t%.1f\t%s\t%.1f\t%.1f\t%s\t%.1f\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t\n",
			pr.Grid.M,
			bench.FormatSize(int64(pr.Bytes)),
			pr.Ring*1e6,
			tree,
			pr.Naive*1e6,
			pr.A2A*1e6,
			bench.FormatSize(int64(pr.A2ASlice)),
			pr.RSAG*1e6,
			bench.FormatSize(int64(pr.RSAGSlice)),
			model.BusBW(
				pr.Bytes,
				pr.Flat,
				world,
			)/1e9,
			model.BusBW(pr.Bytes, pr.Naive, world)/1e9,
			model.BusBW(pr.Bytes, pr.Fairgo(), world)/1e9,
			pr.Speedup,
		)
	}
	return tw.Flush()
}

func peerAlpha(p model.Params) float64 {
	if p.PeerAlpha < 0 {
		return p.Net.Alpha
	}
	return p.PeerAlpha
}
