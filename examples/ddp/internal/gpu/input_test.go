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
	for _, other := range []float32{InputValue(2, 2, 3, 4), InputValue(1, 3, 3, 4), InputValue(1, 2, 4, 4),
		InputValue(1, 2, 3, 5)} {
		require.NotEqual(t, base, other)
	}
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

func mix64(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
