package hier

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

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

// TestWaitInEveryPhase: Wait returns the Work's error, or ctx's, whether
// the Work ends (or ctx does) while Wait spins, while it naps, or once its
// naps have grown to their longest.
func TestWaitInEveryPhase(t *testing.T) {
	bad := errors.New("failed")
	for _, after := range []time.Duration{0, waitSpin / 2, waitSpin * 10, 20 * waitNapMax} {
		t.Run(fmt.Sprint("work ends after ", after), func(t *testing.T) {
			w := newWork()
			time.AfterFunc(after, func() { w.finish(bad) })
			require.ErrorIs(t, w.Wait(context.Background()), bad)
		})
		t.Run(fmt.Sprint("ctx ends after ", after), func(t *testing.T) {
			w := newWork()
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(after, cancel)
			require.ErrorIs(t, w.Wait(ctx), context.Canceled)
			require.False(t, w.IsCompleted())
		})
	}
}
