package hier

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/streams"
)

// calibrator makes the router's measurements (Auto's timing of candidate
// routes, the link probe) on the engine goroutine: collectives on every
// rank alike, whose results every rank agrees on through the world
// communicator.
type calibrator struct {
	r   *Reducer
	hdr *exchange // the exchange buffer of the ranks' times, once needed
}

// release closes the router's world variants and frees the exchange
// buffer.
func (c *calibrator) release() error {
	err := c.r.router.closeWorlds(c.r.brokenCause() != nil)
	if c.hdr == nil {
		return err
	}
	return errors.Join(err, c.hdr.release(c.r.rank.Device))
}

func (c *calibrator) hasVariants() bool { return c.r.rank.Variants != nil }

// world makes the world variant of algo (backend.Variants.World, bounded
// by the watchdog's timeout), then agrees with every rank through the
// world communicator that each made one: all ranks keep theirs, or all
// close them and fail alike, so that no rank times a candidate the
// others dropped.
func (c *calibrator) world(algo backend.NCCLAlgo) (backend.Comm, error) {
	r := c.r
	a := FlatRing
	if algo == backend.AlgoTree {
		a = FlatTree
	}
	if r.rank.Variants == nil {
		return nil, errNoVariants(a)
	}
	ctx, cancel := worldContext(r.cfg.timeout)
	comm, err := r.rank.Variants.World(ctx, algo)
	cancel()
	world := r.rank.Comms.World
	if err == nil && (comm == nil || comm.Size() != world.Size() || comm.Rank() != world.Rank()) {
		err = fmt.Errorf("the backend's %s world is not rank %d of %d", algo, world.Rank(), world.Size())
	}
	closeIt := func() error {
		if comm == nil {
			return nil
		}
		return comm.Close()
	}
	hdr, herr := c.header()
	if herr != nil {
		return nil, errors.Join(herr, err, closeIt())
	}
	ok := int64(1)
	if err != nil {
		ok = 0
	}
	agreed, aerr := c.worldMax(hdr, []int64{-ok}, r.exec.first())
	switch {
	case aerr != nil:
		return nil, errors.Join(aerr, err, closeIt())
	case err != nil:
		return nil, errors.Join(err, closeIt())
	case agreed[0] != -1:
		return nil, errors.Join(fmt.Errorf("another rank could not make its %s world", algo), closeIt())
	}
	return comm, nil
}

// agreedSize exchanges size with every rank through the world
// communicator: ok where every rank proposed the same.
func (c *calibrator) agreedSize(size int64) (int64, bool, error) {
	hdr, err := c.header()
	if err != nil {
		return 0, false, err
	}
	got, err := c.worldMax(hdr, []int64{size, -size}, c.r.exec.first())
	if err != nil {
		return 0, false, err
	}
	return size, got[0] == size && -got[1] == size, nil
}

// timings is what a calibration measured of its candidates: the time per
// call in bursts back to back, the slowest rank's best, and the time of
// one call alone where the class is timed so too (nil where not), the
// fastest rank's best (ranksAgree says why). samples counts each
// candidate's timed bursts.
type timings struct {
	burst, single []int64
	samples       []int
}

// ranksAgree is what a rank sends to worldMax so that every rank gets the
// same timings from its own bursts and singles (singles empty where none
// are timed): each burst as it is, each single negated, so that the
// element-wise maximum over ranks is the slowest rank's burst and, negated
// back by agreedTimings, the fastest rank's single.
//
// Why the fastest for one call alone: the ranks start such a call when
// each has seen the last measurement end, some tens of µs apart, and a
// rank that starts early waits for its peers inside the call's collective;
// the rank that started last times the call itself. The slowest rank's
// best timed NCCL's tree alone at 476 µs on 2 × 2 at 256 KiB, where it ran
// 229 back to back and 226–234 one call at a time in the job, and Auto
// took the hierarchy instead (bench/NOTES.md item 89). A burst's calls
// follow each other, which the start's spread touches once in four.
func ranksAgree(bursts, singles []int64) []int64 {
	out := slices.Clone(bursts)
	for _, v := range singles {
		out = append(out, -v)
	}
	return out
}

// agreedTimings reads worldMax's answer to ranksAgree of n bursts and as
// many singles where alone.
func agreedTimings(agreed []int64, n int, alone bool) (burst, single []int64) {
	burst = agreed[:n]
	if alone {
		single = make([]int64, n)
		for i, v := range agreed[n : 2*n] {
			single[i] = -v
		}
	}
	return burst, single
}

