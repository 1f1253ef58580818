package launch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/fairgo/fairgo/cmd/fairrun/internal/netbed"
)

// Worker is one process to start.
type Worker struct {
	Slot    int      // index of the process on this node, 0..NProcPerNode-1
	Rank    int      // its global rank
	Machine int      // its (emulated) machine index; the node rank without emulation
	GPU     string   // its CUDA_VISIBLE_DEVICES with emulation, else ""
	Env     []string // its whole environment
}

// Extras is what Run set up beside the command line that the workers must
// know about.
type Extras struct {
	NetNS      bool    // every emulated machine is a network namespace with NIC netbed.NIC
	MPS        *MPSEnv // the private MPS daemon; nil: none
	StoreToken string  // the store's shared secret, as FAIRGO_STORE_TOKEN; "": none
	// MasterPort is the MASTER_PORT workers get: a port left free for the
	// trainer's own store (torch's TCPStore), not fairgo's. "": the store's.
	MasterPort string
	// MachineAddrs are the emulated machines' NIC addresses (with NetNS):
	// MASTER_ADDR is then the address of the machine of global rank 0,
	// where a trainer's own store listens.
	MachineAddrs []string
	// Restart is the number of times the group was started before this
	// one (--max-restarts), as TORCHELASTIC_RESTART_COUNT.
	Restart int
}

// MPSEnv is where a private MPS daemon's clients find it.
type MPSEnv struct {
	PipeDir string // CUDA_MPS_PIPE_DIRECTORY
	LogDir  string // CUDA_MPS_LOG_DIRECTORY
}

// Variables that describe the testbed to every worker, for benchmarks to
// record.
const (
	EnvTestbedMachines   = "FAIRGO_TESTBED_MACHINES"    // machines in the job, emulated or not
	EnvTestbedNICGbit    = "FAIRGO_TESTBED_NIC_GBIT"    // shaped NIC rate in Gbit/s; 0: not shaped
	EnvTestbedNICLatency = "FAIRGO_TESTBED_NIC_LATENCY" // added one-way delay, a Go duration ("0s")
	EnvTestbedNICQueue   = "FAIRGO_TESTBED_NIC_QUEUE"   // each NIC's tbf queue at its rate, a Go duration ("4ms")
	EnvTestbedNICRtoMin  = "FAIRGO_TESTBED_NIC_RTO_MIN" // TCP's rto_min on the machines' routes ("0s": the kernel's)
	// EnvTestbedNICSlowStartAfterIdle is 1 where the machines keep TCP's
	// slow start after idle, 0 where it is off.
	EnvTestbedNICSlowStartAfterIdle = "FAIRGO_TESTBED_NIC_SLOW_START_AFTER_IDLE"
	EnvTestbedNetNS                 = "FAIRGO_TESTBED_NETNS" // 1: each machine in its own network namespace
	EnvTestbedMPS                   = "FAIRGO_TESTBED_MPS"   // 1: workers run under a private MPS daemon
	// EnvTestbedIntra is the intra-machine link of emulated machines
	// (IntraNVLink or IntraLoopback); unset without --emulate-machines.
	EnvTestbedIntra = "FAIRGO_TESTBED_INTRA"
	// EnvTestbedNVLinkGbit is the rate lo of each machine is shaped to,
	// Gbit/s (--nvlink-gbit); 0: not shaped.
	EnvTestbedNVLinkGbit = "FAIRGO_TESTBED_NVLINK_GBIT"
)

// Values of EnvTestbedIntra.
const (
	// IntraNVLink: the ranks of a machine have GPUs of their own and one
	// NCCL host, so NCCL connects them GPU to GPU (NVLink where the GPUs
	// have it).
	IntraNVLink = "nvlink"
	// IntraLoopback: the ranks of a machine share GPUs, each is an NCCL
	// host of its own, and their intra-machine traffic is NCCL's sockets
	// over the loopback (lo of the machine's namespace with --nic-gbit).
	IntraLoopback = "loopback"
)

// Identities fairrun gives emulated machines' workers.
const (
	EnvMachineID  = "FAIRGO_MACHINE_ID" // the machine, for fairgo's topology
	EnvNCCLHostID = "NCCL_HOSTID"       // the host, for NCCL
	EnvDeviceID   = "FAIRGO_DEVICE_ID"  // the device within its machine, for fairgo's topology (ranks sharing a GPU)
)

