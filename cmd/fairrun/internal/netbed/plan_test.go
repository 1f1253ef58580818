package netbed

import (
	"errors"
	"math"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNewPlan(t *testing.T) {
	subnet := netip.MustParsePrefix("10.77.3.0/24")
	for _, tc := range []struct {
		name    string
		spec    Spec
		runID   string
		subnet  netip.Prefix
		wantErr string
	}{
		{name: "2 machines", spec: Spec{Machines: 2, Gbit: 10}, runID: "00abcd7f", subnet: subnet},
		{name: "253 machines", spec: Spec{Machines: MaxMachines, Gbit: 1, Latency: time.Millisecond},
			runID: "3fffffff", subnet: subnet},
		{name: "no machines", spec: Spec{Machines: 0, Gbit: 10}, runID: "00abcd7f", subnet: subnet, wantErr: "machines"},
		{name: "too many machines", spec: Spec{Machines: 254, Gbit: 10}, runID: "00abcd7f", subnet: subnet,
			wantErr: "machines"},
		{name: "zero rate", spec: Spec{Machines: 2}, runID: "00abcd7f", subnet: subnet, wantErr: "rate"},
		{name: "negative rate", spec: Spec{Machines: 2, Gbit: -1}, runID: "00abcd7f", subnet: subnet, wantErr: "rate"},
		{name: "negative latency", spec: Spec{Machines: 2, Gbit: 1, Latency: -1}, runID: "00abcd7f",
			subnet: subnet, wantErr: "latency"},
		{name: "bad run id", spec: Spec{Machines: 2, Gbit: 1}, runID: "XYZ", subnet: subnet, wantErr: "run id"},
		{name: "not a /24", spec: Spec{Machines: 2, Gbit: 1}, runID: "00abcd7f",
			subnet: netip.MustParsePrefix("10.77.0.0/16"), wantErr: "subnet"},
		{name: "not masked", spec: Spec{Machines: 2, Gbit: 1}, runID: "00abcd7f",
			subnet: netip.MustParsePrefix("10.77.3.5/24"), wantErr: "subnet"},
		{name: "IPv6", spec: Spec{Machines: 2, Gbit: 1}, runID: "00abcd7f",
			subnet: netip.MustParsePrefix("fd00::/24"), wantErr: "subnet"},
		{name: "shaped loopback", spec: Spec{Machines: 2, Gbit: 2.5, LoopbackGbit: 20}, runID: "00abcd7f", subnet: subnet},
		{name: "negative loopback", spec: Spec{Machines: 2, Gbit: 2.5, LoopbackGbit: -1}, runID: "00abcd7f",
			subnet: subnet, wantErr: "loopback"},
		{name: "NaN loopback", spec: Spec{Machines: 2, Gbit: 2.5, LoopbackGbit: math.NaN()}, runID: "00abcd7f",
			subnet: subnet, wantErr: "loopback"},
		{name: "loopback too fast", spec: Spec{Machines: 2, Gbit: 2.5, LoopbackGbit: MaxGbit + 1},
			runID: "00abcd7f", subnet: subnet, wantErr: "loopback"},
		{name: "queue and rto_min", spec: Spec{Machines: 2, Gbit: 2.5, LoopbackGbit: 20, Queue: 16 * time.Millisecond,
			RtoMin: 5 * time.Millisecond}, runID: "00abcd7f", subnet: subnet},
		{name: "negative queue", spec: Spec{Machines: 2, Gbit: 2.5, Queue: -1}, runID: "00abcd7f", subnet: subnet,
			wantErr: "queue"},
		{name: "queue too long", spec: Spec{Machines: 2, Gbit: 2.5, Queue: MaxQueue + 1}, runID: "00abcd7f",
			subnet: subnet, wantErr: "queue"},
		{name: "negative rto_min", spec: Spec{Machines: 2, Gbit: 2.5, RtoMin: -time.Millisecond}, runID: "00abcd7f",
			subnet: subnet, wantErr: "rto_min"},
		{name: "rto_min not whole ms", spec: Spec{Machines: 2, Gbit: 2.5, RtoMin: 1500 * time.Microsecond},
			runID: "00abcd7f", subnet: subnet, wantErr: "rto_min"},
		{name: "rto_min too long", spec: Spec{Machines: 2, Gbit: 2.5, RtoMin: MaxRtoMin + time.Millisecond},
			runID: "00abcd7f", subnet: subnet, wantErr: "rto_min"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPlan(tc.spec, tc.runID, tc.subnet)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, "frb"+tc.runID, p.Bridge)
			require.Equal(t, "10.77.3.1/24", p.BridgeAddr.String())
			require.Len(t, p.Machines, tc.spec.Machines)
			require.Equal(t, tc.spec.RtoMin, p.RtoMin)
			require.Equal(t, ShapingFor(tc.spec.Gbit, tc.spec.Latency, tc.spec.Queue), p.Shaping)
			names := map[string]bool{p.Bridge: true}
			for i, m := range p.Machines {
				require.Equal(t, i, m.Index)
				require.Equal(t, "eth0", m.NIC)
				require.Equal(t, "10.77.3."+strconv.Itoa(i+2)+"/24", m.Addr.String())
				require.Equal(t, "frv"+tc.runID+"m"+strconv.Itoa(i), m.HostVeth)
				require.LessOrEqual(t, len(m.HostVeth), 15, "IFNAMSIZ")
				require.False(t, names[m.HostVeth])
				names[m.HostVeth] = true
			}
			if tc.spec.LoopbackGbit == 0 {
				require.Nil(t, p.Loopback, "lo is not shaped unless asked")
			} else {
				require.NotNil(t, p.Loopback)
				require.Equal(t, ShapingFor(tc.spec.LoopbackGbit, 0, tc.spec.Queue), *p.Loopback)
			}
			pid, ok := OwnerPid(p.Bridge)
			require.True(t, ok)
			want, _ := strconv.ParseInt(tc.runID[:6], 16, 32)
			require.Equal(t, int(want), pid)
		})
	}
}

