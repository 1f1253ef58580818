package launch

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
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/fairgo/fairgo/cmd/fairrun/internal/netbed"
	"github.com/fairgo/fairgo/rendezvous"
)

const envRootNetNS = "FAIRRUN_TEST_ROOT_NETNS" // netcheck: the test's namespace inode

// netcheck is the worker of the emulated-NIC test: it checks from inside
// that it runs in a namespace of its own whose eth0 has the planned
// address and whose lo carries a tbf exactly when FAIRGO_TESTBED_NVLINK_GBIT
// asks for one, reaches the store on the bridge and the next rank's machine,
// and prints what it found.
func netcheck() int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "netcheck: "+format+"\n", a...)
		return 1
	}
	l, err := rendezvous.FromEnv()
	if err != nil {
		return fail("%v", err)
	}
	ino, err := netnsInode("/proc/self/ns/net")
	if err != nil {
		return fail("%v", err)
	}
	if strconv.FormatUint(ino, 10) == os.Getenv(envRootNetNS) {
		return fail("running in the root network namespace")
	}
	for k, want := range map[string]string{
		"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1",
		EnvTestbedNetNS: "1", EnvTestbedNICGbit: "1", EnvTestbedMachines: "2", EnvTestbedNICLatency: "0s",
	} {
		if got := os.Getenv(k); got != want {
			return fail("%s=%q, want %q", k, got, want)
		}
	}
	loGbit, err := strconv.ParseFloat(os.Getenv(EnvTestbedNVLinkGbit), 64)
	if err != nil {
		return fail("%s: %v", EnvTestbedNVLinkGbit, err)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fail("lo: %v", err)
	}
	qs, err := dump(func() ([]netlink.Qdisc, error) { return netlink.QdiscList(lo) })
	if err != nil {
		return fail("lo's qdiscs: %v", err)
	}
	var loRate uint64
	for _, q := range qs {
		if tbf, ok := q.(*netlink.Tbf); ok {
			loRate = tbf.Rate
		}
	}
	if want := netbed.ShapingFor(loGbit, 0, 0).RateBytes; loGbit > 0 && loRate != want || loGbit == 0 && loRate != 0 {
		return fail("lo shaped to %d bytes/s, want %d (%s=%v)", loRate, want, EnvTestbedNVLinkGbit, loGbit)
	}
	bridge, err := netip.ParseAddr(os.Getenv("MASTER_ADDR"))
	if err != nil {
		return fail("MASTER_ADDR: %v", err)
	}
	machine, _ := strconv.Atoi(os.Getenv("GROUP_RANK"))
	a := bridge.As4()
	a[3] = byte(machine + 2)
	want := netip.PrefixFrom(netip.AddrFrom4(a), 24)
	nic, err := net.InterfaceByName("eth0")
	if err != nil {
		return fail("%v", err)
	}
	addrs, err := nic.Addrs()
	if err != nil {
		return fail("%v", err)
	}
	found := false
	for _, ad := range addrs {
		found = found || ad.String() == want.String()
	}
	if !found {
		return fail("eth0 has %v, want %v", addrs, want)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if l.StoreToken == "" {
		return fail("no %s", rendezvous.EnvStoreToken)
	}
	store, err := rendezvous.Dial(ctx, l.StoreAddr, rendezvous.WithDialToken(l.StoreToken))
	if err != nil {
		return fail("store on the bridge: %v", err)
	}
	defer store.Close()
	ln, err := net.Listen("tcp", net.JoinHostPort(want.Addr().String(), "0"))
	if err != nil {
		return fail("%v", err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "machine %d", machine)
			c.Close()
		}
	}()
	if err := store.Set(ctx, "addr/"+strconv.Itoa(l.Rank), []byte(ln.Addr().String())); err != nil {
		return fail("%v", err)
	}
	next := (l.Rank + 1) % l.WorldSize
	peer, err := store.Get(ctx, "addr/"+strconv.Itoa(next))
	if err != nil {
		return fail("%v", err)
	}
	c, err := net.DialTimeout("tcp", string(peer), 5*time.Second)
	if err != nil {
		return fail("rank %d's machine at %s: %v", next, peer, err)
	}
	greeting, err := io.ReadAll(c)
	c.Close()
	if err != nil {
		return fail("%v", err)
	}
	// Everyone has dialled before anyone closes its listener.
	if n, err := store.Add(ctx, "done", 1); err != nil {
		return fail("%v", err)
	} else if n == int64(l.WorldSize) {
		store.Set(ctx, "all-done", nil)
	}
	if err := store.Wait(ctx, "all-done"); err != nil {
		return fail("%v", err)
	}
	fmt.Printf(
		"netcheck ok rank %d machine %d netns %d addr %s mtu %d peer %q host %s device %q intra %s lo %d\n",
		l.Rank,
		machine,
		ino,
		want,
		nic.MTU,
		greeting,
		os.Getenv(EnvNCCLHostID),
		os.Getenv(EnvDeviceID),
		os.Getenv(EnvTestbedIntra),
		loRate,
	)
	return 0
}

