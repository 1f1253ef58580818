package cuda

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/streams"
)

// Module is GPU code loaded on a Device: a PTX image, which the driver
// JIT-compiles for the GPU, or a cubin. A trainer keeps its own kernels in
// one (examples/ddp does); the reduce kernels of the package are one too.
// Close unloads it; the Device's Close unloads the modules still loaded.
type Module struct {
	d      *Device
	h      cModule
	closed atomic.Bool
}

// Function is a kernel of a Module (cuModuleGetFunction), valid until the
// Module is closed.
type Function struct {
	m    *Module
	h    cFunction
	name string
}

// Dim3 is the size of a launch's grid or block; a zero component means 1.
type Dim3 struct{ X, Y, Z int }

func (d Dim3) dims() ([3]uint32, error) {
	var out [3]uint32
	for i, v := range [3]int{d.X, d.Y, d.Z} {
		switch {
		case v < 0 || v > math.MaxUint32:
			return out, &fairgo.ArgError{
				Arg:    "launch dimensions",
				Value:  d,
				Reason: "each component must be in [0, 2³²)",
			}
		case v == 0:
			out[i] = 1
		default:
			out[i] = uint32(v)
		}
	}
	return out, nil
}

// LoadModule loads a PTX (text) or cubin image on the device
// (cuModuleLoadDataEx); a PTX image that does not compile fails with the
// JIT's log in the error.
func (d *Device) LoadModule(image []byte) (*Module, error) {
	if len(image) == 0 {
		return nil, &fairgo.ArgError{Arg: "module image", Value: "empty", Reason: "needs PTX or a cubin"}
	}
	if err := d.alive(); err != nil {
		return nil, err
	}
	h, log, err := moduleLoad(d.ctx, image)
	if err != nil {
		if log != "" {
			return nil, fmt.Errorf("cuda: loading a module on %v: %w; JIT log: %s", d, err, log)
		}
		return nil, fmt.Errorf("cuda: loading a module on %v: %w", d, err)
	}
	m := &Module{d: d, h: h}
	d.mu.Lock()
	if d.closed.Load() {
		d.mu.Unlock()
		return nil, errors.Join(ErrDeviceClosed, moduleUnload(d.ctx, h))
	}
	d.modules[m] = struct{}{}
	d.mu.Unlock()
	return m, nil
}

func (m *Module) alive() error {
	if m.closed.Load() {
		return fmt.Errorf("cuda: module: %w", fairgo.ErrClosed)
	}
	return m.d.alive()
}

// Function returns the kernel of that name (an extern "C" entry point).
func (m *Module) Function(name string) (*Function, error) {
	if err := m.alive(); err != nil {
		return nil, err
	}
	h, err := moduleFunction(m.d.ctx, m.h, name)
	if err != nil {
		return nil, err
	}
	return &Function{m: m, h: h, name: name}, nil
}

// Global returns the device address and size in bytes of a __device__ or
// __constant__ variable of the module (cuModuleGetGlobal).
func (m *Module) Global(name string) (uintptr, int64, error) {
	if err := m.alive(); err != nil {
		return 0, 0, err
	}
	return moduleGlobal(m.d.ctx, m.h, name)
}

// Close waits for the device's work (cuModuleUnload needs its kernels
// finished) and unloads the module. Closing twice is a no-op, and so is
// a Close after the Device's.
func (m *Module) Close() error {
	if m.closed.Load() {
		return nil
	}
	m.d.mu.Lock()
	_, mine := m.d.modules[m]
	delete(m.d.modules, m)
	m.d.mu.Unlock()
	if !mine { // the device's Close unloaded it
		m.closed.Store(true)
		return nil
	}
	return errors.Join(ctxSync(m.d.ctx), m.unload())
}

func (m *Module) unload() error {
	if !m.closed.CompareAndSwap(false, true) {
		return nil
	}
	return moduleUnload(m.d.ctx, m.h)
}

// Name is the kernel's name.
func (f *Function) Name() string { return f.name }

// Launch enqueues the kernel on s (a stream of the module's device) with
// grid × block threads, sharedBytes of dynamic shared memory and one
// argument per kernel parameter, in order. Arguments must have the kernel
// parameter's size: int8, uint8, int16, uint16, int32, uint32, float32
// (4 bytes or less), int64, uint64, float64, uintptr (a device pointer), a
// bool (1 byte) or a fairgo.Tensor (its device pointer). A Go int or uint
// is refused: its size says nothing about the kernel's parameter (int is 4
// bytes in CUDA C++), so convert it to int32 or int64.
func (f *Function) Launch(grid, block Dim3, sharedBytes int, s streams.Stream, args ...any) error {
	if err := f.m.alive(); err != nil {
		return fmt.Errorf("cuda: kernel %s: %w", f.name, err)
	}
	cs, err := f.m.d.stream(s)
	if err != nil {
		return fmt.Errorf("cuda: kernel %s: %w", f.name, err)
	}
	g, err := grid.dims()
	if err != nil {
		return fmt.Errorf("cuda: kernel %s: grid: %w", f.name, err)
	}
	b, err := block.dims()
	if err != nil {
		return fmt.Errorf("cuda: kernel %s: block: %w", f.name, err)
	}
	if sharedBytes < 0 || sharedBytes > math.MaxUint32 {
		return &fairgo.ArgError{Arg: "shared memory bytes", Value: sharedBytes, Reason: "must be in [0, 2³²)"}
	}
	slots, err := kernelArgs(args)
	if err != nil {
		return fmt.Errorf("cuda: kernel %s: %w", f.name, err)
	}
	return launch(
		f.m.d.ctx,
		f.h,
		f.name,
		[6]uint32{g[0], g[1], g[2], b[0], b[1], b[2]},
		uint32(sharedBytes),
		cs.h,
		slots,
	)
}

// kernelArgs puts each argument into the low bytes of an 8-byte slot (the
// layout a little-endian GPU reads a parameter of that size from).
func kernelArgs(args []any) ([]uint64, error) {
	if len(args) > maxKernelArgs {
		return nil, &fairgo.ArgError{
			Arg:    "kernel arguments",
			Value:  len(args),
			Reason: fmt.Sprintf("at most %d", maxKernelArgs),
		}
	}
	slots := make([]uint64, len(args))
	for i, a := range args {
		var v uint64
		switch x := a.(type) {
		case int8:
			v = uint64(uint8(x))
		case uint8:
			v = uint64(x)
		case int16:
			v = uint64(uint16(x))
		case uint16:
			v = uint64(x)
		case int32:
			v = uint64(uint32(x))
		case uint32:
			v = uint64(x)
		case int64:
			v = uint64(x)
		case uint64:
			v = x
		case float32:
			v = uint64(math.Float32bits(x))
		case float64:
			v = math.Float64bits(x)
		case uintptr:
			v = uint64(x)
		case bool:
			if x {
				v = 1
			}
		case fairgo.Tensor:
			v = uint64(x.Ptr)
		default:
			reason := "unsupported type (int8…uint64, float32, float64, uintptr, bool, fairgo.Tensor)"
			if _, ok := a.(int); ok {
				reason = "a Go int has no fixed size: pass int32 (a C int) or int64"
			} else if _, ok := a.(uint); ok {
				reason = "a Go uint has no fixed size: pass uint32 or uint64"
			}
			return nil, &fairgo.ArgError{Arg: fmt.Sprintf("kernel argument %d", i), Value: fmt.Sprintf("%T", a), Reason: reason}
		}
		slots[i] = v
	}
	return slots, nil
}
