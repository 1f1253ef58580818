package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/harness"
	"github.com/fairgo/fairgo/internal/refdata"
)

// Config is one benchmark run on a testbed.
type Config struct {
	Sizes  []int64 // bytes per call (sweep)
	DType  fairgo.DType
	Op     fairgo.Op
	Warmup int // untimed rounds of each method per point
	Iters  int // calls back to back per timed repetition (sweep)
	Reps   int // repetitions (median and spread)
	// RepBytes steadies small sizes: a repetition repeats its round (Iters
	// calls back to back, then a wait for them) until the rounds have
	// moved at least this many bytes per rank, and times the mean call.
	// 0: one round per repetition.
	RepBytes int64
	// MinRounds is the fewest rounds a repetition times, whatever
	// RepBytes asks: at the largest sizes RepBytes is one round, and a
	// point then a median of few calls, which one slow call moves by tens
	// of percent. 0 or 1: as RepBytes says.
	MinRounds int
	// WorksAtEnd waits for fairgo's Works after a repetition's last round
	// instead of after each: a round of fairgo then ends, as a baseline's
	// does, once the device has run its calls, not once the host has seen
	// each Work complete, whose poll makes ranks start the next round at
	// more different times (fairbench -work-wait end). Errors are caught
	// all the same, a repetition later at most.
	WorksAtEnd  bool
	Check       bool
	Seed        uint64
	Methods     []Method // nil: DefaultMethods (every baseline, and fairgo with its defaults)
	Buckets     int      // overlap: buckets per round
	BucketBytes int64    // overlap: bytes per bucket
	Run         string   // copied into every record: the run's label
	Label       string   // copied into every record
	Command     string   // copied into every record
	Link        string   // copied into every record (links)
	Kind        string   // record kind of sweep points (KindSweep, or KindLink)

	// Observer is told of the run and of every point as it is measured
	// (root process only); nil: nobody.
	Observer Observer
	// Progress, if set, is told of every timed step (root only).
	Progress Progress
}

// Observer follows a run: the report's table implements it.
type Observer interface {
	Start(Header)
	Point([]Record)
}

// Header is what a run knows before its first point.
type Header struct {
	Testbed harness.Info
	Config  Config
	// Fairgo is, for each fairgo method in Config.Methods order, its
	// resolved options and choices before the first call.
	Fairgo []FairgoSetup
}

// Progress counts timed steps.
type Progress interface {
	SetTotal(n int64)
	Increment()
	Close()
}

func (c *Config) defaults() error {
	if c.DType == 0 {
		c.DType = fairgo.Float32
	}
	if c.Op == 0 {
		c.Op = fairgo.Sum
	}
	if c.Methods == nil {
		c.Methods, _ = Methods(DefaultMethods, nil)
	}
	if c.Kind == "" {
		c.Kind = KindSweep
	}
	bad := func(arg string, v any, why string) error { return &fairgo.ArgError{Arg: arg, Value: v, Reason: why} }
	switch {
	case !c.DType.Valid():
		return bad("-dtype", c.DType, "unknown element type")
	case !c.Op.Valid():
		return bad("-op", c.Op, "unknown operator")
	case c.Warmup < 0:
		return bad("-w", c.Warmup, "negative")
	case c.Iters < 1:
		return bad("-n", c.Iters, "must be at least 1")
	case c.Reps < 1:
		return bad("-reps", c.Reps, "must be at least 1")
	case c.RepBytes < 0:
		return bad("-rep-bytes", c.RepBytes, "negative")
	case c.MinRounds < 0 || c.MinRounds > MaxRounds:
		return bad("-min-rounds", c.MinRounds, fmt.Sprintf("not within 0–%d", MaxRounds))
	}
	return nil
}

// run is one run's state.
type run struct {
	ctx     context.Context
	tb      *harness.Testbed
	info    harness.Info
	cfg     Config
	ranks   []*harness.Rank
	world   int
	bufs    []fairgo.Tensor
	callers []*caller
	step    int // Gather key counter
	when    string
}

// Sweep measures every method at every size, one size after another, and
// returns the records (on the root process; the others get nil).
func Sweep(ctx context.Context, tb *harness.Testbed, cfg Config) ([]Record, error) {
	r, err := newRun(ctx, tb, cfg)
	if err != nil {
		return nil, err
	}
	return r.sweep()
}

