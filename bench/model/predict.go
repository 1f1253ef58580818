package model

import (
	"fmt"
	"math"
	"slices"

	"github.com/fairgo/fairgo/hier"
)

// Measurement is one measured point to compare the model with.
type Measurement struct {
	Grid      Grid
	Algorithm string // "flat", "naive" or "fairgo"
	// Chosen is, for fairgo, hier's name of the algorithm its Reducer used
	// at this size (hier.Algorithm's String: "flat", "rail-a2a",
	// "rail-rsag"); "" reads as hier.RailAllToAll above the flat
	// threshold.
	Chosen        string
	Bytes         float64 // per call
	Buckets       int     // calls enqueued back to back (0 or 1: one)
	Seconds       float64 // per call, or per round of Buckets calls
	Slice         float64 // fairgo's slice size
	Parallelism   int
	FlatThreshold float64 // negative: never
	Label         string
}

// Predict is the model's time for a measurement's setting.
func (p Params) Predict(m Measurement) (float64, error) {
	k := float64(max(m.Buckets, 1))
	switch m.Algorithm {
	case "flat":
		return k * p.Flat(m.Grid, m.Bytes), nil
	case "naive":
		return k * p.Naive(m.Grid, m.Bytes), nil
	case "fairgo":
		o := Fairgo{Rail: hier.RailAllToAll, Slice: m.Slice, Parallelism: m.Parallelism,
			FlatThreshold: m.FlatThreshold}
		if m.Chosen != "" {
			chosen, err := hier.ParseAlgorithm(m.Chosen)
			if err != nil {
				return 0, fmt.Errorf("model: no prediction for fairgo's %q: %w", m.Chosen, err)
			}
			switch chosen {
			case hier.Flat:
				return k * p.Flat(m.Grid, m.Bytes), nil
			case hier.RailAllToAll, hier.RailRSAG:
			default:
				return 0, fmt.Errorf("model: no prediction for fairgo's %v (the model has %v, %v and %v)",
					chosen, hier.Flat, hier.RailAllToAll, hier.RailRSAG)
			}
			o.Rail = chosen
			o.FlatThreshold = -1 // the record says what was used
		}
		return p.FairgoTime(m.Grid, m.Bytes, max(m.Buckets, 1), o), nil
	}
	return 0, fmt.Errorf("model: no prediction for algorithm %q", m.Algorithm)
}

// Error is a measurement, its prediction and the relative error
// (predicted − measured) / measured.
type Error struct {
	Measurement
	Predicted float64
	Rel       float64
}

// Summary aggregates relative errors.
type Summary struct {
	N          int
	MedianAbs  float64 // median |Rel|
	MeanAbs    float64
	MaxAbs     float64
	WorstLabel string
}

// Evaluate predicts every measurement and summarises the errors per
// algorithm and over all ("all").
func (p Params) Evaluate(ms []Measurement) ([]Error, map[string]Summary) {
	var errs []Error
	for _, m := range ms {
		t, err := p.Predict(m)
		if err != nil || m.Seconds <= 0 {
			continue
		}
		errs = append(errs, Error{Measurement: m, Predicted: t, Rel: (t - m.Seconds) / m.Seconds})
	}
	sums := map[string]Summary{}
	group := map[string][]Error{}
	for _, e := range errs {
		group[e.Algorithm] = append(group[e.Algorithm], e)
		group["all"] = append(group["all"], e)
	}
	for k, es := range group {
		abs := make([]float64, len(es))
		var s Summary
		for i, e := range es {
			abs[i] = math.Abs(e.Rel)
			s.MeanAbs += abs[i]
			if abs[i] >= s.MaxAbs {
				s.MaxAbs = abs[i]
				s.WorstLabel = fmt.Sprintf("%s %v %.0f B", e.Algorithm, e.Grid, e.Bytes)
			}
		}
		s.N = len(es)
		s.MeanAbs /= float64(len(es))
		slices.Sort(abs)
		if n := len(abs); n%2 == 1 {
			s.MedianAbs = abs[n/2]
		} else {
			s.MedianAbs = (abs[n/2-1] + abs[n/2]) / 2
		}
		sums[k] = s
	}
	return errs, sums
}

// Prediction is the model's view of one (grid, size).
type Prediction struct {
	Grid       Grid
	Bytes      float64
	Ring, Tree float64 // seconds
	Flat       float64
	FlatAlgo   string
	Naive      float64
	// A2A and RSAG are fairgo with either rail form at its best slice.
	A2A, RSAG           float64
	A2ASlice, RSAGSlice float64
	Speedup             float64 // Flat / min(A2A, RSAG)
}

// Fairgo is the faster rail form's time.
func (pr Prediction) Fairgo() float64 { return math.Min(pr.A2A, pr.RSAG) }

// Table tabulates every machine count and size for D GPUs per machine,
// fairgo using its best slice size with parallelism par.
func (p Params) Table(d int, machines []int, sizes []float64, par int) []Prediction {
	var out []Prediction
	for _, m := range machines {
		g := Grid{M: m, D: d}
		for _, n := range sizes {
			pr := Prediction{Grid: g, Bytes: n, Ring: p.Ring(g, n), Tree: p.Tree(g, n), Flat: p.Flat(g, n),
				FlatAlgo: p.FlatAlgo(g, n), Naive: p.Naive(g, n)}
			pr.A2ASlice, pr.A2A = p.BestSlice(g, n, hier.RailAllToAll, par)
			pr.RSAGSlice, pr.RSAG = p.BestSlice(g, n, hier.RailRSAG, par)
			if f := pr.Fairgo(); f > 0 {
				pr.Speedup = pr.Flat / f
			}
			out = append(out, pr)
		}
	}
	return out
}

// FitPeerAlpha chooses the all-to-all's per-peer cost that best explains
// the rail-a2a fairgo measurements on 3 machines or more (the only ones it
// affects), among 0 and α_n·2^k for k in [-10, 1], minimising the squared
// log ratio of predicted to measured time. It reports false without such
// measurements.
func (p Params) FitPeerAlpha(ms []Measurement) (float64, bool) {
	var use []Measurement
	for _, m := range ms {
		a2a := m.Chosen == "" || m.Chosen == hier.RailAllToAll.String()
		if m.Algorithm == "fairgo" && a2a && m.Grid.M >= 3 && m.Seconds > 0 {
			use = append(use, m)
		}
	}
	if len(use) == 0 {
		return 0, false
	}
	cands := []float64{0}
	for k := -10; k <= 1; k++ {
		cands = append(cands, p.Net.Alpha*math.Pow(2, float64(k)))
	}
	best, bestErr := 0.0, math.Inf(1)
	for _, c := range cands {
		q := p
		q.PeerAlpha = c
		var e float64
		for _, m := range use {
			t, err := q.Predict(m)
			if err != nil || t <= 0 {
				continue
			}
			l := math.Log(t / m.Seconds)
			e += l * l
		}
		if e < bestErr {
			best, bestErr = c, e
		}
	}
	return best, true
}
