// Package harness opens the ranks a program drives — every rank of a
// simulated cluster, several GPUs in one process, or one GPU per process
// under a launcher — as one Testbed, with a device, a stream and a timer per
// rank, and on demand world communicators on which NCCL runs its allreduce
// with one algorithm only (AlgoWorld). Info describes it, as the launcher
// told (FAIRGO_TESTBED_*: emulated machines, NICs, MPS, the intra-machine
// link) and as the ranks sit on GPUs and NCCL hosts. The benchmark harness, the examples and tests
// share it, and each opens its cluster by calling the opener it wants:
// there is no registry.
package harness

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/streams"
)

// Device is a rank's device as a program uses it: the engine's device (host
// copies included) and typed allocation. *sim.Device and *cuda.Device
// implement it.
type Device interface {
	backend.Device
	AllocTensor(count int64, dt fairgo.DType) (fairgo.Tensor, error)
}

// Spec is what the single-process openers need.
type Spec struct {
	Machines, Devices int           // the grid this process drives
	Seed              int64         // sim: seed of the random delays
	Jitter            time.Duration // sim: random delay before each device operation
}

// Rank is one rank this process drives. Its resources belong to the
// Testbed; use a Rank from one goroutine at a time.
type Rank struct {
	// Hier is the rank's grid place, device and communicators, for
	// hier.NewReducer (Testbed.Reducers makes one per rank).
	Hier backend.Rank
	// Device is the rank's device.
	Device Device
	// WorldRank is the rank's index in the world communicator.
	WorldRank int
	// Stream is a stream of the rank's device for the program's own work:
	// the benchmark enqueues and times on it.
	Stream streams.Stream

	timer  timer
	allocs []uintptr
}

// timer times the work a function enqueues on a rank's stream.
type timer interface {
	time(ctx context.Context, fn func() error) (time.Duration, error)
	close() error
}

// Alloc allocates count elements of dt on the rank's device; the Testbed's
// Close frees them.
func (r *Rank) Alloc(count int64, dt fairgo.DType) (fairgo.Tensor, error) {
	t, err := r.Device.AllocTensor(count, dt)
	if err != nil {
		return t, err
	}
	r.allocs = append(r.allocs, t.Ptr)
	return t, nil
}

// Upload copies data into t (synchronously; nothing to do for no data).
func (r *Rank) Upload(t fairgo.Tensor, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	if int64(len(data)) > t.ByteLen() {
		return &fairgo.ArgError{
			Arg:    "data",
			Value:  len(data),
			Reason: fmt.Sprintf("more bytes than the tensor's %d", t.ByteLen()),
		}
	}
	return r.Device.Upload(t.Ptr, data)
}

// Download returns a copy of t's bytes.
func (r *Rank) Download(t fairgo.Tensor) ([]byte, error) {
	out := make([]byte, t.ByteLen())
	if len(out) == 0 {
		return out, nil
	}
	return out, r.Device.Download(out, t.Ptr)
}

// Time runs fn, which enqueues work on Stream, and returns how long that
// work took: GPU time between two events on GPUs, wall clock until the
// stream is idle on the simulated cluster.
func (r *Rank) Time(ctx context.Context, fn func() error) (time.Duration, error) {
	return r.timer.time(ctx, fn)
}

// release frees the rank's allocations and its timer.
func (r *Rank) release() error {
	var errs []error
	for _, p := range r.allocs {
		errs = append(errs, r.Device.Free(p))
	}
	r.allocs = nil
	if r.timer != nil {
		errs = append(errs, r.timer.close())
	}
	return errors.Join(errs...)
}

// Testbed is the ranks of one process and how it meets the job's other
// processes. Open it with OpenSim, OpenCUDALocal, OpenCUDAProcess or Open;
// Close releases everything it made.
type Testbed struct {
	info  Info
	ranks []*Rank
	group *group // nil: this process is the whole job

	mu       sync.Mutex
	reducers []*hier.Reducer
	closers  []func() error // run last to first after the ranks are released
	closed   bool

	algoMu sync.Mutex
	algos  map[backend.NCCLAlgo][]backend.Comm // AlgoWorld's, once made
	// newAlgo is the opener's way to make AlgoWorld's; nil: none.
	newAlgo func(context.Context, backend.NCCLAlgo) ([]backend.Comm, error)
}

// Info describes the testbed.
func (t *Testbed) Info() Info { return t.info }

// Ranks are the ranks this process drives, ascending by world rank.
func (t *Testbed) Ranks() []*Rank { return t.ranks }

// Root reports whether this process prints and writes the results (the
// process of world rank 0).
func (t *Testbed) Root() bool { return t.group == nil || t.group.rank == 0 }

// Barrier returns once every process of the job has called it.
func (t *Testbed) Barrier(ctx context.Context) error {
	if t.group == nil {
		return nil
	}
	return t.group.barrier(ctx)
}

// Gather sends blob to the root process under key (unique per call): the
// root gets every process's blob in process order, the others get nil.
func (t *Testbed) Gather(ctx context.Context, key string, blob []byte) ([][]byte, error) {
	if t.group == nil {
		return [][]byte{blob}, nil
	}
	return t.group.gather(ctx, key, blob, false)
}