func netnsInode(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// needTestbed skips a test that builds real emulated NICs where that is
// not possible.
func needTestbed(t *testing.T, spec netbed.Spec) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) to build emulated NICs")
	}
	if err := (netbed.Prober{}).Check(spec); err != nil {
		t.Skipf("this host cannot build emulated NICs: %v", err)
	}
}

// linksOf lists the links of the root namespace that the fairrun of pid
// created (their names carry its pid), and the qdiscs on them. Other
// tests, in this process or in others, may build testbeds meanwhile.
func linksOf(t *testing.T, pid int) []string {
	t.Helper()
	var out []string
	links, err := dump(netlink.LinkList)
	require.NoError(t, err)
	tag := fmt.Sprintf("%06x", pid)
	for _, l := range links {
		name := l.Attrs().Name
		if !strings.HasPrefix(name, "frb"+tag) && !strings.HasPrefix(name, "frv"+tag) {
			continue
		}
		out = append(out, "link "+name)
		qs, err := dump(func() ([]netlink.Qdisc, error) { return netlink.QdiscList(l) })
		require.NoError(t, err)
		for _, q := range qs {
			out = append(out, fmt.Sprintf("qdisc %s %s %x", name, q.Type(), q.Attrs().Handle))
		}
	}
	return out
}

// netnsHolders lists the processes and file descriptors that still refer
// to one of the network namespaces.
func netnsHolders(inodes []uint64) []string {
	want := map[string]bool{}
	for _, ino := range inodes {
		want[fmt.Sprintf("net:[%d]", ino)] = true
	}
	var out []string
	paths, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, p := range append(paths, fds...) {
		if target, err := os.Readlink(p); err == nil && want[target] {
			out = append(out, p+" -> "+target)
		}
	}
	return out
}