// RanksShareGPUs reports whether ranks of one emulated machine share a
// GPU: the machines have more ranks each than there are GPUs.
func RanksShareGPUs(c Config, gpus []string) bool {
	return c.EmulateMachines > 0 && len(gpus) > 0 && c.NProcPerNode/c.EmulateMachines > len(gpus)
}

// Plan computes every worker's environment. base is the environment the
// workers inherit; storeAddr the "host:port" of the store; gpus the devices
// emulated machines are spread over (ignored without emulation); x what Run
// set up for them.
//
// Global ranks are NodeRank·N + slot, permuted within the node with
// --shuffle-ranks. With --emulate-machines M, slots are cut into M
// contiguous groups of N/M; each group gets its own FAIRGO_MACHINE_ID and
// its own LOCAL_RANK numbering, and slot i is pinned to gpus[i mod
// len(gpus)] through CUDA_VISIBLE_DEVICES. NCCL's sockets use the machine's
// NIC, eth0, in its namespace (and NCCL_IB_DISABLE=1 unless set, so that no
// RDMA device bypasses the shaped NIC), else lo.
//
// When the ranks of a machine have GPUs of their own (N/M ≤ len(gpus)) the
// group shares one NCCL_HOSTID, its machine id, and NCCL connects its ranks
// GPU to GPU (FAIRGO_TESTBED_INTRA=nvlink). When they share GPUs (NCCL
// refuses two ranks of one host on one GPU, and topology two ranks of one
// machine claiming one device), each rank gets NCCL_HOSTID=<machine
// id>-d<local rank>, so that NCCL treats it as a host of its own and
// reaches the other ranks of its machine through its socket transport over
// the machine's loopback, and FAIRGO_DEVICE_ID=<gpu>/r<local rank>, a device
// identity of its own; FAIRGO_MACHINE_ID still groups the ranks into
// machines (FAIRGO_TESTBED_INTRA=loopback).
func Plan(c Config, base []string, storeAddr string, gpus []string, x Extras) ([]Worker, error) {
	p, err := newPlanner(c, base, storeAddr, gpus, x)
	if err != nil {
		return nil, err
	}
	workers := make([]Worker, p.n)
	for slot := range p.n {
		workers[slot] = p.worker(slot)
	}
	return workers, nil
}

// planner holds what every worker's environment is derived from (Plan's
// arguments) and what Plan decides once for all of them.
type planner struct {
	c         Config
	base      []string
	storeAddr string
	gpus      []string
	x         Extras

	n      int   // workers on this node
	groups int   // machines on this node: 1 without emulation
	per    int   // workers per machine
	perm   []int // slot → rank within the node
	shared bool  // ranks of one emulated machine share a GPU

	masterAddr, masterPort string // MASTER_ADDR and MASTER_PORT
	hostname               string // leads emulated machines' ids
}

// newPlanner checks Plan's arguments and decides the rank of each slot,
// the machines, MASTER_ADDR and MASTER_PORT.
func newPlanner(c Config, base []string, storeAddr string, gpus []string, x Extras) (*planner, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.NProcPerNode < 1 {
		return nil, fmt.Errorf(
			"fairrun: plan: --nproc-per-node %s is not resolved to a number of workers (Resolve)",
			c.NProcFrom,
		)
	}
	host, port, err := splitHostPort(storeAddr)
	if err != nil {
		return nil, err
	}
	p := &planner{c: c, base: base, storeAddr: storeAddr, gpus: gpus, x: x, n: c.NProcPerNode, groups: 1}
	p.perm = rankPerm(c)
	if c.EmulateMachines > 0 {
		p.groups = c.EmulateMachines
		if len(gpus) == 0 {
			return nil, fmt.Errorf("%w: no GPUs to spread emulated machines over", ErrUsage)
		}
	}
	p.per = p.n / p.groups
	p.shared = RanksShareGPUs(c, gpus)
	p.masterAddr, p.masterPort = host, port
	if x.MasterPort != "" {
		p.masterPort = x.MasterPort
	}
	if x.NetNS && len(x.MachineAddrs) == p.groups && c.NodeRank == 0 {
		// MASTER_ADDR is the machine of global rank 0.
		for slot := range p.n {
			if p.perm[slot] == 0 {
				p.masterAddr = x.MachineAddrs[slot/p.per]
			}
		}
	}
	p.hostname, _ = os.Hostname()
	if p.hostname == "" {
		p.hostname = "localhost"
	}
	return p, nil
}

