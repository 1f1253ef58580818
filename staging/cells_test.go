package staging

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// Cells tile [Base, Base+Bytes) exactly, in [d][m] order.
func TestCellsTileTheArray(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := Cells{
			Base:     uintptr(rapid.IntRange(0, 1<<20).Draw(t, "base")) * 256,
			Machines: rapid.IntRange(1, 16).Draw(t, "M"),
			Devices:  rapid.IntRange(1, 16).Draw(t, "D"),
			N:        rapid.Int64Range(0, 1<<12).Draw(t, "n"),
			ElemSize: rapid.SampledFrom([]int64{1, 2, 4, 8}).Draw(t, "es"),
		}
		next := c.Base
		for d := 0; d < c.Devices; d++ {
			require.Equal(t, c.Cell(d, 0), c.Row(d))
			for m := 0; m < c.Machines; m++ {
				require.Equal(t, next, c.Cell(d, m))
				next += uintptr(c.N * c.ElemSize)
			}
			require.Equal(t, c.Row(d)+uintptr(c.RowCount()*c.ElemSize), next)
		}
		require.Equal(t, c.Base+uintptr(c.Bytes()), next)
	})
}
