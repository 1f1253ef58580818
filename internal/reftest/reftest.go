// Package reftest checks collective results in tests: random inputs per
// rank, an independent float64 or exact-integer reference, and a comparison
// that also demands every rank agree bit for bit.
package reftest

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/elem"
)

// The element loops of RandomInputs, ComputeReference and CheckResults run
// without the race detector's instrumentation (go:norace): they work on
// buffers the calling test owns alone (inputs before they are uploaded,
// results after they are downloaded), and instrumented they were most of
// the time of the large-count tests under -race. getFloat and setFloat are
// elem.Get and elem.Set for the floating-point types, here so that the
// loops call nothing instrumented per element.

// RandomInputs draws one input per rank, in ranges that keep the reduction
// of op finite in dt.
//
//go:norace
func RandomInputs(rng *rand.Rand, dt fairgo.DType, op fairgo.Op, ranks int, count int) [][]byte {
	out := make([][]byte, ranks)
	es := dt.Size()
	for g := range out {
		b := make([]byte, count*es)
		if dt.IsFloat() {
			for i := 0; i < count; i++ {
				v := rng.Float64()*2 - 1
				if op == fairgo.Prod {
					v = 0.9 + rng.Float64()*0.2
					if rng.IntN(2) == 0 {
						v = -v
					}
				}
				setFloat(dt, b, i, v)
			}
		} else {
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
		}
		out[g] = b
	}
	return out
}

// Reference is the expected result of an allreduce of inputs: for integers
// the exact bits, for floats a float64 value and a tolerance per element.
type Reference struct {
	bits []uint64
	val  []float64
	tol  []float64
}

//go:norace
func bitsOf(dt fairgo.DType, b []byte, i int) uint64 {
	switch dt.Size() {
	case 1:
		return uint64(b[i])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b[2*i:]))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return binary.LittleEndian.Uint64(b[8*i:])
}

//go:norace
func mask(dt fairgo.DType) uint64 {
	if dt.Size() == 8 {
		return math.MaxUint64
	}
	return 1<<(8*dt.Size()) - 1
}

// signed sign-extends a dt-wide value.
//
//go:norace
func signed(dt fairgo.DType, v uint64) int64 {
	shift := 64 - 8*dt.Size()
	return int64(v<<shift) >> shift
}

// ComputeReference computes the result independently of the engine: integer
// arithmetic wraps in the element width; floats are summed in float64 with a
// tolerance of (ranks + 2) unit roundoffs of the sum of magnitudes (of the
// product's magnitude for Prod), enough for any order of rounded partial
// results through a two-level or ring reduction.
//
//go:norace
func ComputeReference(dt fairgo.DType, op fairgo.Op, inputs [][]byte) Reference {
	ranks := len(inputs)
	n := len(inputs[0]) / dt.Size()
	var ref Reference
	if !dt.IsFloat() {
		ref.bits = make([]uint64, n)
		for i := 0; i < n; i++ {
			acc := bitsOf(dt, inputs[0], i)
			for g := 1; g < ranks; g++ {
				x := bitsOf(dt, inputs[g], i)
				switch op {
				case fairgo.Sum, fairgo.Avg:
					acc += x
				case fairgo.Prod:
					acc *= x
				case fairgo.Max, fairgo.Min:
					less := acc&mask(dt) < x&mask(dt)
					if dt.IsSigned() {
						less = signed(dt, acc) < signed(dt, x)
					}
					if less == (op == fairgo.Max) {
						acc = x
					}
				}
				acc &= mask(dt)
			}
			if op == fairgo.Avg {
				if dt.IsSigned() {
					acc = uint64(signed(dt, acc) / int64(ranks))
				} else {
					acc /= uint64(ranks)
				}
			}
			ref.bits[i] = acc & mask(dt)
		}
		return ref
	}
	u := dt.Epsilon()
	tiny := map[fairgo.DType]float64{
		fairgo.Float16: 1e-7, fairgo.BFloat16: 1e-37, fairgo.Float32: 1e-44, fairgo.Float64: 1e-300,
	}[dt] * float64(ranks)
	ref.val = make([]float64, n)
	ref.tol = make([]float64, n)
	for i := 0; i < n; i++ {
		acc, mag := getFloat(dt, inputs[0], i), math.Abs(getFloat(dt, inputs[0], i))
		for g := 1; g < ranks; g++ {
			x := getFloat(dt, inputs[g], i)
			switch op {
			case fairgo.Sum, fairgo.Avg:
				acc += x
				mag += math.Abs(x)
			case fairgo.Prod:
				acc *= x
			case fairgo.Max:
				acc = math.Max(acc, x)
			case fairgo.Min:
				acc = math.Min(acc, x)
			}
		}
		switch op {
		case fairgo.Sum:
			ref.tol[i] = float64(ranks+2)*u*mag + tiny
		case fairgo.Avg:
			acc /= float64(ranks)
			ref.tol[i] = float64(ranks+2)*u*mag/float64(ranks) + tiny
		case fairgo.Prod:
			ref.tol[i] = float64(ranks+2)*u*math.Abs(acc) + tiny
		}
		ref.val[i] = acc
	}
	return ref
}

