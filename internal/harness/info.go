package harness

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fairgo/fairgo/rendezvous"
)

// Info describes a testbed: for a benchmark's header and records.
type Info struct {
	Backend     string   // "sim", "cuda" (every rank in one process), "cuda-mp" (one rank per process)
	Timing      string   // how Rank.Time measures, e.g. "CUDA events on the benchmark stream"
	SimTimings  bool     // timings are wall clock on the simulated cluster, not GPU timings
	NCCLVersion string   // "2.28.3", or "" without NCCL
	NCCLEnv     []string // the NCCL_* variables of the environment, sorted
	GPUs        []string // the devices this process drives, e.g. "cuda:0 (NVIDIA H200)"
	Machines    int      // M
	Devices     int      // D
	Processes   int      // processes taking part
	Host        string
	Emulation   Emulation // what the launcher says about emulated machines
	Placement   Placement // how ranks sit on GPUs
}

// World is M × D.
func (i Info) World() int { return i.Machines * i.Devices }

// FlatTopologyUnaware reports whether flat NCCL on this testbed does not
// know the machines: machines hold several ranks, but every rank is an NCCL
// host of its own (fairrun's machines whose ranks share GPUs), so NCCL runs
// a ring over all W ranks, which crosses each NIC 2(W−1)/W of the data
// where a hierarchy sends 2(M−1)/M. Without the job's NCCL hosts (sim, one
// process) it follows the launcher: an intra-machine link over the
// loopback means one NCCL host per rank.
func (i Info) FlatTopologyUnaware() bool {
	if i.Devices < 2 {
		return false
	}
	if i.Placement.NCCLHosts > 0 {
		return i.Placement.NCCLHosts >= i.World()
	}
	return i.Emulation.Intra == IntraLoopback
}

// Invalid is why timings on this testbed mean nothing, or "": ranks of
// different machines sharing a GPU without MPS time-slice it, which puts a
// ~12 ms floor under every collective that spins on the GPU.
func (i Info) Invalid() string {
	if i.Placement.SharedAcrossMachines && !i.Emulation.MPS {
		return fmt.Sprintf(
			"ranks of different machines share a GPU (%d ranks per GPU) without MPS: the GPU time-slices between them",
			i.Placement.RanksPerGPU,
		)
	}
	return ""
}

// The variables a launcher (fairrun --emulate-machines) sets to describe
// the emulated testbed.
const (
	EnvMachines   = "FAIRGO_TESTBED_MACHINES"    // machines M of the job, emulated or not
	EnvNICGbit    = "FAIRGO_TESTBED_NIC_GBIT"    // each machine's NIC, Gbit/s each way
	EnvNICLatency = "FAIRGO_TESTBED_NIC_LATENCY" // one-way delay added by each NIC
	EnvNICQueue   = "FAIRGO_TESTBED_NIC_QUEUE"   // each NIC's tbf queue, in time at its rate (a Go duration)
	EnvNICRtoMin  = "FAIRGO_TESTBED_NIC_RTO_MIN" // TCP's minimum retransmission timeout on the machines' routes; 0s: the kernel's
	// EnvNICSlowStartAfterIdle is 1 where the machines keep TCP's slow
	// start after idle, 0 where it is off
	EnvNICSlowStartAfterIdle = "FAIRGO_TESTBED_NIC_SLOW_START_AFTER_IDLE"
	EnvMPS                   = "FAIRGO_TESTBED_MPS"         // 1: ranks run under an MPS daemon
	EnvNetNS                 = "FAIRGO_TESTBED_NETNS"       // 1: each machine has a network namespace of its own
	EnvIntra                 = "FAIRGO_TESTBED_INTRA"       // the intra-machine link: IntraNVLink or IntraLoopback
	EnvNVLinkGbit            = "FAIRGO_TESTBED_NVLINK_GBIT" // the rate the emulated intra-machine link is shaped to, Gbit/s
)

// The intra-machine links a launcher reports in FAIRGO_TESTBED_INTRA.
const (
	// IntraNVLink: the ranks of a machine have GPUs of their own and talk
	// GPU to GPU (NVLink where the GPUs have it).
	IntraNVLink = "nvlink"
	// IntraLoopback: the ranks of a machine share GPUs and are NCCL hosts
	// of their own; their intra-machine traffic is NCCL's sockets over the
	// machine's loopback, standing in for NVLink.
	IntraLoopback = "loopback"
)

