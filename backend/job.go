package backend

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/fairgo/fairgo"
)

// Backend opens the devices of a process's ranks and builds their
// communicators, once topology discovery has given every rank the same
// placement. The CUDA backend (cuda.Backend) and the simulated cluster
// (sim.Backend) implement it; setup.New calls it.
type Backend interface {
	// Connect returns one Rank per entry of job.Ranks, in that order, each
	// with its Device and its communicators (Grid may be left zero: the
	// caller fills it from the placement). Every process of the job calls
	// it concurrently with the same placement; store is shared by them
	// all, under a prefix of its own. On error it releases whatever it
	// opened. Every blocking step ends when ctx does.
	Connect(ctx context.Context, store Store, job Job) ([]Rank, error)
}

// Job is what a Backend is told: where every rank of the job sits and
// which of them this process drives.
type Job struct {
	Places  Placement    // the grid place of every global rank
	Ranks   []int        // global ranks this process drives, ascending
	Devices []int        // the CUDA device ordinal of each, parallel to Ranks
	Logger  *slog.Logger // never nil
}

// Placement is the grid place of every global rank of a job, indexed by
// global rank; every entry has the same Machines × Devices shape.
type Placement []fairgo.Grid

// WorldSize is the number of ranks.
func (p Placement) WorldSize() int { return len(p) }

// GridOf is the place of global rank r.
func (p Placement) GridOf(r int) fairgo.Grid { return p[r] }

// RankAt is the global rank at machine m, local index d, or -1 when no
// rank sits there.
func (p Placement) RankAt(m, d int) int {
	for r, g := range p {
		if g.Machine == m && g.Local == d {
			return r
		}
	}
	return -1
}

// Validate reports a placement that is not one rank per cell of one
// M × D grid.
func (p Placement) Validate() error {
	bad := func(why string) error {
		return &fairgo.ArgError{Arg: "placement", Value: len(p), Reason: why}
	}
	if len(p) == 0 {
		return bad("no ranks")
	}
	shape := p[0]
	if shape.Size() != len(p) {
		return bad(fmt.Sprintf("a %d × %d grid for %d ranks", shape.Machines, shape.Devices, len(p)))
	}
	seen := make([]bool, len(p))
	for r, g := range p {
		if err := g.Validate(); err != nil {
			return fmt.Errorf("backend: rank %d: %w", r, err)
		}
		if g.Machines != shape.Machines || g.Devices != shape.Devices {
			return bad(fmt.Sprintf("rank %d is on a %d × %d grid, rank 0 on %d × %d",
				r, g.Machines, g.Devices, shape.Machines, shape.Devices))
		}
		if seen[g.Rank()] {
			return bad(fmt.Sprintf("rank %d shares machine %d, local %d with another", r, g.Machine, g.Local))
		}
		seen[g.Rank()] = true
	}
	return nil
}

// Share hands the ranks of a job one value under key: the leader makes it
// with create and publishes it, the others wait for it (an NCCL unique id,
// the id of a simulated cluster). Every step ends when ctx does.
func Share(ctx context.Context, store Store, key string, leader bool, create func() ([]byte, error)) ([]byte, error) {
	if leader {
		v, err := create()
		if err != nil {
			return nil, err
		}
		if err := store.Set(ctx, key, v); err != nil {
			return nil, fmt.Errorf("publishing %s: %w", key, err)
		}
		return v, nil
	}
	v, err := store.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("waiting for %s: %w", key, err)
	}
	return v, nil
}
