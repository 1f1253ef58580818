package launch

import "syscall"

// sysProcAttr puts a worker in its own process group, and has the kernel
// kill it should fairrun die without cleaning up.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
