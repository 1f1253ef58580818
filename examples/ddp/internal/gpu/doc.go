// Package gpu is the GPU half of examples/ddp: the training kernels of
// train.cu (an MLP's matrix products, activations, loss, SGD and a
// synthetic data generator), loaded from their embedded PTX through the
// library's module loader (cuda.Device.LoadModule) and launched on the
// trainer's streams. The library's cuda package carries only the kernels
// the engine needs; a trainer keeps its own, as this example does.
package gpu

import "math"

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
