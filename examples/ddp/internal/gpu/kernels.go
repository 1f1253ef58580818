package gpu

import (
	_ "embed"
	"errors"
	"fmt"
	"math"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/cuda"
	"github.com/fairgo/fairgo/streams"
)

// trainPTX is train.cu compiled by `make ptx` (nvcc -ptx -arch=compute_70);
// LoadKernels has the driver JIT-compile it.
//
//go:embed train.ptx
var trainPTX string

// The entry points of train.ptx.
var trainKernelNames = []string{
	"fg_t_matmul", "fg_t_bias_act", "fg_t_relu_mask", "fg_t_colsum", "fg_t_softmax_xent",
	"fg_t_stats", "fg_t_sgd", "fg_t_gen_inputs", "fg_t_gen_labels",
}

const (
	matmulTile = 16
	blockSize  = 256 // threads per block of the one-dimensional kernels
)

// Kernels holds the float32 training kernels of train.cu on one Device: the
// pieces of a multi-layer perceptron (matrix products, bias and ReLU, the
// softmax cross-entropy), SGD with momentum and a synthetic data
// generator, for examples/ddp and for trainers that want a GPU step with no
// host copies. Every method validates its arguments and enqueues one kernel
// on s (a *cuda.Stream of the same Device), returning at once. Matrices are
// row-major float32 tensors holding at least the elements their dimensions
// say. The kernels are deterministic: the same inputs give the same bits.
//
// Methods may be called from any goroutine. Close unloads the kernels; the
// Device must outlive the Kernels.
type Kernels struct {
	d      *cuda.Device
	module *cuda.Module
	fn     map[string]*cuda.Function
}

// ErrClosed is returned for a launch after Close.
var ErrClosed = fmt.Errorf("gpu: training kernels closed: %w", fairgo.ErrClosed)

// LoadKernels loads the training kernels on d, through the library's
// module loader (cuda.Device.LoadModule).
func LoadKernels(d *cuda.Device) (*Kernels, error) {
	if d == nil {
		return nil, &fairgo.ArgError{Arg: "device", Value: "nil", Reason: "no device"}
	}
	m, err := d.LoadModule([]byte(trainPTX))
	if err != nil {
		return nil, fmt.Errorf("gpu: the training kernels: %w", err)
	}
	ks := &Kernels{d: d, module: m, fn: map[string]*cuda.Function{}}
	for _, name := range trainKernelNames {
		f, err := m.Function(name)
		if err != nil {
			return nil, fmt.Errorf("gpu: %v: %w", d, errors.Join(err, m.Close()))
		}
		ks.fn[name] = f
	}
	return ks, nil
}

// Device is the GPU the kernels are loaded on.
func (ks *Kernels) Device() *cuda.Device { return ks.d }

// Close unloads the kernels (after the device's work has finished, as
// cuModuleUnload requires). Later calls do nothing, and so does a Close
// after the Device's, which unloaded them.
func (ks *Kernels) Close() error { return ks.module.Close() }

func (ks *Kernels) launch(name string, gx, gy, bx, by int, s streams.Stream, args ...any) error {
	err := ks.fn[name].Launch(cuda.Dim3{X: gx, Y: gy}, cuda.Dim3{X: bx, Y: by}, 0, s, args...)
	if errors.Is(err, fairgo.ErrClosed) && !errors.Is(err, cuda.ErrDeviceClosed) {
		return fmt.Errorf("gpu: training kernel %s: %w", name, ErrClosed)
	}
	if err != nil {
		return fmt.Errorf("gpu: %v: %w", ks.d, err)
	}
	return nil
}

// grid1 sizes a one-dimensional launch of n threads (grid-stride kernels
// are capped at 8 blocks per SM).
func (ks *Kernels) grid1(n int64, strided bool) int {
	blocks := (n + blockSize - 1) / blockSize
	if strided {
		blocks = min(blocks, int64(ks.d.Multiprocessors())*8)
	}
	return int(max(1, blocks))
}

// need checks that x is a valid tensor of dt holding at least n elements.
func need(kernel, arg string, x fairgo.Tensor, dt fairgo.DType, n int64) error {
	bad := func(reason string) error {
		return fmt.Errorf("gpu: training kernel %s: %w", kernel, &fairgo.ArgError{Arg: arg, Value: x, Reason: reason})
	}
	switch {
	case x.DType != dt:
		return bad(fmt.Sprintf("must be %v", dt))
	case x.Ptr == 0:
		return bad("null device address")
	case x.Count < n:
		return bad(fmt.Sprintf("holds %d elements, needs %d", x.Count, n))
	}
	if err := x.Validate(); err != nil {
		return fmt.Errorf("gpu: training kernel %s: %s: %w", kernel, arg, err)
	}
	return nil
}