// Overlap measures rounds of cfg.Buckets calls of cfg.BucketBytes each,
// enqueued back to back, for every method: the time of a whole round.
func Overlap(ctx context.Context, tb *harness.Testbed, cfg Config) ([]Record, error) {
	if cfg.Buckets < 1 || cfg.BucketBytes < 1 {
		return nil, &fairgo.ArgError{
			Arg:    "-buckets/-bucket-bytes",
			Value:  fmt.Sprintf("%d × %d", cfg.Buckets, cfg.BucketBytes),
			Reason: "both must be positive",
		}
	}
	r, err := newRun(ctx, tb, cfg)
	if err != nil {
		return nil, err
	}
	return r.overlap()
}

func newRun(ctx context.Context, tb *harness.Testbed, cfg Config) (*run, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	info := tb.Info()
	r := &run{
		ctx:   ctx,
		tb:    tb,
		info:  info,
		cfg:   cfg,
		ranks: tb.Ranks(),
		world: info.World(),
		when:  time.Now().UTC().Format(time.RFC3339),
	}
	if len(r.ranks) == 0 {
		return nil, errors.New("bench: the testbed has no ranks in this process")
	}
	r.bufs = make([]fairgo.Tensor, len(r.ranks))
	r.callers = make([]*caller, len(r.ranks))
	for i, rk := range r.ranks {
		r.callers[i] = &caller{idx: i, rank: rk, reds: map[string]*hier.Reducer{},
			worlds: map[string]backend.Comm{}, op: cfg.Op}
	}
	// The world communicators of one NCCL algorithm, in the methods' order
	// (the same in every process: making them is collective); the testbed
	// closes them.
	for _, m := range cfg.Methods {
		algo, ok := flatAlgos[m.Name]
		if !ok {
			continue
		}
		comms, err := tb.AlgoWorld(ctx, algo)
		if err != nil {
			return nil, fmt.Errorf("bench: %s: %w", m.Name, err)
		}
		for i := range r.callers {
			r.callers[i].worlds[m.Name] = comms[i]
		}
	}
	// A Reducer per variant and rank; the testbed closes them.
	for _, m := range cfg.Methods {
		if m.Variant == nil {
			continue
		}
		opts := append(
			m.Variant.Options(),
			hier.WithTimeout(10*time.Minute),
			hier.WithInlineEnqueue(m.Variant.inline()),
		)
		reds, err := tb.ReducersOf(ctx, func(i int) []hier.Option {
			if src := m.Variant.RoutesOf; src != "" {
				return append(slices.Clone(opts), hier.WithRoutesOf(r.callers[i].reds[src]))
			}
			return opts
		})
		if err != nil {
			return nil, fmt.Errorf("bench: building the Reducers of %s: %w", m.Name, err)
		}
		for i, red := range reds {
			r.callers[i].reds[m.Name] = red
		}
	}
	return r, nil
}

// start tells the observer and the progress bar what is coming.
func (r *run) start(steps int) {
	if !r.tb.Root() {
		return
	}
	if r.cfg.Progress != nil {
		r.cfg.Progress.SetTotal(int64(steps * r.cfg.Reps * len(r.cfg.Methods)))
	}
	if r.cfg.Observer == nil {
		return
	}
	h := Header{Testbed: r.info, Config: r.cfg}
	for _, m := range r.cfg.Methods {
		if m.Variant != nil {
			h.Fairgo = append(h.Fairgo, r.fairgoSetup(m, -1))
		}
	}
	r.cfg.Observer.Start(h)
}

// fairgoSetup describes a variant's first local Reducer; bytes < 0 leaves
// Chosen empty.
func (r *run) fairgoSetup(m Method, bytes int64) FairgoSetup {
	red := r.callers[0].reds[m.Name]
	fs := FairgoSetup{Spec: m.Variant.Spec, Algorithm: m.Variant.Algorithm.String(), SliceBytes: red.SliceBytes(),
		Parallelism: resolvedPar(m.Variant.Parallelism), FlatThreshold: red.FlatThreshold(), Inline: m.Variant.inline()}
	for _, c := range red.Choices() {
		fs.Choices = append(
			fs.Choices,
			Choice{MinBytes: c.MinBytes, Algorithm: c.Algorithm.String(), Route: c.String()},
		)
	}
	if bytes >= 0 {
		c := red.ChoiceFor(bytes)
		fs.Chosen, fs.Route, fs.Calibration = c.Algorithm.String(), c.String(), calibrationOf(c.Calibration)
	}
	return fs
}

