package hier

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
)

// TestJudgeTrustsNoMatchAfterAnAbort: a check read after an abort never
// counts as a match, nor as a call-number mismatch (a slot left half
// reduced or holding another call); a shape mismatch stays one.
func TestJudgeTrustsNoMatchAfterAnAbort(t *testing.T) {
	cause := &TimeoutError{}
	shape := &MismatchError{Seq: 7, Field: "count", This: "10", Low: "10", High: "12"}
	number := &MismatchError{Seq: 7, Field: "call number", This: "7", Low: "3", High: "7"}
	for _, c := range []struct {
		name           string
		decided, cause error
		want           error // errors.Is target
		notMismatch    bool
	}{
		{"a match, healthy", nil, nil, nil, true},
		{"a shape mismatch, healthy", shape, nil, fairgo.ErrMismatch, false},
		{"a call-number mismatch, healthy", number, nil, fairgo.ErrMismatch, false},
		{"a match after an abort", nil, cause, cause, true},
		{"a call-number mismatch after an abort", number, cause, cause, true},
		{"a shape mismatch after an abort", shape, cause, fairgo.ErrMismatch, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := judge(c.decided, c.cause)
			if c.want == nil {
				require.NoError(t, got)
				return
			}
			require.ErrorIs(t, got, c.want)
			require.Equal(t, !c.notMismatch, errors.Is(got, fairgo.ErrMismatch))
		})
	}
}

// TestImageAllocatesNothingOnAMatch: writing a call's image and deciding
// a matching one are on every checked call's path and allocate nothing; a
// call that differs is still reported.
func TestImageAllocatesNothingOnAMatch(t *testing.T) {
	q := &request{kind: kindAllReduce, op: fairgo.Sum, seq: 5, a: fairgo.Tensor{DType: fairgo.Float32, Count: 1000}}
	img := make(image, 8*imageWords)
	var err error
	allocs := testing.AllocsPerRun(100, func() {
		img.put(q, 1, 4)
		err = img.decide(q, 4)
	})
	require.NoError(t, err)
	require.Zero(t, allocs)

	// The element-wise maximum of two ranks' images, as the check reduces
	// them, where the counts differ.
	other := &request{kind: kindAllReduce, op: fairgo.Sum, seq: 5, a: fairgo.Tensor{DType: fairgo.Float32, Count: 1001}}
	theirs := make(image, 8*imageWords)
	theirs.put(other, 2, 4)
	merged := make(image, 8*imageWords)
	for w := range imageWords {
		merged.set(false, w, max(img.get(false, w), theirs.get(false, w)))
	}
	var mm *MismatchError
	require.ErrorAs(t, merged.decide(q, 4), &mm)
	require.Equal(t, "count", mm.Field)
}

// TestMismatchPostReadsAgainstThePeersCall: what a rank leaves on the
// Board for the mismatch it aborts on (mismatchPost) reads, on a peer,
// as the same mismatch with the peer's own value (postedMismatch): a
// check's reduced image with the ranks' range, a fingerprint's field
// without one. A fingerprint's refusal posts nothing (the refusing rank
// posts its own note), and a post that names no field a check names, or
// that is no image, says nothing.
func TestMismatchPostReadsAgainstThePeersCall(t *testing.T) {
	call := func(count int64, op fairgo.Op) *request {
		return &request{kind: kindAllReduce, op: op, seq: 5, a: fairgo.Tensor{DType: fairgo.Float32, Count: count}}
	}
	a, b := make(image, 8*imageWords), make(image, 8*imageWords)
	a.put(call(1000, fairgo.Sum), 0, 4)
	b.put(call(1001, fairgo.Sum), 3, 4)
	merged := make(image, 8*imageWords)
	for w := range imageWords {
		merged.set(false, w, max(a.get(false, w), b.get(false, w)))
	}
	var found *MismatchError
	require.ErrorAs(t, merged.decide(call(1000, fairgo.Sum), 4), &found)

	var read *MismatchError
	require.ErrorAs(t, postedMismatch(mismatchPost(found), call(1001, fairgo.Sum), 4), &read)
	require.Equal(t, MismatchError{Seq: 5, Call: "allreduce of 1001 float32", Field: "count", This: "1001",
		Low: "1000", High: "1001"}, MismatchError{Seq: read.Seq, Call: read.Call, Field: read.Field, This: read.This,
		Low: read.Low, High: read.High})

	byFingerprint := &MismatchError{Seq: 5, Call: "allreduce of 1000 float32", Field: "operator", This: "sum"}
	require.ErrorAs(t, postedMismatch(mismatchPost(byFingerprint), call(1000, fairgo.Max), 4), &read)
	require.Equal(t, "operator", read.Field)
	require.Equal(t, "max", read.This)
	require.Empty(t, read.Low+read.High)
	require.ErrorContains(t, read, "found by the call's fingerprint")
	require.ErrorAs(t, postedMismatch(mismatchPost(&MismatchError{Seq: 5, Field: "size"}), call(1000, fairgo.Sum), 4), &read)
	require.Equal(t, "4000 bytes", read.This)

	require.Nil(t, mismatchPost(&MismatchError{Seq: 5, Field: "size", Refusal: &Refusal{Rank: -1}}))
	require.NoError(t, postedMismatch([]byte(postedField+"colour"), call(1000, fairgo.Sum), 4))
	require.NoError(t, postedMismatch([]byte("not a post"), call(1000, fairgo.Sum), 4))
	require.NoError(t, postedMismatch(nil, call(1000, fairgo.Sum), 4))
}
