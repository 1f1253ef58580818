package report

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/fairgo/fairgo/bench"
	"github.com/fairgo/fairgo/bench/model"
	"github.com/fairgo/fairgo/internal/harness"
)

// pointKey identifies the records of one point across methods.
type pointKey struct {
	kind, run, label, dtype, op string
	m, d, buckets, iters        int
	bytes                       int64
}

func keyOf(r bench.Record) pointKey {
	return pointKey{r.Kind, r.Run, r.Label, r.DType, r.Op, r.Machines, r.Devices, r.Buckets, r.Iters, r.Bytes}
}

// points groups records into points, in the order they first appear.
func points(recs []bench.Record, keep func(bench.Record) bool) ([]pointKey, map[pointKey]point) {
	var order []pointKey
	ps := map[pointKey]point{}
	for _, r := range recs {
		if keep != nil && !keep(r) {
			continue
		}
		k := keyOf(r)
		if ps[k] == nil {
			ps[k] = point{}
			order = append(order, k)
		}
		ps[k][r.Algorithm] = r
	}
	return order, ps
}

// variantNames lists the fairgo variants of recs in the order they appear.
func variantNames(recs []bench.Record) []string {
	var out []string
	for _, r := range recs {
		if r.Fairgo != nil && !slices.Contains(out, r.Algorithm) {
			out = append(out, r.Algorithm)
		}
	}
	return out
}

// Summary prints a compact digest of records: first one line per testbed
// whose intra-machine link is told (emulated, and whether flat NCCL knew the
// machines), then per point the time and busbw of every method, the ideal
// busbw and every variant's ratios, the wrong elements and what marks the
// point (run, label, sim, invalid, intra-machine link); then the links
// fitted to link records.
func Summary(w io.Writer, recs []bench.Record) error {
	s := summary{variants: variantNames(recs), methods: methodsOf(recs)}
	order, ps := points(recs, func(r bench.Record) bool { return r.Kind != bench.KindLink })
	printIntraLines(w, order, ps)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(s.head(), "\t")+"\t")
	for _, k := range order {
		fmt.Fprintln(tw, strings.Join(s.row(k, ps[k]), "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := printHostTimes(w, order, ps, s.methods); err != nil {
		return err
	}
	printLinkFits(w, recs)
	return nil
}

// printHostTimes prints, for the points whose records say where the host
// time went, a row per method: its device time, enqueue, settle (mean and
// 99th percentile) and the ranks' start and seen skews (mean / 90th
// percentile), in µs a call; nothing when no record says.
func printHostTimes(w io.Writer, order []pointKey, ps map[pointKey]point, methods []string) error {
	var rows [][]string
	for _, k := range order {
		for _, m := range methods {
			r, ok := ps[k][m]
			if !ok || r.HostUS == nil {
				continue
			}
			h := r.HostUS
			skew := func(mean, p90 float64) string {
				if mean == 0 && p90 == 0 {
					return "-"
				}
				return fmt.Sprintf("%.0f/%.0f", mean, p90)
			}
			rows = append(rows, []string{
				fmt.Sprintf("%d×%d", k.m, k.d), bench.FormatSize(k.bytes), fmt.Sprint(k.iters), m,
				fmtTime(r.TimeUS), fmtTime(h.Enqueue), fmtTime(h.Settle), fmtTime(h.SettleP99),
				skew(h.StartSkew, h.StartSkewP90), skew(h.SeenSkew, h.SeenSkewP90),
			})
		}
	}
	if len(rows) == 0 {
		return nil
	}
	fmt.Fprintln(w, "# host time a call, µs: enqueue, settle (after the device end, until the caller saw it; mean and 99th "+
		"percentile), the ranks' start and seen skews (mean/90th percentile)")
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "grid\tsize\titers\tmethod\ttime\tenqueue\tsettle\tsettle p99\tstart skew\tseen skew\t")
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	return tw.Flush()
}

// summary is the table of Summary: its methods and fairgo variants.
type summary struct {
	variants, methods []string
}

// printIntraLines prints one line per testbed whose intra-machine link is
// told, in the order of the points.
func printIntraLines(w io.Writer, order []pointKey, ps map[pointKey]point) {
	var lines []string
	for _, k := range order {
		for _, r := range ps[k] {
			if l := r.Testbed.IntraLine(); l != "" && !slices.Contains(lines, l) {
				lines = append(lines, l)
			}
		}
	}
	for _, l := range lines {
		fmt.Fprintf(w, "# %s\n", l)
	}
}

