//go:build cuda

package cuda

import (
	_ "embed"
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/streams"
)

// trainPTX is cuda/kernels/train.cu compiled by `make ptx` (nvcc -ptx
// -arch=compute_70); NewTrain has the driver JIT-compile it.
//
//go:embed kernels/train.ptx
var trainPTX string

// The entry points of train.ptx.
var trainKernelNames = []string{
	"fg_t_matmul", "fg_t_bias_act", "fg_t_relu_mask", "fg_t_colsum", "fg_t_softmax_xent",
	"fg_t_stats", "fg_t_sgd", "fg_t_gen_inputs", "fg_t_gen_labels",
}

const matmulTile = 16

// Train holds the float32 training kernels of cuda/kernels/train.cu on one
// Device: the pieces of a multi-layer perceptron (matrix products, bias and
// ReLU, the softmax cross-entropy), SGD with momentum and a synthetic data
// generator, for examples/ddp and for trainers that want a GPU step with no
// host copies. Every method validates its arguments and enqueues one kernel
// on s (a *Stream of the same Device), returning at once. Matrices are
// row-major float32 tensors holding at least the elements their dimensions
// say. The kernels are deterministic: the same inputs give the same bits.
//
// Methods may be called from any goroutine. Close unloads the kernels; the
// Device must outlive the Train.
type Train struct {
	d      *Device
	module cModule
	fn     map[string]cFunction
	closed atomic.Bool
}

// NewTrain loads the training kernels on d.
func NewTrain(d *Device) (*Train, error) {
	if d == nil {
		return nil, &fairgo.ArgError{Arg: "device", Value: "nil", Reason: "no device"}
	}
	if err := d.alive(); err != nil {
		return nil, err
	}
	m, log, err := moduleLoad(d.ctx, trainPTX)
	if err != nil {
		if log != "" {
			return nil, fmt.Errorf("cuda: %v: loading the training kernels: %w; JIT log: %s", d, err, log)
		}
		return nil, fmt.Errorf("cuda: %v: loading the training kernels: %w", d, err)
	}
	t := &Train{d: d, module: m, fn: map[string]cFunction{}}
	for _, name := range trainKernelNames {
		f, err := moduleFunction(d.ctx, m, name)
		if err != nil {
			_ = moduleUnload(d.ctx, m)
			return nil, fmt.Errorf("cuda: %v: %w", d, err)
		}
		t.fn[name] = f
	}
	return t, nil
}

// Device is the GPU the kernels are loaded on.
func (t *Train) Device() *Device { return t.d }

// Close unloads the kernels (after the device's work has finished, as
// cuModuleUnload requires). Later calls do nothing.
func (t *Train) Close() error {
	if !t.closed.CompareAndSwap(false, true) {
		return nil
	}
	if t.d.closed.Load() { // the Device released the context, and with it the module
		return nil
	}
	return errors.Join(ctxSync(t.d.ctx), moduleUnload(t.d.ctx, t.module))
}

func (t *Train) launch(name string, gx, gy, bx, by int, s streams.Stream, args ...uint64) error {
	if t.closed.Load() {
		return fmt.Errorf("cuda: training kernel %s: %w", name, ErrDeviceClosed)
	}
	cs, err := t.d.stream(s)
	if err != nil {
		return fmt.Errorf("cuda: training kernel %s: %w", name, err)
	}
	if err := launchKernel(t.d.ctx, t.fn[name], name, gx, gy, bx, by, cs.h, args); err != nil {
		return fmt.Errorf("cuda: %v: %w", t.d, err)
	}
	return nil
}

// grid1 sizes a one-dimensional launch of n threads (grid-stride kernels
// are capped at 8 blocks per SM).
func (t *Train) grid1(n int64, strided bool) int {
	blocks := (n + blockSize - 1) / blockSize
	if strided {
		blocks = min(blocks, int64(t.d.sms)*8)
	}
	return int(max(1, blocks))
}

