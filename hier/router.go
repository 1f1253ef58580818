package hier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/logging"
)

// Size classes and calibration. With Auto, an allreduce at or above the
// flat threshold belongs to a size class: [base·2^k, base·2^(k+1)), base the
// flat threshold given with WithFlatThreshold, or minClassBytes (the
// default threshold of Auto), the last class open-ended. The first call of
// a class measures every candidate route at that call's size on this
// job's own links, takes the slowest rank's time of each (the fastest
// rank's for a call alone: ranksAgree), and uses the fastest
// from then on: every rank measures the same calls and sees the same
// extremes, so every rank chooses alike. A class with one candidate
// only (one machine without world variants, above halving-doubling's
// sizes) takes it without measuring.
const (
	// minClassBytes is the smallest class, and Auto's flat threshold
	// unless WithFlatThreshold gives one: below it every candidate is a
	// few latencies, which a calibration cannot tell apart from its noise
	// on a shared network for what it would cost.
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
	// Classes below this size are timed one call at a time as well as in
	// bursts (calibrator.timeRoutes).
	calibrationAloneBytes = 4 << 20
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
	fine   bool // the sliced rail in fineSlices times the link model's slices (Auto's second sliced candidate)
}

func (rt route) String() string {
	name := rt.algo.String()
	if impl := rt.algo.impl(); impl != nil && !impl.whole() {
		if rt.serial {
			name += "-serial"
		}
		if rt.fine {
			name += "-fine"
		}
	}
	return name
}

// plan is how one allreduce runs: its route, the slice its tensor is cut
// into (bytes; the whole call when the route takes it in one piece), and
// for a world variant (FlatRing, FlatTree) its communicator, or why there
// is none.
type plan struct {
	route
	slice   int64
	comm    backend.Comm // the world variant's communicator (router.attach); nil for the other routes
	commErr error        // why a world variant's plan has no communicator
}

// guess is the route of a class not measured yet, or whose calibration
// failed: flat on one machine, else fairring's rail.
func (rt *router) guess() route {
	if rt.grid.Machines == 1 {
		return route{algo: Flat}
	}
	return route{algo: RailAllToAll}
}

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
	top   int64       // test hook (export_router_test.go): the last class's bound; 0: maxCalibrationBytes

	// worlds are the world variants this Reducer made (FlatRing,
	// FlatTree), by NCCL algorithm: made at the first plan that needs
	// one, on the engine goroutine (a call whose variant is still to make
	// is never enqueued inline: inlineable), so at the same place in every
	// rank's call order; closed once every size class is measured and
	// none chose it, or at Close. worldsMu guards the map for the readers
	// on other goroutines (Choices, inlineable, an abort).
	worldsMu sync.Mutex
	worlds   map[backend.NCCLAlgo]*worldVariant

	// settled is, per size class, the route known once read from the
	// table: the calls of a measured class skip decide's candidates (a
	// slice, two locks) and the table's lock. A measured route never
	// changes, and its class keeps more than one candidate (the variants
	// its calibration made are kept or closed, never marked failed), so
	// decide would answer the same.
	settled [maxClasses]atomic.Pointer[route]

	// wholes is, per size class, the plan of its settled route where that
	// route takes a call in one piece (flat, NCCL's ring or tree, the
	// hierarchy in one piece, halving-doubling), its world variant
	// attached: such a plan depends on the call's size only by its slice
	// (the size itself), so route and inlineable answer a call of a
	// settled class with one lookup. It holds only plans of the route in
	// settled, whose variant, once chosen, is never closed before the
	// Reducer (closeUnchosen keeps the variants of measured classes).
	wholes [maxClasses]atomic.Pointer[plan]

	// guessed counts the size classes whose calibration failed and that
	// took the guess: the job goes on, and a test that expects none (on
	// the sim, where a failed kernel does not end the context as on a
	// GPU) reads it.
	guessed atomic.Int64
}

// maxClasses bounds the size classes settled keeps; numClasses is well
// below it for any flat threshold.
const maxClasses = 64

// worldVariant is one world variant's communicator, or why it could not
// be made (then it is no candidate, and a plan that needs it fails).
type worldVariant struct {
	comm backend.Comm
	err  error
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

// linksSettled reports whether the links were probed, or the probe was
// tried: linkModel then probes no more.
func (t *routeTable) linksSettled() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.links != nil || t.linksTried
}

