package cuda

import (
	_ "embed"
	"fmt"
	"math"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/streams"
)

// reducePTX is cuda/kernels/reduce.cu compiled by `make ptx` (nvcc -ptx
// -arch=compute_70); the driver JIT-compiles it for the GPU at Open.
//
//go:embed kernels/reduce.ptx
var reducePTX string

const blockSize = 256

type reduceKey struct {
	op fairgo.Op
	dt fairgo.DType
}

type kernels struct {
	module *Module
	reduce map[reduceKey]*Function
	fill   map[fairgo.DType]*Function
	delay  *Function
	pair   *Function
}

// ReduceKernelName is the PTX entry point of a reduction ("fg_reduce_sum_float16").
func ReduceKernelName(op fairgo.Op, dt fairgo.DType) string {
	return fmt.Sprintf("fg_reduce_%v_%v", op, dt)
}

func loadKernels(d *Device) (*kernels, error) {
	m, err := d.LoadModule([]byte(reducePTX))
	if err != nil {
		return nil, fmt.Errorf("the reduce kernels: %w", err)
	}
	k := &kernels{module: m, reduce: map[reduceKey]*Function{}, fill: map[fairgo.DType]*Function{}}
	fail := func(err error) (*kernels, error) {
		_ = m.Close()
		return nil, err
	}
	for _, dt := range fairgo.DTypes {
		for _, op := range fairgo.Ops {
			f, err := m.Function(ReduceKernelName(op, dt))
			if err != nil {
				return fail(err)
			}
			k.reduce[reduceKey{op, dt}] = f
		}
		f, err := m.Function("fg_fill_" + dt.String())
		if err != nil {
			return fail(err)
		}
		k.fill[dt] = f
	}
	if k.delay, err = m.Function("fg_delay"); err != nil {
		return fail(err)
	}
	if k.pair, err = m.Function("fg_copy_pair"); err != nil {
		return fail(err)
	}
	return k, nil
}

// launch1D enqueues f over a one-dimensional grid with 8-byte arguments.
func (d *Device) launch1D(f *Function, grid, block int, s *Stream, args ...uint64) error {
	return launch(d.ctx, f.h, f.name, [6]uint32{uint32(grid), 1, 1, uint32(block), 1, 1}, 0, s.h, args)
}

// grid sizes a grid-stride launch over count elements of dt, processed 16
// bytes per thread where the data allows.
func (d *Device) grid(count int64, dt fairgo.DType) int {
	perThread := int64(16 / dt.Size())
	items := (count + perThread - 1) / perThread
	blocks := (items + blockSize - 1) / blockSize
	return int(max(1, min(blocks, int64(d.sms)*8)))
}

// ReduceAsync enqueues the add stage's kernel on s (see backend.Device):
//
//	dst[i] = op over k in [0, n) of src[k·stride + i],  i in [0, count)
//
// with Avg dividing the sum by divisor. dst may be exactly one of the
// sources (in place), but must not partly overlap any of them.
func (d *Device) ReduceAsync(dst, src uintptr, n int, stride, count int64, dt fairgo.DType, op fairgo.Op, divisor int,
	s streams.Stream) error {
	cs, err := d.stream(s)
	if err != nil {
		return err
	}
	f, ok := d.kernels.reduce[reduceKey{op, dt}]
	switch {
	case !dt.Valid():
		return &fairgo.ArgError{Arg: "dtype", Value: dt, Reason: "unknown element type", Err: fairgo.ErrUnknownDType}
	case !op.Valid() || !ok:
		return &fairgo.ArgError{Arg: "op", Value: op, Reason: "unknown reduction operator", Err: fairgo.ErrUnknownOp}
	case n < 1:
		return &fairgo.ArgError{Arg: "sources", Value: n, Reason: "must be at least 1"}
	case count < 0:
		return &fairgo.ArgError{Arg: "count", Value: count, Reason: "negative"}
	case stride < 0:
		return &fairgo.ArgError{Arg: "stride", Value: stride, Reason: "negative"}
	case op == fairgo.Avg && divisor < 1:
		return &fairgo.ArgError{Arg: "divisor", Value: divisor, Reason: "must be at least 1 for avg"}
	case count == 0:
		return nil
	case dst == 0 || src == 0:
		return &fairgo.ArgError{Arg: "ptr", Value: "0", Reason: "null device address"}
	}
	size := int64(dt.Size())
	for k := int64(0); k < int64(n); k++ {
		a := src + uintptr(k*stride*size)
		if a != dst && a < dst+uintptr(count*size) && dst < a+uintptr(count*size) {
			return &fairgo.ArgError{
				Arg:    "dst",
				Value:  fmt.Sprintf("%#x", dst),
				Reason: fmt.Sprintf("partly overlaps source %d at %#x", k, a),
			}
		}
	}
	if op != fairgo.Avg {
		divisor = 1
	}
	return d.launch1D(
		f,
		d.grid(count, dt),
		blockSize,
		cs,
		uint64(dst),
		uint64(src),
		uint64(n),
		uint64(stride),
		uint64(count),
		uint64(divisor),
	)
}

// FillAsync enqueues t[i] = offset + scale·(i mod modulus), converted to
// t's type (integers through int64, wrapping; 16-bit floats rounded to
// nearest even). A modulus ≤ 0 means none. For tests and examples.
func (d *Device) FillAsync(t fairgo.Tensor, offset, scale float64, modulus int64, s streams.Stream) error {
	cs, err := d.stream(s)
	if err != nil {
		return err
	}
	if err := t.Validate(); err != nil {
		return err
	}
	if t.Count == 0 {
		return nil
	}
	if modulus <= 0 {
		modulus = t.Count
	}
	return d.launch1D(d.kernels.fill[t.DType], d.grid(t.Count, t.DType), blockSize, cs,
		uint64(t.Ptr), uint64(t.Count), math.Float64bits(offset), math.Float64bits(scale), uint64(modulus))
}

// CopyPairAsync enqueues two copies as one kernel (see
// backend.PairCopier): n1 bytes from src1 to dst1 and n2 bytes from src2 to
// dst2. Each address is device memory or page-locked host memory at its
// DevicePointer; no destination may overlap a source or the other
// destination.
func (d *Device) CopyPairAsync(dst1, src1 uintptr, n1 int64, dst2, src2 uintptr, n2 int64, s streams.Stream) error {
	cs, err := d.stream(s)
	if err != nil {
		return err
	}
	if err := backend.CheckCopyPair(dst1, src1, n1, dst2, src2, n2); err != nil || n1 == 0 && n2 == 0 {
		return err
	}
	return d.launch1D(d.kernels.pair, d.grid(max(n1, n2), fairgo.Uint8), blockSize, cs,
		uint64(dst1), uint64(src1), uint64(n1), uint64(dst2), uint64(src2), uint64(n2))
}

// DelayAsync enqueues a one-thread kernel that busy-waits for dur on the
// GPU clock: it holds s back, for tests of stream and event ordering.
func (d *Device) DelayAsync(dur time.Duration, s streams.Stream) error {
	cs, err := d.stream(s)
	if err != nil {
		return err
	}
	if dur <= 0 {
		return nil
	}
	return d.launch1D(d.kernels.delay, 1, 1, cs, uint64(dur.Nanoseconds()))
}
