package rendezvous

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/fairgo/fairgo"
)

// DefaultMasterPort is the store port when the environment names none
// (torchrun's default).
const DefaultMasterPort = 29500

// EnvStoreAddr names the variable that gives the store address ("host:port")
// directly; fairrun sets it, and it overrides MASTER_ADDR and MASTER_PORT.
const EnvStoreAddr = "FAIRGO_STORE_ADDR"

// EnvStoreToken names the variable that holds the store's shared token
// (see WithToken and WithDialToken). fairrun generates one per job; with
// other launchers set it yourself, the same on every rank.
const EnvStoreToken = "FAIRGO_STORE_TOKEN"

// Launch is where this process sits in the job, as its launcher told it.
type Launch struct {
	Rank           int    // global rank in [0, WorldSize)
	WorldSize      int    // number of processes in the job
	LocalRank      int    // rank among the processes of this node, in [0, LocalWorldSize)
	LocalWorldSize int    // processes on this node
	MasterAddr     string // host of the store
	MasterPort     int    // port of the store
	StoreAddr      string // "host:port" of the store: FAIRGO_STORE_ADDR, else MasterAddr:MasterPort
	StoreToken     string // the store's shared token (FAIRGO_STORE_TOKEN); "" for none
	Source         string // "torchrun", "slurm" or "openmpi"
}

// ErrNoLaunchEnv: none of the known launchers' variables are set.
var ErrNoLaunchEnv = errors.New("rendezvous: no launch environment (set RANK and WORLD_SIZE as torchrun does, or run under Slurm or Open MPI)")

// ErrInvalidEnv is wrapped by every EnvError.
var ErrInvalidEnv = fmt.Errorf("rendezvous: invalid launch environment: %w", fairgo.ErrInvalidArgument)

// EnvError names a launch variable that is missing, unparsable or
// contradicts another one.
type EnvError struct {
	Var    string // the variable, e.g. "RANK"
	Value  string // its value; empty when missing
	Reason string
}

func (e *EnvError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("rendezvous: launch variable %s: %s", e.Var, e.Reason)
	}
	return fmt.Sprintf("rendezvous: launch variable %s=%q: %s", e.Var, e.Value, e.Reason)
}

// Unwrap returns ErrInvalidEnv.
func (e *EnvError) Unwrap() error { return ErrInvalidEnv }

// LookupFunc reads one environment variable; os.LookupEnv is one.
type LookupFunc func(name string) (string, bool)

// FromEnv reads the launch environment of this process; see FromLookup.
func FromEnv() (Launch, error) { return FromLookup(os.LookupEnv) }

// FromLookup reads a launch environment through lookup. The first launcher
// whose rank variable is set wins: torchrun (RANK), Open MPI
// (OMPI_COMM_WORLD_RANK), then Slurm (SLURM_PROCID). The store address comes
// from FAIRGO_STORE_ADDR when set, else MASTER_ADDR and MASTER_PORT (under
// Slurm MASTER_ADDR defaults to SLURM_LAUNCH_NODE_IPADDR; outside torchrun
// MASTER_PORT defaults to DefaultMasterPort).
func FromLookup(lookup LookupFunc) (Launch, error) {
	e := envReader{lookup: lookup}
	var l Launch
	switch {
	case e.has("RANK") || e.has("WORLD_SIZE"):
		l.Source = "torchrun"
		l.Rank = e.int("RANK", 0)
		l.WorldSize = e.int("WORLD_SIZE", 1)
		l.LocalRank = e.int("LOCAL_RANK", 0)
		l.LocalWorldSize = e.int("LOCAL_WORLD_SIZE", 1)
	case e.has("OMPI_COMM_WORLD_RANK"):
		l.Source = "openmpi"
		l.Rank = e.int("OMPI_COMM_WORLD_RANK", 0)
		l.WorldSize = e.int("OMPI_COMM_WORLD_SIZE", 1)
		l.LocalRank = e.int("OMPI_COMM_WORLD_LOCAL_RANK", 0)
		l.LocalWorldSize = e.int("OMPI_COMM_WORLD_LOCAL_SIZE", 1)
	case e.has("SLURM_PROCID"):
		l.Source = "slurm"
		l.Rank = e.int("SLURM_PROCID", 0)
		if e.has("SLURM_NTASKS") || !e.has("SLURM_NPROCS") {
			l.WorldSize = e.int("SLURM_NTASKS", 1)
		} else {
			l.WorldSize = e.int("SLURM_NPROCS", 1)
		}
		l.LocalRank = e.int("SLURM_LOCALID", 0)
		l.LocalWorldSize = e.slurmTasksOnNode()
	default:
		return Launch{}, ErrNoLaunchEnv
	}
	if e.err != nil {
		return Launch{}, e.err
	}
	e.storeAddr(&l)
	l.StoreToken, _ = e.get(EnvStoreToken)
	if e.err != nil {
		return Launch{}, e.err
	}
	return l, l.validate()
}