// timeRoutes runs each candidate on scratch buffers of size bytes and
// returns their timings (prune stops timing a candidate far behind after
// the first round).
//
// A sample is a burst of calls back to back (calibrationBurst: up to 4,
// each on a buffer of its own, then one wait), the way a trainer's
// gradient buckets arrive: a pipelined route overlaps one call's network
// stage with the next call's intra-machine stages, which a single call
// cannot show. Measured one call at a time on the one-GPU testbed, the
// 16 MiB class on 2 × 4 chose the rail allreduce in one piece, which then
// lost to the sliced rail back to back (bench/NOTES.md item 35). The
// other way round, at 256 KiB on 2 × 1 the bursts chose flat NCCL, which
// one call at a time took 1.6 times its tree's time (item 47). So where a
// burst has several calls, every round also times one call alone, and
// choose weighs both. Larger classes (from calibrationAloneBytes) time
// bursts only: their calls are a trainer's buckets, which come back to
// back, and a call alone there costs the calibration most.
//
// The best, not the median: the noise of a shared network is one-sided (a
// TCP retransmission timeout adds 200 ms to a call, nothing makes one
// faster than its links), and on the one-GPU testbed two of three runs of
// one candidate were hit at once, which chose the slower route by its
// median. Every candidate first runs one call untimed (NCCL sets up a
// communicator's connections for an algorithm at its first use, which
// would be timed otherwise); then calibrationRounds rounds of every
// candidate, the order rotated from round to round so that none always
// follows the same one.
func (c *calibrator) timeRoutes(size int64, cands []plan) (timings, error) {
	r := c.r
	first := r.exec.first()
	hdr, err := c.header()
	if err != nil {
		return timings{}, err
	}
	burst := calibrationBurst(size)
	alone := burst > 1 && size < calibrationAloneBytes // time single calls too
	scratch, err := c.agreedScratch(hdr, size*int64(burst), first)
	if err != nil {
		return timings{}, err
	}
	defer r.rank.Device.Free(scratch)
	watch, err := r.newStopwatch()
	if err != nil {
		return timings{}, err
	}
	defer watch.release()
	run := func(a plan, calls int) (int64, error) {
		form := c.checkForm(a, size)
		var fps []*fpSlot
		var checks []*checkSlot
		defer func() { // once the stopwatch waited for the work, or the Reducer broke
			for _, sl := range fps {
				sl.release()
			}
			for _, sl := range checks {
				sl.release()
			}
		}()
		err := watch.start(first)
		var last streams.Stream
		for k := range calls {
			if err != nil {
				break
			}
			t := fairgo.Tensor{Ptr: scratch + uintptr(int64(k)*size), Bytes: size, Count: size / 4, DType: fairgo.Float32}
			switch form {
			case checkFingerprint:
				var sl *fpSlot
				sp, _ := r.exec.stagedPlan(a, size, stagedBytes(t, r.rank.Grid.Size()))
				if sl, last, err = r.fps.enqueueTimed(t, sp, first); err == nil {
					fps = append(fps, sl)
				}
			default:
				last, err = r.exec.allReduce(t, fairgo.Sum, a, first)
				if err == nil && form == checkSeparate {
					var sl *checkSlot
					if sl, err = r.checker.enqueueTimed(); err == nil {
						checks = append(checks, sl)
					}
				}
			}
			if err == nil {
				r.hooks.calibrationCalls.Add(1)
			}
		}
		if err == nil && len(checks) > 0 { // a call completes once its check has too
			err = last.WaitEvent(checks[len(checks)-1].ev)
		}
		var took time.Duration
		if err == nil {
			took, err = watch.stop(last, fmt.Sprintf("the calibration's %v of %d × %d bytes", a, calls, size))
		}
		if err != nil {
			return 0, fmt.Errorf("timing %v at %d bytes: %w", a, size, err)
		}
		return took.Nanoseconds() / int64(calls), nil
	}
	for _, a := range cands { // warm-up: one call connects what the route uses
		if _, err := run(a, 1); err != nil {
			return timings{}, err
		}
	}
	bursts := make([][]int64, len(cands))
	singles := make([][]int64, len(cands))
	timed := make([]int, len(cands)) // the candidates still timed
	for i := range timed {
		timed[i] = i
	}
	for round := range calibrationRounds {
		for j := range timed {
			i := timed[(j+round)%len(timed)]
			d, err := run(cands[i], burst)
			if err != nil {
				return timings{}, err
			}
			bursts[i] = append(bursts[i], d)
			if !alone {
				continue
			}
			if d, err = run(cands[i], 1); err != nil {
				return timings{}, err
			}
			singles[i] = append(singles[i], d)
		}
		if round == 0 && len(timed) > 1 {
			if timed, err = c.prune(hdr, bursts, singles, first); err != nil {
				return timings{}, err
			}
		}
	}
	t := timings{samples: make([]int, len(cands))}
	burstBests := make([]int64, len(cands))
	var singleBests []int64
	for i := range cands {
		burstBests[i] = slices.Min(bursts[i])
		t.samples[i] = len(bursts[i])
		if alone {
			singleBests = append(singleBests, slices.Min(singles[i]))
		}
	}
	agreed, err := c.worldMax(hdr, ranksAgree(burstBests, singleBests), first)
	if err != nil {
		return timings{}, err
	}
	t.burst, t.single = agreedTimings(agreed, len(cands), alone)
	return t, nil
}

