package netbed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Testbed is a built testbed: a bridge in the root namespace, and per
// machine a network namespace whose NIC is a veth on that bridge. The
// namespaces have no names: they live as long as this Testbed holds them
// (or a process runs in them), so a fairrun that dies leaves none behind,
// and their veths vanish with them.
type Testbed struct {
	plan   Plan
	log    *slog.Logger
	root   *netlink.Handle // the root namespace
	bridge netlink.Link    // nil until created
	ns     []netns.NsHandle
	veths  []string // root ends created so far
}

// Setup builds the testbed of spec: it removes bridges left by crashed runs
// of fairrun, picks a free subnet and run id, and creates the bridge, the
// namespaces, the veths, the addresses and the qdiscs. On any error or when
// ctx ends, what it created is removed again. Call Prober.Check first for
// a clear error when privileges or kernel features are missing.
func Setup(ctx context.Context, spec Spec, log *slog.Logger) (_ *Testbed, err error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	root, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("testbed: netlink: %w", err)
	}
	t := &Testbed{log: log, root: root}
	defer func() {
		if err != nil {
			if cerr := t.Close(); cerr != nil {
				err = errors.Join(err, cerr)
			}
		}
	}()
	removeLeftovers(root, log)
	if err := t.createBridge(spec); err != nil {
		return nil, err
	}
	for i := range t.plan.Machines {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("testbed: setup interrupted: %w", context.Cause(ctx))
		}
		if err := t.createMachine(i); err != nil {
			return nil, err
		}
	}
	loRate := uint64(0)
	if t.plan.Loopback != nil {
		loRate = t.plan.Loopback.RateBytes
	}
	log.Info(
		"fairrun: testbed up",
		"machines", len(t.plan.Machines),
		"bridge", t.plan.Bridge,
		"subnet", t.plan.Subnet,
		"rate_bytes_per_s", t.plan.Shaping.RateBytes,
		"burst", t.plan.Shaping.BurstBytes,
		"limit", t.plan.Shaping.LimitBytes,
		"latency", t.plan.Shaping.Latency,
		"loopback_bytes_per_s", loRate,
	)
	return t, nil
}

// Plan returns what was built.
func (t *Testbed) Plan() Plan { return t.plan }

// createBridge picks the run id and the subnet, and brings the bridge up
// with the subnet's first address. Should another run have taken the same
// subnet at the same moment, the bridge with the higher index moves on.
func (t *Testbed) createBridge(spec Spec) error {
	for attempt := 0; ; attempt++ {
		if attempt == 8 {
			return errors.New("testbed: no free bridge name and subnet after 8 attempts")
		}
		inUse, err := addrsInUse(t.root)
		if err != nil {
			return err
		}
		subnet, err := PickSubnet(prefixes(inUse))
		if err != nil {
			return err
		}
		id, err := NewRunID(os.Getpid())
		if err != nil {
			return err
		}
		if t.plan, err = NewPlan(spec, id, subnet); err != nil {
			return err
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: t.plan.Bridge, MTU: t.plan.MTU}}
		if err := t.root.LinkAdd(br); err != nil {
			if errors.Is(err, unix.EEXIST) {
				continue
			}
			return linkErr("bridge", t.plan.Bridge, "the bridge device (CONFIG_BRIDGE, module bridge)", err)
		}
		if t.bridge, err = t.root.LinkByName(t.plan.Bridge); err != nil {
			return fmt.Errorf("testbed: bridge %s: %w", t.plan.Bridge, err)
		}
		// Bridged traffic between the machines must not go through the
		// host's iptables (a FORWARD policy of DROP, as Docker sets it,
		// would cut the machines off). Best effort: the knob exists only
		// with br_netfilter loaded.
		os.WriteFile("/sys/class/net/"+t.plan.Bridge+"/bridge/nf_call_iptables", []byte("0"), 0o644)
		if err := t.root.AddrAdd(t.bridge, &netlink.Addr{IPNet: ipNet(t.plan.BridgeAddr)}); err != nil {
			return fmt.Errorf("testbed: address %v on %s: %w", t.plan.BridgeAddr, t.plan.Bridge, err)
		}
		all, err := addrsInUse(t.root)
		if err != nil {
			return err
		}
		if yields(all, t.plan.Subnet, t.bridge.Attrs().Index) {
			t.log.Info("fairrun: subnet taken meanwhile; trying another", "subnet", t.plan.Subnet)
			t.root.LinkDel(t.bridge)
			t.bridge = nil
			continue
		}
		if err := t.root.LinkSetUp(t.bridge); err != nil {
			return fmt.Errorf("testbed: bring %s up: %w", t.plan.Bridge, err)
		}
		return nil
	}
}

