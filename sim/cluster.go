package sim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/rendezvous"
)

// DefaultStallTimeout is how long a collective waits for its peers when
// Config.StallTimeout is zero.
const DefaultStallTimeout = 30 * time.Second

// MaxRanks bounds Machines × Devices.
const MaxRanks = 4096

// Config describes a simulated cluster.
type Config struct {
	Machines int // M ≥ 1
	Devices  int // D ≥ 1, devices per machine
	// Seed seeds the random delays of Jitter (each stream draws from its
	// own generator, seeded from Seed and the stream's identity).
	Seed int64
	// Jitter is the maximum random delay before each stream operation; 0
	// means none. A few hundred microseconds expose missing event waits.
	Jitter time.Duration
	// StallTimeout is how long a collective waits for all its ranks before
	// failing them with a *StallError; 0 means DefaultStallTimeout.
	StallTimeout time.Duration
	// RankOrder, if set, places global rank g at grid rank RankOrder[g]
	// (machine RankOrder[g] / Devices, local index RankOrder[g] % Devices);
	// it must be a permutation of [0, Machines·Devices). Nil is the identity
	// (machine-major).
	RankOrder []int
	// MemoryLimit is each device's memory in bytes; 0 means unlimited.
	MemoryLimit int64
	// AlgoDelay slows the world communicators that the ranks' Variants
	// make for an algorithm (backend.AlgoRing or backend.AlgoTree; the
	// simulated allreduce is the same for both): each all-reduce on them
	// waits this long on its stream before it meets its peers, so that
	// tests can make a choice between NCCL's algorithms (hier's Auto)
	// come out as they please. Algorithms not in the map: no delay.
	AlgoDelay map[backend.NCCLAlgo]time.Duration
	// WorldDelay is the same for the all-reduces of the world
	// communicator of Comms (hier's flat allreduce, and the few of its
	// own bookkeeping that ride on it).
	WorldDelay time.Duration
	// ConnectAtFirstCall makes each communicator connect as NCCL does by
	// default (NCCL_RUNTIME_CONNECT): a rank's first collective on it
	// blocks the enqueuing thread until every rank has made its first one,
	// or the rank aborts its own handle, or StallTimeout passes (a
	// *StallError). Without it a first call enqueues at once, as every
	// later one does.
	ConnectAtFirstCall bool
	// HangOnMismatch makes a collective whose ranks enqueued different
	// calls hang as NCCL's does (each rank waits for bytes that never
	// come) until a rank aborts its handle or StallTimeout passes (a
	// *StallError), where by default every rank fails at once with a
	// *MismatchError.
	HangOnMismatch bool
}

func (cfg Config) validate() error {
	bad := func(arg string, v any, why string) error {
		return &fairgo.ArgError{Arg: "sim.Config." + arg, Value: v, Reason: why}
	}
	switch {
	case cfg.Machines < 1:
		return bad("Machines", cfg.Machines, "must be at least 1")
	case cfg.Devices < 1:
		return bad("Devices", cfg.Devices, "must be at least 1")
	case cfg.Machines > MaxRanks || cfg.Machines*cfg.Devices > MaxRanks:
		return bad(
			"Machines",
			cfg.Machines,
			fmt.Sprintf("%d × %d devices exceeds %d ranks", cfg.Machines, cfg.Devices, MaxRanks),
		)
	case cfg.Jitter < 0:
		return bad("Jitter", cfg.Jitter, "must not be negative")
	case cfg.StallTimeout < 0:
		return bad("StallTimeout", cfg.StallTimeout, "must not be negative")
	case cfg.MemoryLimit < 0:
		return bad("MemoryLimit", cfg.MemoryLimit, "must not be negative")
	case cfg.WorldDelay < 0:
		return bad("WorldDelay", cfg.WorldDelay, "must not be negative")
	}
	for a, d := range cfg.AlgoDelay {
		if checkAlgo(a) != nil {
			why := fmt.Sprintf("key %q: not %q or %q", a, backend.AlgoRing, backend.AlgoTree)
			return bad("AlgoDelay", cfg.AlgoDelay, why)
		}
		if d < 0 {
			return bad("AlgoDelay", cfg.AlgoDelay, fmt.Sprintf("the delay of %q must not be negative", a))
		}
	}
	if cfg.RankOrder != nil {
		n := cfg.Machines * cfg.Devices
		if len(cfg.RankOrder) != n {
			return bad("RankOrder", cfg.RankOrder, fmt.Sprintf("needs %d entries", n))
		}
		seen := make([]bool, n)
		for g, r := range cfg.RankOrder {
			if r < 0 || r >= n || seen[r] {
				return bad(
					"RankOrder",
					cfg.RankOrder,
					fmt.Sprintf("entry %d (%d) makes it no permutation of [0, %d)", g, r, n),
				)
			}
			seen[r] = true
		}
	}
	return nil
}

