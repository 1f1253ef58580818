// Package netbed builds fairrun's emulated cluster: one network namespace
// per emulated machine, each with one NIC (a veth on a shared bridge) shaped
// to a fixed rate in both directions and, when asked, its loopback shaped
// too (the intra-machine link of ranks that talk over sockets inside their
// machine). The plan (names, addresses, qdisc parameters) is computed
// without touching the system; Setup builds it through netlink, needing
// neither ip nor tc, and Close removes it.
package netbed

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Spec is the testbed the command line asks for.
type Spec struct {
	Machines int           // emulated machines, each with a namespace and a NIC
	Gbit     float64       // NIC rate in Gbit/s (10^9 bit/s), each direction
	Latency  time.Duration // one-way delay added to every packet a machine sends; 0: none
	// LoopbackGbit shapes lo in every machine's namespace with a tbf at
	// this rate (Gbit/s); 0: lo is not shaped. Traffic between sockets of
	// one namespace, including to the machine's own NIC address, goes
	// through lo, whose one queue then bounds the sum of all of it.
	LoopbackGbit float64
	// Queue is how long the tbf queues of the NIC and of a shaped loopback
	// are at their rates (the packets that may wait for tokens); 0:
	// DefaultQueue.
	Queue time.Duration
	// RtoMin is TCP's minimum retransmission timeout on every route of a
	// machine (the metric rto_min, in whole milliseconds); 0: the
	// kernel's, 200 ms. A packet the tbf drops costs TCP a retransmission;
	// when it was the last of a burst, only the retransmission timer finds
	// it, and 200 ms is longer than a whole collective of the sizes the
	// testbed measures, a stall that an RDMA fabric (lossless) never has.
	RtoMin time.Duration
	// SlowStartAfterIdle keeps the kernel's TCP congestion-window restart
	// after an idle period (net.ipv4.tcp_slow_start_after_idle) in the
	// machines' namespaces; false turns it off there. A collective's
	// connections idle between calls and between the stages of a pipeline
	// longer than a retransmission timeout, and each restart begins the
	// next transfer with 10 segments in flight, growing over round trips:
	// a cost an RDMA fabric, without a congestion window, does not have.
	SlowStartAfterIdle bool
}

// Limits of a Spec.
const (
	MaxMachines = 253 // one /24: .1 is the bridge, machines are .2 ... .254
	MaxGbit     = 1000
	MaxLatency  = time.Second
	MaxQueue    = time.Second
	MaxRtoMin   = time.Second
)

// Validate checks the spec.
func (s Spec) Validate() error {
	switch {
	case s.Machines < 1 || s.Machines > MaxMachines:
		return fmt.Errorf("testbed: %d machines: must be in [1, %d]", s.Machines, MaxMachines)
	case math.IsNaN(s.Gbit) || s.Gbit <= 0 || s.Gbit > MaxGbit:
		return fmt.Errorf("testbed: NIC rate %v Gbit/s: must be in (0, %d]", s.Gbit, MaxGbit)
	case s.Latency < 0 || s.Latency > MaxLatency:
		return fmt.Errorf("testbed: NIC latency %v: must be in [0, %v]", s.Latency, MaxLatency)
	case math.IsNaN(s.LoopbackGbit) || s.LoopbackGbit < 0 || s.LoopbackGbit > MaxGbit:
		return fmt.Errorf(
			"testbed: loopback rate %v Gbit/s: must be in (0, %d], or 0 for an unshaped loopback",
			s.LoopbackGbit,
			MaxGbit,
		)
	case s.Queue < 0 || s.Queue > MaxQueue:
		return fmt.Errorf("testbed: NIC queue %v: must be in [0, %v]", s.Queue, MaxQueue)
	case s.RtoMin < 0 || s.RtoMin > MaxRtoMin || s.RtoMin%time.Millisecond != 0:
		return fmt.Errorf("testbed: rto_min %v: must be whole milliseconds in [0, %v]", s.RtoMin, MaxRtoMin)
	}
	return nil
}

// Naming. Interface names have at most 15 bytes (IFNAMSIZ - 1).
const (
	NIC          = "eth0" // the NIC's name inside every machine's namespace
	bridgePrefix = "frb"  // bridge: frb + run id
	vethPrefix   = "frv"  // root end of machine i's veth: frv + run id + "m" + i
	runIDLen     = 8      // 6 hex digits of fairrun's pid, 2 random
	subnetBase   = "10.77.0.0/16"
)

