package hier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/rendezvous"
	"github.com/fairgo/fairgo/topology"
)

// Backend opens the devices of this process's ranks and builds their
// communicators, once topology discovery has given every rank the same
// layout. The CUDA backend (cuda.Backend, build tag cuda) and the simulated
// cluster (sim.Backend) implement it; New and NewLocal call it.
type Backend interface {
	// Connect returns one Rank per entry of job.Ranks, in that order, each
	// with its Device and its communicators (Grid may be left zero: the
	// caller fills it from the layout). Every process of the job calls it
	// concurrently with the same layout; store is shared by them all, under
	// a prefix of its own. On error it releases whatever it opened. Every
	// blocking step ends when ctx does.
	Connect(ctx context.Context, store rendezvous.Store, job Job) ([]Rank, error)
}

// Job is what a Backend is told: the layout every rank computed and the
// ranks this process drives.
type Job struct {
	Layout  *topology.Layout // the grid, the ranks of every machine and rail
	Ranks   []int            // global ranks this process drives, ascending
	Devices []int            // the CUDA device ordinal of each, parallel to Ranks
	Logger  *slog.Logger     // never nil
}

// DefaultStorePrefix is the store prefix New and NewLocal work under unless
// WithStorePrefix says otherwise.
const DefaultStorePrefix = "fairgo"

// setupConfig holds the options that only New and NewLocal read.
type setupConfig struct {
	env    rendezvous.LookupFunc
	launch *rendezvous.Launch
	self   *topology.Self
	prefix string
}

// WithEnv makes New and NewLocal read the launch variables, the machine
// identity and CUDA_VISIBLE_DEVICES through lookup instead of the process
// environment (tests run several "processes" as goroutines this way).
func WithEnv(lookup rendezvous.LookupFunc) Option {
	return func(c *config) { c.setup.env = lookup }
}

// WithLaunch gives New and NewLocal this process's place in the job instead
// of reading it from the launch environment. StoreAddr is only needed when
// the store passed is nil and WorldSize > 1.
func WithLaunch(l rendezvous.Launch) Option {
	return func(c *config) { c.setup.launch = &l }
}

// WithSelf sets how New and NewLocal describe this process to the others
// (machine identity, device facts): Ordinal is replaced by each rank's
// device, and a nil Host.Lookup by the WithEnv lookup. The default is
// topology.Self{} over the process environment, with NVML when available.
func WithSelf(s topology.Self) Option {
	return func(c *config) { c.setup.self = &s }
}

// WithStorePrefix sets the store prefix under which New and NewLocal meet
// the other ranks (default DefaultStorePrefix). Every rank must use the same
// one, and each group of Reducers built on one store needs its own.
func WithStorePrefix(prefix string) Option {
	return func(c *config) { c.setup.prefix = prefix }
}

// SetupError is the error of New and NewLocal: the step that failed, the
// global ranks this process was building (nil when not yet known), and the
// cause. Causes keep their types: a rank that never joined gives a
// *topology.IncompleteError, which lists what the others reported and
// unwraps to the context's error.
type SetupError struct {
	Step  string // "options", "launch", "store", "describe", "discover", "connect" or "reducer"
	Ranks []int
	Err   error
}

func (e *SetupError) Error() string {
	if e.Ranks == nil {
		return fmt.Sprintf("hier: setup: %s: %v", e.Step, e.Err)
	}
	return fmt.Sprintf("hier: setup of ranks %v: %s: %v", e.Ranks, e.Step, e.Err)
}

// Unwrap returns the cause.
func (e *SetupError) Unwrap() error { return e.Err }

// New builds the Reducer of this process's rank, for the common launch of
// one process per GPU (torchrun, Slurm, Open MPI, fairrun):
//
//	r, err := hier.New(ctx, nil, cuda.Backend{})
//	if err != nil { ... }
//	defer r.Close()
//
// It reads the launch environment (rendezvous.FromEnv), uses the CUDA
// device topology.DefaultOrdinal gives (0 when CUDA_VISIBLE_DEVICES names one
// device, else LOCAL_RANK), describes the process (topology.Self), meets
// every rank through store (nil: it dials the launcher's store, and closes
// it before returning) and runs topology.Discover, so that any global rank
// order gives one grid; then b.Connect opens the device and builds the
// communicators, and the Reducer owns them all: Close releases them.
//
// ctx bounds the whole setup; when a rank never joins, the error lists
// what the others reported. opts are the Reducer's options plus WithEnv,
// WithLaunch, WithSelf and WithStorePrefix. Errors are *SetupError.
func New(ctx context.Context, store rendezvous.Store, b Backend, opts ...Option) (*Reducer, error) {
	rs, err := build(ctx, store, b, nil, opts)
	if err != nil {
		return nil, err
	}
	return rs[0], nil
}

