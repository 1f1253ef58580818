package gpu

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/cuda"
)

// devices opens the first n GPUs, or skips the test when there are fewer.
func devices(t testing.TB, n int) []*cuda.Device {
	t.Helper()
	have, err := cuda.Count()
	if errors.Is(err, fairgo.ErrNoDevice) {
		t.Skip(err.Error()) // no driver or no GPU here
	}
	if err != nil {
		t.Fatalf("counting GPUs: %v", err)
	}
	if have < n {
		t.Skipf("needs %d GPUs, found %d", n, have)
	}
	devs := make([]*cuda.Device, n)
	for i := range devs {
		d, err := cuda.Open(i)
		if err != nil {
			t.Fatalf("Open(%d): %v", i, err)
		}
		devs[i] = d
		t.Cleanup(func() {
			if err := d.Close(); err != nil {
				t.Errorf("closing %v: %v", d, err)
			}
		})
	}
	return devs
}

func newStream(t testing.TB, d *cuda.Device) *cuda.Stream {
	t.Helper()
	s, err := d.CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// asBytes views a slice's elements as bytes (no copy).
func asBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
}

func upload[T any](t testing.TB, d *cuda.Device, dst uintptr, src []T) {
	t.Helper()
	if err := d.Upload(dst, asBytes(src)); err != nil {
		t.Fatal(err)
	}
}

func download[T any](t testing.TB, d *cuda.Device, src uintptr, n int) []T {
	t.Helper()
	out := make([]T, n)
	if err := d.Download(asBytes(out), src); err != nil {
		t.Fatal(err)
	}
	return out
}

func isInvalid(err error) bool { return err != nil && errors.Is(err, fairgo.ErrInvalidArgument) }

// trainKit is a device, a stream on it and the training kernels.
func trainKit(t *testing.T) (*cuda.Device, *cuda.Stream, *Kernels) {
	t.Helper()
	d := devices(t, 1)[0]
	s := newStream(t, d)
	tr, err := LoadKernels(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("Kernels.Close: %v", err)
		}
	})
	return d, s, tr
}

// tensorOf allocates a tensor holding vals (float32, int32 or float64).
func tensorOf[T float32 | int32 | float64](t *testing.T, d *cuda.Device, dt fairgo.DType, vals []T) fairgo.Tensor {
	t.Helper()
	x, err := d.AllocTensor(int64(len(vals)), dt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Free(x.Ptr) })
	upload(t, d, x.Ptr, vals)
	return x
}

func zeros(t *testing.T, d *cuda.Device, n int) fairgo.Tensor {
	return tensorOf(t, d, fairgo.Float32, make([]float32, n))
}

func randn(rng *rand.Rand, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(rng.NormFloat64())
	}
	return out
}

func near(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(float64(got[i]) - float64(want[i])); d > tol*(1+math.Abs(float64(want[i]))) ||
			math.IsNaN(float64(got[i])) {
			t.Fatalf("%s[%d] = %g, want %g (tolerance %g)", what, i, got[i], want[i], tol)
		}
	}
}

// hostMatMul is the float64 reference of Kernels.MatMul.
func hostMatMul(a, b []float32, m, n, k int, ta, tb bool) []float32 {
	c := make([]float32, m*n)
	for i := range m {
		for j := range n {
			var s float64
			for p := range k {
				av := a[i*k+p]
				if ta {
					av = a[p*m+i]
				}
				bv := b[p*n+j]
				if tb {
					bv = b[j*k+p]
				}
				s += float64(av) * float64(bv)
			}
			c[i*n+j] = float32(s)
		}
	}
	return c
}

func TestTrainMatMul(t *testing.T) {
	d, s, tr := trainKit(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, sz := range [][3]int{{1, 1, 1}, {19, 23, 37}, {32, 64, 16}, {5, 40, 3}} {
		m, n, k := sz[0], sz[1], sz[2]
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				a, b := randn(rng, m*k), randn(rng, k*n)
				at, bt, c := tensorOf(t, d, fairgo.Float32, a), tensorOf(t, d, fairgo.Float32, b), zeros(t, d, m*n)
				if err := tr.MatMul(c, at, bt, m, n, k, ta, tb, s); err != nil {
					t.Fatal(err)
				}
				near(t, "matmul", download[float32](t, d, c.Ptr, m*n), hostMatMul(a, b, m, n, k, ta, tb), 1e-4)
			}
		}
	}
}

