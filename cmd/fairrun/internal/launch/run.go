package launch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/fairgo/fairgo/cmd/fairrun/internal/testbed"
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
//
// With --nic-gbit, Run first checks the privileges and kernel features the
// emulated NICs need (stopping with a *testbed.MissingError before anything
// is started) and builds the testbed; with MPS it starts a private MPS
// daemon. Both are removed before Run returns, whatever happened; when ctx
// ends during setup, what was built is removed and Run returns 128 + N.
func Run(ctx context.Context, c Config) (code int, err error) {
	if err := c.Validate(); err != nil {
		return ExitLaunchFailure, err
	}
	log := c.logger()
	base := c.Env
	if base == nil {
		base = os.Environ()
	}
	// A failure before the workers start: 128 + N when a signal ended ctx.
	setupFailed := func(err error) (int, error) {
		var se *SignalError
		if ctx.Err() != nil && errors.As(context.Cause(ctx), &se) {
			return 128 + int(se.Signal), err
		}
		return ExitLaunchFailure, err
	}
	var x Extras

	// The emulated NICs.
	var tb *testbed.Testbed
	if c.NICGbit > 0 {
		spec := testbed.Spec{Machines: c.EmulateMachines, Gbit: c.NICGbit, Latency: c.NICLatency}
		if err := c.prober.Check(spec); err != nil {
			return setupFailed(err)
		}
		tb, err = testbed.Setup(ctx, spec, log)
		if err != nil {
			return setupFailed(fmt.Errorf("fairrun: build the emulated NICs: %w", err))
		}
		defer func() {
			if cerr := tb.Close(); cerr != nil {
				log.Error("fairrun: removing the emulated NICs failed", "err", cerr)
				err = errors.Join(err, cerr)
			}
		}()
		x.NetNS = true
	}

	// The store: bound to the address given, never every interface unless
	// asked; with emulated NICs on the bridge, which every namespace reaches.
	bindHost, dialHost := c.StoreBind, c.MasterAddr
	if bindHost == "" {
		bindHost = c.MasterAddr
	}
	if tb != nil {
		bindHost = tb.Plan().BridgeAddr.Addr().String()
		dialHost = bindHost
	}
	storeAddr := net.JoinHostPort(dialHost, strconv.Itoa(c.MasterPort))
	if c.NodeRank == 0 {
		srv, err := rendezvous.Listen(net.JoinHostPort(strings.Trim(bindHost, "[]"), strconv.Itoa(c.MasterPort)), rendezvous.WithServerLogger(log))
		if err != nil {
			return setupFailed(fmt.Errorf("fairrun: host the store: %w", err))
		}
		_, port, _ := net.SplitHostPort(srv.Addr())
		storeAddr = net.JoinHostPort(dialHost, port)
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

	// MPS.
	if wantMPS(c, gpus) {
		control, err := findMPSControl(base)
		switch {
		case err != nil && c.MPS == MPSOn:
			return setupFailed(fmt.Errorf("fairrun: --mps on: %w", err))
		case err != nil:
			log.Warn("fairrun: ranks of different emulated machines share a GPU, but there is no MPS: the GPU time-slices between them and timings are not faithful", "err", err)
		default:
			d, err := startMPS(ctx, control, base, log)
			if err != nil {
				return setupFailed(err)
			}
			defer func() {
				if serr := d.Stop(); serr != nil {
					log.Error("fairrun: stopping the MPS daemon failed", "err", serr)
				}
			}()
			x.MPS = &d.env
		}
	}
	if err := ctx.Err(); err != nil {
		return setupFailed(context.Cause(ctx))
	}

	workers, err := Plan(c, base, storeAddr, gpus, x)
	if err != nil {
		return ExitLaunchFailure, err
	}
	g := &group{log: log, grace: c.Grace, stdout: &lockedWriter{w: c.stdout()}, stderr: &lockedWriter{w: c.stderr()}}
	if tb != nil {
		g.start = tb.Run
	}
	return g.run(ctx, c, workers)
}
