package netbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// With envRole=dropcaps the test binary drops every capability of its
// checking thread, runs the real probe and prints its verdict.
const envRole = "TESTBED_TEST_ROLE"

func TestMain(m *testing.M) {
	if os.Getenv(envRole) == "dropcaps" {
		runtime.LockOSThread()
		var data [2]unix.CapUserData // all zero: no capabilities
		if err := unix.Capset(&unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}, &data[0]); err != nil {
			fmt.Println("capset:", err)
			os.Exit(2)
		}
		fmt.Println("verdict:", Prober{}.Check(Spec{Machines: 2, Gbit: 10}))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The real probe, in a process without capabilities (root or not),
// refuses and names the capability.
func TestProbeWithoutCapabilities(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), envRole+"=dropcaps")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "verdict: fairrun: --nic-gbit needs CAP_NET_ADMIN (run as root)")
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// needNetAdmin skips a test that builds a real testbed where that is not
// possible.
func needNetAdmin(t *testing.T, spec Spec) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) to create network namespaces, veths and qdiscs")
	}
	if err := (Prober{}).Check(spec); err != nil {
		t.Skipf("this host cannot build the testbed: %v", err)
	}
}

// leftovers lists the links of the root namespace whose names carry runID,
// and the qdiscs on the links of the given indexes. Other tests may build
// testbeds meanwhile.
func leftovers(t *testing.T, runID string, indexes []int) []string {
	t.Helper()
	var out []string
	links, err := dump(netlink.LinkList)
	require.NoError(t, err)
	for _, l := range links {
		if strings.Contains(l.Attrs().Name, runID) {
			out = append(out, "link "+l.Attrs().Name)
		}
	}
	qs, err := dump(func() ([]netlink.Qdisc, error) { return netlink.QdiscList(nil) })
	require.NoError(t, err)
	for _, q := range qs {
		if slices.Contains(indexes, q.Attrs().LinkIndex) {
			out = append(out, fmt.Sprintf("qdisc on %d: %s", q.Attrs().LinkIndex, q.Type()))
		}
	}
	return out
}