// need checks that x is a valid tensor of dt holding at least n elements.
func need(kernel, arg string, x fairgo.Tensor, dt fairgo.DType, n int64) error {
	bad := func(reason string) error {
		return fmt.Errorf("cuda: training kernel %s: %w", kernel, &fairgo.ArgError{Arg: arg, Value: x, Reason: reason})
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
		return fmt.Errorf("cuda: training kernel %s: %s: %w", kernel, arg, err)
	}
	return nil
}

func dims(kernel string, names string, vals ...int) error {
	for _, v := range vals {
		if v < 1 || int64(v) > math.MaxInt32 {
			return fmt.Errorf("cuda: training kernel %s: %w", kernel,
				&fairgo.ArgError{Arg: names, Value: vals, Reason: "dimensions must be in [1, 2³¹)"})
		}
	}
	return nil
}

func u32(v int) uint64     { return uint64(uint32(int32(v))) }
func f32(v float32) uint64 { return uint64(math.Float32bits(v)) }
func flag(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// MatMul enqueues c = op(a)·op(b), c being m×n and the inner dimension k:
// a is m×k, or k×m when transA (c = aᵀ·b); b is k×n, or n×k when transB
// (c = a·bᵀ). c must not overlap a or b.
func (t *Train) MatMul(c, a, b fairgo.Tensor, m, n, k int, transA, transB bool, s streams.Stream) error {
	const name = "fg_t_matmul"
	if err := dims(name, "m, n, k", m, n, k); err != nil {
		return err
	}
	mn, mk, kn := int64(m)*int64(n), int64(m)*int64(k), int64(k)*int64(n)
	if err := errors.Join(need(name, "c", c, fairgo.Float32, mn), need(name, "a", a, fairgo.Float32, mk), need(name, "b", b, fairgo.Float32, kn)); err != nil {
		return err
	}
	if overlaps(c, a, mn, mk) || overlaps(c, b, mn, kn) {
		return fmt.Errorf("cuda: training kernel %s: %w", name, &fairgo.ArgError{Arg: "c", Value: c, Reason: "overlaps an operand"})
	}
	gx, gy := (n+matmulTile-1)/matmulTile, (m+matmulTile-1)/matmulTile
	if gy > 65535 {
		return fmt.Errorf("cuda: training kernel %s: %w", name, &fairgo.ArgError{Arg: "m", Value: m, Reason: "more rows than a grid's y dimension covers (65535·16)"})
	}
	return t.launch(name, gx, gy, matmulTile, matmulTile, s,
		uint64(c.Ptr), uint64(a.Ptr), uint64(b.Ptr), u32(m), u32(n), u32(k), flag(transA), flag(transB))
}

func overlaps(x, y fairgo.Tensor, nx, ny int64) bool {
	return x.Ptr < y.Ptr+uintptr(ny*4) && y.Ptr < x.Ptr+uintptr(nx*4)
}

// BiasAct enqueues z[r][c] += bias[c] over a rows×cols z, then, when relu,
// z = max(z, 0).
func (t *Train) BiasAct(z, bias fairgo.Tensor, rows, cols int, relu bool, s streams.Stream) error {
	const name = "fg_t_bias_act"
	if err := dims(name, "rows, cols", rows, cols); err != nil {
		return err
	}
	n := int64(rows) * int64(cols)
	if err := errors.Join(need(name, "z", z, fairgo.Float32, n), need(name, "bias", bias, fairgo.Float32, int64(cols))); err != nil {
		return err
	}
	return t.launch(name, t.grid1(n, true), 1, blockSize, 1, s, uint64(z.Ptr), uint64(bias.Ptr), u32(rows), u32(cols), flag(relu))
}

// ReLUMask enqueues the ReLU's backward pass: da[i] = 0 wherever the ReLU's
// output a[i] is not positive, over da's elements.
func (t *Train) ReLUMask(da, a fairgo.Tensor, s streams.Stream) error {
	const name = "fg_t_relu_mask"
	if err := errors.Join(need(name, "da", da, fairgo.Float32, 1), need(name, "a", a, fairgo.Float32, da.Count)); err != nil {
		return err
	}
	return t.launch(name, t.grid1(da.Count, true), 1, blockSize, 1, s, uint64(da.Ptr), uint64(a.Ptr), uint64(da.Count))
}

// ColSum enqueues out[c] = Σ_r m[r][c] over a rows×cols m (the bias
// gradient), summing rows in order.
func (t *Train) ColSum(out, m fairgo.Tensor, rows, cols int, s streams.Stream) error {
	const name = "fg_t_colsum"
	if err := dims(name, "rows, cols", rows, cols); err != nil {
		return err
	}
	if err := errors.Join(need(name, "out", out, fairgo.Float32, int64(cols)), need(name, "m", m, fairgo.Float32, int64(rows)*int64(cols))); err != nil {
		return err
	}
	return t.launch(name, t.grid1(int64(cols), false), 1, blockSize, 1, s, uint64(out.Ptr), uint64(m.Ptr), u32(rows), u32(cols))
}

// SoftmaxXent enqueues the softmax cross-entropy of rows×classes logits
// against int32 labels in [0, classes), computed in float64 per row:
// loss[r] = logsumexp(logits[r]) − logits[r][y], correct[r] = 1 when the
// first arg max is the label (else 0) and, unless dz is the zero Tensor,
// dz[r][k] = (softmax(logits[r])[k] − [k = y])·scale (scale = 1/rows gives
// the gradient of the mean loss). Labels outside the range are not checked
// on the device: the caller guarantees them.
func (t *Train) SoftmaxXent(logits, labels, loss, correct, dz fairgo.Tensor, rows, classes int, scale float32, s streams.Stream) error {
	const name = "fg_t_softmax_xent"
	if err := dims(name, "rows, classes", rows, classes); err != nil {
		return err
	}
	n := int64(rows) * int64(classes)
	err := errors.Join(need(name, "logits", logits, fairgo.Float32, n), need(name, "labels", labels, fairgo.Int32, int64(rows)),
		need(name, "loss", loss, fairgo.Float32, int64(rows)), need(name, "correct", correct, fairgo.Float32, int64(rows)))
	if dz != (fairgo.Tensor{}) {
		err = errors.Join(err, need(name, "dz", dz, fairgo.Float32, n))
	}
	if err != nil {
		return err
	}
	return t.launch(name, t.grid1(int64(rows), false), 1, blockSize, 1, s, uint64(logits.Ptr), uint64(labels.Ptr),
		uint64(loss.Ptr), uint64(correct.Ptr), uint64(dz.Ptr), u32(rows), u32(classes), f32(scale))
}

// AccumStats enqueues, on one GPU thread, stats[0] += mean(loss[:rows]) and
// stats[1] += Σ correct[:rows], stats being float64.
func (t *Train) AccumStats(stats, loss, correct fairgo.Tensor, rows int, s streams.Stream) error {
	const name = "fg_t_stats"
	if err := dims(name, "rows", rows); err != nil {
		return err
	}
	if err := errors.Join(need(name, "stats", stats, fairgo.Float64, 2), need(name, "loss", loss, fairgo.Float32, int64(rows)),
		need(name, "correct", correct, fairgo.Float32, int64(rows))); err != nil {
		return err
	}
	return t.launch(name, 1, 1, 1, 1, s, uint64(stats.Ptr), uint64(loss.Ptr), uint64(correct.Ptr), u32(rows))
}

// SGD enqueues PyTorch's SGD with momentum over params' elements:
// v = mu·v + g; p −= lr·v.
func (t *Train) SGD(params, velocity, grads fairgo.Tensor, lr, mu float32, s streams.Stream) error {
	const name = "fg_t_sgd"
	n := params.Count
	if err := errors.Join(need(name, "params", params, fairgo.Float32, 1), need(name, "velocity", velocity, fairgo.Float32, n),
		need(name, "grads", grads, fairgo.Float32, n)); err != nil {
		return err
	}
	return t.launch(name, t.grid1(n, true), 1, blockSize, 1, s, uint64(params.Ptr), uint64(velocity.Ptr), uint64(grads.Ptr),
		uint64(n), f32(lr), f32(mu))
}

// GenInputs enqueues x[i] = a standard normal draw that depends only on
// (seed, rank, step, i), over x's elements: see InputValue.
func (t *Train) GenInputs(x fairgo.Tensor, seed uint64, rank, step int, s streams.Stream) error {
	const name = "fg_t_gen_inputs"
	if err := need(name, "x", x, fairgo.Float32, 1); err != nil {
		return err
	}
	return t.launch(name, t.grid1(x.Count, true), 1, blockSize, 1, s, uint64(x.Ptr), uint64(x.Count), seed, uint64(rank), uint64(step))
}

// GenLabels enqueues y[r] = the first arg max over k of teacher[k]·x[r]
// (float32 sums in order), for rows×in inputs x, a classes×in teacher and
// int32 labels y.
func (t *Train) GenLabels(y, x, teacher fairgo.Tensor, rows, in, classes int, s streams.Stream) error {
	const name = "fg_t_gen_labels"
	if err := dims(name, "rows, in, classes", rows, in, classes); err != nil {
		return err
	}
	if err := errors.Join(need(name, "y", y, fairgo.Int32, int64(rows)), need(name, "x", x, fairgo.Float32, int64(rows)*int64(in)),
		need(name, "teacher", teacher, fairgo.Float32, int64(classes)*int64(in))); err != nil {
		return err
	}
	return t.launch(name, t.grid1(int64(rows), false), 1, blockSize, 1, s, uint64(y.Ptr), uint64(x.Ptr), uint64(teacher.Ptr),
		u32(rows), u32(in), u32(classes))
}

func mix64(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// InputValue is the host's version of what GenInputs writes at index i:
// with h = mix(mix(mix(mix(seed) ^ rank) ^ step) ^ i) (mix: splitmix64's
// finaliser), u1 = ((h >> 40) + 1)·2⁻²⁴ and u2 = ((h >> 16) & 0xffffff)·2⁻²⁴,
// x = float32(sqrt(−2 ln u1)·cos(2π u2)). The GPU's log and cos may differ
// from Go's in the last bit of the float64, so rarely in the float32.
func InputValue(seed uint64, rank, step int, i int64) float32 {
	h := mix64(mix64(mix64(mix64(seed)^uint64(rank))^uint64(step)) ^ uint64(i))
	u1 := float64((h>>40)+1) / (1 << 24)
	u2 := float64((h>>16)&0xffffff) / (1 << 24)
	return float32(math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2))
}

// UploadAsync enqueues a copy of src to device memory at dst on s. From Go
// (pageable) memory the driver stages the bytes before it returns, so src
// may be reused at once; the call may wait for s's earlier work, and the
// copy is not asynchronous with respect to the host the way one from pinned
// memory is. Unlike Upload it does not synchronise the whole context.
func (d *Device) UploadAsync(dst uintptr, src []byte, s streams.Stream) error {
	cs, err := d.stream(s)
	if err != nil {
		return err
	}
	if len(src) == 0 {
		return nil
	}
	if dst == 0 {
		return &fairgo.ArgError{Arg: "dst", Value: "0", Reason: "null device address"}
	}
	if err := htodAsync(d.ctx, dst, src, cs.h); err != nil {
		return fmt.Errorf("cuda: upload on %v: %w", cs, err)
	}
	return nil
}

// DownloadAsync copies len(dst) bytes of device memory at src into dst,
// ordered after the work enqueued on s, and returns once the copy is done:
// into Go (pageable) memory cuMemcpyDtoHAsync is synchronous with respect to
// the host anyway, and s is synchronised after it to be sure. It waits for
// s only, not for the whole context as Download does.
func (d *Device) DownloadAsync(dst []byte, src uintptr, s streams.Stream) error {
	cs, err := d.stream(s)
	if err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	if src == 0 {
		return &fairgo.ArgError{Arg: "src", Value: "0", Reason: "null device address"}
	}
	if err := dtohAsync(d.ctx, dst, src, cs.h); err != nil {
		return fmt.Errorf("cuda: download on %v: %w", cs, err)
	}
	if err := streamSync(d.ctx, cs.h); err != nil {
		return fmt.Errorf("cuda: download on %v: %w", cs, err)
	}
	return nil
}
