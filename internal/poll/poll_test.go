package poll

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestNaps: yields for the first Spin, then naps that double up to Max.
func TestNaps(t *testing.T) {
	us := time.Microsecond
	t0 := time.Unix(0, 0)
	for _, c := range []struct {
		name string
		max  time.Duration
		at   []time.Duration // when each poll ends, from the first
		want []time.Duration
	}{
		{"spins first", 0, []time.Duration{0, 5 * us, Spin - 1}, []time.Duration{0, 0, 0}},
		{"then naps up to the default", 0,
			[]time.Duration{0, Spin, Spin + us, 2 * Spin, 3 * Spin, 4 * Spin, 5 * Spin, 9 * Spin},
			[]time.Duration{0, 10 * us, 20 * us, 40 * us, 80 * us, 160 * us, DefaultMax, DefaultMax}},
		{"a small max", 50 * us, []time.Duration{0, Spin, Spin, Spin, Spin}, []time.Duration{0, 10 * us, 20 * us, 40 * us, 50 * us}},
		{"a max under the first nap", 3 * us, []time.Duration{0, Spin, Spin}, []time.Duration{0, 3 * us, 3 * us}},
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
	// Naps of the kernel come back within the timer slack (50 µs); Go's
	// timers took 300–700 µs on the same host.
	require.Less(t, median, 250*time.Microsecond, "polls nap as long as Go's timers")
}
