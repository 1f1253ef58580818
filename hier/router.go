package hier

import (
	"log/slog"
	"math"
	"sync"
	"time"
)

// Size classes and calibration. With Auto, an allreduce at or above the
// flat threshold belongs to a size class: [base·2^k, base·2^(k+1)), base the
// flat threshold (at least minClassBytes), the last class open-ended. The
// first call of a class measures every candidate route at the class's
// size on this job's own links, takes the slowest rank's time of each, and
// uses the fastest from then on: every rank measures the same calls and
// sees the same maxima, so every rank chooses alike.
const (
	minClassBytes       = 64 << 10
	maxCalibrationBytes = 64 << 20 // the last class: calls of this size and more share its choice
	calibrationRounds   = 3        // timed samples per candidate, after one warm-up call of each
	// After the first round, only candidates within this factor of the
	// fastest are timed again.
	calibrationPrune = 2.0
	// A calibration sample moves this much in a burst of calls back to
	// back (calibrationBurst), of at most calibrationMaxBurst calls.
	calibrationBurstBytes = 64 << 20
	calibrationMaxBurst   = 4
)

// route is what an allreduce of some size follows: an algorithm, and for
// the sliced rail forms whether the rail's two exchanges run serially
// (WithSerialRail). Auto chooses one per size class; where the network
// dominates, the overlap of the NVLink stages gains little and fewer
// exchanges in flight on the NIC can fill it better, which only
// measurement tells.
type route struct {
	algo   Algorithm
	serial bool // the rail's collect and diffuse on one stream and communicator (railStep.lanes)
}

func (rt route) String() string {
	if impl := rt.algo.impl(); rt.serial && impl != nil && !impl.whole() {
		return rt.algo.String() + "-serial"
	}
	return rt.algo.String()
}

// plan is how one allreduce runs: its route, and the slice its tensor is
// cut into (bytes; the whole call when the route takes it in one piece).
type plan struct {
	route
	slice int64
}

// guess is the route of a class not measured yet.
var guess = route{algo: RailAllToAll}

// router decides the route of every allreduce: flat below the threshold
// or on one machine, the fixed algorithm of WithAlgorithm, or Auto's
// choice per size class, measured at the first call of the class; and the
// slice of the call, from the link model. The decision is written once, in
// decide; route, Choices and the inline path all read it.
type router struct {
	grid    Grid
	cfg     *config
	logger  *slog.Logger
	measure measurer

	table *routeTable // this Reducer's, or the one it shares (WithRoutesOf)
}

// routeTable is what Auto has learnt: the route measured per size class,
// and the links the slices come from. A Reducer has one of its own, or
// shares another's (WithRoutesOf); measurements run outside its lock.
type routeTable struct {
	mu           sync.Mutex
	measured     map[int]route        // Auto's choice per size class, once measured
	calibrations map[int]*Calibration // what Auto measured for it (none for SetRoute's choices)
	links        *linkModel           // once probed
	linksTried   bool
}

func newRouteTable() *routeTable {
	return &routeTable{measured: map[int]route{}, calibrations: map[int]*Calibration{}}
}

// probedLinks is the links probed so far, nil before the probe or after a
// failed one.
func (t *routeTable) probedLinks() *linkModel {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.links
}

// measurer runs the measurements the router decides from; the Reducer
// implements it (calibrate.go, links.go) on its engine goroutine.
type measurer interface {
	// timeRoutes times each candidate on an allreduce of size bytes and
	// returns, for each, the slowest rank's best time in nanoseconds.
	timeRoutes(size int64, cands []plan) (times []int64, samples []int, err error)
	// probeLinks measures the intra-machine link and the rail.
	probeLinks() (linkModel, error)
	// release frees what the measurements allocated.
	release() error
}

func newRouter(g Grid, cfg *config, m measurer, table *routeTable) *router {
	if table == nil {
		table = newRouteTable()
	}
	return &router{grid: g, cfg: cfg, logger: cfg.logger, measure: m, table: table}
}