func TestTrainBiasReLUColSum(t *testing.T) {
	d, s, tr := trainKit(t)
	rng := rand.New(rand.NewPCG(3, 4))
	rows, cols := 37, 21
	z, bias, g := randn(rng, rows*cols), randn(rng, cols), randn(rng, rows*cols)
	for _, relu := range []bool{false, true} {
		zt, bt := tensorOf(t, d, fairgo.Float32, z), tensorOf(t, d, fairgo.Float32, bias)
		if err := tr.BiasAct(zt, bt, rows, cols, relu, s); err != nil {
			t.Fatal(err)
		}
		want := make([]float32, rows*cols)
		for i := range want {
			want[i] = z[i] + bias[i%cols]
			if relu && want[i] < 0 {
				want[i] = 0
			}
		}
		got := download[float32](t, d, zt.Ptr, rows*cols)
		near(t, "bias+act", got, want, 0)
		if !relu {
			continue
		}
		// ReLU backward through the activations just computed.
		gt := tensorOf(t, d, fairgo.Float32, g)
		if err := tr.ReLUMask(gt, zt, s); err != nil {
			t.Fatal(err)
		}
		wantG := append([]float32(nil), g...)
		for i, a := range want {
			if a <= 0 {
				wantG[i] = 0
			}
		}
		near(t, "relu mask", download[float32](t, d, gt.Ptr, rows*cols), wantG, 0)
	}
	gt, out := tensorOf(t, d, fairgo.Float32, g), zeros(t, d, cols)
	if err := tr.ColSum(out, gt, rows, cols, s); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, cols)
	for c := range cols {
		for r := range rows {
			want[c] += g[r*cols+c] // in order, as the kernel
		}
	}
	near(t, "colsum", download[float32](t, d, out.Ptr, cols), want, 1e-6)
}

func TestTrainSoftmaxXentAndStats(t *testing.T) {
	d, s, tr := trainKit(t)
	rng := rand.New(rand.NewPCG(5, 6))
	rows, classes := 33, 10
	z := randn(rng, rows*classes)
	y := make([]int32, rows)
	for i := range y {
		y[i] = int32(rng.IntN(classes))
	}
	zt, yt := tensorOf(t, d, fairgo.Float32, z), tensorOf(t, d, fairgo.Int32, y)
	loss, correct, dz := zeros(t, d, rows), zeros(t, d, rows), zeros(t, d, rows*classes)
	scale := float32(1) / float32(rows)
	if err := tr.SoftmaxXent(zt, yt, loss, correct, dz, rows, classes, scale, s); err != nil {
		t.Fatal(err)
	}
	stats := tensorOf(t, d, fairgo.Float64, []float64{1, 2})
	if err := tr.AccumStats(stats, loss, correct, rows, s); err != nil {
		t.Fatal(err)
	}
	wantLoss, wantCorrect, wantDz := make([]float32, rows), make([]float32, rows), make([]float32, rows*classes)
	var meanLoss, nCorrect float64
	for r := range rows {
		zs := z[r*classes : (r+1)*classes]
		best := 0
		for k, v := range zs {
			if v > zs[best] {
				best = k
			}
		}
		top := float64(zs[best])
		var sum float64
		for _, v := range zs {
			sum += math.Exp(float64(v) - top)
		}
		wantLoss[r] = float32(top + math.Log(sum) - float64(zs[y[r]]))
		if best == int(y[r]) {
			wantCorrect[r] = 1
		}
		for k, v := range zs {
			p := math.Exp(float64(v)-top) / sum
			if k == int(y[r]) {
				p--
			}
			wantDz[r*classes+k] = float32(p * float64(scale))
		}
		meanLoss += float64(wantLoss[r])
		nCorrect += float64(wantCorrect[r])
	}
	near(t, "loss", download[float32](t, d, loss.Ptr, rows), wantLoss, 1e-6)
	near(t, "correct", download[float32](t, d, correct.Ptr, rows), wantCorrect, 0)
	near(t, "dz", download[float32](t, d, dz.Ptr, rows*classes), wantDz, 1e-6)
	got := download[float64](t, d, stats.Ptr, 2)
	if math.Abs(got[0]-(1+meanLoss/float64(rows))) > 1e-5 || got[1] != 2+nCorrect {
		t.Fatalf("stats = %v, want [%g %g]", got, 1+meanLoss/float64(rows), 2+nCorrect)
	}
	// Without dz: only the loss.
	if err := tr.SoftmaxXent(zt, yt, loss, correct, fairgo.Tensor{}, rows, classes, scale, s); err != nil {
		t.Fatal(err)
	}
	near(t, "loss (no dz)", download[float32](t, d, loss.Ptr, rows), wantLoss, 1e-6)
}

