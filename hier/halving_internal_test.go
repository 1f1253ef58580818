package hier

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
)

// hdWorld draws a world size and a count: worlds up to 40 ranks (powers of
// two and the sizes around them), counts from 0 to a few times the world,
// or up to most.
func hdWorld(t *rapid.T, most int64) (w int, count int64) {
	w = rapid.OneOf(rapid.IntRange(1, 40), rapid.SampledFrom([]int{2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33})).
		Draw(t, "world")
	count = rapid.OneOf(rapid.Int64Range(0, 3*int64(w)+3), rapid.Int64Range(0, most)).Draw(t, "count")
	return w, count
}

// The halving partners pair the ranks of a power of two: an involution
// without fixed points, the partners differing in one bit, each bit once.
func TestHalvingPartnersAreSymmetric(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := hdPow(rapid.IntRange(1, 1<<12).Draw(t, "world"))
		require.Equal(t, p&(p-1), 0, "a power of two")
		k := hdLog2(p)
		require.Equal(t, p, 1<<k)
		r := rapid.IntRange(0, p-1).Draw(t, "rank")
		bits := 0
		for s := range k {
			q := hdPartner(p, r, s)
			require.NotEqual(t, r, q)
			require.GreaterOrEqual(t, q, 0)
			require.Less(t, q, p)
			require.Equal(t, r, hdPartner(p, q, s), "step %d", s)
			bits |= r ^ q
		}
		require.Equal(t, p-1, bits, "every bit once")
	})
}

// At every halving step a rank and its partner hold the same span, and
// what each keeps tiles it: the two halves are disjoint, adjacent and
// cover it, floor and ceil of its length, without padding.
func TestHalvingHalvesTileTheSpan(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w, count := hdWorld(t, 1<<40)
		p := hdPow(w)
		r := rapid.IntRange(0, p-1).Draw(t, "rank")
		for s := range hdLog2(p) {
			q := hdPartner(p, r, s)
			held := hdHeld(count, p, r, s)
			require.Equal(t, held, hdHeld(count, p, q, s), "step %d: partners hold one span", s)
			keep, give := hdHalves(held, p, r, s)
			theirs, _ := hdHalves(held, p, q, s)
			require.Equal(t, give, theirs, "step %d: what one gives the other keeps", s)
			lo, hi := keep, give
			if r&(p>>(s+1)) != 0 {
				lo, hi = give, keep
			}
			require.Equal(t, held.lo, lo.lo)
			require.Equal(t, lo.end(), hi.lo)
			require.Equal(t, held.end(), hi.end())
			require.Equal(t, held.n/2, lo.n, "the lower half is the floor")
		}
	})
}

// Once reduced, the spans the ranks of the power of two own tile the call
// in rank order, each within one element of count/P.
func TestHalvingOwnedSpansTileTheCall(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w, count := hdWorld(t, 1<<40)
		p := hdPow(w)
		var at int64
		for r := range p {
			sc := hdPlan(w, r, count)
			require.Equal(t, at, sc.owned.lo, "rank %d", r)
			require.LessOrEqual(t, sc.owned.n, count/int64(p)+1)
			require.GreaterOrEqual(t, sc.owned.n, count/int64(p))
			at = sc.owned.end()
		}
		require.Equal(t, count, at)
		for r := p; r < w; r++ {
			require.Zero(t, hdPlan(w, r, count).owned.n, "an extra rank owns nothing")
		}
	})
}

// Running every rank's schedule on contributions, one count per rank per
// element, leaves every element of every rank with each rank's
// contribution exactly once; every send meets the peer's receive of the
// same span in the same step, every rank has as many steps, the steps take
// 2·log2(P) (+2 with a fold) exchanges, and the scratch holds every
// reduced receive.
func TestHalvingDoublingReducesEachContributionOnce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w, count := hdWorld(t, 300)
		checkHalvingDoubling(t, w, count)
	})
}

func TestHalvingDoublingSmallWorlds(t *testing.T) {
	for w := 1; w <= 17; w++ {
		for _, count := range []int64{0, 1, int64(w) - 1, int64(w), int64(w) + 1, 2*int64(w) + 3, 1001} {
			t.Run(fmt.Sprintf("%d/%d", w, count), func(t *testing.T) { checkHalvingDoubling(t, w, count) })
		}
	}
}

func checkHalvingDoubling(t require.TestingT, w int, count int64) {
	checkSchedule(t, w, count, hdPlan, 2*hdLog2(hdPow(w)))
}

// Recursive doubling: every contribution once on every rank, log2(P)
// exchanges of the whole call (+2 with a fold), and every rank of the
// power of two holds the whole result before the unfold.
func TestRecursiveDoublingReducesEachContributionOnce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w, count := hdWorld(t, 300)
		checkSchedule(t, w, count, rdPlan, hdLog2(hdPow(w)))
	})
}

