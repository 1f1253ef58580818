// Package model is an alpha-beta cost model of allreduce on M machines × D
// GPUs: NCCL's flat ring and tree, the naive hierarchy, and fairgo's two
// rail forms (hier.RailAllToAll and hier.RailRSAG; algorithms go by hier's
// names). Fitted to two measured links, it checks a benchmark's points
// and extrapolates them to larger clusters.
//
// # Links
//
// The inputs are a GPU pair on NVLink (α_i, B_i) and a machine pair over
// the network (α_n, B_n), each fitted to a 2-rank allreduce, which is a
// ring of two steps of n/2 bytes each way: T(n) = 2α + n/B (FitLink). A
// machine's network bandwidth is D·b with b = min(B_n, cap/D), the rate of
// one rail's flow when all D rails send at once: cap is NetPerMachine (one
// NIC shared by the D GPUs, as on fairrun's testbed: cap = B_n), or none
// (one NIC per GPU).
//
// # Formulas
//
// With W = M·D ranks, n bytes, c = n/W and N = D·b a machine's network:
//
//	ring    T = 2(W−1)·max(α_i + c/B_i, α_n + c/N)
//	        (the NVLink term only when D > 1, the network term only when M > 1)
//	tree    T = 2(⌈log2 M⌉·α_n + (D−1)·α_i) + max(f(M)·n/N, 2(D−1)/D·n/B_i)
//	        NCCL's double binary tree across machines, a chain inside each;
//	        f(M) is the most bytes (per byte of n) that one machine sends,
//	        computed from NCCL's own trees: f(2) = 1, f(M ≥ 4) = 2 (a
//	        machine is inside one tree, with a parent and two children, and
//	        a leaf of the other, each tree carrying n/2). None when M = 1.
//	flat    min(ring, tree): NCCL's choice, ideally
//	naive   T = 2(D−1)(α_i + n/(D·B_i)) + rail allreduce of n/D over M ranks
//	        at b (ring or tree, the faster), one after the other
//	fairgo  per slice of s bytes (k = ⌈n/s⌉ slices):
//	        t_rs = t_ag = (D−1)(α_i + s/(D·B_i))
//	        rail-a2a: t_collect = t_diffuse = α_n + (M−2)·α_peer + (M−1)/M·s/N,
//	                  t_add = s/(D·B_kernel)
//	        rail-rsag: t_rs_rail = t_ag_rail = (M−1)·α_n + (M−1)/M·s/N
//	        T = Σ t + (k−1)·max(t_rs + t_ag, t_rail1 + t_rail2, t_add)
//	        (parallelism 1: k·Σ t; below the flat threshold and on one
//	        machine: flat)
//
// A hierarchical allreduce sends 2(M−1)/M·n out of each machine, which is
// the NIC-bound ideal that fairgo's rail phase reaches in the steady state;
// α_peer, the cost of each further peer of an all-to-all, defaults to α_n.
//
// It is a model: it ignores protocol switches (LL, LL128, Simple), channel
// counts, TCP's behaviour under shaping and host overheads. Report its error
// against measured points before trusting its predictions.
package model

