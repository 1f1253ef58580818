package gpu

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestInputValue: the generator's host side draws standard normal values
// that depend on every coordinate.
func TestInputValue(t *testing.T) {
	const n = 20000
	var mean, sq float64
	for i := range int64(n) {
		v := float64(InputValue(42, 3, 5, i))
		mean += v
		sq += v * v
	}
	mean /= n
	sd := math.Sqrt(sq/n - mean*mean)
	require.InDelta(t, 0, mean, 0.05)
	require.InDelta(t, 1, sd, 0.05)
	base := InputValue(1, 2, 3, 4)
	require.Equal(t, base, InputValue(1, 2, 3, 4))
	for _, other := range []float32{InputValue(2, 2, 3, 4), InputValue(1, 3, 3, 4), InputValue(1, 2, 4, 4), InputValue(1, 2, 3, 5)} {
		require.NotEqual(t, base, other)
	}
}
