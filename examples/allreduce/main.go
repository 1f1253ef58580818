// Command allreduce runs one fairgo allreduce over a cluster and checks the
// result against a float64 reference computed independently on the host.
//
// Every rank's input is a pure function of (seed, rank, index), so each
// process can compute the reference for all ranks without communicating.
// On the simulated cluster (the default) one process holds every rank:
//
//	go run ./examples/allreduce -machines 3 -devices 5 -count 1000003 -dtype bfloat16 -op avg
//
// It prints "ok" and the largest error, and exits 1 on a mismatch.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/elem"
)

// testbed is where the ranks live: the simulated cluster, or GPUs.
type testbed interface {
	// Ranks returns the global ranks this process drives and their reducers.
	Ranks() ([]int, []*hier.Reducer)
	Upload(rank int, data []byte, dt fairgo.DType) (fairgo.Tensor, error)
	Download(rank int, t fairgo.Tensor) ([]byte, error)
	Close() error
}

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

// openers maps a backend name to its constructor; cuda.go adds "cuda" in
// builds with the cuda tag.
var openers = map[string]func(ctx context.Context, f flags, opts []hier.Option) (testbed, error){
	"sim": openSim,
}

func main() {
	var f flags
	flag.StringVar(&f.backend, "backend", "sim", "where the ranks run: sim, or cuda (cuda build)")
	flag.IntVar(&f.machines, "machines", 2, "machines M (sim; cuda in one process)")
	flag.IntVar(&f.devices, "devices", 2, "devices per machine D (sim; cuda in one process)")
	flag.Int64Var(&f.count, "count", 1<<20+3, "elements per rank")
	flag.StringVar(&f.dtype, "dtype", "float32", "element type: float16 bfloat16 float32 float64 int8 uint8 int32 uint32 int64 uint64")
	flag.StringVar(&f.op, "op", "sum", "reduction: sum avg max min prod")
	flag.Int64Var(&f.slice, "slice", 0, "slice size in bytes (0: default)")
	flag.Int64Var(&f.flat, "flat-threshold", 0, "flat allreduce below this many bytes (0: default, -1: never)")
	flag.Uint64Var(&f.seed, "seed", 1, "seed of the input data")
	flag.DurationVar(&f.jitter, "jitter", 0, "sim only: random delay before each device operation")
	flag.IntVar(&f.iters, "iters", 1, "allreduces to run (each checked)")
	flag.Parse()
	if err := run(f); err != nil {
		fmt.Fprintln(os.Stderr, "allreduce:", err)
		os.Exit(1)
	}
}

