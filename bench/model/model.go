// Package model is an alpha-beta cost model of allreduce on M machines × D
// GPUs: the flat NCCL ring and tree over all ranks, the naive hierarchy
// (intra reduce-scatter, rail allreduce, intra all-gather on one stream) and
// fairgo's two levels (five stages per slice, slices pipelined). Its inputs
// are two links measured by fairbench -mode links: the NVLink of a GPU pair
// and the network of a machine pair, each as a latency α (seconds) and a
// bandwidth B (bytes per second, one direction).
//
// A 2-rank allreduce of n bytes is a ring of two steps of n/2 bytes, so a
// link's measurements fit T(n) = 2α + n/B (FitLink). From the two links the
// model predicts, for any grid:
//
//	ring   T = 2(p−1)·max(α_i + c/B_i, α_n + c/(D·b_n)),  c = n/p, p = M·D
//	       (the first term only when D > 1, the second only when M > 1)
//	tree   T = 2(⌈log2 M⌉α_n + (D−1)α_i) + max(2n(D−1)/(D·B_i), 2n/(D·b_n))
//	       (NCCL's tree runs across machines only: none when M = 1)
//	naive  T = 2(D−1)(α_i + n/(D·B_i)) + 2(M−1)(α_n + n/(D·M·b_n))
//	fairgo per slice of s bytes (k = ⌈n/s⌉ slices):
//	       t_rs = t_ag = (D−1)(α_i + s/(D·B_i))
//	       t_collect = t_diffuse = α_n + (M−2)·α_peer + (M−1)/M · s/(D·b_n)
//	       t_add = s/(D·B_kernel)
//	       T = Σ t + (k−1)·max(t_rs + t_ag, t_collect + t_diffuse, t_add)
//
// where b_n is the network bandwidth of one GPU's flow when all D rails of
// all M machines send at once (min(B_n, cap/D, total/(M·D)) with optional
// caps per machine and for the whole job: emulated machines share one
// host's loopback), α_peer the cost of
// each further peer of an all-to-all (default α_n: NCCL posts one message
// per peer), and the pipeline's steady state is bounded by the busiest
// resource: NVLink (stages 1 and 5), the NIC (2 and 4) or the add kernel.
// With parallelism 1 the slices do not overlap: T = k·Σ t. Below the flat
// threshold, and on one machine, fairgo is one flat allreduce (as hier is). NCCL picks ring or tree; "flat" is
// the faster of the two.
//
// It is a model: it ignores protocol switches (LL, LL128, Simple), channel
// counts, contention of two ranks on one GPU (emulated machines) and host
// overheads. Report its error against measured points before trusting its
// predictions.
package model

import (
	"errors"
	"fmt"
	"math"
)

// Link is the alpha-beta description of a link: a message of n bytes takes
// Alpha + n/BW seconds.
type Link struct {
	Alpha float64 // seconds
	BW    float64 // bytes per second, one direction
}

// Time is the time of one message of n bytes.
func (l Link) Time(n float64) float64 { return l.Alpha + n/l.BW }

func (l Link) String() string {
	return fmt.Sprintf("α %.2f µs, B %.2f GB/s", l.Alpha*1e6, l.BW/1e9)
}

// Valid reports whether the link has a non-negative latency and a positive
// bandwidth.
func (l Link) Valid() bool {
	return l.Alpha >= 0 && l.BW > 0 && !math.IsInf(l.BW, 0) && !math.IsNaN(l.Alpha)
}

// Grid is M machines × D GPUs.
type Grid struct{ M, D int }

// World is M·D.
func (g Grid) World() int { return g.M * g.D }

func (g Grid) String() string { return fmt.Sprintf("%d×%d", g.M, g.D) }

// Params are the model's inputs.
type Params struct {
	Intra Link // a GPU's NVLink to a peer in its machine
	Net   Link // a GPU's network path to its rail peer on another machine
	// NetPerMachine caps a machine's total network bandwidth in bytes per
	// second (all rails together); 0 means no cap (D independent NICs).
	NetPerMachine float64
	// NetTotal caps the network bandwidth of all machines together, in
	// bytes per second: emulated machines on one host share its loopback.
	// 0 means no cap.
	NetTotal float64
	// PeerAlpha is the cost of each further peer of an all-to-all, in
	// seconds; negative means Net.Alpha.
	PeerAlpha float64
	// KernelBW is the add kernel's throughput in bytes per second of
	// output; 0 makes the add stage free.
	KernelBW float64
}

// Validate checks the links.
func (p Params) Validate() error {
	var errs []error
	if !p.Intra.Valid() {
		errs = append(errs, fmt.Errorf("model: intra link %v: needs α ≥ 0 and B > 0", p.Intra))
	}
	if !p.Net.Valid() {
		errs = append(errs, fmt.Errorf("model: network link %v: needs α ≥ 0 and B > 0", p.Net))
	}
	if p.NetPerMachine < 0 || p.NetTotal < 0 || p.KernelBW < 0 {
		errs = append(errs, errors.New("model: negative bandwidth cap"))
	}
	return errors.Join(errs...)
}

func (p Params) peerAlpha() float64 {
	if p.PeerAlpha < 0 {
		return p.Net.Alpha
	}
	return p.PeerAlpha
}

// netBW is one flow's network bandwidth when flows flows leave each of
// machines machines at once.
func (p Params) netBW(machines, flows int) float64 {
	bw := p.Net.BW
	if p.NetPerMachine > 0 && flows > 0 {
		bw = math.Min(bw, p.NetPerMachine/float64(flows))
	}
	if p.NetTotal > 0 && flows > 0 && machines > 0 {
		bw = math.Min(bw, p.NetTotal/float64(flows*machines))
	}
	return bw
}

