package model

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
)

// H200-like links with one 10 Gbit/s NIC per machine, for shape tests only
// (not measurements).
var testParams = Params{
	Intra:         Link{Alpha: 5e-6, BW: 300e9},
	Net:           Link{Alpha: 50e-6, BW: 1.25e9},
	NetPerMachine: 1.25e9,
	PeerAlpha:     -1,
	KernelBW:      2e12,
}

func near(t *testing.T, what string, got, want, rel float64) {
	t.Helper()
	require.InDelta(t, want, got, rel*math.Abs(want), what)
}

func TestTreeLoad(t *testing.T) {
	for m, want := range map[int]float64{1: 0, 2: 1, 3: 1.5, 4: 2, 5: 2, 8: 2, 16: 2, 64: 2} {
		require.Equal(t, want, TreeLoad(m), "M=%d", m)
	}
}

func TestTwoRankRingIsTheFittedForm(t *testing.T) {
	p := testParams
	for _, n := range []float64{8, 1 << 20, 1 << 30} {
		near(t, "ring 1×2", p.Ring(Grid{1, 2}, n), LinkTime(p.Intra, n), 1e-12)
		near(t, "ring 2×1", p.Ring(Grid{2, 1}, n), LinkTime(p.Net, n), 1e-12)
		near(t, "flat 2×1", p.Flat(Grid{2, 1}, n), LinkTime(p.Net, n), 1e-12)
	}
}

func TestRingClosedForm(t *testing.T) {
	p := testParams
	// One machine of D GPUs: 2(D−1)(α + n/(D·B)).
	n := float64(64 << 20)
	near(t, "ring 1×8", p.Ring(Grid{1, 8}, n), 2*7*(p.Intra.Alpha+n/8/p.Intra.BW), 1e-12)
	// Large sizes: busbw tends to the link bandwidth.
	big := float64(1 << 40)
	near(t, "busbw 1×8", BusBW(big, p.Ring(Grid{1, 8}, big), 8), p.Intra.BW, 1e-3)
}

// TestNICBound: with one NIC per machine, large allreduces approach the
// NIC-bound ideal 2(M−1)/M·n/B for the hierarchies, and the flat ring pays
// 2(W−1)/W·n/B.
func TestNICBound(t *testing.T) {
	p := testParams
	n := float64(1 << 30)
	B := p.Net.BW
	for _, g := range []Grid{{2, 1}, {2, 2}, {4, 2}, {8, 8}} {
		m, w := float64(g.M), float64(g.World())
		ideal := 2 * (m - 1) / m * n / B
		near(t, "naive "+g.String(), p.Naive(g, n), ideal, 0.02)
		for _, rail := range []hier.Algorithm{hier.RailAllToAll, hier.RailRSAG} {
			_, tf := p.BestSlice(g, n, rail, 4)
			near(t, rail.String()+" "+g.String(), tf, ideal, 0.05)
		}
		near(t, "ring "+g.String(), p.Ring(g, n), 2*(w-1)/w*n/B, 0.01)
	}
	// NCCL's tree on two machines sends n out of each: the ideal.
	near(t, "tree 2×2", p.Tree(Grid{2, 2}, n), n/B, 0.01)
	near(t, "tree 4×2", p.Tree(Grid{4, 2}, n), 2*n/B, 0.01)
	require.Equal(t, "tree", p.FlatAlgo(Grid{2, 2}, n))
	require.Equal(t, "ring", p.FlatAlgo(Grid{4, 2}, n))
	// One NIC per GPU: D times the machine's bandwidth.
	q := p
	q.NetPerMachine = 0
	near(t, "naive 2×8, a NIC per GPU", q.Naive(Grid{2, 8}, n), p.Naive(Grid{2, 8}, n)/8, 0.1)
}

