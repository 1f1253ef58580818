package hier

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/fairgo/fairgo"
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
	minClassBytes         = 64 << 10
	maxCalibrationBytes   = 256 << 20 // classes above are measured at this size
	calibrationMinRepeats = 2         // timed runs per candidate (after one warm-up) for large classes
	calibrationMaxRepeats = 5         // and for small ones
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
	algo     Algorithm
	unsliced bool
}

func (rt route) String() string {
	if rt.unsliced {
		return rt.algo.String() + "-unsliced"
	}
	return rt.algo.String()
}

// candidates are the routes Auto chooses from.
func (r *Reducer) candidates() []route {
	cs := []route{{algo: RailAllToAll}, {algo: RailRSAG}, {algo: RailRSAG, unsliced: true}}
	if r.cfg.flatThreshold == FlatNever {
		return cs
	}
	return append([]route{{algo: Flat}}, cs...)
}

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
	var out []Choice
	if r.cfg.flatThreshold != FlatNever {
		out = append(out, Choice{MinBytes: 0, Algorithm: Flat, Measured: true})
	}
	start := int64(0)
	if r.cfg.flatThreshold != FlatNever {
		start = r.cfg.flatThreshold
	}
	if fixed != Auto {
		return append(out, Choice{MinBytes: start, Algorithm: fixed, Measured: true})
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
		out = append(out, Choice{MinBytes: lo, Algorithm: a.algo, Unsliced: a.unsliced, Measured: measured})
		if lo >= maxCalibrationBytes {
			return out
		}
	}
}

// routeFor is the route of an allreduce of bytes, measuring its size class
// first when Auto has not yet (engine goroutine only).
func (r *Reducer) routeFor(bytes int64) route {
	if r.cfg.algorithm != Auto || r.grid.Machines == 1 {
		return route{algo: r.AlgorithmFor(bytes)}
	}
	if t := r.cfg.flatThreshold; t != FlatNever && bytes < t {
		return route{algo: Flat}
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
	a = r.calibrate(class)
	r.mu.Lock()
	r.measured[class] = a
	r.mu.Unlock()
	return a
}

// calibrate measures the candidates at the size of a class and returns the
// fastest. Failures are consistent across ranks (they agree on whether to
// measure first); a class that cannot be measured gets the guess.
func (r *Reducer) calibrate(class int) route {
	lo := r.classBase() << class
	size := min(lo+lo/2, maxCalibrationBytes) // inside the class
	size = size / 64 * 64
	cands := r.candidates()
	times, err := r.timeCandidates(size, cands)
	if err != nil {
		r.cfg.logger.Warn("fairgo: could not calibrate a size class; guessing", "class_bytes", lo, "guess", guess, "err", err)
		return guess
	}
	best := 0
	for i := range cands {
		if times[i] < times[best] {
			best = i
		}
	}
	attrs := []any{"class_bytes", lo, "measured_bytes", size, "choice", cands[best].String()}
	for i, a := range cands {
		attrs = append(attrs, a.String()+"_us", float64(times[i])/1e3)
	}
	r.cfg.logger.Info("fairgo: calibrated size class", attrs...)
	return cands[best]
}

// timeCandidates runs each candidate on a scratch buffer of size bytes and
// returns the slowest rank's best time of each, in nanoseconds.
func (r *Reducer) timeCandidates(size int64, cands []route) ([]int64, error) {
	first := r.chain.Stream(streams.ReduceScatter)
	hdr, err := r.calibrationHeader()
	if err != nil {
		return nil, err
	}
	// Agree that every rank has the scratch memory before anyone measures.
	scratch, aerr := r.dev.Alloc(size)
	ok := int64(1)
	if aerr != nil {
		ok = 0
	}
	agreed, err := r.worldMax(hdr, []int64{-ok}, first)
	if err != nil {
		return nil, errors.Join(err, freeIf(r.dev, scratch, aerr))
	}
	if agreed[0] != -1 {
		return nil, errors.Join(fmt.Errorf("a rank could not allocate %d bytes of scratch memory", size), aerr, freeIf(r.dev, scratch, aerr))
	}
	defer r.dev.Free(scratch)
	t := fairgo.Tensor{Ptr: scratch, Bytes: size, Count: size / 4, DType: fairgo.Float32}
	if err := r.drain(); err != nil {
		return nil, err
	}
	reps := calibrationMaxRepeats
	if size >= 16<<20 {
		reps = calibrationMinRepeats
	}
	ev, err := r.events.get()
	if err != nil {
		return nil, err
	}
	defer r.events.put(ev)
	best := make([]int64, len(cands))
	for i, a := range cands {
		best[i] = math.MaxInt64
		for rep := range reps + 1 {
			start := time.Now()
			last, err := r.allReduceWith(t, fairgo.Sum, a, first)
			if err == nil {
				err = ev.Record(last)
			}
			if err == nil {
				err = r.waitEvent(ev, fmt.Sprintf("the calibration's %v of %d bytes", a, size))
			}
			if err != nil {
				return nil, fmt.Errorf("timing %v at %d bytes: %w", a, size, err)
			}
			if d := time.Since(start).Nanoseconds(); rep > 0 && d < best[i] { // rep 0 warms up
				best[i] = d
			}
		}
	}
	return r.worldMax(hdr, best, first)
}

func freeIf(dev Device, ptr uintptr, allocErr error) error {
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
	slice := r.layout.SliceBytes
	if rt.unsliced {
		slice = math.MaxInt64
	}
	return r.allReduce(t, op, rt.algo, slice)
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

func (x *exchange) release(d Device) error {
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