// decide is the route of an allreduce of bytes where it does not depend
// on a measurement (ok); otherwise class is the size class whose measured
// route it takes (Auto), or -1 below the smallest class (the guess).
func (rt *router) decide(bytes int64) (r route, class int, ok bool) {
	g, cfg := rt.grid, rt.cfg
	flatThreshold := cfg.flatThreshold != FlatNever
	switch {
	case g.Size() == 1 || g.Machines == 1:
		return route{algo: Flat}, 0, true
	case flatThreshold && bytes < cfg.flatThreshold:
		return route{algo: Flat}, 0, true
	case cfg.algorithm != Auto:
		return route{algo: cfg.algorithm, serial: rt.serialRail()}, 0, true
	case g.Devices == 1 && flatThreshold:
		// With one device per machine the hierarchy is one NCCL allreduce
		// over the machines, which is flat: Auto is flat there, without
		// calibrating.
		return route{algo: Flat}, 0, true
	}
	class, ok = rt.classOf(bytes)
	if !ok {
		return guess, -1, false
	}
	return route{}, class, false
}

// serialRail is whether a sliced rail runs serially (WithSerialRail: on
// unless the option says otherwise).
func (rt *router) serialRail() bool { return !rt.cfg.serialSet || rt.cfg.serialRail }

// classOf is the size class of an allreduce of bytes (calls beyond the
// largest calibrated size share its class); ok is false below the
// smallest class.
func (rt *router) classOf(bytes int64) (class int, ok bool) {
	base := rt.classBase()
	if bytes < base {
		return 0, false
	}
	bytes = min(bytes, max(maxCalibrationBytes, base))
	class = int(math.Log2(float64(bytes) / float64(base)))
	lo := base << class
	for lo > bytes { // floating-point edge
		class--
		lo >>= 1
	}
	for lo<<1 <= bytes {
		class++
		lo <<= 1
	}
	return class, true
}

func (rt *router) classBase() int64 {
	if t := rt.cfg.flatThreshold; t != FlatNever && t > minClassBytes {
		return t
	}
	return minClassBytes
}

// known is decide with Auto's measurements so far: ok is false only for
// a size class not measured yet (class), which route calibrates.
func (rt *router) known(bytes int64) (r route, class int, ok bool) {
	r, class, ok = rt.decide(bytes)
	if ok || class < 0 {
		return r, class, true
	}
	rt.table.mu.Lock()
	defer rt.table.mu.Unlock()
	r, ok = rt.table.measured[class]
	return r, class, ok
}

// isFlat reports whether an allreduce of bytes is flat without a
// measurement still to make (the inline path's question).
func (rt *router) isFlat(bytes int64) bool {
	r, _, ok := rt.known(bytes)
	return ok && r.algo == Flat
}

// route is the plan of an allreduce of bytes, measuring its size class
// first when Auto has not yet (engine goroutine only).
func (rt *router) route(bytes int64) plan {
	r, class, ok := rt.known(bytes)
	if !ok {
		var cal *Calibration
		r, cal = rt.calibrate(class)
		rt.table.mu.Lock()
		rt.table.measured[class] = r
		if cal != nil {
			rt.table.calibrations[class] = cal
		}
		rt.table.mu.Unlock()
	}
	if _, _, fixed := rt.decide(bytes); !fixed {
		r = rt.uncut(r, bytes, rt.linkModel)
	}
	return rt.planFor(r, bytes)
}

// uncut is Auto's route r for an allreduce of bytes: r, except that where
// the sliced rail would take the call in one slice, the hierarchy in one
// piece. Auto times the sliced rail only where the links cut the call at
// the class's size (candidates), but a class spans a factor of two, and at
// its smaller sizes the model may keep the call whole: the sliced rail's
// one slice is then the hierarchy in one piece with the rail's allreduce
// split in two NCCL calls and four hand-offs between streams. On the
// one-GPU testbed's 2 × 4 (r1) the model kept 1 MiB whole and cut the
// 1.5 MiB Auto measured in two: rsag ran 1 MiB in 4218 µs against the one
// piece's 3989 (bench/NOTES.md item 40). links gives the link model as
// planWith takes it.
func (rt *router) uncut(r route, bytes int64, links func() *linkModel) route {
	if r.algo != RailRSAG {
		return r
	}
	if p := rt.planWith(r, bytes, links); p.slice < bytes {
		return r
	}
	return route{algo: RailAllReduce}
}

