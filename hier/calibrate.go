package hier

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/streams"
)

// Size classes and calibration. With Auto, an allreduce at or above the
// flat threshold belongs to a size class: [base·2^k, base·2^(k+1)), base the
// flat threshold (at least minClassBytes), the last class open-ended. The
// first call of a class measures every candidate algorithm at the class's
// size on this job's own links, takes the slowest rank's time of each, and
// uses the fastest from then on: every rank measures the same calls and
// sees the same maxima, so every rank chooses alike.
const (
	minClassBytes        = 64 << 10
	maxCalibrationBytes  = 64 << 20 // the last class: calls of this size and more share its choice
	calibrationMinRounds = 3        // timed runs per candidate (after one warm-up of each) for classes ≥ 16 MiB
	calibrationMaxRounds = 5        // and for smaller ones
)

// classOf is the size class of an allreduce of bytes, and its first byte
// count; ok is false below the smallest class.
func (r *Reducer) classOf(bytes int64) (class int, lo int64, ok bool) {
	base := r.classBase()
	if bytes < base {
		return 0, 0, false
	}
	class = int(math.Log2(float64(bytes) / float64(base)))
	lo = base << class
	for lo > bytes { // floating-point edge
		class--
		lo >>= 1
	}
	for lo<<1 <= bytes {
		class++
		lo <<= 1
	}
	return class, lo, true
}

func (r *Reducer) classBase() int64 {
	if t := r.cfg.flatThreshold; t != FlatNever && t > minClassBytes {
		return t
	}
	return minClassBytes
}

// route is what Auto chooses for a size class: an algorithm, and for the
// rail's NCCL form whether the call is cut into slices (overlapping in the
// pipeline) or goes through as one: where the network dominates, the
// overlap of the NVLink stages gains little and fewer exchanges in flight
// on the NIC can fill it better, which only measurement tells.
type route struct {
	algo   Algorithm
	serial bool // the rail's collect and diffuse on one stream and communicator (lanesFor)
}

func (rt route) String() string {
	if rt.serial && (rt.algo == RailAllToAll || rt.algo == RailRSAG) {
		return rt.algo.String() + "-serial"
	}
	return rt.algo.String()
}

// candidates are the routes Auto chooses from at size bytes, in the order
// that breaks ties (fastest within calibrationTie of each other): the
// hierarchy in one piece, flat, the rail's NCCL form in the links' slices
// (only where they cut the call). Where the link model predicts the slices
// faster than one piece by more than the tie, they come first instead: a
// difference inside the calibration's noise is then decided by the model,
// not by the noise (on the one-GPU testbed the sliced route led by 2–9% at
// 64–256 MiB, and ties to the one piece chose it in 2 of 6 calibrations,
// bench/NOTES.md item 21). The hierarchy in one piece comes first:
// one call at a time it ties with flat where flat is close, and back to
// back it keeps its lead where flat's ring over every rank falls behind
// (4 × 2 at 1 MiB on the one-GPU testbed: 0.86 of naive with flat chosen).
// With one device per machine the hierarchy is one NCCL allreduce over
// the machines, which is flat: Auto is flat there, without calibrating.
// fairring's all-to-all form (RailAllToAll) is not among them: on every
// testbed measured it lost to NCCL's reduce-scatter and all-gather on the
// rail or tied within noise (bench/NOTES.md), and each candidate costs
// calibration time; WithAlgorithm(RailAllToAll) still selects it.
func (r *Reducer) candidates(bytes int64) []route {
	var cs []route
	if r.grid.Devices > 1 || r.cfg.flatThreshold == FlatNever { // FlatNever: hierarchical, also with D = 1
		cs = append(cs, route{algo: RailAllReduce})
	}
	if r.cfg.flatThreshold != FlatNever {
		cs = append(cs, route{algo: Flat})
	}
	sliced := route{algo: RailRSAG, serial: r.serialRail()}
	if slice := r.sliceFor(bytes, sliced); r.grid.Devices > 1 && slice < bytes {
		if r.links != nil && r.links.slicesPay(r.grid, bytes, slice) {
			return append([]route{sliced}, cs...)
		}
		cs = append(cs, sliced)
	}
	return cs
}

// serialRail is whether a sliced rail runs serially (WithSerialRail: on
// unless the option says otherwise).
func (r *Reducer) serialRail() bool { return !r.cfg.serialSet || r.cfg.serialRail }

// guess is the route of a class not measured yet.
var guess = route{algo: RailAllToAll}