// Emulation is the testbed as the launcher describes it: the zero value
// means no launcher told.
type Emulation struct {
	// machines the launcher made (emulated when several share a host); 0: not told
	Machines int `json:"launcher_machines,omitempty"`
	// each machine's NIC rate, Gbit/s each way; 0: no shaped NIC
	NICGbit float64 `json:"nic_gbit,omitempty"`
	// one-way delay each NIC adds
	NICLatency time.Duration `json:"nic_latency_ns,omitempty"`
	// each NIC's tbf queue, in time at its rate; 0: not told
	NICQueue time.Duration `json:"nic_queue_ns,omitempty"`
	// TCP's minimum retransmission timeout on the machines' routes; 0: the kernel's (200 ms) or not told
	NICRtoMin time.Duration `json:"nic_rto_min_ns,omitempty"`
	// whether the machines keep TCP's slow start after idle; nil: not told
	NICSlowStartAfterIdle *bool `json:"nic_slow_start_after_idle,omitempty"`
	// ranks sharing a GPU run under MPS
	MPS bool `json:"mps"`
	// each machine in a network namespace of its own
	NetNS bool `json:"netns"`
	// the intra-machine link, IntraNVLink or IntraLoopback; "": not told
	Intra string `json:"intra,omitempty"`
	// the rate the loopback standing in for NVLink is shaped to, Gbit/s; 0: not shaped
	NVLinkGbit float64 `json:"nvlink_gbit,omitempty"`
}

// IntraLink describes the intra-machine link, "" when not told: "emulated
// (loopback TCP, shaped to 20 Gbit/s)", or "GPU to GPU (NVLink where the
// GPUs have it)".
func (e Emulation) IntraLink() string {
	switch e.Intra {
	case "":
		return ""
	case IntraLoopback:
		if e.NVLinkGbit > 0 {
			return fmt.Sprintf("emulated (loopback TCP, shaped to %g Gbit/s)", e.NVLinkGbit)
		}
		return "emulated (loopback TCP, not shaped)"
	case IntraNVLink:
		return "GPU to GPU (NVLink where the GPUs have it)"
	}
	return e.Intra
}

// NICBytesPerSecond is the NIC rate in bytes per second, 0 when unknown.
func (e Emulation) NICBytesPerSecond() float64 { return e.NICGbit * 1e9 / 8 }

// Emulated reports whether the launcher split one host into machines.
func (e Emulation) Emulated() bool { return e.Machines > 1 || e.NICGbit > 0 || e.NetNS }

func (e Emulation) String() string {
	if !e.Emulated() && !e.MPS {
		return "not emulated"
	}
	var parts []string
	if e.Machines > 0 {
		parts = append(parts, fmt.Sprintf("%d emulated machine(s)", e.Machines))
	}
	if e.NICGbit > 0 {
		nic := fmt.Sprintf("one NIC per machine at %g Gbit/s", e.NICGbit)
		if e.NICLatency > 0 {
			nic += fmt.Sprintf(" + %v one-way latency", e.NICLatency)
		}
		if e.NICQueue > 0 {
			nic += fmt.Sprintf(", a %v queue", e.NICQueue)
		}
		if e.NICRtoMin > 0 {
			nic += fmt.Sprintf(", TCP rto_min %v", e.NICRtoMin)
		}
		if e.NICSlowStartAfterIdle != nil {
			nic += ", TCP slow start after idle " + onOff(*e.NICSlowStartAfterIdle)
		}
		parts = append(parts, nic)
	} else {
		parts = append(parts, "no shaped NIC")
	}
	parts = append(parts, "network namespaces "+onOff(e.NetNS), "MPS "+onOff(e.MPS))
	return strings.Join(parts, ", ")
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// EmulationFromEnv reads the FAIRGO_TESTBED_* variables through lookup
// (os.LookupEnv). NIC_LATENCY is a Go duration ("50us"); a bare number is
// read as microseconds. A malformed value is an error naming the variable.
func EmulationFromEnv(lookup rendezvous.LookupFunc) (Emulation, error) {
	var e Emulation
	get := func(name string) (string, bool) {
		v, ok := lookup(name)
		v = strings.TrimSpace(v)
		return v, ok && v != ""
	}
	bad := func(name, v, why string) (Emulation, error) {
		return Emulation{}, fmt.Errorf("testbed: %s=%q: %s", name, v, why)
	}
	if v, ok := get(EnvMachines); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return bad(EnvMachines, v, "not a machine count")
		}
		e.Machines = n
	}
	if v, ok := get(EnvNICGbit); ok {
		g, err := strconv.ParseFloat(v, 64)
		if err != nil || g < 0 {
			return bad(EnvNICGbit, v, "not a rate in Gbit/s")
		}
		e.NICGbit = g
	}
	if v, ok := get(EnvNICLatency); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			us, ferr := strconv.ParseFloat(v, 64)
			if ferr != nil {
				return bad(EnvNICLatency, v, "neither a duration (50us) nor microseconds")
			}
			d = time.Duration(us * float64(time.Microsecond))
		}
		if d < 0 {
			return bad(EnvNICLatency, v, "negative")
		}
		e.NICLatency = d
	}
	for _, f := range []struct {
		name string
		dst  *time.Duration
	}{{EnvNICQueue, &e.NICQueue}, {EnvNICRtoMin, &e.NICRtoMin}} {
		if v, ok := get(f.name); ok {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return bad(f.name, v, "not a duration (4ms)")
			}
			*f.dst = d
		}
	}
	if v, ok := get(EnvNICSlowStartAfterIdle); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return bad(EnvNICSlowStartAfterIdle, v, "not 1 or 0")
		}
		e.NICSlowStartAfterIdle = &b
	}
	if v, ok := get(EnvIntra); ok {
		if v != IntraNVLink && v != IntraLoopback {
			return bad(EnvIntra, v, fmt.Sprintf("not %s or %s", IntraNVLink, IntraLoopback))
		}
		e.Intra = v
	}
	if v, ok := get(EnvNVLinkGbit); ok {
		g, err := strconv.ParseFloat(v, 64)
		if err != nil || g < 0 || math.IsNaN(g) || math.IsInf(g, 0) {
			return bad(EnvNVLinkGbit, v, "not a rate in Gbit/s")
		}
		e.NVLinkGbit = g
	}
	for _, f := range []struct {
		name string
		dst  *bool
	}{{EnvMPS, &e.MPS}, {EnvNetNS, &e.NetNS}} {
		if v, ok := get(f.name); ok {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return bad(f.name, v, "not 1 or 0")
			}
			*f.dst = b
		}
	}
	return e, nil
}

