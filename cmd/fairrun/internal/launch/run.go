package launch

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"

	"github.com/fairgo/fairgo/rendezvous"
)

// SignalError is the cause to give a context cancelled by a signal, so that
// Run exits with 128 + the signal number, as shells do.
type SignalError struct{ Signal syscall.Signal }

func (e *SignalError) Error() string { return "fairrun: received " + e.Signal.String() }

// exit codes of Run besides the workers' own.
const (
	ExitLaunchFailure = 1   // the store or a worker could not start
	ExitStartFailure  = 127 // the worker program could not be executed
)

// Run starts the workers, hosts the store on node rank 0, and waits. It
// returns the exit code fairrun should end with: 0 when every worker
// exited 0; otherwise the first failure's code (128 + N for a worker killed
// by signal N), or 128 + N when fairrun itself was stopped by signal N (the
// cause of ctx, see SignalError). The error explains a non-zero code; a
// worker's failure is an *ExitError naming its rank.
//
// A worker's exit is seen from its process status within milliseconds,
// whatever its output does. While the workers run, the process is a child
// subreaper (Linux) and reaps every child it has; when the job ends it ends
// every child left, including orphans the workers left behind (SIGTERM,
// SIGKILL after the grace period). Do not start other child processes
// beside Run in the same process.
func Run(ctx context.Context, c Config) (int, error) {
	if err := c.Validate(); err != nil {
		return ExitLaunchFailure, err
	}
	log := c.logger()
	base := c.Env
	if base == nil {
		base = os.Environ()
	}

	// The store.
	storeAddr := net.JoinHostPort(c.MasterAddr, strconv.Itoa(c.MasterPort))
	if c.NodeRank == 0 {
		listen := storeAddr
		if c.NNodes > 1 {
			listen = net.JoinHostPort("", strconv.Itoa(c.MasterPort)) // every interface
		}
		srv, err := rendezvous.Listen(listen, rendezvous.WithServerLogger(log))
		if err != nil {
			return ExitLaunchFailure, fmt.Errorf("fairrun: host the store: %w", err)
		}
		_, port, _ := net.SplitHostPort(srv.Addr())
		storeAddr = net.JoinHostPort(c.MasterAddr, port)
		sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		served := make(chan struct{})
		go func() { srv.Serve(sctx); close(served) }()
		defer func() { stop(); srv.Close(); <-served }()
	}

	var gpus []string
	if c.EmulateMachines > 0 {
		gpus = GPUList(c, base, log)
		if per := c.NProcPerNode / c.EmulateMachines; per > len(gpus) {
			log.Warn("fairrun: ranks of one emulated machine share a GPU (NCCL refuses that)", "ranks_per_machine", per, "gpus", len(gpus))
		}
	}
	workers, err := Plan(c, base, storeAddr, gpus)
	if err != nil {
		return ExitLaunchFailure, err
	}
	g := &group{log: log, grace: c.Grace, stdout: &lockedWriter{w: c.stdout()}, stderr: &lockedWriter{w: c.stderr()}}
	return g.run(ctx, c, workers)
}