// CheckResults returns an error describing the first rank that differs from
// rank 0 bit for bit, or the first element of rank 0 off the reference.
//
//go:norace
func CheckResults(dt fairgo.DType, ref Reference, outputs [][]byte) error {
	for g := 1; g < len(outputs); g++ {
		for i := range outputs[0] {
			if outputs[g][i] != outputs[0][i] {
				return fmt.Errorf("rank %d differs from rank 0 at byte %d (element %d)", g, i, i/dt.Size())
			}
		}
	}
	out := outputs[0]
	if ref.bits != nil {
		for i, want := range ref.bits {
			if got := bitsOf(dt, out, i); got != want {
				return fmt.Errorf("element %d: got %#x, want %#x", i, got, want)
			}
		}
		return nil
	}
	for i, want := range ref.val {
		got := getFloat(dt, out, i)
		if math.IsNaN(got) || math.Abs(got-want) > ref.tol[i] {
			return fmt.Errorf("element %d: got %v, want %v ± %v", i, got, want, ref.tol[i])
		}
	}
	return nil
}

// getFloat is elem.Get for the floating-point types.
//
//go:norace
func getFloat(dt fairgo.DType, b []byte, i int) float64 {
	switch dt {
	case fairgo.Float16:
		return float64(elem.Float16ToFloat32(binary.LittleEndian.Uint16(b[2*i:])))
	case fairgo.BFloat16:
		return float64(elem.BFloat16ToFloat32(binary.LittleEndian.Uint16(b[2*i:])))
	case fairgo.Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	case fairgo.Float64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return elem.Get(dt, b, i)
}

// setFloat is elem.Set for the floating-point types.
//
//go:norace
func setFloat(dt fairgo.DType, b []byte, i int, v float64) {
	switch dt {
	case fairgo.Float16:
		binary.LittleEndian.PutUint16(b[2*i:], elem.Float64ToFloat16(v))
	case fairgo.BFloat16:
		binary.LittleEndian.PutUint16(b[2*i:], elem.Float64ToBFloat16(v))
	case fairgo.Float32:
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
	case fairgo.Float64:
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	default:
		elem.Set(dt, b, i, v)
	}
}

// waitAllLimit bounds WaitAll. The first call of a size class may run
// Auto's calibration, every candidate timed in bursts: on a simulated world
// of 2 × 2 under the race detector, on a host whose two cores other test
// binaries shared, one class took 61 s. A hang is caught sooner elsewhere
// (the simulator's stall, the Reducers' watchdog).
const waitAllLimit = 3 * time.Minute

// WaitAll waits for every Work (waitAllLimit at most) and returns the first
// error.
func WaitAll(works []*hier.Work) error {
	ctx, cancel := context.WithTimeout(context.Background(), waitAllLimit)
	defer cancel()
	var first error
	for _, wk := range works {
		if err := wk.Wait(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}