func TestTrainSGD(t *testing.T) {
	d, s, tr := trainKit(t)
	rng := rand.New(rand.NewPCG(7, 8))
	n := 1000
	p, v, g := randn(rng, n), randn(rng, n), randn(rng, n)
	pt, vt, gt := tensorOf(t, d, fairgo.Float32, p), tensorOf(t, d, fairgo.Float32, v),
		tensorOf(t, d, fairgo.Float32, g)
	const lr, mu = 0.05, 0.9
	for range 3 {
		if err := tr.SGD(pt, vt, gt, lr, mu, s); err != nil {
			t.Fatal(err)
		}
		for i := range p {
			v[i] = mu*v[i] + g[i]
			p[i] -= lr * v[i]
		}
	}
	// The GPU may fuse multiply-adds: equal up to rounding.
	near(t, "velocity", download[float32](t, d, vt.Ptr, n), v, 1e-5)
	near(t, "params", download[float32](t, d, pt.Ptr, n), p, 1e-5)
}

func TestTrainGenerator(t *testing.T) {
	d, s, tr := trainKit(t)
	rows, in, classes := 50, 24, 7
	x := zeros(t, d, rows*in)
	if err := tr.GenInputs(x, 42, 3, 5, s); err != nil {
		t.Fatal(err)
	}
	got := download[float32](t, d, x.Ptr, rows*in)
	want := make([]float32, rows*in)
	var mean, sq float64
	for i := range want {
		want[i] = InputValue(42, 3, 5, int64(i))
		mean += float64(got[i])
		sq += float64(got[i]) * float64(got[i])
	}
	near(t, "inputs", got, want, 1e-6)
	mean /= float64(len(got))
	if sd := math.Sqrt(sq/float64(len(got)) - mean*mean); math.Abs(mean) > 0.15 || sd < 0.85 || sd > 1.15 {
		t.Errorf("inputs: mean %.3f, sd %.3f; want about 0 and 1", mean, sd)
	}
	// Another step or rank draws other inputs.
	if err := tr.GenInputs(x, 42, 3, 6, s); err != nil {
		t.Fatal(err)
	}
	if other := download[float32](t, d, x.Ptr, rows*in); other[0] == got[0] && other[1] == got[1] {
		t.Errorf("step 6 drew the same inputs as step 5")
	}
	upload(t, d, x.Ptr, got)

	teacher := randn(rand.New(rand.NewPCG(9, 10)), classes*in)
	tt, y := tensorOf(t, d, fairgo.Float32, teacher), tensorOf(t, d, fairgo.Int32, make([]int32, rows))
	if err := tr.GenLabels(y, x, tt, rows, in, classes, s); err != nil {
		t.Fatal(err)
	}
	labels := download[int32](t, d, y.Ptr, rows)
	for r, l := range labels {
		score := func(k int) float64 {
			var s float64
			for i := range in {
				s += float64(teacher[k*in+i]) * float64(got[r*in+i])
			}
			return s
		}
		if l < 0 || int(l) >= classes {
			t.Fatalf("label %d = %d outside [0, %d)", r, l, classes)
		}
		for k := range classes {
			if score(k) > score(int(l))+1e-4 {
				t.Fatalf("row %d: label %d scores %g, class %d scores %g", r, l, score(int(l)), k, score(k))
			}
		}
	}
}

