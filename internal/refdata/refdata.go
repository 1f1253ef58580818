// Package refdata generates the check data of fairgo's examples and
// benchmarks and its float64 reference: element i of world rank g is a pure
// function of (seed, g, i), so every process can compute the expected result
// of every rank without communicating.
//
// Integers are small (the float64 reference is exact); floats lie in
// [-1, 1), and in ±[0.9, 1.1) for products.
package refdata

import (
	"math"
	"runtime"
	"sync"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/internal/elem"
)

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// rankKey and indexKey are the two halves of the hash of (g, i), so that
// the reference hashes each index once for all ranks.
func rankKey(g int) uint64           { return splitmix(uint64(g) + 0x9e37) }
func indexKey(i int64) uint64        { return splitmix(uint64(i) * 0x2545F491) }
func mix(seed, rk, ik uint64) uint64 { return splitmix(seed ^ rk ^ ik) }

// Value is the input element i of world rank g.
func Value(dt fairgo.DType, op fairgo.Op, seed uint64, g int, i int64) float64 {
	return valueOf(dt, op, mix(seed, rankKey(g), indexKey(i)))
}

func valueOf(dt fairgo.DType, op fairgo.Op, h uint64) float64 {
	u := float64(h>>11) / (1 << 53)
	switch {
	case dt.IsFloat() && op == fairgo.Prod:
		v := 0.9 + 0.2*u
		if h&1 == 1 {
			v = -v
		}
		return v
	case dt.IsFloat():
		return 2*u - 1
	case op == fairgo.Prod && dt.IsSigned():
		return float64(2*int(h&1) - 1)
	case op == fairgo.Prod:
		return 1
	case dt.IsSigned():
		return float64(int(h%5) - 2)
	}
	return float64(h % 3)
}

// Input is world rank g's input elements [first, first+n), encoded as dt.
func Input(dt fairgo.DType, op fairgo.Op, seed uint64, g int, first, n int64) []byte {
	b := make([]byte, n*int64(dt.Size()))
	rk := rankKey(g)
	parallel(n, func(lo, hi int64) {
		for i := lo; i < hi; i++ {
			elem.Set(dt, b, int(i), valueOf(dt, op, mix(seed, rk, indexKey(first+i))))
		}
	})
	return b
}

// CountWrong compares outs (each the n result elements of one rank, encoded
// as dt) with the float64 reduction over world ranks of their inputs (as
// rounded to dt), and returns the number of wrong elements in each.
// Integers must match exactly; floats may be off by (world + 2) unit
// roundoffs of the sum of magnitudes (of the product's magnitude for Prod).
//
// Element k of each out is input element first+k (so a bucket of a larger
// input is checked in place).
func CountWrong(dt fairgo.DType, op fairgo.Op, seed uint64, world int, first int64, outs [][]byte) []int64 {
	wrong := make([]int64, len(outs))
	if len(outs) == 0 {
		return wrong
	}
	n := int64(len(outs[0]) / dt.Size())
	rks := make([]uint64, world)
	for g := range rks {
		rks[g] = rankKey(g)
	}
	var mu sync.Mutex
	parallel(n, func(lo, hi int64) {
		local := make([]int64, len(outs))
		tmp := make([]byte, dt.Size())
		for i := lo; i < hi; i++ {
			acc, bound := expected(dt, op, seed, rks, indexKey(first+i), tmp)
			for k, out := range outs {
				if !Within(elem.Get(dt, out, int(i)), acc, bound) {
					local[k]++
				}
			}
		}
		mu.Lock()
		for k := range wrong {
			wrong[k] += local[k]
		}
		mu.Unlock()
	})
	return wrong
}

// Expected is the reference result of element i over world ranks, and the
// largest error allowed: 0 for integers; for floats (world + 2) unit
// roundoffs of the sum of magnitudes (of the product's magnitude for Prod),
// enough for any order of rounded partial sums through a ring or two levels.
func Expected(dt fairgo.DType, op fairgo.Op, seed uint64, world int, i int64) (want, bound float64) {
	rks := make([]uint64, world)
	for g := range rks {
		rks[g] = rankKey(g)
	}
	return expected(dt, op, seed, rks, indexKey(i), make([]byte, dt.Size()))
}

// Within reports whether got is the expected value within bound.
func Within(got, want, bound float64) bool {
	return !math.IsNaN(got) && math.Abs(got-want) <= bound+1e-7
}

func expected(dt fairgo.DType, op fairgo.Op, seed uint64, rks []uint64, ik uint64, tmp []byte) (acc, bound float64) {
	world := len(rks)
	var mag float64
	for g := 0; g < world; g++ {
		elem.Set(dt, tmp, 0, valueOf(dt, op, mix(seed, rks[g], ik)))
		x := elem.Get(dt, tmp, 0)
		switch {
		case g == 0:
			acc = x
		case op == fairgo.Sum || op == fairgo.Avg:
			acc += x
		case op == fairgo.Prod:
			acc *= x
		case op == fairgo.Max:
			acc = math.Max(acc, x)
		case op == fairgo.Min:
			acc = math.Min(acc, x)
		}
		mag += math.Abs(x)
	}
	switch op {
	case fairgo.Sum:
		bound = float64(world+2) * dt.Epsilon() * mag
	case fairgo.Avg:
		acc /= float64(world)
		if !dt.IsFloat() {
			acc = math.Trunc(acc)
		}
		bound = float64(world+2) * dt.Epsilon() * mag / float64(world)
	case fairgo.Prod:
		bound = float64(world+2) * dt.Epsilon() * math.Abs(acc)
	}
	return acc, bound
}

// parallel runs fn over [0, n) in chunks on up to GOMAXPROCS goroutines.
func parallel(n int64, fn func(lo, hi int64)) {
	const chunk = 1 << 16
	workers := int64(runtime.GOMAXPROCS(0))
	if n <= chunk || workers == 1 {
		fn(0, n)
		return
	}
	per := (n + workers - 1) / workers
	var wg sync.WaitGroup
	for lo := int64(0); lo < n; lo += per {
		hi := min(lo+per, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	wg.Wait()
}
