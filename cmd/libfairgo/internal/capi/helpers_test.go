package capi_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/cmd/libfairgo/internal/capi"
	"github.com/fairgo/fairgo/hier/setup"
	"github.com/fairgo/fairgo/rendezvous"
	"github.com/fairgo/fairgo/sim"
	"github.com/fairgo/fairgo/streams"
	"github.com/fairgo/fairgo/topology"
)

// simBackend is a capi.Backend over the simulated cluster. "Foreign"
// streams are sim streams the test registers under a handle of its choice,
// as a C caller would pass its own cudaStream_t.
type simBackend struct {
	*sim.Backend
	mu      sync.Mutex
	streams map[uintptr]*sim.Stream
	next    uintptr
	panics  bool // ForeignStream panics (for the Guard tests)
}

func newSimBackend(cfg sim.Config) *simBackend {
	return &simBackend{Backend: sim.NewBackend(cfg), streams: map[uintptr]*sim.Stream{}, next: 0x7000}
}

func (b *simBackend) ForeignStream(dev backend.Device, handle uintptr) (streams.Stream, error) {
	if b.panics {
		panic("simBackend: ForeignStream told to panic")
	}
	b.mu.Lock()
	s, ok := b.streams[handle]
	b.mu.Unlock()
	if !ok {
		return nil, &fairgo.ArgError{
			Arg:    "stream",
			Value:  fmt.Sprintf("%#x", handle),
			Reason: "not a registered stream",
		}
	}
	if s.Device() != dev {
		return nil, &fairgo.ArgError{
			Arg:    "stream",
			Value:  fmt.Sprintf("%#x", handle),
			Reason: fmt.Sprintf("belongs to %v, not %v", s.Device(), dev),
		}
	}
	return s, nil
}

// register creates a stream on dev, as the C caller's own, and returns
// its handle.
func (b *simBackend) register(t testing.TB, dev *sim.Device) (uintptr, *sim.Stream) {
	t.Helper()
	st, err := dev.NewStream()
	require.NoError(t, err)
	s := st.(*sim.Stream)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.next += 0x10
	b.streams[b.next] = s
	return b.next, s
}

// classes are the Classes of the sim backend.
var classes = capi.Classes{
	Mismatch: []error{sim.ErrMismatch},
	Backend:  []capi.Class{capi.Is(sim.ErrStall, capi.Timeout)},
}

// fixture is one test's table over a sim backend, with a shared in-memory
// store playing the launcher's.
type fixture struct {
	t   *testing.T
	b   *simBackend
	tbl *capi.Table
}

func newFixture(t *testing.T, cfg sim.Config) *fixture {
	t.Helper()
	b := newSimBackend(cfg)
	tbl := capi.NewTable(capi.Config{Backend: b, Classes: classes, Store: rendezvous.NewMemoryStore()})
	t.Cleanup(func() {
		require.NoError(t, tbl.CloseAll())
		require.NoError(t, b.Close())
	})
	return &fixture{t: t, b: b, tbl: tbl}
}

// env is process p's launch environment for processes on machineOf.
func env(machineOf []string, p int) rendezvous.LookupFunc {
	local, per := 0, 0
	for q, m := range machineOf {
		if m == machineOf[p] {
			if q < p {
				local++
			}
			per++
		}
	}
	vars := map[string]string{
		"RANK": strconv.Itoa(p), "WORLD_SIZE": strconv.Itoa(len(machineOf)),
		"LOCAL_RANK": strconv.Itoa(local), "LOCAL_WORLD_SIZE": strconv.Itoa(per),
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "FAIRGO_MACHINE_ID": machineOf[p],
	}
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

// launch is process p's explicit place in the job.
func launch(machineOf []string, p int) rendezvous.Launch {
	e := env(machineOf, p)
	n := func(k string) int { v, _ := e(k); i, _ := strconv.Atoi(v); return i }
	return rendezvous.Launch{
		Rank:           p,
		WorldSize:      len(machineOf),
		LocalRank:      n("LOCAL_RANK"),
		LocalWorldSize: n("LOCAL_WORLD_SIZE"),
	}
}

// procOptions are the Options of simulated process p: its environment
// (machine identity) and no NVML.
func procOptions(machineOf []string, p int, o capi.Options) capi.Options {
	self := topology.Self{
		NoNVML: true,
		Host:   topology.Host{Hostname: func() (string, error) { return "capi-test", nil }},
	}
	o.Setup = append(o.Setup, setup.WithEnv(env(machineOf, p)), setup.WithSelf(self))
	return o
}

// initRanks makes one communicator per process with InitRank, concurrently.
func (f *fixture) initRanks(machineOf []string, o capi.Options) []int64 {
	f.t.Helper()
	ids := make([]int64, len(machineOf))
	errs := spawn(len(machineOf), func(p int) error {
		var err error
		ids[p], err = f.tbl.InitRank(launch(machineOf, p), procOptions(machineOf, p, o))
		return err
	})
	for p, err := range errs {
		require.NoError(f.t, err, "rank %d", p)
	}
	return ids
}

// device is the sim device of a communicator.
func (f *fixture) device(id int64) *sim.Device {
	f.t.Helper()
	r, err := f.tbl.Reducer(id)
	require.NoError(f.t, err)
	d, ok := r.Device().(*sim.Device)
	require.True(f.t, ok)
	return d
}

// alloc allocates count elements of dt on dev.
func alloc(t testing.TB, dev *sim.Device, count int64, dt fairgo.DType) fairgo.Tensor {
	t.Helper()
	tn, err := dev.AllocTensor(count, dt)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dev.Free(tn.Ptr) })
	return tn
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

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// code is the result code of err under the sim classes.
func code(err error) capi.Code { return classes.Classify(err) }

// setupEnv is setup.WithEnv.
var setupEnv = setup.WithEnv
