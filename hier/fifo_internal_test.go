package hier

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// The property: any run of pushes, pops from the front and removals leaves
// a fifo holding what a plain slice would, in the same order, and every
// slot it no longer holds is zero (nothing kept alive).
func TestFifoIsASlice(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		var q fifo[*int]
		var model []*int
		for i := range rapid.IntRange(0, 300).Draw(rt, "ops") {
			switch op := rapid.IntRange(0, 3).Draw(rt, "op"); {
			case op <= 1 || len(model) == 0:
				v := i
				q.Push(&v)
				model = append(model, &v)
			case op == 2:
				q.PopFront()
				model = model[1:]
			default:
				k := rapid.IntRange(0, len(model)-1).Draw(rt, "remove")
				q.Remove(k)
				model = append(model[:k:k], model[k+1:]...)
			}
			require.Equal(rt, len(model), q.Len())
			for k, v := range model {
				require.Same(rt, v, q.At(k), "element %d", k)
			}
			if len(model) > 0 {
				require.Same(rt, model[0], q.Front())
			}
			held := 0
			for _, v := range q.buf {
				if v != nil {
					held++
				}
			}
			require.Equal(rt, len(model), held, "slots outside the queue are zero")
		}
	})
}