// planFor is the plan of an allreduce of bytes by r: the whole call for
// an algorithm that takes it in one piece, WithSliceSize's slice when
// given, else the link model's (measured at the first call of at least
// probeMinBytes: the probe is a collective, so that call is enqueued only
// once every rank has made it, like the first call of a size class that
// Auto measures), within a staging slot where the rail receives into one.
// Smaller calls before the probe take the layout's slice.
func (rt *router) planFor(r route, bytes int64) plan { return rt.planWith(r, bytes, rt.linkModel) }

// planWith is planFor with the link model from links, called only where
// the plan needs it (rt.linkModel probes; rt.table.probedLinks does not).
func (rt *router) planWith(r route, bytes int64, links func() *linkModel) plan {
	impl := r.algo.impl()
	if impl.whole() {
		return plan{route: r, slice: bytes}
	}
	layoutSlice := rt.cfg.layout.SliceBytes // WithSliceSize's, or the default, within the staging memory
	if rt.cfg.sliceSet || (rt.table.probedLinks() == nil && bytes < probeMinBytes) {
		return plan{route: r, slice: layoutSlice}
	}
	m := links()
	if m == nil {
		return plan{route: r, slice: layoutSlice}
	}
	s := m.sliceBytes(rt.grid, bytes)
	if impl.stagedReceive(rt.grid) {
		s = min(s, layoutSlice)
	}
	return plan{route: r, slice: s}
}

