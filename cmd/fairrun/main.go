// Command fairrun launches the workers of a fairgo job on one node, the way
// torchrun does, and can split one host into several emulated machines with
// NICs of their own, to benchmark multi-machine layouts on one box.
//
//	fairrun [--nproc-per-node N|gpu|auto|cpu] [--standalone | --nnodes K --node-rank I --master-addr A --master-port P --store-bind H]
//	        [--nnodes K --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID]
//	        [--emulate-machines M [--gpus G] [--nic-gbit B [--nic-latency D] [--nvlink-gbit G]] [--mps auto|on|off]]
//	        [--max-restarts N] [--shuffle-ranks SEED] [--grace D] -- prog args...
//
// "fairrun --help" documents every flag, on stdout; a bad command line
// gives one message on stderr and exit status 2. Every flag also takes
// torchrun's spelling with underscores (--nproc_per_node, --master_addr,
// ...); --nproc-per-node takes torchrun's gpu (one worker per visible GPU:
// CUDA_VISIBLE_DEVICES, else nvidia-smi -L; none is a bad command line),
// auto (gpu when a GPU is visible, else cpu) and cpu (one worker per CPU);
// and --standalone is torchrun's: one node with a store of its own on
// a free port, which a single node gets anyway (refused with --nnodes > 1,
// --master-addr or --master-port). --nproc-per-node is 1 when left out.
// torchrun's multi-node form is taken for a fixed number of nodes:
// --rdzv-endpoint HOST:PORT (with --rdzv-backend c10d or static, and
// --rdzv-id, which the workers get as TORCHELASTIC_RUN_ID) is --master-addr
// HOST --master-port PORT, and HOST's node is node rank 0 unless
// --node-rank says otherwise; every other node needs --node-rank, since
// fairrun hands out no node ranks, and an elastic --nnodes MIN:MAX is
// refused. --max-restarts N starts the whole group again after a worker
// fails, up to N times, with a fresh store (TORCHELASTIC_RESTART_COUNT
// counts the attempts before); --no-python is accepted and changes nothing,
// as fairrun runs any program as given. Errors name flags as typed
// (--bogus). Node rank 0 hosts the rendezvous
// store, bound to --master-addr (or --store-bind), never every interface
// unless asked, and serving only clients that present the job's token,
// FAIRGO_STORE_TOKEN: random per job, or taken from the environment (which
// a job of several nodes must set alike on every node). Each worker gets
// the token and RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, FAIRGO_STORE_ADDR and
// GROUP_RANK, NCCL_NVLS_ENABLE=0 unless the environment sets it, and the
// testbed description FAIRGO_TESTBED_MACHINES, _NIC_GBIT, _NIC_LATENCY,
// _NETNS, _MPS, _NVLINK_GBIT and, with --emulate-machines, _INTRA. Every
// output line is prefixed with the worker's rank ("[3] ..."). The rest of
// the environment passes through, FAIRGO_LOG_LEVEL included (the workers'
// fairgo logs warnings and errors only without it); fairrun's own messages
// are at info, or at the level FAIRGO_LOG_LEVEL names.
//
// Every worker runs in its own process group, and fairrun is a child
// subreaper, so it adopts the processes a worker leaves behind. A worker's
// exit is seen from its process status at once, even while a child of it
// holds its output open. When one worker fails, or fairrun gets SIGINT or
// SIGTERM, every process of the job (the workers' groups and every adopted
// process, such as children a worker started with setsid) gets SIGTERM,
// then SIGKILL after --grace; fairrun names the first failed rank and exits
// with its code (128+N for signal N).
//
// --emulate-machines M cuts the N workers into M contiguous groups, each a
// virtual machine with its own NCCL_HOSTID and FAIRGO_MACHINE_ID and its
// own LOCAL_RANK numbering; worker i gets CUDA_VISIBLE_DEVICES set to GPU i
// mod G (several workers may share a GPU). The ranks of one machine talk
// GPU to GPU (FAIRGO_TESTBED_INTRA=nvlink) when the machine has N/M ≤ G
// ranks. With more, ranks of one machine share GPUs, which NCCL refuses
// within one host and topology within one machine unless the devices have
// identities of their own: each rank then gets NCCL_HOSTID=<machine
// id>-d<local rank> (NCCL treats every rank as a host of its own and uses
// its socket transport between them, over the machine's loopback) and
// FAIRGO_DEVICE_ID=<gpu>/r<local rank>, while FAIRGO_MACHINE_ID still groups
// them into machines (FAIRGO_TESTBED_INTRA=loopback). Flat NCCL then runs
// over W hosts and does not know the machines. Without --nic-gbit, NCCL
// talks between machines over loopback (NCCL_SOCKET_IFNAME=lo). With --nic-gbit B,
// each emulated machine is a network namespace with one NIC, eth0, a veth
// whose other end is on a bridge in the root namespace (10.77.x.0/24,
// bridge .1, machine i .(i+2), MTU 9000), shaped by tbf to B Gbit/s on both
// ends (so in each direction) and, with --nic-latency D, delayed by netem
// on the machine's end; --nvlink-gbit G shapes lo of every machine's
// namespace by tbf to G Gbit/s, the intra-machine link of ranks that share
// GPUs (lo is one queue, so G bounds the sum of a machine's intra-machine
// traffic, unlike NVLink's per-GPU, per-direction links; refused when the
// ranks of a machine have GPUs of their own, with exit status 2 before
// anything runs, like every bad command line). Each tbf queues 16 ms at its
// rate (--nic-queue), so that a machine's own flows are not dropped before
// its NIC, as a real NIC never drops them; TCP's slow start after idle is
// off in every machine's namespace (--nic-slow-start-after-idle keeps it),
// as an RDMA fabric has no congestion window to restart; --nic-rto-min sets
// TCP's minimum retransmission timeout on the machines' routes. At exit
// fairrun logs each NIC's bytes and drops. Its workers run inside the
// namespace with NCCL_SOCKET_IFNAME=eth0 and NCCL_IB_DISABLE=1 (unless
// set), and the store is served on the bridge. This needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN)
// and a kernel with network namespaces, veth, bridge and tbf (netem for
// --nic-latency); fairrun checks them first and stops, before starting any
// worker, saying what is missing. Everything it builds carries a per-run
// name and is removed on exit, on a signal and on failure; the namespaces
// are held only by fairrun and its workers, so they vanish even if fairrun
// is killed, and the next run removes a killed run's bridge.
//
// With --mps auto (the default), when ranks share a GPU (more workers than
// GPUs) the workers run under a private MPS daemon
// (nvidia-cuda-mps-control -d, looked up in PATH and /usr/local/nvidia/bin,
// with fresh CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY), stopped
// with "quit" at the end; without the daemon the GPU time-slices between
// them and timings are not faithful. fairrun changes no GPU setting.
//
// --shuffle-ranks SEED permutes the global ranks over the workers, to test
// that nothing depends on the rank order.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/fairgo/fairgo/cmd/fairrun/internal/launch"
	"github.com/fairgo/fairgo/internal/cli"
)

func main() {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		for s := range sigs {
			cancel(&launch.SignalError{Signal: s.(syscall.Signal)})
		}
	}()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// program is fairrun for cli.Program.Status: the help on stdout, a usage
// error followed by the synopsis.
var program = cli.Program{
	Name: "fairrun",
	Help: func(w io.Writer) { io.WriteString(w, launch.Usage()) },
	Hint: launch.Synopsis,
}

// run is fairrun's command line args (without the program name): it
// returns the exit status, 2 for a bad command line, else the job's (see
// launch.Run). A signal ends ctx with a *launch.SignalError as its cause.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := launch.ParseArgs(args)
	if err == nil {
		// What depends on this node (--nproc-per-node gpu|auto|cpu, the
		// GPUs, --nvlink-gbit's condition) is a bad command line too,
		// found before anything runs.
		cfg.Stdout, cfg.Stderr = stdout, stderr
		cfg, err = launch.Resolve(cfg)
	}
	if err != nil {
		if errors.Is(err, launch.ErrUsage) {
			err = cli.Usage(err)
		}
		return program.Status(err, stdout, stderr)
	}
	code, err := launch.Run(ctx, cfg)
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(stderr, cli.Message(program.Name, err))
	}
	return code
}
