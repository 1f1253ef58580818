package model

import (
	"math"
	"testing"
)

// H200-like links, for shape tests only (not measurements).
var testParams = Params{
	Intra:     Link{Alpha: 5e-6, BW: 300e9},
	Net:       Link{Alpha: 20e-6, BW: 25e9},
	PeerAlpha: -1,
	KernelBW:  2e12,
}

func near(t *testing.T, what string, got, want, rel float64) {
	t.Helper()
	if math.Abs(got-want) > rel*math.Abs(want) {
		t.Errorf("%s = %g, want %g (±%g%%)", what, got, want, rel*100)
	}
}

func TestTwoRankRingIsTheFittedForm(t *testing.T) {
	p := testParams
	for _, n := range []float64{8, 1 << 20, 1 << 30} {
		near(t, "ring 1×2", p.Ring(Grid{1, 2}, n), LinkTime(p.Intra, n), 1e-12)
		near(t, "ring 2×1", p.Ring(Grid{2, 1}, n), LinkTime(p.Net, n), 1e-12)
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

func TestSingleRankIsFree(t *testing.T) {
	g := Grid{1, 1}
	for name, v := range map[string]float64{
		"ring": testParams.Ring(g, 1e6), "tree": testParams.Tree(g, 1e6), "naive": testParams.Naive(g, 1e6),
		"fairgo": testParams.FairgoTime(g, 1e6, 1, Fairgo{Slice: 1 << 20, Parallelism: 4}),
	} {
		if v != 0 {
			t.Errorf("%s on 1×1 = %g, want 0", name, v)
		}
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
	if !math.IsInf(p.Tree(g, n), 1) || p.FlatAlgo(g, n) != "ring" {
		t.Error("tree used inside one machine")
	}
	// A shared cap (emulated machines on one host) slows every network term.
	capped := p
	capped.NetTotal = p.Net.BW
	if g := (Grid{4, 2}); capped.Naive(g, n) <= p.Naive(g, n) || capped.Ring(g, n) <= p.Ring(g, n) {
		t.Error("a shared network cap changes nothing")
	}
	// D = 1: no intra stages.
	st := p.Stages(Grid{4, 1}, n)
	if st[0] != 0 || st[4] != 0 {
		t.Errorf("D=1 intra stages = %v, want 0", st)
	}
	// Parallelism 1 is the sum over slices; more parallelism never hurts.
	o := Fairgo{Slice: 16 << 20, Parallelism: 1, FlatThreshold: -1}
	g = Grid{8, 8}
	st = p.Stages(g, 16<<20)
	sum := st[0] + st[1] + st[2] + st[3] + st[4]
	near(t, "no overlap", p.FairgoTime(g, n, 1, o), 16*sum, 1e-12)
	o.Parallelism = 4
	if p.FairgoTime(g, n, 1, o) > 16*sum {
		t.Error("pipelining made fairgo slower")
	}
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
			cur := map[string]float64{"ring": p.Ring(g, n), "tree": p.Tree(g, n), "naive": p.Naive(g, n), "fairgo": p.FairgoTime(g, n, 1, o)}
			for k, v := range cur {
				if v < prev[k] {
					t.Errorf("%s on %v: time falls from %g to %g at %g bytes", k, g, prev[k], v, n)
				}
			}
			prev = cur
		}
		// Slower links never make anything faster.
		slow := p
		slow.Net.BW /= 2
		slow.Net.Alpha *= 2
		n := float64(64 << 20)
		if slow.Flat(g, n) < p.Flat(g, n) || slow.Naive(g, n) < p.Naive(g, n) || slow.FairgoTime(g, n, 1, o) < p.FairgoTime(g, n, 1, o) {
			t.Errorf("%v: a slower network made an algorithm faster", g)
		}
	}
	// More machines never make the flat allreduce faster.
	for m := 2; m <= 1024; m *= 2 {
		if p.Flat(Grid{m, 8}, 1<<28) < p.Flat(Grid{m / 2, 8}, 1<<28) {
			t.Errorf("flat gets faster from %d to %d machines", m/2, m)
		}
	}
}

func TestBestSliceGrowsWithMachines(t *testing.T) {
	p := testParams
	n := float64(1 << 30)
	prev := 0.0
	for _, m := range []int{2, 16, 128, 1024} {
		s, tt := p.BestSlice(Grid{m, 8}, n, 4)
		if s < prev {
			t.Errorf("best slice shrinks from %g to %g at M=%d", prev, s, m)
		}
		if tt <= 0 || s <= 0 || s > n {
			t.Errorf("M=%d: slice %g time %g", m, s, tt)
		}
		prev = s
	}
}

func TestFairgoWinsAtScaleForLargeTensors(t *testing.T) {
	p := testParams
	p.PeerAlpha = 1e-6
	g := Grid{1024, 8}
	n := float64(1 << 30)
	_, tf := p.BestSlice(g, n, 4)
	if tf >= p.Ring(g, n) {
		t.Errorf("fairgo %g s is not faster than the flat ring %g s on %v", tf, p.Ring(g, n), g)
	}
	p.PeerAlpha = 0
	x, _ := p.Crossover(Grid{64, 8}, []float64{1 << 10, 1 << 20, 1 << 30}, 4)
	if x == 0 {
		t.Error("no crossover found")
	}
}

func TestFitLinkRecoversParams(t *testing.T) {
	want := Link{Alpha: 12e-6, BW: 3.3e9}
	var pts []Point
	for n := float64(1 << 10); n <= 1<<28; n *= 4 {
		pts = append(pts, Point{n, LinkTime(want, n)})
	}
	got, err := FitLink(pts)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "alpha", got.Alpha, want.Alpha, 1e-6)
	near(t, "bw", got.BW, want.BW, 1e-6)
	if _, err := FitLink(pts[:1]); err == nil {
		t.Error("one point: no error")
	}
	if _, err := FitLink([]Point{{1 << 20, 1}, {1 << 20, 1}}); err == nil {
		t.Error("one distinct size: no error")
	}
	// Negative intercepts clamp to α = 0.
	got, err = FitLink([]Point{{1e6, 1e-4}, {2e6, 2.2e-4}})
	if err != nil || got.Alpha != 0 || got.BW <= 0 {
		t.Errorf("clamped fit = %v, %v", got, err)
	}
}

