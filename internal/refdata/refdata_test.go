package refdata

import (
	"bytes"
	"testing"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/internal/elem"
)

func TestCountWrongFindsCorruption(t *testing.T) {
	const world, n = 4, 1000
	dt, op := fairgo.Float32, fairgo.Sum
	ref := make([]byte, n*dt.Size())
	for i := 0; i < n; i++ {
		var s float64
		for g := 0; g < world; g++ {
			s += Value(dt, op, 1, g, int64(i))
		}
		elem.Set(dt, ref, i, s)
	}
	bad := bytes.Clone(ref)
	elem.Set(dt, bad, 17, 99)
	elem.Set(dt, bad, 998, elem.Get(dt, bad, 998)+0.01)
	got := CountWrong(dt, op, 1, world, 0, [][]byte{ref, bad})
	if got[0] != 0 || got[1] != 2 {
		t.Errorf("CountWrong = %v, want [0 2]", got)
	}
	// An offset view checks the same elements.
	if w := CountWrong(dt, op, 1, world, 10, [][]byte{ref[10*4:]}); w[0] != 0 {
		t.Errorf("offset view: %d wrong", w[0])
	}
	if !bytes.Equal(Input(dt, op, 1, 2, 10, 5), Input(dt, op, 1, 2, 0, 15)[40:]) {
		t.Error("Input at an offset differs from the slice of the whole")
	}
}

// Expected agrees with a direct float64 sum of Value, and Within accepts it
// and rejects a value one bound and a bit away.
func TestExpected(t *testing.T) {
	for _, dt := range []fairgo.DType{fairgo.Float32, fairgo.BFloat16, fairgo.Int32} {
		for _, op := range fairgo.Ops {
			want, bound := Expected(dt, op, 5, 3, 42)
			tmp := make([]byte, dt.Size())
			var acc float64
			for g := 0; g < 3; g++ {
				elem.Set(dt, tmp, 0, Value(dt, op, 5, g, 42))
				x := elem.Get(dt, tmp, 0)
				switch {
				case g == 0:
					acc = x
				case op == fairgo.Sum || op == fairgo.Avg:
					acc += x
				case op == fairgo.Prod:
					acc *= x
				case op == fairgo.Max && x > acc, op == fairgo.Min && x < acc:
					acc = x
				}
			}
			if op == fairgo.Avg {
				acc /= 3
				if !dt.IsFloat() {
					acc = float64(int64(acc))
				}
			}
			if want != acc {
				t.Errorf("%s %s: Expected %v, direct %v", dt, op, want, acc)
			}
			if !Within(want, want, bound) || Within(want+bound+1e-3, want, bound) {
				t.Errorf("%s %s: Within misjudges the bound %v", dt, op, bound)
			}
		}
	}
}
