package launch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
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
//
// With MaxRestarts, a worker's failure (an *ExitError, not a signal to
// fairrun nor a failure to start) stops the group as always, and Run then
// builds everything again and starts the group anew, up to MaxRestarts
// times: the store too, so that no worker reads what the failed attempt
// wrote. The workers' TORCHELASTIC_RESTART_COUNT counts the attempts
// before theirs; the result is the last attempt's.
func Run(ctx context.Context, c Config) (code int, err error) {
	if !c.resolved {
		if c, err = Resolve(c); err != nil {
			return ExitUsage, err
		}
	}
	for restart := 0; ; restart++ {
		code, err = runOnce(ctx, c, restart)
		var ee *ExitError
		if code == 0 || restart >= c.MaxRestarts || ctx.Err() != nil || !errors.As(err, &ee) {
			return code, err
		}
		c.logger().Warn(
			"fairrun: a worker failed; starting the group again",
			"err", err, "restart", restart+1, "max_restarts", c.MaxRestarts,
		)
	}
}

// runOnce is one attempt of Run: it builds the setup, starts the workers
// (restart is the count of attempts before) and removes the setup.
func runOnce(ctx context.Context, c Config, restart int) (code int, err error) {
	s := newSetup(ctx, c)
	s.x.Restart = restart
	defer func() {
		if terr := s.tearDown(); terr != nil {
			err = errors.Join(err, terr)
		}
	}()
	if err := s.build(); err != nil {
		return s.failed(err)
	}
	workers, err := Plan(c, s.base, s.storeAddr, c.gpus, s.x)
	if err != nil {
		return ExitLaunchFailure, err
	}
	g := &group{log: s.log, grace: c.Grace, stdout: &lockedWriter{w: c.stdout()}, stderr: &lockedWriter{w: c.stderr()}}
	if s.tb != nil {
		g.start = s.tb.Run
	}
	return g.run(ctx, c, workers)
}

// setup is what Run builds around the workers before they start (the
// store's token, the emulated NICs, the store, the MPS daemon) and removes
// when they are done.
type setup struct {
	ctx  context.Context
	c    Config // resolved
	log  *slog.Logger
	base []string // the workers' base environment

	x         Extras          // what the workers learn about the setup
	tb        *netbed.Testbed // the emulated NICs; nil: none
	storeAddr string          // the store's "host:port", as the workers dial it
	undo      []func() error  // removes what was built, in the order built
}

// newSetup starts the setup of a resolved configuration; nothing is built
// yet.
func newSetup(ctx context.Context, c Config) *setup {
	base := c.Env
	if base == nil {
		base = os.Environ()
	}
	return &setup{ctx: ctx, c: c, log: c.logger(), base: base}
}

// build makes the store's token, reports GPUs the ranks share, builds the
// emulated NICs, hosts the store and starts the MPS daemon, in this order;
// it stops at the first failure, or when ctx has ended meanwhile.
func (s *setup) build() error {
	var err error
	if s.x.StoreToken, err = storeToken(s.c, s.base); err != nil {
		return err
	}
	s.noteSharedGPUs()
	if err := s.buildNICs(); err != nil {
		return err
	}
	if err := s.hostStore(); err != nil {
		return err
	}
	if err := s.startMPSDaemon(); err != nil {
		return err
	}
	if s.ctx.Err() != nil {
		return context.Cause(s.ctx)
	}
	return nil
}

// failed is Run's result for a failure before the workers start:
// ExitLaunchFailure, or 128 + N when signal N ended ctx.
func (s *setup) failed(err error) (int, error) {
	var se *SignalError
	if s.ctx.Err() != nil && errors.As(context.Cause(s.ctx), &se) {
		return 128 + int(se.Signal), err
	}
	return ExitLaunchFailure, err
}