// Cluster is a simulated cluster of Machines × Devices devices and the
// communicators hier needs (see backend.Comms). It owns them all; Close
// releases everything.
type Cluster struct {
	cfg     Config
	devices []*Device       // by global rank
	comms   []backend.Comms // by global rank
	groups  []*group
	board   *rendezvous.MemoryStore // the Board of its ranks
	done    chan struct{}           // closed by Close: World's waits end

	mu       sync.Mutex
	closed   bool
	variants variantSets // the world communicators of the ranks' Variants
}

// NewCluster builds a cluster. Invalid configurations give a
// *fairgo.ArgError.
func NewCluster(cfg Config) (*Cluster, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.StallTimeout == 0 {
		cfg.StallTimeout = DefaultStallTimeout
	}
	M, D := cfg.Machines, cfg.Devices
	n := M * D
	if cfg.RankOrder == nil {
		cfg.RankOrder = make([]int, n)
		for g := range cfg.RankOrder {
			cfg.RankOrder[g] = g
		}
	} else {
		cfg.RankOrder = append([]int(nil), cfg.RankOrder...)
	}
	cfg.AlgoDelay = maps.Clone(cfg.AlgoDelay)
	c := &Cluster{
		cfg:      cfg,
		devices:  make([]*Device, n),
		comms:    make([]backend.Comms, n),
		board:    rendezvous.NewMemoryStore(),
		done:     make(chan struct{}),
		variants: newVariantSets(n),
	}
	global := make([]int, n) // grid rank -> global rank
	for g, r := range cfg.RankOrder {
		global[r] = g
		c.devices[g] = newDevice(c, g, hier.Grid{Machines: M, Devices: D, Machine: r / D, Local: r % D})
	}
	// newComm builds a communicator over global ranks and hands each its handle.
	newComm := func(name string, ranks []int, set func(hc *backend.Comms, cm *Comm)) *group {
		members := make([]*Device, len(ranks))
		for i, g := range ranks {
			members[i] = c.devices[g]
		}
		gr := newGroup(name, members, cfg.StallTimeout)
		gr.connectFirst = cfg.ConnectAtFirstCall
		gr.hangOnMismatch = cfg.HangOnMismatch
		c.groups = append(c.groups, gr)
		for i, g := range ranks {
			set(&c.comms[g], &Comm{g: gr, rank: i, dev: c.devices[g], aborted: make(chan struct{})})
		}
		return gr
	}
	world := make([]int, n)
	for g := range world {
		world[g] = g
	}
	newComm("world", world, func(hc *backend.Comms, cm *Comm) { hc.World = cm }).delay = cfg.WorldDelay
	if n > 1 {
		newComm("check", world, func(hc *backend.Comms, cm *Comm) { hc.Check = cm })
	}
	for m := range M {
		ranks := make([]int, D)
		for d := range D {
			ranks[d] = global[m*D+d]
		}
		newComm(
			fmt.Sprintf("intra-rs/machine=%d", m),
			ranks,
			func(hc *backend.Comms, cm *Comm) { hc.IntraReduceScatter = cm },
		)
		newComm(fmt.Sprintf("intra-ag/machine=%d", m), ranks, func(hc *backend.Comms, cm *Comm) { hc.IntraAllGather = cm })
	}
	for d := range D {
		ranks := make([]int, M)
		for m := range M {
			ranks[m] = global[m*D+d]
		}
		newComm(fmt.Sprintf("rail-collect/local=%d", d), ranks, func(hc *backend.Comms, cm *Comm) { hc.RailCollect = cm })
		newComm(fmt.Sprintf("rail-diffuse/local=%d", d), ranks, func(hc *backend.Comms, cm *Comm) { hc.RailDiffuse = cm })
	}
	return c, nil
}