// TestTrainMLPStep runs the forward and backward pass of a two-layer MLP
// (as examples/ddp does on GPUs) and compares the loss and the gradients
// with a float64 host reference.
func TestTrainMLPStep(t *testing.T) {
	d, s, tr := trainKit(t)
	rng := rand.New(rand.NewPCG(11, 12))
	batch, in, hid, classes := 20, 12, 17, 5
	x, w0, b0, w1, b1 := randn(rng, batch*in), randn(rng, hid*in), randn(rng, hid), randn(rng, classes*hid),
		randn(rng, classes)
	y := make([]int32, batch)
	for i := range y {
		y[i] = int32(rng.IntN(classes))
	}
	f32 := func(v []float32) fairgo.Tensor { return tensorOf(t, d, fairgo.Float32, v) }
	xt, w0t, b0t, w1t, b1t := f32(x), f32(w0), f32(b0), f32(w1), f32(b1)
	yt := tensorOf(t, d, fairgo.Int32, y)
	h, z := zeros(t, d, batch*hid), zeros(t, d, batch*classes)
	loss, correct, dz, dh := zeros(t, d, batch), zeros(t, d, batch), zeros(t, d, batch*classes), zeros(t, d, batch*hid)
	gw0, gb0, gw1, gb1 := zeros(t, d, hid*in), zeros(t, d, hid), zeros(t, d, classes*hid), zeros(t, d, classes)
	steps := []func() error{
		func() error { return tr.MatMul(h, xt, w0t, batch, hid, in, false, true, s) },
		func() error { return tr.BiasAct(h, b0t, batch, hid, true, s) },
		func() error { return tr.MatMul(z, h, w1t, batch, classes, hid, false, true, s) },
		func() error { return tr.BiasAct(z, b1t, batch, classes, false, s) },
		func() error {
			return tr.SoftmaxXent(z, yt, loss, correct, dz, batch, classes, 1/float32(batch), s)
		},
		func() error { return tr.MatMul(gw1, dz, h, classes, hid, batch, true, false, s) },
		func() error { return tr.ColSum(gb1, dz, batch, classes, s) },
		func() error { return tr.MatMul(dh, dz, w1t, batch, hid, classes, false, false, s) },
		func() error { return tr.ReLUMask(dh, h, s) },
		func() error { return tr.MatMul(gw0, dh, xt, hid, in, batch, true, false, s) },
		func() error { return tr.ColSum(gb0, dh, batch, hid, s) },
	}
	for i, f := range steps {
		if err := f(); err != nil {
			t.Fatalf("kernel %d: %v", i, err)
		}
	}

	// Host reference in float64.
	hr := make([]float64, batch*hid)
	for r := range batch {
		for o := range hid {
			v := float64(b0[o])
			for i := range in {
				v += float64(w0[o*in+i]) * float64(x[r*in+i])
			}
			hr[r*hid+o] = math.Max(v, 0)
		}
	}
	dzr := make([]float64, batch*classes)
	var meanLoss float64
	for r := range batch {
		zs := make([]float64, classes)
		top := math.Inf(-1)
		for c := range classes {
			v := float64(b1[c])
			for o := range hid {
				v += float64(w1[c*hid+o]) * hr[r*hid+o]
			}
			zs[c] = v
			top = math.Max(top, v)
		}
		var sum float64
		for _, v := range zs {
			sum += math.Exp(v - top)
		}
		meanLoss += (top + math.Log(sum) - zs[y[r]]) / float64(batch)
		for c, v := range zs {
			p := math.Exp(v-top) / sum
			if c == int(y[r]) {
				p--
			}
			dzr[r*classes+c] = p / float64(batch)
		}
	}
	wantGw1, wantGb1 := make([]float32, classes*hid), make([]float32, classes)
	dhr := make([]float64, batch*hid)
	for r := range batch {
		for c := range classes {
			g := dzr[r*classes+c]
			wantGb1[c] += float32(g)
			for o := range hid {
				wantGw1[c*hid+o] += float32(g * hr[r*hid+o])
				dhr[r*hid+o] += g * float64(w1[c*hid+o])
			}
		}
	}
	wantGw0, wantGb0 := make([]float32, hid*in), make([]float32, hid)
	for r := range batch {
		for o := range hid {
			g := dhr[r*hid+o]
			if hr[r*hid+o] <= 0 {
				g = 0
			}
			wantGb0[o] += float32(g)
			for i := range in {
				wantGw0[o*in+i] += float32(g * float64(x[r*in+i]))
			}
		}
	}
	var gotLoss float64
	for _, l := range download[float32](t, d, loss.Ptr, batch) {
		gotLoss += float64(l) / float64(batch)
	}
	if math.Abs(gotLoss-meanLoss) > 1e-4*(1+meanLoss) {
		t.Errorf("loss %g, want %g", gotLoss, meanLoss)
	}
	near(t, "grad w1", download[float32](t, d, gw1.Ptr, classes*hid), wantGw1, 1e-3)
	near(t, "grad b1", download[float32](t, d, gb1.Ptr, classes), wantGb1, 1e-3)
	near(t, "grad w0", download[float32](t, d, gw0.Ptr, hid*in), wantGw0, 1e-3)
	near(t, "grad b0", download[float32](t, d, gb0.Ptr, hid), wantGb0, 1e-3)
}

