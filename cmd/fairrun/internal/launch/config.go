// Package launch is fairrun's library: it parses the command line, plans
// each worker's environment (torchrun variables, emulated machines, GPU
// pinning) and runs the workers as one group that lives and dies together.
//
// The group hosts the rendezvous store on node rank 0, prefixes every output
// line with the worker's rank, and on the first failure or a signal stops
// every worker (SIGTERM, then SIGKILL after a grace period).
package launch

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fairgo/fairgo/cmd/fairrun/internal/netbed"
	"github.com/fairgo/fairgo/internal/cli"
	"github.com/fairgo/fairgo/logging"
)

// Defaults of the command line.
const (
	DefaultGrace      = 5 * time.Second
	DefaultMasterAddr = "127.0.0.1"
	DefaultMasterPort = 29500 // with --nnodes > 1; a single node picks a free port
	// DefaultRdzvPort is the port of an --rdzv-endpoint given without one,
	// as torchrun's.
	DefaultRdzvPort = 29400
)

// Rendezvous backends --rdzv-backend accepts: torchrun's names for a job of
// a fixed number of nodes, which fairrun's store on node rank 0 serves.
const (
	RdzvC10d   = "c10d"
	RdzvStatic = "static"
)

// Limits of the emulated NICs.
const (
	MaxNICGbit    = netbed.MaxGbit    // a larger --nic-gbit is taken for a typo (Mbit/s?)
	MaxNICLatency = netbed.MaxLatency // one-way delay added to every packet
	MaxNICQueue   = netbed.MaxQueue   // tbf queue of an emulated NIC, in time at its rate
	MaxNICRtoMin  = netbed.MaxRtoMin  // TCP's minimum retransmission timeout on the emulated routes
	// DefaultNICRtoMin is --nic-rto-min's default: the kernel's. No run
	// on the one-GPU testbed had a retransmission timeout (bench/NOTES.md
	// item 35), and a short one with slow start after idle on would
	// restart windows after a few ms of idle.
	DefaultNICRtoMin = 0
	MaxNICMachines   = netbed.MaxMachines // one /24 subnet: the bridge and one address per machine
)

// MPSMode says when fairrun runs the workers under a private MPS daemon.
type MPSMode string

// MPS modes (--mps).
const (
	// on when emulated machines' ranks share a GPU (more workers than GPUs) and the daemon is installed
	MPSAuto MPSMode = "auto"
	// always; an error when nvidia-cuda-mps-control is missing
	MPSOn MPSMode = "on"
	// never
	MPSOff MPSMode = "off"
)

