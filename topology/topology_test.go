package topology

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/rendezvous"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestMachineIdentity(t *testing.T) {
	host := func(name string, err error) func() (string, error) {
		return func() (string, error) { return name, err }
	}
	boot := func(id string, err error) func(string) ([]byte, error) {
		return func(p string) ([]byte, error) {
			if p != BootIDPath {
				return nil, os.ErrNotExist
			}
			return []byte(id), err
		}
	}
	for _, tc := range []struct {
		name    string
		h       Host
		want    Identity
		wantErr bool
	}{
		{"override wins",
			Host{Lookup: env(map[string]string{EnvMachineID: "m7", EnvNCCLHostID: "h"}), Hostname: host("n", nil)},
			Identity{"m7", EnvMachineID}, false},
		{"NCCL_HOSTID", Host{Lookup: env(map[string]string{EnvNCCLHostID: "h1"}), Hostname: host("n", nil)},
			Identity{"h1", EnvNCCLHostID}, false},
		{"empty override ignored", Host{Lookup: env(map[string]string{EnvMachineID: " ", EnvNCCLHostID: "h1"})},
			Identity{"h1", EnvNCCLHostID}, false},
		{"hostname and boot id",
			Host{Lookup: env(nil), Hostname: host("node3", nil), ReadFile: boot("abc-123\n", nil)},
			Identity{"node3/abc-123", "hostname+boot_id"}, false},
		{"no boot id", Host{Lookup: env(nil), Hostname: host("node3", nil), ReadFile: boot("", os.ErrNotExist)},
			Identity{"node3", "hostname"}, false},
		{"nothing", Host{Lookup: env(nil), Hostname: host("", errors.New("no"))}, Identity{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MachineIdentity(tc.h)
			if tc.wantErr {
				require.Error(t, err)
				require.Contains(t, err.Error(), EnvMachineID)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	// The real machine has some identity.
	id, err := MachineIdentity(Host{Lookup: env(nil)})
	require.NoError(t, err)
	require.NotEmpty(t, id.ID)
}

// fakeNVML knows devices by physical index.
type fakeNVML []Device

func (f fakeNVML) DeviceByIndex(i int) (Device, error) {
	if i < 0 || i >= len(f) {
		return Device{}, fmt.Errorf("no device %d", i)
	}
	return f[i], nil
}

func (f fakeNVML) DeviceByUUID(u string) (Device, error) {
	for _, d := range f {
		if d.UUID == u {
			return d, nil
		}
	}
	return Device{}, fmt.Errorf("no device %s", u)
}

func (f fakeNVML) Close() error { return nil }

func TestDescribeDevice(t *testing.T) {
	nv := fakeNVML{
		{Index: 0, UUID: "GPU-aaa", PCIBusID: "00000000:18:00.0", NVLinkPeers: []string{"00000000:2a:00.0"}},
		{Index: 1, UUID: "GPU-bbb", PCIBusID: "00000000:2a:00.0"},
	}
	for _, tc := range []struct {
		name    string
		ordinal int
		env     map[string]string
		nv      NVML
		want    Device
		wantErr bool
	}{
		{"nvml by ordinal", 1, nil, nv,
			Device{ID: "GPU-bbb", Index: 1, UUID: "GPU-bbb", PCIBusID: "00000000:2a:00.0", Source: SourceNVML}, false},
		{"nvml through mask", 0, map[string]string{EnvVisibleDevices: "1,0"}, nv,
			Device{ID: "GPU-bbb", Index: 1, UUID: "GPU-bbb", PCIBusID: "00000000:2a:00.0", Source: SourceNVML}, false},
		{"nvml by uuid mask", 0, map[string]string{EnvVisibleDevices: "GPU-aaa"}, nv,
			Device{ID: "GPU-aaa", Index: 0, UUID: "GPU-aaa", PCIBusID: "00000000:18:00.0",
				NVLinkPeers: []string{"00000000:2a:00.0"}, Source: SourceNVML},
			false},
		{"nvml lacks the device: fallback", 0, map[string]string{EnvVisibleDevices: "5"}, nv,
			Device{ID: "cuda:5", Index: 5, Source: SourceVisible}, false},
		{"no nvml, mask", 1, map[string]string{EnvVisibleDevices: "3, 2"}, nil,
			Device{ID: "cuda:2", Index: 2, Source: SourceVisible}, false},
		{"no nvml, uuid mask", 0, map[string]string{EnvVisibleDevices: "GPU-zzz"}, nil,
			Device{ID: "GPU-zzz", Index: -1, UUID: "GPU-zzz", Source: SourceVisible}, false},
		{"no nvml, MIG", 0, map[string]string{EnvVisibleDevices: "MIG-1"}, nil,
			Device{ID: "MIG-1", Index: -1, Source: SourceVisible}, false},
		{"no nvml, no mask", 3, nil, nil, Device{ID: "cuda:3", Index: 3, Source: SourceOrdinal}, false},
		{"ordinal beyond mask", 2, map[string]string{EnvVisibleDevices: "0,1"}, nil, Device{}, true},
		{"empty mask", 0, map[string]string{EnvVisibleDevices: ""}, nil, Device{}, true},
		{"negative ordinal", -1, nil, nil, Device{}, true},
		// FAIRGO_DEVICE_ID names the device; the physical facts stay.
		{"explicit, nvml", 1, map[string]string{EnvDeviceID: "1/r3"}, nv,
			Device{ID: "1/r3", Index: 1, UUID: "GPU-bbb", PCIBusID: "00000000:2a:00.0",
				Source: SourceExplicit + SourceNVML}, false},
		{"explicit, nvml by uuid mask, NVLinks kept", 0, map[string]string{EnvVisibleDevices: "GPU-aaa",
			EnvDeviceID: " GPU-aaa/r0 "}, nv,
			Device{ID: "GPU-aaa/r0", Index: 0, UUID: "GPU-aaa", PCIBusID: "00000000:18:00.0",
				NVLinkPeers: []string{"00000000:2a:00.0"}, Source: SourceExplicit + SourceNVML}, false},
		{"explicit, no nvml, mask", 0, map[string]string{EnvVisibleDevices: "2", EnvDeviceID: "2/r1"}, nil,
			Device{ID: "2/r1", Index: 2, Source: SourceExplicit + SourceVisible}, false},
		{"explicit, no nvml, no mask", 3, map[string]string{EnvDeviceID: "x"}, nil,
			Device{ID: "x", Index: 3, Source: SourceExplicit + SourceOrdinal}, false},
		{"explicit empty counts as unset", 3, map[string]string{EnvDeviceID: "  "}, nil,
			Device{ID: "cuda:3", Index: 3, Source: SourceOrdinal}, false},
		{"explicit with a blank inside", 0, map[string]string{EnvDeviceID: "0 r1"}, nil, Device{}, true},
		{"explicit with a control character", 0, map[string]string{EnvDeviceID: "0/r\x001"}, nil, Device{}, true},
		{"explicit too long", 0, map[string]string{EnvDeviceID: strings.Repeat("x", MaxDeviceIDLen+1)}, nil, Device{}, true},
		{"explicit, negative ordinal", -1, map[string]string{EnvDeviceID: "x"}, nil, Device{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DescribeDevice(tc.ordinal, env(tc.env), tc.nv)
			if tc.wantErr {
				require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			require.Equal(t, strings.TrimSpace(tc.env[EnvDeviceID]) != "", got.ExplicitID())
		})
	}
	_, err := DescribeDevice(0, env(map[string]string{EnvDeviceID: "a b"}), nil)
	require.ErrorContains(t, err, EnvDeviceID, "the error names the variable")
	require.Equal(t, 0, DefaultOrdinal(3, env(map[string]string{EnvVisibleDevices: "5"})))
	require.Equal(t, 3, DefaultOrdinal(3, env(map[string]string{EnvVisibleDevices: "0,1,2,3"})))
	require.Equal(t, 3, DefaultOrdinal(3, env(nil)))
}

// The real NVML, when the machine has one; otherwise the error says why.
func TestOpenNVML(t *testing.T) {
	nv, err := OpenNVML()
	if err != nil {
		require.ErrorIs(t, err, ErrNoNVML)
		t.Logf("no NVML here: %v", err)
		return
	}
	defer nv.Close()
	d, err := nv.DeviceByIndex(0)
	require.NoError(t, err)
	require.NotEmpty(t, d.UUID)
}

func TestSelfDescribe(t *testing.T) {
	m, err := Self{
		Host: Host{
			Lookup:   env(map[string]string{EnvNCCLHostID: "emu-1", EnvVisibleDevices: "1"}),
			Hostname: func() (string, error) { return "box", nil },
		},
		Ordinal: 0,
		NoNVML:  true,
	}.Describe()
	require.NoError(t, err)
	require.Equal(t, Member{MachineID: "emu-1", MachineSource: EnvNCCLHostID, Hostname: "box",
		Device: Device{ID: "cuda:1", Index: 1, Source: SourceVisible}}, m)
}

// Ranks that share one GPU describe it alike but for the identity
// FAIRGO_DEVICE_ID gives them.
func TestSelfDescribeExplicit(t *testing.T) {
	for _, local := range []string{"r0", "r1"} {
		m, err := Self{
			Host: Host{Lookup: env(map[string]string{EnvMachineID: "emu-0", EnvNCCLHostID: "emu-0-d" + local[1:],
				EnvVisibleDevices: "1", EnvDeviceID: "1/" + local}), Hostname: func() (string, error) { return "box", nil }},
			NoNVML: true,
		}.Describe()
		require.NoError(t, err)
		require.Equal(t, Member{MachineID: "emu-0", MachineSource: EnvMachineID, Hostname: "box",
			Device: Device{ID: "1/" + local, Index: 1, Source: SourceExplicit + SourceVisible}}, m)
	}
}

// member builds a member with a device index.
func member(rank int, machine string, dev int) Member {
	return Member{
		Rank:      rank,
		MachineID: machine,
		Hostname:  "host-" + machine,
		Device:    Device{ID: fmt.Sprintf("cuda:%d", dev), Index: dev},
	}
}

func TestBuild(t *testing.T) {
	// Round-robin ranks over two machines, given out of order.
	ms := []Member{member(3, "b", 1), member(0, "a", 0), member(2, "a", 1), member(1, "b", 0)}
	l, err := Build(ms, 3)
	require.NoError(t, err)
	require.Equal(t, fairgo.Grid{Machines: 2, Devices: 2, Machine: 1, Local: 1}, l.Grid)
	require.Equal(t, []Machine{{ID: "a", Ranks: []int{0, 2}}, {ID: "b", Ranks: []int{1, 3}}}, l.Machines)
	require.Equal(t, []int{1, 3}, l.IntraRanks())
	require.Equal(t, []int{2, 3}, l.RailRanks())
	require.Equal(t, []int{0, 1}, l.Rail(0))
	c, k := l.IntraSplit()
	require.Equal(t, [2]int{1, 1}, [2]int{c, k})
	c, k = l.RailSplit()
	require.Equal(t, [2]int{1, 1}, [2]int{c, k})
	require.Equal(t, "grid 2x2 machine 1 local 1 rank 3", l.String())
	require.Equal(t, 2, l.RankAt(0, 1))
	require.Equal(t, 4, l.WorldSize())

	for _, tc := range []struct {
		name    string
		members []Member
		self    int
		is      error
		text    []string
	}{
		{"irregular", []Member{member(0, "a", 0), member(1, "a", 1), member(2, "b", 0)}, 0, ErrIrregular,
			[]string{`machine "a" (hosts host-a): 2 ranks [0 1] devices [cuda:0 cuda:1]`,
				`machine "b" (hosts host-b): 1 ranks [2] devices [cuda:0]`}},
		{"duplicate device", []Member{member(0, "a", 0), member(1, "a", 0), member(2, "b", 0), member(3, "b", 1)},
			0, ErrDuplicateDevice,
			[]string{`ranks [0 1] on machine "a" all use device cuda:0`, `machine "b"`}},
		{"rank out of range", []Member{member(0, "a", 0), member(2, "a", 1)}, 0, ErrBadMember, []string{"rank 2"}},
		{"rank twice", []Member{member(1, "a", 0), member(1, "a", 1)}, 0, ErrBadMember, []string{"reported twice"}},
		{"no machine id", []Member{member(0, "", 0)}, 0, ErrBadMember, []string{"machine identity"}},
		{"self out of range", []Member{member(0, "a", 0)}, 1, ErrBadMember, nil},
		{"world size mismatch", []Member{{Rank: 0, WorldSize: 3, MachineID: "a", Device: Device{ID: "x"}}}, 0,
			ErrBadMember, []string{"world size 3"}},
		{"empty", nil, 0, ErrBadMember, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(tc.members, tc.self)
			require.ErrorIs(t, err, tc.is)
			for _, s := range tc.text {
				require.Contains(t, err.Error(), s)
			}
		})
	}
	var de *DuplicateDeviceError
	_, err = Build([]Member{member(0, "a", 0), member(1, "a", 0)}, 0)
	require.ErrorAs(t, err, &de)
	require.Equal(t, []int{0, 1}, de.Ranks)
	require.Len(t, de.Machines, 1)
}

// explicitMember builds a member whose device identity came from
// FAIRGO_DEVICE_ID, on physical GPU gpu.
func explicitMember(rank int, machine, id string, gpu int) Member {
	return Member{
		Rank:      rank,
		MachineID: machine,
		Hostname:  "box",
		Device:    Device{ID: id, Index: gpu, Source: SourceExplicit + SourceVisible},
	}
}

// Explicit device identities: distinct ones on one GPU make a grid, one
// claimed twice is refused naming the ranks, and a machine that mixes
// explicit and GPU identities is refused.
func TestBuildExplicitDeviceIDs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members []Member
		grid    fairgo.Grid // of rank 0, when accepted
		is      error
		ranks   []int // the DuplicateDeviceError's
		text    []string
	}{
		{name: "2x2 on one GPU", members: []Member{explicitMember(0, "a", "0/r0", 0), explicitMember(1, "a", "0/r1", 0),
			explicitMember(2, "b", "0/r0", 0), explicitMember(3, "b", "0/r1", 0)},
			grid: fairgo.Grid{Machines: 2, Devices: 2}},
		{name: "2x4 on two GPUs, two ranks of a machine on each", members: []Member{
			explicitMember(0, "a", "0/r0", 0), explicitMember(1, "a", "1/r1", 1),
			explicitMember(2, "a", "0/r2", 0), explicitMember(3, "a", "1/r3", 1),
			explicitMember(4, "b", "0/r0", 0), explicitMember(5, "b", "1/r1", 1),
			explicitMember(6, "b", "0/r2", 0), explicitMember(7, "b", "1/r3", 1)},
			grid: fairgo.Grid{Machines: 2, Devices: 4}},
		{name: "one identity claimed twice", members: []Member{
			explicitMember(0, "a", "0/r0", 0), explicitMember(1, "a", "0/r1", 0),
			explicitMember(2, "b", "0/r1", 0), explicitMember(3, "b", "0/r1", 0)},
			is: ErrDuplicateDevice, ranks: []int{2, 3}, text: []string{
				`ranks [2 3] on machine "b" all use device 0/r1`, EnvDeviceID,
			}},
		{name: "explicit and GPU identities on one machine", members: []Member{
			explicitMember(0, "a", "0/r0", 0), member(1, "a", 0),
			explicitMember(2, "b", "0/r0", 0), explicitMember(3, "b", "0/r1", 0)},
			is: ErrBadMember, text: []string{`machine "a": ranks [0] give FAIRGO_DEVICE_ID and ranks [1] do not`}},
		{name: "explicit on one machine, GPU identities on another", members: []Member{
			explicitMember(0, "a", "0/r0", 0), explicitMember(1, "a", "0/r1", 0),
			member(2, "b", 0), member(3, "b", 1)},
			grid: fairgo.Grid{Machines: 2, Devices: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Build(tc.members, 0)
			if tc.is == nil {
				require.NoError(t, err)
				require.Equal(t, tc.grid, l.Grid)
				return
			}
			require.ErrorIs(t, err, tc.is)
			for _, s := range tc.text {
				require.Contains(t, err.Error(), s)
			}
			if tc.ranks != nil {
				var de *DuplicateDeviceError
				require.ErrorAs(t, err, &de)
				require.Equal(t, tc.ranks, de.Ranks)
			}
		})
	}
}

// discoverAll runs Discover for every rank concurrently on store.
func discoverAll(ctx context.Context, store rendezvous.Store, members []Member) ([]*Layout, []error) {
	ls := make([]*Layout, len(members))
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for _, m := range members {
		wg.Go(func() {
			ls[m.Rank], errs[m.Rank] = Discover(ctx, store, m.Rank, len(members), m)
		})
	}
	wg.Wait()
	return ls, errs
}

func TestDiscover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// 3 machines × 2, ranks shuffled across machines.
	rng := rand.New(rand.NewPCG(7, 7))
	perm := rng.Perm(6)
	var ms []Member
	for slot, r := range perm {
		ms = append(ms, member(r, fmt.Sprint("m", slot/2), slot%2))
	}
	srv, err := rendezvous.Listen("127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(ctx)
	defer srv.Close()
	for _, kind := range []string{"memory", "tcp"} {
		t.Run(kind, func(t *testing.T) {
			var store rendezvous.Store = rendezvous.NewMemoryStore()
			if kind == "tcp" {
				c, err := rendezvous.Dial(ctx, srv.Addr())
				require.NoError(t, err)
				defer c.Close()
				store = rendezvous.WithPrefix(c, "run1")
			}
			ls, errs := discoverAll(ctx, store, ms)
			for r := range ms {
				require.NoError(t, errs[r])
				require.Equal(t, ls[0].Machines, ls[r].Machines)
				require.Equal(t, r, ls[r].Rank)
				require.Equal(t, ls[0].GridOf(r), ls[r].Grid)
				require.Equal(t, 3, ls[r].Grid.Machines)
				require.Equal(t, 2, ls[r].Grid.Devices)
			}
			// Machine order: by smallest rank.
			require.Equal(t, 0, ls[0].Machines[0].Ranks[0])
		})
	}
}

func TestDiscoverErrors(t *testing.T) {
	t.Run("incomplete", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		store := rendezvous.NewMemoryStore()
		ms := []Member{member(0, "a", 0), member(1, "a", 1), member(3, "b", 1)}
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for _, m := range ms {
			wg.Go(func() { _, errs[m.Rank] = Discover(ctx, store, m.Rank, 4, m) })
		}
		wg.Wait()
		for _, m := range ms {
			err := errs[m.Rank]
			require.ErrorIs(t, err, ErrIncomplete)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.ErrorIs(t, err, fairgo.ErrTimeout, "a rank that did not come is a timeout")
			var ie *IncompleteError
			require.ErrorAs(t, err, &ie)
			require.Equal(t, []int{2}, ie.Missing)
			require.Len(t, ie.Machines, 2)
			require.Contains(t, err.Error(), "3 of 4 ranks reported")
			require.Contains(t, err.Error(), `machine "b" (hosts host-b): 1 ranks [3] devices [cuda:1]`)
		}
	})
	t.Run("irregular and duplicate reach every rank", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, errs := discoverAll(
			ctx,
			rendezvous.NewMemoryStore(),
			[]Member{member(0, "a", 0), member(1, "a", 1), member(2, "b", 0)},
		)
		for _, err := range errs {
			require.ErrorIs(t, err, ErrIrregular)
		}
		_, errs = discoverAll(
			ctx,
			rendezvous.NewMemoryStore(),
			[]Member{member(0, "a", 0), member(1, "b", 0), member(2, "a", 0), member(3, "b", 1)},
		)
		for _, err := range errs {
			require.ErrorIs(t, err, ErrDuplicateDevice)
		}
	})
	t.Run("store reused", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		store := rendezvous.NewMemoryStore()
		_, err := Discover(ctx, store, 0, 1, member(0, "a", 0))
		require.NoError(t, err)
		_, err = Discover(ctx, store, 0, 1, member(0, "a", 0))
		require.ErrorContains(t, err, "used before")
	})
	t.Run("bad arguments", func(t *testing.T) {
		ctx := context.Background()
		_, err := Discover(ctx, rendezvous.NewMemoryStore(), 2, 2, Member{})
		require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
		_, err = Discover(ctx, rendezvous.NewMemoryStore(), 0, 0, Member{})
		require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	})
}

// IntraSplit returns the CommSplit color and key of this rank's intra-machine
// communicator: ranks of one machine share the color, and the key orders
// them by local index.
func (l *Layout) IntraSplit() (color, key int) { return l.Grid.Machine, l.Grid.Local }

// RailSplit returns the CommSplit color and key of this rank's rail
// communicator: ranks of one local index share the color, and the key
// orders them by machine index.
func (l *Layout) RailSplit() (color, key int) { return l.Grid.Local, l.Grid.Machine }