// measurer runs the measurements the router decides from; the Reducer
// implements it (calibrate.go, links.go) on its engine goroutine.
type measurer interface {
	// timeRoutes times each candidate on an allreduce of size bytes:
	// for each, in nanoseconds, the slowest rank's best burst and the
	// fastest rank's best call alone (timings).
	timeRoutes(size int64, cands []plan) (timings, error)
	// probeLinks measures the intra-machine link and the rail.
	probeLinks() (linkModel, error)
	// agreedSize returns size where every rank proposed it, else ok false
	// (a collective: every rank asks at the same place, each with the
	// size of the call it is at).
	agreedSize(size int64) (agreed int64, ok bool, err error)
	// hasVariants reports whether the backend makes world variants.
	hasVariants() bool
	// world makes the world variant on which NCCL runs algo only, once
	// every rank has (a collective: every rank asks at the same place).
	world(algo backend.NCCLAlgo) (backend.Comm, error)
	// release frees what the measurements allocated, and closes the
	// router's world variants.
	release() error
}

// fact logs a fact about the whole job, which every rank finds alike: at
// info on rank 0, at debug on the others (logging.FactLevel), so that a
// job says it once. Warnings stay on every rank.
func (rt *router) fact(msg string, args ...any) {
	rt.logger.Log(context.Background(), logging.FactLevel(rt.grid.Rank()), msg, args...)
}

func newRouter(g Grid, cfg *config, m measurer, table *routeTable) *router {
	if table == nil {
		table = newRouteTable()
	}
	return &router{grid: g, cfg: cfg, logger: cfg.logger, measure: m, table: table,
		worlds: map[backend.NCCLAlgo]*worldVariant{}}
}