import (
	"errors"
	"fmt"
	"math"

	"github.com/fairgo/fairgo/hier"
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
	return fmt.Sprintf("α %.2f µs, B %.3f GB/s", l.Alpha*1e6, l.BW/1e9)
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
	// second (all rails together): one NIC per machine. 0 means no cap (D
	// independent NICs, one per GPU).
	NetPerMachine float64
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
	if p.NetPerMachine < 0 || p.KernelBW < 0 {
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

// flowBW is one rail's network bandwidth when the D rails of a machine
// send at once.
func (p Params) flowBW(d int) float64 {
	bw := p.Net.BW
	if p.NetPerMachine > 0 && d > 0 {
		bw = math.Min(bw, p.NetPerMachine/float64(d))
	}
	return bw
}

// machineBW is a machine's network bandwidth with all D rails sending.
func (p Params) machineBW(d int) float64 { return float64(d) * p.flowBW(d) }

// Ring is the flat ring allreduce of n bytes over every rank.
func (p Params) Ring(g Grid, n float64) float64 {
	w := float64(g.World())
	if g.World() == 1 {
		return 0
	}
	c := n / w
	var step float64
	if g.D > 1 {
		step = p.Intra.Time(c)
	}
	if g.M > 1 {
		step = math.Max(step, p.Net.Alpha+c/p.machineBW(g.D))
	}
	return 2 * (w - 1) * step
}

// Tree is NCCL's tree allreduce: a chain inside each machine, a double
// binary tree across machines, reduce and broadcast pipelined. NCCL does
// not use it inside one machine: +Inf when M = 1.
func (p Params) Tree(g Grid, n float64) float64 {
	if g.World() == 1 {
		return 0
	}
	if g.M == 1 {
		return math.Inf(1)
	}
	d := float64(g.D)
	lat := (d-1)*p.Intra.Alpha + math.Ceil(math.Log2(float64(g.M)))*p.Net.Alpha
	bw := TreeLoad(g.M) * n / p.machineBW(g.D)
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

// railAllReduce is NCCL's allreduce of n bytes on one rail of M ranks while
// the D rails of every machine do the same: ring or tree, the faster.
func (p Params) railAllReduce(g Grid, n float64) float64 {
	if g.M <= 1 {
		return 0
	}
	m, b := float64(g.M), p.flowBW(g.D)
	ring := 2 * (m - 1) * (p.Net.Alpha + n/m/b)
	tree := 2*math.Ceil(math.Log2(m))*p.Net.Alpha + TreeLoad(g.M)*n/b
	return math.Min(ring, tree)
}

// Naive is the hand-written hierarchy on one stream.
func (p Params) Naive(g Grid, n float64) float64 {
	return 2*p.intraRS(g, n) + p.railAllReduce(g, n/float64(g.D))
}

// Fairgo are fairgo's options as the model sees them.
type Fairgo struct {
	// Rail is the rail form of fairgo's pipeline: hier.RailRSAG, else
	// hier.RailAllToAll (the default: the zero value, hier.Auto, and any
	// other algorithm read as it).
	Rail          hier.Algorithm
	Slice         float64 // bytes per slice
	Parallelism   int     // slices in flight; 1 disables overlap
	FlatThreshold float64 // below this many bytes: Flat; negative: never
}

// Stages are the five stage times of one slice of s bytes: intra
// reduce-scatter, the two rail steps with the add between them, intra
// all-gather; rail is read as Fairgo.Rail.
func (p Params) Stages(g Grid, s float64, rail hier.Algorithm) [5]float64 {
	var t [5]float64
	t[0] = p.intraRS(g, s)
	t[4] = t[0]
	if g.M > 1 {
		m := float64(g.M)
		bytes := (m - 1) / m * s / p.machineBW(g.D)
		switch rail {
		case hier.RailRSAG:
			t[1] = (m-1)*p.Net.Alpha + bytes
		default:
			t[1] = p.Net.Alpha + (m-2)*p.peerAlpha() + bytes
			if p.KernelBW > 0 {
				t[2] = s / float64(g.D) / p.KernelBW
			}
		}
		t[3] = t[1]
	}
	return t
}

// FairgoTime is fairgo's allreduce of buckets calls of n bytes each,
// enqueued back to back (buckets 1: one call).
func (p Params) FairgoTime(g Grid, n float64, buckets int, o Fairgo) float64 {
	buckets = max(buckets, 1)
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
	t := p.Stages(g, s, o.Rail)
	sum := t[0] + t[1] + t[2] + t[3] + t[4]
	if o.Parallelism == 1 {
		return k * sum
	}
	bottleneck := math.Max(t[0]+t[4], math.Max(t[1]+t[3], t[2]))
	return sum + (k-1)*bottleneck
}

// BestSlice returns, among powers of two from 64 KiB to n, the slice size
// that minimises fairgo's time for n bytes with the given rail form, and
// that time.
func (p Params) BestSlice(g Grid, n float64, rail hier.Algorithm, par int) (slice, t float64) {
	best, bestT := n, math.Inf(1)
	for s := float64(64 << 10); ; s *= 2 {
		s = math.Min(s, n)
		tt := p.FairgoTime(g, n, 1, Fairgo{Rail: rail, Slice: s, Parallelism: par, FlatThreshold: -1})
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

// TreeLoad is f(M): the most bytes one machine sends (and receives), per
// byte reduced, in NCCL's double binary tree allreduce over m machines.
// Each of the two trees carries half the bytes; in a tree a machine sends
// its half up once (reduce) and down once to each child (broadcast), so its
// load is half its degree in each tree.
func TreeLoad(m int) float64 {
	if m < 2 {
		return 0
	}
	worst := 0
	for r := range m {
		second := m - 1 - r // NCCL mirrors the first tree for even counts
		if m%2 == 1 {
			second = (r - 1 + m) % m // and shifts it for odd counts
		}
		worst = max(worst, btreeDegree(m, r)+btreeDegree(m, second))
	}
	return float64(worst) / 2
}

// btreeDegree is the number of neighbours (parent and children) of rank in
// NCCL's binary tree over n ranks (ncclGetBtree).
func btreeDegree(n, rank int) int {
	bit := 1
	for bit < n && bit&rank == 0 {
		bit <<= 1
	}
	if rank == 0 {
		if n > 1 {
			return 1 // the root's only child
		}
		return 0
	}
	deg := 1 // the parent
	low := bit >> 1
	if low == 0 {
		return deg
	}
	deg++ // rank − low is always in range
	for low > 0 && rank+low >= n {
		low >>= 1
	}
	if low > 0 {
		deg++
	}
	return deg
}
