package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/refdata"
)

// Config is one benchmark run on a testbed.
type Config struct {
	Sizes       []int64 // bytes per call (sweep)
	DType       fairgo.DType
	Op          fairgo.Op
	Warmup      int // untimed calls of each algorithm per size
	Iters       int // timed calls per repetition
	Reps        int // repetitions (median and spread)
	Check       bool
	Seed        uint64
	Algorithms  []Algorithm // nil: all
	Slice       int64       // fairgo slice size; 0: default
	FlatThresh  int64       // fairgo flat threshold; 0: default
	Parallelism []int       // fairgo parallelism settings; sweep uses the first; nil: default
	Buckets     int         // overlap: buckets per round
	BucketBytes int64       // overlap: bytes per bucket
	Label       string      // copied into every record
	Link        string      // copied into every record (links mode)
	Kind        string      // record kind for sweep rows (KindSweep, or KindLink)

	// Table receives the rows as they are measured (root process only);
	// nil prints nothing.
	Table *Table
	// Progress, if set, is told of every timed step (root only).
	Progress Progress
}

func (c *Config) defaults() error {
	if c.DType == 0 {
		c.DType = fairgo.Float32
	}
	if c.Op == 0 {
		c.Op = fairgo.Sum
	}
	if c.Algorithms == nil {
		c.Algorithms = Algorithms
	}
	if c.Kind == "" {
		c.Kind = KindSweep
	}
	if len(c.Parallelism) == 0 {
		c.Parallelism = []int{0}
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
	}
	return nil
}

// Progress counts timed steps.
type Progress interface {
	SetTotal(n int64)
	Increment()
	Close()
}

// bench is one run's state.
type bench struct {
	ctx   context.Context
	tb    Testbed
	info  Info
	cfg   Config
	ranks []Rank
	world int
	bufs  []fairgo.Tensor
	reds  map[int][]*hier.Reducer // by parallelism setting
	step  int                     // Gather key counter
	when  string
}

// Run runs the sweep mode on tb and returns the records (on the root
// process; others get nil).
func Run(ctx context.Context, tb Testbed, cfg Config) ([]Record, error) {
	b, err := newBench(ctx, tb, cfg)
	if err != nil {
		return nil, err
	}
	defer b.close()
	return b.sweep()
}

// RunOverlap runs the overlap mode: for every parallelism setting, rounds of
// cfg.Buckets calls of cfg.BucketBytes each, enqueued back to back.
func RunOverlap(ctx context.Context, tb Testbed, cfg Config) ([]Record, error) {
	if cfg.Buckets < 1 || cfg.BucketBytes < 1 {
		return nil, &fairgo.ArgError{Arg: "-buckets/-bucket-bytes", Value: fmt.Sprintf("%d × %d", cfg.Buckets, cfg.BucketBytes), Reason: "both must be positive"}
	}
	b, err := newBench(ctx, tb, cfg)
	if err != nil {
		return nil, err
	}
	defer b.close()
	return b.overlap()
}

func newBench(ctx context.Context, tb Testbed, cfg Config) (*bench, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	info := tb.Info()
	b := &bench{ctx: ctx, tb: tb, info: info, cfg: cfg, ranks: tb.Ranks(), world: info.World(),
		reds: map[int][]*hier.Reducer{}, when: time.Now().UTC().Format(time.RFC3339)}
	if len(b.ranks) == 0 {
		return nil, errors.New("bench: the testbed has no ranks in this process")
	}
	return b, nil
}

func (b *bench) close() {
	for _, rs := range b.reds {
		for _, r := range rs {
			if r != nil {
				_ = r.Close()
			}
		}
	}
}

// reducers returns (making them on first use) a Reducer per local rank with
// the given parallelism and the configured slice and flat threshold.
func (b *bench) reducers(par int) ([]*hier.Reducer, error) {
	if rs, ok := b.reds[par]; ok {
		return rs, nil
	}
	rs := make([]*hier.Reducer, len(b.ranks))
	err := b.forRanks(func(i int, r Rank) error {
		red, err := hier.NewReducer(b.ctx, r.Hier(), hier.WithSliceSize(b.cfg.Slice), hier.WithFlatThreshold(b.cfg.FlatThresh),
			hier.WithParallelism(par), hier.WithTimeout(10*time.Minute))
		rs[i] = red
		return err
	})
	b.reds[par] = rs
	if err != nil {
		return nil, fmt.Errorf("bench: building reducers: %w", err)
	}
	return rs, nil
}

