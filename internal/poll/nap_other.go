//go:build !linux

package poll

import "time"

// nap sleeps d through the runtime's timers (nanosleep is Linux's).
func nap(d time.Duration) { time.Sleep(d) }