// rankPerm is each slot's rank within the node: the slot itself, or a
// permutation seeded by --shuffle-ranks.
func rankPerm(c Config) []int {
	perm := make([]int, c.NProcPerNode)
	for i := range perm {
		perm[i] = i
	}
	if c.Shuffle {
		rng := rand.New(rand.NewPCG(c.ShuffleSeed, 0x6661697267))
		rng.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
	}
	return perm
}

// worker plans the worker of one slot: its rank, machine, GPU and whole
// environment.
func (p *planner) worker(slot int) Worker {
	c := p.c
	w := Worker{Slot: slot, Rank: c.NodeRank*p.n + p.perm[slot], Machine: c.NodeRank}
	env := newEnv(p.base)
	p.setTorchrun(env, w, slot)
	if c.EmulateMachines > 0 {
		p.emulate(env, &w, slot)
	}
	env.set("GROUP_RANK", strconv.Itoa(w.Machine))
	p.setTestbed(env)
	w.Env = env.list()
	return w
}

// setTorchrun sets torchrun's variables, the store's address and token,
// and NCCL's defaults for every worker.
func (p *planner) setTorchrun(env *env, w Worker, slot int) {
	env.set("RANK", strconv.Itoa(w.Rank))
	env.set("WORLD_SIZE", strconv.Itoa(p.c.NNodes*p.n))
	env.set("LOCAL_RANK", strconv.Itoa(slot%p.per))
	env.set("LOCAL_WORLD_SIZE", strconv.Itoa(p.per))
	env.set("MASTER_ADDR", p.masterAddr)
	env.set("MASTER_PORT", p.masterPort)
	env.set("FAIRGO_STORE_ADDR", p.storeAddr)
	if p.x.StoreToken != "" {
		env.set(EnvStoreToken, p.x.StoreToken)
	}
	env.setDefault("NCCL_NVLS_ENABLE", "0") // NVLink multicast stays off unless asked for
	// torchrun's restart variables, which trainers read to resume from a
	// checkpoint after a restart.
	env.set("TORCHELASTIC_RESTART_COUNT", strconv.Itoa(p.x.Restart))
	env.set("TORCHELASTIC_MAX_RESTARTS", strconv.Itoa(p.c.MaxRestarts))
	if p.c.RdzvID != "" {
		env.set("TORCHELASTIC_RUN_ID", p.c.RdzvID)
	}
}

// emulate puts the worker of slot on its emulated machine: the machine
// and GPU of w, the identities NCCL and fairgo know it by (see Plan), and
// the NIC NCCL's sockets use.
func (p *planner) emulate(env *env, w *Worker, slot int) {
	w.Machine = p.c.NodeRank*p.groups + slot/p.per
	w.GPU = p.gpus[slot%len(p.gpus)]
	id := fmt.Sprintf("%s-emu%d", p.hostname, w.Machine)
	intra := IntraNVLink
	if p.shared {
		local := slot % p.per
		env.set(EnvNCCLHostID, fmt.Sprintf("%s-d%d", id, local))
		env.set(EnvDeviceID, fmt.Sprintf("%s/r%d", w.GPU, local))
		intra = IntraLoopback
	} else {
		env.set(EnvNCCLHostID, id)
	}
	env.set(EnvMachineID, id)
	env.set("CUDA_VISIBLE_DEVICES", w.GPU)
	env.set(EnvTestbedIntra, intra)
	if p.x.NetNS {
		env.set("NCCL_SOCKET_IFNAME", netbed.NIC)
		env.setDefault("NCCL_IB_DISABLE", "1")
	} else {
		env.setDefault("NCCL_SOCKET_IFNAME", "lo")
	}
}

// setTestbed sets where the MPS daemon is, when there is one, and the
// variables that describe the testbed (EnvTestbed*).
func (p *planner) setTestbed(env *env) {
	c, x := p.c, p.x
	if x.MPS != nil {
		env.set("CUDA_MPS_PIPE_DIRECTORY", x.MPS.PipeDir)
		env.set("CUDA_MPS_LOG_DIRECTORY", x.MPS.LogDir)
	}
	env.set(EnvTestbedMachines, strconv.Itoa(c.NNodes*p.groups))
	env.set(EnvTestbedNICGbit, strconv.FormatFloat(c.NICGbit, 'g', -1, 64))
	env.set(EnvTestbedNICLatency, c.NICLatency.String())
	if c.NICGbit > 0 {
		env.set(EnvTestbedNICQueue, c.nicQueue().String())
		env.set(EnvTestbedNICRtoMin, c.NICRtoMin.String())
		env.set(EnvTestbedNICSlowStartAfterIdle, boolEnv(c.NICSlowStartAfterIdle))
	}
	env.set(EnvTestbedNetNS, boolEnv(x.NetNS))
	env.set(EnvTestbedMPS, boolEnv(x.MPS != nil))
	env.set(EnvTestbedNVLinkGbit, strconv.FormatFloat(c.NVLinkGbit, 'g', -1, 64))
}

