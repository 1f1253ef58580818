package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
)

// Algorithm is one way to allreduce.
type Algorithm int

// The algorithms, in the order the table shows them.
const (
	// Flat is one NCCL allreduce on the world communicator.
	Flat Algorithm = iota
	// Naive is the hierarchy written by hand on one stream: NCCL
	// reduce-scatter inside the machine, allreduce on the rail, all-gather
	// inside the machine.
	Naive
	// Fairgo is hier.Reducer.AllReduce.
	Fairgo
	numAlgorithms
)

// Algorithms lists every algorithm.
var Algorithms = []Algorithm{Flat, Naive, Fairgo}

var algNames = [...]string{"flat", "naive", "fairgo"}

func (a Algorithm) String() string {
	if a >= 0 && a < numAlgorithms {
		return algNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", int(a))
}

// ParseAlgorithms reads a comma-separated list of algorithm names.
func ParseAlgorithms(s string) ([]Algorithm, error) {
	var out []Algorithm
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		found := false
		for a, n := range algNames {
			if n == f {
				out = append(out, Algorithm(a))
				found = true
			}
		}
		if !found {
			return nil, &fairgo.ArgError{Arg: "-algos", Value: f, Reason: "unknown algorithm (flat, naive, fairgo)"}
		}
	}
	if len(out) == 0 {
		return nil, &fairgo.ArgError{Arg: "-algos", Value: s, Reason: "empty list"}
	}
	return out, nil
}

// caller enqueues calls of the algorithms for one rank on its stream.
type caller struct {
	idx   int // index among the testbed's local ranks
	rank  Rank
	red   *hier.Reducer
	op    fairgo.Op
	works []*hier.Work // fairgo calls whose completion is still to be checked
}

// call enqueues one allreduce of t with alg on the rank's stream. t.Bytes
// must leave room for t.Count rounded up to a multiple of D (the naive
// hierarchy pads; padding elements are reduced too and never read back).
func (c *caller) call(ctx context.Context, alg Algorithm, t fairgo.Tensor) error {
	s := c.rank.Stream()
	hr := c.rank.Hier()
	cm := hr.Comms
	switch alg {
	case Flat:
		return cm.World.AllReduce(t.Ptr, t.Ptr, t.Count, t.DType, c.op, s)
	case Naive:
		g := hr.Grid
		D := int64(g.Devices)
		chunk := (t.Count + D - 1) / D
		if chunk*D*int64(t.DType.Size()) > t.Bytes {
			return fmt.Errorf("bench: naive hierarchy: buffer of %d bytes has no room to pad %d elements to a multiple of %d", t.Bytes, t.Count, D)
		}
		mine := t.Ptr + uintptr(int64(g.Local)*chunk*int64(t.DType.Size()))
		if D > 1 {
			if err := cm.IntraReduceScatter.ReduceScatter(t.Ptr, mine, chunk, t.DType, c.op, s); err != nil {
				return err
			}
		}
		if g.Machines > 1 {
			if err := cm.RailCollect.AllReduce(mine, mine, chunk, t.DType, c.op, s); err != nil {
				return err
			}
		}
		if D > 1 {
			return cm.IntraReduceScatter.AllGather(mine, t.Ptr, chunk, t.DType, s)
		}
		return nil
	case Fairgo:
		w := c.red.AllReduce(ctx, t, c.op, hier.After(s))
		c.works = append(c.works, w)
		return w.StreamWait(ctx, s)
	}
	return fmt.Errorf("bench: %v: unknown algorithm", alg)
}

// wait returns the first error of the fairgo calls enqueued since the last
// wait (their device work is complete once the stream is idle).
func (c *caller) wait(ctx context.Context) error {
	var errs []error
	for _, w := range c.works {
		errs = append(errs, w.Wait(ctx))
	}
	c.works = c.works[:0]
	return errors.Join(errs...)
}
