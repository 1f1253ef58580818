//go:build unix && !linux

package launch

import "syscall"

// sysProcAttr puts a worker in its own process group.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// becomeSubreaper is Linux only: elsewhere orphans go to init.
func becomeSubreaper() (restore func(), err error) { return func() {}, nil }

// childrenOf is not implemented outside Linux: no orphans are adopted there.
func childrenOf(int) []int { return nil }
