package hier

import (
	"fmt"
	"strings"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/staging"
	"github.com/fairgo/fairgo/streams"
)

// Algorithm is how an allreduce crosses the grid.
type Algorithm int

// The algorithms. Their values are part of the C ABI (fairgo_algorithm_t):
// new ones are appended.
const (
	// Auto picks, for each size class, whichever of the others measured
	// fastest on this job's links (a calibration at the first call of the
	// class), the same choice on every rank.
	Auto Algorithm = iota
	// Flat is one NCCL allreduce on the world communicator, with NCCL's
	// own choice of its algorithm.
	Flat
	// RailAllToAll is fairring's two-level pipeline: reduce-scatter inside
	// the machine, an all-to-all on the rail, a reduction kernel, an
	// all-to-all back, an all-gather inside the machine. With one device
	// per machine it is the all-to-all, the kernel and the all-to-all
	// back alone: a reduce-scatter and an all-gather of one step each.
	RailAllToAll
	// RailRSAG is the same pipeline with the rail phase done by NCCL:
	// reduce-scatter then all-gather on the rail communicators.
	RailRSAG
	// RailAllReduce is the hierarchy in one piece, on one stream: an
	// intra-machine reduce-scatter, one NCCL allreduce on the rail, an
	// intra-machine all-gather. It is what a trainer writes by hand, with
	// fairgo's padding, averaging and cross-rank check; where slicing does
	// not pay (the NVLink stages too short to hide, or too costly to
	// repeat), it is the fastest hierarchy.
	RailAllReduce
	// FlatRing is one NCCL allreduce over all ranks on a world
	// communicator of its own on which NCCL runs its ring only. It needs
	// the backend's world variants (backend.Rank.Variants): making the
	// communicator costs one ncclCommSplit of the world, once, at the
	// first call that uses it (with Auto, the calibration of the first
	// size class; with WithAlgorithm, the first call above the flat
	// threshold), and it holds NCCL buffers of the order of the world
	// communicator's for as long as it is kept.
	FlatRing
	// FlatTree is FlatRing with NCCL's tree: its latency grows with the
	// logarithm of the ranks, where NCCL's own choice may still take the
	// ring at small sizes across machines. Same costs as FlatRing.
	FlatTree
	// HalvingDoubling is fairgo's allreduce for small calls on many
	// ranks: Rabenseifner's recursive halving reduce-scatter and recursive
	// doubling all-gather over the world communicator, each step a
	// pairwise exchange and the add kernel, 2·log2(W) steps where NCCL's
	// ring takes 2(W−1) (two more where W is not a power of two). It
	// allocates a scratch buffer of up to half the call (the whole call
	// on a rank that takes a fold; larger calls than 16 MiB run in pieces
	// of 16 MiB) on first use, kept until Close.
	HalvingDoubling
	// RecursiveDoubling is fairgo's allreduce for the smallest calls on
	// many ranks: log2(W) pairwise exchanges of the whole call over the
	// world communicator, each followed by the add kernel (two more where
	// W is not a power of two), half the steps of HalvingDoubling at up
	// to log2(W)/2 times its bytes. Its scratch buffer holds the whole
	// call (up to 16 MiB; larger calls run in pieces). Only by
	// WithAlgorithm: Auto does not time it.
	RecursiveDoubling
	numAlgorithms
)

var algorithmNames = [...]string{
	"auto", "flat", "rail-a2a", "rail-rsag", "rail-allreduce", "flat-ring", "flat-tree", "halving-doubling",
	"recursive-doubling",
}

// algorithms are the implementations, by Algorithm (Auto has none: it
// chooses one of the others).
var algorithms = [numAlgorithms]algorithm{
	Flat:              flatAllReduce{},
	RailAllToAll:      pipelined{railAllToAll{}},
	RailRSAG:          pipelined{railRSAG{}},
	RailAllReduce:     pipelined{railAllReduce{}},
	FlatRing:          flatAllReduce{variant: backend.AlgoRing},
	FlatTree:          flatAllReduce{variant: backend.AlgoTree},
	HalvingDoubling:   halvingDoubling{},
	RecursiveDoubling: recursiveDoubling{},
}