// Config is one fairrun invocation.
type Config struct {
	// workers on this node; 0 with NProcFrom until Resolve
	NProcPerNode int
	// --nproc-per-node gpu, auto or cpu (torchrun's): Resolve counts the workers on this node; "": NProcPerNode as given
	NProcFrom string
	// nodes in the job (--nnodes K, or K:K; a range MIN:MAX is refused: no elastic jobs)
	NNodes int
	// this node's index in [0, NNodes)
	NodeRank int
	// host of the store (node rank 0), as the workers dial it
	MasterAddr string
	// port of the store; 0: a free port (single node only)
	MasterPort int
	// --standalone: one node with a store of its own on a free port (what a single node gets anyway);
	// refuses --nnodes > 1, --master-addr, --master-port
	Standalone bool
	// host or IP the store listens on; "": MasterAddr
	StoreBind string
	// split this node's workers into this many virtual machines; 0: off
	EmulateMachines int
	// GPUs to spread emulated machines over; 0: detect
	GPUs int
	// permute global ranks across this node's workers
	Shuffle bool
	// the permutation's seed
	ShuffleSeed uint64
	Grace       time.Duration

	// An emulated machine's NIC (with EmulateMachines): NICGbit > 0 puts
	// every emulated machine in a network namespace of its own with one NIC
	// shaped to NICGbit Gbit/s each way; NICLatency adds a one-way delay to
	// every packet a machine sends.
	NICGbit    float64
	NICLatency time.Duration
	// NICQueue is the tbf queue of every NIC (and shaped loopback), in time
	// at its rate; 0: netbed.DefaultQueue.
	NICQueue time.Duration
	// NICRtoMin is TCP's minimum retransmission timeout on every route of
	// the emulated machines; 0: the kernel's (200 ms).
	NICRtoMin time.Duration
	// NICSlowStartAfterIdle keeps TCP's congestion-window restart after
	// idle in the emulated machines (the kernel's default); false turns it
	// off there.
	NICSlowStartAfterIdle bool
	// NVLinkGbit (with NICGbit) shapes lo in every emulated machine's
	// namespace to NVLinkGbit Gbit/s: the intra-machine link of ranks that
	// share a GPU, which talk over NCCL's sockets through lo. A tbf on lo
	// bounds the sum of all intra-machine traffic of the machine (lo is one
	// queue), unlike NVLink's links, one per GPU and direction.
	NVLinkGbit float64
	MPS        MPSMode // "": MPSAuto

	// MaxRestarts is how many times the whole group is started again after
	// a worker fails, as torchrun's --max-restarts: every worker is
	// stopped, and the store made afresh, before the next attempt. Each
	// node restarts its own workers: in a job of several nodes the others'
	// workers fail in turn (their peers are gone, and fairgo's watchdog
	// ends what waits on them), so every node starts again.
	MaxRestarts int
	// torchrun's rendezvous flags, for a fixed number of nodes:
	// RdzvEndpoint "HOST[:PORT]" stands for --master-addr HOST
	// --master-port PORT (DefaultRdzvPort when left out), RdzvBackend is
	// c10d or static, RdzvID the job's name (TORCHELASTIC_RUN_ID).
	RdzvBackend, RdzvEndpoint, RdzvID string
	// NoPython is torchrun's --no-python, which fairrun needs not: it runs
	// any program as given, never "python prog".
	NoPython bool

	Program string   // the worker program
	Args    []string // its arguments

	Env    []string     // the workers' base environment; nil: os.Environ()
	Stdout io.Writer    // where prefixed worker stdout goes; nil: os.Stdout
	Stderr io.Writer    // where prefixed worker stderr and fairrun's messages go; nil: os.Stderr
	Logger *slog.Logger // nil: a text logger on Stderr, at info or the level FAIRGO_LOG_LEVEL names

	prober netbed.Prober // checks --nic-gbit's needs; the zero value checks this host (tests replace it)

	given    map[string]string // the text of every flag given, by its hyphenated name (ParseArgs), for Resolve's errors
	resolved bool              // Resolve ran: gpus is this node's
	gpus     []string          // the GPUs emulated machines are spread over (Resolve)
}

// ErrUsage wraps every command-line error.
var ErrUsage = errors.New("fairrun: invalid command line")

// ErrHelp is returned by ParseArgs for -h, -help and --help: print Usage()
// to stdout and exit 0. It wraps flag.ErrHelp.
var ErrHelp = fmt.Errorf("fairrun: help requested: %w", flag.ErrHelp)

// UsageError names the flag at fault. It wraps ErrUsage.
type UsageError struct {
	Flag   string
	Value  any
	Reason string
}

func (e *UsageError) Error() string {
	return fmt.Sprintf("fairrun: --%s %v: %s", e.Flag, e.Value, e.Reason)
}

// Unwrap returns ErrUsage.
func (e *UsageError) Unwrap() error { return ErrUsage }

// Synopsis is the short form printed after command-line errors.
const Synopsis = `usage: fairrun [--nproc-per-node N|gpu|auto|cpu] [--standalone | --nnodes K --node-rank I --master-addr A --master-port P --store-bind H]
               [--nnodes K --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID]
               [--emulate-machines M [--gpus G] [--nic-gbit B [--nic-latency D] [--nvlink-gbit G]] [--mps auto|on|off]]
               [--max-restarts N] [--shuffle-ranks SEED] [--grace D] -- prog args...
run "fairrun --help" for every flag`

