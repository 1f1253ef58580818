package hier

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStreamWaitSeesTheFailure: a Work that fails without reaching the
// device (a pointer CheckRange refuses) makes StreamWait return its error,
// whenever StreamWait wakes: a nil there would order the caller's stream
// after nothing and report success.
func TestStreamWaitSeesTheFailure(t *testing.T) {
	bad := errors.New("refused")
	for range 20000 {
		w := newWork()
		got := make(chan error, 1)
		go func() { got <- w.StreamWait(context.Background(), nil) }()
		w.finish(bad)
		require.ErrorIs(t, <-got, bad)
	}
}
