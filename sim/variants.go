package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
)

var _ backend.Variants = (*Variants)(nil)

// Variants is a simulated rank's backend.Variants (Cluster.Rank hands one
// to every rank). The k-th World call of a rank for an algorithm gives
// that rank's member of a world communicator made for the k-th call of
// every rank for that algorithm: the first rank to ask makes it for the
// whole cluster, and each call returns once every rank has asked, as an
// NCCL split does. The simulated allreduce is the same whatever the
// algorithm; Config.AlgoDelay makes one slower than another.
//
// A rank's calls are matched with the other ranks' by their order, per
// algorithm; calls of one rank from several goroutines at once get
// consecutive numbers in no set order, so one goroutine per rank should
// make them. The communicators belong to the cluster as those of Comms do
// (Close fails their pending calls); closing one closes that handle only.
type Variants struct {
	c    *Cluster
	rank int // global rank
}

// World implements backend.Variants: this rank's member, named
// "flat-<algo>" ("flat-tree#1" for the second of that algorithm, and so
// on), of a world communicator of its own. An algorithm other than
// backend.AlgoRing and backend.AlgoTree is an *fairgo.ArgError. When ctx
// ends before every rank has asked, World returns ctx's error and the
// ranks waiting with it fail with one wrapping fairgo.ErrAborted; after
// Config.StallTimeout they all fail with a *StallError; when the cluster
// closes, with fairgo.ErrClosed.
func (v *Variants) World(ctx context.Context, algo backend.NCCLAlgo) (backend.Comm, error) {
	if err := checkAlgo(algo); err != nil {
		return nil, err
	}
	set, err := v.c.joinVariant(algo, v.rank)
	if err != nil {
		return nil, err
	}
	if err := v.c.awaitVariant(ctx, set, v.rank); err != nil {
		return nil, err
	}
	return set.comms[v.rank], nil
}

// checkAlgo reports an algorithm Variants does not make as an
// *fairgo.ArgError.
func checkAlgo(a backend.NCCLAlgo) error {
	if a == backend.AlgoRing || a == backend.AlgoTree {
		return nil
	}
	return &fairgo.ArgError{
		Arg:    "NCCL algorithm",
		Value:  a,
		Reason: fmt.Sprintf("%q or %q", backend.AlgoRing, backend.AlgoTree),
	}
}

// variantSets are the world communicators of the ranks' Variants: how
// many each rank asked for, and those some ranks have not yet asked for.
// Cluster.mu guards them.
type variantSets struct {
	asked map[backend.NCCLAlgo][]int // by algorithm, then global rank
	open  map[variantKey]*variantSet
	n     int // ranks
}

type variantKey struct {
	algo backend.NCCLAlgo
	k    int // the k-th of its algorithm
}

func newVariantSets(n int) variantSets {
	return variantSets{asked: map[backend.NCCLAlgo][]int{}, open: map[variantKey]*variantSet{}, n: n}
}

// variantSet is one world communicator of Variants, as its ranks join it.
type variantSet struct {
	name   string
	algo   backend.NCCLAlgo
	group  *group
	comms  []*Comm // by global rank
	joined []bool  // by global rank
	count  int     // ranks joined

	ready chan struct{} // closed once every rank joined, or the set failed
	err   error         // why it failed; read after ready is closed
	over  bool          // ready is closed
}

// finish closes the set's wait with err (nil: every rank joined), unless
// it was over already; it returns the set's outcome. The caller holds
// Cluster.mu.
func (s *variantSet) finish(err error) error {
	if !s.over {
		s.over, s.err = true, err
		if err != nil {
			s.group.fail(err)
		}
		close(s.ready)
	}
	return s.err
}

// missing are the ranks that have not joined; the caller holds Cluster.mu.
func (s *variantSet) missing() (arrived, missing []int) {
	for r, j := range s.joined {
		if j {
			arrived = append(arrived, r)
		} else {
			missing = append(missing, r)
		}
	}
	return arrived, missing
}

