package hier_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/streams"
)

// countsComm is a null communicator that records the element counts of
// its allreduces.
type countsComm struct {
	nullComm
	mu     *sync.Mutex
	counts *[]int64
}

func (c countsComm) AllReduce(_, _ uintptr, n int64, _ fairgo.DType, _ fairgo.Op, _ streams.Stream) error {
	c.mu.Lock()
	*c.counts = append(*c.counts, n)
	c.mu.Unlock()
	return nil
}

// Auto times each candidate with the check its calls will carry: a route
// of one collective with a fingerprint inside it (its allreduces reduce
// the staged copy: StagedCount elements), the others with a separate check beside
// every call (a collective on the check communicator), and nothing more
// without a check or where shared memory checks the calls. A route of several collectives pays for a separate
// check what a single one does not, and only timing both shows it.
func TestCalibrationTimesTheCheck(t *testing.T) {
	const size = 256 << 10
	for _, tc := range []struct {
		name               string
		opts               []hier.Option
		fingerprinted, sep bool // calibration allreduces with a fingerprint; check collectives
		own                int  // the call's own check collectives
	}{
		// Calls are checked in shared memory past the agreement, which
		// call 1's check carries (its image, and the relays' gather).
		{"default", nil, false, false, 2},
		{"no shared memory", []hier.Option{hier.WithSharedMemoryDir("")}, true, true, 0},
		{"no fingerprints", []hier.Option{hier.WithSharedMemoryDir(""), hier.WithFingerprintMax(0)}, false, true, 1},
		{"no check", []hier.Option{hier.WithCheck(false)}, false, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var world, check []int64
			rk := nullRank(2, 1)
			rk.Comms.World = countsComm{rk.Comms.World.(nullComm), &mu, &world}
			rk.Comms.Check = countsComm{rk.Comms.Check.(nullComm), &mu, &check}
			ctx := context.Background()
			r, err := hier.NewReducer(ctx, rk, append([]hier.Option{hier.WithTimeout(time.Minute),
				hier.WithLogger(slog.New(slog.DiscardHandler))}, tc.opts...)...)
			require.NoError(t, err)
			defer func() { require.NoError(t, r.Close()) }()
			ptr, err := rk.Device.Alloc(size)
			require.NoError(t, err)
			tn := fairgo.Tensor{Ptr: ptr, Bytes: size, Count: size / 4, DType: fairgo.Float32}
			require.NoError(t, r.AllReduce(ctx, tn, fairgo.Sum).Wait(ctx))
			require.Positive(t, hier.CalibrationCalls(r), "the size class was calibrated")
			mu.Lock()
			defer mu.Unlock()
			// Calibration calls are timed at the call's size (the class's
			// first); with a fingerprint, the staged copy's count.
			// The call's own fingerprinted allreduce is one of them.
			var withFingerprint int
			for _, n := range world {
				if n == hier.StagedCount(size/4, 4, 2) {
					withFingerprint++
				}
			}
			// The call's own check: a fingerprint after its data, one
			// separate collective, or the agreement's two.
			timedChecks := len(check) - tc.own
			require.Equal(t, tc.fingerprinted, withFingerprint > 1, "flat timed with its fingerprint (world allreduces %v)", world)
			require.Equal(t, tc.sep, timedChecks > 0, "check collectives timed beside the other routes: %d", len(check))
		})
	}
}