// nsInode returns the inode of the network namespace of the calling thread.
func nsInode() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// Setup builds what the plan says, machines reach each other and the
// bridge, and Close leaves nothing behind.
func TestSetupAndClose(t *testing.T) {
	spec := Spec{Machines: 3, Gbit: 10, Latency: 100 * time.Microsecond, Queue: 8 * time.Millisecond,
		RtoMin: 5 * time.Millisecond}
	if err := (Prober{}).Check(spec); err != nil && strings.Contains(err.Error(), "netem") {
		t.Logf("no netem here (%v): testing without latency", err)
		spec.Latency = 0
	}
	needNetAdmin(t, spec)
	rootSSAIBytes, err := os.ReadFile(slowStartAfterIdle)
	require.NoError(t, err)
	rootSSAI := strings.TrimSpace(string(rootSSAIBytes))
	tb, err := Setup(context.Background(), spec, quiet)
	require.NoError(t, err)
	closed := false
	t.Cleanup(func() {
		if !closed {
			tb.Close()
		}
	})
	p := tb.Plan()

	br, err := netlink.LinkByName(p.Bridge)
	require.NoError(t, err)
	require.Equal(t, "bridge", br.Type())
	indexes := []int{br.Attrs().Index}
	addrs, err := netlink.AddrList(br, netlink.FAMILY_V4)
	require.NoError(t, err)
	require.Len(t, addrs, 1)
	require.Equal(t, p.BridgeAddr.String(), addrs[0].IPNet.String())

	// A listener on the bridge address in the root namespace.
	storeLn, err := net.Listen("tcp", net.JoinHostPort(p.BridgeAddr.Addr().String(), "0"))
	require.NoError(t, err)
	defer storeLn.Close()
	go func() {
		for {
			c, err := storeLn.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("root\n"))
			c.Close()
		}
	}()

	rootIno, err := nsInode()
	require.NoError(t, err)
	inodes := map[uint64]bool{rootIno: true}
	listeners := make([]net.Listener, len(p.Machines))
	for i, m := range p.Machines {
		host, err := netlink.LinkByName(m.HostVeth)
		require.NoError(t, err)
		indexes = append(indexes, host.Attrs().Index)
		require.Equal(t, br.Attrs().Index, host.Attrs().MasterIndex, "%s is on the bridge", m.HostVeth)
		qs, err := dump(func() ([]netlink.Qdisc, error) { return netlink.QdiscList(host) })
		require.NoError(t, err)
		require.Len(t, qs, 1)
		tbf, ok := qs[0].(*netlink.Tbf)
		require.True(t, ok, "%s: %v", m.HostVeth, qs[0])
		require.Equal(t, p.Shaping.RateBytes, tbf.Rate)
		require.Equal(t, p.Shaping.LimitBytes, tbf.Limit)

		require.NoError(t, tb.Run(i, func() error {
			ino, err := nsInode()
			if err != nil {
				return err
			}
			if inodes[ino] {
				return fmt.Errorf("machine %d shares namespace %d", i, ino)
			}
			inodes[ino] = true
			nic, err := netlink.LinkByName(NIC)
			if err != nil {
				return err
			}
			a, err := netlink.AddrList(nic, netlink.FAMILY_V4)
			if err != nil {
				return err
			}
			if len(a) != 1 || a[0].IPNet.String() != m.Addr.String() {
				return fmt.Errorf("machine %d: %s has %v, want %v", i, NIC, a, m.Addr)
			}
			links, err := dump(netlink.LinkList)
			if err != nil {
				return err
			}
			if len(links) != 2 {
				return fmt.Errorf("machine %d sees %d links, want lo and %s", i, len(links), NIC)
			}
			qs, err := dump(func() ([]netlink.Qdisc, error) { return netlink.QdiscList(nic) })
			if err != nil {
				return err
			}
			kinds := []string{}
			for _, q := range qs {
				kinds = append(kinds, q.Type())
			}
			slices.Sort(kinds)
			want := "tbf"
			if spec.Latency > 0 {
				want = "netem,tbf"
			}
			if strings.Join(kinds, ",") != want {
				return fmt.Errorf("machine %d: qdiscs %v, want %s", i, kinds, want)
			}
			if tbf, err := loopbackTbf(); err != nil || tbf != nil {
				return fmt.Errorf("machine %d: lo shaped without --nvlink-gbit (%v, %v)", i, tbf, err)
			}
			if err := checkRtoMin(m, spec.RtoMin); err != nil {
				return fmt.Errorf("machine %d: %w", i, err)
			}
			if b, err := os.ReadFile(slowStartAfterIdle); err != nil || strings.TrimSpace(string(b)) != "0" {
				return fmt.Errorf("machine %d: tcp_slow_start_after_idle %q (%v), want 0", i, b, err)
			}
			listeners[i], err = net.Listen("tcp", net.JoinHostPort(m.Addr.Addr().String(), "0"))
			return err
		}))
		defer listeners[i].Close()
		go func(ln net.Listener) {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprintf(c, "machine %d\n", i)
				c.Close()
			}
		}(listeners[i])
	}
	_, err = nsInode()
	require.NoError(t, err)
	b, err := os.ReadFile(slowStartAfterIdle)
	require.NoError(t, err)
	require.Equal(t, rootSSAI, strings.TrimSpace(string(b)), "the root namespace's setting stays")
	ino, _ := nsInode()
	require.Equal(t, rootIno, ino, "Run returns the thread to the root namespace")

	read := func(from int, addr string) string {
		var got string
		require.NoError(t, tb.Run(from, func() error {
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			b, err := io.ReadAll(c)
			got = string(b)
			return err
		}))
		return got
	}
	for i := range p.Machines {
		j := (i + 1) % len(p.Machines)
		require.Equal(
			t,
			fmt.Sprintf("machine %d\n", j),
			read(i, listeners[j].Addr().String()),
			"machine %d reaches machine %d",
			i,
			j,
		)
		require.Equal(t, "root\n", read(i, storeLn.Addr().String()), "machine %d reaches the bridge", i)
	}
	// The machines cannot see the root namespace's loopback.
	require.Error(t, tb.Run(0, func() error {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+fmt.Sprint(storeLn.Addr().(*net.TCPAddr).Port), time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}))

	// Every machine sent and received through its tbfs, and nothing was
	// dropped.
	counters, err := tb.Counters()
	require.NoError(t, err)
	require.Len(t, counters, len(p.Machines))
	for i, c := range counters {
		require.Equal(t, i, c.Machine)
		require.Equal(t, NIC, c.Send.Link)
		require.Equal(t, p.Machines[i].HostVeth, c.Receive.Link)
		require.Positive(t, c.Send.SentPkts, "machine %d sent", i)
		require.Positive(t, c.Receive.SentPkts, "machine %d received", i)
		require.Greater(t, c.Send.SentBytes, uint64(c.Send.SentPkts))
		require.Zero(t, c.Send.Drops+c.Receive.Drops, "machine %d", i)
		require.Nil(t, c.Loopback, "lo is not shaped")
	}

	for _, ln := range listeners {
		ln.Close()
	}
	require.NoError(t, tb.Close())
	closed = true
	require.Empty(t, leftovers(t, p.RunID, indexes), "Close removes every link and qdisc")
}