const usageHead = `usage: fairrun [flags] -- prog args...

fairrun starts --nproc-per-node copies of prog (1 by default) on this node with the
torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), FAIRGO_STORE_ADDR and FAIRGO_STORE_TOKEN, hosts
the rendezvous store on node rank 0 (it serves only clients with the token:
random per job, or FAIRGO_STORE_TOKEN from the environment, which --nnodes
> 1 needs alike on every node), prefixes every output line with the rank,
and ends every process of the job when one worker fails or on SIGINT or
SIGTERM, exiting with the first failure's code.

--emulate-machines M splits one host into M machines (own NCCL_HOSTID,
FAIRGO_MACHINE_ID, LOCAL_RANK numbering, GPUs round-robin). When a machine
has more ranks than there are GPUs, its ranks share GPUs: each rank is then
an NCCL host of its own (NCCL_HOSTID=<machine>-d<local rank>) with a device
identity of its own (FAIRGO_DEVICE_ID=<gpu>/r<local rank>), so that NCCL
and fairgo accept them, and they talk over NCCL's sockets on the loopback
inside their machine (flat NCCL then does not know the machines). With
--nic-gbit each machine also gets a network namespace with one NIC (eth0, a
veth on a bridge, shaped by tbf in both directions), and --nvlink-gbit
shapes its loopback too; this needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and
a kernel with network namespaces, veth, bridge and tbf (netem for
--nic-latency). Workers learn the testbed from FAIRGO_TESTBED_MACHINES,
_NIC_GBIT, _NIC_LATENCY, _NETNS, _MPS, _INTRA (nvlink: ranks of a machine
on GPUs of their own; loopback: sharing GPUs) and _NVLINK_GBIT.

Every flag takes one dash or two, and torchrun's spelling with underscores
as well (--nproc_per_node, --nnodes, --node_rank, --master_addr,
--master_port, --store_bind, --emulate_machines, ...). A single node is
standalone by default, as torchrun's --standalone makes it: the store on
127.0.0.1 at a free port; --standalone says so, and is refused with --nnodes
> 1, --master-addr or --master-port. --nproc-per-node takes torchrun's
gpu (one worker per visible GPU: CUDA_VISIBLE_DEVICES, else nvidia-smi -L),
auto (gpu when a GPU is visible, else cpu) and cpu (one worker per CPU).
torchrun's multi-node form works for a fixed number of nodes: --nnodes K
--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID is --master-addr
HOST --master-port PORT, and the node whose address HOST is takes node rank
0 unless --node-rank says otherwise (the others need --node-rank); an
elastic range --nnodes MIN:MAX is refused. --max-restarts N starts the whole
group again, up to N times, after a worker fails (TORCHELASTIC_RESTART_COUNT
tells the workers which attempt they are); --no-python is accepted and
changes nothing, as fairrun runs any program as given.
-h or --help prints this on stdout, --version fairgo's version; a bad command line, also one found
from this node's GPUs before anything runs (gpu without a GPU,
--nvlink-gbit where the ranks of each machine have GPUs of their own),
gives one message on stderr and exit status 2.

flags:
`

