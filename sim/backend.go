package sim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
)

var _ backend.Backend = (*Backend)(nil)

// keyCluster is the store key under which the process holding global rank
// 0 publishes the cluster it built (as NCCL's unique id is published).
const keyCluster = "sim/cluster"

// Backend is a backend.Backend over simulated clusters, so that setup.New and
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

// NewBackend returns a Backend whose clusters use cfg (its Seed, Jitter,
// StallTimeout, MemoryLimit, AlgoDelay, WorldDelay, ConnectAtFirstCall
// and HangOnMismatch); its Machines, Devices and RankOrder are ignored.
func NewBackend(cfg Config) *Backend {
	return &Backend{cfg: cfg}
}

// newCluster builds the cluster of a placement and returns its id.
func (b *Backend) newCluster(l backend.Placement) (int, error) {
	cfg := b.cfg
	g := l.GridOf(0)
	cfg.Machines, cfg.Devices = g.Machines, g.Devices
	cfg.RankOrder = make([]int, l.WorldSize())
	for r := range cfg.RankOrder {
		cfg.RankOrder[r] = l.GridOf(r).Rank()
	}
	c, err := NewCluster(cfg)
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, errors.Join(fmt.Errorf("sim: backend: %w", fairgo.ErrClosed), c.Close())
	}
	b.clusters = append(b.clusters, c)
	b.claimed = append(b.claimed, map[int]bool{})
	return len(b.clusters) - 1, nil
}

// Connect implements backend.Backend.
func (b *Backend) Connect(ctx context.Context, store backend.Store, job backend.Job) ([]backend.Rank, error) {
	l := job.Places
	if l.Validate() != nil || len(job.Ranks) == 0 {
		return nil, &fairgo.ArgError{
			Arg:    "sim backend job",
			Value:  job.Ranks,
			Reason: "needs a placement and at least one rank",
		}
	}
	v, err := backend.Share(ctx, store, keyCluster, job.Ranks[0] == 0, func() ([]byte, error) {
		id, err := b.newCluster(l)
		return []byte(strconv.Itoa(id)), err
	})
	if err != nil {
		return nil, fmt.Errorf("sim: rank 0's cluster: %w", err)
	}
	id, err := strconv.Atoi(string(v))
	if err != nil {
		return nil, fmt.Errorf("sim: cluster id %q: %w", v, err)
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
		return nil, fmt.Errorf("sim: cluster %d has %d ranks, the placement %d", id, c.Size(), l.WorldSize())
	}
	out := make([]backend.Rank, len(job.Ranks))
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
				"sim: rank %d is at %v in the cluster and at %v in the placement",
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
