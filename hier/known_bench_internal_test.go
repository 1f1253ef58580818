package hier

import "testing"

// BenchmarkKnownRoute is the router's answer for a call of a measured
// class with three candidates (NCCL's default, ring and tree), as every
// call of one machine asks it.
func BenchmarkKnownRoute(b *testing.B) {
	m := &fixedMeasurer{times: map[Algorithm]int64{Flat: 10, FlatRing: 20, FlatTree: 30}, variants: true}
	rt := testRouter(Grid{Machines: 1, Devices: 2}, config{algorithm: Auto, flatThreshold: DefaultAutoFlatThreshold}, m)
	rt.route(64 << 10)
	for b.Loop() {
		if _, _, ok := rt.known(64 << 10); !ok {
			b.Fatal("not known")
		}
	}
}
