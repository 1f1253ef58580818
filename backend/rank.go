package backend

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/fairgo/fairgo"
)

// Comms are the six communicators of one rank. Intra communicators hold
// the D ranks of this machine ranked by local index; rail communicators hold
// the M ranks with this local index ranked by machine index. Each pipeline
// stage that talks has its own communicator so that stages of different
// slices run concurrently without NCCL ordering deadlocks; the check
// communicator carries the cross-rank consistency check of every call,
// beside the data.
type Comms struct {
	World              Comm // all ranks, in the launcher's global order
	IntraReduceScatter Comm // stage 1 (and flat work inside a machine)
	IntraAllGather     Comm // stage 5
	RailCollect        Comm // stage 2
	RailDiffuse        Comm // stage 4
	Check              Comm // all ranks, any order: the consistency check
}

// Store is a small key-value store shared by the ranks of a job: backends
// exchange what their communicators are made from through it (Share), and
// Reducers leave word of a failure there for their peers (which rank timed
// out, how far each rank got). A rendezvous store satisfies it. Get blocks
// until the key exists or ctx ends.
type Store interface {
	Set(ctx context.Context, key string, value []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
}

// Rank bundles what the engine needs for one rank: its device, its place in
// the grid and its communicators. The caller keeps ownership of the device
// and the communicators unless OwnsResources is set, in which case the
// Reducer releases them on Close (Release).
type Rank struct {
	Grid          fairgo.Grid
	Device        Device
	Comms         Comms
	OwnsResources bool
	// Board, when set, lets the Reducers of a job tell each other why they
	// failed: a timeout on one rank then reads as a timeout on all, with
	// the call each rank reached. Nil: each rank knows only its own cause.
	// Every rank of a job must be given the same board, or none. A board
	// serves one Reducer per rank: the notes they leave there (a timeout, a
	// refusal, a mismatch, the shape of a call long undecided, by call
	// number) concern their calls, so Reducers built again
	// over the same ranks need a board of their own (setup's is the job's
	// store under its prefix: setup.WithStorePrefix tells two jobs apart).
	Board Store
	// Closers run after the communicators and the device are closed, when
	// OwnsResources is set (setup code hands over the store it opened).
	Closers []func() error
	// Variants, when set, makes copies of the world communicator with one
	// NCCL algorithm each (Auto's flat-ring and flat-tree candidates).
	// Nil: those candidates are not offered. Communicators it made belong
	// to whoever asked for them, not to the Rank.
	Variants Variants
}

// Release closes the rank's distinct communicators, then its device, then
// runs its Closers, and joins their errors.
func (r Rank) Release() error {
	var errs []error
	for _, c := range r.Comms.Distinct() {
		errs = append(errs, c.Close())
	}
	if r.Device != nil {
		errs = append(errs, r.Device.Close())
	}
	for _, fn := range r.Closers {
		errs = append(errs, fn())
	}
	return errors.Join(errs...)
}

// Distinct is the non-nil communicators, each once.
func (c Comms) Distinct() []Comm {
	var out []Comm
	for _, cm := range []Comm{c.World, c.IntraReduceScatter, c.IntraAllGather, c.RailCollect, c.RailDiffuse, c.Check} {
		if cm != nil && !slices.Contains(out, cm) {
			out = append(out, cm)
		}
	}
	return out
}

// Validate reports, as an *fairgo.ArgError, a rank without a device, or
// whose communicators are missing or do not fit its grid.
func (r Rank) Validate() error {
	if err := r.Grid.Validate(); err != nil {
		return err
	}
	if r.Device == nil {
		return &fairgo.ArgError{Arg: "rank device", Value: nil, Reason: "missing"}
	}
	c := r.Comms
	check := func(name string, cm Comm, size, rank int) error {
		if cm == nil {
			if size == 1 {
				return nil // a one-rank communicator may be omitted
			}
			return &fairgo.ArgError{Arg: name + " communicator", Value: nil, Reason: "missing"}
		}
		if cm.Size() != size || cm.Rank() != rank {
			return &fairgo.ArgError{
				Arg:    name + " communicator",
				Value:  fmt.Sprintf("rank %d of %d", cm.Rank(), cm.Size()),
				Reason: fmt.Sprintf("grid %v needs rank %d of %d", r.Grid, rank, size),
			}
		}
		return nil
	}
	g := r.Grid
	if c.World == nil || c.World.Size() != g.Size() {
		return &fairgo.ArgError{
			Arg:    "world communicator",
			Value:  c.World,
			Reason: fmt.Sprintf("must hold %d ranks", g.Size()),
		}
	}
	if g.Size() > 1 && (c.Check == nil || c.Check.Size() != g.Size() || c.Check == c.World) {
		return &fairgo.ArgError{
			Arg:    "check communicator",
			Value:  c.Check,
			Reason: fmt.Sprintf("must hold the %d ranks, apart from the world communicator", g.Size()),
		}
	}
	for _, x := range []struct {
		name       string
		cm         Comm
		size, rank int
	}{
		{"intra reduce-scatter", c.IntraReduceScatter, g.Devices, g.Local},
		{"intra all-gather", c.IntraAllGather, g.Devices, g.Local},
		{"rail collect", c.RailCollect, g.Machines, g.Machine},
		{"rail diffuse", c.RailDiffuse, g.Machines, g.Machine},
	} {
		if err := check(x.name, x.cm, x.size, x.rank); err != nil {
			return err
		}
	}
	return nil
}