func dims(kernel string, names string, vals ...int) error {
	for _, v := range vals {
		if v < 1 || int64(v) > math.MaxInt32 {
			return fmt.Errorf("gpu: training kernel %s: %w", kernel,
				&fairgo.ArgError{Arg: names, Value: vals, Reason: "dimensions must be in [1, 2³¹)"})
		}
	}
	return nil
}

// flag is a kernel's int flag.
func flag(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// MatMul enqueues c = op(a)·op(b), c being m×n and the inner dimension k:
// a is m×k, or k×m when transA (c = aᵀ·b); b is k×n, or n×k when transB
// (c = a·bᵀ). c must not overlap a or b.
func (ks *Kernels) MatMul(c, a, b fairgo.Tensor, m, n, k int, transA, transB bool, s streams.Stream) error {
	const name = "fg_t_matmul"
	if err := dims(name, "m, n, k", m, n, k); err != nil {
		return err
	}
	mn, mk, kn := int64(m)*int64(n), int64(m)*int64(k), int64(k)*int64(n)
	if err := errors.Join(need(name, "c", c, fairgo.Float32, mn), need(name, "a", a, fairgo.Float32, mk),
		need(name, "b", b, fairgo.Float32, kn)); err != nil {
		return err
	}
	if overlaps(c, a, mn, mk) || overlaps(c, b, mn, kn) {
		return fmt.Errorf(
			"gpu: training kernel %s: %w",
			name,
			&fairgo.ArgError{Arg: "c", Value: c, Reason: "overlaps an operand"},
		)
	}
	gx, gy := (n+matmulTile-1)/matmulTile, (m+matmulTile-1)/matmulTile
	if gy > 65535 {
		return fmt.Errorf(
			"gpu: training kernel %s: %w",
			name,
			&fairgo.ArgError{Arg: "m", Value: m, Reason: "more rows than a grid's y dimension covers (65535·16)"},
		)
	}
	return ks.launch(name, gx, gy, matmulTile, matmulTile, s,
		c, a, b, int32(m), int32(n), int32(k), flag(transA), flag(transB))
}

func overlaps(x, y fairgo.Tensor, nx, ny int64) bool {
	return x.Ptr < y.Ptr+uintptr(ny*4) && y.Ptr < x.Ptr+uintptr(nx*4)
}

// BiasAct enqueues z[r][c] += bias[c] over a rows×cols z, then, when relu,
// z = max(z, 0).
func (ks *Kernels) BiasAct(z, bias fairgo.Tensor, rows, cols int, relu bool, s streams.Stream) error {
	const name = "fg_t_bias_act"
	if err := dims(name, "rows, cols", rows, cols); err != nil {
		return err
	}
	n := int64(rows) * int64(cols)
	if err := errors.Join(need(name, "z", z, fairgo.Float32, n),
		need(name, "bias", bias, fairgo.Float32, int64(cols))); err != nil {
		return err
	}
	return ks.launch(name, ks.grid1(n, true), 1, blockSize, 1, s, z, bias, int32(rows), int32(cols), flag(relu))
}

// ReLUMask enqueues the ReLU's backward pass: da[i] = 0 wherever the ReLU's
// output a[i] is not positive, over da's elements.
func (ks *Kernels) ReLUMask(da, a fairgo.Tensor, s streams.Stream) error {
	const name = "fg_t_relu_mask"
	if err := errors.Join(need(name, "da", da, fairgo.Float32, 1),
		need(name, "a", a, fairgo.Float32, da.Count)); err != nil {
		return err
	}
	return ks.launch(name, ks.grid1(da.Count, true), 1, blockSize, 1, s, da, a, da.Count)
}

// ColSum enqueues out[c] = Σ_r m[r][c] over a rows×cols m (the bias
// gradient), summing rows in order.
func (ks *Kernels) ColSum(out, m fairgo.Tensor, rows, cols int, s streams.Stream) error {
	const name = "fg_t_colsum"
	if err := dims(name, "rows, cols", rows, cols); err != nil {
		return err
	}
	if err := errors.Join(need(name, "out", out, fairgo.Float32, int64(cols)),
		need(name, "m", m, fairgo.Float32, int64(rows)*int64(cols))); err != nil {
		return err
	}
	return ks.launch(name, ks.grid1(int64(cols), false), 1, blockSize, 1, s, out, m, int32(rows), int32(cols))
}

// SoftmaxXent enqueues the softmax cross-entropy of rows×classes logits
// against int32 labels in [0, classes), computed in float64 per row:
// loss[r] = logsumexp(logits[r]) − logits[r][y], correct[r] = 1 when the
// first arg max is the label (else 0) and, unless dz is the zero Tensor,
// dz[r][k] = (softmax(logits[r])[k] − [k = y])·scale (scale = 1/rows gives
// the gradient of the mean loss). Labels outside the range are not checked
// on the device: the caller guarantees them.
func (ks *Kernels) SoftmaxXent(
	logits, labels, loss, correct, dz fairgo.Tensor,
	rows, classes int,
	scale float32,
	s streams.Stream,
) error {
	const name = "fg_t_softmax_xent"
	if err := dims(name, "rows, classes", rows, classes); err != nil {
		return err
	}
	n := int64(rows) * int64(classes)
	err := errors.Join(
		need(name, "logits", logits, fairgo.Float32, n),
		need(name, "labels", labels, fairgo.Int32, int64(rows)),
		need(
			name,
			"loss",
			loss,
			fairgo.Float32,
			int64(rows),
		),
		need(name, "correct", correct, fairgo.Float32, int64(rows)),
	)
	if dz != (fairgo.Tensor{}) {
		err = errors.Join(err, need(name, "dz", dz, fairgo.Float32, n))
	}
	if err != nil {
		return err
	}
	return ks.launch(name, ks.grid1(int64(rows), false), 1, blockSize, 1, s, logits, labels,
		loss, correct, dz, int32(rows), int32(classes), scale)
}

// AccumStats enqueues, on one GPU thread, stats[0] += mean(loss[:rows]) and
// stats[1] += Σ correct[:rows], stats being float64.
func (ks *Kernels) AccumStats(stats, loss, correct fairgo.Tensor, rows int, s streams.Stream) error {
	const name = "fg_t_stats"
	if err := dims(name, "rows", rows); err != nil {
		return err
	}
	if err := errors.Join(need(name, "stats", stats, fairgo.Float64, 2),
		need(name, "loss", loss, fairgo.Float32, int64(rows)),
		need(name, "correct", correct, fairgo.Float32, int64(rows))); err != nil {
		return err
	}
	return ks.launch(name, 1, 1, 1, 1, s, stats, loss, correct, int32(rows))
}

// SGD enqueues PyTorch's SGD with momentum over params' elements:
// v = mu·v + g; p −= lr·v.
func (ks *Kernels) SGD(params, velocity, grads fairgo.Tensor, lr, mu float32, s streams.Stream) error {
	const name = "fg_t_sgd"
	n := params.Count
	if err := errors.Join(need(name, "params", params, fairgo.Float32, 1),
		need(name, "velocity", velocity, fairgo.Float32, n),
		need(name, "grads", grads, fairgo.Float32, n)); err != nil {
		return err
	}
	return ks.launch(name, ks.grid1(n, true), 1, blockSize, 1, s, params, velocity, grads,
		n, lr, mu)
}

// GenInputs enqueues x[i] = a standard normal draw that depends only on
// (seed, rank, step, i), over x's elements: see InputValue
// (input_test.go).
func (ks *Kernels) GenInputs(x fairgo.Tensor, seed uint64, rank, step int, s streams.Stream) error {
	const name = "fg_t_gen_inputs"
	if err := need(name, "x", x, fairgo.Float32, 1); err != nil {
		return err
	}
	return ks.launch(name, ks.grid1(x.Count, true), 1, blockSize, 1, s, x, x.Count, seed, uint64(rank), uint64(step))
}

// GenLabels enqueues y[r] = the first arg max over k of teacher[k]·x[r]
// (float32 sums in order), for rows×in inputs x, a classes×in teacher and
// int32 labels y.
func (ks *Kernels) GenLabels(y, x, teacher fairgo.Tensor, rows, in, classes int, s streams.Stream) error {
	const name = "fg_t_gen_labels"
	if err := dims(name, "rows, in, classes", rows, in, classes); err != nil {
		return err
	}
	if err := errors.Join(need(name, "y", y, fairgo.Int32, int64(rows)), need(name, "x", x, fairgo.Float32,
		int64(rows)*int64(in)),
		need(name, "teacher", teacher, fairgo.Float32, int64(classes)*int64(in))); err != nil {
		return err
	}
	return ks.launch(name, ks.grid1(int64(rows), false), 1, blockSize, 1, s, y, x, teacher,
		int32(rows), int32(in), int32(classes))
}
