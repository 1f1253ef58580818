// Command allreduce runs one fairgo allreduce over a cluster and checks the
// result against a float64 reference computed independently on the host.
//
// Every rank's input is a pure function of (seed, rank, index) (package
// internal/refdata), so each process can compute the reference for all ranks
// without communicating.
// On the simulated cluster (the default) one process holds every rank:
//
//	go run ./examples/allreduce -machines 3 -devices 5 -count 1000003 -dtype bfloat16 -op avg
//
// Under a launcher (fairrun, torchrun) -backend cuda runs one rank per
// process; the simulated backend cannot span processes, so each process
// runs a simulated cluster of its own, and says so first on stderr.
//
// It prints "ok" and the largest error, and exits 1 on a mismatch or a
// failure, 2 on a bad command line (one message on stderr); -h prints the
// flags on stdout.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/cli"
	"github.com/fairgo/fairgo/internal/elem"
	"github.com/fairgo/fairgo/internal/harness"
	"github.com/fairgo/fairgo/internal/refdata"
)

type flags struct {
	backend           string
	machines, devices int
	count             int64
	dtype, op         string
	slice             int64
	flat              int64
	seed              uint64
	jitter            time.Duration
	iters             int
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// newFlags declares the flags into f.
func newFlags(f *flags) *flag.FlagSet {
	fs := flag.NewFlagSet("allreduce", flag.ContinueOnError)
	cli.Choice(
		fs,
		&f.backend,
		"backend",
		"sim",
		"the `backend` the ranks run on: sim, or cuda (GPUs)",
		cli.OneOf("sim", "cuda"),
	)
	fs.IntVar(
		&f.machines,
		"machines",
		2,
		"machines M (sim; cuda in one process; under a launcher the grid is discovered)",
	)
	fs.IntVar(&f.devices, "devices", 2, "devices per machine D (sim; cuda in one process)")
	fs.Int64Var(&f.count, "count", 1<<20+3, "elements per rank")
	cli.Choice(
		fs,
		&f.dtype,
		"dtype",
		"float32",
		"element `type`: float16 bfloat16 float32 float64 int8 uint8 int32 uint32 int64 uint64",
		cli.DType(),
	)
	cli.Choice(fs, &f.op, "op", "sum", "`reduction`: sum avg max min prod", cli.Op)
	fs.Int64Var(&f.slice, "slice", 0, "slice size in bytes (0: default)")
	fs.Int64Var(&f.flat, "flat-threshold", 0, "flat allreduce below this many bytes (0: default, -1: never)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the input data")
	fs.DurationVar(&f.jitter, "jitter", 0, "sim only: random delay before each device operation")
	fs.IntVar(&f.iters, "iters", 1, "allreduces to run, at least 1 (each checked)")
	return fs
}

// help writes the usage.
func help(w io.Writer) {
	fmt.Fprint(w, `usage: allreduce [flags]

allreduce runs fairgo allreduces over a cluster (the simulated one, or GPUs
with -backend cuda) and checks every rank's result against a float64
reference. It prints "ok" and the largest error; it exits 1 on a mismatch or
a failure, 2 on a bad command line. -version prints fairgo's version.

flags:
`)
	fs := newFlags(new(flags))
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// run is the command line args (without the program name): it returns the
// exit status.
func run(args []string, stdout, stderr io.Writer) int {
	var f flags
	fs := newFlags(&f)
	given := cli.Given(fs)
	err := cli.Parse(fs, args)
	if err == nil {
		err = f.check(given)
	}
	if err == nil {
		// Under a launcher the simulated backend still holds every rank in
		// this process: say so, or two workers look like one job.
		note := harness.SimUnderLauncher(f.backend, harness.Spec{Machines: f.machines, Devices: f.devices})
		if note != "" {
			fmt.Fprintln(stderr, "allreduce: "+note)
		}
		err = reduce(f, stdout)
	}
	return cli.Program{Name: "allreduce", Help: help}.Status(err, stdout, stderr)
}

// check refuses what the flags cannot mean, with usage errors that echo
// the value as given (cli.Given).
func (f flags) check(givenText map[string]string) error {
	given := func(name string) string { return givenText[name] }
	switch {
	case f.machines < 1:
		return cli.Usagef("-machines %s: must be at least 1", given("machines"))
	case f.devices < 1:
		return cli.Usagef("-devices %s: must be at least 1", given("devices"))
	case f.count < 0:
		return cli.Usagef("-count %s: negative", given("count"))
	case f.iters < 1:
		return cli.Usagef(
			"-iters %s: must be at least 1 (ok means every iteration's allreduce was checked)",
			given("iters"),
		)
	case f.jitter < 0:
		return cli.Usagef("-jitter %s: negative", given("jitter"))
	}
	if err := hier.ValidateOptions(hier.WithSliceSize(f.slice)); err != nil {
		return cli.Usagef("-slice %s: %w", given("slice"), cli.Reason(err))
	}
	if err := hier.ValidateOptions(hier.WithFlatThreshold(f.flat)); err != nil {
		return cli.Usagef("-flat-threshold %s: %w", given("flat-threshold"), cli.Reason(err))
	}
	return nil
}

// reduce runs the allreduces f describes and checks them, printing on
// stdout.
func reduce(f flags, stdout io.Writer) error {
	dt, err := fairgo.ParseDType(f.dtype)
	if err != nil {
		return err
	}
	op, err := fairgo.ParseOp(f.op)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// The simulated cluster, or GPUs: one rank per process under a launcher
	// (fairrun, torchrun), else every rank of the -machines × -devices grid
	// over this process's GPUs.
	tb, err := harness.Open(
		ctx,
		f.backend,
		harness.Spec{Machines: f.machines, Devices: f.devices, Seed: int64(f.seed), Jitter: f.jitter},
	)
	if err != nil {
		return err
	}
	defer tb.Close()
	reducers, err := tb.Reducers(
		ctx,
		hier.WithSliceSize(f.slice),
		hier.WithFlatThreshold(f.flat),
		hier.WithTimeout(5*time.Minute),
	)
	if err != nil {
		return err
	}
	ranks := tb.Ranks()
	if tb.Info().Backend != "sim" {
		for _, r := range reducers {
			fmt.Fprintf(stdout, "rank %d: grid %v on %v\n", r.WorldRank(), r.Grid(), r.Device())
		}
	}
	world := reducers[0].Grid().Size()

	var worst, worstRatio float64
	for it := 0; it < f.iters; it++ {
		seed := f.seed + uint64(it)
		ts := make([]fairgo.Tensor, len(ranks))
		for i, r := range ranks {
			if ts[i], err = r.Alloc(f.count, dt); err != nil {
				return err
			}
			if err := r.Upload(ts[i], refdata.Input(dt, op, seed, r.WorldRank, 0, f.count)); err != nil {
				return err
			}
		}
		start := time.Now()
		works := make([]*hier.Work, len(ranks))
		for i, r := range reducers {
			works[i] = r.AllReduce(ctx, ts[i], op)
		}
		for _, w := range works {
			if err := w.Wait(ctx); err != nil {
				return err
			}
		}
		elapsed := time.Since(start)
		for i, r := range ranks {
			out, err := r.Download(ts[i])
			if err != nil {
				return err
			}
			maxErr, ratio, err := check(dt, op, seed, world, out)
			worst, worstRatio = math.Max(worst, maxErr), math.Max(worstRatio, ratio)
			if err != nil {
				return fmt.Errorf("rank %d: %w", r.WorldRank, err)
			}
		}
		fmt.Fprintf(stdout, "iteration %d: %d × %s %s on %d×%d ranks in %v\n", it, f.count, dt, op,
			reducers[0].Grid().Machines, reducers[0].Grid().Devices, elapsed.Round(time.Microsecond))
	}
	fmt.Fprintf(stdout, "ok max_abs_error=%.3g max_error/bound=%.3g\n", worst, worstRatio)
	return nil
}

// check compares out with the float64 reduction of every rank's input (as
// rounded to dt; refdata.Expected gives it and the error allowed: none for
// integers, (world + 2) unit roundoffs of the sum of magnitudes for floats).
// It returns the largest error and the largest error/bound ratio.
func check(dt fairgo.DType, op fairgo.Op, seed uint64, world int, out []byte) (float64, float64, error) {
	n := int64(len(out) / dt.Size())
	var worst, worstRatio float64
	for i := int64(0); i < n; i++ {
		want, bound := refdata.Expected(dt, op, seed, world, i)
		got := elem.Get(dt, out, int(i))
		if !refdata.Within(got, want, bound) {
			return worst, worstRatio, fmt.Errorf(
				"element %d: got %v, want %v (bound %.3g): %w",
				i,
				got,
				want,
				bound,
				errMismatch,
			)
		}
		e := math.Abs(got - want)
		worst = math.Max(worst, e)
		if bound > 0 {
			worstRatio = math.Max(worstRatio, e/bound)
		}
	}
	return worst, worstRatio, nil
}

var errMismatch = errors.New("result differs from the reference")
