package hier_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/sim"
)

// TestWaitCompletesCallsWithoutTheWatcher holds every rank's watcher and
// waits for the last of several calls: the Wait must complete it, and every
// call before it in call order, with the right data, on its own. Before and
// after, with the watchers going, calls complete as usual. With the
// fingerprint carrying the check (two machines, the default), with the
// separate check (its verdict the checker's, the watcher held or not),
// with the check in shared memory (one machine; its first calls take the
// separate check), and without a check.
func TestWaitCompletesCallsWithoutTheWatcher(t *testing.T) {
	for _, tc := range []struct {
		name          string
		machines      int
		opts          []hier.Option
		fingerprinted bool
	}{
		{"fingerprinted", 2, nil, true},
		{"separate-check", 2, []hier.Option{hier.WithFingerprintMax(0)}, false},
		{"separate-check/inline", 2, []hier.Option{hier.WithFingerprintMax(0), hier.WithInlineEnqueue(true)}, false},
		{"shared-memory", 1, nil, false},
		{"shared-memory/inline", 1, []hier.Option{hier.WithInlineEnqueue(true)}, false},
		{"unchecked", 2, []hier.Option{hier.WithCheck(false)}, false},
		{"unchecked/inline", 2, []hier.Option{hier.WithCheck(false), hier.WithInlineEnqueue(true)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, sim.Config{Machines: tc.machines, Devices: 2 / tc.machines}, tc.opts...)
			t.Cleanup(func() {
				for _, r := range w.reducers {
					hier.HoldWatcher(r, false)
				}
			})
			const calls, count = 5, 1000
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			round := func() {
				data := make([][][]byte, calls)
				works := make([][]*hier.Work, calls)
				tensors := make([][]fairgo.Tensor, calls)
				for i := range calls {
					data[i] = make([][]byte, w.size())
					for g := range data[i] {
						data[i][g] = int32s(count, int32(100*i+g+1))
					}
					tensors[i] = w.upload(t, fairgo.Int32, data[i])
					for g, r := range w.reducers {
						works[i] = append(works[i], r.AllReduce(ctx, tensors[i][g], fairgo.Sum))
					}
				}
				for g := range w.reducers {
					require.NoError(t, works[calls-1][g].Wait(ctx))
					for i := range calls {
						require.True(t, works[i][g].IsCompleted(), "call %d of rank %d completes before the last", i, g)
						require.NoError(t, works[i][g].Err())
					}
				}
				for i := range calls {
					var want int32
					for g := range w.size() {
						want += int32(100*i + g + 1)
					}
					for g, got := range w.download(t, tensors[i]) {
						require.Equal(t, int32s(count, want), got, "call %d, rank %d", i, g)
					}
				}
			}
			round()
			for i := 0; tc.machines == 1 && !hier.SharedMemoryCheck(w.reducers[0]) && i < 100; i++ {
				round() // the calls before SharedMemoryFirstCall take the collective check
			}
			for _, r := range w.reducers {
				require.Equal(t, tc.machines == 1, hier.SharedMemoryCheck(r), "the check of one machine is in shared memory")
			}
			helped := make([]uint64, len(w.reducers))
			fingerprinted := make([]uint64, len(w.reducers))
			for g, r := range w.reducers {
				helped[g], fingerprinted[g] = hier.HelpedCalls(r), hier.FingerprintedCalls(r)
				hier.HoldWatcher(r, true)
			}
			round()
			for g, r := range w.reducers {
				require.Equal(t, uint64(calls), hier.HelpedCalls(r)-helped[g], "the Wait completed every call")
				if tc.fingerprinted {
					require.Equal(t, uint64(calls), hier.FingerprintedCalls(r)-fingerprinted[g])
				}
				hier.HoldWatcher(r, false)
			}
			round()
		})
	}
}

// int32s is n little-endian int32 elements of value v.
func int32s(n int, v int32) []byte {
	b := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	}
	return b
}
