package sim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/hier/setup"
	"github.com/fairgo/fairgo/rendezvous"
)

var _ setup.Backend = (*Backend)(nil)

// keyCluster is the store key under which the process holding global rank
// 0 publishes the cluster it built (as NCCL's unique id is published).
const keyCluster = "sim/cluster"

// Backend is a setup.Backend over simulated clusters, so that setup.New and
// setup.NewLocal run end to end without GPUs: goroutines play the processes
// of a job, each calling setup.New with the same Backend and its own
// environment (setup.WithEnv), through a shared rendezvous store.
//
// The process holding global rank 0 builds a Cluster shaped by the
// discovered layout (Machines, Devices and RankOrder come from it) and
// publishes its id through the store; the others wait for the id there,
// then take their ranks' devices and communicators. Device ordinals are
// ignored. The Reducers own their devices and communicators; Close releases
// the clusters' memory.
type Backend struct {
	cfg Config

	mu       sync.Mutex
	clusters []*Cluster
	claimed  []map[int]bool // by cluster: global ranks already handed out
	closed   bool
}

// NewBackend returns a Backend whose clusters use cfg's Seed, Jitter,
// StallTimeout and MemoryLimit; its Machines, Devices and RankOrder are
// ignored.
func NewBackend(cfg Config) *Backend {
	return &Backend{cfg: cfg}
}

// Connect implements setup.Backend.
func (b *Backend) Connect(ctx context.Context, store rendezvous.Store, job setup.Job) ([]hier.Rank, error) {
	l := job.Layout
	if l == nil || len(job.Ranks) == 0 {
		return nil, &fairgo.ArgError{
			Arg:    "sim backend job",
			Value:  job.Ranks,
			Reason: "needs a layout and at least one rank",
		}
	}
	var id int
	if job.Ranks[0] == 0 {
		cfg := b.cfg
		g := l.Grid
		cfg.Machines, cfg.Devices = g.Machines, g.Devices
		cfg.RankOrder = make([]int, l.WorldSize())
		for r := range cfg.RankOrder {
			cfg.RankOrder[r] = l.GridOf(r).Rank()
		}
		c, err := NewCluster(cfg)
		if err != nil {
			return nil, err
		}
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return nil, errors.Join(fmt.Errorf("sim: backend: %w", fairgo.ErrClosed), c.Close())
		}
		id = len(b.clusters)
		b.clusters = append(b.clusters, c)
		b.claimed = append(b.claimed, map[int]bool{})
		b.mu.Unlock()
		if err := store.Set(ctx, keyCluster, []byte(strconv.Itoa(id))); err != nil {
			return nil, fmt.Errorf("sim: publishing the cluster: %w", err)
		}
	} else {
		v, err := store.Get(ctx, keyCluster)
		if err != nil {
			return nil, fmt.Errorf("sim: waiting for rank 0's cluster: %w", err)
		}
		if id, err = strconv.Atoi(string(v)); err != nil {
			return nil, fmt.Errorf("sim: cluster id %q: %w", v, err)
		}
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("sim: backend: %w", fairgo.ErrClosed)
	}
	if id < 0 || id >= len(b.clusters) {
		return nil, fmt.Errorf("sim: cluster %d was built by another backend", id)
	}
	c := b.clusters[id]
	if c.Size() != l.WorldSize() {
		return nil, fmt.Errorf("sim: cluster %d has %d ranks, the layout %d", id, c.Size(), l.WorldSize())
	}
	out := make([]hier.Rank, len(job.Ranks))
	for i, r := range job.Ranks {
		if r < 0 || r >= c.Size() || b.claimed[id][r] {
			return nil, &fairgo.ArgError{
				Arg:    "sim backend rank",
				Value:  r,
				Reason: fmt.Sprintf("outside [0, %d) or taken twice", c.Size()),
			}
		}
		out[i] = c.Rank(r)
		if out[i].Grid != l.GridOf(r) {
			return nil, fmt.Errorf(
				"sim: rank %d is at %v in the cluster and at %v in the layout",
				r,
				out[i].Grid,
				l.GridOf(r),
			)
		}
	}
	for _, r := range job.Ranks {
		b.claimed[id][r] = true
	}
	return out, nil
}

// Close closes every cluster (close the Reducers first). Later Connects
// fail.
func (b *Backend) Close() error {
	b.mu.Lock()
	cs := b.clusters
	b.clusters, b.claimed, b.closed = nil, nil, true
	b.mu.Unlock()
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