// createMachine creates machine i's namespace and its veth, with addresses
// and qdiscs on both ends.
func (t *Testbed) createMachine(i int) error {
	m := t.plan.Machines[i]
	ns, err := newNetNS()
	if err != nil {
		return nsErr(err)
	}
	t.ns = append(t.ns, ns)
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{
			Name:        m.HostVeth,
			MasterIndex: t.bridge.Attrs().Index,
			MTU:         t.plan.MTU,
		}, // the peer gets the same MTU
		PeerName:      m.NIC,
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := t.root.LinkAdd(veth); err != nil {
		// A failure after the kernel made the pair (setting the master)
		// leaves it behind: remember its name in any case.
		if _, lerr := t.root.LinkByName(m.HostVeth); lerr == nil {
			t.veths = append(t.veths, m.HostVeth)
		}
		return linkErr("veth", m.HostVeth, "the veth device (CONFIG_VETH, module veth)", err)
	}
	t.veths = append(t.veths, m.HostVeth)
	host, err := t.root.LinkByName(m.HostVeth)
	if err != nil {
		return fmt.Errorf("testbed: %s: %w", m.HostVeth, err)
	}
	if err := t.shape(t.root, host, false); err != nil {
		return err
	}
	if err := t.root.LinkSetUp(host); err != nil {
		return fmt.Errorf("testbed: bring %s up: %w", m.HostVeth, err)
	}

	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("testbed: netlink in machine %d's namespace: %w", i, err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("testbed: machine %d: lo: %w", i, err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("testbed: machine %d: bring lo up: %w", i, err)
	}
	if t.plan.Loopback != nil {
		if err := addQdiscs(h, lo, *t.plan.Loopback, false, flagLoopback); err != nil {
			return fmt.Errorf("testbed: machine %d: %w", i, err)
		}
	}
	nic, err := h.LinkByName(m.NIC)
	if err != nil {
		return fmt.Errorf("testbed: machine %d: %s: %w", i, m.NIC, err)
	}
	if err := h.AddrAdd(nic, &netlink.Addr{IPNet: ipNet(m.Addr)}); err != nil {
		return fmt.Errorf("testbed: machine %d: address %v on %s: %w", i, m.Addr, m.NIC, err)
	}
	if err := t.shape(h, nic, true); err != nil {
		return err
	}
	if err := h.LinkSetUp(nic); err != nil {
		return fmt.Errorf("testbed: machine %d: bring %s up: %w", i, m.NIC, err)
	}
	if t.plan.RtoMin > 0 {
		if err := setRtoMin(h, t.plan.RtoMin); err != nil {
			return fmt.Errorf("testbed: machine %d: %w", i, err)
		}
	}
	if !t.plan.SlowStartAfterIdle {
		err := inNetNS(ns, func() error { return os.WriteFile(slowStartAfterIdle, []byte("0"), 0o644) })
		if err != nil {
			return fmt.Errorf("testbed: machine %d: turn TCP's slow start after idle off: %w", i, err)
		}
	}
	return nil
}

// slowStartAfterIdle is the sysctl of TCP's congestion-window restart
// after idle, per network namespace (that of the thread that opens it).
const slowStartAfterIdle = "/proc/sys/net/ipv4/tcp_slow_start_after_idle"

// setRtoMin sets the metric rto_min on every IPv4 unicast and local route
// of the namespace h works in (its subnet's through the NIC, its own
// addresses' through lo): TCP connections take their minimum
// retransmission timeout from their route.
func setRtoMin(h *netlink.Handle, d time.Duration) error {
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("routes: %w", err)
	}
	n := 0
	for _, rt := range routes {
		if rt.Dst == nil || (rt.Type != unix.RTN_UNICAST && rt.Type != unix.RTN_LOCAL) {
			continue
		}
		rt.RtoMin = int(d / time.Millisecond)
		if err := h.RouteReplace(&rt); err != nil {
			return fmt.Errorf("rto_min %v on the route to %v (table %d): %w", d, rt.Dst, rt.Table, err)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("rto_min %v: no route to set it on", d)
	}
	return nil
}

// Counters reads every machine's tbf counters: where a shaped link dropped
// packets, TCP retransmitted them, and a run's timings carry the cost.
func (t *Testbed) Counters() ([]MachineCounters, error) {
	var out []MachineCounters
	for i, m := range t.plan.Machines {
		mc := MachineCounters{Machine: i}
		var err error
		if mc.Receive, err = tbfCounters(t.root, m.HostVeth); err != nil {
			return nil, fmt.Errorf("testbed: machine %d: %w", i, err)
		}
		h, err := netlink.NewHandleAt(t.ns[i], unix.NETLINK_ROUTE)
		if err != nil {
			return nil, fmt.Errorf("testbed: netlink in machine %d's namespace: %w", i, err)
		}
		mc.Send, err = tbfCounters(h, m.NIC)
		if err == nil && t.plan.Loopback != nil {
			var lo QdiscCounters
			lo, err = tbfCounters(h, "lo")
			mc.Loopback = &lo
		}
		h.Close()
		if err != nil {
			return nil, fmt.Errorf("testbed: machine %d: %w", i, err)
		}
		out = append(out, mc)
	}
	return out, nil
}

// tbfCounters reads the counters of the tbf on the link named name.
func tbfCounters(h *netlink.Handle, name string) (QdiscCounters, error) {
	link, err := h.LinkByName(name)
	if err != nil {
		return QdiscCounters{}, fmt.Errorf("%s: %w", name, err)
	}
	qs, err := h.QdiscList(link)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return QdiscCounters{}, fmt.Errorf("qdiscs of %s: %w", name, err)
	}
	for _, q := range qs {
		tbf, ok := q.(*netlink.Tbf)
		if !ok || tbf.Statistics == nil || tbf.Statistics.Basic == nil || tbf.Statistics.Queue == nil {
			continue
		}
		st := tbf.Statistics
		return QdiscCounters{
			Link:       name,
			SentBytes:  st.Basic.Bytes,
			SentPkts:   st.Basic.Packets,
			Drops:      st.Queue.Drops,
			Overlimits: st.Queue.Overlimits,
		}, nil
	}
	return QdiscCounters{}, fmt.Errorf("%s has no tbf with counters", name)
}