// alloc gives every local rank a buffer of count elements, plus room for
// the naive hierarchy's padding.
func (r *run) alloc(count int64) error {
	return r.tb.ForRanks(func(i int, rk *harness.Rank) error {
		t, err := rk.Alloc(count+int64(r.world), r.cfg.DType)
		if err != nil {
			return fmt.Errorf("allocating %d elements: %w", count, err)
		}
		r.bufs[i] = t
		return nil
	})
}

// rankResult is what one process reports for one point: for each method,
// the per-unit times of each repetition for each local rank, and the wrong
// elements per local rank.
type rankResult struct {
	Times [][][]float64 `json:"t"` // [method][rep][local rank] seconds per timed unit
	Wrong [][]int64     `json:"w"` // [method][local rank]; nil: not checked
	// Load is the process's CPU time and TCP counters over each method's
	// timed repetitions, [method]; Units the timed units they span.
	Load  []hostDelta `json:"l,omitempty"`
	Units int         `json:"u,omitempty"`
	// Host is where each local rank's host time went over each method's
	// timed repetitions, [method][local rank].
	Host [][]hostTimes `json:"h,omitempty"`
	// Spans are this process's ranks' kept rounds of each method, [method]
	// (nil where it has none), and Clock names the clock of their times
	// (the host's name): processes of one clock are compared by them.
	Spans []*roundSpans `json:"sp,omitempty"`
	Clock string        `json:"k,omitempty"`
}

// timeUnit runs, for every local rank at once, rounds rounds of units
// calls of enqueue, each round inside the rank's timer and waited for
// before the next, and returns each rank's mean time per call and where
// its host time went.
func (r *run) timeUnit(units, rounds int, enqueue func(c *caller) error) ([]float64, []hostTimes, error) {
	if err := r.tb.Barrier(r.ctx); err != nil {
		return nil, nil, err
	}
	out := make([]float64, len(r.ranks))
	host := make([]hostTimes, len(r.ranks))
	err := r.tb.ForRanks(func(i int, rk *harness.Rank) error {
		c := r.callers[i]
		h := &host[i]
		var total time.Duration
		for round := range rounds {
			start := time.Now()
			d, err := rk.Time(r.ctx, func() error {
				defer h.enqueued(round, start, time.Now())
				for range units {
					if err := enqueue(c); err != nil {
						return err
					}
				}
				return nil
			})
			ran := time.Now()
			if err == nil && !r.cfg.WorksAtEnd {
				err = c.wait(r.ctx)
			}
			if err != nil {
				return err
			}
			h.round(round, start, ran, time.Now())
			total += d
		}
		if r.cfg.WorksAtEnd {
			ran := time.Now()
			if err := c.wait(r.ctx); err != nil {
				return err
			}
			h.Settle += time.Since(ran).Seconds()
		}
		out[i] = total.Seconds() / float64(units*rounds)
		return nil
	})
	return out, host, err
}

// rounds is how many rounds of a repetition move RepBytes, a round moving
// bytes per rank, and at least MinRounds.
func (r *run) rounds(bytes int64) int {
	n := 1
	if r.cfg.RepBytes > 0 && bytes > 0 {
		n = int(min((r.cfg.RepBytes+bytes-1)/bytes, MaxRounds))
	}
	return max(n, r.cfg.MinRounds)
}

// MaxRounds bounds the rounds of one repetition (RepBytes over tiny sizes,
// and MinRounds).
const MaxRounds = 1 << 12