// head is the table's header: the point, every method's time and busbw,
// the ideal, every variant's ratios, the wrong elements and the notes.
func (s summary) head() []string {
	head := []string{"kind", "grid", "type", "size", "iters"}
	for _, m := range s.methods {
		head = append(head, m+" us")
	}
	for _, m := range s.methods {
		head = append(head, m+" busbw")
	}
	head = append(head, "ideal")
	for _, v := range s.variants {
		head = append(head, v+"/flat", v+"/best", v+"/ideal")
	}
	return append(head, "wrong", "notes")
}

// row is the table's row of point p at k, in head's columns.
func (s summary) row(k pointKey, p point) []string {
	size := bench.FormatSize(k.bytes)
	if k.kind == bench.KindOverlap {
		size = fmt.Sprintf("%d×%s", k.buckets, size)
	}
	row := []string{k.kind, fmt.Sprintf("%d×%d", k.m, k.d), k.dtype, size, fmt.Sprint(k.iters)}
	for _, m := range s.methods {
		row = append(row, fmtTime(p.time(m)))
	}
	var any bench.Record
	wrong, checked := int64(0), false
	for _, m := range s.methods {
		r, ok := p[m]
		if !ok {
			row = append(row, "-")
			continue
		}
		any = r
		row = append(row, fmtBW(r.BusBW))
		if r.Wrong >= 0 {
			wrong += r.Wrong
			checked = true
		}
	}
	row = append(row, fmtIdeal(any.IdealBusBW))
	for _, v := range s.variants {
		row = append(row, fmtRatio(p.vsFlat(v)), fmtRatio(p.vsBest(v)), fmtRatio(p.vsIdeal(v)))
	}
	ws := "-"
	if checked {
		ws = fmt.Sprint(wrong)
	}
	return append(row, ws, notes(any))
}

// printLinkFits prints the link fitted to each link's records, by link
// name; a link whose fit fails is left out.
func printLinkFits(w io.Writer, recs []bench.Record) {
	links := map[string][]model.Point{}
	for _, r := range recs {
		if r.Kind == bench.KindLink {
			links[r.Link] = append(links[r.Link], model.Point{Bytes: float64(r.Bytes), Seconds: r.TimeUS / 1e6})
		}
	}
	for _, l := range slices.Sorted(maps.Keys(links)) {
		if fit, err := model.FitLink(links[l]); err == nil {
			fmt.Fprintf(w, "link %s: %v (%d sizes)\n", l, fit, len(links[l]))
		}
	}
}

// notes marks a point: its run and label, sim timings, an invalid testbed.
func notes(r bench.Record) string {
	var parts []string
	if r.Run != "" {
		parts = append(parts, "run="+r.Run)
	}
	if r.Label != "" {
		parts = append(parts, r.Label)
	}
	if r.Testbed.NICGbit > 0 {
		parts = append(parts, fmt.Sprintf("nic=%gGbit", r.Testbed.NICGbit))
	}
	if r.Testbed.Intra == harness.IntraLoopback {
		intra := "intra=loopback"
		if r.Testbed.NVLinkGbit > 0 {
			intra += fmt.Sprintf("@%gGbit", r.Testbed.NVLinkGbit)
		}
		parts = append(parts, intra)
	}
	if r.Testbed.FlatTopologyUnaware {
		parts = append(parts, "flat-unaware")
	}
	if r.SimTimings {
		parts = append(parts, "sim(not GPU timings)")
	}
	if r.Invalid != "" {
		parts = append(parts, "INVALID")
	}
	return orNone(strings.Join(parts, " "))
}

func fmtIdeal(bw float64) string {
	if bw <= 0 {
		return "-"
	}
	return fmtBW(bw)
}

// Scale prints every fairgo variant's speedup per machine count and size:
// the digest of fairbench scale.
func Scale(w io.Writer, recs []bench.Record) error {
	variants := variantNames(recs)
	order, ps := points(recs, func(r bench.Record) bool { return r.Kind == bench.KindSweep })
	fmt.Fprintf(w, "#\n# scale summary: median time per call (us); v/x = time(x)/time(v)\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{"machines", "size", "type", "flat", "naive"}
	head = append(head, variants...)
	for _, v := range variants {
		head = append(head, v+"/flat", v+"/naive")
	}
	fmt.Fprintln(tw, "# "+strings.Join(head, "\t")+"\t")
	for _, k := range order {
		p := ps[k]
		row := []string{
			fmt.Sprint(k.m),
			bench.FormatSize(k.bytes),
			k.dtype,
			fmtTime(p.time(bench.Flat)),
			fmtTime(p.time(bench.Naive)),
		}
		for _, v := range variants {
			row = append(row, fmtTime(p.time(v)))
		}
		for _, v := range variants {
			row = append(row, fmtRatio(p.vsFlat(v)), fmtRatio(p.ratio(v, p.time(bench.Naive))))
		}
		fmt.Fprintln(tw, "  "+strings.Join(row, "\t")+"\t")
	}
	return tw.Flush()
}