// newFlagSet declares every flag of fairrun, bound to c.
func newFlagSet(c *Config) *flag.FlagSet {
	fs := flag.NewFlagSet("fairrun", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	declareJobFlags(fs, c)
	declareMachineFlags(fs, c)
	declareNICFlags(fs, c)
	declareWorkerFlags(fs, c)
	return fs
}

// declareJobFlags declares the flags of the job's shape and its store:
// the workers on this node, the nodes, and where the store is.
func declareJobFlags(fs *flag.FlagSet, c *Config) {
	fs.Var(
		nprocValue{c},
		"nproc-per-node",
		"`N` workers to start on this node: a number, or as torchrun: gpu (one per visible GPU), "+
			"auto (gpu when there is a GPU, else cpu), cpu (one per CPU)",
	)
	fs.Var(
		nnodesValue{c},
		"nnodes",
		"`K` nodes in the job (or K:K; an elastic range MIN:MAX is not supported); run one fairrun per node",
	)
	fs.IntVar(&c.NodeRank, "node-rank", 0, "this node's index `I` in [0, nnodes); node 0 hosts the store")
	fs.StringVar(
		&c.MasterAddr,
		"master-addr",
		DefaultMasterAddr,
		"`host` of the store, as every worker dials it (not allowed with --nic-gbit: the bridge's address is used)",
	)
	fs.IntVar(
		&c.MasterPort,
		"master-port",
		-1,
		fmt.Sprintf(
			"MASTER_PORT, left free for the trainer's own store; "+
				"fairgo's store listens on `port`+1 (default: free ports on one node, %d with --nnodes > 1)",
			DefaultMasterPort,
		),
	)
	fs.BoolVar(
		&c.Standalone,
		"standalone",
		false,
		"one node with a store of its own on a free port, as torchrun's "+
			"--standalone (what a single node gets by default; not with --nnodes > 1, --master-addr or "+
			"--master-port)",
	)
	fs.StringVar(
		&c.StoreBind,
		"store-bind",
		"",
		"`host` or IP the store listens on (default: --master-addr; never every interface unless given 0.0.0.0 or ::)",
	)
	declareRdzvFlags(fs, c)
}

// declareRdzvFlags declares torchrun's rendezvous flags, which name
// fairrun's store for a fixed number of nodes.
func declareRdzvFlags(fs *flag.FlagSet, c *Config) {
	cli.Choice(
		fs,
		&c.RdzvBackend,
		"rdzv-backend",
		"",
		"torchrun's rendezvous `backend`: c10d or static, both served by fairrun's store on node rank 0 "+
			"(a fixed number of nodes)",
		cli.OneOf(RdzvC10d, RdzvStatic),
	)
	fs.StringVar(
		&c.RdzvEndpoint,
		"rdzv-endpoint",
		"",
		fmt.Sprintf(
			"torchrun's `HOST:PORT` of the rendezvous: --master-addr HOST --master-port PORT (port %d when left "+
				"out); the node whose address HOST is gets node rank 0 without --node-rank",
			DefaultRdzvPort,
		),
	)
	fs.StringVar(
		&c.RdzvID,
		"rdzv-id",
		"",
		"torchrun's job `id`, the same on every node; the workers get it as TORCHELASTIC_RUN_ID",
	)
}

// declareMachineFlags declares the flags of the emulated machines: how
// many, and the GPUs they are spread over.
func declareMachineFlags(fs *flag.FlagSet, c *Config) {
	fs.IntVar(
		&c.EmulateMachines,
		"emulate-machines",
		0,
		"split this node's workers into `M` emulated machines (must divide --nproc-per-node)",
	)
	fs.IntVar(
		&c.GPUs,
		"gpus",
		0,
		"`G` GPUs to spread emulated machines over (default: CUDA_VISIBLE_DEVICES, else nvidia-smi -L, else 1)",
	)
}

// declareNICFlags declares the flags of the emulated machines' links: the
// NIC's rate and delay, and the loopback's rate.
func declareNICFlags(fs *flag.FlagSet, c *Config) {
	fs.Float64Var(
		&c.NICGbit,
		"nic-gbit",
		0,
		fmt.Sprintf(
			"give each emulated machine a network namespace with one NIC shaped to `B` Gbit/s each way (0 < B <= "+
				"%d; needs --emulate-machines, root)",
			MaxNICGbit,
		),
	)
	fs.DurationVar(
		&c.NICLatency,
		"nic-latency",
		0,
		"one-way `delay` added to every packet an emulated machine sends, e.g. 50us (needs --nic-gbit)",
	)
	fs.DurationVar(
		&c.NICQueue,
		"nic-queue",
		netbed.DefaultQueue,
		fmt.Sprintf(
			"how long each emulated NIC's tbf queue is at its rate, e.g. 16ms (0 < D <= %v; needs --nic-gbit); "+
				"a queue that overflows drops packets, which TCP retransmits",
			MaxNICQueue,
		),
	)
	fs.DurationVar(
		&c.NICRtoMin,
		"nic-rto-min",
		DefaultNICRtoMin,
		fmt.Sprintf(
			"TCP's minimum retransmission timeout on every route of the emulated machines, whole ms "+
				"(0: the kernel's 200 ms, a stall per lost tail packet that a lossless RDMA fabric never has; "+
				"<= %v; needs --nic-gbit)",
			MaxNICRtoMin,
		),
	)
	fs.BoolVar(
		&c.NICSlowStartAfterIdle,
		"nic-slow-start-after-idle",
		false,
		"keep TCP's slow start after idle (the kernel's default) in the emulated machines; by default it is off "+
			"there, as an RDMA fabric has no congestion window to restart (needs --nic-gbit)",
	)
	fs.Float64Var(
		&c.NVLinkGbit,
		"nvlink-gbit",
		0,
		fmt.Sprintf(
			"shape each emulated machine's loopback (lo of its namespace) by tbf to `G` Gbit/s: "+
				"the intra-machine link of ranks that share a GPU, "+
				"which talk over NCCL sockets through lo. lo is one queue, "+
				"so G bounds the sum of all intra-machine traffic of a machine, unlike NVLink's links, "+
				"one per GPU and direction "+
				"(0 < G <= %d; needs --nic-gbit, and more ranks per machine than GPUs)",
			MaxNICGbit,
		),
	)
}

// declareWorkerFlags declares the flags of how the workers run: under
// MPS, stopped after a grace period, with shuffled ranks.
func declareWorkerFlags(fs *flag.FlagSet, c *Config) {
	fs.Func(
		"mps",
		"`mode` of running the workers under a private CUDA MPS daemon: "+
			"auto (when emulated machines' ranks share a GPU), on, off (default auto)",
		func(s string) error {
			switch m := MPSMode(s); m {
			case MPSAuto, MPSOn, MPSOff:
				c.MPS = m
				return nil
			}
			return fmt.Errorf("%q is not auto, on or off", s)
		},
	)
	fs.DurationVar(&c.Grace, "grace", DefaultGrace, "`duration` between SIGTERM and SIGKILL when the job is stopped")
	fs.IntVar(
		&c.MaxRestarts,
		"max-restarts",
		0,
		"start the whole group again after a worker fails, up to `N` times, as torchrun does "+
			"(the workers see TORCHELASTIC_RESTART_COUNT)",
	)
	fs.BoolVar(
		&c.NoPython,
		"no-python",
		false,
		"torchrun's flag to run prog without python: what fairrun always does (accepted, changes nothing)",
	)
	fs.Func(
		"shuffle-ranks",
		"permute the global ranks over this node's workers with this `seed`, to test that nothing depends on rank order",
		func(s string) error {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return fmt.Errorf("seed %q is not an unsigned integer", s)
			}
			c.Shuffle, c.ShuffleSeed = true, v
			return nil
		},
	)
}

