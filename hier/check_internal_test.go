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
