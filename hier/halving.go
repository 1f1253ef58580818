package hier

import "github.com/fairgo/fairgo"

// Halving-doubling (Rabenseifner's allreduce) over the world
// communicator, for small calls on many ranks. With P = 2^k ranks, the
// reduce-scatter takes k steps: at step s every rank exchanges half of
// the span it still holds with the partner whose rank differs in bit
// P>>(s+1), and adds the half it keeps to the partner's copy of it; the
// all-gather retraces the steps, each rank sending the span it owns and
// receiving its partner's. That is 2·log2(P) latencies where NCCL's ring
// pays 2(P−1), for the same 2(P−1)/P of the call on each rank's link.
//
// A world that is not a power of two folds first: with P the largest
// power of two not above the world size W, rank P+i (an extra rank)
// hands its whole buffer to rank i, which adds it to its own, sits out
// the 2·log2(P) steps, and gets the result back from rank i at the end:
// two more steps, the whole call each.
//
// Spans are halved as they come: the lower half of n elements has
// floor(n/2), the upper ceil(n/2), so nothing is padded and a count below
// the world size leaves some spans empty (an empty exchange still takes
// part in the step, with nothing to send).
//
// The schedule here is pure arithmetic; executor.halvingDoubling
// (halving_run.go) enqueues it.

// span is the elements [lo, lo+n) of a call.
type span struct{ lo, n int64 }

func (s span) end() int64 { return s.lo + s.n }

// hdStep is one step of the schedule of one rank: send the elements of
// send to peer and receive the elements of recv from it (peer −1: the
// rank sits this step out, with nothing to send or receive). reduce: the
// received elements go to the scratch buffer and are added to recv's
// elements of the rank's buffer; otherwise they land in place.
type hdStep struct {
	peer       int
	send, recv span
	reduce     bool
}

// hdSchedule is what one rank does in a halving-doubling allreduce of
// count elements.
type hdSchedule struct {
	steps []hdStep
	// owned is the span this rank holds fully reduced after steps
	// [0, reduced): the place to divide an average once, before the
	// all-gather spreads it. Empty on an extra rank.
	owned   span
	reduced int
}

// hdPow is the largest power of two not above w (w ≥ 1).
func hdPow(w int) int {
	p := 1
	for p <= w/2 {
		p *= 2
	}
	return p
}

// hdLog2 is log2 of a power of two.
func hdLog2(p int) int {
	k := 0
	for 1<<k < p {
		k++
	}
	return k
}

// hdPartner is the partner of rank r (< p, a power of two) at halving
// step s: the rank that differs in bit p>>(s+1). It is an involution
// without fixed points.
func hdPartner(p, r, s int) int { return r ^ (p >> (s + 1)) }

// hdHalves splits sp at halving step s between rank r and its partner: r
// keeps the lower half (floor) when its bit p>>(s+1) is clear, the upper
// (ceil) when it is set, and gives the other.
func hdHalves(sp span, p, r, s int) (keep, give span) {
	lower := span{sp.lo, sp.n / 2}
	upper := span{sp.lo + sp.n/2, sp.n - sp.n/2}
	if r&(p>>(s+1)) != 0 {
		return upper, lower
	}
	return lower, upper
}

// hdHeld is the span rank r (< p) holds before halving step s (s = 0: the
// whole call; s = log2(p): the span it owns once reduced).
func hdHeld(count int64, p, r, s int) span {
	sp := span{0, count}
	for i := range s {
		sp, _ = hdHalves(sp, p, r, i)
	}
	return sp
}

// hdPlan is the schedule of rank r of a world of w ranks for count
// elements. Every rank's schedule has the same number of steps, so that
// the steps of all ranks pair up in order.
func hdPlan(w, r int, count int64) hdSchedule {
	return folded(w, r, count, func(sc *hdSchedule, p, r int) {
		k := hdLog2(p)
		for s := range k { // reduce-scatter
			keep, give := hdHalves(hdHeld(count, p, r, s), p, r, s)
			sc.steps = append(sc.steps, hdStep{peer: hdPartner(p, r, s), send: give, recv: keep, reduce: true})
		}
		sc.reduced = len(sc.steps)
		sc.owned = hdHeld(count, p, r, k)
		for s := k - 1; s >= 0; s-- { // all-gather, the steps retraced
			mine, theirs := hdHalves(hdHeld(count, p, r, s), p, r, s)
			sc.steps = append(sc.steps, hdStep{peer: hdPartner(p, r, s), send: mine, recv: theirs})
		}
	})
}