// checkRtoMin checks, in machine m's namespace, that the routes to its
// subnet and to its own address carry rto_min d (in ms; 0: none set).
func checkRtoMin(m Machine, d time.Duration) error {
	routes, err := dump(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return err
	}
	want := map[string]bool{m.Addr.Masked().String(): false, netip.PrefixFrom(m.Addr.Addr(), 32).String(): false}
	for _, rt := range routes {
		if rt.Dst == nil {
			continue
		}
		dst := rt.Dst.String()
		if _, ok := want[dst]; !ok {
			continue
		}
		if rt.RtoMin != int(d/time.Millisecond) {
			return fmt.Errorf("route to %s (table %d): rto_min %d ms, want %v", dst, rt.Table, rt.RtoMin, d)
		}
		want[dst] = true
	}
	for dst, seen := range want {
		if !seen {
			return fmt.Errorf("no route to %s among %v", dst, routes)
		}
	}
	return nil
}

// A setup interrupted half-way removes what it had created.
func TestSetupInterrupted(t *testing.T) {
	spec := Spec{Machines: 2, Gbit: 1}
	needNetAdmin(t, spec)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tb, err := Setup(ctx, spec, quiet)
	require.ErrorIs(t, err, context.Canceled)
	require.Nil(t, tb)
	require.Empty(
		t,
		leftovers(t, fmt.Sprintf("%06x", os.Getpid()), nil),
		"the bridge created before the interruption is gone",
	)
}

// A bridge left by a crashed run (its pid gone) is removed by the next
// Setup; one of a live process is kept.
func TestLeftoverBridgeRemoved(t *testing.T) {
	spec := Spec{Machines: 1, Gbit: 1}
	needNetAdmin(t, spec)
	// A pid that is surely gone: a child that has exited and been reaped.
	cmd := exec.Command("/bin/true")
	require.NoError(t, cmd.Run())
	dead := fmt.Sprintf("frb%06x00", cmd.Process.Pid)
	alive := fmt.Sprintf("frb%06x00", 1)
	for _, name := range []string{dead, alive} {
		require.NoError(t, netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}))
	}
	t.Cleanup(func() {
		for _, name := range []string{dead, alive} {
			if l, err := netlink.LinkByName(name); err == nil {
				netlink.LinkDel(l)
			}
		}
	})
	tb, err := Setup(context.Background(), spec, quiet)
	require.NoError(t, err)
	require.NoError(t, tb.Close())
	_, err = netlink.LinkByName(dead)
	require.Error(t, err, "the crashed run's bridge is gone")
	_, err = netlink.LinkByName(alive)
	require.NoError(t, err, "a live process's bridge stays")
}

// loopbackTbf returns the tbf on lo of the calling thread's namespace, or
// nil when lo has none.
func loopbackTbf() (*netlink.Tbf, error) {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return nil, err
	}
	qs, err := dump(func() ([]netlink.Qdisc, error) { return netlink.QdiscList(lo) })
	if err != nil {
		return nil, err
	}
	for _, q := range qs {
		if tbf, ok := q.(*netlink.Tbf); ok {
			return tbf, nil
		}
	}
	return nil, nil
}

// measureGbit sends over TCP from machine from to the NIC address of
// machine to (from == to: inside one machine, which goes through its lo)
// for d and returns the rate seen by the receiver after a warm-up, in
// Gbit/s. The bytes move by sendfile and splice: user-space copies (and
// the race detector's checks of them) would make the CPU of a small host,
// not the link, the limit.
func measureGbit(t *testing.T, tb *Testbed, from, to int, d time.Duration) float64 {
	t.Helper()
	p := tb.Plan()
	var ln net.Listener
	require.NoError(t, tb.Run(to, func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(p.Machines[to].Addr.Addr().String(), "0"))
		return err
	}))
	defer ln.Close()
	var conn net.Conn
	require.NoError(t, tb.Run(from, func() (err error) {
		conn, err = net.DialTimeout("tcp", ln.Addr().String(), 2*time.Second)
		return err
	}))
	defer conn.Close()

	const chunk = 16 << 20
	src, err := os.CreateTemp(t.TempDir(), "zeros")
	require.NoError(t, err)
	defer src.Close()
	require.NoError(t, src.Truncate(chunk))
	go func() {
		tcp := conn.(*net.TCPConn)
		for {
			if _, err := src.Seek(0, io.SeekStart); err != nil {
				return
			}
			if _, err := tcp.ReadFrom(src); err != nil { // sendfile
				return
			}
		}
	}()
	rc, err := ln.Accept()
	require.NoError(t, err)
	defer rc.Close()
	sink, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer sink.Close()
	const warmup = 200 * time.Millisecond
	rc.SetReadDeadline(time.Now().Add(warmup + d + 5*time.Second))
	start := time.Now()
	var counted int64
	var since time.Time
	for time.Since(start) < warmup+d {
		n, err := io.CopyN(sink, rc, chunk/4) // splice
		require.NoError(t, err)
		if since.IsZero() {
			if time.Since(start) >= warmup {
				since = time.Now()
			}
			continue
		}
		counted += n
	}
	return float64(counted) * 8 / time.Since(since).Seconds() / 1e9
}