// shape puts the tbf (and, on a machine's own end, the netem) on link.
func (t *Testbed) shape(h *netlink.Handle, link netlink.Link, machineEnd bool) error {
	return addQdiscs(h, link, t.plan.Shaping, machineEnd && t.plan.Shaping.Latency > 0, flagNIC)
}

// addQdiscs puts a tbf at the root of link, or a netem at the root and the
// tbf under it; flag is the command-line flag that asked for the tbf, for
// errors.
func addQdiscs(h *netlink.Handle, link netlink.Link, s Shaping, withNetem bool, flag string) error {
	idx := link.Attrs().Index
	tbfParent := uint32(netlink.HANDLE_ROOT)
	if withNetem {
		netem := netlink.NewNetem(
			netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
			netlink.NetemQdiscAttrs{Latency: uint32(s.Latency.Microseconds()), Limit: s.NetemLimit},
		)
		if err := h.QdiscAdd(netem); err != nil {
			return qdiscErr(flagLatency, "netem", link.Attrs().Name, featureNetem, err)
		}
		tbfParent = netlink.MakeHandle(1, 1)
	}
	tbf := &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(10, 0), Parent: tbfParent},
		Rate:       s.RateBytes,
		Buffer:     netlink.Xmittime(s.RateBytes, s.BurstBytes), // the bucket, in scheduler ticks
		Limit:      s.LimitBytes,
	}
	if err := h.QdiscAdd(tbf); err != nil {
		return qdiscErr(flag, "tbf", link.Attrs().Name, featureTbf, err)
	}
	return nil
}

