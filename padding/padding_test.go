package padding

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// Cells of a view tile [Base, Base+Bytes) exactly, in [d][m] order.
func TestViewCellsTileTheSlot(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := View{
			Base:     uintptr(rapid.IntRange(0, 1<<20).Draw(t, "base")) * 256,
			Machines: rapid.IntRange(1, 16).Draw(t, "M"),
			Devices:  rapid.IntRange(1, 16).Draw(t, "D"),
			PadShard: rapid.Int64Range(0, 16).Draw(t, "p"),
			ElemSize: rapid.SampledFrom([]int64{1, 2, 4, 8}).Draw(t, "es"),
		}
		next := v.Base
		for d := 0; d < v.Devices; d++ {
			require.Equal(t, v.Cell(d, 0), v.Row(d))
			for m := 0; m < v.Machines; m++ {
				require.Equal(t, next, v.Cell(d, m))
				next += uintptr(v.PadShard * v.ElemSize)
			}
		}
		require.Equal(t, v.Base+uintptr(v.Bytes()), next)
	})
}
