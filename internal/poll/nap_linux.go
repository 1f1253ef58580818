package poll

import (
	"syscall"
	"time"
)

// nap sleeps d in the kernel (nanosleep), on the calling thread: about d
// plus the timer slack, where time.Sleep would wait for the runtime's
// timer, which an idle process serves about once a millisecond.
func nap(d time.Duration) {
	ts := syscall.NsecToTimespec(d.Nanoseconds())
	_ = syscall.Nanosleep(&ts, nil) // interrupted early: the caller polls again
}
