package hier

import (
	"fmt"
	"math"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/staging"
)

// The slice size of the pipeline comes from the job's own links. Slicing
// lets the NVLink stages of one slice run while the network carries
// another, but every slice pays each stage's fixed cost again (an NCCL
// launch, the network's round trips, the socket transport's per-operation
// work): the best number of slices is where the overlap it buys stops
// paying for those costs, which depends on both links and on the grid. The
// Reducer measures both links once, with every rank busy as in the
// pipeline (the D rails of a machine share its NIC), and derives the slice
// of each call from the model below.

// link is one kind of link as one rank sees it while every rank uses its
// own: an NCCL reduce-scatter (or all-gather) of n bytes over p ranks
// takes alpha + (p−1)/p · n / bw seconds.
type link struct {
	alpha float64 // seconds
	bw    float64 // bytes per second
}

// linkModel is the intra-machine link and the rail (the network) as the
// probe measured them; the zero value means "not measured".
type linkModel struct {
	intra, rail link
	// probes are the times the fit came from (ns; the slowest rank's best
	// of the intra link's small and large probe, then the rail's), for the
	// log: a fit is only as good as they are.
	probes [4]int64
}

func (m linkModel) String() string {
	s := fmt.Sprintf("intra α %.1f µs, %.2f GB/s; rail α %.1f µs, %.3f GB/s",
		m.intra.alpha*1e6, m.intra.bw/1e9, m.rail.alpha*1e6, m.rail.bw/1e9)
	if m.probes != [4]int64{} {
		p := m.probes
		s += fmt.Sprintf(" (probes of %d KiB and %d KiB: intra %.1f and %.1f µs, rail %.1f and %.1f µs)",
			probeSmall>>10, probeLarge>>10, float64(p[0])/1e3, float64(p[1])/1e3, float64(p[2])/1e3, float64(p[3])/1e3)
	}
	return s
}

// maxModelSlices bounds the slices the model considers for one call.
const maxModelSlices = 64

// stageTimes is the model's time of each pipeline stage for one slice of
// s bytes on grid g: the intra reduce-scatter and all-gather, and the rail
// phase (its reduce-scatter and all-gather, or collect and diffuse, of the
// rank's row of s/D bytes).
func (m linkModel) stageTimes(g Grid, s float64) (intra, rail float64) {
	M, D := float64(g.Machines), float64(g.Devices)
	if g.Devices > 1 {
		intra = m.intra.alpha + (D-1)/D*s/m.intra.bw
	}
	if g.Machines > 1 {
		rail = 2 * (m.rail.alpha + (M-1)/M*s/D/m.rail.bw)
	}
	return intra, rail
}

// pipelineTime is the model's time of an allreduce of bytes in k slices:
// the first slice through every stage, then one slice per time of the
// slowest stage.
func (m linkModel) pipelineTime(g Grid, bytes int64, k int) float64 {
	s := float64(bytes) / float64(k)
	intra, rail := m.stageTimes(g, s)
	return 2*intra + rail + float64(k-1)*math.Max(intra, rail)
}

// sliceBytes is the slice, a multiple of the grid's unit (M·D·Align), that
// minimizes the model's time of an allreduce of bytes; bytes itself (one
// slice) when that is fastest or the model is unknown. Fewer slices win
// ties.
func (m linkModel) sliceBytes(g Grid, bytes int64) int64 {
	unit := int64(g.Size()) * staging.Align
	if m.rail.bw <= 0 || (g.Devices > 1 && m.intra.bw <= 0) || bytes <= unit {
		return bytes
	}
	best, bestT := 1, m.pipelineTime(g, bytes, 1)
	for k := 2; k <= maxModelSlices && int64(k)*unit <= bytes; k++ {
		if t := m.pipelineTime(g, bytes, k); t < bestT*(1-1e-9) {
			best, bestT = k, t
		}
	}
	if best == 1 {
		return bytes
	}
	per := (bytes + int64(best) - 1) / int64(best)
	return (per + unit - 1) / unit * unit
}

// fineSlices is how many times the model's slices Auto's second sliced
// candidate cuts a call into. The model's α is fitted from lone calls of
// the probe, and a slice in a busy pipeline, its rail exchanges back to
// back, pays less than that: where the NIC binds, the model's few slices
// left the NVLink stages' overlap unused (bench/NOTES.md item 122), so Auto
// times both and measurement decides.
const fineSlices = 4

// fineSliceBytes is the slice that cuts an allreduce of bytes into
// fineSlices times as many slices as sliceBytes (at most maxModelSlices,
// and none smaller than the grid's unit), a multiple of the unit.
func (m linkModel) fineSliceBytes(g Grid, bytes int64) int64 {
	unit := int64(g.Size()) * staging.Align
	if bytes <= unit {
		return bytes
	}
	s := m.sliceBytes(g, bytes)
	k := min((bytes+s-1)/s*fineSlices, maxModelSlices, bytes/unit)
	if k <= 1 {
		return bytes
	}
	per := (bytes + k - 1) / k
	return (per + unit - 1) / unit * unit
}