// Ring is the flat ring allreduce of n bytes over every rank.
func (p Params) Ring(g Grid, n float64) float64 {
	pr := float64(g.World())
	if g.World() == 1 {
		return 0
	}
	c := n / pr
	var step float64
	if g.D > 1 {
		step = p.Intra.Time(c)
	}
	if g.M > 1 {
		step = math.Max(step, p.Net.Alpha+c/(float64(g.D)*p.netBW(g.M, g.D)))
	}
	return 2 * (pr - 1) * step
}

// Tree is NCCL's tree allreduce across machines: a chain inside each
// machine, a double binary tree across machines, reduce and broadcast
// pipelined. NCCL does not use it inside one machine: +Inf when M = 1.
func (p Params) Tree(g Grid, n float64) float64 {
	if g.World() == 1 {
		return 0
	}
	if g.M == 1 {
		return math.Inf(1)
	}
	d := float64(g.D)
	lat := (d-1)*p.Intra.Alpha + math.Ceil(math.Log2(float64(g.M)))*p.Net.Alpha
	bw := 2 * n / (d * p.netBW(g.M, g.D))
	if g.D > 1 {
		bw = math.Max(bw, 2*n*(d-1)/d/p.Intra.BW)
	}
	return 2*lat + bw
}

// Flat is the faster of Ring and Tree (NCCL's choice, ideally).
func (p Params) Flat(g Grid, n float64) float64 { return math.Min(p.Ring(g, n), p.Tree(g, n)) }

// FlatAlgo names the faster flat algorithm.
func (p Params) FlatAlgo(g Grid, n float64) string {
	if p.Tree(g, n) < p.Ring(g, n) {
		return "tree"
	}
	return "ring"
}

// intraRS is a ring reduce-scatter (or all-gather) of n bytes over the D
// GPUs of a machine.
func (p Params) intraRS(g Grid, n float64) float64 {
	if g.D <= 1 {
		return 0
	}
	d := float64(g.D)
	return (d - 1) * p.Intra.Time(n/d)
}

// Naive is the hand-written hierarchy on one stream.
func (p Params) Naive(g Grid, n float64) float64 {
	t := 2 * p.intraRS(g, n)
	if g.M > 1 {
		m, d := float64(g.M), float64(g.D)
		t += 2 * (m - 1) * (p.Net.Alpha + n/(d*m*p.netBW(g.M, g.D)))
	}
	return t
}

// Fairgo are fairgo's options as the model sees them.
type Fairgo struct {
	Slice         float64 // bytes per slice
	Parallelism   int     // slices in flight; 1 disables overlap
	FlatThreshold float64 // below this many bytes: Flat; negative: never
}

// Stages are the five stage times of one slice of s bytes.
func (p Params) Stages(g Grid, s float64) [5]float64 {
	var t [5]float64
	t[0] = p.intraRS(g, s)
	t[4] = t[0]
	if g.M > 1 {
		m, d := float64(g.M), float64(g.D)
		a2a := p.Net.Alpha + (m-2)*p.peerAlpha() + (m-1)/m*s/(d*p.netBW(g.M, g.D))
		t[1], t[3] = a2a, a2a
		if p.KernelBW > 0 {
			t[2] = s / d / p.KernelBW
		}
	}
	return t
}

// FairgoTime is fairgo's allreduce of buckets calls of n bytes each,
// enqueued back to back (buckets 1: one call).
func (p Params) FairgoTime(g Grid, n float64, buckets int, o Fairgo) float64 {
	if buckets < 1 {
		buckets = 1
	}
	if g.World() == 1 || n <= 0 {
		return 0
	}
	if g.M == 1 || (o.FlatThreshold >= 0 && n < o.FlatThreshold) {
		return float64(buckets) * p.Flat(g, n) // as hier does on one machine
	}
	s := n
	if o.Slice > 0 && o.Slice < n {
		s = o.Slice
	}
	per := math.Ceil(n / s)
	s = n / per // slices of one call are equal in the model
	k := per * float64(buckets)
	t := p.Stages(g, s)
	sum := t[0] + t[1] + t[2] + t[3] + t[4]
	if o.Parallelism == 1 {
		return k * sum
	}
	bottleneck := math.Max(t[0]+t[4], math.Max(t[1]+t[3], t[2]))
	return sum + (k-1)*bottleneck
}

// BestSlice returns, among powers of two from 64 KiB to n, the slice size
// that minimises fairgo's time for n bytes, and that time.
func (p Params) BestSlice(g Grid, n float64, par int) (slice, t float64) {
	best, bestT := n, math.Inf(1)
	for s := float64(64 << 10); ; s *= 2 {
		s = math.Min(s, n)
		tt := p.FairgoTime(g, n, 1, Fairgo{Slice: s, Parallelism: par, FlatThreshold: -1})
		if tt < bestT*(1-1e-9) {
			best, bestT = s, tt
		}
		if s >= n {
			break
		}
	}
	return best, bestT
}

// BusBW is nccl-tests' bus bandwidth in bytes per second of an allreduce
// of n bytes over world ranks that took t seconds.
func BusBW(n, t float64, world int) float64 {
	if t <= 0 || world < 2 {
		return 0
	}
	return n / t * 2 * float64(world-1) / float64(world)
}