// Values of --nproc-per-node that count this node's devices, as torchrun's.
const (
	NProcGPU  = "gpu"  // one worker per visible GPU (CUDA_VISIBLE_DEVICES, else nvidia-smi -L); none is a usage error
	NProcAuto = "auto" // NProcGPU when a GPU is visible, else NProcCPU
	NProcCPU  = "cpu"  // one worker per CPU this process may run on
)

// nprocValue is --nproc-per-node: a number, or gpu, auto or cpu, which
// Resolve turns into one.
type nprocValue struct{ c *Config }

func (v nprocValue) String() string {
	if v.c == nil {
		return "0"
	}
	if v.c.NProcFrom != "" {
		return v.c.NProcFrom
	}
	return strconv.Itoa(v.c.NProcPerNode)
}

func (v nprocValue) Set(s string) error {
	switch s {
	case NProcGPU, NProcAuto, NProcCPU:
		v.c.NProcPerNode, v.c.NProcFrom = 0, s
		return nil
	}
	n, err := strconv.ParseInt(s, 0, strconv.IntSize)
	if err != nil {
		return fmt.Errorf("not a number, %s, %s or %s", NProcGPU, NProcAuto, NProcCPU)
	}
	v.c.NProcPerNode, v.c.NProcFrom = int(n), ""
	return nil
}

// nnodesValue is --nnodes: K, or torchrun's K:K. A range MIN:MAX with
// MIN < MAX asks for an elastic job, which fairrun does not run.
type nnodesValue struct{ c *Config }

func (v nnodesValue) String() string {
	if v.c == nil {
		return "0"
	}
	return strconv.Itoa(v.c.NNodes)
}

func (v nnodesValue) Set(s string) error {
	lo, hi, ranged := strings.Cut(s, ":")
	n, err := strconv.Atoi(lo)
	if err != nil {
		return fmt.Errorf("not a number of nodes K (or K:K)")
	}
	if ranged {
		m, err := strconv.Atoi(hi)
		if err != nil {
			return fmt.Errorf("not a number of nodes K (or K:K)")
		}
		if m != n {
			return fmt.Errorf(
				"elastic ranges MIN:MAX are not supported: fairrun runs a fixed number of nodes (--nnodes %d, or %d:%d)",
				m, m, m,
			)
		}
	}
	v.c.NNodes = n
	return nil
}

// defaults is the configuration before the command line.
func defaults() Config {
	return Config{
		NProcPerNode: 1, NNodes: 1, MasterAddr: DefaultMasterAddr, MasterPort: -1, Grace: DefaultGrace, MPS: MPSAuto,
	}
}

// Usage is fairrun's whole help text: what it does and every flag.
func Usage() string {
	var b strings.Builder
	b.WriteString(usageHead)
	c := defaults()
	newFlagSet(&c).VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		if arg != "" {
			arg = " " + arg
		}
		fmt.Fprintf(&b, "  --%s%s\n        %s", f.Name, arg, usage)
		switch f.DefValue {
		case "", "0", "-1", "0s", "false":
		default:
			fmt.Fprintf(&b, " (default %s)", f.DefValue)
		}
		b.WriteString("\n")
	})
	return b.String()
}

