package setup_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/hier/setup"
	"github.com/fairgo/fairgo/internal/reftest"
	"github.com/fairgo/fairgo/rendezvous"
	"github.com/fairgo/fairgo/sim"
	"github.com/fairgo/fairgo/topology"
)

// job plays the processes of a launch on one box: process p is global rank
// p, on the machine machineOf[p], with the environment fairrun would give it.
type job struct {
	machineOf []string
	storeAddr string // TCP store; "" uses mem
	mem       rendezvous.Store
}

// env is process p's launch environment.
func (j job) env(p int) rendezvous.LookupFunc {
	local, perMachine := 0, 0
	for q, m := range j.machineOf {
		if m == j.machineOf[p] {
			if q < p {
				local++
			}
			perMachine++
		}
	}
	vars := map[string]string{
		"RANK": strconv.Itoa(p), "WORLD_SIZE": strconv.Itoa(len(j.machineOf)),
		"LOCAL_RANK": strconv.Itoa(local), "LOCAL_WORLD_SIZE": strconv.Itoa(perMachine),
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
		"FAIRGO_MACHINE_ID": j.machineOf[p],
	}
	if j.storeAddr != "" {
		vars["FAIRGO_STORE_ADDR"] = j.storeAddr
	}
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

// opts are the setup options of process p: its own environment, and no
// NVML, so that devices are "cuda:LOCAL_RANK" whatever the test machine has.
func (j job) opts(p int, extra ...setup.Option) []setup.Option {
	self := topology.Self{NoNVML: true, Host: topology.Host{Hostname: func() (string, error) { return "testbox", nil }}}
	return append([]setup.Option{setup.WithEnv(j.env(p)), setup.WithSelf(self)}, extra...)
}

// store is what process p passes to setup.New: nil over TCP (New dials
// FAIRGO_STORE_ADDR itself), else the shared memory store.
func (j job) store() rendezvous.Store {
	if j.storeAddr != "" {
		return nil
	}
	return j.mem
}

// startTCP serves a store for the test's lifetime and returns its address.
func startTCP(t *testing.T) string {
	t.Helper()
	srv, err := rendezvous.Listen("127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return srv.Addr()
}

// shuffledMachines places M×D processes on M machines in a random global
// rank order and returns the machine of each process and the grid topology
// must compute for it (machines by smallest rank, locals by rank).
func shuffledMachines(rng *rand.Rand, m, d int) ([]string, []hier.Grid) {
	w := m * d
	perm := rng.Perm(w)
	machineOf := make([]string, w)
	for p := range w {
		machineOf[p] = fmt.Sprintf("box%d", perm[p]/d)
	}
	grids := make([]hier.Grid, w)
	var order []string // machines by smallest global rank
	for _, id := range machineOf {
		if !slices.Contains(order, id) {
			order = append(order, id)
		}
	}
	for p, id := range machineOf {
		local := 0
		for q := range p {
			if machineOf[q] == id {
				local++
			}
		}
		grids[p] = hier.Grid{Machines: m, Devices: d, Machine: slices.Index(order, id), Local: local}
	}
	return machineOf, grids
}

// spawn runs fn for every process concurrently and returns their errors.
func spawn(n int, fn func(p int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for p := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs[p] = fn(p) }()
	}
	wg.Wait()
	return errs
}

// simDevice returns the sim device behind a Reducer.
func simDevice(t testing.TB, r *hier.Reducer) *sim.Device {
	d, ok := r.Device().(*sim.Device)
	require.True(t, ok, "device %T", r.Device())
	return d
}

type newCase struct {
	dt    fairgo.DType
	op    fairgo.Op
	count int
}

var newCases = []newCase{
	{fairgo.Float32, fairgo.Sum, 4099},
	{fairgo.BFloat16, fairgo.Avg, 1001},
	{fairgo.Int32, fairgo.Max, 777},
	{fairgo.Float64, fairgo.Prod, 65},
}

// runProcesses builds one Reducer per process with setup.New, runs every
// case on them (each process uploading its own input) and checks the
// results against the reference and the grids against expectations.
func runProcesses(t *testing.T, j job, grids []hier.Grid, seed uint64) {
	t.Helper()
	w := len(j.machineOf)
	b := sim.NewBackend(sim.Config{Seed: int64(seed), Jitter: 5 * time.Microsecond})
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs := make([]*hier.Reducer, w)
	errs := spawn(w, func(p int) error {
		r, err := setup.New(
			ctx,
			j.store(),
			b,
			j.opts(p, setup.WithReducer(hier.WithFlatThreshold(hier.FlatNever), hier.WithSliceSize(1024)))...)
		rs[p] = r
		return err
	})
	t.Cleanup(func() { require.NoError(t, hier.CloseAll(rs)) })
	require.NoError(t, errors.Join(errs...))
	for p, r := range rs {
		require.Equal(t, grids[p], r.Grid(), "process %d", p)
		require.Equal(t, p, r.WorldRank())
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	for _, c := range newCases {
		inputs := reftest.RandomInputs(rng, c.dt, c.op, w, c.count)
		outputs := make([][]byte, w)
		errs := spawn(w, func(p int) error {
			dev := simDevice(t, rs[p])
			tn, err := dev.AllocTensor(int64(c.count), c.dt)
			if err != nil {
				return err
			}
			defer dev.Free(tn.Ptr)
			if err := dev.Upload(tn.Ptr, inputs[p]); err != nil {
				return err
			}
			if err := rs[p].AllReduce(ctx, tn, c.op).Wait(ctx); err != nil {
				return err
			}
			outputs[p] = make([]byte, len(inputs[p]))
			return dev.Download(outputs[p], tn.Ptr)
		})
		require.NoError(t, errors.Join(errs...), "%v %v", c.dt, c.op)
		require.NoError(
			t,
			reftest.CheckResults(c.dt, reftest.ComputeReference(c.dt, c.op, inputs), outputs),
			"%v %v",
			c.dt,
			c.op,
		)
	}
}

func TestNewProcesses(t *testing.T) {
	for _, store := range []string{"memory", "tcp"} {
		for _, g := range [][2]int{{2, 2}, {3, 2}, {2, 3}, {1, 3}, {3, 1}, {1, 1}} {
			t.Run(fmt.Sprintf("%s/%dx%d", store, g[0], g[1]), func(t *testing.T) {
				seed := uint64(g[0]*10 + g[1])
				machineOf, grids := shuffledMachines(rand.New(rand.NewPCG(seed, 1)), g[0], g[1])
				j := job{machineOf: machineOf, mem: rendezvous.NewMemoryStore()}
				if store == "tcp" {
					j.storeAddr = startTCP(t)
				}
				runProcesses(t, j, grids, seed)
			})
		}
	}
}

// Processes that each drive several devices (NewLocal): two processes of
// two devices on machines of their own make a 2×2 grid, and one process
// alone needs no launcher.
func TestNewLocal(t *testing.T) {
	t.Run("2 processes × 2 devices", func(t *testing.T) {
		j := job{machineOf: []string{"b", "a"}, storeAddr: startTCP(t)}
		b := sim.NewBackend(sim.Config{Seed: 3})
		defer b.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		rs := make([][]*hier.Reducer, 2)
		errs := spawn(2, func(p int) error {
			var err error
			rs[p], err = setup.NewLocal(
				ctx,
				nil,
				b,
				[]int{1, 0},
				j.opts(p, setup.WithReducer(hier.WithFlatThreshold(hier.FlatNever)))...)
			return err
		})
		require.NoError(t, errors.Join(errs...))
		all := append(slices.Clone(rs[0]), rs[1]...)
		defer func() { require.NoError(t, hier.CloseAll(all)) }()
		for g, r := range all {
			require.Equal(t, g, r.WorldRank())
			// process p holds ranks 2p, 2p+1 on machine p; locals by rank.
			require.Equal(t, hier.Grid{Machines: 2, Devices: 2, Machine: g / 2, Local: g % 2}, r.Grid())
		}
		checkAllReduce(t, ctx, all, newCases[0])
	})
	t.Run("single process", func(t *testing.T) {
		b := sim.NewBackend(sim.Config{Seed: 4})
		defer b.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		rs, err := setup.NewLocal(
			ctx,
			nil,
			b,
			[]int{0, 1, 2},
			setup.WithLaunch(rendezvous.Launch{WorldSize: 1, LocalWorldSize: 1}),
			setup.WithEnv(func(string) (string, bool) { return "", false }),
			setup.WithSelf(
				topology.Self{
					NoNVML: true,
					Host:   topology.Host{Hostname: func() (string, error) { return "solo", nil }},
				},
			),
		)
		require.NoError(t, err)
		defer func() { require.NoError(t, hier.CloseAll(rs)) }()
		require.Len(t, rs, 3)
		require.Equal(t, hier.Grid{Machines: 1, Devices: 3, Machine: 0, Local: 2}, rs[2].Grid())
		checkAllReduce(t, ctx, rs, newCases[1])
	})
}

// checkAllReduce runs one case on reducers held by this process.
func checkAllReduce(t *testing.T, ctx context.Context, rs []*hier.Reducer, c newCase) {
	t.Helper()
	inputs := reftest.RandomInputs(rand.New(rand.NewPCG(11, 12)), c.dt, c.op, len(rs), c.count)
	ts := make([]fairgo.Tensor, len(rs))
	works := make([]*hier.Work, len(rs))
	for g, r := range rs {
		dev := simDevice(t, r)
		var err error
		ts[g], err = dev.AllocTensor(int64(c.count), c.dt)
		require.NoError(t, err)
		require.NoError(t, dev.Upload(ts[g].Ptr, inputs[g]))
	}
	for g, r := range rs {
		works[g] = r.AllReduce(ctx, ts[g], c.op)
	}
	require.NoError(t, reftest.WaitAll(works))
	outputs := make([][]byte, len(rs))
	for g, r := range rs {
		outputs[g] = make([]byte, len(inputs[g]))
		require.NoError(t, simDevice(t, r).Download(outputs[g], ts[g].Ptr))
	}
	require.NoError(t, reftest.CheckResults(c.dt, reftest.ComputeReference(c.dt, c.op, inputs), outputs))
}

// newErr runs every process of j with setup.New under a short deadline and
// returns their errors (closing any Reducer that was built).
func newErrs(t *testing.T, j job, procs []int, timeout time.Duration) []error {
	t.Helper()
	b := sim.NewBackend(sim.Config{})
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return spawn(len(procs), func(i int) error {
		r, err := setup.New(ctx, j.store(), b, j.opts(procs[i])...)
		if err == nil {
			_ = r.Close()
			return errors.New("setup.New succeeded")
		}
		return err
	})
}

func TestNewIrregularGrid(t *testing.T) {
	j := job{machineOf: []string{"a", "b", "a"}, mem: rendezvous.NewMemoryStore()}
	for p, err := range newErrs(t, j, []int{0, 1, 2}, 10*time.Second) {
		require.ErrorIs(t, err, topology.ErrIrregular, "process %d", p)
		var se *setup.Error
		require.ErrorAs(t, err, &se)
		require.Equal(t, "discover", se.Step)
		require.Equal(t, []int{p}, se.Ranks)
		require.Contains(t, err.Error(), `machine "b"`)
	}
}

func TestNewRankNeverJoins(t *testing.T) {
	for _, store := range []string{"memory", "tcp"} {
		t.Run(store, func(t *testing.T) {
			j := job{machineOf: []string{"a", "a", "b", "b"}, mem: rendezvous.NewMemoryStore()}
			if store == "tcp" {
				j.storeAddr = startTCP(t)
			}
			start := time.Now()
			errs := newErrs(t, j, []int{0, 1, 3}, 300*time.Millisecond) // rank 2 never starts
			require.Less(t, time.Since(start), 10*time.Second)
			for _, err := range errs {
				require.ErrorIs(t, err, context.DeadlineExceeded)
				require.ErrorIs(t, err, topology.ErrIncomplete)
				var ie *topology.IncompleteError
				require.ErrorAs(t, err, &ie)
				require.Equal(t, []int{2}, ie.Missing)
				require.Len(t, ie.Machines, 2) // what a and b reported
				require.Contains(t, err.Error(), "missing ranks [2]")
			}
		})
	}
}

// The process holding rank 0 dies after discovery: the others wait for its
// backend's rendezvous only until their context ends.
func TestNewBackendWaitHonoursContext(t *testing.T) {
	j := job{machineOf: []string{"a", "b"}, mem: rendezvous.NewMemoryStore()}
	b := sim.NewBackend(sim.Config{})
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	errs := spawn(2, func(p int) error {
		var be setup.Backend = b
		if p == 0 {
			be = failingBackend{}
		}
		r, err := setup.New(ctx, j.store(), be, j.opts(p)...)
		if err == nil {
			_ = r.Close()
		}
		return err
	})
	require.ErrorContains(t, errs[0], "no devices today")
	require.ErrorIs(t, errs[1], context.DeadlineExceeded)
	var se *setup.Error
	require.ErrorAs(t, errs[1], &se)
	require.Equal(t, "connect", se.Step)
}

type failingBackend struct{}

func (failingBackend) Connect(context.Context, backend.Store, backend.Job) ([]backend.Rank, error) {
	return nil, errors.New("no devices today")
}

func TestNewBadSetup(t *testing.T) {
	ctx := context.Background()
	b := sim.NewBackend(sim.Config{})
	defer b.Close()
	noEnv := setup.WithEnv(func(string) (string, bool) { return "", false })
	_, err := setup.New(ctx, nil, b, noEnv)
	require.ErrorIs(t, err, rendezvous.ErrNoLaunchEnv)

	_, err = setup.New(
		ctx,
		nil,
		b,
		noEnv,
		setup.WithLaunch(rendezvous.Launch{Rank: 2, WorldSize: 2, LocalWorldSize: 1}),
	)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	require.ErrorContains(t, err, "Rank")

	_, err = setup.New(ctx, nil, nil, noEnv)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)

	_, err = setup.NewLocal(ctx, nil, b, []int{0, 0}, noEnv)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	_, err = setup.NewLocal(ctx, nil, b, nil, noEnv)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)

	// A world of two without a store or its address.
	_, err = setup.New(ctx, nil, b, noEnv, setup.WithLaunch(rendezvous.Launch{WorldSize: 2, LocalWorldSize: 2}))
	var se *setup.Error
	require.ErrorAs(t, err, &se)
	require.Equal(t, "store", se.Step)

	// Invalid Reducer options fail before the rendezvous.
	j := job{machineOf: []string{"a"}, mem: rendezvous.NewMemoryStore()}
	_, err = setup.New(ctx, j.store(), b, j.opts(0, setup.WithReducer(hier.WithParallelism(-1)))...)
	require.ErrorAs(t, err, &se)
	require.Equal(t, "options", se.Step)
	require.ErrorContains(t, err, "WithParallelism")

	// A store prefix used twice is caught by discovery.
	r, err := setup.New(ctx, j.store(), b, j.opts(0)...)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	_, err = setup.New(ctx, j.store(), b, j.opts(0)...)
	require.ErrorContains(t, err, "prefix was used before")
	r, err = setup.New(ctx, j.store(), b, j.opts(0, setup.WithStorePrefix("second"))...)
	require.NoError(t, err)
	require.NoError(t, r.Close())

	// A backend whose ranks contradict the layout is refused, and what it
	// made is released.
	lb := &lyingBackend{Backend: sim.NewBackend(sim.Config{})}
	defer lb.Close()
	j = job{machineOf: []string{"a", "a"}, mem: rendezvous.NewMemoryStore()}
	errs := spawn(2, func(p int) error {
		_, err := setup.New(ctx, j.store(), lb, j.opts(p)...)
		return err
	})
	for _, err := range errs {
		require.ErrorAs(t, err, &se)
		require.Equal(t, "connect", se.Step)
		require.ErrorContains(t, err, "discovery says")
	}
	require.Len(t, lb.devs, 2)
	for _, d := range lb.devs {
		_, err := d.NewStream()
		require.ErrorIs(t, err, fairgo.ErrClosed, "device %v was not closed", d)
	}
}

