package main

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGradientMatchesFiniteDifferences checks the backward pass against
// central finite differences of the loss, in float64.
func TestGradientMatchesFiniteDifferences(t *testing.T) {
	tests := []struct {
		name  string
		sizes []int
		batch int
	}{
		{"logistic regression", []int{5, 3}, 4},
		{"one hidden layer", []int{6, 8, 4}, 5},
		{"two hidden layers", []int{4, 7, 5, 3}, 3},
		{"batch of one", []int{3, 4, 2}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(len(tc.sizes))))
			m, err := NewMLP[float64](tc.sizes)
			require.NoError(t, err)
			m.Init(rng)
			for i := range m.Params { // non-zero biases too
				m.Params[i] += 0.1 * rng.NormFloat64()
			}
			x := make([]float64, tc.batch*tc.sizes[0])
			for i := range x {
				x[i] = rng.NormFloat64()
			}
			y := make([]int, tc.batch)
			for i := range y {
				y[i] = rng.IntN(tc.sizes[len(tc.sizes)-1])
			}
			var ws Workspace[float64]
			grad := make([]float64, len(m.Params))
			var order []int
			loss, _ := m.Step(&ws, x, y, grad, func(l int) { order = append(order, l) })

			want := make([]int, m.Layers())
			for i := range want {
				want[i] = m.Layers() - 1 - i
			}
			require.Equal(t, want, order, "done must report layers from the last to the first")
			plain, _ := m.Step(&ws, x, y, nil, nil)
			require.Equal(t, loss, plain, "the loss must not depend on whether gradients are computed")

			const h = 1e-6
			for i := range m.Params {
				orig := m.Params[i]
				m.Params[i] = orig + h
				up, _ := m.Step(&ws, x, y, nil, nil)
				m.Params[i] = orig - h
				down, _ := m.Step(&ws, x, y, nil, nil)
				m.Params[i] = orig
				fd := (up - down) / (2 * h)
				require.InDeltaf(t, fd, grad[i], 1e-6+1e-5*math.Abs(fd), "parameter %d", i)
			}
		})
	}
}

func TestNewMLPRejectsBadSizes(t *testing.T) {
	tests := []struct {
		name  string
		sizes []int
	}{
		{"empty", nil},
		{"input only", []int{4}},
		{"zero width", []int{4, 0, 2}},
		{"negative width", []int{4, -1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewMLP[float32](tc.sizes)
			require.Error(t, err)
		})
	}
}

// TestTrainingOnOneReplicaLearns is the single-process baseline: the model
// and the teacher's data are learnable.
func TestTrainingOnOneReplicaLearns(t *testing.T) {
	sizes := []int{16, 32, 4}
	m, err := NewMLP[float32](sizes)
	require.NoError(t, err)
	m.Init(rand.New(rand.NewPCG(1, 2)))
	teacher := NewTeacher(3, sizes[0], sizes[2])
	const batch = 32
	x := make([]float32, 20*batch*sizes[0])
	y := make([]int, 20*batch)
	teacher.Sample(rand.New(rand.NewPCG(4, 5)), x, y)
	var ws Workspace[float32]
	grad := make([]float32, len(m.Params))
	vel := make([]float32, len(m.Params))
	first, _ := m.Step(&ws, x, y, nil, nil)
	for range 5 {
		for s := range 20 {
			m.Step(&ws, x[s*batch*sizes[0]:(s+1)*batch*sizes[0]], y[s*batch:(s+1)*batch], grad, nil)
			sgdMomentum(m.Params, vel, grad, 0.05, 0.9)
		}
	}
	last, correct := m.Step(&ws, x, y, nil, nil)
	require.Less(t, last, first/2)
	require.Greater(t, correct, len(y)*3/4)
}
