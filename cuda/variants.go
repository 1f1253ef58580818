package cuda

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
)

var _ backend.Variants = (*Variants)(nil)

// Variants is one rank's backend.Variants: World duplicates the rank's
// world communicator (ncclCommSplit, color 0, key = its rank) while
// NCCL_ALGO restricts the allreduce to one algorithm, so that NCCL
// initialises the copy with that algorithm only. Backend.Connect and
// NewLocalRanks give every rank one where NCCL has ncclCommSplit (and
// Backend.NoSplit is off).
//
// What a copy costs: one ncclCommSplit to make (a collective
// initialisation that returns once every rank of the world has joined,
// as the world communicator's own making does), and while it lives device
// memory of the order of the world communicator's own: NCCL allocates its
// buffers per peer and per channel for each communicator, and a copy
// shares none with its parent. With NCCL 2.28, a copy of a world of two
// H100s of one host took about 47 ms and 197 MiB on each GPU (NVLink, 24
// channels), and between two machines emulated on them (sockets) about
// 12 ms and 17 MiB. Close (ncclCommDestroy) frees them.
//
// World may be called from several goroutines, and several ranks of one
// process may call it at once (each rank from its own goroutine, as hier's
// engines do): the process environment holds one NCCL_ALGO value at a
// time (algoWindow), so a call with another algorithm than the splits in
// progress waits for them. Every NCCL communicator that this process
// initialises meanwhile, by whatever code, reads the same value.
type Variants struct {
	world *Comm
}

// NewVariants returns the Variants of the rank whose world communicator
// is world.
func NewVariants(world *Comm) (*Variants, error) {
	if world == nil {
		return nil, &fairgo.ArgError{Arg: "world communicator", Value: nil, Reason: "missing"}
	}
	return &Variants{world: world}, nil
}

// World implements backend.Variants: this rank's copy of the world
// communicator named "flat-<algo>" ("flat-tree", "flat-ring"), on which
// NCCL's allreduce uses algo only. An algorithm other than backend.AlgoRing
// and backend.AlgoTree is an *fairgo.ArgError. When ctx ends before the
// other ranks have joined, World returns ctx's error; the split, which
// NCCL cannot interrupt, is aborted in the background should it ever
// complete.
func (v *Variants) World(ctx context.Context, algo backend.NCCLAlgo) (backend.Comm, error) {
	cs, err := DuplicateAlgo(ctx, []*Comm{v.world}, algo, "flat-"+string(algo))
	if err != nil {
		return nil, err
	}
	return cs[0], nil
}

// DuplicateAlgo is Duplicate while NCCL_ALGO restricts the allreduce to
// algo (backend.AlgoRing or backend.AlgoTree; others are an
// *fairgo.ArgError): the copies run their allreduce with that algorithm
// only, their other collectives as NCCL chooses. Every rank of the
// communicator, in every process, must call it with the same algo. The
// environment is set through algoWindow, so concurrent calls of this
// process with the same algo share the setting and calls with another wait
// for them; it is restored once the last split under it has returned.
func DuplicateAlgo(ctx context.Context, comms []*Comm, algo backend.NCCLAlgo, name string) ([]*Comm, error) {
	if len(comms) == 0 || comms[0] == nil {
		return duplicate(ctx, comms, name, "") // duplicate says what is wrong
	}
	value, err := ncclAlgoValue(comms[0].lib.Version(), algo)
	if err != nil {
		return nil, err
	}
	return duplicate(ctx, comms, name, value)
}

// perCollectiveAlgoVersion is the first NCCL that reads NCCL_ALGO per
// collective ("allreduce:tree"); older ones take one list for all
// collectives and would enable no algorithm at all for that spelling.
const perCollectiveAlgoVersion = 22400

// ncclAlgoValue is the NCCL_ALGO value that restricts the allreduce of an
// NCCL of version code version to algo: "allreduce:<algo>" from NCCL 2.24,
// else the algorithm alone ("Tree"), which restricts every collective of
// the communicator: the same for its allreduce, the only collective its
// users run on it.
func ncclAlgoValue(version int, algo backend.NCCLAlgo) (string, error) {
	switch algo {
	case backend.AlgoRing, backend.AlgoTree:
	default:
		return "", &fairgo.ArgError{
			Arg:    "NCCL algorithm",
			Value:  algo,
			Reason: fmt.Sprintf("%q or %q", backend.AlgoRing, backend.AlgoTree),
		}
	}
	if version >= perCollectiveAlgoVersion {
		return "allreduce:" + string(algo), nil
	}
	s := string(algo)
	return strings.ToUpper(s[:1]) + s[1:], nil
}

// algoWindow is the process's NCCL_ALGO while its splits run: NCCL reads
// the variable from the process environment when it initialises a
// communicator, and the ranks of one process split concurrently, each
// blocked until every rank of the world has joined.
var algoWindow = envWindow{name: "NCCL_ALGO"}

// envWindow holds an environment variable at one value for as long as any
// of its users needs it. Users of the same value share the window (the
// ranks of one process must all be inside at once: each one's split waits
// for the others); a user of another value waits until the window has
// closed. When the last user leaves, the variable is restored to what it
// was when the window opened, set or unset. It does not guard against code
// that changes the variable behind its back.
type envWindow struct {
	name string

	mu     sync.Mutex
	value  string        // the value while open
	users  int           // 0: closed
	prev   string        // the variable before the window opened
	had    bool          // whether it was set then
	closed chan struct{} // closed when the open window closes; nil while none waits
}

// enter waits until the window is closed or open with value, opens it
// with value if closed, and counts the caller in; or returns ctx's error
// when ctx ends first. Every successful enter must be followed by leave.
func (w *envWindow) enter(ctx context.Context, value string) error {
	for {
		w.mu.Lock()
		if w.users == 0 {
			prev, had := os.LookupEnv(w.name)
			if err := os.Setenv(w.name, value); err != nil {
				w.mu.Unlock()
				return fmt.Errorf("cuda: setting %s=%s: %w", w.name, value, err)
			}
			w.value, w.prev, w.had = value, prev, had
		}
		if w.value == value {
			w.users++
			w.mu.Unlock()
			return nil
		}
		if w.closed == nil {
			w.closed = make(chan struct{})
		}
		closed, other := w.closed, w.value
		w.mu.Unlock()
		select {
		case <-closed:
		case <-ctx.Done():
			return fmt.Errorf("cuda: waiting to set %s=%s while %s=%s is in use: %w",
				w.name, value, w.name, other, ctx.Err())
		}
	}
}

// leave counts the caller out; the last one out restores the variable and
// lets the waiters in.
func (w *envWindow) leave() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.users == 0 {
		return errors.New("cuda: leaving the " + w.name + " window, which is closed")
	}
	w.users--
	if w.users > 0 {
		return nil
	}
	err := os.Unsetenv(w.name)
	if w.had {
		err = os.Setenv(w.name, w.prev)
	}
	if err != nil {
		err = fmt.Errorf("cuda: restoring %s: %w", w.name, err)
	}
	if w.closed != nil {
		close(w.closed)
		w.closed = nil
	}
	return err
}

// within runs fn inside the window of value.
func (w *envWindow) within(ctx context.Context, value string, fn func() error) error {
	if err := w.enter(ctx, value); err != nil {
		return err
	}
	err := fn()
	return errors.Join(err, w.leave())
}