// choicesLocked is the current choice table (r.mu held): Flat below the
// flat threshold, then one entry per size class that has been measured (or
// the algorithm fixed by WithAlgorithm).
func (r *Reducer) choicesLocked() []Choice {
	g := r.grid
	if g.Size() == 1 || g.Machines == 1 {
		return []Choice{{MinBytes: 0, Algorithm: Flat, Measured: true}}
	}
	fixed := r.cfg.algorithm
	if fixed == Auto && g.Devices == 1 && r.cfg.flatThreshold != FlatNever {
		return []Choice{{MinBytes: 0, Algorithm: Flat, Measured: true}} // see candidates
	}
	var out []Choice
	if r.cfg.flatThreshold != FlatNever {
		out = append(out, Choice{MinBytes: 0, Algorithm: Flat, Measured: true})
	}
	start := int64(0)
	if r.cfg.flatThreshold != FlatNever {
		start = r.cfg.flatThreshold
	}
	if fixed != Auto {
		return append(out, Choice{MinBytes: start, Algorithm: fixed, Serial: r.serialRail(), Measured: true})
	}
	if start < r.classBase() {
		out = append(out, Choice{MinBytes: start, Algorithm: guess.algo})
	}
	for class := 0; ; class++ {
		lo := r.classBase() << class
		a, measured := r.measured[class]
		if !measured {
			a = guess
		}
		out = append(out, Choice{MinBytes: lo, Algorithm: a.algo, Serial: a.serial, Measured: measured,
			Calibration: r.calibrations[class]})
		if lo >= maxCalibrationBytes {
			return out
		}
	}
}

// routeFor is the route of an allreduce of bytes, measuring its size class
// first when Auto has not yet (engine goroutine only).
func (r *Reducer) routeFor(bytes int64) route {
	if r.grid.Machines == 1 {
		return route{algo: Flat}
	}
	if t := r.cfg.flatThreshold; t != FlatNever && bytes < t {
		return route{algo: Flat}
	}
	if r.cfg.algorithm != Auto { // as choicesLocked reports it
		return route{algo: r.cfg.algorithm, serial: r.serialRail()}
	}
	if r.grid.Devices == 1 && r.cfg.flatThreshold != FlatNever {
		return route{algo: Flat} // the only candidate (see candidates)
	}
	class, lo, ok := r.classOf(bytes)
	if !ok {
		return guess
	}
	if lo > maxCalibrationBytes {
		class, _, _ = r.classOf(maxCalibrationBytes)
	}
	r.mu.Lock()
	a, measured := r.measured[class]
	r.mu.Unlock()
	if measured {
		return a
	}
	a, cal := r.calibrate(class)
	r.mu.Lock()
	r.measured[class] = a
	if cal != nil {
		r.calibrations[class] = cal
	}
	r.mu.Unlock()
	return a
}

// calibrate measures the candidates at the size of a class and returns the
// fastest. Failures are consistent across ranks (they agree on whether to
// measure first); a class that cannot be measured gets the guess.
func (r *Reducer) calibrate(class int) (route, *Calibration) {
	lo := r.classBase() << class
	size := min(lo+lo/2, maxCalibrationBytes) // inside the class
	size = size / 64 * 64
	start := time.Now()
	if !r.cfg.sliceSet {
		r.linkModel() // before the timing: the sliced candidates take its slices
	}
	cands := r.candidates(size)
	times, err := r.timeCandidates(size, cands)
	if err != nil {
		r.cfg.logger.Warn(
			"fairgo: could not calibrate a size class; guessing",
			"class_bytes", lo,
			"guess", guess,
			"err", err,
		)
		return guess, nil
	}
	best := fastest(times)
	cal := &Calibration{Bytes: size, Times: map[string]time.Duration{}, Cost: time.Since(start)}
	attrs := []any{
		"class_bytes", lo,
		"measured_bytes", size,
		"choice", cands[best].String(),
		"cost", cal.Cost.Round(time.Millisecond),
	}
	for i, a := range cands {
		cal.Times[a.String()] = time.Duration(times[i])
		attrs = append(attrs, a.String()+"_us", float64(times[i])/1e3)
	}
	r.cfg.logger.Info("fairgo: calibrated size class", attrs...)
	return cands[best], cal
}

// calibrationTie is how much slower than the fastest a candidate may be
// and still win for coming earlier in the list (flat first, then the
// simpler forms): differences inside the calibration's noise should not
// flip a choice between runs.
const calibrationTie = 0.03

// fastest is the index of the smallest time, a tie going to the earlier.
func fastest(times []int64) int {
	best := 0
	for i, t := range times {
		if t < times[best] {
			best = i
		}
	}
	for i, t := range times[:best] {
		if float64(t) <= float64(times[best])*(1+calibrationTie) {
			return i
		}
	}
	return best
}

