package model

import (
	"errors"
	"fmt"
	"math"
)

// Point is one measured 2-rank allreduce: n bytes in t seconds.
type Point struct {
	Bytes   float64
	Seconds float64
}

// FitLink fits T(n) = 2α + n/B, the 2-rank ring allreduce, to points by
// least squares on relative error (each point weighted 1/T², so small and
// large sizes count alike). A negative intercept is clamped to α = 0 and
// the bandwidth refitted through the origin.
func FitLink(points []Point) (Link, error) {
	var good []Point
	for _, p := range points {
		if p.Bytes > 0 && p.Seconds > 0 && !math.IsInf(p.Seconds, 0) {
			good = append(good, p)
		}
	}
	if len(good) < 2 {
		return Link{}, fmt.Errorf("model: fitting a link needs at least 2 points of distinct sizes, have %d", len(good))
	}
	// Minimise Σ w (a + b·n − T)², w = 1/T².
	var sw, sn, sT, snn, snT float64
	for _, p := range good {
		w := 1 / (p.Seconds * p.Seconds)
		sw += w
		sn += w * p.Bytes
		sT += w * p.Seconds
		snn += w * p.Bytes * p.Bytes
		snT += w * p.Bytes * p.Seconds
	}
	det := sw*snn - sn*sn
	if det <= 0 || math.Abs(det) < 1e-300 {
		return Link{}, errors.New("model: fitting a link needs points of at least two distinct sizes")
	}
	a := (snn*sT - sn*snT) / det
	b := (sw*snT - sn*sT) / det
	if a < 0 {
		a = 0
		b = snT / snn
	}
	if b <= 0 {
		return Link{}, fmt.Errorf("model: the times do not grow with the size (slope %g): no bandwidth to fit", b)
	}
	return Link{Alpha: a / 2, BW: 1 / b}, nil
}

// LinkTime is the 2-rank allreduce time FitLink fits.
func LinkTime(l Link, n float64) float64 { return 2*l.Alpha + n/l.BW }

// Testbed are the measurements a model of fairrun's testbed is fitted to:
// 2-rank allreduces over an NVLink pair (1 × 2) and over a network pair of
// machines (2 × 1).
type Testbed struct {
	NVLink, Net []Point
	// OneNICPerMachine: the D GPUs of a machine share one NIC (fairrun
	// --nic-gbit), so the fitted network bandwidth is the machine's.
	OneNICPerMachine bool
}
