package main

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Float is the element type the model computes in: float32 for training,
// float64 for the finite-difference gradient check.
type Float interface{ ~float32 | ~float64 }

// MLP is a multi-layer perceptron with ReLU between layers and a softmax
// cross-entropy loss. All its parameters live in one flat vector, layer
// after layer, each layer's weights (out × in, row-major) then its bias, so
// that a run of consecutive parameters is one contiguous range: gradient
// buckets are then plain slices of one gradient buffer.
type MLP[T Float] struct {
	Sizes  []int // layer widths: input, hidden..., classes
	Params []T
	layers []layer
}

// layer locates one layer's weights and bias in the flat vector.
type layer struct{ in, out, w, b int }

// NewMLP builds an MLP with the given widths (at least input and output),
// with all parameters zero.
func NewMLP[T Float](sizes []int) (*MLP[T], error) {
	if len(sizes) < 2 {
		return nil, fmt.Errorf("mlp: need at least an input and an output width, got %v", sizes)
	}
	m := &MLP[T]{Sizes: append([]int(nil), sizes...)}
	off := 0
	for l := 0; l+1 < len(sizes); l++ {
		in, out := sizes[l], sizes[l+1]
		if in < 1 || out < 1 {
			return nil, fmt.Errorf("mlp: layer widths must be positive, got %v", sizes)
		}
		m.layers = append(m.layers, layer{in: in, out: out, w: off, b: off + in*out})
		off += in*out + out
	}
	m.Params = make([]T, off)
	return m, nil
}

// Layers is the number of weight layers.
func (m *MLP[T]) Layers() int { return len(m.layers) }

// ParamList names each parameter tensor and its range in Params, in
// forward order (w0, b0, w1, b1, ...).
func (m *MLP[T]) ParamList() []Param {
	var ps []Param
	for l, ly := range m.layers {
		ps = append(ps,
			Param{Name: fmt.Sprintf("layer%d.weight", l), Layer: l, Offset: ly.w, Len: ly.in * ly.out},
			Param{Name: fmt.Sprintf("layer%d.bias", l), Layer: l, Offset: ly.b, Len: ly.out})
	}
	return ps
}

// Init draws weights from He's normal initialisation and zeroes biases.
func (m *MLP[T]) Init(rng *rand.Rand) {
	for _, ly := range m.layers {
		std := math.Sqrt(2 / float64(ly.in))
		for i := range ly.in * ly.out {
			m.Params[ly.w+i] = T(rng.NormFloat64() * std)
		}
		clear(m.Params[ly.b : ly.b+ly.out])
	}
}

// Workspace holds the activations of one batch between the forward and the
// backward pass, so that steps allocate nothing.
type Workspace[T Float] struct {
	acts [][]T // acts[l] is the input of layer l (batch × in); acts[L] the logits
	dz   []T   // gradient of the current layer's output
	da   []T   // gradient of the current layer's input
}

// Step runs the forward pass on a batch (x is batch × input, y the labels)
// and returns the mean loss and the number of correct predictions. When grad
// is not nil it also runs the backward pass, from the last layer to the
// first, writing the gradient of the mean loss into grad (laid out like
// Params) and calling done(l) as soon as layer l's gradients are final:
// the caller hands finished buckets to the allreduce while earlier layers
// still compute.
func (m *MLP[T]) Step(ws *Workspace[T], x []T, y []int, grad []T, done func(layer int)) (loss float64, correct int) {
	batch := len(y)
	m.forward(ws, x, batch)
	loss, correct, dz := m.softmaxXent(ws, y, grad != nil)
	if grad == nil {
		return loss, correct
	}
	m.backward(ws, dz, grad, batch, done)
	return loss, correct
}

// forward runs the forward pass of a batch of x, leaving every layer's
// input and the logits in ws.acts.
func (m *MLP[T]) forward(ws *Workspace[T], x []T, batch int) {
	L := len(m.layers)
	if len(ws.acts) != L+1 {
		ws.acts = make([][]T, L+1)
	}
	ws.acts[0] = x[:batch*m.Sizes[0]]
	for l, ly := range m.layers {
		out := grow(&ws.acts[l+1], batch*ly.out)
		in := ws.acts[l]
		w, b := m.Params[ly.w:ly.b], m.Params[ly.b:ly.b+ly.out]
		for s := range batch {
			xs := in[s*ly.in : (s+1)*ly.in]
			zs := out[s*ly.out : (s+1)*ly.out]
			for o := range ly.out {
				zs[o] = b[o] + dot(w[o*ly.in:(o+1)*ly.in], xs)
			}
			if l+1 < L { // ReLU between layers
				for o, v := range zs {
					zs[o] = max(v, 0)
				}
			}
		}
	}
}