// withUnderscores gives every flag of fs with a hyphen in its name
// torchrun's spelling with underscores too (--nproc_per_node for
// --nproc-per-node), on the same value.
func withUnderscores(fs *flag.FlagSet) {
	var hyphenated []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if strings.Contains(f.Name, "-") {
			hyphenated = append(hyphenated, f)
		}
	})
	for _, f := range hyphenated {
		fs.Var(f.Value, strings.ReplaceAll(f.Name, "-", "_"), f.Usage)
	}
}

// ParseArgs reads fairrun's command line (without the program name). Flags
// come first, in hyphen or underscore spelling; the worker program and its
// arguments follow "--" (or the first argument that is not a flag). -h,
// -help and --help give ErrHelp, -version and --version cli.ErrVersion. A
// UsageError echoes the value as given.
func ParseArgs(args []string) (Config, error) {
	c := defaults()
	fs := newFlagSet(&c)
	given := cli.Given(fs) // the text of every flag set, by its hyphenated name
	withUnderscores(fs)
	if err := asGiven(parseArgs(fs, args, &c, given), given); err != nil {
		return Config{}, err
	}
	c.given = given
	return c, nil
}

// asGiven makes a UsageError among err's echo its flag's value as given.
// It returns err.
func asGiven(err error, given map[string]string) error {
	var ue *UsageError
	if errors.As(err, &ue) {
		if v, ok := given[ue.Flag]; ok {
			ue.Value = v
			if v == "" {
				ue.Value = `""`
			}
		}
	}
	return err
}

// parseArgs parses args with fs, whose flags are bound to c, and checks c;
// given is the text of each flag set.
func parseArgs(fs *flag.FlagSet, args []string, c *Config, given map[string]string) error {
	if err := cli.ParseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ErrHelp
		}
		if errors.Is(err, cli.ErrVersion) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	set := func(name string) bool { _, ok := given[name]; return ok }
	bad := func(flag string, v any, reason string) error {
		return &UsageError{Flag: flag, Value: v, Reason: reason}
	}
	rest := fs.Args()
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	if len(rest) == 0 {
		return fmt.Errorf("%w: no worker program", ErrUsage)
	}
	c.Program, c.Args = rest[0], rest[1:]
	if err := c.takeRdzv(set, given); err != nil {
		return err
	}
	if c.MasterPort < 0 {
		c.MasterPort = 0
		if c.NNodes > 1 {
			c.MasterPort = DefaultMasterPort
		}
	}
	// Flags whose zero value is also their default: given explicitly, zero
	// is wrong.
	if set("nic-gbit") && c.NICGbit == 0 {
		return bad("nic-gbit", c.NICGbit, "must be > 0")
	}
	if set("nic-queue") && c.NICQueue == 0 {
		return bad("nic-queue", c.NICQueue, "must be > 0")
	}
	for _, f := range []string{"nic-queue", "nic-rto-min", "nic-slow-start-after-idle"} {
		if set(f) && c.NICGbit == 0 {
			return bad(f, given[f], "needs --nic-gbit (it shapes the emulated machines' NICs)")
		}
	}
	if set("nvlink-gbit") && c.NVLinkGbit == 0 {
		return bad("nvlink-gbit", c.NVLinkGbit, "must be > 0")
	}
	if set("master-addr") && c.NICGbit > 0 {
		return bad(
			"master-addr",
			c.MasterAddr,
			"not allowed with --nic-gbit: the store is served on the emulated machines' bridge",
		)
	}
	// torchrun's --standalone: one node, a store of its own on a free
	// port. That is what a single node gets anyway; a flag that says
	// otherwise is refused rather than ignored, even with the default's
	// value (Validate refuses --nnodes > 1).
	for _, f := range []string{"master-addr", "master-port"} {
		if c.Standalone && set(f) {
			return bad(f, given[f], notStandalone)
		}
	}
	return c.Validate()
}