// MTU of every NIC and of the bridge: jumbo frames, as GPU clusters'
// Ethernet fabrics use them. At 1500 bytes the bridge forwards six times
// as many packets, and on a small host the CPU, not the tbf, then sets the
// rate (measured on 2 cores, TCP through a 10 Gbit/s tbf: 7.2–9.5 Gbit/s at
// MTU 1500, 9.7–9.9 at 9000).
const MTU = 9000

// Plan is everything Setup creates.
type Plan struct {
	MTU        int          // of the NICs and the bridge
	RunID      string       // per-run suffix of every name
	Bridge     string       // the bridge in the root namespace
	Subnet     netip.Prefix // a free /24 inside 10.77.0.0/16
	BridgeAddr netip.Prefix // .1 of Subnet: the store listens here
	Machines   []Machine
	Shaping    Shaping
	// Loopback is the tbf of lo in every machine's namespace; nil: lo is
	// not shaped.
	Loopback *Shaping
	// RtoMin is the rto_min of every route in every machine's namespace; 0:
	// the kernel's.
	RtoMin time.Duration
	// SlowStartAfterIdle is net.ipv4.tcp_slow_start_after_idle in every
	// machine's namespace.
	SlowStartAfterIdle bool
}

// Machine is one emulated machine's namespace and NIC.
type Machine struct {
	Index    int
	HostVeth string       // the veth end on the bridge, in the root namespace
	NIC      string       // the veth end in the machine's namespace
	Addr     netip.Prefix // the NIC's address: .(Index+2) of Subnet
}

// QdiscCounters is what one tbf did while the testbed ran.
type QdiscCounters struct {
	Link       string // the link's name (a machine's NIC, its bridge end, or lo)
	SentBytes  uint64
	SentPkts   uint32
	Drops      uint32 // packets the full queue refused
	Overlimits uint32 // times a packet had to wait for tokens
}

// MachineCounters is one machine's tbfs: what it sent (its NIC's own end),
// what it received (the bridge end) and, when shaped, its loopback.
type MachineCounters struct {
	Machine  int
	Send     QdiscCounters
	Receive  QdiscCounters
	Loopback *QdiscCounters
}

// Shaping is the qdisc configuration of every veth end.
//
// A tbf on both ends of each veth shapes both directions of a machine's
// NIC: the namespace end shapes what the machine sends, the bridge end what
// it receives (several senders converging on one machine queue there, as on
// a real switch port).
//
// Burst (the bucket) is max(256 KiB, 200 µs at the rate): 1 Gbit/s → 256
// KiB, 10 → 256 KiB, 40 → 1 MB, 100 → 2.5 MB. It must hold a whole GSO
// super-packet (up to 64 KiB, more with BIG TCP) or tbf splits each one
// into MTU segments at a CPU cost that makes high rates erratic, and it
// must cover the latency of the qdisc watchdog timer (tens of µs; a late
// timer loses the tokens that overflow the bucket, so a bucket of a few µs
// of traffic falls short of the rate). It must stay small against the
// messages being timed: the first Burst bytes after an idle period leave at
// veth speed, which at 10 Gbit/s saves 0.2 ms on a transfer (6% of a 4 MiB
// one); a bucket of 1 ms would make small collectives look 30% faster
// than a real NIC allows.
//
// Limit (bytes that may wait for tokens) is Burst plus the queue time at
// the rate (DefaultQueue: 16 ms), at most 64 MiB. A real NIC does not drop
// what its own host sends: the socket waits instead. A tbf that is too
// short does drop it, and TCP takes such a local drop for congestion and
// halves its window. With 4 ms, the 2 × 4 testbed at 2.5 Gbit/s dropped
// 1,300–7,600 packets per run on the sending side, where several rails'
// flows share one NIC, and none on the receiving side. With 16 ms it
// dropped none, and the collectives were as fast or faster
// (bench/NOTES.md item 35). The queue stays short enough that the
// queueing delay of a saturated NIC is tens of ms at most.
//
// With a latency, a netem qdisc is the root of the namespace end (packets
// the machine sends wait Latency) and the tbf its child.
type Shaping struct {
	RateBytes  uint64        // bytes per second
	BurstBytes uint32        // tbf bucket
	LimitBytes uint32        // tbf queue
	Latency    time.Duration // netem delay on the namespace end; 0: no netem
	NetemLimit uint32        // netem queue in packets
}

// Shaping parameters (see Shaping).
const (
	minBurst     = 256 << 10
	burstTime    = 200 * time.Microsecond
	maxLimit     = 64 << 20
	minNetemPkts = 1000
)

