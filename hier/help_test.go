package hier_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/reftest"
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

// TestWatcherLeavesAWaitedCallToItsWait makes every rank's call wait 200
// ms on its device before it starts. While a Wait polls the call, the
// watcher must not poll it too (a few asks at most, where it looked before
// the Wait began; polling through the call would be a thousand), and the
// Wait completes it. A call nobody waits for, the watcher polls and
// completes itself.
func TestWatcherLeavesAWaitedCallToItsWait(t *testing.T) {
	const delay = 200 * time.Millisecond
	for _, tc := range []struct {
		name     string
		machines int
		opts     []hier.Option
	}{
		{"fingerprinted", 2, nil},
		{"separate-check", 2, []hier.Option{hier.WithFingerprintMax(0)}},
		{"shared-memory", 1, nil},
		{"shared-memory/inline", 1, []hier.Option{hier.WithInlineEnqueue(true)}},
		{"unchecked/inline", 2, []hier.Option{hier.WithCheck(false), hier.WithInlineEnqueue(true)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, sim.Config{Machines: tc.machines, Devices: 2 / tc.machines}, tc.opts...)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for i := 0; i < 100 && (i == 0 || tc.machines == 1 && !hier.SharedMemoryCheck(w.reducers[0])); i++ {
				_, err := w.allReduce(t, fairgo.Int32, fairgo.Sum, [][]byte{int32s(64, 1), int32s(64, 2)})
				require.NoError(t, err) // past the calls that agree on the shared memory
			}
			// delayed enqueues on every rank a call that starts delay after
			// it is made, with its Works.
			delayed := func() ([]*hier.Work, []fairgo.Tensor) {
				ts := w.upload(t, fairgo.Int32, [][]byte{int32s(1000, 3), int32s(1000, 4)})
				works := make([]*hier.Work, len(w.reducers))
				for g, r := range w.reducers {
					s, err := w.devs[g].NewStream()
					require.NoError(t, err)
					require.NoError(t, w.devs[g].(*sim.Device).DelayAsync(delay, s))
					works[g] = r.AllReduce(ctx, ts[g], fairgo.Sum, hier.After(s))
				}
				return works, ts
			}
			polls := func() []uint64 {
				out := make([]uint64, len(w.reducers))
				for g, r := range w.reducers {
					out[g] = hier.WatcherPolls(r)
				}
				return out
			}

			before, helped := polls(), make([]uint64, len(w.reducers))
			for g, r := range w.reducers {
				helped[g] = hier.HelpedCalls(r)
			}
			works, ts := delayed()
			errs := make(chan error, len(works))
			for _, wk := range works {
				go func() { errs <- wk.Wait(ctx) }()
			}
			for range works {
				require.NoError(t, <-errs)
			}
			after := polls()
			for g, r := range w.reducers {
				require.LessOrEqual(t, after[g]-before[g], uint64(20), "rank %d: the watcher polled a call a Wait polled", g)
				require.Equal(t, helped[g]+1, hier.HelpedCalls(r), "rank %d: the Wait completed its call", g)
			}
			for g, got := range w.download(t, ts) {
				require.Equal(t, int32s(1000, 7), got, "rank %d", g)
			}

			works, _ = delayed()
			for g, wk := range works {
				select {
				case <-wk.Done():
					require.NoError(t, wk.Err())
				case <-ctx.Done():
					t.Fatalf("rank %d: a call nobody waited for did not complete", g)
				}
			}
			for g, r := range w.reducers {
				require.Greater(t, hier.WatcherPolls(r), after[g], "rank %d: the watcher polled the call nobody waited for", g)
				require.Equal(t, helped[g]+1, hier.HelpedCalls(r), "rank %d: the watcher completed it", g)
			}
		})
	}
}

