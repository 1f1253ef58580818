// Package poll paces the loops that poll the GPU driver and NCCL for
// completion: naps in the kernel, short while the wait is. Go's timers
// cannot nap: time.Sleep of a few microseconds lasts about a millisecond in
// a process whose other goroutines are idle, which a completion poll cannot
// afford.
package poll

import "time"

const (
	// firstNap is the first nap, and the shortest (on Linux a nap is late
	// by at most 1 µs of timer slack, which it sets; elsewhere by the
	// system's slack). A loop never polls without a nap between: polls
	// that only yielded the processor, thousands a millisecond, each a
	// driver call, slowed the rank's own launches and its collectives
	// (bench/NOTES.md item 74).
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
// is ready: it naps in the kernel, each nap twice the last, from 10 µs up
// to Max, and never longer than the wait so far over lateShare (but at
// least 10 µs). A Backoff is for one goroutine.
type Backoff struct {
	Max time.Duration // the longest nap; 0: DefaultMax

	start time.Time
	nap   time.Duration
}

// Wait pauses before the next poll.
func (b *Backoff) Wait() { nap(b.next(time.Now())) }

// next is the nap before the next poll at now.
func (b *Backoff) next(now time.Time) time.Duration {
	if b.start.IsZero() {
		b.start = now
	}
	waited := now.Sub(b.start)
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

// Nap sleeps for d in the kernel (on Linux with 1 µs of timer slack): the
// calling goroutine keeps its thread, and no other goroutine of the process
// is scheduled in its place or woken for it, as a time.Sleep would.
func Nap(d time.Duration) { nap(d) }