// NewWorld makes a communicator of every rank, named name, beside the
// ones the cluster was built with (a baseline measured on a communicator
// of its own, as a flat ring on NCCL is): its handles by global rank. The
// cluster owns it; Close fails its pending calls like the others'.
func (c *Cluster) NewWorld(name string) ([]*Comm, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("sim: cluster: %w", fairgo.ErrClosed)
	}
	_, out := c.newWorldLocked(name, 0)
	return out, nil
}

// Config returns the cluster's configuration, with defaults filled in.
func (c *Cluster) Config() Config {
	cfg := c.cfg
	cfg.RankOrder = append([]int(nil), cfg.RankOrder...)
	cfg.AlgoDelay = maps.Clone(cfg.AlgoDelay)
	return cfg
}

// Size is the number of ranks, Machines × Devices.
func (c *Cluster) Size() int { return len(c.devices) }

// Device returns the device of a global rank, or nil outside [0, Size()).
func (c *Cluster) Device(global int) *Device {
	if global < 0 || global >= len(c.devices) {
		return nil
	}
	return c.devices[global]
}

// Comms returns the communicator handles of a global rank (zero outside
// [0, Size())). Their dynamic type is *Comm.
func (c *Cluster) Comms(global int) backend.Comms {
	if global < 0 || global >= len(c.devices) {
		return backend.Comms{}
	}
	return c.comms[global]
}

// Rank returns what hier.NewReducer needs for a global rank: its grid
// place, device, communicators and Variants (whose World makes the rank's
// member of a world communicator of its own, see Variants). The cluster
// keeps ownership (OwnsResources is false). Outside [0, Size()) it is the
// zero Rank, which hier rejects.
func (c *Cluster) Rank(global int) backend.Rank {
	d := c.Device(global)
	if d == nil {
		return backend.Rank{}
	}
	return backend.Rank{Grid: d.grid, Device: d, Comms: c.comms[global], Board: c.board,
		Variants: &Variants{c: c, rank: global}}
}

// Reducers builds a hier.Reducer for every rank, concurrently (they
// rendezvous with each other). If any fails, the ones built are closed and
// the first error is returned. The cluster is one process, which logs as a
// job of processes does: each Reducer logs to hier.WithLogger's logger in
// opts, or to logging.Default() (warnings and errors, unless
// FAIRGO_LOG_LEVEL says otherwise), and a fact about the whole job (the
// links, a size class's choice) at info on rank 0 only, at debug on the
// others.
func (c *Cluster) Reducers(ctx context.Context, opts ...hier.Option) ([]*hier.Reducer, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	rs := make([]*hier.Reducer, c.Size())
	eg, ctx := errgroup.WithContext(ctx)
	for g := range rs {
		eg.Go(func() error {
			r, err := hier.NewReducer(ctx, c.Rank(g), opts...)
			if err != nil {
				return fmt.Errorf("sim: building the reducer of rank %d: %w", g, err)
			}
			rs[g] = r
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		var errs []error
		for _, r := range rs {
			if r != nil {
				errs = append(errs, r.Close())
			}
		}
		return nil, errors.Join(append([]error{err}, errs...)...)
	}
	return rs, nil
}

func (c *Cluster) checkOpen() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("sim: cluster: %w", fairgo.ErrClosed)
	}
	return nil
}

// Close fails every communicator's pending calls with an error wrapping
// fairgo.ErrClosed, ends the waits of Variants' World with it, stops every
// device's streams (their goroutines have exited when Close returns) and
// releases device memory. Closing twice is a no-op.
func (c *Cluster) Close() error {
	groups, first := closeOnce(&c.mu, &c.closed, func() []*group {
		close(c.done)
		return c.groups
	})
	if !first {
		return nil
	}
	for _, g := range groups {
		g.fail(fmt.Errorf("sim: %s: cluster closed: %w", g.name, fairgo.ErrClosed))
	}
	errs := []error{c.board.Close()}
	for _, d := range c.devices {
		errs = append(errs, d.Close())
		d.mem.release()
	}
	return errors.Join(errs...)
}

// closeOnce sets *closed under mu and returns what take reads under the same
// lock; first is false, and nothing is read, where it was closed already.
func closeOnce[T any](mu *sync.Mutex, closed *bool, take func() T) (v T, first bool) {
	mu.Lock()
	defer mu.Unlock()
	if *closed {
		return v, false
	}
	*closed = true
	return take(), true
}