// Run calls fn on an OS thread that is in machine i's network namespace,
// and returns fn's error. Processes that fn starts (exec.Cmd.Start) inherit
// the namespace; sockets it opens belong to it. Should the thread fail to
// return to the root namespace, it is discarded (and with it the
// parent-death signal of processes started on it fires).
func (t *Testbed) Run(i int, fn func() error) error {
	if i < 0 || i >= len(t.ns) {
		return fmt.Errorf("testbed: no machine %d (have %d)", i, len(t.ns))
	}
	return inNetNS(t.ns[i], fn)
}

func inNetNS(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("testbed: current namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("testbed: enter namespace: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// The goroutine ends locked: Go discards the thread.
			errc <- errors.Join(ferr, fmt.Errorf("testbed: return to the root namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// newNetNS creates a network namespace and returns a handle to it, without
// moving any thread into it for good.
func newNetNS() (netns.NsHandle, error) {
	type result struct {
		ns  netns.NsHandle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, err}
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, err}
			return
		}
		ns, gerr := netns.Get()
		if err := netns.Set(orig); err != nil {
			if gerr == nil {
				ns.Close()
			}
			ch <- result{-1, errors.Join(gerr, err)} // the thread stays locked and is discarded
			return
		}
		runtime.UnlockOSThread()
		ch <- result{ns, gerr}
	}()
	r := <-ch
	return r.ns, r.err
}

// Close removes everything Setup created: the veths (their namespace ends
// go with them), the bridge, and the namespaces (once no process runs in
// them). It is safe on a half-built testbed and returns every failure.
func (t *Testbed) Close() error {
	if t == nil || t.root == nil {
		return nil
	}
	var errs []error
	for _, name := range t.veths {
		if l, err := t.root.LinkByName(name); err == nil {
			if err := t.root.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("testbed: delete %s: %w", name, err))
			}
		}
	}
	t.veths = nil
	if t.bridge != nil {
		if err := t.root.LinkDel(t.bridge); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("testbed: delete %s: %w", t.plan.Bridge, err))
		}
		t.bridge = nil
	}
	for _, ns := range t.ns {
		ns.Close()
	}
	t.ns = nil
	t.root.Close()
	t.root = nil
	return errors.Join(errs...)
}

// removeLeftovers deletes the bridges of runs whose fairrun is gone (a
// crashed run's namespaces and veths vanished with it; its bridge stays).
func removeLeftovers(h *netlink.Handle, log *slog.Logger) {
	links, err := h.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return
	}
	for _, l := range links {
		pid, ok := OwnerPid(l.Attrs().Name)
		if !ok || l.Type() != "bridge" || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
			continue // its run may still be going
		}
		if err := h.LinkDel(l); err == nil {
			log.Info("fairrun: removed a bridge left by a crashed run", "bridge", l.Attrs().Name, "pid", pid)
		}
	}
}

// linkPrefix is an IPv4 prefix of the root namespace and the link that
// holds it.
type linkPrefix struct {
	prefix netip.Prefix
	link   int
}

// addrsInUse lists the IPv4 prefixes of the root namespace.
func addrsInUse(h *netlink.Handle) ([]linkPrefix, error) {
	addrs, err := h.AddrList(nil, netlink.FAMILY_V4)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("testbed: list addresses: %w", err)
	}
	var out []linkPrefix
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok {
			continue
		}
		bits, _ := a.Mask.Size()
		out = append(out, linkPrefix{netip.PrefixFrom(ip, bits).Masked(), a.LinkIndex})
	}
	return out, nil
}

func prefixes(lps []linkPrefix) []netip.Prefix {
	out := make([]netip.Prefix, len(lps))
	for i, lp := range lps {
		out[i] = lp.prefix
	}
	return out
}

// yields reports whether the bridge of index self must give up subnet: a
// link of lower index holds an address in it. Two runs that picked the same
// subnet at once both check after adding their own address, so exactly one
// of them (the later bridge) moves on.
func yields(all []linkPrefix, subnet netip.Prefix, self int) bool {
	for _, lp := range all {
		if lp.link != self && lp.link < self && lp.prefix.Overlaps(subnet) {
			return true
		}
	}
	return false
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
}