// takeRdzv maps torchrun's rendezvous flags onto fairrun's: the endpoint's
// host and port become the store's (--master-addr, --master-port), which
// they may not contradict. set tells whether a flag was given, given its
// text.
func (c *Config) takeRdzv(set func(string) bool, given map[string]string) error {
	if c.Standalone && set("rdzv-endpoint") {
		return usageError("rdzv-endpoint", given["rdzv-endpoint"], notStandalone)
	}
	if !set("rdzv-endpoint") {
		if set("rdzv-backend") && c.NNodes > 1 && !set("master-addr") {
			return usageError(
				"rdzv-backend",
				c.RdzvBackend,
				"needs --rdzv-endpoint HOST:PORT with --nnodes > 1 (the host of node rank 0)",
			)
		}
		return nil
	}
	for _, f := range []string{"master-addr", "master-port"} {
		if set(f) {
			return usageError(f, given[f], "not allowed with --rdzv-endpoint, which gives the store's host and port")
		}
	}
	ep := c.RdzvEndpoint
	host, port := ep, strconv.Itoa(DefaultRdzvPort)
	if h, p, err := net.SplitHostPort(ep); err == nil {
		host, port = h, p
	} else if strings.Count(ep, ":") == 1 { // "host:" or ":port" and the like
		return usageError("rdzv-endpoint", ep, "not HOST:PORT")
	}
	p, err := strconv.Atoi(port)
	switch {
	case host == "":
		return usageError("rdzv-endpoint", ep, "no host: give HOST:PORT, the address of node rank 0")
	case err != nil || p < 0 || p > 65534:
		return usageError("rdzv-endpoint", ep, "the port is not a number in [0, 65534]")
	case p == 0 && c.NNodes > 1: // torchrun's standalone localhost:0 is one node's free port
		return usageError("rdzv-endpoint", ep, "port 0 (a free port) is for one node: several nodes need a fixed port")
	}
	c.MasterAddr, c.MasterPort = strings.Trim(host, "[]"), p
	return nil
}

// notStandalone is the reason of the flags --standalone refuses.
const notStandalone = "not allowed with --standalone (one node with a store of its own on a free port)"

// Validate checks the configuration, naming the flag at fault.
func (c Config) Validate() error {
	for _, check := range []func() error{c.checkJob, c.checkMachines, c.checkNICs} {
		if err := check(); err != nil {
			return err
		}
	}
	switch {
	case c.MPS != "" && c.MPS != MPSAuto && c.MPS != MPSOn && c.MPS != MPSOff:
		return usageError("mps", c.MPS, "must be auto, on or off")
	case c.Program == "":
		return fmt.Errorf("%w: no worker program", ErrUsage)
	}
	return nil
}

// usageError is the *UsageError of flag with value v.
func usageError(flag string, v any, reason string) error {
	return &UsageError{Flag: flag, Value: v, Reason: reason}
}

// checkJob checks the job's shape and its store: the workers on this
// node, the nodes, --standalone, and the store's address.
func (c Config) checkJob() error {
	bad := usageError
	switch {
	case c.NProcFrom != "" && c.NProcFrom != NProcGPU && c.NProcFrom != NProcAuto && c.NProcFrom != NProcCPU:
		return bad(
			"nproc-per-node",
			c.NProcFrom,
			fmt.Sprintf("not a number, %s, %s or %s", NProcGPU, NProcAuto, NProcCPU),
		)
	case c.NProcPerNode < 1 && c.NProcFrom == "":
		return bad("nproc-per-node", c.NProcPerNode, "must be at least 1")
	case c.NNodes < 1:
		return bad("nnodes", c.NNodes, "must be at least 1")
	case c.Standalone && c.NNodes > 1:
		return bad("nnodes", c.NNodes, notStandalone)
	case c.Standalone && c.MasterAddr != DefaultMasterAddr:
		return bad("master-addr", c.MasterAddr, notStandalone)
	case c.Standalone && c.MasterPort != 0:
		return bad("master-port", c.MasterPort, notStandalone)
	case c.NodeRank < 0 || c.NodeRank >= c.NNodes:
		return bad("node-rank", c.NodeRank, fmt.Sprintf("outside [0, --nnodes=%d)", c.NNodes))
	case c.MasterPort < 0 || c.MasterPort > 65534:
		return bad("master-port", c.MasterPort, "outside [0, 65534] (fairgo's store takes the port after it)")
	case c.MasterPort == 0 && c.NNodes > 1:
		return bad("master-port", c.MasterPort, "a job of several nodes needs a fixed port")
	case c.MasterAddr == "":
		return bad("master-addr", `""`, "empty")
	case c.StoreBind != "" && hasPort(c.StoreBind):
		return bad("store-bind", c.StoreBind, "give a host or IP; the port is --master-port")
	}
	return nil
}