func TestSingleRankIsFree(t *testing.T) {
	g := Grid{1, 1}
	for name, v := range map[string]float64{
		"ring": testParams.Ring(g, 1e6), "tree": testParams.Tree(g, 1e6), "naive": testParams.Naive(g, 1e6),
		"fairgo": testParams.FairgoTime(g, 1e6, 1, Fairgo{Slice: 1 << 20, Parallelism: 4}),
	} {
		require.Zero(t, v, name)
	}
}

func TestLimits(t *testing.T) {
	p := testParams
	n := float64(256 << 20)
	// M = 1: the naive hierarchy is reduce-scatter + all-gather, fairgo is
	// the flat ring, and both cost the same; NCCL's tree is not used.
	g := Grid{1, 8}
	rs := 7 * (p.Intra.Alpha + n/8/p.Intra.BW)
	near(t, "naive 1×8", p.Naive(g, n), 2*rs, 1e-12)
	near(t, "fairgo 1×8", p.FairgoTime(g, n, 1, Fairgo{Slice: n / 4, Parallelism: 4, FlatThreshold: -1}), 2*rs, 1e-12)
	require.True(t, math.IsInf(p.Tree(g, n), 1))
	require.Equal(t, "ring", p.FlatAlgo(g, n))
	// A cap per machine slows every network term.
	uncapped := p
	uncapped.NetPerMachine = 0
	g = Grid{4, 2}
	require.Greater(t, p.Naive(g, n), uncapped.Naive(g, n))
	require.Greater(t, p.Ring(g, n), uncapped.Ring(g, n))
	// D = 1: no intra stages.
	st := p.Stages(Grid{4, 1}, n, hier.RailAllToAll)
	require.Zero(t, st[0])
	require.Zero(t, st[4])
	// The rail forms differ in latency only.
	q := p
	q.PeerAlpha = p.Net.Alpha / 4
	a2a, rsag := q.Stages(Grid{8, 2}, n, hier.RailAllToAll), q.Stages(Grid{8, 2}, n, hier.RailRSAG)
	near(t, "rsag − a2a", rsag[1]-a2a[1], 7*p.Net.Alpha-(p.Net.Alpha+6*q.PeerAlpha), 1e-6)
	require.Zero(t, rsag[2], "the add runs inside NCCL")
	// Parallelism 1 is the sum over slices; more parallelism never hurts.
	o := Fairgo{Slice: 16 << 20, Parallelism: 1, FlatThreshold: -1}
	g = Grid{8, 8}
	st = p.Stages(g, 16<<20, hier.RailAllToAll)
	sum := st[0] + st[1] + st[2] + st[3] + st[4]
	near(t, "no overlap", p.FairgoTime(g, n, 1, o), 16*sum, 1e-12)
	o.Parallelism = 4
	require.LessOrEqual(t, p.FairgoTime(g, n, 1, o), 16*sum, "pipelining made fairgo slower")
	// Below the flat threshold fairgo is flat.
	o.FlatThreshold = 1 << 20
	near(t, "below threshold", p.FairgoTime(g, 4096, 1, o), p.Flat(g, 4096), 1e-12)
	// Buckets of a round behave like one tensor cut at bucket boundaries.
	near(t, "buckets", p.FairgoTime(g, 16<<20, 4, Fairgo{Slice: 16 << 20, Parallelism: 4, FlatThreshold: -1}),
		p.FairgoTime(g, 64<<20, 1, Fairgo{Slice: 16 << 20, Parallelism: 4, FlatThreshold: -1}), 1e-12)
}