// Calibration is what Auto measured for one size class.
type Calibration struct {
	// Bytes is the size the candidates were timed at.
	Bytes int64
	// Times is each candidate route's time (hier.Choice names): the
	// slowest rank's best of the timed runs.
	Times map[string]time.Duration
	// Cost is the wall time the calibration took on this rank: what the
	// first call of the class waited beyond its own work.
	Cost time.Duration
}

// timeCandidates runs each candidate on a scratch buffer of size bytes and
// returns, for each, the slowest rank's best time in nanoseconds. The best,
// not the median: the noise of a shared network is one-sided (a TCP
// retransmission timeout adds 200 ms to a call, nothing makes one faster
// than its links), and on the one-GPU testbed two of three runs of one
// candidate were hit at once, which chose the slower route by its median. Every
// candidate first runs once untimed (NCCL sets up a communicator's
// connections for an algorithm at its first use, which would be timed
// otherwise); then rounds of every candidate, the order rotated from round
// to round so that none always follows the same one.
func (r *Reducer) timeCandidates(size int64, cands []route) ([]int64, error) {
	first := r.chain.Stream(streams.ReduceScatter)
	hdr, err := r.calibrationHeader()
	if err != nil {
		return nil, err
	}
	scratch, err := r.agreedScratch(hdr, size, first)
	if err != nil {
		return nil, err
	}
	defer r.dev.Free(scratch)
	t := fairgo.Tensor{Ptr: scratch, Bytes: size, Count: size / 4, DType: fairgo.Float32}
	rounds := calibrationMaxRounds
	if size >= 16<<20 {
		rounds = calibrationMinRounds
	}
	ev, err := r.events.get()
	if err != nil {
		return nil, err
	}
	defer r.events.put(ev)
	run := func(a route) (int64, error) {
		start := time.Now()
		last, err := r.allReduceWith(t, fairgo.Sum, a, first)
		if err == nil {
			err = ev.Record(last)
		}
		if err == nil {
			err = r.waitEvent(ev, fmt.Sprintf("the calibration's %v of %d bytes", a, size))
		}
		if err != nil {
			return 0, fmt.Errorf("timing %v at %d bytes: %w", a, size, err)
		}
		return time.Since(start).Nanoseconds(), nil
	}
	for _, a := range cands { // warm-up
		if _, err := run(a); err != nil {
			return nil, err
		}
	}
	samples := make([][]int64, len(cands))
	for round := range rounds {
		for j := range cands {
			i := (j + round) % len(cands)
			d, err := run(cands[i])
			if err != nil {
				return nil, err
			}
			samples[i] = append(samples[i], d)
		}
	}
	bests := make([]int64, len(cands))
	for i := range cands {
		bests[i] = slices.Min(samples[i])
	}
	return r.worldMax(hdr, bests, first)
}

// agreedScratch allocates bytes of scratch memory for a measurement, once
// every rank has agreed that it could (so that all measure or none does),
// and waits for the work before it; the caller frees it.
func (r *Reducer) agreedScratch(hdr *exchange, bytes int64, s streams.Stream) (uintptr, error) {
	scratch, aerr := r.dev.Alloc(bytes)
	ok := int64(1)
	if aerr != nil {
		ok = 0
	}
	agreed, err := r.worldMax(hdr, []int64{-ok}, s)
	if err != nil {
		return 0, errors.Join(err, freeIf(r.dev, scratch, aerr))
	}
	if agreed[0] != -1 {
		return 0, errors.Join(
			fmt.Errorf("a rank could not allocate %d bytes of scratch memory", bytes),
			aerr,
			freeIf(r.dev, scratch, aerr),
		)
	}
	if err := r.drain(); err != nil {
		return 0, errors.Join(err, r.dev.Free(scratch))
	}
	return scratch, nil
}

func freeIf(dev backend.Device, ptr uintptr, allocErr error) error {
	if allocErr != nil {
		return nil
	}
	return dev.Free(ptr)
}

// allReduceWith enqueues an allreduce of t by a given route, flat work on
// first, and returns the stream its last work is on.
func (r *Reducer) allReduceWith(t fairgo.Tensor, op fairgo.Op, rt route, first streams.Stream) (streams.Stream, error) {
	if rt.algo == Flat {
		return first, r.comms.World.AllReduce(t.Ptr, t.Ptr, t.Count, t.DType, op, first)
	}
	return r.allReduce(t, op, rt, r.sliceFor(t.ByteLen(), rt))
}