// NewLocal builds one Reducer per device for a process that drives several
// GPUs (one engine goroutine each). With k devices per process, the process
// of launch rank p holds global ranks p·k … p·k+k-1 of a world of
// WORLD_SIZE·k ranks, so every process must pass the same number of
// devices; a single process with WithLaunch(rendezvous.Launch{WorldSize: 1,
// LocalWorldSize: 1}) and a nil store needs no launcher. Otherwise it is New:
// discovery, b.Connect, Reducers that own their resources. Close them with
// CloseAll (NCCL may synchronise the ranks of a communicator when they are
// destroyed).
func NewLocal(ctx context.Context, store rendezvous.Store, b Backend, devices []int, opts ...Option) ([]*Reducer, error) {
	if len(devices) == 0 {
		return nil, &SetupError{Step: "options", Err: &fairgo.ArgError{Arg: "devices", Value: devices, Reason: "needs at least one device"}}
	}
	for i, d := range devices {
		if d < 0 || slices.Contains(devices[:i], d) {
			return nil, &SetupError{Step: "options", Err: &fairgo.ArgError{Arg: "devices", Value: devices, Reason: "needs distinct, non-negative ordinals (one rank per GPU in a process)"}}
		}
	}
	return build(ctx, store, b, devices, opts)
}

// CloseAll closes Reducers concurrently and joins their errors.
func CloseAll(rs []*Reducer) error {
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		if r == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Close(); err != nil && !errors.Is(err, fairgo.ErrClosed) {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// build is New (devices nil: one rank, the default ordinal) and NewLocal.
func build(ctx context.Context, store rendezvous.Store, b Backend, devices []int, opts []Option) ([]*Reducer, error) {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	s := c.setup
	log := c.logger
	if log == nil {
		log = slog.Default()
	}
	env := s.env
	if env == nil {
		env = os.LookupEnv
	}
	if b == nil {
		return nil, &SetupError{Step: "options", Err: &fairgo.ArgError{Arg: "backend", Value: nil, Reason: "missing"}}
	}
	// The Reducer's options are checked before anyone waits on this rank.
	if _, err := buildConfig(Grid{Machines: 1, Devices: 1}, opts); err != nil {
		return nil, &SetupError{Step: "options", Err: err}
	}

	// Where this process sits, and which global ranks it drives.
	var launch rendezvous.Launch
	if s.launch != nil {
		launch = *s.launch
		if err := checkLaunch(launch); err != nil {
			return nil, &SetupError{Step: "launch", Err: err}
		}
	} else {
		l, err := rendezvous.FromLookup(env)
		if err != nil {
			return nil, &SetupError{Step: "launch", Err: err}
		}
		launch = l
	}
	if devices == nil {
		devices = []int{topology.DefaultOrdinal(launch.LocalRank, env)}
	}
	k := len(devices)
	world := launch.WorldSize * k
	ranks := make([]int, k)
	for i := range ranks {
		ranks[i] = launch.Rank*k + i
	}
	fail := func(step string, err error) ([]*Reducer, error) {
		return nil, &SetupError{Step: step, Ranks: ranks, Err: err}
	}

	// The store: the caller's, the launcher's, or one in memory for a
	// single process.
	if store == nil {
		if launch.WorldSize == 1 {
			store = rendezvous.NewMemoryStore()
		} else {
			if launch.StoreAddr == "" {
				return fail("store", &fairgo.ArgError{Arg: "store", Value: nil, Reason: "nil, and the launch names no store address"})
			}
			cl, err := rendezvous.Dial(ctx, launch.StoreAddr)
			if err != nil {
				return fail("store", err)
			}
			store = cl
		}
		defer store.Close()
	}
	prefix := s.prefix
	if prefix == "" {
		prefix = DefaultStorePrefix
	}
	store = rendezvous.WithPrefix(store, prefix)

	// Describe every local rank, then meet the others.
	self := topology.Self{Logger: log}
	if s.self != nil {
		self = *s.self
	}
	if self.Host.Lookup == nil && s.env != nil {
		self.Host.Lookup = s.env
	}
	if self.Logger == nil {
		self.Logger = log
	}
	members := make([]topology.Member, k)
	for i, d := range devices {
		self.Ordinal = d
		m, err := self.Describe()
		if err != nil {
			return fail("describe", err)
		}
		members[i] = m
	}
	layouts := make([]*topology.Layout, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			layouts[i], errs[i] = topology.Discover(ctx, store, ranks[i], world, members[i])
		}()
	}
	wg.Wait()
	if err := firstError(errs); err != nil {
		return fail("discover", err)
	}
	layout := layouts[0]
	log.Debug("fairgo: topology discovered", "layout", layout.String(), "ranks", ranks, "devices", devices)

	// Devices and communicators.
	rks, err := b.Connect(ctx, rendezvous.WithPrefix(store, "backend"), Job{Layout: layout, Ranks: ranks, Devices: devices, Logger: log})
	if err != nil {
		return fail("connect", err)
	}
	if len(rks) != k {
		err := fmt.Errorf("backend returned %d ranks for %d", len(rks), k)
		return fail("connect", errors.Join(err, closeRanks(rks)))
	}
	for i := range rks {
		want := layout.GridOf(ranks[i])
		if rks[i].Grid == (Grid{}) {
			rks[i].Grid = want
		}
		rks[i].OwnsResources = true
		var bad error
		switch w := rks[i].Comms.World; {
		case rks[i].Grid != want:
			bad = fmt.Errorf("backend gave rank %d the grid %v; discovery says %v", ranks[i], rks[i].Grid, want)
		case w != nil && w.Rank() != ranks[i]:
			bad = fmt.Errorf("backend gave rank %d a world communicator in which it is rank %d", ranks[i], w.Rank())
		}
		if bad != nil {
			return fail("connect", errors.Join(bad, closeRanks(rks)))
		}
	}

	// One Reducer per rank; each owns its rank's resources from here on.
	rs := make([]*Reducer, k)
	for i := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs[i], errs[i] = NewReducer(ctx, rks[i], opts...)
		}()
	}
	wg.Wait()
	if err := firstError(errs); err != nil {
		// NewReducer may or may not have released a failed rank's
		// resources; closing is idempotent in both backends.
		var cerrs []error
		for i, r := range rs {
			if r == nil {
				cerrs = append(cerrs, closeRanks(rks[i:i+1]))
			}
		}
		cerrs = append(cerrs, CloseAll(rs))
		return fail("reducer", errors.Join(append([]error{err}, cerrs...)...))
	}
	return rs, nil
}

