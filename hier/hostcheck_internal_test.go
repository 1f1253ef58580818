package hier

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// A slot is reusable exactly when every rank's cursor has passed the call
// that held it before (or it was never used), whatever post remembered of
// the cursors (freed): a slot reused early overwrites an image a peer has
// yet to read, and the check decides on the wrong call's image.
func TestSlotReusableOnlyOnceEveryRankDecided(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		size := rapid.IntRange(1, 8).Draw(t, "size")
		h := &hostCheck{words: make([]uint64, hostWords(size)), size: size}
		cursors := make([]uint64, size)
		seq := uint64(hostFirstCall)
		for range rapid.IntRange(1, 200).Draw(t, "steps") {
			if rapid.Bool().Draw(t, "advance") {
				k := rapid.IntRange(0, size-1).Draw(t, "rank")
				cursors[k] = min(seq, cursors[k]+rapid.Uint64Range(0, 3*hostSlots).Draw(t, "by"))
				*h.cursor(k) = cursors[k]
				continue
			}
			want := seq < hostFirstCall+hostSlots
			if !want {
				want = true
				for _, c := range cursors {
					want = want && c >= seq-hostSlots
				}
			}
			require.Equal(t, want, h.reusable(seq), "call %d, cursors %v, freed %d", seq, cursors, h.freed)
			if want {
				seq += rapid.Uint64Range(1, 4).Draw(t, "next")
			}
		}
	})
}
