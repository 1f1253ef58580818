package report

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/bench"
	"github.com/fairgo/fairgo/bench/model"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/harness"
)

// nodesLayouts are the layouts of scripts/gpu.sh nodes.
var nodesLayouts = []model.Grid{{M: 2, D: 1}, {M: 4, D: 1}, {M: 8, D: 1}, {M: 16, D: 1}, {M: 2, D: 2}}

// nodesRun makes the records of the nodes sweeps as truth times them, at
// 10 Gbit/s, 64K–64M, with the NVLink pair's 1 × 2 flat sweep in one
// process: flat is NCCL's best of ring and tree, flat-ring the ring, naive
// flat-tree the tree, the hierarchy, fairgo flat on M × 1 and rail-rsag (16 MiB slices) on
// 2 × 2. adjust may change a method's time (µs) at a point.
func nodesRun(
	run string,
	layouts []model.Grid,
	adjust func(g model.Grid, alg string, bytes int64, us float64) float64,
) []bench.Record {
	var recs []bench.Record
	for s := int64(64 << 10); s <= 64<<20; s *= 4 {
		g := model.Grid{M: 1, D: 2}
		recs = append(recs, bench.Record{Kind: bench.KindSweep, Run: run, Backend: "cuda", Machines: 1, Devices: 2,
			Processes: 1, DType: "float32", Op: "sum", Algorithm: bench.Flat, Bytes: s, Iters: 1,
			TimeUS: inProcess.Flat(g, float64(s)) * 1e6})
	}
	for _, g := range layouts {
		tb := bench.Setup{Emulation: harness.Emulation{Machines: g.M, NICGbit: 10, MPS: true, NetNS: true,
			Intra: harness.IntraNVLink}, Placement: harness.Placement{RanksPerGPU: max(g.World()/4, 1)}}
		for s := int64(64 << 10); s <= 64<<20; s *= 4 {
			n := float64(s)
			fo := &bench.FairgoSetup{Algorithm: "auto", Chosen: hier.Flat.String(), Parallelism: 4,
				SliceBytes: 16 << 20, FlatThreshold: 0}
			fairgo := truth.Flat(g, n)
			if g.D > 1 {
				fo.Chosen = hier.RailRSAG.String()
				fairgo = truth.FairgoTime(g, n, 1,
					model.Fairgo{Rail: hier.RailRSAG, Slice: 16 << 20, Parallelism: 4, FlatThreshold: -1})
			}
			for alg, t := range map[string]float64{bench.Flat: truth.Flat(g, n), bench.FlatRing: truth.Ring(g, n),
				bench.FlatTree: truth.Tree(g, n), bench.Naive: truth.Naive(g, n), bench.DefaultVariant: fairgo} {
				us := t * 1e6
				if adjust != nil {
					us = adjust(g, alg, s, us)
				}
				r := bench.Record{Kind: bench.KindSweep, Run: run, Backend: "cuda", Machines: g.M, Devices: g.D,
					Processes: g.World(), Testbed: tb, DType: "float32", Op: "sum", Algorithm: alg, Bytes: s,
					Iters: 1, Reps: 3, TimeUS: us}
				if alg == bench.DefaultVariant {
					r.Fairgo = fo
				}
				recs = append(recs, r)
			}
		}
	}
	return recs
}

