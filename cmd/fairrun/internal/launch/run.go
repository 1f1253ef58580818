package launch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/fairgo/fairgo/cmd/fairrun/internal/netbed"
	"github.com/fairgo/fairgo/rendezvous"
)

// EnvStoreToken names the store's shared secret in the workers'
// environment; the store refuses connections without it.
const EnvStoreToken = rendezvous.EnvStoreToken

// ErrNoStoreToken: a job of several nodes needs the same token on every
// node, and fairrun cannot hand one to the other nodes.
var ErrNoStoreToken = errors.New(
	"fairrun: --nnodes > 1 needs " + EnvStoreToken + " set to the same secret on every node (e.g. the " +
		"output of: head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n')",
)

// storeToken returns the store's token: FAIRGO_STORE_TOKEN from the
// environment when set, else (one node) 16 random bytes in hex.
func storeToken(c Config, base []string) (string, error) {
	if v, ok := newEnv(base).get(EnvStoreToken); ok && v != "" {
		if len(v) > rendezvous.MaxTokenLen {
			return "", fmt.Errorf("fairrun: %s has %d bytes, at most %d", EnvStoreToken, len(v), rendezvous.MaxTokenLen)
		}
		return v, nil
	}
	if c.NNodes > 1 {
		return "", ErrNoStoreToken
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("fairrun: store token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// SignalError is the cause to give a context cancelled by a signal, so that
// Run exits with 128 + the signal number, as shells do.
type SignalError struct{ Signal syscall.Signal }

func (e *SignalError) Error() string { return "fairrun: received " + e.Signal.String() }

// exit codes of Run besides the workers' own.
const (
	ExitLaunchFailure = 1   // the store or a worker could not start
	ExitUsage         = 2   // a bad command line (a *UsageError): nothing was started
	ExitStartFailure  = 127 // the worker program could not be executed
)

// Run starts the workers, hosts the store on node rank 0, and waits. It
// returns the exit code fairrun should end with: 0 when every worker
// exited 0; otherwise the first failure's code (128 + N for a worker killed
// by signal N), or 128 + N when fairrun itself was stopped by signal N (the
// cause of ctx, see SignalError). The store takes only connections that
// present the job's token (FAIRGO_STORE_TOKEN, given to every worker). The
// error explains a non-zero code; a
// worker's failure is an *ExitError naming its rank.
//
// A worker's exit is seen from its process status within milliseconds,
// whatever its output does. While the workers run, the process is a child
// subreaper (Linux) and reaps every child it has; when the job ends it ends
// every child left, including orphans the workers left behind (SIGTERM,
// SIGKILL after the grace period). Do not start other child processes
// beside Run in the same process.
//
// Run first resolves c (see Resolve) unless it is resolved already: a
// *UsageError there returns ExitUsage before anything is started. With
// --nic-gbit, Run then checks the privileges and kernel features the
// emulated NICs need (stopping with a *netbed.MissingError before anything
// is started) and builds the testbed; with MPS it starts a private MPS
// daemon. Both are removed before Run returns,
// whatever happened; when ctx ends during setup, what was built is removed
// and Run returns 128 + N.
func Run(ctx context.Context, c Config) (code int, err error) {
	if !c.resolved {
		if c, err = Resolve(c); err != nil {
			return ExitUsage, err
		}
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

	// The store's shared secret, checked on every connection.
	if x.StoreToken, err = storeToken(c, base); err != nil {
		return setupFailed(err)
	}

	// The GPUs emulated machines are spread over (Resolve), and whether
	// ranks of one machine share them.
	gpus := c.gpus
	per := c.NProcPerNode / max(c.EmulateMachines, 1)
	if RanksShareGPUs(c, gpus) {
		log.Info(
			"fairrun: ranks of one emulated machine share a GPU: "+
				"each rank is an NCCL host of its own (NCCL_HOSTID=<machine>-d<local rank>) "+
				"with a device identity of its own (FAIRGO_DEVICE_ID); "+
				"inside a machine they talk over NCCL sockets on the loopback, "+
				"and flat NCCL does not know the machines",
			"ranks_per_machine",
			per,
			"gpus",
			len(gpus),
			"loopback_gbit",
			c.NVLinkGbit,
		)
	}

	// The emulated NICs.
	var tb *netbed.Testbed
	if c.NICGbit > 0 {
		spec := netbed.Spec{
			Machines:     c.EmulateMachines,
			Gbit:         c.NICGbit,
			Latency:      c.NICLatency,
			LoopbackGbit: c.NVLinkGbit,
		}
		if err := c.prober.Check(spec); err != nil {
			return setupFailed(err)
		}
		tb, err = netbed.Setup(ctx, spec, log)
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
	// fairgo's store takes --master-port + 1 (a free port on a single
	// node), so that MASTER_PORT stays free for the trainer's own store, as
	// torchrun leaves it.
	storePort := 0
	if c.MasterPort != 0 {
		storePort = c.MasterPort + 1
		x.MasterPort = strconv.Itoa(c.MasterPort)
	}
	if tb != nil {
		for _, m := range tb.Plan().Machines {
			x.MachineAddrs = append(x.MachineAddrs, m.Addr.Addr().String())
		}
	}
	storeAddr := net.JoinHostPort(dialHost, strconv.Itoa(storePort))
	if c.NodeRank == 0 {
		if c.MasterPort == 0 {
			p, err := freePort(bindHost)
			if err != nil {
				return setupFailed(fmt.Errorf("fairrun: a free MASTER_PORT: %w", err))
			}
			x.MasterPort = strconv.Itoa(p)
		}
		srv, err := rendezvous.Listen(
			net.JoinHostPort(strings.Trim(bindHost, "[]"), strconv.Itoa(storePort)),
			rendezvous.WithServerLogger(log),
			rendezvous.WithToken(x.StoreToken),
		)
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

	// MPS.
	if wantMPS(c, gpus) {
		control, err := findMPSControl(base)
		switch {
		case err != nil && c.MPS == MPSOn:
			return setupFailed(fmt.Errorf("fairrun: --mps on: %w", err))
		case err != nil:
			log.Warn(
				"fairrun: ranks share a GPU, but there is no MPS: the GPU time-slices between them and timings are not faithful",
				"err",
				err,
			)
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

// Resolve decides, before anything runs, what depends on this node: the
// number of workers of --nproc-per-node gpu, auto or cpu (NProcFrom), the
// GPUs emulated machines are spread over (GPUList), and whether
// --nvlink-gbit applies (it shapes the loopback that ranks sharing a GPU
// talk over, so it is refused when the ranks of each machine have GPUs of
// their own). It looks at c.Env (else the process's environment) and may
// run nvidia-smi -L; it starts nothing. Every error is a *UsageError that
// names the flag and echoes its value as given. Run resolves a
// configuration that is not resolved yet.
func Resolve(c Config) (Config, error) {
	if err := c.Validate(); err != nil {
		return c, asGiven(err, c.given)
	}
	base := c.Env
	if base == nil {
		base = os.Environ()
	}
	log := c.logger()
	if c.NProcFrom != "" {
		gpus, where := VisibleGPUs(base, log)
		switch {
		case gpus > 0 && c.NProcFrom != NProcCPU:
			c.NProcPerNode = gpus
		case c.NProcFrom == NProcGPU:
			return c, asGiven(
				&UsageError{Flag: "nproc-per-node", Value: c.NProcFrom, Reason: "no GPU is visible (" + where + "); " +
					NProcAuto + " starts one worker per CPU then, " + NProcCPU + " always"},
				c.given,
			)
		default:
			c.NProcPerNode = runtime.NumCPU()
		}
		if err := c.Validate(); err != nil { // --emulate-machines must divide the count
			return c, asGiven(err, c.given)
		}
		defer log.Info("fairrun: --nproc-per-node "+c.NProcFrom, "workers", c.NProcPerNode, "gpus", gpus, "from", where)
	}
	if c.EmulateMachines > 0 {
		c.gpus = GPUList(c, base, log)
	}
	if c.NVLinkGbit > 0 && !RanksShareGPUs(c, c.gpus) {
		per := c.NProcPerNode / max(c.EmulateMachines, 1)
		return c, asGiven(&UsageError{Flag: "nvlink-gbit", Value: c.NVLinkGbit, Reason: fmt.Sprintf(
			"the ranks of each emulated machine have GPUs of their own (%d per machine, "+
				"%d GPUs) and talk GPU to GPU, which tbf cannot shape; "+
				"it shapes the loopback that ranks sharing a GPU talk over (more ranks per machine than GPUs: "+
				"lower --gpus or raise --nproc-per-node)",
			per,
			len(c.gpus),
		)}, c.given)
	}
	c.resolved = true
	return c, nil
}

// freePort asks the kernel for a port that is free on host now (the
// trainer's own store binds it later).
func freePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(strings.Trim(host, "[]"), "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
