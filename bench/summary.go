package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/fairgo/fairgo/bench/model"
)

// Summary prints a compact digest of records: per grid, type and size (or
// bucket round and parallelism) the busbw of every algorithm, fairgo's
// speedups and the wrong elements; and the fitted links.
func Summary(w io.Writer, recs []Record) error {
	type key struct {
		kind, label, dtype, op string
		m, d, buckets, par     int
		bytes                  int64
		sim                    bool
	}
	groups := map[key]map[string]Record{}
	var order []key
	for _, r := range recs {
		if r.Kind == KindLink {
			continue
		}
		k := key{r.Kind, r.Label, r.DType, r.Op, r.Machines, r.Devices, r.Buckets, r.Parallelism, r.Bytes, r.SimTimings}
		if k.kind == KindSweep {
			k.par = 0
		}
		if groups[k] == nil {
			groups[k] = map[string]Record{}
			order = append(order, k)
		}
		groups[k][r.Algorithm] = r
	}
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "kind\tgrid\ttype\tsize\tpar\tflat us\tnaive us\tfairgo us\tflat busbw\tnaive busbw\tfairgo busbw\tf/flat\tf/naive\twrong\tlabel\t")
	cell := func(g map[string]Record, alg string, f func(Record) string) string {
		if r, ok := g[alg]; ok {
			return f(r)
		}
		return "-"
	}
	us := func(r Record) string { return fmtTime(r.TimeUS) }
	bw := func(r Record) string { return fmtBW(r.BusBW) }
	ratio := func(g map[string]Record, other string) string {
		f, okf := g["fairgo"]
		o, oko := g[other]
		if !okf || !oko || f.TimeUS <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", o.TimeUS/f.TimeUS)
	}
	for _, k := range order {
		g := groups[k]
		size := FormatSize(k.bytes)
		par := "-"
		if k.kind == KindOverlap {
			size = fmt.Sprintf("%d×%s", k.buckets, size)
			par = fmt.Sprint(k.par)
		}
		wrong := int64(0)
		checked := false
		for _, r := range g {
			if r.Wrong >= 0 {
				wrong += r.Wrong
				checked = true
			}
		}
		ws := "-"
		if checked {
			ws = fmt.Sprint(wrong)
		}
		label := k.label
		if k.sim {
			label = strings.TrimSpace(label + " sim(not GPU timings)")
		}
		fmt.Fprintf(tw, "%s\t%d×%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", k.kind, k.m, k.d, k.dtype, size, par,
			cell(g, "flat", us), cell(g, "naive", us), cell(g, "fairgo", us), cell(g, "flat", bw), cell(g, "naive", bw), cell(g, "fairgo", bw),
			ratio(g, "flat"), ratio(g, "naive"), ws, label)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	links := map[string][]model.Point{}
	for _, r := range recs {
		if r.Kind == KindLink {
			links[r.Link] = append(links[r.Link], model.Point{Bytes: float64(r.Bytes), Seconds: r.TimeUS / 1e6})
		}
	}
	names := make([]string, 0, len(links))
	for l := range links {
		names = append(names, l)
	}
	slices.Sort(names)
	for _, l := range names {
		if fit, err := model.FitLink(links[l]); err == nil {
			fmt.Fprintf(w, "link %s: %v (%d sizes)\n", l, fit, len(links[l]))
		}
	}
	return nil
}