func TestShapingFor(t *testing.T) {
	for _, tc := range []struct {
		gbit       float64
		latency    time.Duration
		queue      time.Duration
		rate       uint64
		burst      uint32
		limit      uint32
		netemLimit uint32
	}{
		{gbit: 1, rate: 125_000_000, burst: 256 << 10, limit: 256<<10 + 2_000_000},
		{gbit: 10, rate: 1_250_000_000, burst: 256 << 10, limit: 256<<10 + 20_000_000},
		{gbit: 40, queue: 4 * time.Millisecond, rate: 5_000_000_000, burst: 1_000_000, limit: 21_000_000},
		{gbit: 40, rate: 5_000_000_000, burst: 1_000_000, limit: 64 << 20},
		{gbit: 100, rate: 12_500_000_000, burst: 2_500_000, limit: 64 << 20},
		{gbit: 1000, rate: 125_000_000_000, burst: 25_000_000, limit: 64 << 20},
		{gbit: 0.5, rate: 62_500_000, burst: 256 << 10, limit: 256<<10 + 1_000_000},
		{gbit: 10, latency: 50 * time.Microsecond, rate: 1_250_000_000, burst: 256 << 10,
			limit: 256<<10 + 20_000_000, netemLimit: 1000},
		{gbit: 10, latency: 10 * time.Millisecond, rate: 1_250_000_000, burst: 256 << 10,
			limit: 256<<10 + 20_000_000, netemLimit: 16667},
		{gbit: 2.5, queue: DefaultQueue, rate: 312_500_000, burst: 256 << 10, limit: 256<<10 + 5_000_000},
		{gbit: 2.5, queue: 4 * time.Millisecond, rate: 312_500_000, burst: 256 << 10, limit: 256<<10 + 1_250_000},
		{gbit: 100, queue: 4 * time.Millisecond, rate: 12_500_000_000, burst: 2_500_000, limit: 52_500_000},
	} {
		name := strconv.FormatFloat(tc.gbit, 'g', -1, 64) + "G/" + tc.latency.String() + "/" + tc.queue.String()
		t.Run(name, func(t *testing.T) {
			s := ShapingFor(tc.gbit, tc.latency, tc.queue)
			require.Equal(t, tc.rate, s.RateBytes)
			require.Equal(t, tc.burst, s.BurstBytes)
			require.Equal(t, tc.limit, s.LimitBytes)
			require.Equal(t, tc.latency, s.Latency)
			require.Equal(t, tc.netemLimit, s.NetemLimit)
			require.Greater(t, s.BurstBytes, uint32(64<<10), "a GSO super-packet fits the bucket")
			require.Greater(t, s.LimitBytes, s.BurstBytes)
		})
	}
}

