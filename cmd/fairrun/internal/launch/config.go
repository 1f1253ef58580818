// Package launch is fairrun's library: it parses the command line, plans
// each worker's environment (torchrun variables, emulated machines, GPU
// pinning) and runs the workers as one group that lives and dies together.
//
// The group hosts the rendezvous store on node rank 0, prefixes every output
// line with the worker's rank, and on the first failure or a signal stops
// every worker (SIGTERM, then SIGKILL after a grace period).
package launch

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"
)

// Defaults of the command line.
const (
	DefaultGrace      = 5 * time.Second
	DefaultMasterAddr = "127.0.0.1"
	DefaultMasterPort = 29500 // with --nnodes > 1; a single node picks a free port
)

// Config is one fairrun invocation.
type Config struct {
	NProcPerNode    int    // workers on this node
	NNodes          int    // nodes in the job
	NodeRank        int    // this node's index in [0, NNodes)
	MasterAddr      string // host of the store (node rank 0)
	MasterPort      int    // port of the store; 0: a free port (single node only)
	EmulateMachines int    // split this node's workers into this many virtual machines; 0: off
	GPUs            int    // GPUs to spread emulated machines over; 0: detect
	Shuffle         bool   // permute global ranks across this node's workers
	ShuffleSeed     uint64 // the permutation's seed
	Grace           time.Duration

	Program string   // the worker program
	Args    []string // its arguments

	Env    []string     // the workers' base environment; nil: os.Environ()
	Stdout io.Writer    // where prefixed worker stdout goes; nil: os.Stdout
	Stderr io.Writer    // where prefixed worker stderr and fairrun's messages go; nil: os.Stderr
	Logger *slog.Logger // nil: a text logger on Stderr
}

// ErrUsage wraps every command-line error.
var ErrUsage = errors.New("fairrun: invalid command line")

// UsageError names the flag at fault. It wraps ErrUsage.
type UsageError struct {
	Flag   string
	Value  any
	Reason string
}

func (e *UsageError) Error() string {
	return fmt.Sprintf("fairrun: --%s %v: %s", e.Flag, e.Value, e.Reason)
}

// Unwrap returns ErrUsage.
func (e *UsageError) Unwrap() error { return ErrUsage }

// Usage is the synopsis printed with command-line errors.
const Usage = `usage: fairrun --nproc-per-node N [--nnodes K --node-rank I --master-addr A --master-port P]
               [--emulate-machines M [--gpus G]] [--shuffle-ranks SEED] [--grace D] -- prog args...`

// ParseArgs reads fairrun's command line (without the program name). Flags
// come first; the worker program and its arguments follow "--" (or the
// first argument that is not a flag).
func ParseArgs(args []string) (Config, error) {
	c := Config{NNodes: 1, MasterAddr: DefaultMasterAddr, MasterPort: -1, Grace: DefaultGrace}
	fs := flag.NewFlagSet("fairrun", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.IntVar(&c.NProcPerNode, "nproc-per-node", 0, "workers on this node")
	fs.IntVar(&c.NNodes, "nnodes", 1, "nodes in the job")
	fs.IntVar(&c.NodeRank, "node-rank", 0, "this node's rank")
	fs.StringVar(&c.MasterAddr, "master-addr", DefaultMasterAddr, "host of the store (node rank 0)")
	fs.IntVar(&c.MasterPort, "master-port", -1, "port of the store")
	fs.IntVar(&c.EmulateMachines, "emulate-machines", 0, "virtual machines on this node")
	fs.IntVar(&c.GPUs, "gpus", 0, "GPUs for emulated machines (default: nvidia-smi -L, else 1)")
	fs.DurationVar(&c.Grace, "grace", DefaultGrace, "time between SIGTERM and SIGKILL")
	fs.Func("shuffle-ranks", "permute global ranks with this seed", func(s string) error {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return fmt.Errorf("seed %q is not an unsigned integer", s)
		}
		c.Shuffle, c.ShuffleSeed = true, v
		return nil
	})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, fmt.Errorf("%w\n%s", ErrUsage, Usage)
		}
		return Config{}, fmt.Errorf("%w: %v\n%s", ErrUsage, err, Usage)
	}
	rest := fs.Args()
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	if len(rest) == 0 {
		return Config{}, fmt.Errorf("%w: no worker program\n%s", ErrUsage, Usage)
	}
	c.Program, c.Args = rest[0], rest[1:]
	if c.MasterPort < 0 {
		c.MasterPort = 0
		if c.NNodes > 1 {
			c.MasterPort = DefaultMasterPort
		}
	}
	return c, c.Validate()
}

// Validate checks the configuration, naming the flag at fault.
func (c Config) Validate() error {
	bad := func(flag string, v any, reason string) error {
		return &UsageError{Flag: flag, Value: v, Reason: reason}
	}
	switch {
	case c.NProcPerNode < 1:
		return bad("nproc-per-node", c.NProcPerNode, "must be at least 1")
	case c.NNodes < 1:
		return bad("nnodes", c.NNodes, "must be at least 1")
	case c.NodeRank < 0 || c.NodeRank >= c.NNodes:
		return bad("node-rank", c.NodeRank, fmt.Sprintf("outside [0, --nnodes=%d)", c.NNodes))
	case c.MasterPort < 0 || c.MasterPort > 65535:
		return bad("master-port", c.MasterPort, "outside [0, 65535]")
	case c.MasterPort == 0 && c.NNodes > 1:
		return bad("master-port", c.MasterPort, "a job of several nodes needs a fixed port")
	case c.MasterAddr == "":
		return bad("master-addr", `""`, "empty")
	case c.EmulateMachines < 0:
		return bad("emulate-machines", c.EmulateMachines, "negative")
	case c.EmulateMachines > 0 && c.NProcPerNode%c.EmulateMachines != 0:
		return bad("emulate-machines", c.EmulateMachines, fmt.Sprintf("does not divide --nproc-per-node=%d", c.NProcPerNode))
	case c.GPUs < 0:
		return bad("gpus", c.GPUs, "negative")
	case c.Grace < 0:
		return bad("grace", c.Grace, "negative")
	case c.Program == "":
		return fmt.Errorf("%w: no worker program", ErrUsage)
	}
	return nil
}

func (c Config) stdout() io.Writer {
	if c.Stdout == nil {
		return os.Stdout
	}
	return c.Stdout
}

func (c Config) stderr() io.Writer {
	if c.Stderr == nil {
		return os.Stderr
	}
	return c.Stderr
}

func (c Config) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.New(slog.NewTextHandler(c.stderr(), nil))
}