// decide is the route of an allreduce of bytes where it does not depend
// on a measurement (ok); otherwise class is the size class whose measured
// route it takes (Auto), or -1 below the smallest class (the guess).
//
// Flat: one rank, below the flat threshold, a hierarchical algorithm on
// one machine. A fixed algorithm is followed. Auto measures every class
// with more than one candidate, whatever the grid: with one device per
// machine or on one machine too, where NCCL's ring, its tree and
// halving-doubling still differ (on 8 machines of one GPU, NCCL's own
// choice took 1.7–2.3× its tree's time at 64–256 KiB, and the tree
// 1.5–1.7× the default's at 1–4 MiB). The answer depends on the grid, the
// options and which world variants exist, never on timings, so every
// rank gives it alike.
func (rt *router) decide(bytes int64) (r route, class int, ok bool) {
	g, cfg := rt.grid, rt.cfg
	flat := route{algo: Flat}
	switch {
	case g.Size() == 1:
		return flat, 0, true
	case cfg.flatThreshold != FlatNever && bytes < cfg.flatThreshold:
		return flat, 0, true
	case cfg.algorithm != Auto:
		if g.Machines == 1 && cfg.algorithm.hierarchical() {
			return flat, 0, true
		}
		return route{algo: cfg.algorithm, serial: rt.serialRail()}, 0, true
	}
	class, ok = rt.classOf(bytes)
	if !ok {
		if g.Machines == 1 {
			return flat, 0, true
		}
		return rt.guess(), -1, false
	}
	var buf [maxCandidates]route // decide runs on every call: no allocation
	switch rs := rt.appendCandidateRoutes(buf[:0], rt.classSize(class)); len(rs) {
	case 0:
		return flat, 0, true
	case 1:
		return rs[0], 0, true
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
	bytes = min(bytes, max(rt.topClass(), base))
	// base<<class <= bytes < base<<(class+1): the class is the integer
	// log2 of bytes/base, rounded down (bytes/base rounds down alike).
	return bits.Len64(uint64(bytes/base)) - 1, true
}

func (rt *router) classBase() int64 {
	if t := rt.cfg.flatThreshold; t != FlatNever && t > minClassBytes {
		return t
	}
	return minClassBytes
}

// classSize is the size a class is timed at where its first call's size
// cannot be (timedSize): 1.5 times its smallest, a multiple of 64 bytes,
// at most the last class's bound.
func (rt *router) classSize(class int) int64 {
	lo := rt.classBase() << class
	return min(lo+lo/2, rt.topClass()) / 64 * 64
}

// timedSize is the size Auto times class at when an allreduce of bytes is
// its first call: that call's size (a multiple of 64 bytes, within the
// class), since a trainer's buckets come back at the same sizes step after
// step; the last, open-ended class at classSize. Where the ranks' first
// calls differ (a mismatch that their check then finds), every rank times
// classSize instead (router.calibrate): the one size that needs no call
// to agree on.
//
// Why not a fixed point of each class: NCCL's algorithms cross over inside
// a factor of two. On two machines of one GPU, NCCL's tree took 204–224
// µs at 256 KiB and its ring 284–339; at 384 KiB, where the class was
// timed, the two measured within a few percent of each other, the ring
// was chosen in two runs of six, and the 256 KiB calls then ran at
// 0.64–0.73 of the tree (bench/NOTES.md, "Auto timed at the first call's
// size").
func (rt *router) timedSize(class int, bytes int64) int64 {
	lo := rt.classBase() << class
	if class == rt.numClasses()-1 || bytes < lo || bytes >= 2*lo {
		return rt.classSize(class)
	}
	// A multiple of 64 bytes, so that the timed calls' buffers, one after
	// another in the scratch memory, stay aligned for every kernel and
	// NCCL (a flat threshold need not be one: the class's bounds then are
	// not either).
	if t := bytes / 64 * 64; t >= lo {
		return t
	}
	return (lo + 63) / 64 * 64
}

// numClasses is the number of size classes.
func (rt *router) numClasses() int {
	c, _ := rt.classOf(max(rt.topClass(), rt.classBase()))
	return c + 1
}

// topClass is where the last, open-ended class starts:
// maxCalibrationBytes, or less where a test says so.
func (rt *router) topClass() int64 {
	if rt.top > 0 {
		return rt.top
	}
	return maxCalibrationBytes
}

// known is decide with Auto's measurements so far: ok is false only for
// a size class not measured yet (class), which route calibrates.
func (rt *router) known(bytes int64) (r route, class int, ok bool) {
	if p, class := rt.settledRoute(bytes); p != nil {
		return *p, class, true
	}
	r, class, ok = rt.decide(bytes)
	if ok || class < 0 {
		return r, class, true
	}
	rt.table.mu.Lock()
	defer rt.table.mu.Unlock()
	r, ok = rt.table.measured[class]
	if ok && class < maxClasses {
		settled := r
		rt.settled[class].Store(&settled)
	}
	return r, class, ok
}

// settledRoute is the route of an allreduce of bytes where decide would
// look it up in the table and known has read it there before; nil
// otherwise.
func (rt *router) settledRoute(bytes int64) (*route, int) {
	g, cfg := rt.grid, rt.cfg
	if g.Size() == 1 || cfg.algorithm != Auto || cfg.flatThreshold != FlatNever && bytes < cfg.flatThreshold {
		return nil, 0
	}
	class, ok := rt.classOf(bytes)
	if !ok || class >= maxClasses {
		return nil, 0
	}
	return rt.settled[class].Load(), class
}

// isFlat reports whether an allreduce of bytes is ONE allreduce on a
// communicator of all ranks, on the call's first stream (Flat, FlatRing,
// FlatTree: executor.singleComm gives the communicator of route's plan),
// known without anything collective still to do first: no calibration of
// its class, and for a world variant the communicator made already (the
// call that makes it, a collective that blocks until every rank joins,
// goes through the engine). Any goroutine may ask; the answer changes
// only as calls execute, so that every rank gives it alike for the same
// call.
func (rt *router) isFlat(bytes int64) bool {
	r, _, ok := rt.known(bytes)
	impl := r.algo.impl()
	return ok && impl != nil && impl.single() && rt.variantMade(r)
}

// planned reports whether the route of an allreduce of bytes is known
// without a calibration, and for a world variant whether its communicator
// is made: route then plans the call with nothing collective of its own
// to do but, once, the probe of the links. It is the question of the
// check that rides in the call's own data (fingerprint.go), asked, like
// isFlat, alike on every rank for the same call.
func (rt *router) planned(bytes int64) bool {
	r, _, ok := rt.known(bytes)
	impl := r.algo.impl()
	return ok && impl != nil && (!impl.single() || rt.variantMade(r))
}

// variantMade reports whether r's world variant, where it runs on one, has
// its communicator.
func (rt *router) variantMade(r route) bool {
	v := r.algo.variant()
	if v == "" {
		return true
	}
	rt.worldsMu.Lock()
	defer rt.worldsMu.Unlock()
	w := rt.worlds[v]
	return w != nil && w.comm != nil
}

// route is the plan of an allreduce of bytes, measuring its size class
// first when Auto has not yet, with its world variant attached (made now
// if it is the first plan to need it). Both happen on the engine
// goroutine only: an inline caller's call needs neither (inlineable).
func (rt *router) route(bytes int64) plan {
	if p, ok := rt.settledWhole(bytes); ok {
		return p
	}
	p := rt.freshPlan(bytes)
	rt.keepWhole(bytes, p)
	return p
}

// freshPlan is route without wholes: the plan from the table, the links
// and the world variants.
func (rt *router) freshPlan(bytes int64) plan {
	r, class, ok := rt.known(bytes)
	if !ok {
		var cal *Calibration
		r, cal = rt.calibrate(class, bytes)
		rt.table.mu.Lock()
		rt.table.measured[class] = r
		if cal != nil {
			rt.table.calibrations[class] = cal
		}
		rt.table.mu.Unlock()
		rt.closeUnchosen()
	}
	p, _ := rt.attach(rt.shape(r, bytes, rt.linkModel))
	return p
}

// settledWhole is the plan of an allreduce of bytes where its class is
// settled on a route that takes the call whole and route has planned a
// call of the class before (wholes); ok false otherwise.
func (rt *router) settledWhole(bytes int64) (p plan, ok bool) {
	r, class := rt.settledRoute(bytes)
	if r == nil {
		return plan{}, false
	}
	w := rt.wholes[class].Load()
	if w == nil || w.route != *r {
		return plan{}, false
	}
	p = *w
	p.slice = bytes
	return p, true
}

// keepWhole remembers p, the plan route made for an allreduce of bytes,
// where settledWhole may answer with it: its class settled on p's route,
// which takes calls whole, with its world variant made.
func (rt *router) keepWhole(bytes int64, p plan) {
	impl := p.algo.impl()
	if impl == nil || !impl.whole() || p.commErr != nil || p.algo.variant() != "" && p.comm == nil {
		return
	}
	if r, class := rt.settledRoute(bytes); r != nil && *r == p.route {
		kept := new(plan) // allocated here only: p itself stays on the caller's stack
		*kept = p
		rt.wholes[class].Store(kept)
	}
}

// shape is the plan of an allreduce of bytes by r, its route known: uncut
// where Auto chose r, then sliced by planWith, with the link model from
// links (rt.linkModel probes; rt.table.probedLinks does not).
func (rt *router) shape(r route, bytes int64, links func() *linkModel) plan {
	if _, _, fixed := rt.decide(bytes); !fixed {
		r = rt.uncut(r, bytes, links)
	}
	return rt.planWith(r, bytes, links)
}

// inlineable reports whether an allreduce of bytes may be enqueued on its
// caller's goroutine (WithInlineEnqueue): its plan is known with nothing
// collective to do first (no calibration of its class, no world variant
// to make, no probe of the links: each blocks until every rank joins, and
// goes through the engine), and it takes the call in one piece or one
// slice, so that its enqueue costs the caller about what the engine's
// hand-off would: one NCCL allreduce of all ranks (isFlat), the hierarchy
// in one piece, halving-doubling, recursive doubling, or the pipeline's
// five stages once. A call of several slices goes through the engine,
// which enqueues them while the caller goes on. Any goroutine may ask;
// the answer changes only as calls execute.
func (rt *router) inlineable(bytes int64) bool {
	if _, ok := rt.settledWhole(bytes); ok {
		return true // one collective, or the hierarchy's stages once, with nothing to make first
	}
	return rt.freshInlineable(bytes)
}

// freshInlineable is inlineable without wholes.
func (rt *router) freshInlineable(bytes int64) bool {
	r, _, ok := rt.known(bytes)
	impl := r.algo.impl()
	switch {
	case !ok || impl == nil:
		return false
	case impl.single():
		return rt.variantMade(r) // isFlat
	case !impl.whole() && !rt.cfg.sliceSet && bytes >= probeMinBytes && !rt.table.linksSettled():
		return false // its plan probes the links first (planWith, uncut)
	}
	return rt.shape(r, bytes, rt.table.probedLinks).slice >= bytes
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
	if r.fine {
		s = m.fineSliceBytes(rt.grid, bytes)
	}
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
	rt.fact("fairgo: measured the links", "grid", rt.grid.String(), "links", m.String())
	return &m
}

// candidateRoutes are the routes Auto chooses from at size bytes, in the
// order that breaks ties (fastest within calibrationTie of each other):
//
//   - the hierarchy in one piece (D > 1, or FlatNever): one call at a
//     time it ties with flat where flat is close, and back to back it
//     keeps its lead where flat's ring over every rank falls behind (4 × 2
//     at 1 MiB on the one-GPU testbed: 0.86 of naive with flat chosen);
//   - flat, NCCL's own choice, then its ring and its tree alone (where
//     the backend makes world variants): a tie goes to the default, which
//     needs no communicator of its own;
//   - halving-doubling, from hdMinRanks ranks up to hdMaxBytes;
//   - the rail all-to-all where D = 1: a reduce-scatter and an
//     all-gather of one step each over the machines;
//   - the rail's NCCL form in the links' slices (D > 1; candidates keeps
//     it only where the slices cut the call).
//
// FlatNever leaves out the routes over the world communicator (flat, its
// variants, halving-doubling). With D > 1 fairring's all-to-all form is not
// among them: on every testbed measured it lost to NCCL's reduce-scatter
// and all-gather on the rail or tied within noise (bench/NOTES.md), and
// each candidate costs calibration time; WithAlgorithm(RailAllToAll) still
// selects it. The list depends on the grid, the options and which world
// variants exist, so every rank gives it alike.
func (rt *router) candidateRoutes(bytes int64) []route { return rt.appendCandidateRoutes(nil, bytes) }

// maxCandidates bounds how many routes appendCandidateRoutes appends.
const maxCandidates = 8

// appendCandidateRoutes appends candidateRoutes(bytes) to rs.
func (rt *router) appendCandidateRoutes(rs []route, bytes int64) []route {
	g := rt.grid
	flatOK := rt.cfg.flatThreshold != FlatNever
	multi := g.Machines > 1
	if multi && (g.Devices > 1 || !flatOK) {
		rs = append(rs, route{algo: RailAllReduce})
	}
	if flatOK {
		rs = append(rs, route{algo: Flat})
		for _, a := range []Algorithm{FlatRing, FlatTree} {
			if rt.variantOK(a) {
				rs = append(rs, route{algo: a})
			}
		}
		if g.Size() >= hdMinRanks && bytes <= hdMaxBytes {
			rs = append(rs, route{algo: HalvingDoubling})
		}
	}
	if multi && g.Devices == 1 {
		rs = append(rs, route{algo: RailAllToAll, serial: rt.serialRail()})
	}
	if multi && g.Devices > 1 {
		rs = append(rs, route{algo: RailRSAG, serial: rt.serialRail()})
	}
	return rs
}

// candidates are the plans of candidateRoutes at size bytes, without their
// world variants (calibrate attaches them): the rail's NCCL form only where
// the links' slices cut the call. Where the link model predicts its slices
// faster than one piece by more than the tie, it comes first instead: a
// difference inside the calibration's noise is then decided by the model,
// not by the noise (on the one-GPU testbed the sliced route led by 2–9% at
// 64–256 MiB, and ties to the one piece chose it in 2 of 6 calibrations,
// bench/NOTES.md item 21). Where the links were measured (not with
// WithSliceSize), the rail in fineSlices times the model's slices comes
// just before the model's slices (last where those are no candidate): a
// tie between the two goes to the finer, which calibrated within 2% of
// the model's slices on the one-GPU testbed's 2 × 4 and then ran 64
// buckets back to back 7–12% faster (bench/NOTES.md item 122).
func (rt *router) candidates(bytes int64) []plan {
	var cs []plan
	var fine *plan
	for _, r := range rt.candidateRoutes(bytes) {
		p := rt.planFor(r, bytes)
		if r.algo == RailRSAG {
			if f := rt.finePlan(r, bytes, p); f.slice < min(p.slice, bytes) {
				fine = &f
			}
			if p.slice >= bytes {
				continue
			}
			if links := rt.table.probedLinks(); links != nil && links.slicesPay(rt.grid, bytes, p.slice) {
				cs = append([]plan{p}, cs...)
				continue
			}
		}
		cs = append(cs, p)
	}
	if fine != nil { // just before the model's slices, or last
		i := slices.IndexFunc(cs, func(p plan) bool { return p.algo == RailRSAG })
		if i < 0 {
			i = len(cs)
		}
		cs = slices.Insert(cs, i, *fine)
	}
	return cs
}

// finePlan is the plan of r in fineSlices times the model's slices, p
// itself (r's plan) where the slices do not come from measured links, and
// below calibrationAloneBytes: there a class is timed one call at a time
// too, by the fastest rank's best call, which flattered the fine slices'
// extra launches (on the one-GPU testbed's 2 × 4 they won 1 MiB's
// calibration by 7% and then ran 8% behind the hierarchy's time,
// bench/NOTES.md item 122), while the NIC binds only at larger sizes.
func (rt *router) finePlan(r route, bytes int64, p plan) plan {
	if rt.cfg.sliceSet || rt.table.probedLinks() == nil || bytes < calibrationAloneBytes {
		return p
	}
	r.fine = true
	return rt.planFor(r, bytes)
}

// calibrate measures the candidates at the size of a class and returns the
// fastest. Failures are consistent across ranks (they agree on whether to
// measure first); a class that cannot be measured gets the guess. The
// links are probed first where a candidate's slices come from them; a
// world variant is made at the first calibration that has it as a
// candidate (its cost is the Calibration's Setup), and a variant that
// could not be made is no candidate.
func (rt *router) calibrate(class int, bytes int64) (route, *Calibration) {
	lo := rt.classBase() << class
	start := time.Now()
	size := rt.classSize(class)
	if agreed, ok, err := rt.measure.agreedSize(rt.timedSize(class, bytes)); err == nil && ok {
		size = agreed
	}
	routes := rt.candidateRoutes(size)
	sliced := slices.ContainsFunc(routes, func(r route) bool { return !r.algo.impl().whole() })
	if !rt.cfg.sliceSet && sliced && size >= probeMinBytes {
		rt.linkModel() // before the timing: the sliced candidates take its slices
	}
	var cands []plan
	var setup time.Duration
	for _, p := range rt.candidates(size) {
		p, made := rt.attach(p)
		setup += made
		if p.commErr == nil {
			cands = append(cands, p)
		}
	}
	switch len(cands) {
	case 0:
		return rt.guess(), nil
	case 1:
		return cands[0].route, nil
	}
	t, err := rt.measure.timeRoutes(size, cands)
	if err != nil {
		rt.guessed.Add(1)
		rt.logger.Warn("fairgo: could not calibrate a size class; guessing",
			"class_bytes", lo, "guess", rt.guess(), "err", err)
		return rt.guess(), nil
	}
	best := choose(t, handicaps(cands, rt.grid))
	cal := &Calibration{Bytes: size, Times: map[string]time.Duration{}, Samples: map[string]int{},
		Setup: setup, Cost: time.Since(start)}
	if t.single != nil {
		cal.OneAtATime = map[string]time.Duration{}
	}
	attrs := []any{
		"class_bytes", lo,
		"measured_bytes", size,
		"choice", cands[best].String(),
		"cost", cal.Cost.Round(time.Millisecond),
	}
	if setup > 0 {
		attrs = append(attrs, "setup", setup.Round(time.Millisecond))
	}
	for i, p := range cands {
		cal.Times[p.String()] = time.Duration(t.burst[i])
		cal.Samples[p.String()] = t.samples[i]
		attrs = append(attrs, p.String()+"_us", float64(t.burst[i])/1e3)
		if t.single != nil {
			cal.OneAtATime[p.String()] = time.Duration(t.single[i])
			attrs = append(attrs, p.String()+"_one_us", float64(t.single[i])/1e3)
		}
	}
	rt.fact("fairgo: calibrated size class", attrs...)
	return cands[best].route, cal
}

// variantOK reports whether a world variant (FlatRing, FlatTree) can be a
// candidate: the backend makes them, and making this one has not failed.
func (rt *router) variantOK(a Algorithm) bool {
	if rt.measure == nil || !rt.measure.hasVariants() {
		return false
	}
	rt.worldsMu.Lock()
	defer rt.worldsMu.Unlock()
	w := rt.worlds[a.variant()]
	return w == nil || w.err == nil
}

// attach gives p its world variant where its route is one (FlatRing,
// FlatTree), making it if none is open, and returns how long making it
// took (0 when it was open already or is not needed). Where it could not
// be made, p.commErr says why: a candidate is then dropped, a call by a
// fixed algorithm fails with that error (an *fairgo.ArgError without
// backend.Rank.Variants).
func (rt *router) attach(p plan) (plan, time.Duration) {
	v := p.algo.variant()
	if v == "" {
		return p, 0
	}
	rt.worldsMu.Lock()
	w := rt.worlds[v]
	rt.worldsMu.Unlock()
	if w != nil {
		p.comm, p.commErr = w.comm, w.err
		return p, 0
	}
	start := time.Now()
	comm, err := rt.measure.world(v)
	took := time.Since(start)
	if err != nil {
		err = fmt.Errorf("hier: the world communicator of %v: %w", p.algo, err)
		rt.logger.Warn("fairgo: could not make a world variant; it is no candidate", "algorithm", p.algo.String(),
			"err", err)
	} else {
		rt.fact("fairgo: made a world variant", "algorithm", p.algo.String(),
			"setup", took.Round(time.Microsecond))
	}
	rt.worldsMu.Lock()
	rt.worlds[v] = &worldVariant{comm: comm, err: err}
	rt.worldsMu.Unlock()
	p.comm, p.commErr = comm, err
	return p, took
}

// closeUnchosen closes the world variants no size class chose, once every
// class is measured (or needs no measurement): no call will use them, and
// each holds NCCL buffers of the order of the world communicator's. A
// route table shared with another Reducer (WithRoutesOf) counts the
// classes either measured. Every rank closes alike, at the same call.
func (rt *router) closeUnchosen() {
	used := map[backend.NCCLAlgo]bool{}
	rt.table.mu.Lock()
	for c := range rt.numClasses() {
		if r, ok := rt.table.measured[c]; ok {
			used[r.algo.variant()] = true
		} else if _, _, fixed := rt.decide(rt.classBase() << c); !fixed {
			rt.table.mu.Unlock()
			return // a class still to measure may choose one
		}
	}
	rt.table.mu.Unlock()
	var errs []error
	rt.worldsMu.Lock()
	for _, v := range rt.worldOrder() {
		if w := rt.worlds[v]; w.comm != nil && !used[v] {
			errs = append(errs, w.comm.Close())
			delete(rt.worlds, v) // a later plan (a route set by hand) makes it again
			rt.fact("fairgo: closed a world variant no size class chose", "nccl_algorithm", string(v))
		}
	}
	rt.worldsMu.Unlock()
	if err := errors.Join(errs...); err != nil {
		rt.logger.Warn("fairgo: closing a world variant failed", "err", err)
	}
}

// closeWorlds closes the open world variants (the Reducer's release),
// aborting them first when the Reducer broke: work of theirs may still
// wait for a peer, which a close would wait for too.
func (rt *router) closeWorlds(broken bool) error {
	rt.worldsMu.Lock()
	defer rt.worldsMu.Unlock()
	var errs []error
	for _, v := range rt.worldOrder() {
		if w := rt.worlds[v]; w.comm != nil {
			if broken {
				errs = append(errs, w.comm.Abort())
			}
			errs = append(errs, w.comm.Close())
		}
		delete(rt.worlds, v)
	}
	return errors.Join(errs...)
}

// worldOrder is the world variants' keys in one order on every rank
// (rt.worldsMu held): NCCL's destroy of a communicator finalizes with its
// peers, so ranks that destroyed two variants in the orders of their maps
// waited on each other, one in each, until the close's grace ran out.
func (rt *router) worldOrder() []backend.NCCLAlgo {
	return slices.Sorted(maps.Keys(rt.worlds))
}

// worldComms are the world variants open now, for the Reducer's abort
// and its watch of communicator errors (any goroutine).
func (rt *router) worldComms() []backend.Comm {
	rt.worldsMu.Lock()
	defer rt.worldsMu.Unlock()
	var out []backend.Comm
	for _, a := range []Algorithm{FlatRing, FlatTree} {
		if w := rt.worlds[a.variant()]; w != nil && w.comm != nil {
			out = append(out, w.comm)
		}
	}
	return out
}

// errNoVariants is why a world variant cannot be made on a rank whose
// backend makes none.
func errNoVariants(a Algorithm) error {
	return &fairgo.ArgError{
		Arg:    "WithAlgorithm",
		Value:  a,
		Reason: "needs a backend that makes world communicators with one NCCL algorithm (backend.Rank.Variants is nil)",
	}
}

// worldContext bounds the making of a world variant by the watchdog's
// timeout, when there is one.
func worldContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout > 0 {
		return context.WithTimeout(context.Background(), timeout)
	}
	return context.WithCancel(context.Background())
}