// forRanks runs fn for every local rank on goroutines of its own (ranks of
// one process must enqueue concurrently: each waits for its peers).
func (b *bench) forRanks(fn func(i int, r Rank) error) error {
	errs := make([]error, len(b.ranks))
	var wg sync.WaitGroup
	for i, r := range b.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(i, r); err != nil {
				errs[i] = fmt.Errorf("rank %d: %w", r.WorldRank(), err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// alloc gives every local rank a buffer of count elements, plus room for
// the naive hierarchy's padding.
func (b *bench) alloc(count int64) error {
	return b.forRanks(func(i int, r Rank) error {
		t, err := r.Alloc(count+int64(b.world), b.cfg.DType)
		if err != nil {
			return fmt.Errorf("allocating %d elements: %w", count, err)
		}
		b.bufs[i] = t
		return nil
	})
}

// rankResult is what one process reports for one point: for each algorithm,
// the per-call times of each repetition for each local rank, and the wrong
// elements per local rank.
type rankResult struct {
	Times [][][]float64 `json:"t"` // [alg][rep][local rank] seconds per timed unit
	Wrong [][]int64     `json:"w"` // [alg][local rank]; nil: not checked
}

// timeUnit runs, for every local rank at once, units calls of enqueue
// inside the rank's timer, and returns each rank's time per unit.
func (b *bench) timeUnit(units int, enqueue func(c *caller) error, callers []*caller) ([]float64, error) {
	if err := b.tb.Barrier(b.ctx); err != nil {
		return nil, err
	}
	out := make([]float64, len(b.ranks))
	err := b.forRanks(func(i int, r Rank) error {
		c := callers[i]
		d, err := r.Time(b.ctx, func() error {
			for range units {
				if err := enqueue(c); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			err = c.wait(b.ctx)
		}
		out[i] = d.Seconds() / float64(units)
		return err
	})
	return out, err
}

func (b *bench) callers(par int) ([]*caller, error) {
	reds, err := b.reducers(par)
	if err != nil {
		return nil, err
	}
	cs := make([]*caller, len(b.ranks))
	for i, r := range b.ranks {
		cs[i] = &caller{idx: i, rank: r, red: reds[i], op: b.cfg.Op}
	}
	return cs, nil
}

// measure runs warm-up and the timed repetitions of every algorithm,
// alternating, with run enqueueing one timed unit for a caller.
func (b *bench) measure(res *rankResult, callers []*caller, run func(alg Algorithm, c *caller) error) error {
	algs := b.cfg.Algorithms
	res.Times = make([][][]float64, len(algs))
	if b.cfg.Warmup > 0 {
		for _, alg := range algs {
			if _, err := b.timeUnit(b.cfg.Warmup, func(c *caller) error { return run(alg, c) }, callers); err != nil {
				return fmt.Errorf("%v warm-up: %w", alg, err)
			}
		}
	}
	for rep := 0; rep < b.cfg.Reps; rep++ {
		for k, alg := range algs {
			ts, err := b.timeUnit(b.cfg.Iters, func(c *caller) error { return run(alg, c) }, callers)
			if err != nil {
				return fmt.Errorf("%v: %w", alg, err)
			}
			res.Times[k] = append(res.Times[k], ts)
			if b.cfg.Progress != nil {
				b.cfg.Progress.Increment()
			}
		}
	}
	return nil
}

// check runs each algorithm once on fresh inputs over every bucket and
// counts wrong elements per local rank.
func (b *bench) check(res *rankResult, callers []*caller, count, stride int64, buckets int, keep bool) error {
	algs := b.cfg.Algorithms
	res.Wrong = make([][]int64, len(algs))
	dt, op, seed := b.cfg.DType, b.cfg.Op, b.cfg.Seed
	outs := make([][][]byte, len(b.ranks)) // [local rank][alg] when keep
	for k, alg := range algs {
		res.Wrong[k] = make([]int64, len(b.ranks))
		err := b.forRanks(func(i int, r Rank) error {
			buf := b.bufs[i]
			for j := 0; j < buckets; j++ {
				t := buf.Slice(int64(j)*stride, count)
				if err := r.Upload(t, refdata.Input(dt, op, seed, r.WorldRank(), int64(j)*stride, count)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%v check: uploading inputs: %w", alg, err)
		}
		if _, err := b.timeUnit(1, func(c *caller) error {
			for j := 0; j < buckets; j++ {
				t := b.bucket(c, j, count, stride)
				if err := c.call(b.ctx, alg, t); err != nil {
					return err
				}
			}
			return nil
		}, callers); err != nil {
			return fmt.Errorf("%v check: %w", alg, err)
		}
		err = b.forRanks(func(i int, r Rank) error {
			for j := 0; j < buckets; j++ {
				out, err := r.Download(b.bufs[i].Slice(int64(j)*stride, count))
				if err != nil {
					return err
				}
				if keep {
					outs[i] = append(outs[i], out)
					continue
				}
				res.Wrong[k][i] += refdata.CountWrong(dt, op, seed, b.world, int64(j)*stride, [][]byte{out})[0]
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%v check: %w", alg, err)
		}
	}
	if keep { // one reference pass for every algorithm (buckets == 1)
		for i := range b.ranks {
			w := refdata.CountWrong(dt, op, seed, b.world, 0, outs[i])
			for k := range algs {
				res.Wrong[k][i] = w[k]
			}
		}
	}
	return nil
}

// bucket is bucket j of the caller's buffer, with the rest of the stride
// as room for the naive hierarchy's padding.
func (b *bench) bucket(c *caller, j int, count, stride int64) fairgo.Tensor {
	buf := b.bufs[c.idx]
	t := buf.Slice(int64(j)*stride, count)
	t.Bytes = min(stride*int64(buf.DType.Size()), buf.Bytes-int64(j)*stride*int64(buf.DType.Size()))
	return t
}

// gather sends this process's result to the root and returns every
// process's (root only).
func (b *bench) gather(res rankResult) ([]rankResult, error) {
	blob, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	b.step++
	blobs, err := b.tb.Gather(b.ctx, fmt.Sprintf("result/%d", b.step), blob)
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

// summarize turns every process's result for one point into one record per
// algorithm. A repetition's time is the mean over all ranks; the record
// holds the median over repetitions.
func (b *bench) summarize(all []rankResult, proto Record) []Record {
	var recs []Record
	for k, alg := range b.cfg.Algorithms {
		reps := make([]float64, b.cfg.Reps)
		for rep := range reps {
			var sum float64
			var n int
			for _, pr := range all {
				for _, t := range pr.Times[k][rep] {
					sum += t
					n++
				}
			}
			reps[rep] = sum / float64(max(n, 1)) * 1e6
		}
		wrong := int64(-1)
		if b.cfg.Check {
			wrong = 0
			for _, pr := range all {
				for _, w := range pr.Wrong[k] {
					wrong += w
				}
			}
		}
		r := proto
		r.Algorithm = alg.String()
		r.RepsUS = reps
		r.TimeUS = median(reps)
		r.MinUS, r.MaxUS = slices.Min(reps), slices.Max(reps)
		r.AlgBW, r.BusBW = Bandwidths(r.TotalBytes(), r.TimeUS/1e6, r.World())
		r.Wrong = wrong
		recs = append(recs, r)
	}
	return recs
}

func (b *bench) proto(bytes, count int64, par int, slice int64) Record {
	return Record{Kind: b.cfg.Kind, Label: b.cfg.Label, Link: b.cfg.Link, Backend: b.info.Backend, SimTimings: b.info.SimTimings,
		Machines: b.info.Machines, Devices: b.info.Devices, Processes: b.info.Processes,
		DType: b.cfg.DType.String(), Op: b.cfg.Op.String(), Bytes: bytes, Count: count, Parallelism: par, SliceBytes: slice,
		Iters: b.cfg.Iters, Reps: b.cfg.Reps, NCCLVersion: b.info.NCCLVersion, NCCLEnv: NCCLEnv(), Host: b.info.Host, When: b.when}
}

func (b *bench) sweep() ([]Record, error) {
	es := int64(b.cfg.DType.Size())
	var maxCount int64
	for _, s := range b.cfg.Sizes {
		maxCount = max(maxCount, s/es)
	}
	if maxCount == 0 {
		return nil, &fairgo.ArgError{Arg: "-e", Value: slices.Max(b.cfg.Sizes), Reason: fmt.Sprintf("no size holds one %s", b.cfg.DType)}
	}
	b.bufs = make([]fairgo.Tensor, len(b.ranks))
	if err := b.alloc(maxCount); err != nil {
		return nil, err
	}
	par := b.cfg.Parallelism[0]
	callers, err := b.callers(par)
	if err != nil {
		return nil, err
	}
	red := callers[0].red
	if b.cfg.Progress != nil {
		b.cfg.Progress.SetTotal(int64(len(b.cfg.Sizes) * b.cfg.Reps * len(b.cfg.Algorithms)))
	}
	if b.cfg.Table != nil && b.tb.Root() {
		b.cfg.Table.Header(b.info, b.cfg, red)
	}
	var recs []Record
	for _, size := range b.cfg.Sizes {
		count := size / es
		if count == 0 {
			continue
		}
		var res rankResult
		if b.cfg.Check {
			if err := b.check(&res, callers, count, maxCount+int64(b.world), 1, true); err != nil {
				return recs, fmt.Errorf("bench: size %s: %w", FormatSize(size), err)
			}
		}
		err := b.measure(&res, callers, func(alg Algorithm, c *caller) error {
			return c.call(b.ctx, alg, b.bucket(c, 0, count, maxCount+int64(b.world)))
		})
		if err != nil {
			return recs, fmt.Errorf("bench: size %s: %w", FormatSize(size), err)
		}
		all, err := b.gather(res)
		if err != nil {
			return recs, err
		}
		if all == nil {
			continue
		}
		p := b.proto(count*es, count, resolvedPar(par), red.SliceBytes())
		p.FlatThresh = red.FlatThreshold()
		rs := b.summarize(all, p)
		if b.cfg.Table != nil {
			b.cfg.Table.Row(rs)
		}
		recs = append(recs, rs...)
	}
	return recs, nil
}

func (b *bench) overlap() ([]Record, error) {
	es := int64(b.cfg.DType.Size())
	count := b.cfg.BucketBytes / es
	if count == 0 {
		return nil, &fairgo.ArgError{Arg: "-bucket-bytes", Value: b.cfg.BucketBytes, Reason: fmt.Sprintf("holds no %s", b.cfg.DType)}
	}
	w := int64(b.world)
	stride := (count + w - 1) / w * w
	if stride == count {
		stride += w // room for nothing else is needed, but keep buckets apart
	}
	K := b.cfg.Buckets
	b.bufs = make([]fairgo.Tensor, len(b.ranks))
	if err := b.alloc(stride * int64(K)); err != nil {
		return nil, err
	}
	if b.cfg.Progress != nil {
		b.cfg.Progress.SetTotal(int64(len(b.cfg.Parallelism) * b.cfg.Reps * len(b.cfg.Algorithms)))
	}
	var recs []Record
	for n, par := range b.cfg.Parallelism {
		callers, err := b.callers(par)
		if err != nil {
			return recs, err
		}
		red := callers[0].red
		if n == 0 && b.cfg.Table != nil && b.tb.Root() {
			b.cfg.Table.Header(b.info, b.cfg, red)
		}
		var res rankResult
		if b.cfg.Check {
			if err := b.check(&res, callers, count, stride, K, false); err != nil {
				return recs, fmt.Errorf("bench: parallelism %d: %w", par, err)
			}
		}
		err = b.measure(&res, callers, func(alg Algorithm, c *caller) error {
			for j := 0; j < K; j++ {
				if err := c.call(b.ctx, alg, b.bucket(c, j, count, stride)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return recs, fmt.Errorf("bench: parallelism %d: %w", par, err)
		}
		all, err := b.gather(res)
		if err != nil {
			return recs, err
		}
		if all == nil {
			continue
		}
		p := b.proto(count*es, count, resolvedPar(par), red.SliceBytes())
		p.Kind, p.Buckets, p.FlatThresh = KindOverlap, K, red.FlatThreshold()
		rs := b.summarize(all, p)
		if b.cfg.Table != nil {
			b.cfg.Table.Row(rs)
		}
		recs = append(recs, rs...)
	}
	return recs, nil
}

func resolvedPar(p int) int {
	if p == 0 {
		return hier.DefaultParallelism
	}
	return p
}

func median(xs []float64) float64 {
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
