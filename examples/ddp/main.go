// Command ddp is a data-parallel training loop on fairgo, written to be
// copied: each rank trains a replica of a small MLP on its own shard of
// synthetic data and averages gradients with hier.Reducer.AllReduce.
//
// The gradients are grouped into buckets (PyTorch DDP's 25 MiB by default);
// the backward pass runs from the last layer to the first and hands each
// bucket to AllReduce(..., fairgo.Avg) as soon as its layers are done, so
// the reduction of the last layers overlaps the backward pass of the first
// ones. The optimizer step (SGD with momentum) waits on the Works. Each
// epoch prints the loss and the time per step split into compute and
// exposed communication (time spent in Wait); at the end the replicas'
// parameters are compared (an AllGather of hashes, and byte for byte when
// one process holds every rank), and ddp exits 1 unless they are identical.
//
// On the simulated cluster (the default; forward and backward run in Go on
// the host, gradients are uploaded to each rank's simulated device):
//
//	go run ./examples/ddp -machines 2 -devices 4
//
// On GPUs (-backend cuda: forward, backward, data and optimizer run as
// kernels of this example's own PTX (internal/gpu) on one compute stream per
// rank, each bucket's
// allreduce ordered after its gradients with hier.After and the optimizer
// ordered after the allreduces with Work.StreamWait; compute and exposed
// communication are timed with CUDA events), one process per GPU under
// fairrun, or one process over the GPUs of one machine:
//
//	make gpu-bin && bin/fairrun --nproc-per-node 4 --emulate-machines 2 -- bin/ddp -backend cuda
//	bin/ddp -backend cuda -machines 1 -devices 2
//
// A toy model fits in one 25 MiB bucket, which would leave nothing to
// overlap; -min-buckets (default 4) lowers the cap to the model's size
// divided by it (parameters are never split, so a large one still gets a
// bucket of its own). -min-buckets 1 keeps the plain cap; -bucket-kb sets
// a cap in KiB.
//
// -h prints the flags on stdout; a bad command line gives one message on
// stderr and exit status 2, a failure (replicas that differ included) 1.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/cli"
	"github.com/fairgo/fairgo/internal/harness"
)

// options are the command line.
type options struct {
	backend           string
	machines, devices int
	epochs, steps     int
	batch             int
	in, classes       int
	hidden, depth     int
	lr, momentum      float64
	seed              uint64
	dtype             string
	bucketMB          float64
	bucketKB          int64
	minBuckets        int
	flat              int64
	jitter            time.Duration
}