// TestWaitsAfterABurstAskTheDeviceTwice enqueues 20 calls on one stream on
// every rank, lets the device finish them with the watchers held, and
// waits for each Work in call order: the first Wait asks the oldest call's
// event and the newest's, which says the calls between them are done on
// the same stream, and completes all of them; the other 19 Waits find
// their calls complete. With the check in the fingerprint, in shared
// memory, and without a check; each call's data must be right.
func TestWaitsAfterABurstAskTheDeviceTwice(t *testing.T) {
	for _, tc := range []struct {
		name     string
		machines int
		opts     []hier.Option
	}{
		{"fingerprinted", 2, nil},
		{"shared-memory", 1, nil},
		{"shared-memory/inline", 1, []hier.Option{hier.WithInlineEnqueue(true)}},
		{"unchecked/inline", 2, []hier.Option{hier.WithCheck(false), hier.WithInlineEnqueue(true)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, sim.Config{Machines: tc.machines, Devices: 2 / tc.machines}, tc.opts...)
			t.Cleanup(func() {
				for _, r := range w.reducers {
					hier.HoldWatcher(r, false)
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for i := 0; i < 100 && (i == 0 || tc.machines == 1 && !hier.SharedMemoryCheck(w.reducers[0])); i++ {
				_, err := w.allReduce(t, fairgo.Int32, fairgo.Sum, [][]byte{int32s(64, 1), int32s(64, 2)})
				require.NoError(t, err) // past the calls that agree on the shared memory
			}
			const calls = 20
			queries := make([]uint64, len(w.reducers))
			for g, r := range w.reducers {
				hier.HoldWatcher(r, true)
				queries[g] = hier.HelpQueries(r)
			}
			tensors := make([][]fairgo.Tensor, calls)
			works := make([][]*hier.Work, calls)
			for i := range calls {
				tensors[i] = w.upload(t, fairgo.Int32, [][]byte{int32s(300, int32(i)), int32s(300, int32(10*i))})
				for g, r := range w.reducers {
					works[i] = append(works[i], r.AllReduce(ctx, tensors[i][g], fairgo.Sum))
				}
			}
			for g := range w.reducers {
				// Every call enqueued (the engine goes in call order), and
				// done on the device.
				s, err := w.devs[g].NewStream()
				require.NoError(t, err)
				require.NoError(t, works[calls-1][g].StreamWait(ctx, s))
				require.NoError(t, w.devs[g].(*sim.Device).Synchronize(ctx))
			}
			for g, r := range w.reducers {
				for i := range calls {
					require.NoError(t, works[i][g].Wait(ctx), "call %d, rank %d", i, g)
				}
				require.Equal(t, uint64(2), hier.HelpQueries(r)-queries[g],
					"rank %d: the Waits of %d calls done on one stream asked the device twice", g, calls)
			}
			for i := range calls {
				for g, got := range w.download(t, tensors[i]) {
					require.Equal(t, int32s(300, int32(11*i)), got, "call %d, rank %d", i, g)
				}
			}
		})
	}
}

// TestWatcherAsksTheDeviceTwiceAfterABurst: 20 calls done on the device
// before the watcher looks at them (held meanwhile) cost it two queries,
// the oldest call's and the newest's, not one a call; nobody waits.
func TestWatcherAsksTheDeviceTwiceAfterABurst(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 2, Devices: 1}, hier.WithCheck(false), hier.WithInlineEnqueue(true))
	t.Cleanup(func() {
		for _, r := range w.reducers {
			hier.HoldWatcher(r, false)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const calls = 20
	polls := make([]uint64, len(w.reducers))
	for g, r := range w.reducers {
		hier.HoldWatcher(r, true)
		polls[g] = hier.WatcherPolls(r)
	}
	works := make([][]*hier.Work, calls)
	tensors := make([][]fairgo.Tensor, calls)
	for i := range calls {
		tensors[i] = w.upload(t, fairgo.Int32, [][]byte{int32s(300, int32(i)), int32s(300, int32(10*i))})
		for g, r := range w.reducers {
			works[i] = append(works[i], r.AllReduce(ctx, tensors[i][g], fairgo.Sum))
		}
	}
	for g, r := range w.reducers {
		require.NoError(t, w.devs[g].(*sim.Device).Synchronize(ctx))
		hier.HoldWatcher(r, false)
	}
	for i := range calls {
		for g := range w.reducers {
			select {
			case <-works[i][g].Done():
				require.NoError(t, works[i][g].Err())
			case <-ctx.Done():
				t.Fatalf("call %d of rank %d did not complete", i, g)
			}
		}
		for g, got := range w.download(t, tensors[i]) {
			require.Equal(t, int32s(300, int32(11*i)), got, "call %d, rank %d", i, g)
		}
	}
	for g, r := range w.reducers {
		require.Equal(t, uint64(2), hier.WatcherPolls(r)-polls[g], "rank %d", g)
	}
}

// A Wait that finds a call's data and its separate check done decides the
// check itself where the ranks' calls matched: a checker goroutine slow to
// wake (held here) adds nothing to the call. A mismatch stays the
// checker's, which explains it and aborts: the Waits return it only once
// the checker decides.
func TestWaitDecidesAMatchedCheck(t *testing.T) {
	w := newWorld(t, sim.Config{Machines: 2, Devices: 1, Seed: 8, StallTimeout: time.Minute},
		hier.WithFingerprintMax(0), hier.WithTimeout(time.Minute))
	ts := w.upload(t, fairgo.Float32, [][]byte{make([]byte, 4096), make([]byte, 4096)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	warm := make([]*hier.Work, len(w.reducers)) // a first call, whose class Auto may calibrate
	for g, r := range w.reducers {
		warm[g] = r.AllReduce(ctx, ts[g], fairgo.Sum)
	}
	require.NoError(t, reftest.WaitAll(warm))
	for _, r := range w.reducers {
		hier.HoldChecker(r, true)
		t.Cleanup(func() { hier.HoldChecker(r, false) }) // before the world's Close, which waits for the checks
	}
	before := make([]uint64, len(w.reducers))
	for g, r := range w.reducers {
		before[g] = hier.ChecksDecidedEarly(r)
	}
	const calls = 5
	for range calls {
		works := make([]*hier.Work, len(w.reducers))
		for g, r := range w.reducers {
			works[g] = r.AllReduce(ctx, ts[g], fairgo.Sum)
		}
		for g, wk := range works {
			require.NoError(t, wk.Wait(ctx), "rank %d: the Wait decides the check while the checker is held", g)
		}
	}
	for g, r := range w.reducers {
		require.Equal(t, uint64(calls), hier.ChecksDecidedEarly(r)-before[g], "rank %d", g)
	}

	ops := []fairgo.Op{fairgo.Sum, fairgo.Max}
	errs := make(chan error, len(w.reducers))
	for g, r := range w.reducers {
		wk := r.AllReduce(ctx, ts[g], ops[g])
		go func() { errs <- wk.Wait(ctx) }()
	}
	select {
	case err := <-errs:
		t.Fatalf("a Wait returned while the checker that decides a mismatch was held: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	for _, r := range w.reducers {
		hier.HoldChecker(r, false)
	}
	for range w.reducers {
		require.ErrorIs(t, <-errs, fairgo.ErrMismatch)
	}
}
