// Package poll paces the loops that poll the GPU driver and NCCL for
// completion: a short spin, then naps in the kernel. Go's timers cannot
// nap: time.Sleep of a few microseconds lasts about a millisecond in a
// process whose other goroutines are idle, which a completion poll cannot
// afford.
package poll

import (
	"runtime"
	"time"
)

const (
	// Spin is how long a Backoff yields the processor between polls
	// before it starts to nap.
	Spin = 30 * time.Microsecond
	// firstNap is the first nap (on Linux a nap is late by at most 1 µs
	// of timer slack, which it sets; elsewhere by the system's slack).
	firstNap = 10 * time.Microsecond
	// lateShare bounds every nap by the wait so far, over lateShare: a
	// condition that turns true during a nap is seen at most about a
	// sixteenth of the wait later (or a first nap, for short waits), so
	// that a host's lateness in seeing a call end stays a small share of
	// the call and does not become the next call's start skew
	// (bench/NOTES.md item 71).
	lateShare = 16
	// DefaultMax is the longest nap of a Backoff whose Max is 0.
	DefaultMax = 200 * time.Microsecond
)

// Backoff paces one polling loop: call Wait between polls. The zero value
// is ready: it yields the processor for the first Spin of the wait, then
// naps in the kernel, each nap twice the last, from 10 µs up to Max, and
// never longer than the wait so far over lateShare (but at least 10 µs).
// A Backoff is for one goroutine.
type Backoff struct {
	Max time.Duration // the longest nap; 0: DefaultMax

	start time.Time
	nap   time.Duration
}

// Wait pauses before the next poll.
func (b *Backoff) Wait() {
	if d := b.next(time.Now()); d > 0 {
		nap(d)
	} else {
		runtime.Gosched()
	}
}

// next is the pause before the next poll at now: 0 to yield, or a nap.
func (b *Backoff) next(now time.Time) time.Duration {
	if b.start.IsZero() {
		b.start = now
	}
	waited := now.Sub(b.start)
	if waited < Spin {
		return 0
	}
	limit := b.Max
	if limit <= 0 {
		limit = DefaultMax
	}
	switch {
	case b.nap == 0:
		b.nap = firstNap
	case b.nap < limit:
		b.nap *= 2
	}
	b.nap = min(b.nap, limit, max(waited/lateShare, firstNap))
	return b.nap
}