func defaults() options {
	return options{
		backend: "sim", machines: 2, devices: 4,
		epochs: 6, steps: 10, batch: 32,
		in: 64, classes: 10, hidden: 256, depth: 2,
		lr: 0.05, momentum: 0.9, seed: 1, dtype: "float32",
		bucketMB: 25, minBuckets: 4,
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// newFlags declares the flags into o, with o's values as the defaults.
func newFlags(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("ddp", flag.ContinueOnError)
	cli.Choice(
		fs,
		&o.backend,
		"backend",
		o.backend,
		"the `backend` the ranks run on: sim, or cuda (GPUs)",
		cli.OneOf("sim", "cuda"),
	)
	fs.IntVar(
		&o.machines,
		"machines",
		o.machines,
		"machines M (sim; cuda in one process; under a launcher the grid is discovered)",
	)
	fs.IntVar(&o.devices, "devices", o.devices, "devices per machine D (sim; cuda in one process: M·D GPUs)")
	fs.IntVar(&o.epochs, "epochs", o.epochs, "epochs (passes over each rank's shard)")
	fs.IntVar(&o.steps, "steps", o.steps, "steps per epoch")
	fs.IntVar(&o.batch, "batch", o.batch, "samples per rank and step")
	fs.IntVar(&o.in, "in", o.in, "input features")
	fs.IntVar(&o.classes, "classes", o.classes, "classes")
	fs.IntVar(&o.hidden, "hidden", o.hidden, "width of the hidden layers")
	fs.IntVar(&o.depth, "depth", o.depth, "number of hidden layers")
	fs.Float64Var(&o.lr, "lr", o.lr, "learning rate")
	fs.Float64Var(&o.momentum, "momentum", o.momentum, "SGD momentum")
	fs.Uint64Var(&o.seed, "seed", o.seed, "seed of the teacher, the data shards and the initialisation")
	cli.Choice(
		fs,
		&o.dtype,
		"dtype",
		o.dtype,
		"`type` the gradients are reduced in: float32 or bfloat16 (sim only)",
		cli.DType(fairgo.Float32, fairgo.BFloat16),
	)
	fs.Float64Var(&o.bucketMB, "bucket-mb", o.bucketMB, "gradient bucket cap in MiB")
	fs.Int64Var(&o.bucketKB, "bucket-kb", 0, "gradient bucket cap in KiB (overrides -bucket-mb when set)")
	fs.IntVar(
		&o.minBuckets,
		"min-buckets",
		o.minBuckets,
		"lower the bucket cap to the model size / this, for toy models (1: off)",
	)
	fs.Int64Var(
		&o.flat,
		"flat-threshold",
		0,
		"buckets smaller than this many bytes are one flat allreduce (0: fairgo's default, -1: never)",
	)
	fs.DurationVar(&o.jitter, "jitter", 0, "sim only: random delay before each device operation")
	return fs
}

// help writes the usage.
func help(w io.Writer) {
	fmt.Fprint(w, `usage: ddp [flags]

ddp trains a small MLP data-parallel on fairgo: every rank a replica on its
own shard, gradients averaged in buckets with AllReduce while the backward
pass goes on. It prints each epoch's loss and the time per step split into
compute and exposed communication, and checks at the end that the replicas
are identical. It exits 1 when they are not or on a failure, 2 on a bad
command line. -version prints fairgo's version.

flags:
`)
	o := defaults()
	fs := newFlags(&o)
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// run is the command line args (without the program name): it returns the
// exit status.
func run(args []string, stdout, stderr io.Writer) int {
	o := defaults()
	fs := newFlags(&o)
	given := cli.Given(fs)
	err := cli.Parse(fs, args)
	if err == nil {
		err = o.check(given)
	}
	if err == nil {
		_, err = demo(context.Background(), o, stdout)
	}
	return cli.Program{Name: "ddp", Help: help}.Status(err, stdout, stderr)
}

// check refuses what the flags cannot mean, before anything runs, with
// usage errors that echo the values as given (cli.Given).
func (o options) check(given map[string]string) error {
	bad := func(flag, why string) error { return cli.Usagef("-%s %s: %s", flag, given[flag], why) }
	switch {
	case o.machines < 1:
		return bad("machines", "must be at least 1")
	case o.devices < 1:
		return bad("devices", "must be at least 1")
	case o.epochs < 1:
		return bad("epochs", "must be at least 1")
	case o.steps < 1:
		return bad("steps", "must be at least 1")
	case o.batch < 1:
		return bad("batch", "must be at least 1")
	case o.in < 1:
		return bad("in", "must be at least 1")
	case o.classes < 1:
		return bad("classes", "must be at least 1")
	case o.hidden < 1:
		return bad("hidden", "must be at least 1")
	case o.depth < 0:
		return bad("depth", "negative")
	case !(o.lr > 0):
		return bad("lr", "must be > 0")
	case !(o.momentum >= 0 && o.momentum < 1):
		return bad("momentum", "must be in [0, 1)")
	case o.bucketKB < 0:
		return bad("bucket-kb", "negative")
	case o.bucketKB == 0 && !(o.bucketMB*(1<<20) >= 1):
		return bad("bucket-mb", "the bucket cap must be at least a byte")
	case o.minBuckets < 1:
		return bad("min-buckets", "must be at least 1")
	case o.jitter < 0:
		return bad("jitter", "negative")
	}
	if dt, err := fairgo.ParseDType(o.dtype); err != nil || (o.backend == "cuda" && dt != fairgo.Float32) {
		return cli.Usagef("-dtype %s: the GPU trainer (-backend cuda) communicates float32 gradients", o.dtype)
	}
	if err := hier.ValidateOptions(hier.WithFlatThreshold(o.flat)); err != nil {
		return cli.Usagef("-flat-threshold %s: %w", given["flat-threshold"], cli.Reason(err))
	}
	return nil
}

// summary is what a run ends with, for tests.
// demoConfig is the training the flags ask for: its Config, the training
// loop of the backend, the model, and a note on the bucket size.
func demoConfig(o options) (Config, trainFunc, *MLP[float32], string, error) {
	dt, err := fairgo.ParseDType(o.dtype)
	if err != nil {
		return Config{}, nil, nil, "", err
	}
	// The training loop: on the host for the simulated cluster, on the GPU
	// with the kernels of internal/gpu for the cuda backend.
	var train trainFunc = Train
	switch o.backend {
	case "sim":
	case "cuda":
		train = trainGPU
	default:
		return Config{}, nil, nil, "", fmt.Errorf("backend %q: sim or cuda", o.backend)
	}
	model, err := NewMLP[float32](o.sizes())
	if err != nil {
		return Config{}, nil, nil, "", err
	}
	nparams := len(model.Params)
	bucketCap, note, err := o.bucketBytes(nparams, dt.Size())
	if err != nil {
		return Config{}, nil, nil, "", err
	}
	cfg := Config{
		Epochs: o.epochs, Steps: o.steps, Batch: o.batch, Sizes: o.sizes(),
		LR: o.lr, Momentum: o.momentum, Seed: o.seed, DType: dt, BucketBytes: bucketCap,
	}
	if err := cfg.validate(); err != nil {
		return Config{}, nil, nil, "", err
	}
	return cfg, train, model, note, nil
}

// trainFunc trains one rank: Train on the host, trainGPU on the GPU.
type trainFunc func(
	ctx context.Context,
	cfg Config,
	r *hier.Reducer,
	mem Memory,
	onEpoch func(EpochStats),
) (*Result, error)

// trainRanks trains every rank this process drives, one goroutine each;
// world rank 0 reports each epoch on out.
func trainRanks(
	ctx context.Context,
	cfg Config,
	train trainFunc,
	reducers []*hier.Reducer,
	tb *harness.Testbed,
	out io.Writer,
) ([]*Result, error) {
	results := make([]*Result, len(reducers))
	eg, ctx := errgroup.WithContext(ctx)
	for i, r := range reducers {
		var onEpoch func(EpochStats)
		if r.WorldRank() == 0 {
			onEpoch = func(s EpochStats) {
				fmt.Fprintf(out, "epoch %d  loss %.4f  accuracy %5.1f%%  step %s = compute %s + exposed comm %s\n",
					s.Epoch, s.Loss, 100*s.Accuracy, ms(s.Compute+s.Comm), ms(s.Compute), ms(s.Comm))
			}
		}
		eg.Go(func() error {
			res, err := train(ctx, cfg, r, tb.Ranks()[i].Device, onEpoch)
			results[i] = res
			if err != nil {
				return fmt.Errorf("rank %d: %w", r.WorldRank(), err)
			}
			return nil
		})
	}
	return results, eg.Wait()

}

// compareReplicas summarises the ranks' results; in one process it compares
// the trained bytes themselves too, and joins any difference to err (the
// ranks' own ErrReplicasDiffer, or nil).
func compareReplicas(results []*Result, buckets []Bucket, err error) (*summary, error) {
	sum := &summary{Buckets: buckets, Identical: err == nil}
	for i, res := range results {
		if res == nil {
			continue
		}
		if sum.Epochs == nil {
			sum.Epochs = res.Epochs
		}
		if !bytes.Equal(res.Params, results[0].Params) {
			sum.Identical = false
			err = errors.Join(
				err,
				fmt.Errorf(
					"%w: rank %d differs from rank 0 from byte %d on",
					ErrReplicasDiffer,
					i,
					firstDiff(res.Params, results[0].Params),
				),
			)
		}
	}
	return sum, err
}

type summary struct {
	Epochs    []EpochStats
	Buckets   []Bucket
	Identical bool
}

func (o options) sizes() []int {
	s := []int{o.in}
	for range o.depth {
		s = append(s, o.hidden)
	}
	return append(s, o.classes)
}

// bucketBytes resolves the bucket cap from the flags and the model size.
func (o options) bucketBytes(nparams int, elemSize int) (bucketCap int64, note string, err error) {
	bucketCap = int64(o.bucketMB * (1 << 20))
	if o.bucketKB > 0 {
		bucketCap = o.bucketKB << 10
	}
	if bucketCap <= 0 {
		return 0, "", fmt.Errorf(
			"the bucket cap must be positive (-bucket-mb %g, -bucket-kb %d)",
			o.bucketMB,
			o.bucketKB,
		)
	}
	model := int64(nparams) * int64(elemSize)
	if o.minBuckets > 1 && model/int64(o.minBuckets) < bucketCap {
		lowered := max(model/int64(o.minBuckets), 1)
		note = fmt.Sprintf(
			" (cap %s lowered to %s = the %s model / -min-buckets %d, so that there is something to overlap)",
			size(bucketCap),
			size(lowered),
			size(model),
			o.minBuckets,
		)
		bucketCap = lowered
	}
	return bucketCap, note, nil
}

// demo trains as o says, printing on out.
func demo(ctx context.Context, o options, out io.Writer) (*summary, error) {
	cfg, train, model, note, err := demoConfig(o)
	if err != nil {
		return nil, err
	}
	dt, nparams, bucketCap := cfg.DType, len(model.Params), cfg.BucketBytes

	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	// The simulated cluster, or GPUs: one rank per process under a launcher
	// (fairrun, torchrun), else every rank of the -machines × -devices grid
	// over this process's GPUs.
	tb, err := harness.Open(
		ctx,
		o.backend,
		harness.Spec{Machines: o.machines, Devices: o.devices, Seed: int64(o.seed), Jitter: o.jitter},
	)
	if err != nil {
		return nil, err
	}
	defer tb.Close()
	// The watchdog turns a dead or diverging peer into an error instead of
	// a hang.
	reducers, err := tb.Reducers(ctx, hier.WithTimeout(2*time.Minute), hier.WithFlatThreshold(o.flat))
	if err != nil {
		return nil, err
	}
	grid := reducers[0].Grid()
	// With one process per GPU, the process of world rank 0 does the talking.
	if !slices.ContainsFunc(reducers, func(r *hier.Reducer) bool { return r.WorldRank() == 0 }) {
		out = io.Discard
	}
	fmt.Fprintf(out, "ddp: %d×%d ranks (%s), MLP %v: %d parameters, gradients in %s\n",
		grid.Machines, grid.Devices, o.backend, cfg.Sizes, nparams, dt)

	if note := harness.SimUnderLauncher(o.backend, harness.Spec{Machines: o.machines, Devices: o.devices}); note != "" {
		fmt.Fprintln(out, "ddp: "+note) // every process's own cluster has a rank 0: each says it
	}
	if o.backend == "sim" {
		fmt.Fprintf(
			out,
			"sim: all ranks share this host's %d CPUs, so the time in Wait includes waiting for the other ranks' compute\n",
			runtime.NumCPU(),
		)
	}
	// Every rank assigns the same buckets; show them once.
	buckets, err := AssignBuckets(model.ParamList(), dt.Size(), bucketCap)
	if err != nil {
		return nil, err
	}
	printBuckets(out, buckets, model.ParamList(), dt, reducers[0].FlatThreshold(), grid, note)

	start := time.Now()
	results, err := trainRanks(ctx, cfg, train, reducers, tb, out)
	if err != nil && !errors.Is(err, ErrReplicasDiffer) {
		return nil, err
	}
	sum, err := compareReplicas(results, buckets, err)
	if !sum.Identical {
		return sum, err
	}
	how := "by hash"
	if len(results) > 1 {
		how = "by hash, and byte for byte in this process"
	}
	fmt.Fprintf(out, "replicas identical: %d ranks hold the same %d parameter bytes (compared %s; trained in %s)\n",
		grid.Size(), len(results[0].Params), how, time.Since(start).Round(time.Millisecond))
	return sum, nil
}

func printBuckets(out io.Writer, bs []Bucket, ps []Param, dt fairgo.DType, flat int64, g hier.Grid, note string) {
	fmt.Fprintf(out, "buckets: %d%s, in launch order:\n", len(bs), note)
	for i, b := range bs {
		var names []string
		for _, p := range b.Params {
			names = append(names, ps[p].Name)
		}
		bytes := int64(b.Len() * dt.Size())
		path := "two-level"
		if g.Machines == 1 || (flat != hier.FlatNever && bytes < flat) {
			path = "flat (below the flat threshold)"
		}
		fmt.Fprintf(out, "  bucket %d: %8s, %s: %s\n", i, size(bytes), path, strings.Join(names, " "))
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func size(b int64) string {
	switch {
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", b>>20)
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

func ms(d time.Duration) string { return fmt.Sprintf("%6.2f ms", d.Seconds()*1000) }