func run(f flags) error {
	dt, err := fairgo.ParseDType(f.dtype)
	if err != nil {
		return err
	}
	op, err := fairgo.ParseOp(f.op)
	if err != nil {
		return err
	}
	open, ok := openers[f.backend]
	if !ok {
		return fmt.Errorf("backend %q is not in this build (have %v; the cuda backend needs `go build -tags cuda`)", f.backend, keys(openers))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	opts := []hier.Option{hier.WithSliceSize(f.slice), hier.WithFlatThreshold(f.flat), hier.WithTimeout(5 * time.Minute)}
	tb, err := open(ctx, f, opts)
	if err != nil {
		return err
	}
	defer tb.Close()
	ranks, reducers := tb.Ranks()
	world := reducers[0].Grid().Size()

	var worst, worstRatio float64
	for it := 0; it < f.iters; it++ {
		seed := f.seed + uint64(it)
		ts := make([]fairgo.Tensor, len(ranks))
		for i, g := range ranks {
			if ts[i], err = tb.Upload(g, input(dt, op, seed, g, f.count), dt); err != nil {
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
		for i, g := range ranks {
			out, err := tb.Download(g, ts[i])
			if err != nil {
				return err
			}
			maxErr, ratio, err := check(dt, op, seed, world, out)
			worst, worstRatio = math.Max(worst, maxErr), math.Max(worstRatio, ratio)
			if err != nil {
				return fmt.Errorf("rank %d: %w", g, err)
			}
		}
		fmt.Printf("iteration %d: %d × %s %s on %d×%d ranks in %v\n", it, f.count, dt, op,
			reducers[0].Grid().Machines, reducers[0].Grid().Devices, elapsed.Round(time.Microsecond))
	}
	fmt.Printf("ok max_abs_error=%.3g max_error/bound=%.3g\n", worst, worstRatio)
	return nil
}

// value is the input element i of rank g: small integers for integer types
// (so the float64 reference is exact), values in [-1, 1) for floats and in
// ±[0.9, 1.1) for float products.
func value(dt fairgo.DType, op fairgo.Op, seed uint64, g int, i int64) float64 {
	h := splitmix(seed ^ splitmix(uint64(g)+0x9e37) ^ splitmix(uint64(i)*0x2545F491))
	u := float64(h>>11) / (1 << 53)
	switch {
	case dt.IsFloat() && op == fairgo.Prod:
		v := 0.9 + 0.2*u
		if h&1 == 1 {
			v = -v
		}
		return v
	case dt.IsFloat():
		return 2*u - 1
	case op == fairgo.Prod && dt.IsSigned():
		return float64(2*int(h&1) - 1)
	case op == fairgo.Prod:
		return 1
	case dt.IsSigned():
		return float64(int(h%5) - 2)
	}
	return float64(h % 3)
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func input(dt fairgo.DType, op fairgo.Op, seed uint64, g int, n int64) []byte {
	b := make([]byte, n*int64(dt.Size()))
	for i := int64(0); i < n; i++ {
		elem.Set(dt, b, int(i), value(dt, op, seed, g, i))
	}
	return b
}

// check compares out with the float64 reduction of every rank's input (as
// rounded to dt). Integers must match exactly; floats may be off by at most
// (world + 2) unit roundoffs of the sum of magnitudes (of the product for
// Prod). It returns the largest error and the largest error/bound ratio.
func check(dt fairgo.DType, op fairgo.Op, seed uint64, world int, out []byte) (float64, float64, error) {
	n := int64(len(out) / dt.Size())
	tmp := make([]byte, dt.Size())
	var worst, worstRatio float64
	for i := int64(0); i < n; i++ {
		var acc, mag float64
		for g := 0; g < world; g++ {
			elem.Set(dt, tmp, 0, value(dt, op, seed, g, i))
			x := elem.Get(dt, tmp, 0)
			switch {
			case g == 0:
				acc = x
			case op == fairgo.Sum || op == fairgo.Avg:
				acc += x
			case op == fairgo.Prod:
				acc *= x
			case op == fairgo.Max:
				acc = math.Max(acc, x)
			case op == fairgo.Min:
				acc = math.Min(acc, x)
			}
			mag += math.Abs(x)
		}
		bound := 0.0
		switch op {
		case fairgo.Sum:
			bound = float64(world+2) * dt.Epsilon() * mag
		case fairgo.Avg:
			acc /= float64(world)
			if !dt.IsFloat() {
				acc = math.Trunc(acc)
			}
			bound = float64(world+2) * dt.Epsilon() * mag / float64(world)
		case fairgo.Prod:
			bound = float64(world+2) * dt.Epsilon() * math.Abs(acc)
		}
		got := elem.Get(dt, out, int(i))
		e := math.Abs(got - acc)
		if math.IsNaN(got) || e > bound+1e-7 {
			return worst, worstRatio, fmt.Errorf("element %d: got %v, want %v (bound %.3g): %w", i, got, acc, bound, errMismatch)
		}
		worst = math.Max(worst, e)
		if bound > 0 {
			worstRatio = math.Max(worstRatio, e/bound)
		}
	}
	return worst, worstRatio, nil
}

var errMismatch = errors.New("result differs from the reference")

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