// calibrationTie is how much slower than the fastest a candidate may be
// and still win for coming earlier in the list (flat first, then the
// simpler forms): differences inside the calibration's noise should not
// flip a choice between runs.
const calibrationTie = 0.03

// exchangeHandicap is how much faster than the other candidates an
// exchange of fairgo's own (halving-doubling, and the rail all-to-all
// where every machine has one device: an all-to-all among all ranks) must
// measure to be chosen: its score is multiplied by 1 + exchangeHandicap.
// Such an exchange is several NCCL launches of point-to-point steps a
// call, and its calibration has undershot its time in the job that
// followed by 2–5 times on machines of one GPU per rank shared by several
// processes, where NCCL's one-launch collectives measured true (8 × 1
// 64 KiB: halving-doubling calibrated at 462–522 µs, then took 1588–1762 in
// the sweep, while NCCL's tree calibrated at 454–552 took 326–433;
// bench/NOTES.md item 78). An exchange that wins by more is what it exists
// for: the latency regime of many machines.
const exchangeHandicap = 0.25

// handicaps are the factors of choose's scores for cands: 1 +
// exchangeHandicap for fairgo's own exchanges, 1 for the others.
func handicaps(cands []plan, g Grid) []float64 {
	out := make([]float64, len(cands))
	for i, p := range cands {
		out[i] = 1
		if p.algo == HalvingDoubling || (p.algo == RailAllToAll && g.Devices == 1) {
			out[i] = 1 + exchangeHandicap
		}
	}
	return out
}

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