// measure runs the warm-up and the timed repetitions of every method,
// alternating (each repetition in its repOrder), with enqueue enqueueing
// one timed unit of a method.
func (r *run) measure(res *rankResult, units, rounds int, enqueue func(m Method, c *caller) error) error {
	ms := r.cfg.Methods
	res.Times = make([][][]float64, len(ms))
	for _, m := range ms {
		if r.cfg.Warmup == 0 {
			break
		}
		if _, _, err := r.timeUnit(r.cfg.Warmup, 1, func(c *caller) error { return enqueue(m, c) }); err != nil {
			return fmt.Errorf("%s warm-up: %w", m.Name, err)
		}
	}
	res.Load = make([]hostDelta, len(ms))
	res.Host = make([][]hostTimes, len(ms))
	res.Clock, _ = os.Hostname()
	res.Units = units * rounds * r.cfg.Reps
	for rep := range r.cfg.Reps {
		for _, k := range repOrder(rep, len(ms)) {
			m := ms[k]
			before := sampleHost()
			ts, host, err := r.timeUnit(units, rounds, func(c *caller) error { return enqueue(m, c) })
			if err != nil {
				return fmt.Errorf("%s: %w", m.Name, err)
			}
			res.Load[k] = res.Load[k].add(before.until(sampleHost()))
			res.Host[k] = addHostTimes(res.Host[k], host)
			res.Times[k] = append(res.Times[k], ts)
			if r.cfg.Progress != nil && r.tb.Root() {
				r.cfg.Progress.Increment()
			}
		}
	}
	res.Spans = make([]*roundSpans, len(ms))
	for k := range ms {
		res.Spans[k] = spansOf(res.Host[k])
	}
	return nil
}

// repOrder is the order in which repetition rep measures n methods: row
// rep of a Williams design (a balanced Latin square): over n repetitions
// (2n when n is odd, the rows' reversals after them) every method goes
// first equally often and follows every other method equally often. A
// method measured at the same place, or next to the same method, every
// time carries whatever that place does to it (the method before it
// leaves its communicators' connections idle, its streams' work queued,
// the host's caches): on the one-GPU testbed three identical variants ran
// 221, 228 and 260 µs at 2 × 1 256K in one process, with the order fixed
// (bench/NOTES.md item 39), and with the order only rotated and reversed,
// which keeps each method's neighbours, two variants making the same
// calls at 16 × 1 64K swapped places by ~5% when listed the other way
// (item 156). Every process derives the same order, so the ranks still
// call alike.
func repOrder(rep, n int) []int {
	out := make([]int, n)
	if n == 0 {
		return out
	}
	rows := n
	if n%2 == 1 {
		rows = 2 * n
	}
	row := rep % rows
	for j := range out {
		// The first row: 0, 1, n−1, 2, n−2, …; row r adds r to each.
		first := (j + 1) / 2
		if j%2 == 0 && j > 0 {
			first = n - j/2
		}
		out[j] = (first + row) % n
	}
	if row >= n {
		slices.Reverse(out)
	}
	return out
}