func TestEvaluate(t *testing.T) {
	p := testParams
	ms := []Measurement{
		{Grid: Grid{1, 2}, Algorithm: "flat", Bytes: 1 << 20, Seconds: p.Flat(Grid{1, 2}, 1<<20)},
		{Grid: Grid{2, 2}, Algorithm: "naive", Bytes: 1 << 20, Seconds: 2 * p.Naive(Grid{2, 2}, 1<<20)},
		{Grid: Grid{2, 2}, Algorithm: "bogus", Bytes: 1 << 20, Seconds: 1},
	}
	errs, sum := p.Evaluate(ms)
	if len(errs) != 2 {
		t.Fatalf("%d errors, want 2", len(errs))
	}
	near(t, "exact", errs[0].Rel+1, 1, 1e-12)
	near(t, "half", errs[1].Rel, -0.5, 1e-12)
	if s := sum["all"]; s.N != 2 || math.Abs(s.MaxAbs-0.5) > 1e-12 {
		t.Errorf("summary %+v", s)
	}
	if err := (Params{}).Validate(); err == nil {
		t.Error("zero params validate")
	}
}

func TestFitPeerAlpha(t *testing.T) {
	truth := testParams
	truth.PeerAlpha = truth.Net.Alpha / 4
	var ms []Measurement
	for _, m := range []int{4, 8} {
		for _, n := range []float64{1 << 20, 1 << 24, 1 << 28} {
			g := Grid{m, 2}
			o := Fairgo{Slice: 4 << 20, Parallelism: 4, FlatThreshold: -1}
			ms = append(ms, Measurement{Grid: g, Algorithm: "fairgo", Bytes: n, Seconds: truth.FairgoTime(g, n, 1, o),
				Slice: o.Slice, Parallelism: o.Parallelism, FlatThreshold: -1})
		}
	}
	p := testParams
	got, ok := p.FitPeerAlpha(ms)
	if !ok {
		t.Fatal("no fit")
	}
	near(t, "peer alpha", got, truth.PeerAlpha, 1e-9)
	if _, ok := p.FitPeerAlpha(ms[:0]); ok {
		t.Error("fit without points")
	}
}
