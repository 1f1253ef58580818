package hier_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
)

// On NCCL, a call that differs between ranks never completes without an
// error on any rank. With a fingerprint (a small call carrying its check
// in its own data, the default, on a flat, rail or pairwise route), an
// operator that differs
// leaves the collective's steps aligned and fails on every rank with the
// field named. A count that differs misaligns the data collective: with a
// fingerprint or with the separate check (WithFingerprintMax(0)) it ends in
// the mismatch (read from the Board where every exchange hangs) or (a
// pairwise route's exchanges, which NCCL finds truncated) the abort on
// every rank, never in nil nor in the watchdog's timeout.
func TestGPUFingerprintFindsMismatches(t *testing.T) {
	for _, g := range gpuGrids(t, [2]int{1, 2}, [2]int{2, 2}, [2]int{1, 4}) {
		if g[0]*g[1] == 1 {
			t.Log("one rank: nothing to mismatch (the launcher form runs these cases on one GPU)")
			continue
		}
		type mismatch struct {
			name    string
			count   func(rank, n int) int
			op      func(rank int) fairgo.Op
			aligned bool           // the launch's steps stay aligned: a *MismatchError with the range
			fp      bool           // fingerprinted (the default), else the separate check (WithFingerprintMax(0))
			algo    hier.Algorithm // Auto: flat at this size; a rail or pairwise route carries the fingerprint too
		}
		same := func(_, n int) int { return n }
		sum := func(int) fairgo.Op { return fairgo.Sum }
		plusOne := func(r, n int) int {
			if r == 0 {
				return n + 1
			}
			return n
		}
		twice := func(r, n int) int {
			if r == 0 {
				return 2 * n
			}
			return n
		}
		avgOnZero := func(r int) fairgo.Op {
			if r == 0 {
				return fairgo.Avg
			}
			return fairgo.Sum
		}
		algos := []hier.Algorithm{hier.Auto}
		if g[0] > 1 {
			algos = append(algos, hier.RailAllToAll, hier.HalvingDoubling)
		}
		var cases []mismatch
		for _, algo := range algos {
			cases = append(cases, mismatch{fmt.Sprintf("operator/%v", algo), same, avgOnZero, true, true, algo})
			for _, fp := range []bool{true, false} {
				cases = append(cases, mismatch{fmt.Sprintf("count+1/fp=%v/%v", fp, algo), plusOne, sum, false, fp, algo},
					mismatch{fmt.Sprintf("count*2/fp=%v/%v", fp, algo), twice, sum, false, fp, algo})
			}
		}
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%dx%d/%s", g[0], g[1], tc.name), func(t *testing.T) {
				opts := []hier.Option{hier.WithTimeout(5 * time.Second)}
				if tc.algo != hier.Auto {
					opts = append(opts, hier.WithAlgorithm(tc.algo), hier.WithFlatThreshold(hier.FlatNever))
				}
				if tc.fp {
					// The collective check: on one machine the first call's
					// carries the agreement on shared memory, never a
					// fingerprint.
					opts = append(opts, hier.WithSharedMemoryDir(""))
				} else {
					opts = append(opts, hier.WithFingerprintMax(0))
				}
				w := freshGPUWorld(t, g[0], g[1], opts...)
				const n = 4 << 10              // 16 KiB of float32: below Auto's first measured class, so flat and fingerprinted
				in := make([][]byte, w.size()) // by world rank: under a launcher, more than the local ranks
				for k := range in {
					in[k] = make([]byte, 4*tc.count(k, n))
				}
				ts := w.upload(t, fairgo.Float32, in)
				var works []*hier.Work
				for r, red := range w.reducers {
					works = append(works, red.AllReduce(context.Background(), ts[r], tc.op(w.rank(r))))
				}
				for r, wk := range works {
					err := wk.Wait(context.Background())
					t.Logf("rank %d: %v", w.rank(r), err)
					require.Error(t, err, "rank %d", w.rank(r))
					if tc.aligned {
						var me *hier.MismatchError
						require.ErrorAs(t, err, &me, "rank %d", w.rank(r))
						require.Contains(t, []string{"operator", "shape"}, me.Field) // "shape": a field hash that collided
						continue
					}
					// A pairwise route's exchanges of different sizes may also
					// end in NCCL's own finding ("message truncated"): the
					// communicators are aborted, and so is the call. Where
					// every exchange hangs, the ranks compare their calls on
					// the Board (every GPU world has one) after a second,
					// before the watchdog's 5 s.
					require.True(t, errors.Is(err, fairgo.ErrMismatch) ||
						tc.algo != hier.Auto && errors.Is(err, fairgo.ErrAborted),
						"rank %d: %v", w.rank(r), err)
				}
				for _, red := range w.reducers {
					require.Equal(t, tc.fp, hier.FingerprintedCalls(red) > 0)
				}
			})
		}
	}
}

