// Package setup builds hier.Reducers for the processes of a launched job:
// it reads the launch environment, meets the other ranks through a store,
// discovers the machine/device grid and asks a Backend for devices and
// communicators. The engine (package hier) knows none of this; trainers call
// setup.New once per process and then use the Reducer.
package setup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/logging"
	"github.com/fairgo/fairgo/rendezvous"
	"github.com/fairgo/fairgo/topology"
)

// Backend opens the devices and communicators of a process's ranks
// (cuda.Backend, sim.Backend).
type Backend = backend.Backend

// DefaultStorePrefix is the store prefix New and NewLocal work under unless
// WithStorePrefix says otherwise.
const DefaultStorePrefix = "fairgo"

// Option configures New and NewLocal.
type Option func(*config)

type config struct {
	env     rendezvous.LookupFunc
	launch  *rendezvous.Launch
	self    *topology.Self
	prefix  string
	logger  *slog.Logger
	reducer []hier.Option
}

// WithEnv makes New and NewLocal read the launch variables, the machine
// identity and CUDA_VISIBLE_DEVICES through lookup instead of the process
// environment (tests run several "processes" as goroutines this way).
func WithEnv(lookup rendezvous.LookupFunc) Option { return func(c *config) { c.env = lookup } }

// WithLaunch gives New and NewLocal this process's place in the job instead
// of reading it from the launch environment. StoreAddr is only needed when
// the store passed is nil and WorldSize > 1.
func WithLaunch(l rendezvous.Launch) Option { return func(c *config) { c.launch = &l } }

// WithSelf sets how New and NewLocal describe this process to the others
// (machine identity, device facts): Ordinal is replaced by each rank's
// device, and a nil Host.Lookup by the WithEnv lookup. The default is
// topology.Self{} over the process environment, with NVML when available.
func WithSelf(s topology.Self) Option { return func(c *config) { c.self = &s } }

// WithStorePrefix sets the store prefix under which New and NewLocal meet
// the other ranks (default DefaultStorePrefix). Every rank must use the same
// one, and each group of Reducers built on one store needs its own.
func WithStorePrefix(prefix string) Option { return func(c *config) { c.prefix = prefix } }

// WithLogger sets the logger of the setup and, unless WithReducer sets
// another, of the Reducers, used as given. Nil means logging.FromEnv over
// the WithEnv lookup: slog.Default()'s handler behind the level
// FAIRGO_LOG_LEVEL sets, warnings and errors only without it.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithReducer passes options to every Reducer built (hier.WithSliceSize,
// hier.WithTimeout, ...). They are validated before this rank waits on any
// other.
func WithReducer(opts ...hier.Option) Option {
	return func(c *config) { c.reducer = append(c.reducer, opts...) }
}

// Error is the error of New and NewLocal: the step that failed, the global
// ranks this process was building (nil when not yet known), and the cause.
// Causes keep their types: a rank that never joined gives a
// *topology.IncompleteError, which lists what the others reported and
// unwraps to the context's error.
type Error struct {
	Step  string // "options", "launch", "store", "describe", "discover", "connect" or "reducer"
	Ranks []int
	Err   error
}