// 2 emulated machines × 1 worker on 1 Gbit/s NICs, and 2 × 2 on one GPU
// with lo shaped: each machine's workers are in a namespace of their own,
// with the planned address on eth0 and lo's tbf, reach the next rank's
// machine and the store on the bridge; ranks sharing the GPU are NCCL
// hosts of their own. Afterwards no namespace, link or qdisc of the run is
// left.
func TestRunEmulatedNICs(t *testing.T) {
	for _, tc := range []struct {
		name         string
		nproc, gpus  int
		loGbit       float64
		intra        string
		ranksPerHost int
	}{
		{name: "2x1", nproc: 2, gpus: 2, intra: IntraNVLink, ranksPerHost: 1},
		{name: "2x2 on one GPU, lo shaped", nproc: 4, gpus: 1, loGbit: 1, intra: IntraLoopback, ranksPerHost: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			needTestbed(t, netbed.Spec{Machines: 2, Gbit: 1, LoopbackGbit: tc.loGbit})
			rootIno, err := netnsInode("/proc/self/ns/net")
			require.NoError(t, err)
			require.Empty(t, linksOf(t, os.Getpid()))
			var so, se syncBuffer
			c := Config{
				NProcPerNode:    tc.nproc,
				NNodes:          1,
				MasterAddr:      DefaultMasterAddr,
				EmulateMachines: 2,
				GPUs:            tc.gpus,
				NICGbit:         1,
				NICRtoMin:       DefaultNICRtoMin,
				NVLinkGbit:      tc.loGbit,
				MPS:             MPSOff,
				Grace:           2 * time.Second,
				Program:         os.Args[0],
				Env: append(
					os.Environ(),
					envRole+"=netcheck",
					envRootNetNS+"="+strconv.FormatUint(rootIno, 10),
				),
				Stdout: &so,
				Stderr: &se,
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			code, err := Run(ctx, c)
			require.NoError(t, err, "stderr: %s", se.String())
			require.Equal(t, 0, code)
			t.Logf("stdout:\n%s", so.String())

			line := regexp.MustCompile(
				`^\[(\d)\] netcheck ok rank (\d) machine (\d) netns (\d+) addr (\S+) mtu (\d+) ` +
					`peer "machine (\d)" host (\S+) device "(\S*)" intra (\S+) lo (\d+)$`,
			)
			wantLo := uint64(0) // lo not shaped
			if tc.loGbit > 0 {
				wantLo = netbed.ShapingFor(tc.loGbit, 0, 0).RateBytes
			}
			inodes := map[uint64]int{}
			addrOf := map[int]string{}
			machineOf := map[int]int{}
			peerOf := map[int]int{}
			hosts := map[string]int{}
			for _, l := range strings.Split(strings.TrimSpace(so.String()), "\n") {
				m := line.FindStringSubmatch(l)
				require.NotNil(t, m, "line %q", l)
				rank, _ := strconv.Atoi(m[2])
				machine, _ := strconv.Atoi(m[3])
				ino, _ := strconv.ParseUint(m[4], 10, 64)
				peer, _ := strconv.Atoi(m[7])
				if other, ok := inodes[ino]; ok {
					require.Equal(t, other, machine, "one namespace, one machine")
				}
				inodes[ino] = machine
				if a, ok := addrOf[machine]; ok {
					require.Equal(t, a, m[5], "the ranks of a machine share its NIC")
				}
				addrOf[machine], machineOf[rank], peerOf[rank] = m[5], machine, peer
				hosts[m[8]]++
				require.Equal(t, "9000", m[6], "MTU")
				require.Equal(t, tc.intra, m[10])
				require.Equal(
					t,
					tc.intra == IntraLoopback,
					m[9] != "",
					"a device identity exactly when ranks share a GPU",
				)
				require.Equal(t, wantLo, mustUint(t, m[11]), "lo's rate")
			}
			require.Len(t, machineOf, tc.nproc)
			for r, p := range peerOf {
				require.Equal(t, machineOf[(r+1)%tc.nproc], p, "rank %d reached the next rank's machine", r)
			}
			for h, n := range hosts {
				require.Equal(t, tc.ranksPerHost, n, "ranks of NCCL host %s", h)
			}
			require.Len(t, inodes, 2, "one namespace per machine")
			require.NotContains(t, inodes, rootIno)
			require.Regexp(t, `^10\.77\.\d+\.2/24$`, addrOf[0])
			require.Regexp(t, `^10\.77\.\d+\.3/24$`, addrOf[1])
			// At the end fairrun logs what each machine's NIC carried and
			// dropped (the workers reached each other, so both sent).
			counters := regexp.MustCompile(`msg="fairrun: NIC counters" machine=(\d) sent_bytes=(\d+) send_drops=\d+ `+
				`received_bytes=(\d+) receive_drops=\d+`).FindAllStringSubmatch(se.String(), -1)
			require.Len(t, counters, 2, "stderr: %s", se.String())
			for i, m := range counters {
				require.Equal(t, strconv.Itoa(i), m[1])
				require.NotZero(t, mustUint(t, m[2]), "machine %d sent", i)
				require.NotZero(t, mustUint(t, m[3]), "machine %d received", i)
			}
			if tc.loGbit > 0 {
				require.Contains(t, se.String(), "loopback_bytes=")
			}

			require.Empty(t, linksOf(t, os.Getpid()), "every link and qdisc of the run is gone")
			var list []uint64
			for ino := range inodes {
				list = append(list, ino)
			}
			require.Empty(t, netnsHolders(list), "nothing holds the namespaces")
		})
	}
}