func boolEnv(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func splitHostPort(addr string) (host, port string, err error) {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return "", "", fmt.Errorf("%w: store address %q is not host:port", ErrUsage, addr)
	}
	host, port = strings.Trim(addr[:i], "[]"), addr[i+1:]
	return host, port, nil
}

// env is an environment that keeps its order and replaces in place.
type env struct {
	keys []string
	vals map[string]string
}

func newEnv(base []string) *env {
	e := &env{vals: map[string]string{}}
	for _, kv := range base {
		k, v, _ := strings.Cut(kv, "=")
		e.set(k, v)
	}
	return e
}

func (e *env) set(k, v string) {
	if _, ok := e.vals[k]; !ok {
		e.keys = append(e.keys, k)
	}
	e.vals[k] = v
}

// setDefault sets k unless the user's environment already has it.
func (e *env) setDefault(k, v string) {
	if _, ok := e.vals[k]; !ok {
		e.set(k, v)
	}
}

func (e *env) get(k string) (string, bool) { v, ok := e.vals[k]; return v, ok }

func (e *env) list() []string {
	out := make([]string, len(e.keys))
	for i, k := range e.keys {
		out[i] = k + "=" + e.vals[k]
	}
	return out
}

// GPUList returns the devices emulated machines are spread over: the
// entries of CUDA_VISIBLE_DEVICES in base when set, else 0..n-1 with n the
// --gpus flag, else the count from `nvidia-smi -L`, else 1.
func GPUList(c Config, base []string, log *slog.Logger) []string {
	if v, ok := newEnv(base).get("CUDA_VISIBLE_DEVICES"); ok && strings.TrimSpace(v) != "" {
		var out []string
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out = append(out, e)
			}
		}
		if c.GPUs > 0 && c.GPUs < len(out) {
			out = out[:c.GPUs]
		}
		return out
	}
	n := c.GPUs
	if n == 0 {
		n = countGPUs(log)
	}
	out := make([]string, n)
	for i := range out {
		out[i] = strconv.Itoa(i)
	}
	return out
}

// countGPUs asks nvidia-smi; 1 when it is missing or fails.
func countGPUs(log *slog.Logger) int {
	n, err := smiGPUs()
	if err != nil && !errors.Is(err, exec.ErrNotFound) {
		log.Warn("fairrun: nvidia-smi -L failed; assuming one GPU", "err", err)
	}
	return max(n, 1)
}

// smiGPUs counts the GPUs `nvidia-smi -L` lists.
func smiGPUs() (int, error) {
	path, err := exec.LookPath("nvidia-smi")
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "-L").Output()
	if err != nil {
		return 0, fmt.Errorf("nvidia-smi -L: %w", err)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "GPU ") {
			n++
		}
	}
	return n, nil
}

// VisibleGPUs counts the GPUs a worker could see, for --nproc-per-node gpu
// and auto: with CUDA_VISIBLE_DEVICES set in base, its entries up to the
// first empty or negative one (where CUDA stops; "" hides every GPU), else
// the GPUs `nvidia-smi -L` lists (none when it is missing or fails). where
// says what was counted, for messages.
func VisibleGPUs(base []string, log *slog.Logger) (n int, where string) {
	if v, ok := newEnv(base).get("CUDA_VISIBLE_DEVICES"); ok {
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e == "" || strings.HasPrefix(e, "-") {
				break
			}
			n++
		}
		return n, fmt.Sprintf("CUDA_VISIBLE_DEVICES=%q", v)
	}
	n, err := smiGPUs()
	switch {
	case errors.Is(err, exec.ErrNotFound):
		return 0, "no nvidia-smi in PATH"
	case err != nil:
		log.Warn("fairrun: counting the GPUs failed", "err", err)
		return 0, err.Error()
	}
	return n, "nvidia-smi -L"
}