// linkModel is the links the slices come from, probed at the first call
// that needs them; nil when the probe failed (the layout's slice then
// serves, on every rank alike: a failed probe fails everywhere).
func (rt *router) linkModel() *linkModel {
	t := rt.table
	t.mu.Lock()
	links, tried := t.links, t.linksTried
	t.linksTried = true
	t.mu.Unlock()
	if links != nil || tried {
		return links
	}
	m, err := rt.measure.probeLinks()
	if err != nil {
		rt.logger.Warn(
			"fairgo: could not measure the links; slices keep the default size",
			"slice_bytes", rt.cfg.layout.SliceBytes,
			"err", err,
		)
		return nil
	}
	t.mu.Lock()
	t.links = &m
	t.mu.Unlock()
	rt.logger.Info("fairgo: measured the links", "grid", rt.grid.String(), "links", m.String())
	return &m
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
// fairring's all-to-all form (RailAllToAll) is not among them: on every
// testbed measured it lost to NCCL's reduce-scatter and all-gather on the
// rail or tied within noise (bench/NOTES.md), and each candidate costs
// calibration time; WithAlgorithm(RailAllToAll) still selects it.
func (rt *router) candidates(bytes int64) []plan {
	var cs []plan
	if rt.grid.Devices > 1 || rt.cfg.flatThreshold == FlatNever { // FlatNever: hierarchical, also with D = 1
		cs = append(cs, rt.planFor(route{algo: RailAllReduce}, bytes))
	}
	if rt.cfg.flatThreshold != FlatNever {
		cs = append(cs, rt.planFor(route{algo: Flat}, bytes))
	}
	sliced := rt.planFor(route{algo: RailRSAG, serial: rt.serialRail()}, bytes)
	if rt.grid.Devices > 1 && sliced.slice < bytes {
		if links := rt.table.probedLinks(); links != nil && links.slicesPay(rt.grid, bytes, sliced.slice) {
			return append([]plan{sliced}, cs...)
		}
		cs = append(cs, sliced)
	}
	return cs
}

// calibrate measures the candidates at the size of a class and returns the
// fastest. Failures are consistent across ranks (they agree on whether to
// measure first); a class that cannot be measured gets the guess.
func (rt *router) calibrate(class int) (route, *Calibration) {
	lo := rt.classBase() << class
	size := min(lo+lo/2, maxCalibrationBytes) // inside the class
	size = size / 64 * 64
	start := time.Now()
	if !rt.cfg.sliceSet {
		rt.linkModel() // before the timing: the sliced candidates take its slices
	}
	cands := rt.candidates(size)
	times, samples, err := rt.measure.timeRoutes(size, cands)
	if err != nil {
		rt.logger.Warn("fairgo: could not calibrate a size class; guessing",
			"class_bytes", lo, "guess", guess, "err", err)
		return guess, nil
	}
	best := fastest(times)
	cal := &Calibration{Bytes: size, Times: map[string]time.Duration{}, Samples: map[string]int{}, Cost: time.Since(start)}
	attrs := []any{
		"class_bytes", lo,
		"measured_bytes", size,
		"choice", cands[best].String(),
		"cost", cal.Cost.Round(time.Millisecond),
	}
	for i, p := range cands {
		cal.Times[p.String()] = time.Duration(times[i])
		cal.Samples[p.String()] = samples[i]
		attrs = append(attrs, p.String()+"_us", float64(times[i])/1e3)
	}
	rt.logger.Info("fairgo: calibrated size class", attrs...)
	return cands[best].route, cal
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
	// Samples is how many timed samples (bursts of calls back to back)
	// each candidate ran: fewer than the rounds for one that the first
	// round put more than twice behind the fastest.
	Samples map[string]int
	// Cost is the wall time the calibration took on this rank: what the
	// first call of the class waited beyond its own work.
	Cost time.Duration
}

// Choice is the algorithm of allreduces of at least MinBytes (up to the next
// Choice's MinBytes).
type Choice struct {
	MinBytes  int64
	Algorithm Algorithm
	// Serial: the rail's collect and diffuse of all slices run one after
	// the other on one stream and communicator (WithSerialRail).
	Serial bool
	// Measured is false for a size class Auto has not measured yet (no
	// call of that size so far); Algorithm is then a guess.
	Measured bool
	// Calibration is what Auto measured to choose, nil when it did not
	// (a fixed algorithm, a class not measured yet, a failed calibration).
	Calibration *Calibration
}

// String names the choice's route: the algorithm, with "-serial" when its
// rail runs serially ("rail-rsag-serial").
func (c Choice) String() string {
	return route{algo: c.Algorithm, serial: c.Serial}.String()
}

// choices is the current choice table: one entry where decide's answer
// changes (0, the flat threshold, each size class), each with the route
// decide gives there.
func (rt *router) choices() []Choice {
	rt.table.mu.Lock()
	defer rt.table.mu.Unlock()
	var out []Choice
	lastFixed := false // the last entry did not depend on a measurement
	add := func(lo int64) {
		r, class, ok := rt.decide(lo)
		c := Choice{MinBytes: lo, Measured: ok}
		if !ok && class >= 0 {
			r, c.Measured = rt.table.measured[class]
			if !c.Measured {
				r = guess
			}
			c.Calibration = rt.table.calibrations[class]
		}
		c.Algorithm, c.Serial = r.algo, r.serial
		if n := len(out); ok && lastFixed && out[n-1].String() == c.String() {
			return // a fixed route that goes on: no boundary here
		}
		out = append(out, c)
		lastFixed = ok
	}
	add(0)
	if t := rt.cfg.flatThreshold; t != FlatNever {
		add(t)
	}
	for lo := rt.classBase(); ; lo <<= 1 {
		if lo > rt.cfg.flatThreshold || rt.cfg.flatThreshold == FlatNever {
			add(lo)
		}
		if lo >= maxCalibrationBytes {
			return out
		}
	}
}

// choiceFor is the choice an allreduce of bytes follows (Reducer.ChoiceFor).
// It never probes (any goroutine may ask): before the probe it answers
// with the layout's slice, where the call itself may probe first and cut
// by the model.
func (rt *router) choiceFor(bytes int64) Choice {
	c := pick(rt.choices(), bytes)
	if _, _, fixed := rt.decide(bytes); fixed || !c.Measured {
		return c
	}
	if u := rt.uncut(route{algo: c.Algorithm, serial: c.Serial}, bytes, rt.table.probedLinks); u.algo != c.Algorithm {
		c.Algorithm, c.Serial = u.algo, u.serial
	}
	return c
}

// pick is the entry of cs that an allreduce of bytes follows.
func pick(cs []Choice, bytes int64) Choice {
	out := Choice{Algorithm: Flat, Measured: true}
	for _, c := range cs {
		if bytes >= c.MinBytes {
			out = c
		}
	}
	return out
}