func mustUint(t *testing.T, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 10, 64)
	require.NoError(t, err)
	return v
}

// --nvlink-gbit where every rank of a machine has a GPU of its own (so
// nothing would cross lo) stops before anything is built or started, with
// the exit status of a bad command line.
func TestRunRefusesNVLinkGbitWithoutSharing(t *testing.T) {
	dir := t.TempDir()
	c := Config{
		NProcPerNode:    8,
		NNodes:          1,
		MasterAddr:      DefaultMasterAddr,
		EmulateMachines: 4,
		GPUs:            2,
		NICGbit:         10,
		NVLinkGbit:      20,
		Program:         "/bin/sh",
		Args:            []string{"-c", "touch " + filepath.Join(dir, "started")},
		Stdout:          io.Discard,
		Stderr:          io.Discard,
		prober: netbed.Prober{
			EffectiveCaps: func() (uint64, error) { t.Error("the testbed was probed"); return 0, nil },
		},
	}
	code, err := Run(context.Background(), c)
	require.Equal(t, ExitUsage, code, "a bad command line, found before anything runs")
	require.ErrorIs(t, err, ErrUsage)
	var ue *UsageError
	require.ErrorAs(t, err, &ue)
	require.Equal(t, "nvlink-gbit", ue.Flag)
	require.ErrorContains(t, err, "2 per machine, 2 GPUs")
	_, serr := os.Stat(filepath.Join(dir, "started"))
	require.True(t, errors.Is(serr, os.ErrNotExist), "a worker was started")
}

// SIGTERM to fairrun in the middle of an emulated-NIC job removes the
// testbed too.
func TestFairrunSIGTERMRemovesTestbed(t *testing.T) {
	needTestbed(t, netbed.Spec{Machines: 2, Gbit: 10})
	_, fairrun := binaries(t)
	dir := t.TempDir()
	t.Cleanup(func() { killAll(dir) })
	cmd := exec.Command(
		fairrun,
		"--nproc-per-node",
		"4",
		"--emulate-machines",
		"2",
		"--gpus",
		"4",
		"--nic-gbit",
		"10",
		"--grace",
		"500ms",
		"--",
		os.Args[0],
	)
	cmd.Env = roleEnv("setsid", dir)
	var so, se syncBuffer
	cmd.Stdout, cmd.Stderr = &so, &se
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	waitFiles(t, dir, "worker-0", "worker-1", "worker-2", "worker-3")
	during := linksOf(t, cmd.Process.Pid)
	require.Len(t, during, 6, "the testbed is up: a bridge (noqueue), two veths and their tbfs: %v", during)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		exited <- err
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "stderr: %s", se.String())
		require.Equal(t, 143, ee.ExitCode(), "stderr: %s", se.String())
	case <-time.After(5 * time.Second):
		t.Fatalf("fairrun did not exit; stderr: %s", se.String())
	}
	require.Empty(t, linksOf(t, cmd.Process.Pid), "stderr: %s", se.String())
}

// Without the privileges, fairrun --nic-gbit stops before starting any
// worker, saying what is missing. The probe is injected, so this runs as
// any user.
func TestRunRefusesWithoutPrivileges(t *testing.T) {
	for _, tc := range []struct {
		name string
		caps uint64
		want string
	}{
		{name: "no capabilities", caps: 0, want: "fairrun: --nic-gbit needs CAP_NET_ADMIN (run as root)"},
		{name: "no CAP_SYS_ADMIN", caps: 1 << netbed.CapNetAdmin,
			want: "fairrun: --nic-gbit needs CAP_SYS_ADMIN (run as root)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var so, se syncBuffer
			c := Config{NProcPerNode: 2, NNodes: 1, MasterAddr: DefaultMasterAddr, EmulateMachines: 2, NICGbit: 10,
				Program: "/bin/sh", Args: []string{"-c", "touch " + filepath.Join(dir, "started")},
				Stdout: &so, Stderr: &se,
				prober: netbed.Prober{
					EffectiveCaps: func() (uint64, error) { return tc.caps, nil },
					Kernel:        func(netbed.Spec) error { t.Error("kernel probed without the capabilities"); return nil },
				}}
			code, err := Run(context.Background(), c)
			require.Equal(t, ExitLaunchFailure, code)
			require.ErrorIs(t, err, netbed.ErrUnavailable)
			require.EqualError(t, err, tc.want)
			_, serr := os.Stat(filepath.Join(dir, "started"))
			require.True(t, errors.Is(serr, os.ErrNotExist), "a worker was started")
		})
	}
}