// lyingBackend swaps the grid coordinates of the ranks it returns.
type lyingBackend struct {
	*sim.Backend
	mu   sync.Mutex
	devs []*sim.Device
}

func (b *lyingBackend) Connect(ctx context.Context, store backend.Store, job backend.Job) ([]backend.Rank, error) {
	rks, err := b.Backend.Connect(ctx, store, job)
	for i := range rks {
		rks[i].Grid.Local = rks[i].Grid.Devices - 1 - rks[i].Grid.Local
		b.mu.Lock()
		b.devs = append(b.devs, rks[i].Device.(*sim.Device))
		b.mu.Unlock()
	}
	return rks, err
}

// Connect opens the ranks without a Reducer: the caller builds Reducers
// over them, one after the other, reaches the communicators, and releases
// the ranks; the grids are the ones discovery computes.
func TestConnect(t *testing.T) {
	machineOf, grids := shuffledMachines(rand.New(rand.NewPCG(5, 1)), 2, 2)
	j := job{machineOf: machineOf, storeAddr: startTCP(t)}
	b := sim.NewBackend(sim.Config{})
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ranks := make([]backend.Rank, len(machineOf))
	errs := spawn(len(machineOf), func(p int) error {
		rks, err := setup.Connect(ctx, j.store(), b, nil, j.opts(p)...)
		if err != nil {
			return err
		}
		if len(rks) != 1 {
			return fmt.Errorf("process %d got %d ranks", p, len(rks))
		}
		ranks[p] = rks[0]
		return nil
	})
	for p, err := range errs {
		require.NoError(t, err, "process %d", p)
	}
	for p, rk := range ranks {
		require.Equal(t, grids[p], rk.Grid, "process %d", p)
		require.False(t, rk.OwnsResources, "the caller owns Connect's ranks")
		require.NotNil(t, rk.Board, "the job's store is the board")
		require.NotNil(t, rk.Variants, "the backend's Variants pass through")
		require.Equal(t, p, rk.Comms.World.Rank())
	}
	for round := range 2 { // two Reducers in turn over the same ranks
		rs := make([]*hier.Reducer, len(ranks))
		for p, rk := range ranks {
			var err error
			rs[p], err = hier.NewReducer(ctx, rk)
			require.NoError(t, err, "round %d, process %d", round, p)
		}
		checkAllReduce(t, ctx, rs, newCases[round])
		require.NoError(t, hier.CloseAll(rs))
	}
	for p, rk := range ranks {
		require.NoError(t, rk.Release(), "process %d", p)
	}
}

func TestConnectBadDevices(t *testing.T) {
	for _, devices := range [][]int{{-1}, {0, 0}} {
		_, err := setup.Connect(context.Background(), nil, sim.NewBackend(sim.Config{}), devices)
		var se *setup.Error
		require.ErrorAs(t, err, &se)
		require.Equal(t, "options", se.Step)
		require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	}
}