// rdPlan is the schedule of rank r of a world of w ranks for count
// elements in recursive doubling: the fold of hdPlan, then log2(P) steps
// in each of which a rank of the power of two exchanges its whole buffer
// with the partner whose rank differs in bit 2^s and adds what it
// receives, then the unfold. Half the steps of halving-doubling (each
// a latency), every one of them moving the whole call: for calls small
// enough that a step's latency outweighs its bytes. Partners add the same
// two operands, so every rank ends with the same bits.
func rdPlan(w, r int, count int64) hdSchedule {
	all := span{0, count}
	return folded(w, r, count, func(sc *hdSchedule, p, r int) {
		for s := range hdLog2(p) {
			sc.steps = append(sc.steps, hdStep{peer: r ^ (1 << s), send: all, recv: all, reduce: true})
		}
		sc.reduced = len(sc.steps)
		sc.owned = all
	})
}

// folded is the schedule of rank r of a world of w ranks for count
// elements around core, the steps of the ranks of the power of two P ≤ w:
// where w is not a power of two, rank P+i first hands its buffer to rank
// i, which adds it to its own, and gets the result back from rank i at
// the end. core appends the steps of rank r < P and sets reduced and
// owned; a rank from P on sits as many steps out as rank 0 takes, so that
// every rank's schedule has the same number of steps and the steps pair up
// in order.
func folded(w, r int, count int64, core func(sc *hdSchedule, p, r int)) hdSchedule {
	p := hdPow(w)
	extra := w - p
	all := span{0, count}
	idle := hdStep{peer: -1}
	fold := func(inward bool) hdStep {
		switch {
		case r >= p && inward:
			return hdStep{peer: r - p, send: all}
		case r >= p:
			return hdStep{peer: r - p, recv: all}
		case r < extra && inward:
			return hdStep{peer: r + p, recv: all, reduce: true}
		case r < extra:
			return hdStep{peer: r + p, send: all}
		}
		return idle
	}
	var sc hdSchedule
	if extra > 0 {
		sc.steps = append(sc.steps, fold(true))
	}
	if r < p {
		core(&sc, p, r)
	} else {
		var ref hdSchedule // rank 0's steps, for their number
		core(&ref, p, 0)
		for range len(ref.steps) {
			sc.steps = append(sc.steps, idle)
		}
		sc.reduced = len(sc.steps) - (len(ref.steps) - ref.reduced)
	}
	if extra > 0 {
		sc.steps = append(sc.steps, fold(false))
	}
	return sc
}

// scratch is the elements a rank receives into its scratch buffer at
// once: the largest span it reduces.
func (sc hdSchedule) scratch() int64 {
	var n int64
	for _, st := range sc.steps {
		if st.reduce {
			n = max(n, st.recv.n)
		}
	}
	return n
}

// Where halving-doubling is among Auto's candidates. Below hdMinRanks it
// saves no step: on 2 ranks it is NCCL's ring (two exchanges), on 3 the
// fold makes it four, as many as the ring. Above hdMaxBytes the
// bandwidth term dominates: halving-doubling moves as much as the ring
// only on a power of two (the fold adds the whole call twice), its steps
// do not overlap one another as NCCL's pipelined chunks do, and NCCL's
// point-to-point operations use fewer channels than its collectives; it
// cannot win there, and every candidate lengthens the calibration.
const (
	hdMinRanks = 4
	hdMaxBytes = 4 << 20 // classes timed at this size or less
	// hdMaxChunkBytes bounds one run of the schedule, and so the scratch
	// buffer: a larger call (WithAlgorithm(HalvingDoubling)) runs in
	// pieces of this size, one after the other.
	hdMaxChunkBytes = 16 << 20
)

// hdOps are, for op over a world of w ranks of elements dt, the operator
// of every step and how Avg divides by w: on floating types each rank
// scales its input by 1/w before the first step (pre), as NCCL's Avg does,
// so that no partial sum exceeds the largest input (a sum of 16-bit
// values near their maximum would overflow on the way); on integers the
// owned span is divided once after the reduce steps (post), truncating,
// as an integer Avg does everywhere. 0: no division.
func hdOps(op fairgo.Op, dt fairgo.DType, w int) (step fairgo.Op, pre, post int) {
	switch {
	case op != fairgo.Avg:
		return op, 0, 0
	case dt.IsFloat():
		return fairgo.Sum, w, 0
	}
	return fairgo.Sum, 0, w
}