// checkMachines checks the emulated machines, their GPUs, and the grace
// period.
func (c Config) checkMachines() error {
	bad := usageError
	switch {
	case c.EmulateMachines < 0:
		return bad("emulate-machines", c.EmulateMachines, "negative")
	case c.EmulateMachines > 0 && c.NProcPerNode > 0 && c.NProcPerNode%c.EmulateMachines != 0:
		return bad(
			"emulate-machines",
			c.EmulateMachines,
			fmt.Sprintf("does not divide --nproc-per-node=%d", c.NProcPerNode),
		)
	case c.GPUs < 0:
		return bad("gpus", c.GPUs, "negative")
	case c.Grace < 0:
		return bad("grace", c.Grace, "negative")
	case c.MaxRestarts < 0:
		return bad("max-restarts", c.MaxRestarts, "negative")
	}
	return nil
}

// nicQueue is the tbf queue of the emulated NICs, in time at their rate.
func (c Config) nicQueue() time.Duration {
	if c.NICQueue == 0 {
		return netbed.DefaultQueue
	}
	return c.NICQueue
}

// checkNICs checks the emulated NICs and loopback: their rates and delay,
// and what they need.
func (c Config) checkNICs() error {
	bad := usageError
	switch {
	case math.IsNaN(c.NICGbit) || c.NICGbit < 0 || c.NICGbit > MaxNICGbit:
		return bad("nic-gbit", c.NICGbit, fmt.Sprintf("must be in (0, %d] Gbit/s", MaxNICGbit))
	case c.NICGbit > 0 && c.EmulateMachines == 0:
		return bad("nic-gbit", c.NICGbit, "needs --emulate-machines (the NICs belong to emulated machines)")
	case c.NICGbit > 0 && c.EmulateMachines > MaxNICMachines:
		return bad(
			"emulate-machines",
			c.EmulateMachines,
			fmt.Sprintf("at most %d emulated machines with --nic-gbit (one /24 subnet)", MaxNICMachines),
		)
	case c.NICGbit > 0 && c.NNodes > 1:
		return bad(
			"nic-gbit",
			c.NICGbit,
			fmt.Sprintf("emulated NICs cannot reach other nodes: needs --nnodes 1, not %d", c.NNodes),
		)
	case c.NICGbit > 0 && c.StoreBind != "":
		return bad(
			"store-bind",
			c.StoreBind,
			"not allowed with --nic-gbit: the store is served on the emulated machines' bridge",
		)
	case c.NICLatency < 0 || c.NICLatency > MaxNICLatency:
		return bad("nic-latency", c.NICLatency, fmt.Sprintf("must be in [0, %v]", MaxNICLatency))
	case c.NICLatency > 0 && c.NICGbit == 0:
		return bad("nic-latency", c.NICLatency, "needs --nic-gbit (the delay is added on the emulated NICs)")
	case c.NICQueue < 0 || c.NICQueue > MaxNICQueue:
		return bad("nic-queue", c.NICQueue, fmt.Sprintf("must be in (0, %v]", MaxNICQueue))
	case c.NICRtoMin < 0 || c.NICRtoMin > MaxNICRtoMin || c.NICRtoMin%time.Millisecond != 0:
		return bad("nic-rto-min", c.NICRtoMin, fmt.Sprintf("must be whole milliseconds in [0, %v]", MaxNICRtoMin))
	case math.IsNaN(c.NVLinkGbit) || c.NVLinkGbit < 0 || c.NVLinkGbit > MaxNICGbit:
		return bad("nvlink-gbit", c.NVLinkGbit, fmt.Sprintf("must be in (0, %d] Gbit/s", MaxNICGbit))
	case c.NVLinkGbit > 0 && c.NICGbit == 0:
		return bad(
			"nvlink-gbit",
			c.NVLinkGbit,
			"needs --nic-gbit (it shapes the loopback of each emulated machine's network namespace)",
		)
	}
	return nil
}

// hasPort reports whether addr is "host:port" rather than a host or IP.
func hasPort(addr string) bool {
	_, _, err := net.SplitHostPort(addr)
	return err == nil
}

func (c Config) stdout() io.Writer {
	if c.Stdout == nil {
		return os.Stdout
	}
	return c.Stdout
}

func (c Config) stderr() io.Writer {
	if c.Stderr == nil {
		return os.Stderr
	}
	return c.Stderr
}

// logger is c.Logger, or fairrun's own: a text logger on Stderr at info
// (fairrun's lines are about the whole job, once), or at the level
// FAIRGO_LOG_LEVEL names, which the workers get too.
func (c Config) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	h := slog.NewTextHandler(c.stderr(), &slog.HandlerOptions{Level: slog.LevelDebug})
	return logging.New(h, os.LookupEnv, slog.LevelInfo)
}
