package hier

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// What every rank gets back from the element-wise maximum of what each
// sent (ranksAgree): the slowest rank's burst and the fastest rank's call
// alone, for each candidate, whatever the ranks measured.
func TestRanksAgreeOnTheSlowestBurstAndTheFastestCallAlone(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ranks := rapid.IntRange(1, 8).Draw(t, "ranks")
		n := rapid.IntRange(1, maxCandidates).Draw(t, "candidates")
		alone := rapid.Bool().Draw(t, "alone")
		times := rapid.Int64Range(1, 1e9)
		var agreed []int64
		bursts := make([][]int64, ranks)
		singles := make([][]int64, ranks)
		for r := range ranks {
			bursts[r] = rapid.SliceOfN(times, n, n).Draw(t, "bursts")
			if alone {
				singles[r] = rapid.SliceOfN(times, n, n).Draw(t, "singles")
			}
			sent := ranksAgree(bursts[r], singles[r])
			require.Len(t, sent, len(bursts[r])+len(singles[r]))
			if agreed == nil {
				agreed = slices.Clone(sent)
			}
			for i, v := range sent {
				agreed[i] = max(agreed[i], v)
			}
		}
		burst, single := agreedTimings(agreed, n, alone)
		for i := range n {
			slowest, fastest := bursts[0][i], int64(0)
			for r := range ranks {
				slowest = max(slowest, bursts[r][i])
				if alone && (r == 0 || singles[r][i] < fastest) {
					fastest = singles[r][i]
				}
			}
			require.Equal(t, slowest, burst[i], "candidate %d's burst", i)
			if alone {
				require.Equal(t, fastest, single[i], "candidate %d alone", i)
			}
		}
		if !alone {
			require.Nil(t, single)
		}
	})
}