// tearDown removes what build built, the last built first, and returns
// the errors of those removals that failed.
func (s *setup) tearDown() error {
	var errs []error
	for i := len(s.undo) - 1; i >= 0; i-- {
		if err := s.undo[i](); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// noteSharedGPUs logs, when ranks of one emulated machine share a GPU
// (the GPUs Resolve spread the machines over), how they are told apart.
func (s *setup) noteSharedGPUs() {
	c := s.c
	if !RanksShareGPUs(c, c.gpus) {
		return
	}
	s.log.Info(
		"fairrun: ranks of one emulated machine share a GPU: "+
			"each rank is an NCCL host of its own (NCCL_HOSTID=<machine>-d<local rank>) "+
			"with a device identity of its own (FAIRGO_DEVICE_ID); "+
			"inside a machine they talk over NCCL sockets on the loopback, "+
			"and flat NCCL does not know the machines",
		"ranks_per_machine",
		c.NProcPerNode/max(c.EmulateMachines, 1),
		"gpus",
		len(c.gpus),
		"loopback_gbit",
		c.NVLinkGbit,
	)
}

// buildNICs checks what the emulated NICs need and builds them (with
// --nic-gbit).
func (s *setup) buildNICs() error {
	c := s.c
	if c.NICGbit <= 0 {
		return nil
	}
	spec := netbed.Spec{
		Machines:           c.EmulateMachines,
		Gbit:               c.NICGbit,
		Latency:            c.NICLatency,
		Queue:              c.nicQueue(),
		RtoMin:             c.NICRtoMin,
		SlowStartAfterIdle: c.NICSlowStartAfterIdle,
		LoopbackGbit:       c.NVLinkGbit,
	}
	if err := c.prober.Check(spec); err != nil {
		return err
	}
	tb, err := netbed.Setup(s.ctx, spec, s.log)
	if err != nil {
		return fmt.Errorf("fairrun: build the emulated NICs: %w", err)
	}
	s.tb = tb
	s.undo = append(s.undo, func() error {
		s.logCounters(tb)
		if cerr := tb.Close(); cerr != nil {
			s.log.Error("fairrun: removing the emulated NICs failed", "err", cerr)
			return cerr
		}
		return nil
	})
	s.x.NetNS = true
	return nil
}

// logCounters logs what every emulated machine's tbfs sent and dropped:
// the drops are packets TCP had to retransmit, a cost that a lossless
// fabric does not have.
func (s *setup) logCounters(tb *netbed.Testbed) {
	counters, err := tb.Counters()
	if err != nil {
		s.log.Warn("fairrun: reading the emulated NICs' counters failed", "err", err)
		return
	}
	for _, c := range counters {
		attrs := []any{
			"machine", c.Machine,
			"sent_bytes", c.Send.SentBytes, "send_drops", c.Send.Drops,
			"received_bytes", c.Receive.SentBytes, "receive_drops", c.Receive.Drops,
		}
		if c.Loopback != nil {
			attrs = append(attrs, "loopback_bytes", c.Loopback.SentBytes, "loopback_drops", c.Loopback.Drops)
		}
		s.log.Info("fairrun: NIC counters", attrs...)
	}
}

// hostStore decides the store's address, and the MASTER_PORT and machine
// addresses the workers get, and on node rank 0 serves the store.
//
// The store is bound to the address given, never every interface unless
// asked; with emulated NICs on the bridge, which every namespace reaches.
// fairgo's store takes --master-port + 1 (a free port on a single node),
// so that MASTER_PORT stays free for the trainer's own store, as torchrun
// leaves it.
func (s *setup) hostStore() error {
	c := s.c
	bindHost, dialHost := c.StoreBind, c.MasterAddr
	if bindHost == "" {
		bindHost = c.MasterAddr
	}
	if s.tb != nil {
		bindHost = s.tb.Plan().BridgeAddr.Addr().String()
		dialHost = bindHost
	}
	storePort := 0
	if c.MasterPort != 0 {
		storePort = c.MasterPort + 1
		s.x.MasterPort = strconv.Itoa(c.MasterPort)
	}
	if s.tb != nil {
		for _, m := range s.tb.Plan().Machines {
			s.x.MachineAddrs = append(s.x.MachineAddrs, m.Addr.Addr().String())
		}
	}
	s.storeAddr = net.JoinHostPort(dialHost, strconv.Itoa(storePort))
	if c.NodeRank != 0 {
		return nil
	}
	return s.serveStore(bindHost, dialHost, storePort)
}

// serveStore picks a free MASTER_PORT when none is given, listens on
// bindHost:storePort (0: a free port) and serves the store until tearDown.
func (s *setup) serveStore(bindHost, dialHost string, storePort int) error {
	if s.c.MasterPort == 0 {
		p, err := freePort(bindHost)
		if err != nil {
			return fmt.Errorf("fairrun: a free MASTER_PORT: %w", err)
		}
		s.x.MasterPort = strconv.Itoa(p)
	}
	srv, err := rendezvous.Listen(
		net.JoinHostPort(strings.Trim(bindHost, "[]"), strconv.Itoa(storePort)),
		rendezvous.WithServerLogger(s.log),
		rendezvous.WithToken(s.x.StoreToken),
	)
	if err != nil {
		return fmt.Errorf("fairrun: host the store: %w", err)
	}
	_, port, _ := net.SplitHostPort(srv.Addr())
	s.storeAddr = net.JoinHostPort(dialHost, port)
	sctx, stop := context.WithCancel(context.WithoutCancel(s.ctx))
	served := make(chan struct{})
	go func() { srv.Serve(sctx); close(served) }()
	s.undo = append(s.undo, func() error { stop(); srv.Close(); <-served; return nil })
	return nil
}

// startMPSDaemon starts a private MPS daemon when --mps asks for one (see
// wantMPS); without nvidia-cuda-mps-control that fails with --mps on and
// is a warning with auto.
func (s *setup) startMPSDaemon() error {
	if !wantMPS(s.c, s.c.gpus) {
		return nil
	}
	control, err := findMPSControl(s.base)
	switch {
	case err != nil && s.c.MPS == MPSOn:
		return fmt.Errorf("fairrun: --mps on: %w", err)
	case err != nil:
		s.log.Warn(
			"fairrun: ranks share a GPU, but there is no MPS: the GPU time-slices between them and timings are not faithful",
			"err",
			err,
		)
		return nil
	}
	d, err := startMPS(s.ctx, control, s.base, s.log)
	if err != nil {
		return err
	}
	s.undo = append(s.undo, func() error {
		if serr := d.Stop(); serr != nil {
			s.log.Error("fairrun: stopping the MPS daemon failed", "err", serr)
		}
		return nil
	})
	s.x.MPS = &d.env
	return nil
}

// Resolve decides, before anything runs, what depends on this node: the
// number of workers of --nproc-per-node gpu, auto or cpu (NProcFrom), the
// GPUs emulated machines are spread over (GPUList), and whether
// --nvlink-gbit applies (it shapes the loopback that ranks sharing a GPU
// talk over, so it is refused when the ranks of each machine have GPUs of
// their own), and with --rdzv-endpoint and no --node-rank whether this node
// is the endpoint's host (node rank 0; any other node needs --node-rank,
// since fairrun's rendezvous hands out no node ranks). It looks at c.Env (else the process's environment) and may
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
	if err := c.rdzvNodeRank(); err != nil {
		return c, asGiven(err, c.given)
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

// rdzvNodeRank gives a job of several nodes started with torchrun's
// --rdzv-endpoint and no --node-rank its node rank: 0 on the endpoint's
// host, where the store is served. On another node it is a usage error:
// torchrun's rendezvous hands node ranks out as nodes join, fairrun's
// store does not, and guessing would start two nodes as the same rank.
func (c *Config) rdzvNodeRank() error {
	if c.RdzvEndpoint == "" || c.NNodes == 1 {
		return nil
	}
	if _, ok := c.given["node-rank"]; ok {
		return nil
	}
	if isLocalHost(c.MasterAddr) {
		c.NodeRank = 0
		return nil
	}
	return &UsageError{Flag: "rdzv-endpoint", Value: c.RdzvEndpoint, Reason: fmt.Sprintf(
		"%s is not this node, so it is not node rank 0: give this node's --node-rank in [1, %d) "+
			"(fairrun runs a fixed set of nodes and hands out no node ranks)",
		c.MasterAddr, c.NNodes,
	)}
}

// isLocalHost reports whether host (a name or an IP) is an address of
// this machine: a loopback address, or one of its interfaces'.
func isLocalHost(host string) bool {
	ips := []net.IP{net.ParseIP(host)}
	if ips[0] == nil {
		addrs, err := net.LookupIP(host)
		if err != nil {
			return false
		}
		ips = addrs
	}
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		ifaddrs = nil
	}
	for _, ip := range ips {
		if ip.IsLoopback() {
			return true
		}
		for _, a := range ifaddrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return true
			}
		}
	}
	return false
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