// joinVariant counts rank's next call for algo in, making the set of that
// call where rank is the first to ask.
func (c *Cluster) joinVariant(algo backend.NCCLAlgo, rank int) (*variantSet, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("sim: cluster: %w", fairgo.ErrClosed)
	}
	vs := &c.variants
	if vs.asked[algo] == nil {
		vs.asked[algo] = make([]int, vs.n)
	}
	key := variantKey{algo, vs.asked[algo][rank]}
	vs.asked[algo][rank]++
	set := vs.open[key]
	if set == nil {
		name := "flat-" + string(algo)
		if key.k > 0 {
			name = fmt.Sprintf("%s#%d", name, key.k)
		}
		set = &variantSet{name: name, algo: algo, joined: make([]bool, vs.n), ready: make(chan struct{})}
		set.group, set.comms = c.newWorldLocked(name, c.cfg.AlgoDelay[algo])
		vs.open[key] = set
	}
	set.joined[rank] = true
	set.count++
	if set.count == vs.n {
		delete(vs.open, key)
		set.finish(nil)
	}
	return set, nil
}

// awaitVariant waits until every rank has joined set, or ctx ends, the
// stall timeout passes or the cluster closes; the last three fail the set
// for every rank (unless it completed meanwhile).
func (c *Cluster) awaitVariant(ctx context.Context, set *variantSet, rank int) error {
	timer := time.NewTimer(c.cfg.StallTimeout)
	defer timer.Stop()
	select {
	case <-set.ready:
		return set.err
	case <-ctx.Done():
		c.mu.Lock()
		defer c.mu.Unlock()
		_, missing := set.missing()
		err := set.finish(fmt.Errorf("sim: %s: rank %d stopped waiting for ranks %v (%v): %w",
			set.name, rank, missing, ctx.Err(), fairgo.ErrAborted))
		if err == nil {
			return nil // every rank joined meanwhile
		}
		return fmt.Errorf("sim: %s of rank %d: ranks %v have not asked for it: %w", set.name, rank, missing, ctx.Err())
	case <-timer.C:
		c.mu.Lock()
		defer c.mu.Unlock()
		arrived, missing := set.missing()
		e := &StallError{Comm: set.name, Timeout: c.cfg.StallTimeout, Arrived: arrived, Missing: missing}
		for range arrived {
			e.Calls = append(e.Calls, fmt.Sprintf("Variants.World(%s)", set.algo))
		}
		return set.finish(e)
	case <-c.done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return set.finish(fmt.Errorf("sim: %s: cluster closed: %w", set.name, fairgo.ErrClosed))
	}
}

// NewAlgoWorld is NewWorld for the communicator a flat allreduce with
// NCCL algorithm algo runs on (a baseline): named "flat-<algo>", its
// all-reduces slowed by Config.AlgoDelay[algo]. An algorithm other than
// backend.AlgoRing and backend.AlgoTree is an *fairgo.ArgError.
func (c *Cluster) NewAlgoWorld(algo backend.NCCLAlgo) ([]*Comm, error) {
	if err := checkAlgo(algo); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("sim: cluster: %w", fairgo.ErrClosed)
	}
	_, comms := c.newWorldLocked("flat-"+string(algo), c.cfg.AlgoDelay[algo])
	return comms, nil
}

// newWorldLocked makes a communicator of every rank in global order, its
// all-reduces slowed by delay, that Close fails with the others; the
// caller holds c.mu.
func (c *Cluster) newWorldLocked(name string, delay time.Duration) (*group, []*Comm) {
	gr := newGroup(name, c.devices, c.cfg.StallTimeout)
	gr.delay = delay
	gr.connectFirst = c.cfg.ConnectAtFirstCall
	gr.hangOnMismatch = c.cfg.HangOnMismatch
	c.groups = append(c.groups, gr)
	out := make([]*Comm, len(c.devices))
	for g, d := range c.devices {
		out[g] = &Comm{g: gr, rank: g, dev: d, aborted: make(chan struct{})}
	}
	return gr, out
}
