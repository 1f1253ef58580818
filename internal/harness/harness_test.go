package harness

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/cuda"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/elem"
	"github.com/fairgo/fairgo/rendezvous"
)

func TestSimTestbedRunsAnAllReduce(t *testing.T) {
	ctx := context.Background()
	tb, err := OpenSim(Spec{Machines: 2, Devices: 3, Seed: 1, Jitter: 20 * time.Microsecond})
	require.NoError(t, err)
	defer func() { require.NoError(t, tb.Close()) }()
	info := tb.Info()
	require.Equal(t, "sim", info.Backend)
	require.True(t, info.SimTimings)
	require.Equal(t, 6, info.World())
	require.Len(t, info.GPUs, 6)
	require.Empty(t, info.Invalid())
	require.True(t, tb.Root())
	require.NoError(t, tb.Barrier(ctx))
	blobs, err := tb.Gather(ctx, "k", []byte("x"))
	require.NoError(t, err)
	require.Equal(t, [][]byte{[]byte("x")}, blobs)

	reds, err := tb.Reducers(ctx, hier.WithFlatThreshold(hier.FlatNever))
	require.NoError(t, err)
	const n = 1001
	ts := make([]fairgo.Tensor, len(tb.Ranks()))
	err = tb.ForRanks(func(i int, r *Rank) error {
		require.Equal(t, i, r.WorldRank)
		x, err := r.Alloc(n, fairgo.Float32)
		if err != nil {
			return err
		}
		buf := make([]byte, n*4)
		for j := range n {
			elem.Set(fairgo.Float32, buf, j, float64(r.WorldRank+j))
		}
		ts[i] = x
		return r.Upload(x, buf)
	})
	require.NoError(t, err)
	err = tb.ForRanks(func(i int, r *Rank) error {
		d, err := r.Time(ctx, func() error {
			w := reds[i].AllReduce(ctx, ts[i], fairgo.Sum, hier.After(r.Stream))
			if err := w.StreamWait(ctx, r.Stream); err != nil {
				return err
			}
			return w.Wait(ctx)
		})
		if err == nil && d <= 0 {
			err = fmt.Errorf("time %v", d)
		}
		return err
	})
	require.NoError(t, err)
	err = tb.ForRanks(func(i int, r *Rank) error {
		out, err := r.Download(ts[i])
		if err != nil {
			return err
		}
		for j := range n {
			if got, want := elem.Get(fairgo.Float32, out, j), float64(15+6*j); got != want {
				return fmt.Errorf("element %d = %g, want %g", j, got, want)
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Error(t, tb.Ranks()[0].Upload(ts[0].Slice(0, 1), make([]byte, 8)), "more bytes than the tensor")
	require.NoError(t, tb.Close())
	require.NoError(t, tb.Close(), "closing twice")
	_, err = tb.Reducers(ctx)
	require.Error(t, err)
}

func TestOpen(t *testing.T) {
	_, err := Open(context.Background(), "tpu", Spec{Machines: 1, Devices: 1})
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	_, err = OpenSim(Spec{Machines: 0, Devices: 1})
	require.Error(t, err)
	if _, cerr := cuda.Count(); cerr != nil && !UnderLauncher() {
		// The GPU backend is in every build; without a driver or GPU it
		// reports fairgo.ErrNoDevice.
		_, err = Open(context.Background(), "cuda", Spec{Machines: 1, Devices: 1})
		require.ErrorIs(t, err, fairgo.ErrNoDevice)
	}
	tb, err := Open(context.Background(), "sim", Spec{Machines: 1, Devices: 2})
	require.NoError(t, err)
	require.NoError(t, tb.Close())
}

// TestGroup runs barriers and gathers of three processes over one store.
func TestGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store := rendezvous.NewMemoryStore()
	const size = 3
	got := make([][][]byte, size)
	all := make([][][]byte, size)
	var wg sync.WaitGroup
	errs := make([]error, size)
	for p := range size {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tb := &Testbed{group: &group{store: store, rank: p, size: size}}
			for range 3 {
				if err := tb.Barrier(ctx); err != nil {
					errs[p] = err
					return
				}
			}
			var err error
			if got[p], err = tb.Gather(ctx, "g", []byte{byte(p)}); err != nil {
				errs[p] = err
				return
			}
			all[p], errs[p] = tb.group.gather(ctx, "all", []byte{byte(10 + p)}, true)
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.Equal(t, [][]byte{{0}, {1}, {2}}, got[0])
	require.Nil(t, got[1])
	for p := range size {
		require.Equal(t, [][]byte{{10}, {11}, {12}}, all[p])
	}
}

func TestPlacement(t *testing.T) {
	tests := []struct {
		name  string
		seats []Seat
		want  Placement
	}{
		{
			"one GPU each",
			[]Seat{{0, "h/0", ""}, {0, "h/1", ""}, {1, "h/2", ""}, {1, "h/3", ""}},
			Placement{RanksPerGPU: 1},
		},
		{
			"2x2 on two GPUs",
			[]Seat{{0, "h/0", ""}, {0, "h/1", ""}, {1, "h/0", ""}, {1, "h/1", ""}},
			Placement{RanksPerGPU: 2, SharedAcrossMachines: true},
		},
		{
			"two ranks of one machine share",
			[]Seat{{0, "h/0", ""}, {0, "h/0", ""}, {1, "h/1", ""}},
			Placement{RanksPerGPU: 2},
		},
		{
			"4x2 on two GPUs",
			[]Seat{
				{0, "h/0", ""},
				{0, "h/1", ""},
				{1, "h/0", ""},
				{1, "h/1", ""},
				{2, "h/0", ""},
				{2, "h/1", ""},
				{3, "h/0", ""},
				{3, "h/1", ""},
			},
			Placement{RanksPerGPU: 4, SharedAcrossMachines: true},
		},
		{"other hosts", []Seat{{0, "a/0", ""}, {1, "b/0", ""}}, Placement{RanksPerGPU: 1}},
		{
			"2x2 on one GPU, every rank its own NCCL host",
			[]Seat{{0, "h/0", "h-emu0-d0"}, {0, "h/0", "h-emu0-d1"}, {1, "h/0", "h-emu1-d0"}, {1, "h/0", "h-emu1-d1"}},
			Placement{RanksPerGPU: 4, SharedAcrossMachines: true, NCCLHosts: 4},
		},
		{
			"4x2 on two GPUs, one NCCL host per machine",
			[]Seat{{0, "h/0", "e0"}, {0, "h/1", "e0"}, {1, "h/0", "e1"}, {1, "h/1", "e1"},
				{2, "h/0", "e2"}, {2, "h/1", "e2"}, {3, "h/0", "e3"}, {3, "h/1", "e3"}},
			Placement{RanksPerGPU: 4, SharedAcrossMachines: true, NCCLHosts: 4},
		},
		{"one NCCL host unknown", []Seat{{0, "h/0", "e0"}, {1, "h/1", ""}}, Placement{RanksPerGPU: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, PlacementOf(tc.seats))
		})
	}
}

// Flat NCCL is topology-unaware when machines hold several ranks and every
// rank is an NCCL host of its own; the ideal's M stays the machines.
func TestFlatTopologyUnaware(t *testing.T) {
	tests := []struct {
		name string
		info Info
		want bool
	}{
		{"2x2 on one GPU: 4 NCCL hosts", Info{Machines: 2, Devices: 2, Placement: Placement{NCCLHosts: 4}}, true},
		{"2x4 on one GPU: 8 NCCL hosts", Info{Machines: 2, Devices: 4, Placement: Placement{NCCLHosts: 8}}, true},
		{"4x2 on two GPUs: an NCCL host per machine", Info{Machines: 4, Devices: 2, Placement: Placement{NCCLHosts: 4},
			Emulation: Emulation{Intra: IntraNVLink}}, false},
		{
			"Mx1: nothing inside a machine to know",
			Info{Machines: 4, Devices: 1, Placement: Placement{NCCLHosts: 4}},
			false,
		},
		{
			"hosts unknown, the launcher says loopback",
			Info{Machines: 2, Devices: 2, Emulation: Emulation{Intra: IntraLoopback}},
			true,
		},
		{"hosts unknown, NVLink", Info{Machines: 2, Devices: 2, Emulation: Emulation{Intra: IntraNVLink}}, false},
		{"nothing told", Info{Machines: 2, Devices: 2}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.info.FlatTopologyUnaware())
		})
	}
}

func TestIntraLink(t *testing.T) {
	require.Equal(
		t,
		"emulated (loopback TCP, shaped to 20 Gbit/s)",
		Emulation{Intra: IntraLoopback, NVLinkGbit: 20}.IntraLink(),
	)
	require.Equal(t, "emulated (loopback TCP, not shaped)", Emulation{Intra: IntraLoopback}.IntraLink())
	require.Equal(t, "GPU to GPU (NVLink where the GPUs have it)", Emulation{Intra: IntraNVLink}.IntraLink())
	require.Empty(t, Emulation{NVLinkGbit: 20}.IntraLink(), "not told")
}

// On the simulated cluster AlgoWorld is a world communicator of its own
// per rank and algorithm: made once, right sums, closed with the testbed;
// RingWorld is the ring's.
func TestAlgoWorldSim(t *testing.T) {
	ctx := context.Background()
	tb, err := OpenSim(Spec{Machines: 2, Devices: 2})
	require.NoError(t, err)
	made := map[backend.NCCLAlgo][]backend.Comm{}
	for _, algo := range []backend.NCCLAlgo{backend.AlgoRing, backend.AlgoTree} {
		comms, err := tb.AlgoWorld(ctx, algo)
		require.NoError(t, err)
		require.Len(t, comms, 4)
		require.Equal(t, "flat-"+string(algo), comms[0].Name())
		again, err := tb.AlgoWorld(ctx, algo)
		require.NoError(t, err)
		require.Equal(t, comms, again, "made once")
		made[algo] = comms
		testFlatSum(t, tb, comms)
	}
	require.NotEqual(t, made[backend.AlgoRing][0], made[backend.AlgoTree][0], "one per algorithm")
	ring, err := tb.RingWorld(ctx)
	require.NoError(t, err)
	require.Equal(t, made[backend.AlgoRing], ring)
	_, err = tb.AlgoWorld(ctx, "nvls")
	var ae *fairgo.ArgError
	require.ErrorAs(t, err, &ae)

	require.NoError(t, tb.Close())
	require.ErrorIs(t, ring[0].Err(), fairgo.ErrClosed)
	_, err = tb.RingWorld(ctx)
	require.NoError(t, err, "made before Close: the same handles")
	tb2, err := OpenSim(Spec{Machines: 1, Devices: 2})
	require.NoError(t, err)
	require.NoError(t, tb2.Close())
	_, err = tb2.AlgoWorld(ctx, backend.AlgoTree)
	require.ErrorIs(t, err, fairgo.ErrClosed)
}

// testFlatSum sums over comms, one per rank of tb, and checks the result.
func testFlatSum(t *testing.T, tb *Testbed, comms []backend.Comm) {
	t.Helper()
	ctx := context.Background()
	n := len(comms)
	ts := make([]fairgo.Tensor, n)
	require.NoError(t, tb.ForRanks(func(i int, r *Rank) error {
		if comms[i].Rank() != r.WorldRank || comms[i].Size() != n || comms[i] == r.Hier.Comms.World {
			return fmt.Errorf(
				"communicator %v: rank %d of %d, want %d of %d, and not the world communicator",
				comms[i],
				comms[i].Rank(),
				comms[i].Size(),
				r.WorldRank,
				n,
			)
		}
		x, err := r.Alloc(3, fairgo.Float32)
		if err != nil {
			return err
		}
		buf := make([]byte, 12)
		for j := range 3 {
			elem.Set(fairgo.Float32, buf, j, float64(r.WorldRank*(j+1)))
		}
		if err := r.Upload(x, buf); err != nil {
			return err
		}
		ts[i] = x
		_, err = r.Time(
			ctx,
			func() error { return comms[i].AllReduce(x.Ptr, x.Ptr, 3, fairgo.Float32, fairgo.Sum, r.Stream) },
		)
		return err
	}))
	tri := float64(n * (n - 1) / 2)
	require.NoError(t, tb.ForRanks(func(i int, r *Rank) error {
		out, err := r.Download(ts[i])
		if err != nil {
			return err
		}
		for j := range 3 {
			if got, want := elem.Get(fairgo.Float32, out, j), tri*float64(j+1); got != want {
				return fmt.Errorf("element %d = %g, want %g", j, got, want)
			}
		}
		return nil
	}))
}

func TestInvalid(t *testing.T) {
	shared := Placement{RanksPerGPU: 2, SharedAcrossMachines: true}
	tests := []struct {
		name    string
		info    Info
		invalid bool
	}{
		{"one rank per GPU", Info{Placement: Placement{RanksPerGPU: 1}}, false},
		{"shared without MPS", Info{Placement: shared}, true},
		{"shared, MPS unknown", Info{Placement: shared, Emulation: Emulation{Machines: 2}}, true},
		{"shared under MPS", Info{Placement: shared, Emulation: Emulation{Machines: 2, MPS: true}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.invalid, tc.info.Invalid() != "", tc.info.Invalid())
		})
	}
}