func TestRecursiveDoublingSmallWorlds(t *testing.T) {
	for w := 1; w <= 17; w++ {
		for _, count := range []int64{0, 1, int64(w) + 1, 1001} {
			t.Run(fmt.Sprintf("%d/%d", w, count), func(t *testing.T) {
				checkSchedule(t, w, count, rdPlan, hdLog2(hdPow(w)))
				for r := range hdPow(w) {
					sc := rdPlan(w, r, count)
					require.Equal(t, span{0, count}, sc.owned, "rank %d owns the whole call", r)
					if w > 1 {
						require.Equal(t, count, sc.scratch(), "the scratch takes the whole call")
					}
				}
			})
		}
	}
}

// checkSchedule runs the schedules plan gives every rank (core steps
// each, plus the fold's two where w is not a power of two) and checks
// what TestHalvingDoublingReducesEachContributionOnce says.
func checkSchedule(t require.TestingT, w int, count int64, plan func(w, r int, count int64) hdSchedule, core int) {
	plans := make([]hdSchedule, w)
	for r := range w {
		plans[r] = plan(w, r, max(count, 0))
	}
	p := hdPow(w)
	want := core
	if w > p {
		want += 2
	}
	// state[r][i][j]: how many times rank j's contribution is in element i
	// of rank r's buffer.
	state := make([][][]int, w)
	for r := range state {
		state[r] = make([][]int, count)
		for i := range state[r] {
			state[r][i] = make([]int, w)
			state[r][i][r] = 1
		}
	}
	for r := range w {
		require.Len(t, plans[r].steps, want, "rank %d's steps", r)
		require.LessOrEqual(t, plans[r].scratch(), count)
	}
	for s := range want {
		next := make([][][]int, w)
		for r := range w {
			next[r] = make([][]int, count)
			for i := range next[r] {
				next[r][i] = append([]int(nil), state[r][i]...)
			}
		}
		for r := range w {
			st := plans[r].steps[s]
			if st.peer < 0 {
				require.Zero(t, st.send.n+st.recv.n, "rank %d step %d: no peer, nothing to move", r, s)
				continue
			}
			require.NotEqual(t, r, st.peer)
			peer := plans[st.peer].steps[s]
			require.Equal(t, r, peer.peer, "step %d: %d's peer %d pairs with it", s, r, st.peer)
			require.Equal(t, st.recv, peer.send, "step %d: %d receives what %d sends", s, r, st.peer)
			require.Equal(t, st.send, peer.recv, "step %d: %d sends what %d receives", s, r, st.peer)
			require.LessOrEqual(t, st.recv.end(), count)
			if st.reduce {
				require.LessOrEqual(t, st.recv.n, plans[r].scratch(), "the scratch holds it")
			}
			for i := st.recv.lo; i < st.recv.end(); i++ {
				for j := range w {
					if st.reduce {
						next[r][i][j] = state[r][i][j] + state[st.peer][i][j]
					} else {
						next[r][i][j] = state[st.peer][i][j]
					}
				}
			}
		}
		state = next
		if s+1 == plans[0].reduced {
			for r := range p { // the owned spans are complete before the all-gather
				o := plans[r].owned
				for i := o.lo; i < o.end(); i++ {
					for j := range w {
						if state[r][i][j] != 1 { // require only on failure: it costs a lot per element
							require.Equal(t, 1, state[r][i][j], "rank %d owns element %d: rank %d's part", r, i, j)
						}
					}
				}
			}
		}
	}
	for r := range w {
		require.Equal(t, plans[0].reduced, plans[r].reduced)
		for i := range count {
			for j := range w {
				if state[r][i][j] != 1 {
					require.Equal(t, 1, state[r][i][j], "rank %d, element %d: rank %d's part", r, i, j)
				}
			}
		}
	}
}

// Avg of floats scales every input by 1/W first and sums; Avg of integers
// sums and divides once, by the world size; the other operators apply at
// every step, with nothing to divide.
func TestHalvingDoublingOps(t *testing.T) {
	for _, tc := range []struct {
		op        fairgo.Op
		dt        fairgo.DType
		step      fairgo.Op
		pre, post int
	}{
		{fairgo.Sum, fairgo.Float32, fairgo.Sum, 0, 0},
		{fairgo.Avg, fairgo.Float32, fairgo.Sum, 7, 0},
		{fairgo.Avg, fairgo.BFloat16, fairgo.Sum, 7, 0},
		{fairgo.Avg, fairgo.Int32, fairgo.Sum, 0, 7},
		{fairgo.Avg, fairgo.Uint8, fairgo.Sum, 0, 7},
		{fairgo.Max, fairgo.Float16, fairgo.Max, 0, 0},
		{fairgo.Min, fairgo.Int64, fairgo.Min, 0, 0},
		{fairgo.Prod, fairgo.Float64, fairgo.Prod, 0, 0},
	} {
		step, pre, post := hdOps(tc.op, tc.dt, 7)
		require.Equal(t, tc.step, step, "%v %v", tc.op, tc.dt)
		require.Equal(t, tc.pre, pre, "%v %v", tc.op, tc.dt)
		require.Equal(t, tc.post, post, "%v %v", tc.op, tc.dt)
	}
}