// ForRanks runs fn for every local rank, each on a goroutine of its own (the
// ranks of one process must enqueue collectives concurrently: each waits for
// its peers), and joins their errors.
func (t *Testbed) ForRanks(fn func(i int, r *Rank) error) error {
	errs := make([]error, len(t.ranks))
	var wg sync.WaitGroup
	for i, r := range t.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(i, r); err != nil {
				errs[i] = fmt.Errorf("rank %d: %w", r.WorldRank, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Reducers builds a hier.Reducer for every local rank with opts,
// concurrently (they rendezvous with each other). The Testbed closes them
// on Close; if one fails, those built are closed and the error returned.
func (t *Testbed) Reducers(ctx context.Context, opts ...hier.Option) ([]*hier.Reducer, error) {
	return t.ReducersOf(ctx, func(int) []hier.Option { return opts })
}

// ReducersOf is Reducers with the options of local rank i from opts(i)
// (options that name another Reducer of the rank, hier.WithRoutesOf).
func (t *Testbed) ReducersOf(ctx context.Context, opts func(i int) []hier.Option) ([]*hier.Reducer, error) {
	rs := make([]*hier.Reducer, len(t.ranks))
	err := t.ForRanks(func(i int, r *Rank) error {
		red, err := hier.NewReducer(ctx, r.Hier, opts(i)...)
		rs[i] = red
		return err
	})
	if err != nil {
		return nil, errors.Join(err, hier.CloseAll(rs))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errors.Join(fmt.Errorf("testbed: %w", fairgo.ErrClosed), hier.CloseAll(rs))
	}
	t.reducers = append(t.reducers, rs...)
	return rs, nil
}

// AlgoWorld returns, for each of Ranks, a world communicator of its own on
// which NCCL runs its allreduce with algo only (backend.AlgoRing or
// backend.AlgoTree; another is an *fairgo.ArgError): NCCL reads NCCL_ALGO
// when it initialises a communicator, and this one is the world
// communicator duplicated (ncclCommSplit) while NCCL_ALGO=allreduce:<algo>
// is set in the process environment, which is restored afterwards
// (cuda.DuplicateAlgo, whose window keeps concurrent splits of the process
// apart). On the simulated cluster it is a world communicator of its own
// (sim.Cluster.NewAlgoWorld: the sim has one algorithm). The first call
// for an algorithm makes them, and every process of the job must make it
// (NCCL's initialisation is collective); later calls return the same.
// Close destroys them.
func (t *Testbed) AlgoWorld(ctx context.Context, algo backend.NCCLAlgo) ([]backend.Comm, error) {
	t.algoMu.Lock()
	defer t.algoMu.Unlock()
	if comms := t.algos[algo]; comms != nil {
		return comms, nil
	}
	if t.newAlgo == nil {
		return nil, fmt.Errorf("testbed: this testbed cannot make a flat-%s world communicator", algo)
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("testbed: %w", fairgo.ErrClosed)
	}
	comms, err := t.newAlgo(ctx, algo)
	if err != nil {
		return nil, fmt.Errorf("testbed: the flat-%s world communicator: %w", algo, err)
	}
	closeComms := func() error {
		var errs []error
		for _, c := range comms {
			errs = append(errs, c.Close())
		}
		return errors.Join(errs...)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed { // closed meanwhile
		return nil, errors.Join(fmt.Errorf("testbed: %w", fairgo.ErrClosed), closeComms())
	}
	t.onClose(closeComms)
	if t.algos == nil {
		t.algos = map[backend.NCCLAlgo][]backend.Comm{}
	}
	t.algos[algo] = comms
	return comms, nil
}

// RingWorld is AlgoWorld(ctx, backend.AlgoRing): the flat ring baseline's
// communicators.
func (t *Testbed) RingWorld(ctx context.Context) ([]backend.Comm, error) {
	return t.AlgoWorld(ctx, backend.AlgoRing)
}

// Close closes the Reducers made by Reducers, releases every rank's
// allocations, stream and timer, then the communicators, devices and store
// the opener made. Closing twice does nothing.
func (t *Testbed) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	reds := t.reducers
	t.reducers = nil
	t.mu.Unlock()
	errs := []error{hier.CloseAll(reds)}
	for _, r := range t.ranks {
		errs = append(errs, r.release())
	}
	for i := len(t.closers) - 1; i >= 0; i-- {
		errs = append(errs, t.closers[i]())
	}
	return errors.Join(errs...)
}

// onClose adds a release step; steps run last to first.
func (t *Testbed) onClose(fn func() error) { t.closers = append(t.closers, fn) }

// closeOnError closes t and joins err with what that reports.
func (t *Testbed) closeOnError(err error) error { return errors.Join(err, t.Close()) }

// Open opens the testbed of a backend by name: "sim" (OpenSim), or "cuda":
// OpenCUDAProcess under a launcher of several processes (UnderLauncher),
// else OpenCUDALocal. Without a CUDA driver or GPU, "cuda" fails with an
// error that matches fairgo.ErrNoDevice.
func Open(ctx context.Context, backend string, s Spec) (*Testbed, error) {
	switch backend {
	case "sim":
		return OpenSim(s)
	case "cuda":
		if UnderLauncher() {
			return OpenCUDAProcess(ctx)
		}
		return OpenCUDALocal(s)
	}
	return nil, &fairgo.ArgError{Arg: "backend", Value: backend, Reason: "sim or cuda"}
}
