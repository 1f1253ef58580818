package poll

import (
	"syscall"
	"time"
)

// prSetTimerSlack is prctl's PR_SET_TIMERSLACK.
const prSetTimerSlack = 29

// napSlack is the timer slack a nap runs with: the kernel may end a sleep
// this much late. Its default, 50 µs, would come on top of every nap and
// make a 10 µs nap last 60.
const napSlack = time.Microsecond

// nap sleeps d in the kernel (nanosleep), on the calling thread: about d
// plus napSlack, where time.Sleep would wait for the runtime's timer,
// which an idle process serves about once a millisecond. The slack is a
// setting of the thread, and a goroutine may nap on another thread each
// time: every nap sets it (one system call, well under a nap).
func nap(d time.Duration) {
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, uintptr(napSlack.Nanoseconds()), 0)
	ts := syscall.NsecToTimespec(d.Nanoseconds())
	_ = syscall.Nanosleep(&ts, nil) // interrupted early: the caller polls again
}