func TestPickSubnet(t *testing.T) {
	p := netip.MustParsePrefix
	for _, tc := range []struct {
		name  string
		inUse []netip.Prefix
		want  string
	}{
		{name: "nothing in use", want: "10.77.0.0/24"},
		{name: "unrelated", inUse: []netip.Prefix{p("127.0.0.0/8"), p("192.168.1.0/24"), p("10.76.0.0/16")},
			want: "10.77.0.0/24"},
		{name: "first two taken", inUse: []netip.Prefix{p("10.77.0.0/24"), p("10.77.1.0/24")}, want: "10.77.2.0/24"},
		{name: "a host address inside", inUse: []netip.Prefix{p("10.77.0.9/32")}, want: "10.77.1.0/24"},
		{name: "a wider net covering the start", inUse: []netip.Prefix{p("10.77.0.0/23")}, want: "10.77.2.0/24"},
		{name: "all of 10/8", inUse: []netip.Prefix{p("10.0.0.0/8")}, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PickSubnet(tc.inUse)
			if tc.want == "" {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got.String())
		})
	}
}

func TestRunID(t *testing.T) {
	id, err := NewRunID(0x12ab)
	require.NoError(t, err)
	require.Len(t, id, 8)
	require.Equal(t, "0012ab", id[:6])
	pid, ok := OwnerPid("frb" + id)
	require.True(t, ok)
	require.Equal(t, 0x12ab, pid)
	for _, name := range []string{"frb12", "eth0", "frb0012abZZ", "frv0012ab00m1", "br-0012ab00"} {
		_, ok := OwnerPid(name)
		require.False(t, ok, name)
	}
}

// The probe refuses before anything is created when a capability or a
// kernel feature is missing, whoever runs the test.
func TestProberRefuses(t *testing.T) {
	spec := Spec{Machines: 2, Gbit: 10}
	all := uint64(1<<CapNetAdmin | 1<<CapSysAdmin)
	kernelOK := func(Spec) error { return nil }
	noTbf := func(Spec) error { return &MissingError{Flag: "nic-gbit", Feature: featureTbf} }
	for _, tc := range []struct {
		name    string
		caps    uint64
		capsErr error
		kernel  func(Spec) error
		want    string // "" : no error
	}{
		{name: "root", caps: all, kernel: kernelOK},
		{name: "no capabilities", caps: 0, kernel: kernelOK, want: "fairrun: --nic-gbit needs CAP_NET_ADMIN (run as root)"},
		{name: "no CAP_SYS_ADMIN", caps: 1 << CapNetAdmin, kernel: kernelOK,
			want: "fairrun: --nic-gbit needs CAP_SYS_ADMIN (run as root)"},
		{name: "no CAP_NET_ADMIN", caps: 1 << CapSysAdmin, kernel: kernelOK,
			want: "fairrun: --nic-gbit needs CAP_NET_ADMIN (run as root)"},
		{name: "unreadable", capsErr: errors.New("no /proc"), kernel: kernelOK,
			want: "needs CAP_NET_ADMIN and CAP_SYS_ADMIN"},
		{name: "kernel without tbf", caps: all, kernel: noTbf, want: "fairrun: --nic-gbit: kernel lacks the tbf qdisc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kernelCalled := false
			p := Prober{
				EffectiveCaps: func() (uint64, error) { return tc.caps, tc.capsErr },
				Kernel:        func(s Spec) error { kernelCalled = true; return tc.kernel(s) },
			}
			err := p.Check(spec)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrUnavailable)
			var me *MissingError
			require.ErrorAs(t, err, &me)
			require.Contains(t, err.Error(), tc.want)
			if me.Capability != "" {
				require.False(t, kernelCalled, "the kernel is probed only with the capabilities")
			}
		})
	}
	require.Error(t, Prober{}.Check(Spec{}), "the spec is validated")
}

func TestParseCapEff(t *testing.T) {
	v, err := parseCapEff("Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\nCapBnd:\t0\n")
	require.NoError(t, err)
	require.Equal(t, uint64(0x1ffffffffff), v)
	_, err = parseCapEff("Name:\tx\n")
	require.Error(t, err)
}