// sliceFor is the slice of a hierarchical allreduce of bytes by rt: the
// whole call for RailAllReduce, WithSliceSize's when given, else the link
// model's (measured at the first call of at least probeMinBytes: the
// probe is a collective, so that call is enqueued only once every rank has
// made it, like the first call of a size class that Auto measures), within
// the staging slot for the all-to-all's D = 1 receive ring. Smaller calls
// before the probe take the layout's slice.
func (r *Reducer) sliceFor(bytes int64, rt route) int64 {
	if rt.algo == RailAllReduce {
		return math.MaxInt64
	}
	if r.cfg.sliceSet || (r.links == nil && bytes < probeMinBytes) {
		return r.layout.SliceBytes
	}
	m := r.linkModel()
	if m == nil {
		return r.layout.SliceBytes
	}
	s := m.sliceBytes(r.grid, bytes)
	if rt.algo == RailAllToAll && r.grid.Devices == 1 {
		s = min(s, r.layout.SliceBytes)
	}
	return s
}

// linkModel is the links the slices come from, probed at the first call
// that needs them; nil when the probe failed (the layout's slice then
// serves, on every rank alike: a failed probe fails everywhere).
func (r *Reducer) linkModel() *linkModel {
	if r.links == nil && !r.linksTried {
		r.linksTried = true
		m, err := r.probeLinks()
		if err != nil {
			r.cfg.logger.Warn(
				"fairgo: could not measure the links; slices keep the default size",
				"slice_bytes", r.layout.SliceBytes,
				"err", err,
			)
			return nil
		}
		r.links = &m
		r.cfg.logger.Info("fairgo: measured the links", "grid", r.grid.String(), "links", m.String())
	}
	return r.links
}

// calibrationHeader is a small device buffer and its host twin for the
// calibration's exchanges, allocated at the first calibration.
func (r *Reducer) calibrationHeader() (*exchange, error) {
	if r.calib != nil {
		return r.calib, nil
	}
	const n = 8 * 8
	dev, err := r.dev.Alloc(n)
	if err != nil {
		return nil, err
	}
	host, err := r.dev.AllocHost(n)
	if err != nil {
		return nil, errors.Join(err, r.dev.Free(dev))
	}
	r.calib = &exchange{dev: dev, host: host}
	return r.calib, nil
}

// exchange is a device buffer and its host twin.
type exchange struct {
	dev  uintptr
	host []byte
}

func (x *exchange) release(d backend.Device) error {
	return errors.Join(d.Free(x.dev), d.FreeHost(x.host))
}

// worldMax returns the element-wise maximum over all ranks of vals (at most
// 8 values), through the world communicator on s, waiting for it.
func (r *Reducer) worldMax(x *exchange, vals []int64, s streams.Stream) ([]int64, error) {
	n := len(vals)
	for i, v := range vals {
		binary.LittleEndian.PutUint64(x.host[8*i:], uint64(v))
	}
	host := x.host[:8*n]
	ev, err := r.events.get()
	if err != nil {
		return nil, err
	}
	defer r.events.put(ev)
	err = r.dev.CopyFromHostAsync(x.dev, host, s)
	if err == nil {
		err = r.comms.World.AllReduce(x.dev, x.dev, int64(n), fairgo.Int64, fairgo.Max, s)
	}
	if err == nil {
		err = r.dev.CopyToHostAsync(host, x.dev, s)
	}
	if err == nil {
		err = ev.Record(s)
	}
	if err == nil {
		err = r.waitEvent(ev, "the calibration's exchange of timings")
	}
	if err != nil {
		return nil, err
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(host[8*i:]))
	}
	return out, nil
}

// drain waits for the work on the engine's streams.
func (r *Reducer) drain() error {
	ev, err := r.events.get()
	if err != nil {
		return err
	}
	defer r.events.put(ev)
	for st := range streams.NumStages {
		if err := ev.Record(r.chain.Stream(st)); err != nil {
			return err
		}
		if err := r.waitEvent(ev, "the work before a calibration"); err != nil {
			return err
		}
	}
	return nil
}

// waitEvent waits for ev in the engine goroutine; it gives up when the
// Reducer breaks, and the watchdog (WithTimeout) covers it as it covers
// calls: a peer that never calibrates must not hang the engine.
func (r *Reducer) waitEvent(ev streams.Event, what string) error {
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), watchPoll)
		_ = ev.Wait(ctx)
		cancel()
		if done, err := ev.Query(); done {
			r.progressed()
			return err
		}
		if cause := r.brokenCause(); cause != nil {
			return cause
		}
		if c, cerr := r.commFailure(); cerr != nil {
			r.abort(fmt.Errorf("%w: communicator %s failed: %w", fairgo.ErrAborted, c.Name(), cerr))
			continue
		}
		if waited := time.Since(start); r.cfg.timeout > 0 && waited > r.cfg.timeout {
			r.timedOutOn(what, waited)
		}
	}
}