// check runs each method once on fresh inputs over every bucket and counts
// wrong elements per local rank. With one bucket the outputs of every
// method and local rank are kept and checked against one pass of the
// reference (every rank expects the same result).
func (r *run) check(res *rankResult, count, stride int64, buckets int) error {
	ms := r.cfg.Methods
	res.Wrong = make([][]int64, len(ms))
	dt, op, seed := r.cfg.DType, r.cfg.Op, r.cfg.Seed
	keep := buckets == 1
	inputs := make([][][]byte, len(r.ranks)) // [local rank][bucket]
	for i, rk := range r.ranks {
		for j := range buckets {
			inputs[i] = append(inputs[i], refdata.Input(dt, op, seed, rk.WorldRank, int64(j)*stride, count))
		}
	}
	outs := make([][][]byte, len(r.ranks)) // [local rank][method] when keep
	for k, m := range ms {
		res.Wrong[k] = make([]int64, len(r.ranks))
		err := r.tb.ForRanks(func(i int, rk *harness.Rank) error {
			for j := range buckets {
				if err := rk.Upload(r.bufs[i].Slice(int64(j)*stride, count), inputs[i][j]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s check: uploading inputs: %w", m.Name, err)
		}
		if _, _, err := r.timeUnit(1, 1, func(c *caller) error {
			for j := range buckets {
				if err := c.call(r.ctx, m, r.bucket(c, j, count, stride)); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return fmt.Errorf("%s check: %w", m.Name, err)
		}
		err = r.tb.ForRanks(func(i int, rk *harness.Rank) error {
			for j := range buckets {
				out, err := rk.Download(r.bufs[i].Slice(int64(j)*stride, count))
				if err != nil {
					return err
				}
				if keep {
					outs[i] = append(outs[i], out)
					continue
				}
				res.Wrong[k][i] += refdata.CountWrong(dt, op, seed, r.world, int64(j)*stride, [][]byte{out})[0]
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s check: %w", m.Name, err)
		}
	}
	if keep {
		wrong := countWrong(dt, op, seed, r.world, slices.Concat(outs...))
		for i := range r.ranks {
			for k := range ms {
				res.Wrong[k][i] = wrong[i*len(ms)+k]
			}
		}
	}
	return nil
}

// countWrong is refdata.CountWrong over the first elements of outs,
// checking each distinct output once: ranks usually agree to the bit.
func countWrong(dt fairgo.DType, op fairgo.Op, seed uint64, world int, outs [][]byte) []int64 {
	var distinct [][]byte
	which := make([]int, len(outs))
	for i, out := range outs {
		j := slices.IndexFunc(distinct, func(d []byte) bool { return bytes.Equal(d, out) })
		if j < 0 {
			j = len(distinct)
			distinct = append(distinct, out)
		}
		which[i] = j
	}
	wrong := refdata.CountWrong(dt, op, seed, world, 0, distinct)
	out := make([]int64, len(outs))
	for i, j := range which {
		out[i] = wrong[j]
	}
	return out
}

// bucket is bucket j of the caller's buffer, with the rest of the stride
// as room for the naive hierarchy's padding.
func (r *run) bucket(c *caller, j int, count, stride int64) fairgo.Tensor {
	buf := r.bufs[c.idx]
	t := buf.Slice(int64(j)*stride, count)
	t.Bytes = min(stride*int64(buf.DType.Size()), buf.Bytes-int64(j)*stride*int64(buf.DType.Size()))
	return t
}

// gather sends this process's result to the root and returns every
// process's (root only).
func (r *run) gather(res rankResult) ([]rankResult, error) {
	blob, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	r.step++
	blobs, err := r.tb.Gather(r.ctx, fmt.Sprintf("result/%d", r.step), blob)
	if err != nil || blobs == nil {
		return nil, err
	}
	out := make([]rankResult, len(blobs))
	for i, bl := range blobs {
		if err := json.Unmarshal(bl, &out[i]); err != nil {
			return nil, fmt.Errorf("bench: result of process %d: %w", i, err)
		}
	}
	return out, nil
}

// point measures one point (a size, or a round of buckets) and returns its
// records on the root, nil elsewhere.
func (r *run) point(proto Record, count, stride int64, buckets, units int) ([]Record, error) {
	var res rankResult
	if r.cfg.Check {
		if err := r.check(&res, count, stride, buckets); err != nil {
			return nil, err
		}
	}
	rounds := r.rounds(proto.Bytes * int64(buckets) * int64(units))
	if rounds > 1 {
		proto.Rounds, proto.WorksAtEnd = rounds, r.cfg.WorksAtEnd
	}
	err := r.measure(&res, units, rounds, func(m Method, c *caller) error {
		for j := range buckets {
			if err := c.call(r.ctx, m, r.bucket(c, j, count, stride)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	all, err := r.gather(res)
	if err != nil || all == nil {
		return nil, err
	}
	recs := r.summarize(all, proto)
	if r.cfg.Observer != nil {
		r.cfg.Observer.Point(recs)
	}
	return recs, nil
}

// summarize turns every process's result for one point into one record per
// method. A repetition's time is the mean over all ranks (and, apart, the
// slowest rank's); the record holds the median over repetitions.
func (r *run) summarize(all []rankResult, proto Record) []Record {
	var recs []Record
	for k, m := range r.cfg.Methods {
		reps := make([]float64, r.cfg.Reps)
		slowest := make([]float64, r.cfg.Reps)
		for rep := range reps {
			var sum float64
			var n int
			for _, pr := range all {
				for _, t := range pr.Times[k][rep] {
					sum += t
					n++
					slowest[rep] = max(slowest[rep], t*1e6)
				}
			}
			reps[rep] = sum / float64(max(n, 1)) * 1e6
		}
		wrong := int64(-1)
		if r.cfg.Check {
			wrong = 0
			for _, pr := range all {
				for _, w := range pr.Wrong[k] {
					wrong += w
				}
			}
		}
		rec := proto
		rec.Algorithm = m.Name
		if m.Variant != nil {
			fs := r.fairgoSetup(m, rec.Bytes)
			rec.Fairgo = &fs
		}
		rec.RepsUS = reps
		rec.TimeUS = Median(reps)
		rec.SlowestRankUS = Median(slowest)
		rec.MinUS, rec.MaxUS = slices.Min(reps), slices.Max(reps)
		rec.AlgBW, rec.BusBW = Bandwidths(rec.TotalBytes(), rec.TimeUS/1e6, rec.World())
		rec.IdealBusBW = IdealBusBW(rec.TotalBytes(), rec.Machines, rec.Devices, rec.Testbed.NICBytesPerSecond())
		rec.Wrong = wrong
		var loads []hostDelta
		for _, pr := range all {
			if k < len(pr.Load) {
				loads = append(loads, pr.Load[k])
			}
		}
		if len(loads) > 0 {
			rec.Load = sumLoad(loads, all[0].Units)
		}
		var hosts []hostTimes
		for _, pr := range all {
			if k < len(pr.Host) {
				hosts = append(hosts, pr.Host[k]...)
			}
		}
		var spans []*roundSpans
		if oneClock(all) {
			for _, pr := range all {
				if k < len(pr.Spans) {
					spans = append(spans, pr.Spans[k])
				}
			}
		}
		rec.HostUS = hostPerCall(hosts, all[0].Units, spans)
		recs = append(recs, rec)
	}
	return recs
}

// oneClock reports whether every process read its times from one clock:
// all name the same host.
func oneClock(all []rankResult) bool {
	for _, pr := range all {
		if pr.Clock == "" || pr.Clock != all[0].Clock {
			return false
		}
	}
	return len(all) > 0
}

func (r *run) proto(kind string, bytes, count int64) Record {
	i := r.info
	return Record{
		Kind:        kind,
		Run:         r.cfg.Run,
		Label:       r.cfg.Label,
		Link:        r.cfg.Link,
		Command:     r.cfg.Command,
		Backend:     i.Backend,
		SimTimings:  i.SimTimings,
		Machines:    i.Machines,
		Devices:     i.Devices,
		Processes:   i.Processes,
		Testbed:     SetupOf(i),
		Invalid:     i.Invalid(),
		DType:       r.cfg.DType.String(),
		Op:          r.cfg.Op.String(),
		Bytes:       bytes,
		Count:       count,
		Iters:       r.cfg.Iters,
		Reps:        r.cfg.Reps,
		NCCLVersion: i.NCCLVersion,
		NCCLEnv:     i.NCCLEnv,
		Host:        i.Host,
		When:        r.when,
	}
}

func (r *run) sweep() ([]Record, error) {
	es := int64(r.cfg.DType.Size())
	var maxCount int64
	for _, s := range r.cfg.Sizes {
		maxCount = max(maxCount, s/es)
	}
	if maxCount == 0 {
		return nil, &fairgo.ArgError{
			Arg:    "-e",
			Value:  slices.Max(append([]int64{0}, r.cfg.Sizes...)),
			Reason: fmt.Sprintf("no size holds one %s", r.cfg.DType),
		}
	}
	if err := r.alloc(maxCount); err != nil {
		return nil, err
	}
	r.start(len(r.cfg.Sizes))
	var recs []Record
	for _, size := range r.cfg.Sizes {
		count := size / es
		if count == 0 {
			continue
		}
		rs, err := r.point(r.proto(r.cfg.Kind, count*es, count), count, maxCount+int64(r.world), 1, r.cfg.Iters)
		if err != nil {
			return recs, fmt.Errorf("bench: size %s: %w", FormatSize(size), err)
		}
		recs = append(recs, rs...)
	}
	return recs, nil
}

func (r *run) overlap() ([]Record, error) {
	es := int64(r.cfg.DType.Size())
	count := r.cfg.BucketBytes / es
	if count == 0 {
		return nil, &fairgo.ArgError{
			Arg:    "-bucket-bytes",
			Value:  r.cfg.BucketBytes,
			Reason: fmt.Sprintf("holds no %s", r.cfg.DType),
		}
	}
	w := int64(r.world)
	stride := (count + w - 1) / w * w
	if stride == count {
		stride += w // keep buckets apart
	}
	K := r.cfg.Buckets
	if err := r.alloc(stride * int64(K)); err != nil {
		return nil, err
	}
	r.start(1)
	p := r.proto(KindOverlap, count*es, count)
	p.Buckets, p.Iters = K, 1
	recs, err := r.point(p, count, stride, K, 1)
	if err != nil {
		return recs, fmt.Errorf("bench: %d buckets of %s: %w", K, FormatSize(r.cfg.BucketBytes), err)
	}
	return recs, nil
}

func resolvedPar(p int) int {
	if p == 0 {
		return hier.DefaultParallelism
	}
	return p
}

// Median is the median of xs (NaN for none); xs is left as it was.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
