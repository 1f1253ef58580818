package cuda

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/logging"
	"github.com/fairgo/fairgo/nccl"
)

var _ backend.Backend = Backend{}

// Backend is the backend.Backend of GPUs, for setup.New and setup.NewLocal:
//
//	r, err := setup.New(ctx, nil, cuda.Backend{})
//
// Connect opens each rank's device (its CUDA ordinal; with
// CUDA_VISIBLE_DEVICES naming one GPU, as fairrun sets it, that is 0) and
// makes the five communicators: the world communicator from a unique id
// that global rank 0 creates and publishes through the store, then the two
// intra-machine communicators by ncclCommSplit(color = machine, key =
// local index) and the two rail communicators by ncclCommSplit(color =
// local index, key = machine). Without ncclCommSplit (NCCL before 2.18), or
// with NoSplit, each intra and rail communicator comes from a unique id of
// its own, created by its first member and exchanged through the store.
// One-rank communicators are left nil. Two ranks may share a GPU when they
// are on different (emulated) machines: their NCCL_HOSTID differ. Where
// the intra and rail communicators come from ncclCommSplit, each rank also
// gets Variants, which make copies of its world communicator with one NCCL
// allreduce algorithm each, on demand.
//
// Without a CUDA driver or a GPU, Connect returns Load's *LoadError, which
// matches fairgo.ErrNoDevice.
//
// NCCL's initialisation cannot be interrupted: when ctx ends first, Connect
// returns ctx's error and the communicators, should they ever complete, are
// aborted in the background. The process should then exit.
type Backend struct {
	// NoSplit makes the intra and rail communicators from unique ids even
	// when ncclCommSplit is available.
	NoSplit bool
}

// Connect implements backend.Backend.
func (b Backend) Connect(ctx context.Context, store backend.Store, job backend.Job) ([]backend.Rank, error) {
	if job.Places.Validate() != nil || len(job.Ranks) == 0 || len(job.Ranks) != len(job.Devices) {
		return nil, &fairgo.ArgError{
			Arg:    "cuda backend job",
			Value:  fmt.Sprintf("ranks %v devices %v", job.Ranks, job.Devices),
			Reason: "needs a layout and one device per rank",
		}
	}
	if _, err := Load(); err != nil {
		return nil, err
	}
	devs := make([]*Device, len(job.Devices))
	closeDevs := func() error {
		var errs []error
		for _, d := range devs {
			if d != nil {
				errs = append(errs, d.Close())
			}
		}
		return errors.Join(errs...)
	}
	for i, o := range job.Devices {
		for _, p := range job.Devices[:i] {
			if p == o {
				return nil, &fairgo.ArgError{
					Arg:    "cuda backend devices",
					Value:  job.Devices,
					Reason: "one rank per GPU in a process",
				}
			}
		}
		d, err := Open(o)
		if err != nil {
			return nil, errors.Join(
				fmt.Errorf("cuda: opening device %d for rank %d: %w", o, job.Ranks[i], err),
				closeDevs(),
			)
		}
		devs[i] = d
	}
	log := job.Logger
	if log == nil {
		log = logging.Default()
	}
	ranks, err := connect(ctx, store, job.Places, job.Ranks, devs, b.NoSplit, log)
	if err != nil {
		return nil, errors.Join(err, closeDevs())
	}
	return ranks, nil
}

// connect makes the communicators of this process's ranks (global ranks
// ranks, on devs) in the placement every rank computed. The caller keeps
// the devices; on error every communicator made is aborted.
func connect(
	ctx context.Context,
	store backend.Store,
	layout backend.Placement,
	ranks []int,
	devs []*Device,
	noSplit bool,
	log *slog.Logger,
) ([]backend.Rank, error) {
	lib, err := nccl.Load()
	if err != nil {
		return nil, err
	}
	defer lib.Close()
	c := &connector{ctx: ctx, store: store, layout: layout, ranks: ranks, devs: devs, lib: lib}
	c.out = make([]backend.Rank, len(ranks))
	for i, r := range ranks {
		c.out[i] = backend.Rank{Grid: layout.GridOf(r), Device: devs[i]}
	}
	if err := c.worldComms(); err != nil {
		return c.fail(err)
	}
	split := !noSplit && lib.Supports("ncclCommSplit")
	for i := range c.out {
		if w, ok := c.out[i].Comms.World.(*Comm); ok && split {
			c.out[i].Variants = &Variants{world: w}
		}
	}
	g := c.out[0].Grid
	log.Debug("fairgo: cuda communicators", "world", layout.WorldSize(),
		"grid", fmt.Sprintf("%dx%d", g.Machines, g.Devices), "split", split, "nccl", lib.String())
	for _, s := range c.subs() {
		if s.size == 1 { // one-rank communicators stay nil, on every rank alike
			continue
		}
		var raw []*nccl.Comm
		if split {
			raw, err = c.split(s)
		} else {
			raw, err = c.fromIDs(s)
		}
		if err != nil {
			return c.fail(err)
		}
		place := func(i int) (int, int) { _, key := s.colorKey(c.out[i].Grid); return s.size, key }
		if err := c.wrap(s.nameOf, raw, place, s.set); err != nil {
			return c.fail(err)
		}
	}
	return c.out, nil
}