// DefaultQueue is the tbf queue of a NIC, in time at its rate, when the
// Spec names none (see Shaping).
const DefaultQueue = 16 * time.Millisecond

// ShapingFor returns the qdisc parameters of a NIC of gbit Gbit/s with a
// one-way latency and a queue of queue at the rate (0: DefaultQueue).
func ShapingFor(gbit float64, latency, queue time.Duration) Shaping {
	if queue == 0 {
		queue = DefaultQueue
	}
	rate := gbit * 1e9 / 8 // bytes per second
	at := func(d time.Duration) float64 { return rate * d.Seconds() }
	burst := math.Max(minBurst, at(burstTime))
	limit := math.Min(burst+at(queue), maxLimit)
	s := Shaping{RateBytes: uint64(math.Round(rate)), BurstBytes: uint32(burst), LimitBytes: uint32(limit)}
	if latency > 0 {
		// Every packet in flight through the delay sits in netem: room for
		// twice the rate × delay in 1500-byte packets, and netem's default.
		pkts := math.Ceil(2 * at(latency) / 1500)
		s.Latency = latency
		s.NetemLimit = uint32(math.Min(math.Max(pkts, minNetemPkts), 1<<24))
	}
	return s
}

// NewPlan lays out the testbed of spec with the given run id on subnet (a
// /24).
func NewPlan(spec Spec, runID string, subnet netip.Prefix) (Plan, error) {
	if err := spec.Validate(); err != nil {
		return Plan{}, err
	}
	if len(runID) != runIDLen || strings.Trim(runID, "0123456789abcdef") != "" {
		return Plan{}, fmt.Errorf("testbed: run id %q: want %d lower-case hex digits", runID, runIDLen)
	}
	if !subnet.Addr().Is4() || subnet.Bits() != 24 || subnet.Masked() != subnet {
		return Plan{}, fmt.Errorf("testbed: subnet %v: want an IPv4 /24", subnet)
	}
	p := Plan{
		MTU:        MTU,
		RunID:      runID,
		Bridge:     bridgePrefix + runID,
		Subnet:     subnet,
		BridgeAddr: netip.PrefixFrom(nthAddr(subnet, 1), 24),
		Shaping:    ShapingFor(spec.Gbit, spec.Latency, spec.Queue),
		RtoMin:     spec.RtoMin,
		// The kernel's default is on.
		SlowStartAfterIdle: spec.SlowStartAfterIdle,
	}
	if spec.LoopbackGbit > 0 {
		lo := ShapingFor(spec.LoopbackGbit, 0, spec.Queue)
		p.Loopback = &lo
	}
	for i := range spec.Machines {
		p.Machines = append(p.Machines, Machine{
			Index:    i,
			HostVeth: vethPrefix + runID + "m" + strconv.Itoa(i),
			NIC:      NIC,
			Addr:     netip.PrefixFrom(nthAddr(subnet, i+2), 24),
		})
	}
	return p, nil
}

func nthAddr(subnet netip.Prefix, n int) netip.Addr {
	a := subnet.Addr().As4()
	a[3] = byte(n)
	return netip.AddrFrom4(a)
}

// PickSubnet returns the first /24 of 10.77.0.0/16 that overlaps none of
// the prefixes in use (the addresses of the root namespace).
func PickSubnet(inUse []netip.Prefix) (netip.Prefix, error) {
	base := netip.MustParsePrefix(subnetBase).Addr().As4()
	for i := range 256 {
		a := base
		a[2] = byte(i)
		cand := netip.PrefixFrom(netip.AddrFrom4(a), 24)
		free := true
		for _, u := range inUse {
			if u.Overlaps(cand) {
				free = false
				break
			}
		}
		if free {
			return cand, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("testbed: every /24 of %s is in use", subnetBase)
}

// NewRunID returns a run id: fairrun's pid in 6 hex digits, so that a later
// run can tell a crashed run's leftovers from a live run's, and 2 random
// ones, so that runs of one process differ.
func NewRunID(pid int) (string, error) {
	var b [1]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("testbed: run id: %w", err)
	}
	return fmt.Sprintf("%06x", pid&0xffffff) + hex.EncodeToString(b[:]), nil
}

// OwnerPid returns the pid encoded in the name of a bridge that a run
// created, and whether name is such a bridge.
func OwnerPid(name string) (int, bool) {
	id, ok := strings.CutPrefix(name, bridgePrefix)
	if !ok || len(id) != runIDLen || strings.Trim(id, "0123456789abcdef") != "" {
		return 0, false
	}
	pid, err := strconv.ParseInt(id[:6], 16, 32)
	return int(pid), err == nil
}