func TestMonotonic(t *testing.T) {
	p := testParams
	o := Fairgo{Slice: 8 << 20, Parallelism: 4, FlatThreshold: -1}
	for _, g := range []Grid{{1, 2}, {2, 2}, {4, 8}, {64, 8}, {1024, 8}} {
		prev := map[string]float64{}
		for n := float64(1 << 10); n <= 1<<32; n *= 2 {
			cur := map[string]float64{
				"ring":   p.Ring(g, n),
				"tree":   p.Tree(g, n),
				"naive":  p.Naive(g, n),
				"fairgo": p.FairgoTime(g, n, 1, o),
			}
			for k, v := range cur {
				require.GreaterOrEqual(t, v, prev[k], "%s on %v: time falls at %g bytes", k, g, n)
			}
			prev = cur
		}
		// Slower links never make anything faster.
		slow := p
		slow.Net.BW /= 2
		slow.NetPerMachine /= 2
		slow.Net.Alpha *= 2
		n := float64(64 << 20)
		require.GreaterOrEqual(t, slow.Flat(g, n), p.Flat(g, n))
		require.GreaterOrEqual(t, slow.Naive(g, n), p.Naive(g, n))
		require.GreaterOrEqual(t, slow.FairgoTime(g, n, 1, o), p.FairgoTime(g, n, 1, o))
	}
	// More machines never make the flat allreduce faster.
	for m := 2; m <= 1024; m *= 2 {
		require.GreaterOrEqual(t, p.Flat(Grid{m, 8}, 1<<28), p.Flat(Grid{m / 2, 8}, 1<<28), "M=%d", m)
	}
}

func TestBestSliceGrowsWithMachines(t *testing.T) {
	p := testParams
	p.NetPerMachine = 0
	n := float64(1 << 30)
	prev := 0.0
	for _, m := range []int{2, 16, 128, 1024} {
		s, tt := p.BestSlice(Grid{m, 8}, n, hier.RailAllToAll, 4)
		require.GreaterOrEqual(t, s, prev, "best slice shrinks at M=%d", m)
		require.Positive(t, tt)
		require.Positive(t, s)
		require.LessOrEqual(t, s, n)
		prev = s
	}
}

func TestFitLinkRecoversParams(t *testing.T) {
	want := Link{Alpha: 12e-6, BW: 3.3e9}
	var pts []Point
	for n := float64(1 << 10); n <= 1<<28; n *= 4 {
		pts = append(pts, Point{n, LinkTime(want, n)})
	}
	got, err := FitLink(pts)
	require.NoError(t, err)
	near(t, "alpha", got.Alpha, want.Alpha, 1e-6)
	near(t, "bw", got.BW, want.BW, 1e-6)
	_, err = FitLink(pts[:1])
	require.Error(t, err, "one point")
	_, err = FitLink([]Point{{1 << 20, 1}, {1 << 20, 1}})
	require.Error(t, err, "one distinct size")
	// Negative intercepts clamp to α = 0.
	got, err = FitLink([]Point{{1e6, 1e-4}, {2e6, 2.2e-4}})
	require.NoError(t, err)
	require.Zero(t, got.Alpha)
	require.Positive(t, got.BW)
}

