package harness

import (
	"fmt"

	"github.com/fairgo/fairgo/rendezvous"
)

// SimUnderLauncher says, when backend is "sim" and this process is one
// worker of a job of several processes (UnderLauncher), what that means:
// the simulated cluster lives in one process, so every worker runs a
// cluster of s.Machines × s.Devices of its own and the workers never
// reduce together. A program prints it at start, so that "fairrun
// --nproc-per-node 2 -- allreduce" does not look like one job of 2×2 ranks
// run twice. It returns "" in every other case.
func SimUnderLauncher(backend string, s Spec) string {
	if backend != "sim" || !UnderLauncher() {
		return ""
	}
	where := "this process is one of a job of several"
	if l, err := rendezvous.FromEnv(); err == nil {
		where = fmt.Sprintf("this process is rank %d of %d", l.Rank, l.WorldSize)
	}
	return fmt.Sprintf(
		"the simulated backend runs in one process: %s under a launcher, and it runs a simulated %d×%d cluster "+
			"of its own, independent of the other processes (use -backend cuda for one rank per process "+
			"over the launcher's ranks, or run without a launcher)",
		where, s.Machines, s.Devices,
	)
}