// connector carries one connect: what it was given, the ranks it builds
// and the communicators made so far (aborted if it fails).
type connector struct {
	ctx    context.Context
	store  backend.Store
	layout backend.Placement
	ranks  []int
	devs   []*Device
	lib    *nccl.Library
	out    []backend.Rank
	world  []*nccl.Comm // each rank's world communicator, which the others split from
	made   []*Comm
}

// sub is one kind of communicator under the world: the check, the intra
// ones and the rail ones.
type sub struct {
	name     string                         // a format with the color, or the name of the one communicator
	size     int                            // ranks per communicator (one: none is made)
	colorKey func(g fairgo.Grid) (int, int) // which communicator, and the place in it
	leaderOf func(color int) int            // global rank of its first member
	config   *nccl.Config                   // nil: NCCL's defaults
	set      func(c *backend.Comms, cm backend.Comm)
}

// nameOf is the name of the communicator of the rank at g.
func (s sub) nameOf(g fairgo.Grid) string {
	if !strings.Contains(s.name, "%") { // one communicator of every rank
		return s.name
	}
	c, _ := s.colorKey(g)
	return fmt.Sprintf(s.name, c)
}

// fail aborts every communicator made and returns err.
func (c *connector) fail(err error) ([]backend.Rank, error) {
	for _, cm := range c.made {
		_ = cm.Abort()
	}
	return nil, err
}

// worldComms makes the world communicator of every rank from a unique id
// global rank 0 publishes.
func (c *connector) worldComms() error {
	W := c.layout.WorldSize()
	id, err := shareID(c.ctx, c.lib, c.store, "nccl/world", c.ranks[0] == 0)
	if err != nil {
		return err
	}
	c.world, err = eachRank(c.ctx, "world communicator", c.devs, func(i int) (*nccl.Comm, error) {
		return c.lib.CommInitRank(W, id, c.ranks[i])
	})
	if err != nil {
		return err
	}
	name := func(fairgo.Grid) string { return "world" }
	place := func(i int) (int, int) { return W, c.ranks[i] }
	return c.wrap(name, c.world, place, func(cs *backend.Comms, cm backend.Comm) { cs.World = cm })
}

// subs are the communicators under the world, in the order every rank
// makes them.
func (c *connector) subs() []sub {
	l := c.layout
	g := c.out[0].Grid
	M, D, W := g.Machines, g.Devices, l.WorldSize()
	intraCK := func(g fairgo.Grid) (int, int) { return g.Machine, g.Local }
	railCK := func(g fairgo.Grid) (int, int) { return g.Local, g.Machine }
	intraLeader := func(m int) int { return l.RankAt(m, 0) }
	railLeader := func(d int) int { return l.RankAt(0, d) }
	checkCK := func(g fairgo.Grid) (int, int) { return 0, g.Rank() }
	checkLeader := func(int) int { return l.RankAt(0, 0) }
	// The check moves a few kilobytes: one CTA, so that it never takes SMs
	// that the data's kernels (and, with ranks sharing a GPU under MPS,
	// other ranks' kernels they wait for) need.
	checkConfig := &nccl.Config{MinCTAs: 1, MaxCTAs: 1, CommName: "fairgo-check"}
	return []sub{
		{"check", W, checkCK, checkLeader, checkConfig, func(c *backend.Comms, cm backend.Comm) { c.Check = cm }},
		{"intra-rs/machine=%d", D, intraCK, intraLeader, nil,
			func(c *backend.Comms, cm backend.Comm) { c.IntraReduceScatter = cm }},
		{"intra-ag/machine=%d", D, intraCK, intraLeader, nil,
			func(c *backend.Comms, cm backend.Comm) { c.IntraAllGather = cm }},
		{"rail-collect/local=%d", M, railCK, railLeader, nil,
			func(c *backend.Comms, cm backend.Comm) { c.RailCollect = cm }},
		{"rail-diffuse/local=%d", M, railCK, railLeader, nil,
			func(c *backend.Comms, cm backend.Comm) { c.RailDiffuse = cm }},
	}
}

// split makes s's communicators by ncclCommSplit of the world.
func (c *connector) split(s sub) ([]*nccl.Comm, error) {
	return eachRank(c.ctx, s.nameOf(c.out[0].Grid)+" split", c.devs, func(i int) (*nccl.Comm, error) {
		color, key := s.colorKey(c.out[i].Grid)
		cm, err := c.world[i].Split(color, key, s.config)
		if err == nil && cm == nil {
			err = fmt.Errorf("ncclCommSplit(color %d, key %d) returned no communicator", color, key)
		}
		return cm, err
	})
}