// The fairrun binary, run without capabilities (as nobody when the test is
// root), refuses --nic-gbit with exit code 1 and says why.
func TestFairrunRefusesWithoutPrivileges(t *testing.T) {
	_, fairrun := binaries(t)
	dir := t.TempDir()
	cmd := exec.Command(fairrun, "--nproc-per-node", "2", "--emulate-machines", "2", "--nic-gbit", "10", "--",
		"/bin/sh", "-c", "touch "+filepath.Join(dir, "started"))
	if os.Geteuid() == 0 {
		require.NoError(t, os.Chmod(filepath.Dir(fairrun), 0o755))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	require.Equal(t, 1, ee.ExitCode(), "%s", out)
	require.Contains(t, string(out), "fairrun: --nic-gbit needs CAP_NET_ADMIN (run as root)")
	_, serr := os.Stat(filepath.Join(dir, "started"))
	require.True(t, errors.Is(serr, os.ErrNotExist), "a worker was started")
}

// fakeMPSControl writes an nvidia-cuda-mps-control that records its calls
// in log: -d starts a "daemon" (a sleep in a session of its own), quit on
// stdin kills it.
func fakeMPSControl(t *testing.T, log string) (bindir string) {
	t.Helper()
	bindir = t.TempDir()
	script := `#!/bin/sh
if [ "$1" = "-d" ]; then
	echo "start pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> ` + log + `
	setsid sh -c 'echo $$ > "$CUDA_MPS_PIPE_DIRECTORY/daemon.pid"; exec sleep 60' </dev/null >/dev/null 2>&1 &
	while [ ! -s "$CUDA_MPS_PIPE_DIRECTORY/daemon.pid" ]; do sleep 0.01; done
	exit 0
fi
read cmd
echo "$cmd pipe=$CUDA_MPS_PIPE_DIRECTORY" >> ` + log + `
[ "$cmd" = quit ] && kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/daemon.pid")"
`
	require.NoError(t, os.WriteFile(filepath.Join(bindir, MPSControl), []byte(script), 0o755))
	return bindir
}

// When ranks of different emulated machines share a GPU, --mps auto runs
// them under a private MPS daemon: every worker gets its directories, and
// the daemon is told to quit and its directories removed at the end.
func TestRunMPS(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mps     MPSMode
		gpus    int
		started bool
	}{
		{name: "auto, ranks share a GPU", mps: MPSAuto, gpus: 2, started: true},
		{name: "auto, one GPU per rank", mps: MPSAuto, gpus: 4, started: false},
		{name: "on", mps: MPSOn, gpus: 4, started: true},
		{name: "off", mps: MPSOff, gpus: 1, started: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			log := filepath.Join(dir, "calls")
			bindir := fakeMPSControl(t, log)
			env := []string{"PATH=" + bindir + ":/usr/bin:/bin"}
			var so, se syncBuffer
			c := Config{
				NProcPerNode:    4,
				NNodes:          1,
				MasterAddr:      DefaultMasterAddr,
				EmulateMachines: 2,
				GPUs:            tc.gpus,
				MPS:             tc.mps,
				Grace:           time.Second,
				Program:         "/bin/sh",
				Args: []string{
					"-c",
					`echo "mps=$FAIRGO_TESTBED_MPS pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY"; ` +
						`if [ -n "$CUDA_MPS_PIPE_DIRECTORY" ]; then ` +
						`test -s "$CUDA_MPS_PIPE_DIRECTORY/daemon.pid" && test -d "$CUDA_MPS_LOG_DIRECTORY"; fi`,
				},
				Env:    env,
				Stdout: &so,
				Stderr: &se,
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			code, err := Run(ctx, c)
			require.NoError(t, err, "stderr: %s", se.String())
			require.Equal(t, 0, code)
			lines := strings.Split(strings.TrimSpace(so.String()), "\n")
			require.Len(t, lines, 4)
			calls, _ := os.ReadFile(log)
			if !tc.started {
				require.Empty(t, calls)
				for _, l := range lines {
					require.Regexp(t, `^\[\d\] mps=0 pipe= log=$`, l)
				}
				return
			}
			m := regexp.MustCompile(`^start pipe=(\S+) log=(\S+)\nquit pipe=(\S+)\n$`).FindStringSubmatch(string(calls))
			require.NotNil(t, m, "calls: %q", calls)
			pipe, logDir := m[1], m[2]
			require.Equal(t, pipe, m[3], "quit went to the same daemon")
			for _, l := range lines {
				require.Regexp(t, `^\[\d\] mps=1 pipe=`+regexp.QuoteMeta(pipe)+` log=`+regexp.QuoteMeta(logDir)+`$`, l)
			}
			for _, d := range []string{pipe, logDir} {
				_, err := os.Stat(d)
				require.True(t, errors.Is(err, os.ErrNotExist), "%s is left", d)
			}
		})
	}
}