// Past relayMeshMachines machines (under a launcher: fairrun 6x1 or
// larger), the check through shared memory leaves a flat call to its
// fingerprint and posts a call of several exchanges for the relay: both
// kinds, in runs longer than the shared memory's slots, give the
// reference's results, and a flat call whose operator differs fails on
// every rank with the field named.
func TestGPURouteChoosesTheCheck(t *testing.T) {
	g := gpuGrid(t)
	if g[0] <= hier.RelayMeshMachines {
		t.Logf("%dx%d: at most %d machines check through the relay's mesh alone (the launcher form of 6x1 or more runs this test)",
			g[0], g[1], hier.RelayMeshMachines)
		return
	}
	const flatBelow = 16 << 10 // bytes: below, one flat collective; from it, halving-doubling
	w := freshGPUWorld(t, g[0], g[1], hier.WithAlgorithm(hier.HalvingDoubling), hier.WithFlatThreshold(flatBelow),
		hier.WithTimeout(time.Minute))
	n := w.size()
	for k := range hier.SharedMemoryFirstCall {
		in := hashInputs(fairgo.Float32, fairgo.Sum, n, 1, uint64(k))
		_, err := w.allReduce(t, fairgo.Float32, fairgo.Sum, in)
		require.NoError(t, err)
		w.freeAllocs()
	}
	for _, red := range w.reducers {
		require.True(t, hier.RelayedCheck(red), "the check goes through shared memory and the relay")
	}
	fp0 := hier.FingerprintedCalls(w.reducers[0])
	flat := 0
	for run, count := range []int{1000, 8000, 1000, 8000} { // elements: flat, halving-doubling, ...
		for k := range hier.SharedMemorySlots + 3 {
			in := hashInputs(fairgo.Float32, fairgo.Sum, n, count, uint64(run*1000+k))
			out, err := w.allReduce(t, fairgo.Float32, fairgo.Sum, in)
			require.NoError(t, err, "run %d, call %d", run, k)
			require.NoError(t, checkParallel(fairgo.Float32, fairgo.Sum, in, out), "run %d, call %d", run, k)
			w.freeAllocs()
			if 4*count < flatBelow {
				flat++
			}
		}
	}
	require.Equal(t, fp0+uint64(flat), hier.FingerprintedCalls(w.reducers[0]), "the flat calls, and only they")
	{ // a flat call whose operator differs: the fingerprint alone sees it (the relay's kind: hostcheck_test.go)
		const count = 1000
		in := make([][]byte, n)
		for k := range in {
			in[k] = make([]byte, 4*count)
		}
		ts := w.upload(t, fairgo.Float32, in)
		var works []*hier.Work
		for r, red := range w.reducers {
			op := fairgo.Sum
			if w.rank(r) == 0 {
				op = fairgo.Avg
			}
			works = append(works, red.AllReduce(context.Background(), ts[r], op))
		}
		for r, wk := range works {
			err := wk.Wait(context.Background())
			var me *hier.MismatchError
			require.ErrorAs(t, err, &me, "rank %d", w.rank(r))
			require.Contains(t, []string{"operator", "shape"}, me.Field, "rank %d: %v", w.rank(r), err) // "shape": a field hash that collided
		}
	}
}