func (a Algorithm) String() string {
	if a >= 0 && a < numAlgorithms {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", int(a))
}

// Valid reports whether a is one of the algorithms.
func (a Algorithm) Valid() bool { return a >= 0 && a < numAlgorithms }

// ParseAlgorithm reads an algorithm's name ("auto", "flat", "rail-a2a",
// "rail-rsag", "rail-allreduce", "flat-ring", "flat-tree",
// "halving-doubling", "recursive-doubling").
func ParseAlgorithm(s string) (Algorithm, error) {
	for a, n := range algorithmNames {
		if n == s {
			return Algorithm(a), nil
		}
	}
	return 0, &fairgo.ArgError{
		Arg:    "algorithm",
		Value:  s,
		Reason: "unknown (" + strings.Join(algorithmNames[:], ", ") + ")",
	}
}

// impl is a's implementation; nil for Auto.
func (a Algorithm) impl() algorithm {
	if a <= Auto || a >= numAlgorithms {
		return nil
	}
	return algorithms[a]
}

// hierarchical reports whether a runs in two levels (machines and rails):
// on one machine it is one flat allreduce.
func (a Algorithm) hierarchical() bool {
	return a == RailAllToAll || a == RailRSAG || a == RailAllReduce
}

// variant is the NCCL algorithm of a world variant (FlatRing, FlatTree),
// "" for the others.
func (a Algorithm) variant() backend.NCCLAlgo {
	if f, ok := a.impl().(flatAllReduce); ok {
		return f.variant
	}
	return ""
}

// algorithm is one way to run an allreduce: it enqueues the whole call on
// the executor as its plan says (the slice, whether the rail is serial)
// and returns the stream its last work is on.
type algorithm interface {
	allReduce(x *executor, t fairgo.Tensor, op fairgo.Op, p plan, first streams.Stream) (
		streams.Stream, error)
	// whole reports whether the algorithm takes a call in one piece (its
	// plan's slice is then the whole call).
	whole() bool
	// stagedReceive reports whether a slice's rail exchange receives into
	// a staging slot on grid g (its slice then fits one).
	stagedReceive(g Grid) bool
	// single reports whether the algorithm is one NCCL allreduce on a
	// communicator of all ranks, on the call's first stream
	// (executor.singleComm).
	single() bool
}

// flatAllReduce is one NCCL allreduce over all ranks, on first: on the
// world communicator (Flat), or on the world variant that runs NCCL's
// ring or tree only (FlatRing, FlatTree), which the router made when it
// planned the call (plan.comm). Either way on executor.singleComm's.
type flatAllReduce struct {
	variant backend.NCCLAlgo // "": the world communicator, NCCL's own choice
}

func (flatAllReduce) allReduce(
	x *executor, t fairgo.Tensor, op fairgo.Op, p plan, first streams.Stream,
) (streams.Stream, error) {
	c := x.singleComm(p)
	if c == nil {
		if p.commErr != nil {
			return nil, p.commErr
		}
		return nil, fmt.Errorf("hier: no world communicator for %v", p.route)
	}
	return first, c.AllReduce(t.Ptr, t.Ptr, t.Count, t.DType, op, first)
}

func (flatAllReduce) whole() bool { return true }

func (flatAllReduce) stagedReceive(Grid) bool { return false }

func (flatAllReduce) single() bool { return true }

// pipelined runs its rail step inside the five-stage pipeline, slice by
// slice (executor.pipeline), its first stage on first.
type pipelined struct{ rail railStep }

func (a pipelined) allReduce(
	x *executor, t fairgo.Tensor, op fairgo.Op, p plan, first streams.Stream,
) (streams.Stream, error) {
	return x.pipeline(t, op, p, a.rail, first)
}

func (a pipelined) whole() bool { return a.rail.whole() }

func (a pipelined) stagedReceive(g Grid) bool { return a.rail.stagedReceive(g) }

func (pipelined) single() bool { return false }

// railStep is the middle of the pipeline, stages 2 to 4 of one slice
// (collect, add, diffuse): what one rail algorithm does between the
// intra-machine reduce-scatter and all-gather. Each stage method enqueues
// every part of the slice on its lane.
type railStep interface {
	collect(c *sliceCall) error
	add(c *sliceCall) error
	diffuse(c *sliceCall) error
	// lanes puts the stages on their streams and communicators, given the
	// default of one each (serial: the plan's rail runs serially).
	lanes(l *lanes, serial bool)
	// stagedReceive reports whether the collect receives into a staging
	// slot on grid g instead of the neighbour's row.
	stagedReceive(g Grid) bool
	whole() bool
}

// serialLanes puts the diffuse on the collect's stream and communicator,
// when the rail runs serially.
func serialLanes(l *lanes, serial bool) {
	if serial {
		l.st[streams.Diffuse] = l.st[streams.Collect]
		l.diffuse = l.collect
	}
}

// railAllToAll is fairring's rail: cell [d][k] goes to machine k, the add
// kernel reduces the M shards received into cell [d][m], which then goes
// back to every machine.
type railAllToAll struct{}

func (railAllToAll) collect(c *sliceCall) error {
	M := c.grid.Machines
	return c.eachPart(func(pt part) error {
		x := pt.cells
		counts, displs := sameCounts(M, x.N), strided(M, x.N)
		return c.l.collect.AllToAllv(x.Row(c.grid.Local), counts, displs, pt.recv, counts, displs, c.dt,
			c.l.st[streams.Collect])
	})
}

func (railAllToAll) add(c *sliceCall) error {
	g := c.grid
	for _, pt := range c.p.parts {
		x := pt.cells
		err := c.dev.ReduceAsync(x.Cell(g.Local, g.Machine), pt.recv, g.Machines, x.N, x.N, c.dt, c.ops.add,
			c.ops.addDivisor, c.l.st[streams.Add])
		if err != nil {
			return err
		}
	}
	return nil
}

func (railAllToAll) diffuse(c *sliceCall) error {
	g := c.grid
	return c.eachPart(func(pt part) error {
		x := pt.cells
		sendCounts := withoutPeer(sameCounts(g.Machines, x.N), g.Machine)
		return c.l.diffuse.AllToAllv(x.Cell(g.Local, g.Machine), sendCounts, make([]int64, g.Machines),
			x.Row(g.Local), sendCounts, strided(g.Machines, x.N), c.dt, c.l.st[streams.Diffuse])
	})
}

func (railAllToAll) lanes(l *lanes, serial bool) { serialLanes(l, serial) }

// stagedReceive: with one device per machine there is no neighbour's row.
func (railAllToAll) stagedReceive(g Grid) bool { return g.Devices == 1 }

func (railAllToAll) whole() bool { return false }

// railRSAG is the rail by NCCL: a reduce-scatter of row d leaves cell
// [d][m] reduced, an all-gather fills the row again; the add stage only
// divides an integer average.
type railRSAG struct{}

func (railRSAG) collect(c *sliceCall) error {
	g := c.grid
	return c.eachPart(func(pt part) error {
		x := pt.cells
		return c.l.collect.ReduceScatter(x.Row(g.Local), x.Cell(g.Local, g.Machine), x.N, c.dt, c.ops.rail,
			c.l.st[streams.Collect])
	})
}

func (railRSAG) add(c *sliceCall) error {
	g := c.grid
	return c.divide(func(x staging.Cells) (uintptr, int64) { return x.Cell(g.Local, g.Machine), x.N })
}

func (railRSAG) diffuse(c *sliceCall) error {
	g := c.grid
	return c.eachPart(func(pt part) error {
		x := pt.cells
		return c.l.diffuse.AllGather(x.Cell(g.Local, g.Machine), x.Row(g.Local), x.N, c.dt, c.l.st[streams.Diffuse])
	})
}

func (railRSAG) lanes(l *lanes, serial bool) { serialLanes(l, serial) }

func (railRSAG) stagedReceive(Grid) bool { return false }

func (railRSAG) whole() bool { return false }

// railAllReduce is the hierarchy in one piece: one NCCL allreduce of the
// whole row on the rail, every stage on the first stream, one
// communicator per level.
type railAllReduce struct{}

func (railAllReduce) collect(c *sliceCall) error {
	d := c.grid.Local
	return c.eachPart(func(pt part) error {
		x := pt.cells
		return c.l.collect.AllReduce(x.Row(d), x.Row(d), x.RowCount(), c.dt, c.ops.rail, c.l.st[streams.Collect])
	})
}

func (railAllReduce) add(c *sliceCall) error {
	d := c.grid.Local
	return c.divide(func(x staging.Cells) (uintptr, int64) { return x.Row(d), x.RowCount() })
}

// diffuse: the allreduce filled the row.
func (railAllReduce) diffuse(*sliceCall) error { return nil }

func (railAllReduce) lanes(l *lanes, _ bool) {
	for s := range streams.NumStages {
		l.st[s] = l.st[streams.ReduceScatter]
	}
	l.intraAG, l.diffuse = l.intraRS, l.collect
}

func (railAllReduce) stagedReceive(Grid) bool { return false }

func (railAllReduce) whole() bool { return true }