// checkForm is how a call's cross-rank check runs beside its data.
type checkForm int

const (
	checkNone        checkForm = iota // no check, or through shared memory: nothing to time
	checkFingerprint                  // inside the data's own collective (fingerprint.go)
	checkSeparate                     // a collective of its own on the check stream (check.go)
)

// checkForm is the check that a float32 sum of size bytes on route a
// carries, which its calibration times with it: a candidate whose plan
// takes the staged copy in one piece carries a fingerprint (as its calls
// will: fingerprintPlan), the others a separate check, which on many
// machines cost a route of several collectives more than the data
// (bench/NOTES.md item 74). Where calls are checked through shared memory
// (on one machine, and across machines through the relay) from call
// hostFirstCall on, their check costs nothing to time, but past
// relayMeshMachines a call on a route of one collective carries a
// fingerprint there too (checksByRoute).
func (c *calibrator) checkForm(a plan, size int64) checkForm {
	r := c.r
	if r.checker == nil || r.hooks.skipCheck {
		return checkNone
	}
	if r.hostCheckable() && (!r.checksByRoute() || a.algo.impl() == nil || !a.algo.impl().single()) {
		return checkNone // through shared memory, or past the mesh on a route of several exchanges (checksByRoute)
	}
	if r.fps != nil && size <= r.fps.max && fingerprintFits(fairgo.Float32, fairgo.Sum, r.rank.Grid.Size()) {
		staged := stagedBytes(fairgo.Tensor{Count: size / 4, DType: fairgo.Float32}, r.rank.Grid.Size())
		if _, ok := r.exec.stagedPlan(a, size, staged); ok {
			return checkFingerprint
		}
	}
	if r.hostCheckable() {
		return checkNone // posted for the relay
	}
	return checkSeparate
}

// prune returns the candidates worth more rounds after the first: those
// whose first sample (a burst's, the slowest rank's; a single's, the
// fastest rank's: ranksAgree) is within calibrationPrune times the
// fastest candidate's, in bursts or one call at a time (singles, empty
// where a burst is one call). A candidate slower than that wins the rounds left
// only if noise doubled its first sample, and timing it again lengthens
// the first call of the class (on the sim cluster with 11 KiB slices, the
// sliced rail took 13× flat's time and 85% of the calibration). Every rank
// keeps the same candidates: the decision is on times all ranks agreed on.
func (c *calibrator) prune(hdr *exchange, bursts, singles [][]int64, s streams.Stream) ([]int, error) {
	n := len(bursts)
	firstBursts := make([]int64, n)
	var firstSingles []int64
	for i, sm := range bursts {
		firstBursts[i] = sm[0]
		if len(singles[i]) > 0 {
			firstSingles = append(firstSingles, singles[i][0])
		}
	}
	agreed, err := c.worldMax(hdr, ranksAgree(firstBursts, firstSingles), s)
	if err != nil {
		return nil, err
	}
	burst, single := agreedTimings(agreed, n, len(firstSingles) == n)
	within := func(ts []int64, i int) bool {
		return len(ts) > i && float64(ts[i]) <= calibrationPrune*float64(slices.Min(ts))
	}
	var keep []int
	for i := range n {
		if within(burst, i) || within(single, i) {
			keep = append(keep, i)
		}
	}
	return keep, nil
}

// calibrationBurst is how many calls of size bytes one calibration sample
// makes back to back: enough to move calibrationBurstBytes, at least 1 and
// at most calibrationMaxBurst.
func calibrationBurst(size int64) int {
	if size <= 0 {
		return 1
	}
	return int(min(max(calibrationBurstBytes/size, 1), calibrationMaxBurst))
}

// agreedScratch allocates bytes of scratch memory for a measurement, once
// every rank has agreed that it could (so that all measure or none does),
// and waits for the work before it; the caller frees it.
func (c *calibrator) agreedScratch(hdr *exchange, bytes int64, s streams.Stream) (uintptr, error) {
	r := c.r
	dev := r.rank.Device
	scratch, aerr := dev.Alloc(bytes)
	ok := int64(1)
	if aerr != nil {
		ok = 0
	}
	agreed, err := c.worldMax(hdr, []int64{-ok}, s)
	if err != nil {
		return 0, errors.Join(err, freeIf(dev, scratch, aerr))
	}
	if agreed[0] != -1 {
		return 0, errors.Join(
			fmt.Errorf("a rank could not allocate %d bytes of scratch memory", bytes),
			aerr,
			freeIf(dev, scratch, aerr),
		)
	}
	if err := r.drain(); err != nil {
		return 0, errors.Join(err, dev.Free(scratch))
	}
	return scratch, nil
}