// checkLaunch validates a Launch given with WithLaunch.
func checkLaunch(l rendezvous.Launch) error {
	bad := func(field string, v int, why string) error {
		return &fairgo.ArgError{Arg: "WithLaunch " + field, Value: v, Reason: why}
	}
	switch {
	case l.WorldSize < 1:
		return bad("WorldSize", l.WorldSize, "must be at least 1")
	case l.Rank < 0 || l.Rank >= l.WorldSize:
		return bad("Rank", l.Rank, fmt.Sprintf("outside [0, %d)", l.WorldSize))
	case l.LocalWorldSize < 1 || l.LocalWorldSize > l.WorldSize:
		return bad("LocalWorldSize", l.LocalWorldSize, fmt.Sprintf("outside [1, %d]", l.WorldSize))
	case l.LocalRank < 0 || l.LocalRank >= l.LocalWorldSize:
		return bad("LocalRank", l.LocalRank, fmt.Sprintf("outside [0, %d)", l.LocalWorldSize))
	}
	return nil
}

// firstError returns the first error that is not merely a sibling's
// cancellation, else the first error.
func firstError(errs []error) error {
	var first error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if first == nil {
			first = err
		}
		if !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return first
}

// closeRanks releases ranks a Reducer does not own (yet): communicators
// first, then the device, each rank on its own goroutine.
func closeRanks(rks []Rank) error {
	errs := make([]error, len(rks))
	var wg sync.WaitGroup
	for i, rk := range rks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var es []error
			for _, cm := range (&Reducer{comms: rk.Comms}).commList() {
				es = append(es, cm.Close())
			}
			if rk.Device != nil {
				es = append(es, rk.Device.Close())
			}
			errs[i] = errors.Join(es...)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("releasing: %w", err)
	}
	return nil
}