// fromIDs makes s's communicators from unique ids their first members
// create and publish through the store.
func (c *connector) fromIDs(s sub) ([]*nccl.Comm, error) {
	ids := make([]nccl.UniqueID, len(c.ranks))
	// Leaders publish first, then everyone reads: no process waits on an
	// id that a process waiting on it would create.
	for _, leaders := range []bool{true, false} {
		for i, r := range c.ranks {
			color, _ := s.colorKey(c.out[i].Grid)
			if (s.leaderOf(color) == r) != leaders {
				continue
			}
			var err error
			if ids[i], err = shareID(c.ctx, c.lib, c.store, "nccl/"+s.nameOf(c.out[i].Grid), leaders); err != nil {
				return nil, err
			}
		}
	}
	return eachRank(c.ctx, s.nameOf(c.out[0].Grid), c.devs, func(i int) (*nccl.Comm, error) {
		_, key := s.colorKey(c.out[i].Grid)
		if s.config != nil && c.lib.Supports("ncclCommInitRankConfig") {
			return c.lib.CommInitRankConfig(c.ctx, s.size, ids[i], key, s.config)
		}
		return c.lib.CommInitRank(s.size, ids[i], key)
	})
}

// wrap wraps new communicators, checks their places against the
// placement (want: the size and rank the i-th should have) and stores
// them with set.
func (c *connector) wrap(
	name func(g fairgo.Grid) string,
	raw []*nccl.Comm,
	want func(i int) (size, rank int),
	set func(c *backend.Comms, cm backend.Comm),
) error {
	for i, rc := range raw {
		cm, err := NewComm(c.devs[i], rc, name(c.out[i].Grid))
		if err != nil {
			for _, x := range raw[i:] {
				_ = x.Abort()
			}
			return err
		}
		c.made = append(c.made, cm)
		set(&c.out[i].Comms, cm)
	}
	for i, cm := range c.made[len(c.made)-len(raw):] {
		if n, r := want(i); cm.Size() != n || cm.Rank() != r {
			return fmt.Errorf("cuda: communicator %s of global rank %d is rank %d of %d; the layout says %d of %d",
				cm.Name(), c.ranks[i], cm.Rank(), cm.Size(), r, n)
		}
	}
	return nil
}

// shareID returns the NCCL unique id shared under key: the leader creates
// and publishes it, the others wait for it.
func shareID(ctx context.Context, lib *nccl.Library, store backend.Store, key string, leader bool) (nccl.UniqueID, error) {
	v, err := backend.Share(ctx, store, key, leader, func() ([]byte, error) {
		id, err := lib.GetUniqueId()
		return id.Bytes(), err
	})
	if err != nil {
		return nccl.UniqueID{}, fmt.Errorf("cuda: the NCCL unique id: %w", err)
	}
	id, err := nccl.UniqueIDFromBytes(v)
	if err != nil {
		return id, fmt.Errorf("cuda: NCCL unique id %s: %w", key, err)
	}
	return id, nil
}

// eachRank runs create for every local rank at once, each on a locked OS
// thread of its own with the rank's device context current, and waits for
// all of them or for ctx. The calls are NCCL's blocking initialisations
// (ncclCommInitRank, ncclCommSplit), which return once every member has
// joined; one thread per rank lets the ranks of one process join together
// without an NCCL group (inside a group NCCL writes the new handle after
// the call has returned). On error, or when ctx ends first, every
// communicator made, then or later, is aborted.
func eachRank(
	ctx context.Context,
	what string,
	devs []*Device,
	create func(i int) (*nccl.Comm, error),
) ([]*nccl.Comm, error) {
	type result struct {
		i   int
		c   *nccl.Comm
		err error
	}
	n := len(devs)
	ch := make(chan result, n)
	for i, d := range devs {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			prev, err := ctxGet()
			if err == nil {
				err = ctxSet(d.ctx)
			}
			if err != nil {
				ch <- result{i, nil, err}
				return
			}
			c, err := create(i)
			_ = ctxSet(prev)
			ch <- result{i, c, err}
		}()
	}
	comms := make([]*nccl.Comm, n)
	var errs []error
	abortAll := func() {
		for _, c := range comms {
			if c != nil {
				_ = c.Abort()
			}
		}
	}
	for got := 0; got < n; got++ {
		select {
		case r := <-ch:
			comms[r.i] = r.c
			if r.err != nil {
				errs = append(errs, fmt.Errorf("on %v: %w", devs[r.i], r.err))
			}
		case <-ctx.Done():
			left := n - got
			go func() {
				for range left {
					if r := <-ch; r.c != nil {
						_ = r.c.Abort()
					}
				}
			}()
			abortAll()
			return nil, fmt.Errorf(
				"cuda: %s: NCCL did not complete (a rank missing or failed?): %w",
				what,
				errors.Join(append([]error{ctx.Err()}, errs...)...),
			)
		}
	}
	if len(errs) > 0 {
		abortAll()
		return nil, fmt.Errorf("cuda: %s: %w", what, errors.Join(errs...))
	}
	return comms, nil
}