func TestTrainArgs(t *testing.T) {
	d, s, tr := trainKit(t)
	f := zeros(t, d, 16)
	i := tensorOf(t, d, fairgo.Int32, make([]int32, 16))
	cases := map[string]error{
		"short c":        tr.MatMul(f, f.Slice(0, 4), f.Slice(4, 4), 8, 8, 1, false, false, s),
		"zero dim":       tr.MatMul(f, f, f, 0, 1, 1, false, false, s),
		"overlap":        tr.MatMul(f.Slice(0, 4), f.Slice(2, 4), f.Slice(8, 4), 2, 2, 2, false, false, s),
		"int bias":       tr.BiasAct(f, i, 4, 4, true, s),
		"float labels":   tr.SoftmaxXent(f, f, f, f, fairgo.Tensor{}, 4, 4, 1, s),
		"short velocity": tr.SGD(f, f.Slice(0, 8), f, 1, 0, s),
		"null x":         tr.GenInputs(fairgo.Tensor{Count: 4, Bytes: 16, DType: fairgo.Float32}, 1, 0, 0, s),
		"short stats":    tr.AccumStats(tensorOf(t, d, fairgo.Float64, []float64{0}), f, f, 4, s),
	}
	for name, err := range cases {
		if !isInvalid(err) {
			t.Errorf("%s: %v, want an invalid-argument error", name, err)
		}
	}
	other := devices(t, 1)[0]
	if err := tr.SGD(f, f, f, 1, 0, newStream(t, other)); !isInvalid(err) {
		t.Errorf("a stream of another Device: %v, want an invalid-argument error", err)
	}
	if err := d.UploadAsync(f.Ptr, []byte{1}, newStream(t, other)); !isInvalid(err) {
		t.Errorf("UploadAsync on a stream of another Device: %v, want an invalid-argument error", err)
	}
}

func TestTrainAsyncCopies(t *testing.T) {
	d, s, tr := trainKit(t)
	n := 1 << 16
	src := randn(rand.New(rand.NewPCG(13, 14)), n)
	x := zeros(t, d, n)
	if err := d.UploadAsync(x.Ptr, asBytes(src), s); err != nil {
		t.Fatal(err)
	}
	// Ordered with kernels on the same stream: p -= 1·(0·v + g) with g = p.
	v := zeros(t, d, n)
	if err := tr.SGD(x, v, x, 0.5, 0, s); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, n)
	if err := d.DownloadAfter(asBytes(got), x.Ptr, s); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, n)
	for i, p := range src {
		want[i] = p - 0.5*p
	}
	near(t, "upload, sgd, download", got, want, 1e-6)
	if err := d.UploadAsync(0, []byte{1}, s); !isInvalid(err) {
		t.Errorf("UploadAsync to 0: %v, want an invalid-argument error", err)
	}
}