// choose is the candidate a calibration takes: the fastest in bursts
// where that is all it timed; else the one whose worse ratio to the
// fastest, in bursts or one call at a time, is the smallest, so that
// neither a trainer's buckets back to back nor a lone call pays much for
// the other's choice. Each score is multiplied by the candidate's
// handicap (nil: none). Ties go to the earlier candidate (fastest).
func choose(t timings, handicap []float64) int {
	score := make([]int64, len(t.burst))
	if t.single == nil {
		for i, b := range t.burst {
			score[i] = int64(float64(b) * handicapOf(handicap, i))
		}
		return fastest(score)
	}
	fb, fs := max(slices.Min(t.burst), 1), max(slices.Min(t.single), 1)
	for i := range score {
		worse := max(float64(t.burst[i])/float64(fb), float64(t.single[i])/float64(fs))
		score[i] = int64(1e6 * worse * handicapOf(handicap, i))
	}
	return fastest(score)
}

func handicapOf(h []float64, i int) float64 {
	if i < len(h) {
		return h[i]
	}
	return 1
}

// Calibration is what Auto measured for one size class.
type Calibration struct {
	// Bytes is the size the candidates were timed at: the size of the
	// class's first call, agreed by every rank (1.5 times the class's
	// smallest for the last class, or where the ranks' first calls
	// differed).
	Bytes int64
	// Times is each candidate route's time (hier.Choice names): the
	// slowest rank's best of the timed runs.
	Times map[string]time.Duration
	// OneAtATime is each candidate's time for one call alone, the fastest
	// rank's best (the rank that started the call last, which waited for
	// no peer); nil for classes of 4 MiB and more, timed in bursts only.
	// Auto takes the candidate whose worse ratio to the fastest, in
	// Times or here, is the smallest.
	OneAtATime map[string]time.Duration
	// Samples is how many timed samples (bursts of calls back to back)
	// each candidate ran: fewer than the rounds for one that the first
	// round put more than twice behind the fastest in both modes.
	Samples map[string]int
	// Setup is the part of Cost spent making world variants (FlatRing,
	// FlatTree; one ncclCommSplit each), at the first calibration that
	// had them as candidates; 0 for the others.
	Setup time.Duration
	// Cost is the wall time the calibration took on this rank, Setup and
	// any link probe included: what the first call of the class waited
	// beyond its own work.
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
	// Fine: Auto chose the sliced rail in four times as many slices as the
	// link model gives (measured faster than the other candidates, or tied
	// with the model's slices), and cuts the class's calls so.
	Fine bool
	// Measured is false for a size class Auto has not measured yet (no
	// call of that size so far); Algorithm is then a guess.
	Measured bool
	// Calibration is what Auto measured to choose, nil when it did not
	// (a fixed algorithm, a class not measured yet, a failed calibration).
	Calibration *Calibration
}

// String names the choice's route: the algorithm, with "-serial" when its
// rail runs serially and "-fine" in fine slices ("rail-rsag-serial-fine").
func (c Choice) String() string { return c.route().String() }

func (c Choice) route() route { return route{algo: c.Algorithm, serial: c.Serial, fine: c.Fine} }

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
				r = rt.guess()
			}
			c.Calibration = rt.table.calibrations[class]
		}
		c.Algorithm, c.Serial, c.Fine = r.algo, r.serial, r.fine
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
		if lo >= rt.topClass() {
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
	if u := rt.uncut(c.route(), bytes, rt.table.probedLinks); u.algo != c.Algorithm {
		c.Algorithm, c.Serial, c.Fine = u.algo, u.serial, u.fine
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