// validate checks the numbers against each other.
func (l Launch) validate() error {
	names := map[string][4]string{
		"torchrun": {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
		"openmpi":  {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
		"slurm":    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
	}[l.Source]
	itoa := strconv.Itoa
	switch {
	case l.WorldSize < 1:
		return &EnvError{names[1], itoa(l.WorldSize), "must be at least 1"}
	case l.Rank < 0 || l.Rank >= l.WorldSize:
		return &EnvError{names[0], itoa(l.Rank), fmt.Sprintf("outside [0, %s=%d)", names[1], l.WorldSize)}
	case l.LocalWorldSize < 1:
		return &EnvError{names[3], itoa(l.LocalWorldSize), "must be at least 1"}
	case l.LocalWorldSize > l.WorldSize:
		return &EnvError{names[3], itoa(l.LocalWorldSize), fmt.Sprintf("larger than %s=%d", names[1], l.WorldSize)}
	case l.LocalRank < 0 || l.LocalRank >= l.LocalWorldSize:
		return &EnvError{names[2], itoa(l.LocalRank), fmt.Sprintf("outside [0, %s=%d)", names[3], l.LocalWorldSize)}
	}
	return nil
}

type envReader struct {
	lookup LookupFunc
	err    error // the first error
}

func (e *envReader) get(name string) (string, bool) {
	v, ok := e.lookup(name)
	v = strings.TrimSpace(v)
	return v, ok && v != ""
}

func (e *envReader) has(name string) bool { _, ok := e.get(name); return ok }

func (e *envReader) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

// int reads a required integer variable; on error it records it and returns
// def so that later checks stay quiet.
func (e *envReader) int(name string, def int) int {
	v, ok := e.get(name)
	if !ok {
		e.fail(&EnvError{Var: name, Reason: "missing"})
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		e.fail(&EnvError{Var: name, Value: v, Reason: "not an integer"})
		return def
	}
	return n
}

// slurmTasksOnNode reads SLURM_NTASKS_PER_NODE, else this node's entry of
// SLURM_TASKS_PER_NODE ("2(x3),1": three nodes of 2 then one of 1) indexed by
// SLURM_NODEID.
func (e *envReader) slurmTasksOnNode() int {
	if e.has("SLURM_NTASKS_PER_NODE") {
		return e.int("SLURM_NTASKS_PER_NODE", 1)
	}
	v, ok := e.get("SLURM_TASKS_PER_NODE")
	if !ok {
		e.fail(&EnvError{Var: "SLURM_NTASKS_PER_NODE", Reason: "missing (and SLURM_TASKS_PER_NODE too)"})
		return 1
	}
	counts, err := parseSlurmTasksPerNode(v)
	if err != nil {
		e.fail(&EnvError{Var: "SLURM_TASKS_PER_NODE", Value: v, Reason: err.Error()})
		return 1
	}
	node := 0
	if len(counts) > 1 {
		node = e.int("SLURM_NODEID", 0)
	} else if e.has("SLURM_NODEID") {
		node = e.int("SLURM_NODEID", 0)
	}
	if node < 0 || node >= len(counts) {
		nv, _ := e.get("SLURM_NODEID")
		e.fail(&EnvError{Var: "SLURM_NODEID", Value: nv, Reason: fmt.Sprintf("outside the %d nodes of SLURM_TASKS_PER_NODE=%q", len(counts), v)})
		return 1
	}
	return counts[node]
}

// parseSlurmTasksPerNode expands Slurm's compressed per-node task counts.
func parseSlurmTasksPerNode(v string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(v, ",") {
		n, rep := part, "1"
		if i := strings.Index(part, "(x"); i >= 0 && strings.HasSuffix(part, ")") {
			n, rep = part[:i], part[i+2:len(part)-1]
		}
		c, err1 := strconv.Atoi(n)
		r, err2 := strconv.Atoi(rep)
		if err1 != nil || err2 != nil || c < 1 || r < 1 || r > 1<<20 {
			return nil, fmt.Errorf("bad entry %q (want N or N(xK))", part)
		}
		for range r {
			out = append(out, c)
		}
	}
	return out, nil
}

func (e *envReader) storeAddr(l *Launch) {
	if v, ok := e.get(EnvStoreAddr); ok {
		host, port, err := net.SplitHostPort(v)
		p, perr := strconv.Atoi(port)
		if err != nil || perr != nil || p < 1 || p > 65535 || host == "" {
			e.fail(&EnvError{Var: EnvStoreAddr, Value: v, Reason: "want host:port"})
			return
		}
		l.MasterAddr, l.MasterPort, l.StoreAddr = host, p, v
		return
	}
	addr, ok := e.get("MASTER_ADDR")
	if !ok && l.Source == "slurm" {
		addr, ok = e.get("SLURM_LAUNCH_NODE_IPADDR")
	}
	if !ok {
		reason := "missing (and " + EnvStoreAddr + " too)"
		if l.Source == "slurm" {
			reason = "missing (and SLURM_LAUNCH_NODE_IPADDR and " + EnvStoreAddr + " too)"
		}
		e.fail(&EnvError{Var: "MASTER_ADDR", Reason: reason})
		return
	}
	port := DefaultMasterPort
	if l.Source == "torchrun" || e.has("MASTER_PORT") {
		port = e.int("MASTER_PORT", DefaultMasterPort)
		if e.err != nil {
			return
		}
		if port < 1 || port > 65535 {
			e.fail(&EnvError{Var: "MASTER_PORT", Value: strconv.Itoa(port), Reason: "outside [1, 65535]"})
			return
		}
	}
	l.MasterAddr, l.MasterPort = addr, port
	l.StoreAddr = net.JoinHostPort(addr, strconv.Itoa(port))
}