func freeIf(dev backend.Device, ptr uintptr, allocErr error) error {
	if allocErr != nil {
		return nil
	}
	return dev.Free(ptr)
}

// header is a small device buffer and its host twin for the
// measurements' exchanges, allocated at the first measurement.
func (c *calibrator) header() (*exchange, error) {
	if c.hdr != nil {
		return c.hdr, nil
	}
	const n = 8 * exchangeWords
	d := c.r.rank.Device
	dev, err := d.Alloc(n)
	if err != nil {
		return nil, err
	}
	host, err := d.AllocHost(n)
	if err != nil {
		return nil, errors.Join(err, d.Free(dev))
	}
	c.hdr = &exchange{dev: dev, host: host}
	return c.hdr, nil
}

// exchange is a device buffer and its host twin.
type exchange struct {
	dev  uintptr
	host []byte
}

func (x *exchange) release(d backend.Device) error {
	return errors.Join(d.Free(x.dev), d.FreeHost(x.host))
}

// exchangeWords is how many values worldMax exchanges at most: two per
// candidate of a calibration.
const exchangeWords = 32

// worldMax returns the element-wise maximum over all ranks of vals (at most
// exchangeWords values), through the world communicator on s, waiting for
// it.
func (c *calibrator) worldMax(x *exchange, vals []int64, s streams.Stream) ([]int64, error) {
	r := c.r
	n := len(vals)
	if n > exchangeWords {
		return nil, fmt.Errorf("hier: %d values to exchange, more than the %d the exchange holds", n, exchangeWords)
	}
	for i, v := range vals {
		binary.LittleEndian.PutUint64(x.host[8*i:], uint64(v))
	}
	host := x.host[:8*n]
	ev, err := r.events.get()
	if err != nil {
		return nil, err
	}
	defer r.events.put(ev)
	err = r.rank.Device.CopyFromHostAsync(x.dev, host, s)
	if err == nil {
		err = r.rank.Comms.World.AllReduce(x.dev, x.dev, int64(n), fairgo.Int64, fairgo.Max, s)
	}
	if err == nil {
		err = r.rank.Device.CopyToHostAsync(host, x.dev, s)
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

// stopwatch times a measurement's work, from start (recorded on the
// stream the work begins on) to stop (recorded where it ends): by the
// device's clock where the device has timing events
// (backend.EventTimer), else by the host's until it sees the end. The
// host sees a small call's end up to a nap of its wait late (item 56 of
// bench/NOTES.md): tens of µs of noise on calls Auto tells apart by as
// much.
type stopwatch struct {
	r          *Reducer
	timer      backend.EventTimer // nil: the host's clock
	begin, end streams.Event
	hostStart  time.Time
}

// newStopwatch makes a stopwatch; release frees it.
func (r *Reducer) newStopwatch() (*stopwatch, error) {
	w := &stopwatch{r: r}
	t, ok := r.rank.Device.(backend.EventTimer)
	if !ok {
		var err error
		w.end, err = r.events.get()
		return w, err
	}
	var err error
	if w.begin, err = t.NewTimingEvent(); err != nil {
		return nil, err
	}
	if w.end, err = t.NewTimingEvent(); err != nil {
		return nil, errors.Join(err, streams.Release(w.begin))
	}
	w.timer = t
	return w, nil
}

// start begins a measurement of the work enqueued next on s.
func (w *stopwatch) start(s streams.Stream) error {
	w.hostStart = time.Now()
	if w.timer == nil {
		return nil
	}
	return w.begin.Record(s)
}

// stop ends the measurement after the work enqueued so far on s, waits
// for it (what names it for the watchdog) and returns its time.
func (w *stopwatch) stop(s streams.Stream, what string) (time.Duration, error) {
	if err := w.end.Record(s); err != nil {
		return 0, err
	}
	if err := w.r.waitEvent(w.end, what); err != nil {
		return 0, err
	}
	if w.timer == nil {
		return time.Since(w.hostStart), nil
	}
	return w.timer.Elapsed(w.begin, w.end)
}

func (w *stopwatch) release() error {
	if w.timer == nil {
		w.r.events.put(w.end)
		return nil
	}
	return errors.Join(streams.Release(w.begin), streams.Release(w.end))
}

// drain waits for the work on the engine's streams.
func (r *Reducer) drain() error {
	ev, err := r.events.get()
	if err != nil {
		return err
	}
	defer r.events.put(ev)
	for st := range streams.NumStages {
		if err := ev.Record(r.exec.chain.Stream(st)); err != nil {
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