func (e *Error) Error() string {
	if e.Ranks == nil {
		return fmt.Sprintf("setup: %s: %v", e.Step, e.Err)
	}
	return fmt.Sprintf("setup of ranks %v: %s: %v", e.Ranks, e.Step, e.Err)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// New builds the Reducer of this process's rank, for the common launch of
// one process per GPU (torchrun, Slurm, Open MPI, fairrun):
//
//	r, err := setup.New(ctx, nil, cuda.Backend{})
//	if err != nil { ... }
//	defer r.Close()
//
// It reads the launch environment (rendezvous.FromEnv), uses the CUDA
// device topology.DefaultOrdinal gives (0 when CUDA_VISIBLE_DEVICES names one
// device, else LOCAL_RANK), describes the process (topology.Self), meets
// every rank through store (nil: the launcher's store, closed when the
// Reducer closes; a store the caller passes must stay open as long as the
// Reducer, which leaves word of failures there) and runs topology.Discover, so that any global rank order
// gives one grid; then b.Connect opens the device and builds the
// communicators, and the Reducer owns them all: Close releases them.
//
// ctx bounds the whole setup; when a rank never joins, the error lists
// what the others reported. Errors are *Error.
func New(ctx context.Context, store rendezvous.Store, b Backend, opts ...Option) (*hier.Reducer, error) {
	if ctx == nil {
		return nil, &Error{
			Step: "options",
			Err:  &fairgo.ArgError{Arg: "ctx", Value: nil, Reason: "a nil context; use context.Background()"},
		}
	}
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
// hier.CloseAll (NCCL may synchronise the ranks of a communicator when they
// are destroyed).
func NewLocal(
	ctx context.Context,
	store rendezvous.Store,
	b Backend,
	devices []int,
	opts ...Option,
) ([]*hier.Reducer, error) {
	if err := checkDevices(ctx, devices, false); err != nil {
		return nil, err
	}
	return build(ctx, store, b, devices, opts)
}

// checkDevices validates the context and the devices of NewLocal and
// Connect (nil devices: the default one, when defaultOK).
func checkDevices(ctx context.Context, devices []int, defaultOK bool) error {
	bad := func(arg string, v any, why string) error {
		return &Error{Step: "options", Err: &fairgo.ArgError{Arg: arg, Value: v, Reason: why}}
	}
	if ctx == nil {
		return bad("ctx", nil, "a nil context; use context.Background()")
	}
	if len(devices) == 0 && !defaultOK {
		return bad("devices", devices, "needs at least one device")
	}
	for i, d := range devices {
		if d < 0 || slices.Contains(devices[:i], d) {
			return bad("devices", devices, "needs distinct, non-negative ordinals (one rank per GPU in a process)")
		}
	}
	return nil
}

// builder carries one New or NewLocal through its steps.
type builder struct {
	cfg     config
	log     *slog.Logger
	env     rendezvous.LookupFunc
	b       Backend
	launch  rendezvous.Launch
	devices []int
	ranks   []int // global ranks this process drives
	world   int
	store   rendezvous.Store        // prefixed
	owned   *rendezvous.LaunchStore // the store New opened itself, or nil
}

func (s *builder) fail(step string, err error) error {
	return &Error{Step: step, Ranks: s.ranks, Err: err}
}

// build is New (devices nil: one rank, the default ordinal) and NewLocal.
func build(
	ctx context.Context,
	store rendezvous.Store,
	b Backend,
	devices []int,
	opts []Option,
) ([]*hier.Reducer, error) {
	s, rks, err := open(ctx, store, b, devices, opts)
	if err != nil {
		return nil, err
	}
	rs, err := s.reducers(ctx, rks)
	if err != nil {
		if s.owned != nil {
			_ = s.owned.Close()
		}
		return nil, s.fail("reducer", err)
	}
	return rs, nil
}

// Connect opens this process's ranks of a launched job as New (devices
// nil) or NewLocal does, without building Reducers: the caller owns the
// ranks, builds Reducers over them with hier.NewReducer (one at a time:
// see NewReducer), and releases them with backend.Rank.Release once those
// are closed. Tests and benchmarks use it to reach the communicators
// themselves (a flat NCCL baseline on the same ranks). Each rank's Board
// is the job's store, and its Closers leave a store Connect opened.
func Connect(
	ctx context.Context,
	store rendezvous.Store,
	b Backend,
	devices []int,
	opts ...Option,
) ([]backend.Rank, error) {
	if err := checkDevices(ctx, devices, devices == nil); err != nil {
		return nil, err
	}
	s, rks, err := open(ctx, store, b, devices, opts)
	if err != nil {
		return nil, err
	}
	s.share(rks)
	for i := range rks {
		rks[i].OwnsResources = false
	}
	return rks, nil
}

// open runs the steps up to the backend's ranks: options, launch, store,
// describe, discover, connect.
func open(
	ctx context.Context,
	store rendezvous.Store,
	b Backend,
	devices []int,
	opts []Option,
) (*builder, []backend.Rank, error) {
	s, err := newBuilder(b, devices, opts)
	if err != nil {
		return nil, nil, err
	}
	if err := s.openStore(ctx, store); err != nil {
		return nil, nil, err
	}
	rks, err := s.run(ctx)
	if err != nil && s.owned != nil {
		_ = s.owned.Close()
	}
	return s, rks, err
}

// newBuilder validates the options and reads this process's place in the
// job and the global ranks it drives.
func newBuilder(b Backend, devices []int, opts []Option) (*builder, error) {
	s := &builder{b: b, devices: devices}
	for _, o := range opts {
		if o != nil {
			o(&s.cfg)
		}
	}
	s.env = s.cfg.env
	if s.env == nil {
		s.env = os.LookupEnv
	}
	s.log = s.cfg.logger
	if s.log == nil {
		s.log = logging.FromEnv(s.env)
	}
	if b == nil {
		return nil, &Error{Step: "options", Err: &fairgo.ArgError{Arg: "backend", Value: nil, Reason: "missing"}}
	}
	// The Reducer's options are checked before anyone waits on this rank.
	if err := hier.ValidateOptions(s.reducerOptions()...); err != nil {
		return nil, &Error{Step: "options", Err: err}
	}
	if s.cfg.launch != nil {
		s.launch = *s.cfg.launch
		if err := checkLaunch(s.launch); err != nil {
			return nil, &Error{Step: "launch", Err: err}
		}
	} else {
		l, err := rendezvous.FromLookup(s.env)
		if err != nil {
			return nil, &Error{Step: "launch", Err: err}
		}
		s.launch = l
	}
	if s.devices == nil {
		s.devices = []int{topology.DefaultOrdinal(s.launch.LocalRank, s.env)}
	}
	k := len(s.devices)
	s.world = s.launch.WorldSize * k
	s.ranks = make([]int, k)
	for i := range s.ranks {
		s.ranks[i] = s.launch.Rank*k + i
	}
	return s, nil
}

// reducerOptions are the Reducer options: setup's defaults first (the
// logger; inline enqueueing for the one rank of a process), so that the
// caller's WithReducer options win.
func (s *builder) reducerOptions() []hier.Option {
	opts := []hier.Option{hier.WithLogger(s.log), hier.WithInlineEnqueue(len(s.devices) == 1)}
	return append(opts, s.cfg.reducer...)
}

// openStore settles the store: the caller's, or the one the launcher
// provides (rendezvous.Open: fairrun's, torchrun's agent store, one rank 0
// hosts under Slurm, Open MPI or torchrun without an agent store, or one in
// memory for a single process); then the prefix.
func (s *builder) openStore(ctx context.Context, store rendezvous.Store) error {
	if store == nil {
		ls, err := rendezvous.Open(ctx, s.launch, rendezvous.WithOpenLogger(s.log))
		if err != nil {
			return s.fail("store", err)
		}
		s.owned, store = ls, ls
	}
	prefix := s.cfg.prefix
	if prefix == "" {
		prefix = DefaultStorePrefix
	}
	s.store = rendezvous.WithPrefix(store, prefix)
	return nil
}

// run describes, discovers and connects.
func (s *builder) run(ctx context.Context) ([]backend.Rank, error) {
	members, err := s.describe()
	if err != nil {
		return nil, s.fail("describe", err)
	}
	layout, err := s.discover(ctx, members)
	if err != nil {
		return nil, s.fail("discover", err)
	}
	s.log.Debug("fairgo: topology discovered", "layout", layout.String(), "ranks", s.ranks, "devices", s.devices)
	rks, err := s.connect(ctx, layout)
	if err != nil {
		return nil, s.fail("connect", err)
	}
	return rks, nil
}

// describe gives the Member of every local rank.
func (s *builder) describe() ([]topology.Member, error) {
	self := topology.Self{Logger: s.log}
	if s.cfg.self != nil {
		self = *s.cfg.self
	}
	if self.Host.Lookup == nil && s.cfg.env != nil {
		self.Host.Lookup = s.cfg.env
	}
	if self.Logger == nil {
		self.Logger = s.log
	}
	members := make([]topology.Member, len(s.devices))
	for i, d := range s.devices {
		self.Ordinal = d
		m, err := self.Describe()
		if err != nil {
			return nil, err
		}
		members[i] = m
	}
	return members, nil
}

// discover meets the other ranks; every local rank takes part.
func (s *builder) discover(ctx context.Context, members []topology.Member) (*topology.Layout, error) {
	k := len(members)
	layouts := make([]*topology.Layout, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			layouts[i], errs[i] = topology.Discover(ctx, s.store, s.ranks[i], s.world, members[i])
		}()
	}
	wg.Wait()
	if err := firstError(errs); err != nil {
		return nil, err
	}
	return layouts[0], nil
}

// connect asks the backend for devices and communicators and checks what it
// returned against the layout.
func (s *builder) connect(ctx context.Context, layout *topology.Layout) ([]backend.Rank, error) {
	k := len(s.ranks)
	rks, err := s.b.Connect(
		ctx,
		rendezvous.WithPrefix(s.store, "backend"),
		backend.Job{Places: placement(layout), Ranks: s.ranks, Devices: s.devices, Logger: s.log},
	)
	if err != nil {
		return nil, err
	}
	if len(rks) != k {
		err := fmt.Errorf("backend returned %d ranks for %d", len(rks), k)
		return nil, errors.Join(err, closeRanks(rks))
	}
	for i := range rks {
		want := layout.GridOf(s.ranks[i])
		if rks[i].Grid == (hier.Grid{}) {
			rks[i].Grid = want
		}
		rks[i].OwnsResources = true
		var bad error
		switch w := rks[i].Comms.World; {
		case rks[i].Grid != want:
			bad = fmt.Errorf("backend gave rank %d the grid %v; discovery says %v", s.ranks[i], rks[i].Grid, want)
		case w != nil && w.Rank() != s.ranks[i]:
			bad = fmt.Errorf("backend gave rank %d a world communicator in which it is rank %d", s.ranks[i], w.Rank())
		}
		if bad != nil {
			return nil, errors.Join(bad, closeRanks(rks))
		}
	}
	return rks, nil
}

// placement is the grid place of every rank of the layout.
func placement(l *topology.Layout) backend.Placement {
	p := make(backend.Placement, l.WorldSize())
	for r := range p {
		p[r] = l.GridOf(r)
	}
	return p
}

// reducers builds one Reducer per rank; each owns its rank's resources from
// here on. The store New opened is closed with the last of them.
func (s *builder) reducers(ctx context.Context, rks []backend.Rank) ([]*hier.Reducer, error) {
	k := len(rks)
	opts := s.reducerOptions()
	s.share(rks)
	rs := make([]*hier.Reducer, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs[i], errs[i] = hier.NewReducer(ctx, rks[i], opts...)
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
		cerrs = append(cerrs, hier.CloseAll(rs))
		return nil, errors.Join(append([]error{err}, cerrs...)...)
	}
	return rs, nil
}

// share gives the ranks the job's store as their Board (the Reducers tell
// each other of failures through it) and, when this setup opened the
// store, the release of it once the last rank is released.
func (s *builder) share(rks []backend.Rank) {
	for i := range rks {
		if rks[i].Board == nil {
			rks[i].Board = rendezvous.WithPrefix(s.store, "board")
		}
	}
	if s.owned != nil {
		closer := &sharedCloser{ls: s.owned, users: len(rks)}
		for i := range rks {
			rks[i].Closers = append(rks[i].Closers, closer.release)
		}
	}
}

// sharedCloser leaves the launcher's store once its last user released it:
// a rank that hosts it keeps serving (up to leaveTimeout) until the others
// have left.
type sharedCloser struct {
	mu    sync.Mutex
	ls    *rendezvous.LaunchStore
	users int
}

const leaveTimeout = time.Minute

func (s *sharedCloser) release() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users--
	if s.users > 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	return s.ls.Leave(ctx)
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

// closeRanks releases ranks a Reducer does not own (yet), each rank on its
// own goroutine.
func closeRanks(rks []backend.Rank) error {
	errs := make([]error, len(rks))
	var wg sync.WaitGroup
	for i, rk := range rks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = rk.Release()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("releasing: %w", err)
	}
	return nil
}