func curveNames(cs []Curve) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// Every layout has its measured curve and the model's beside it, and the
// real cluster its prediction; the model fitted to the run predicts the
// run's own ratios.
func TestNodeCurves(t *testing.T) {
	// A second run, slower, that the curves do not take.
	recs := append(nodesRun("r1", nodesLayouts, nil), nodesRun("r2", nodesLayouts,
		func(_ model.Grid, alg string, _ int64, us float64) float64 {
			return us * map[bool]float64{true: 3, false: 1}[alg == bench.DefaultVariant]
		})...)
	curves, notes, err := NodeCurves(recs, NodesOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{"2×1 measured", "2×1 model", "2×2 measured", "2×2 model", "4×1 measured",
		"4×1 model", "8×1 measured", "8×1 model", "16×1 measured", "16×1 model", "64×8 model, real links"},
		curveNames(curves))
	require.Contains(t, strings.Join(notes, "\n"), `measured: run "r1", 10 Gbit/s NICs`)
	require.Contains(t, strings.Join(notes, "\n"), "64×8 at real links: NVLink α 3.0 µs, B 450 GB/s; "+
		"one NIC per GPU, α 5.0 µs, B 50 GB/s (400 Gbit/s)")
	for i := 0; i < len(curves)-1; i += 2 {
		measured, predicted := curves[i], curves[i+1]
		require.False(t, measured.Model)
		require.True(t, predicted.Model)
		require.False(t, predicted.Real)
		require.Len(t, measured.Points, 6, measured.Name)
		require.Len(t, predicted.Points, 6, predicted.Name)
		g := measured.Grid
		for j, pt := range measured.Points {
			n := float64(pt.Bytes)
			best := min(truth.Flat(g, n), truth.Ring(g, n), truth.Naive(g, n))
			require.InDelta(t, best*1e6, pt.BestUS, 1e-6, "%s %d", measured.Name, pt.Bytes)
			require.InDelta(t, best*1e6/pt.FairgoUS, pt.Ratio, 1e-12)
			require.InDelta(t, pt.Ratio, predicted.Points[j].Ratio, 1e-6*pt.Ratio,
				"%s %s: the model fitted to the run predicts it", predicted.Name, bench.FormatSize(pt.Bytes))
		}
	}
	for _, pt := range curves[3].Points {
		require.Equal(t, hier.RailRSAG.String(), pt.Route, "2×2 model: the route its record took")
	}
	real := curves[len(curves)-1]
	require.True(t, real.Model)
	require.True(t, real.Real)
	require.Equal(t, RealGrid, real.Grid)
	require.Len(t, real.Points, 6, "the sizes measured")
	for _, pt := range real.Points {
		g, n := RealGrid, float64(pt.Bytes)
		best := min(RealLinks.Ring(g, n), RealLinks.Tree(g, n), RealLinks.Naive(g, n))
		require.InDelta(t, best*1e6, pt.BestUS, 1e-6)
		require.Positive(t, pt.Ratio)
		require.False(t, math.IsInf(pt.Ratio, 0))
		require.Contains(t, []string{"ring", "tree", "naive"}, pt.Best)
		require.Contains(t, []string{"flat", "rail-a2a", "rail-rsag"}, pt.Route)
	}

	var buf bytes.Buffer
	require.NoError(t, NodesReport(&buf, curves, notes))
	require.Contains(t, buf.String(), "16×1 measured")
	require.Contains(t, buf.String(), "64×8 model, real links")

	dir := t.TempDir()
	files, err := NodesPlot(dir, curves, NodesTitle(10))
	require.NoError(t, err)
	require.Equal(t, []string{filepath.Join(dir, NodesPlotName+".png"), filepath.Join(dir, NodesPlotName+".svg")}, files)
	for _, f := range files {
		st, err := os.Stat(f)
		require.NoError(t, err)
		require.Positive(t, st.Size())
	}
	svg, err := os.ReadFile(files[1])
	require.NoError(t, err)
	for _, c := range curves {
		require.Contains(t, string(svg), c.Name, "the legend names every curve")
	}
}

// The ratio is against the fastest baseline at each point, whichever it
// is: the measured curve of 2 × 2 takes flat-ring at 1M, naive at 4M and
// flat-tree at 16M, where each is the fastest.
func TestNodeCurvesTakeTheFastestBaseline(t *testing.T) {
	recs := nodesRun("r1", []model.Grid{{M: 2, D: 2}}, func(_ model.Grid, alg string, s int64, us float64) float64 {
		switch {
		case s == 1<<20 && alg == bench.DefaultVariant:
			return 100
		case s == 1<<20 && alg == bench.FlatRing:
			return 50
		case s == 1<<20:
			return 400
		case s == 4<<20 && alg == bench.DefaultVariant:
			return 100
		case s == 4<<20 && alg == bench.Naive:
			return 80
		case s == 4<<20:
			return 400
		case s == 16<<20 && alg == bench.DefaultVariant:
			return 100
		case s == 16<<20 && alg == bench.FlatTree:
			return 70
		case s == 16<<20:
			return 400
		}
		return us
	})
	curves, _, err := NodeCurves(recs, NodesOptions{})
	require.NoError(t, err)
	pts := map[int64]CurvePoint{}
	for _, pt := range curves[0].Points {
		pts[pt.Bytes] = pt
	}
	require.Equal(t, bench.FlatRing, pts[1<<20].Best)
	require.InDelta(t, 0.5, pts[1<<20].Ratio, 1e-12)
	require.Equal(t, bench.Naive, pts[4<<20].Best)
	require.InDelta(t, 0.8, pts[4<<20].Ratio, 1e-12)
	require.Equal(t, bench.FlatTree, pts[16<<20].Best)
	require.InDelta(t, 0.7, pts[16<<20].Ratio, 1e-12)
}

// Without the NVLink pair the model of the testbed cannot be fitted: the
// measured curves and the real cluster's stay, and the notes say why;
// given the pair, the layouts' predictions come back.
func TestNodeCurvesWithoutAModel(t *testing.T) {
	var recs []bench.Record
	for _, r := range nodesRun("r1", nodesLayouts, nil) {
		if r.Testbed.NICGbit > 0 {
			recs = append(recs, r)
		}
	}
	curves, notes, err := NodeCurves(recs, NodesOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{"2×1 measured", "2×2 measured", "4×1 measured", "8×1 measured", "16×1 measured",
		"64×8 model, real links"}, curveNames(curves))
	require.Contains(t, strings.Join(notes, "\n"), "no model of the testbed: NVLink pair")
	curves, _, err = NodeCurves(recs, NodesOptions{Intra: truth.Intra})
	require.NoError(t, err)
	require.Len(t, curves, 11)

	// No testbed record at all: the real cluster alone, at 64K–64M.
	curves, notes, err = NodeCurves(nil, NodesOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{"64×8 model, real links"}, curveNames(curves))
	require.Len(t, curves[0].Points, 6)
	require.Contains(t, strings.Join(notes, "\n"), "no sweep of one call at a time on the testbed at 10 Gbit/s")
}