// slicesPay reports whether the model predicts an allreduce of bytes in
// slices of slice bytes faster than in one piece by more than
// calibrationTie: then a measured tie between the two goes to the slices.
// A model with a link of the grid fitted without latency (α = 0: its small
// probe no slower than its bandwidth alone predicts, which is noise, not a
// link) prices every slice's exchanges at nothing and so always favours
// more slices; it breaks no tie (bench/NOTES.md item 123).
func (m linkModel) slicesPay(g Grid, bytes, slice int64) bool {
	if slice <= 0 || slice >= bytes || !m.latencyFitted(g) {
		return false
	}
	k := int((bytes + slice - 1) / slice)
	return m.pipelineTime(g, bytes, k) < m.pipelineTime(g, bytes, 1)*(1-calibrationTie)
}

// latencyFitted reports whether every link of the grid (NVLink where D > 1,
// the rail where M > 1) was fitted with a latency: α > 0.
func (m linkModel) latencyFitted(g Grid) bool {
	return (g.Devices < 2 || m.intra.alpha > 0) && (g.Machines < 2 || m.rail.alpha > 0)
}

// Probe sizes: per rank, the small one mostly latency, the large one
// mostly bandwidth.
const (
	probeMinBytes = 1 << 20 // the smallest call that probes the links
	probeSmall    = 256 << 10
	probeLarge    = 8 << 20
	probeRuns     = 3 // timed runs per size, after one untimed of the large size
)

// probeLinks measures the intra link (an allreduce on the intra
// communicator, every machine at once) and the rail (an allreduce on the
// rail communicator, every rail at once, so that a machine's D rails share
// its NIC as they do in the pipeline), each at two sizes, and fits the
// model. Every rank takes the slowest rank's times, so every rank derives
// the same slices. Engine goroutine only.
func (c *calibrator) probeLinks() (linkModel, error) {
	r := c.r
	g := r.rank.Grid
	first := r.exec.first()
	hdr, err := c.header()
	if err != nil {
		return linkModel{}, err
	}
	scratch, err := c.agreedScratch(hdr, probeLarge, first)
	if err != nil {
		return linkModel{}, fmt.Errorf("the link probe: %w", err)
	}
	defer r.rank.Device.Free(scratch)
	watch, err := r.newStopwatch()
	if err != nil {
		return linkModel{}, err
	}
	defer watch.release()
	timeOne := func(cm backend.Comm, bytes int64) (int64, error) {
		err := watch.start(first)
		if err == nil {
			err = cm.AllReduce(scratch, scratch, bytes/4, fairgo.Float32, fairgo.Sum, first)
		}
		var took time.Duration
		if err == nil {
			took, err = watch.stop(first, fmt.Sprintf("the link probe's allreduce of %d bytes on %s", bytes, cm.Name()))
		}
		return took.Nanoseconds(), err
	}
	// timeOn returns the best time of probeRuns allreduces of each size on
	// cm, the sizes alternating, after one untimed of the large size: it
	// connects, and it opens the TCP windows of a socket transport, which a
	// small first run would leave for the timed small runs to open (a
	// small time too slow makes the fit's α too large, and the slices too
	// few). The best, not the median: a shared network's noise is
	// one-sided (see calibrator.timeRoutes).
	timeOn := func(cm backend.Comm) (small, large int64, err error) {
		if cm == nil || cm.Size() < 2 {
			return 0, 0, nil
		}
		if _, err := timeOne(cm, probeLarge); err != nil {
			return 0, 0, err
		}
		for range probeRuns {
			s, err := timeOne(cm, probeSmall)
			if err != nil {
				return 0, 0, err
			}
			l, err := timeOne(cm, probeLarge)
			if err != nil {
				return 0, 0, err
			}
			if small == 0 || s < small {
				small = s
			}
			if large == 0 || l < large {
				large = l
			}
		}
		return small, large, nil
	}
	var times [4]int64
	for i, cm := range []backend.Comm{r.rank.Comms.IntraReduceScatter, r.rank.Comms.RailCollect} {
		if times[2*i], times[2*i+1], err = timeOn(cm); err != nil {
			return linkModel{}, err
		}
	}
	maxed, err := c.worldMax(hdr, times[:], first)
	if err != nil {
		return linkModel{}, err
	}
	return fitLinks(g, maxed), nil
}

// fitLinks fits each link to its two probe times (ns, small then large;
// 0 where the grid has no such link): an allreduce of n bytes over p ranks
// takes 2α + 2(p−1)/p · n / B. A link whose large probe was not slower
// than its small one gets the large probe's bandwidth and no α.
func fitLinks(g Grid, ns []int64) linkModel {
	fit := func(p int, t1, t2 int64) link {
		if p < 2 || t2 <= 0 {
			return link{}
		}
		f := 2 * float64(p-1) / float64(p)
		s1, s2 := float64(t1)*1e-9, float64(t2)*1e-9
		if s2 <= s1 {
			return link{bw: f * probeLarge / s2}
		}
		bw := f * (probeLarge - probeSmall) / (s2 - s1)
		alpha := math.Max(0, (s1-f*probeSmall/bw)/2)
		return link{alpha: alpha, bw: bw}
	}
	m := linkModel{intra: fit(g.Devices, ns[0], ns[1]), rail: fit(g.Machines, ns[2], ns[3])}
	copy(m.probes[:], ns)
	return m
}