// --mps on without nvidia-cuda-mps-control stops before any worker.
func TestRunMPSMissing(t *testing.T) {
	if _, err := findMPSControl([]string{"PATH=" + t.TempDir()}); err == nil {
		t.Skip("this host has " + MPSControl + " in " + strings.Join(mpsDirs, ", "))
	}
	dir := t.TempDir()
	c := Config{NProcPerNode: 2, NNodes: 1, MasterAddr: DefaultMasterAddr, EmulateMachines: 2, GPUs: 1, MPS: MPSOn,
		Program: "/bin/sh", Args: []string{"-c", "touch " + filepath.Join(dir, "started")},
		Env: []string{"PATH=" + t.TempDir()}, Stdout: io.Discard, Stderr: io.Discard}
	code, err := Run(context.Background(), c)
	require.Equal(t, ExitLaunchFailure, code)
	require.ErrorIs(t, err, ErrNoMPS)
	_, serr := os.Stat(filepath.Join(dir, "started"))
	require.True(t, errors.Is(serr, os.ErrNotExist))
}

// The MPS directory of a crashed fairrun (its pid gone) is removed by the
// next start; that of a live process is kept.
func TestMPSLeftoversRemoved(t *testing.T) {
	exited := exec.Command("/bin/true")
	require.NoError(t, exited.Run())
	dead, err := os.MkdirTemp("", mpsDirPrefix+strconv.Itoa(exited.Process.Pid)+"-")
	require.NoError(t, err)
	live, err := os.MkdirTemp("", mpsDirPrefix+"1-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dead); os.RemoveAll(live) })
	require.NoError(t, os.Mkdir(filepath.Join(dead, "pipe"), 0o700))

	bindir := fakeMPSControl(t, filepath.Join(t.TempDir(), "calls"))
	control, err := findMPSControl([]string{"PATH=" + bindir})
	require.NoError(t, err)
	d, err := startMPS(
		context.Background(),
		control,
		[]string{"PATH=/usr/bin:/bin"},
		slog.New(slog.NewTextHandler(io.Discard, nil)),
	)
	require.NoError(t, err)
	require.NoError(t, d.Stop())
	_, err = os.Stat(dead)
	require.True(t, errors.Is(err, os.ErrNotExist), "the crashed run's directory is gone")
	_, err = os.Stat(live)
	require.NoError(t, err, "a live process's directory stays")
	_, err = os.Stat(d.dir)
	require.True(t, errors.Is(err, os.ErrNotExist))
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