// softmaxXent is the softmax cross-entropy of the logits in ws.acts
// against the labels y, accumulated in float64: the mean loss, the
// correct predictions and, with withGrad, dz, the loss's gradient with
// respect to the logits.
func (m *MLP[T]) softmaxXent(ws *Workspace[T], y []int, withGrad bool) (loss float64, correct int, dz []T) {
	batch := len(y)
	classes := m.Sizes[len(m.layers)]
	logits := ws.acts[len(m.layers)]
	if withGrad {
		dz = grow(&ws.dz, batch*classes)
	}
	for s := range batch {
		zs := logits[s*classes : (s+1)*classes]
		best := 0
		for k, v := range zs {
			if v > zs[best] {
				best = k
			}
		}
		if best == y[s] {
			correct++
		}
		top := float64(zs[best])
		var sum float64
		for _, v := range zs {
			sum += math.Exp(float64(v) - top)
		}
		loss += top + math.Log(sum) - float64(zs[y[s]])
		if withGrad {
			for k, v := range zs {
				p := math.Exp(float64(v)-top) / sum
				if k == y[s] {
					p--
				}
				dz[s*classes+k] = T(p / float64(batch))
			}
		}
	}
	return loss / float64(batch), correct, dz
}

// backward runs the backward pass from the gradient dz of the logits,
// from the last layer to the first, writing the parameters' gradients
// into grad and calling done(l), if not nil, when layer l's are final.
func (m *MLP[T]) backward(ws *Workspace[T], dz, grad []T, batch int, done func(layer int)) {
	for l := len(m.layers) - 1; l >= 0; l-- {
		ly := m.layers[l]
		in := ws.acts[l]
		w := m.Params[ly.w:ly.b]
		gw, gb := grad[ly.w:ly.b], grad[ly.b:ly.b+ly.out]
		clear(gw)
		clear(gb)
		var da []T
		if l > 0 {
			da = grow(&ws.da, batch*ly.in)
			clear(da)
		}
		for s := range batch {
			xs := in[s*ly.in : (s+1)*ly.in]
			for o, g := range dz[s*ly.out : (s+1)*ly.out] {
				if g == 0 {
					continue
				}
				gb[o] += g
				axpy(gw[o*ly.in:(o+1)*ly.in], g, xs)
				if l > 0 {
					axpy(da[s*ly.in:(s+1)*ly.in], g, w[o*ly.in:(o+1)*ly.in])
				}
			}
		}
		if l > 0 {
			// Through the ReLU: its input was positive exactly where its
			// output (this layer's input) is.
			for i, a := range in {
				if a <= 0 {
					da[i] = 0
				}
			}
			ws.dz, ws.da = da, dz
			dz = da
		}
		if done != nil {
			done(l)
		}
	}
}

// grow resizes *buf to n elements, reallocating only when it is too small.
func grow[T Float](buf *[]T, n int) []T {
	if cap(*buf) < n {
		*buf = make([]T, n)
	}
	*buf = (*buf)[:n]
	return *buf
}

func dot[T Float](a, b []T) T {
	b = b[:len(a)]
	var s0, s1, s2, s3 T
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// axpy adds a·x to y.
func axpy[T Float](y []T, a T, x []T) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}

// Teacher labels the synthetic data: a fixed random linear map from the
// input to the class scores; the label is the highest score. Every rank
// builds the same teacher from the job's seed.
type Teacher struct {
	in, classes int
	w           []float32
}

// NewTeacher draws a teacher from seed.
func NewTeacher(seed uint64, in, classes int) *Teacher {
	rng := rand.New(rand.NewPCG(seed, 0x7eac4e7))
	t := &Teacher{in: in, classes: classes, w: make([]float32, in*classes)}
	for i := range t.w {
		t.w[i] = float32(rng.NormFloat64())
	}
	return t
}

// Sample fills x (n × in) with standard normal inputs drawn from rng and y
// with the teacher's labels.
func (t *Teacher) Sample(rng *rand.Rand, x []float32, y []int) {
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	for s := range y {
		xs := x[s*t.in : (s+1)*t.in]
		best, bestScore := 0, float32(math.Inf(-1))
		for k := range t.classes {
			if v := dot(t.w[k*t.in:(k+1)*t.in], xs); v > bestScore {
				best, bestScore = k, v
			}
		}
		y[s] = best
	}
}