// Placement is how the job's ranks sit on GPUs and NCCL hosts.
type Placement struct {
	RanksPerGPU          int  `json:"ranks_per_gpu"`                    // the most ranks on one GPU (1: a GPU each)
	SharedAcrossMachines bool `json:"shared_across_machines,omitempty"` // ranks of different machines share a GPU
	NCCLHosts            int  `json:"nccl_hosts,omitempty"`             // distinct NCCL hosts among the ranks; 0: unknown
}

// Seat is where one rank runs: its machine index, an identity of its GPU
// that is equal for two ranks exactly when they share the GPU, and its
// NCCL host (NCCL_HOSTID, else the hostname; "": unknown).
type Seat struct {
	Machine  int
	GPU      string
	NCCLHost string `json:",omitempty"`
}

// PlacementOf summarises the seats of every rank of a job. NCCLHosts is
// counted when every seat names its NCCL host.
func PlacementOf(seats []Seat) Placement {
	machines := map[string][]int{}
	for _, s := range seats {
		if !slices.Contains(machines[s.GPU], s.Machine) {
			machines[s.GPU] = append(machines[s.GPU], s.Machine)
		}
	}
	count := map[string]int{}
	hosts := map[string]bool{}
	var p Placement
	for _, s := range seats {
		count[s.GPU]++
		p.RanksPerGPU = max(p.RanksPerGPU, count[s.GPU])
		if len(machines[s.GPU]) > 1 {
			p.SharedAcrossMachines = true
		}
		hosts[s.NCCLHost] = true
	}
	if !hosts[""] {
		p.NCCLHosts = len(hosts)
	}
	return p
}

func (p Placement) String() string {
	s := fmt.Sprintf("%d rank(s) per GPU", p.RanksPerGPU)
	if p.SharedAcrossMachines {
		s += ", ranks of different machines share GPUs"
	}
	if p.NCCLHosts > 0 {
		s += fmt.Sprintf(", %d NCCL host(s)", p.NCCLHosts)
	}
	return s
}

// ncclHost is this process's NCCL host as NCCL knows it: NCCL_HOSTID when
// set, else the hostname.
func ncclHost() string {
	if id := strings.TrimSpace(os.Getenv("NCCL_HOSTID")); id != "" {
		return id
	}
	return hostname()
}

// UnderLauncher reports whether this process is one worker of a job of
// several processes (WORLD_SIZE > 1 from fairrun, torchrun, Slurm or Open
// MPI). A job of one process is driven by the single-process openers.
func UnderLauncher() bool {
	for _, v := range []string{"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "FAIRGO_STORE_ADDR"} {
		if s := os.Getenv(v); s != "" && s != "1" {
			return true // a launcher's variable: reading the rest may still fail, and says why
		}
	}
	l, err := rendezvous.FromEnv()
	return err == nil && l.WorldSize > 1
}

// NCCLEnv returns the NCCL_* variables of the environment, sorted.
func NCCLEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "NCCL_") {
			out = append(out, kv)
		}
	}
	slices.Sort(out)
	return out
}

// hostname is the host's name, or "" when unknown.
func hostname() string {
	h, _ := os.Hostname()
	return h
}