// TestFitTestbedPredictsItsOwnPoints: measurements made by a known model of
// the testbed (one NIC per machine) give back its links, and the fitted
// model predicts every algorithm on every layout exactly.
func TestFitTestbedPredictsItsOwnPoints(t *testing.T) {
	truth := Params{
		Intra:         Link{Alpha: 8e-6, BW: 250e9},
		Net:           Link{Alpha: 120e-6, BW: 1.19e9},
		NetPerMachine: 1.19e9,
		PeerAlpha:     -1,
	}
	sizes := []float64{1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30}
	var tb Testbed
	tb.OneNICPerMachine = true
	for _, n := range sizes {
		tb.NVLink = append(tb.NVLink, Point{n, truth.Flat(Grid{1, 2}, n)})
		tb.Net = append(tb.Net, Point{n, truth.Flat(Grid{2, 1}, n)})
	}
	p, err := tb.Fit()
	require.NoError(t, err)
	near(t, "NVLink α", p.Intra.Alpha, truth.Intra.Alpha, 1e-6)
	near(t, "NIC B", p.Net.BW, truth.Net.BW, 1e-6)
	near(t, "NIC α", p.Net.Alpha, truth.Net.Alpha, 1e-6)
	var ms []Measurement
	for _, g := range []Grid{{2, 1}, {2, 2}, {4, 2}} {
		for _, n := range sizes {
			o := Fairgo{Slice: 16 << 20, Parallelism: 4, FlatThreshold: -1}
			ms = append(
				ms,
				Measurement{Grid: g, Algorithm: "flat", Bytes: n, Seconds: truth.Flat(g, n)},
				Measurement{Grid: g, Algorithm: "naive", Bytes: n, Seconds: truth.Naive(g, n)},
				Measurement{Grid: g, Algorithm: "fairgo", Chosen: hier.RailRSAG.String(), Bytes: n, Slice: o.Slice, Parallelism: 4,
					Seconds: truth.FairgoTime(
						g,
						n,
						1,
						Fairgo{Rail: hier.RailRSAG, Slice: o.Slice, Parallelism: 4, FlatThreshold: -1},
					)},
				Measurement{
					Grid:        g,
					Algorithm:   "fairgo",
					Chosen:      hier.RailAllToAll.String(),
					Bytes:       n,
					Buckets:     64,
					Slice:       o.Slice,
					Parallelism: 4,
					Seconds:     truth.FairgoTime(g, n, 64, o),
				},
				Measurement{Grid: g, Algorithm: "fairgo", Chosen: hier.Flat.String(), Bytes: n, Seconds: truth.Flat(g, n)},
			)
		}
	}
	errs, sums := p.Evaluate(ms)
	require.Len(t, errs, len(ms))
	require.Less(t, sums["all"].MaxAbs, 1e-6, "worst: %s", sums["all"].WorstLabel)
	_, err = Testbed{NVLink: tb.NVLink}.Fit()
	require.Error(t, err, "no network points")
}

func TestEvaluate(t *testing.T) {
	p := testParams
	ms := []Measurement{
		{Grid: Grid{1, 2}, Algorithm: "flat", Bytes: 1 << 20, Seconds: p.Flat(Grid{1, 2}, 1<<20)},
		{Grid: Grid{2, 2}, Algorithm: "naive", Bytes: 1 << 20, Seconds: 2 * p.Naive(Grid{2, 2}, 1<<20)},
		{Grid: Grid{2, 2}, Algorithm: "bogus", Bytes: 1 << 20, Seconds: 1},
		{Grid: Grid{2, 2}, Algorithm: "fairgo", Chosen: "ring", Bytes: 1 << 20, Seconds: 1},
	}
	errs, sum := p.Evaluate(ms)
	require.Len(t, errs, 2)
	near(t, "exact", errs[0].Rel+1, 1, 1e-12)
	near(t, "half", errs[1].Rel, -0.5, 1e-12)
	require.Equal(t, 2, sum["all"].N)
	require.InDelta(t, 0.5, sum["all"].MaxAbs, 1e-12)
	require.Error(t, (Params{}).Validate())
}