// TCP between two machines moves the shaped rate, within 15%. Another
// test may be loading the CPU meanwhile (go test runs packages in
// parallel), and a small host's CPU then caps TCP below 10 Gbit/s: a
// measurement short of the rate is repeated, at most three times, and when
// all fall short at 10 Gbit/s, or at 1 Gbit/s on a host busier than its CPU
// count, the test is skipped, saying so. A measurement above the rate fails at once: the shaping does
// not hold.
func TestShapedRate(t *testing.T) {
	for _, gbit := range []float64{1, 10} {
		t.Run(fmt.Sprintf("%vGbit", gbit), func(t *testing.T) {
			spec := Spec{Machines: 2, Gbit: gbit}
			needNetAdmin(t, spec)
			tb, err := Setup(context.Background(), spec, quiet)
			require.NoError(t, err)
			defer tb.Close()
			best := 0.0
			for range 3 {
				got := measureGbit(t, tb, 0, 1, 800*time.Millisecond)
				t.Logf("shaped to %v Gbit/s: TCP moved %.3f Gbit/s (%.1f%%)", gbit, got, 100*got/gbit)
				require.Less(t, got, 1.15*gbit, "faster than the shaped rate")
				if got > 0.85*gbit {
					return
				}
				best = max(best, got)
			}
			if load := loadAverage(); load > float64(runtime.NumCPU()) || gbit > 1 {
				// A small host's CPU caps TCP near 10 Gbit/s, more so while
				// other packages test: only 1 Gbit/s must always be reached.
				t.Skipf(
					"best of three %.2f Gbit/s of %v (load %.1f on %d CPUs): "+
						"above 1 Gbit/s this host's CPU cannot be told from the shaping",
					best,
					gbit,
					load,
					runtime.NumCPU(),
				)
			}
			t.Fatalf("slower than the shaped rate three times: best %.2f Gbit/s of %v", best, gbit)
		})
	}
}

// With a loopback rate, lo of every machine carries a tbf of that rate,
// and TCP from a machine to its own NIC address (as NCCL's sockets between
// ranks of one machine that are NCCL hosts of their own) moves at that
// rate, within 15%, while the NIC keeps its own.
func TestLoopbackShaped(t *testing.T) {
	const loGbit = 1
	spec := Spec{Machines: 2, Gbit: 10, LoopbackGbit: loGbit}
	needNetAdmin(t, spec)
	tb, err := Setup(context.Background(), spec, quiet)
	require.NoError(t, err)
	defer tb.Close()
	p := tb.Plan()
	require.NotNil(t, p.Loopback)
	for i := range p.Machines {
		require.NoError(t, tb.Run(i, func() error {
			tbf, err := loopbackTbf()
			switch {
			case err != nil:
				return err
			case tbf == nil:
				return fmt.Errorf("machine %d: no tbf on lo", i)
			case tbf.Rate != p.Loopback.RateBytes || tbf.Limit != p.Loopback.LimitBytes:
				return fmt.Errorf(
					"machine %d: lo's tbf rate %d limit %d, want %d and %d",
					i,
					tbf.Rate,
					tbf.Limit,
					p.Loopback.RateBytes,
					p.Loopback.LimitBytes,
				)
			}
			return nil
		}))
	}
	best := 0.0
	for range 3 {
		got := measureGbit(t, tb, 0, 0, 800*time.Millisecond)
		t.Logf(
			"lo shaped to %v Gbit/s: TCP to the machine's own NIC address moved %.3f Gbit/s (%.1f%%)",
			loGbit,
			got,
			100*got/loGbit,
		)
		require.Less(t, got, 1.15*loGbit, "faster than lo's shaped rate: traffic inside a machine bypasses lo")
		if got > 0.85*loGbit {
			return
		}
		best = max(best, got)
	}
	if load := loadAverage(); load > float64(runtime.NumCPU()) {
		t.Skipf(
			"best of three %.2f Gbit/s of %v (load %.1f on %d CPUs): this host is too busy to tell",
			best,
			loGbit,
			load,
			runtime.NumCPU(),
		)
	}
	t.Fatalf("slower than lo's shaped rate three times: best %.2f Gbit/s of %v", best, loGbit)
}

// loadAverage returns the 1-minute load average; 0 when unknown.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var v float64
	fmt.Sscan(string(b), &v)
	return v
}

// dump repeats a netlink dump that another process's changes interrupted
// (other tests build testbeds at the same time).
func dump[T any](list func() (T, error)) (T, error) {
	for range 20 {
		v, err := list()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return list()
}
