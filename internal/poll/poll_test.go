package poll

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestNapBounds: whatever the times of the polls, a Backoff naps between
// every two (it never only yields), naps that never shrink, never exceed
// Max, and never exceed the wait so far over lateShare unless at the first
// nap's length: a condition that turns true is seen within about a
// sixteenth of the wait.
func TestNapBounds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := Backoff{Max: time.Duration(rapid.Int64Range(0, int64(time.Millisecond)).Draw(t, "max"))}
		limit := b.Max
		if limit == 0 {
			limit = DefaultMax
		}
		t0 := time.Unix(100, 0)
		at := time.Duration(0) // since the first poll, where the wait starts
		var last time.Duration
		for i := range rapid.IntRange(1, 40).Draw(t, "polls") {
			if i > 0 {
				at += time.Duration(rapid.Int64Range(0, int64(5*time.Millisecond)).Draw(t, fmt.Sprint("step", i)))
			}
			d := b.next(t0.Add(at))
			require.Positive(t, d)
			require.LessOrEqual(t, d, limit)
			require.LessOrEqual(t, d, max(at/lateShare, firstNap), "at %v", at)
			require.GreaterOrEqual(t, d, last, "naps never shrink")
			last = d
		}
	})
}

// TestNaps: naps from the first poll, that double up to Max, each at most a
// sixteenth of the wait so far (at least 10 µs).
func TestNaps(t *testing.T) {
	us := time.Microsecond
	t0 := time.Unix(0, 0)
	for _, c := range []struct {
		name string
		max  time.Duration
		at   []time.Duration // when each poll ends, from the first
		want []time.Duration
	}{
		{"naps of 10 µs from the first poll while the wait is short", 0,
			[]time.Duration{0, 5 * us, 30 * us, 60 * us, 150 * us},
			[]time.Duration{10 * us, 10 * us, 10 * us, 10 * us, 10 * us}},
		{"naps double, within a sixteenth of the wait", 0,
			[]time.Duration{0, 320 * us, 640 * us, 1280 * us, 1280 * us, 2560 * us},
			[]time.Duration{10 * us, 20 * us, 40 * us, 80 * us, 80 * us, 160 * us}},
		{"up to the default", 0,
			[]time.Duration{0, 10 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond,
				10 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond, time.Second},
			[]time.Duration{10 * us, 20 * us, 40 * us, 80 * us, 160 * us, DefaultMax, DefaultMax, DefaultMax}},
		{"a small max", 50 * us, []time.Duration{0, 2 * time.Millisecond, 2 * time.Millisecond, 2 * time.Millisecond,
			2 * time.Millisecond}, []time.Duration{10 * us, 20 * us, 40 * us, 50 * us, 50 * us}},
		{"a max under the first nap", 3 * us, []time.Duration{0, 30 * us, 30 * us}, []time.Duration{3 * us, 3 * us, 3 * us}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := Backoff{Max: c.max}
			var got []time.Duration
			for _, at := range c.at {
				got = append(got, b.next(t0.Add(at)))
			}
			require.Equal(t, c.want, got)
		})
	}
}

// TestNoticesSoon: a condition that turns true while the loop naps is seen
// within about a nap, not the near millisecond that time.Sleep of a few
// microseconds can take.
func TestNoticesSoon(t *testing.T) {
	const trials, after = 20, 300 * time.Microsecond
	var late []time.Duration
	for range trials {
		var set atomic.Int64 // when the condition turned true, in ns since the Unix epoch
		go func() {
			nap(after) // not a Go timer: those are late by as much as the naps this test looks for
			set.Store(time.Now().UnixNano())
		}()
		var b Backoff
		for set.Load() == 0 {
			b.Wait()
		}
		late = append(late, time.Since(time.Unix(0, set.Load())))
	}
	slices.Sort(late)
	median := late[trials/2]
	t.Logf("seen %v after the condition (median of %d; slowest %v)", median, trials, late[trials-1])
	// A nap is at most a sixteenth of the wait (~20 µs here) and comes
	// back within 1 µs of slack; naps doubling up to 200 µs with the
	// default 50 µs of slack were seen up to 250 µs late, and Go's timers
	// 300–700 µs on the same host.
	require.Less(t, median, 150*time.Microsecond, "polls nap long")
}

// TestNapSleeps: Nap sleeps at least its duration, on the calling
// goroutine.
func TestNapSleeps(t *testing.T) {
	for _, d := range []time.Duration{50 * time.Microsecond, 2 * time.Millisecond} {
		start := time.Now()
		Nap(d)
		require.GreaterOrEqual(t, time.Since(start), d)
	}
}
