//go:build unix && !linux

package launch

import "syscall"

// sysProcAttr puts a worker in its own process group.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