// TestPredictChosen: a fairgo measurement's Chosen is read by hier's
// names: flat is the flat time, rail-a2a and rail-rsag the pipeline with
// that rail form and no flat threshold, "" the pipeline with rail-a2a and
// the record's threshold; other algorithms have no prediction.
func TestPredictChosen(t *testing.T) {
	p := testParams
	g, n := Grid{4, 2}, float64(64<<20)
	o := Fairgo{Slice: 4 << 20, Parallelism: 4, FlatThreshold: 1 << 30}
	pipeline := func(rail hier.Algorithm, threshold float64) float64 {
		return p.FairgoTime(g, n, 1, Fairgo{Rail: rail, Slice: o.Slice, Parallelism: o.Parallelism,
			FlatThreshold: threshold})
	}
	cases := []struct {
		chosen  string
		want    float64
		invalid bool // hier does not know the name
	}{
		{"", pipeline(hier.RailAllToAll, o.FlatThreshold), false},
		{hier.Flat.String(), p.Flat(g, n), false},
		{hier.RailAllToAll.String(), pipeline(hier.RailAllToAll, -1), false},
		{hier.RailRSAG.String(), pipeline(hier.RailRSAG, -1), false},
		{hier.RailAllReduce.String(), 0, false},
		{hier.Auto.String(), 0, false},
		{"ring", 0, true},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%q", c.chosen), func(t *testing.T) {
			m := Measurement{Grid: g, Algorithm: "fairgo", Chosen: c.chosen, Bytes: n, Slice: o.Slice,
				Parallelism: o.Parallelism, FlatThreshold: o.FlatThreshold}
			got, err := p.Predict(m)
			if c.want == 0 {
				require.Error(t, err)
				require.Contains(t, err.Error(), c.chosen)
				if c.invalid {
					require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
				}
				return
			}
			require.NoError(t, err)
			require.InDelta(t, c.want, got, c.want*1e-12)
		})
	}
	require.NotEqual(t, pipeline(hier.RailAllToAll, -1), pipeline(hier.RailRSAG, -1), "the two rail forms differ")
	require.NotEqual(t, pipeline(hier.RailAllToAll, -1), pipeline(hier.RailAllToAll, o.FlatThreshold),
		"the record's threshold (above n) matters where Chosen is empty")
	require.Equal(t, pipeline(hier.RailAllToAll, -1), pipeline(hier.Auto, -1), "the zero Rail reads as rail-a2a")
}

func TestFitPeerAlpha(t *testing.T) {
	truth := testParams
	truth.PeerAlpha = truth.Net.Alpha / 4
	var ms []Measurement
	for _, m := range []int{4, 8} {
		for _, n := range []float64{1 << 20, 1 << 24, 1 << 28} {
			g := Grid{m, 2}
			o := Fairgo{Slice: 1 << 20, Parallelism: 4, FlatThreshold: -1}
			ms = append(
				ms,
				Measurement{
					Grid:          g,
					Algorithm:     "fairgo",
					Chosen:        hier.RailAllToAll.String(),
					Bytes:         n,
					Seconds:       truth.FairgoTime(g, n, 1, o),
					Slice:         o.Slice,
					Parallelism:   o.Parallelism,
					FlatThreshold: -1,
				},
			)
		}
	}
	p := testParams
	got, ok := p.FitPeerAlpha(ms)
	require.True(t, ok)
	near(t, "peer alpha", got, truth.PeerAlpha, 1e-9)
	_, ok = p.FitPeerAlpha(ms[:0])
	require.False(t, ok)
}

func TestPredictionTable(t *testing.T) {
	p := testParams
	p.NetPerMachine = 0
	preds := p.Table(8, []int{8, 64}, []float64{1 << 20, 1 << 30}, 4)
	require.Len(t, preds, 4)
	for _, pr := range preds {
		require.Positive(t, pr.Flat)
		require.Positive(t, pr.A2A)
		require.Positive(t, pr.RSAG)
		require.Equal(t, math.Min(pr.A2A, pr.RSAG), pr.Fairgo())
		require.InDelta(t, pr.Flat/pr.Fairgo(), pr.Speedup, 1e-12)
	}
}

// Fit fits both links and returns the model's parameters (α_peer = α_n, a
// free add kernel).
func (t Testbed) Fit() (Params, error) {
	intra, err := FitLink(t.NVLink)
	if err != nil {
		return Params{}, fmt.Errorf("NVLink pair: %w", err)
	}
	net, err := FitLink(t.Net)
	if err != nil {
		return Params{}, fmt.Errorf("network pair: %w", err)
	}
	p := Params{Intra: intra, Net: net, PeerAlpha: -1}
	if t.OneNICPerMachine {
		p.NetPerMachine = net.BW
	}
	return p, p.Validate()
}
