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