func TestEmulationFromEnv(t *testing.T) {
	env := func(kv ...string) rendezvous.LookupFunc {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	tests := []struct {
		name string
		env  rendezvous.LookupFunc
		want Emulation
		bad  bool
	}{
		{"nothing", env(), Emulation{}, false},
		{"testbed", env(EnvMachines, "4", EnvNICGbit, "10", EnvNICLatency, "50us", EnvMPS, "1", EnvNetNS, "1"),
			Emulation{Machines: 4, NICGbit: 10, NICLatency: 50 * time.Microsecond, MPS: true, NetNS: true}, false},
		{"latency in microseconds", env(EnvNICLatency, "25"), Emulation{NICLatency: 25 * time.Microsecond}, false},
		{"no MPS", env(EnvMachines, "2", EnvMPS, "0", EnvNetNS, "0"), Emulation{Machines: 2}, false},
		{"empty values", env(EnvNICGbit, " "), Emulation{}, false},
		{"bad rate", env(EnvNICGbit, "ten"), Emulation{}, true},
		{"negative machines", env(EnvMachines, "-1"), Emulation{}, true},
		{"bad latency", env(EnvNICLatency, "soon"), Emulation{}, true},
		{"bad MPS", env(EnvMPS, "maybe"), Emulation{}, true},
		{
			"intra-machine link over the loopback, shaped",
			env(EnvMachines, "2", EnvIntra, "loopback", EnvNVLinkGbit, "20"),
			Emulation{Machines: 2, Intra: IntraLoopback, NVLinkGbit: 20},
			false,
		},
		{"NVLink, not shaped", env(EnvIntra, "nvlink", EnvNVLinkGbit, "0"), Emulation{Intra: IntraNVLink}, false},
		{"bad intra", env(EnvIntra, "pcie"), Emulation{}, true},
		{"bad loopback rate", env(EnvNVLinkGbit, "-1"), Emulation{}, true},
		{"NaN loopback rate", env(EnvNVLinkGbit, "NaN"), Emulation{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EmulationFromEnv(tc.env)
			if tc.bad {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	e := Emulation{Machines: 2, NICGbit: 10, MPS: true, NetNS: true}
	require.Equal(t, 1.25e9, e.NICBytesPerSecond())
	require.Contains(t, e.String(), "10 Gbit/s")
	require.Equal(t, "not emulated", Emulation{}.String())
	require.Equal(t, "not emulated", Emulation{Machines: 1}.String(), "one machine under fairrun")
	require.False(t, Emulation{Machines: 1}.Emulated())
	require.True(t, Emulation{Machines: 2}.Emulated())
}
