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

// EnvStorePort names the variable that sets the port of the store rank 0
// hosts (launchers without a store of their own); without it the port is
// MASTER_PORT+1, so that it cannot collide with the c10d TCPStore that
// PyTorch's rank 0 (or torchrun's agent) serves on MASTER_PORT itself.
const EnvStorePort = "FAIRGO_STORE_PORT"

// Launchers, as Launch.Launcher names them.
const (
	LauncherFairrun  = "fairrun"  // FAIRGO_STORE_ADDR is set: a fairgo store is given (fairrun sets it)
	LauncherTorchrun = "torchrun" // RANK... and TORCHELASTIC_* variables: torchrun (torch.distributed.run)
	LauncherEnv      = "env"      // RANK... without TORCHELASTIC_*: any launcher that sets torchrun's variables
	LauncherSlurm    = "slurm"    // SLURM_PROCID...: srun
	LauncherOpenMPI  = "openmpi"  // OMPI_COMM_WORLD_RANK...: Open MPI's mpirun
)

// Store kinds, as Launch.StoreKind names them: how Open gets this process's
// store.
const (
	StoreMemory = "memory" // a single process: a store in memory
	StoreFairgo = "fairgo" // dial the fairgo store at StoreAddr (FAIRGO_STORE_ADDR)
	StoreC10d   = "c10d"   // dial torchrun's agent store at StoreAddr (c10d TCPStore protocol)
	StoreRank0  = "rank0"  // rank 0 hosts a fairgo store at StoreAddr; the others dial it
)

// Launch is where this process sits in the job, as its launcher told it.
type Launch struct {
	// global rank in [0, WorldSize)
	Rank int
	// number of processes in the job
	WorldSize int
	// rank among the processes of this node, in [0, LocalWorldSize)
	LocalRank int
	// processes on this node
	LocalWorldSize int
	// MASTER_ADDR (or derived, see FromLookup), or the host of FAIRGO_STORE_ADDR
	MasterAddr string
	// MASTER_PORT (or derived), or the port of FAIRGO_STORE_ADDR
	MasterPort int
	// "host:port" of the store this process uses (see StoreKind)
	StoreAddr string
	// the store's shared token (FAIRGO_STORE_TOKEN); "" for none
	StoreToken string
	// whose variables gave the rank: "torchrun" (RANK...), "slurm" or "openmpi"
	Source string
	// who launched the process: a Launcher* constant; "" when made by hand
	Launcher string
	// a Store* constant; "" when made by hand (Open then infers it)
	StoreKind string
	// TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent serves a c10d store at MASTER_ADDR:MASTER_PORT
	AgentStore bool
	// TORCHELASTIC_RESTART_COUNT: torchrun's attempt number (0 first)
	RestartCount int
	Vars         []EnvVar
}

// EnvVar is one variable FromLookup read, for error messages: which
// variables a launch was derived from. The token's value is never kept.
type EnvVar struct {
	Name  string
	Value string // "" when unset
	Set   bool
}

func (v EnvVar) String() string {
	if !v.Set {
		return v.Name + " unset"
	}
	return v.Name + "=" + strconv.Quote(v.Value)
}

// VarsString lists the variables read as NAME="value" (NAME unset).
func (l Launch) VarsString() string {
	parts := make([]string, len(l.Vars))
	for i, v := range l.Vars {
		parts[i] = v.String()
	}
	return strings.Join(parts, " ")
}

// ErrNoLaunchEnv: none of the known launchers' variables are set.
var ErrNoLaunchEnv = errors.New(
	"rendezvous: no launch environment (set RANK and WORLD_SIZE as torchrun does, or run under Slurm or Open MPI)",
)

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

// FromLookup reads a launch environment through lookup. The first
// launcher whose rank variable is set wins: torchrun's variables (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), Open MPI's
// (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE), then Slurm's
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or
// SLURM_TASKS_PER_NODE with SLURM_NODEID).
//
// The store, in this order:
//
//   - FAIRGO_STORE_ADDR set (fairrun sets it): dial the fairgo store there
//     (StoreFairgo); Launcher "fairrun".
//   - torchrun with TORCHELASTIC_USE_AGENT_STORE=True (exactly "True", as
//     torch.distributed checks it): torchrun's agent serves a c10d TCPStore
//     at MASTER_ADDR:MASTER_PORT (StoreC10d).
//   - otherwise rank 0 hosts a fairgo store at MASTER_ADDR:P where P is
//     FAIRGO_STORE_PORT, else MASTER_PORT+1 (StoreRank0): torchrun without
//     an agent store, any launcher that sets torchrun's variables, Slurm and
//     Open MPI.
//
// MASTER_ADDR and MASTER_PORT are required with torchrun's variables. Under
// Slurm, MASTER_ADDR defaults to the first host of SLURM_STEP_NODELIST
// (else SLURM_JOB_NODELIST, SLURM_NODELIST; compressed lists such as
// "gpu[01-03,07]" are expanded), else SLURM_LAUNCH_NODE_IPADDR, and
// MASTER_PORT to SlurmPort(SLURM_JOB_ID), else DefaultMasterPort. Under Open
// MPI, which names no host to meet at, MASTER_ADDR (or FAIRGO_STORE_ADDR)
// must be given (mpirun -x MASTER_ADDR=host-of-rank-0); MASTER_PORT
// defaults to DefaultMasterPort. FAIRGO_STORE_TOKEN, when set, is the
// store's token (Launch.StoreToken). Launch.Vars lists every variable read.
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
		l.Source = LauncherOpenMPI
		l.Rank = e.int("OMPI_COMM_WORLD_RANK", 0)
		l.WorldSize = e.int("OMPI_COMM_WORLD_SIZE", 1)
		l.LocalRank = e.int("OMPI_COMM_WORLD_LOCAL_RANK", 0)
		l.LocalWorldSize = e.int("OMPI_COMM_WORLD_LOCAL_SIZE", 1)
	case e.has("SLURM_PROCID"):
		l.Source = LauncherSlurm
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
	if tok, ok := e.lookupRaw(EnvStoreToken); ok {
		l.StoreToken = tok
	}
	if e.err != nil {
		return Launch{}, e.err
	}
	l.Vars = e.vars
	return l, l.validate()
}

// validate checks the numbers against each other.
func (l Launch) validate() error {
	names := map[string][4]string{
		"torchrun": {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
		"openmpi": {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
			"OMPI_COMM_WORLD_LOCAL_SIZE"},
		"slurm": {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
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
	vars   []EnvVar
	seen   map[string]bool
}

// get reads a variable; empty counts as unset. Every variable read is
// recorded in vars (the token's value excepted).
func (e *envReader) get(name string) (string, bool) {
	v, ok := e.lookup(name)
	v = strings.TrimSpace(v)
	ok = ok && v != ""
	if !e.seen[name] {
		if e.seen == nil {
			e.seen = map[string]bool{}
		}
		e.seen[name] = true
		rec := EnvVar{Name: name, Value: v, Set: ok}
		if name == EnvStoreToken && ok {
			rec.Value = "(hidden)"
		}
		e.vars = append(e.vars, rec)
	}
	return v, ok
}

// lookupRaw reads a variable through get's recording but keeps its value
// untrimmed (a token may hold spaces).
func (e *envReader) lookupRaw(name string) (string, bool) {
	if _, ok := e.get(name); !ok {
		return "", false
	}
	return e.lookup(name)
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
		e.fail(
			&EnvError{
				Var:    "SLURM_NODEID",
				Value:  nv,
				Reason: fmt.Sprintf("outside the %d nodes of SLURM_TASKS_PER_NODE=%q", len(counts), v),
			},
		)
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

// storeAddr decides who launched the process and where its store is:
// FAIRGO_STORE_ADDR when set, else MASTER_ADDR (or Slurm's first host) at
// a port from MASTER_PORT (or Slurm's job id): torchrun's agent store
// there, or rank 0's at FAIRGO_STORE_PORT, else MASTER_PORT+1. A failure
// is recorded in e.err.
func (e *envReader) storeAddr(l *Launch) {
	e.launcher(l)
	if e.fairrunStore(l) {
		return
	}
	addr, ok := e.masterAddr(l.Source)
	if !ok {
		return
	}
	port, ok := e.masterPort(l.Source)
	if !ok {
		return
	}
	l.MasterAddr, l.MasterPort = addr, port
	if l.AgentStore {
		l.StoreKind = StoreC10d
		l.StoreAddr = net.JoinHostPort(addr, strconv.Itoa(port))
		return
	}
	l.StoreKind = StoreRank0
	if sp, ok := e.rank0StorePort(port); ok {
		l.StoreAddr = net.JoinHostPort(addr, strconv.Itoa(sp))
	}
}

// launcher tells torchrun (its TORCHELASTIC_* variables: whether its agent
// serves a store, its restart count) from other launchers that set
// torchrun's variables, and names the launcher by the source otherwise.
func (e *envReader) launcher(l *Launch) {
	if l.Source == "torchrun" &&
		(e.has("TORCHELASTIC_RUN_ID") || e.has("TORCHELASTIC_RESTART_COUNT") || e.has("TORCHELASTIC_USE_AGENT_STORE")) {
		l.Launcher = LauncherTorchrun
		v, _ := e.get("TORCHELASTIC_USE_AGENT_STORE")
		l.AgentStore = v == "True"
		if e.has("TORCHELASTIC_RESTART_COUNT") {
			l.RestartCount = e.int("TORCHELASTIC_RESTART_COUNT", 0)
		}
	}
	if l.Launcher == "" {
		l.Launcher = l.Source
		if l.Source == "torchrun" {
			l.Launcher = LauncherEnv
		}
	}
}

// fairrunStore reads FAIRGO_STORE_ADDR: when it is set, the fairgo store
// there is the store (launcher fairrun), and it reports true.
func (e *envReader) fairrunStore(l *Launch) bool {
	v, ok := e.get(EnvStoreAddr)
	if !ok {
		return false
	}
	host, port, err := net.SplitHostPort(v)
	p, perr := strconv.Atoi(port)
	if err != nil || perr != nil || p < 1 || p > 65535 || host == "" {
		e.fail(&EnvError{Var: EnvStoreAddr, Value: v, Reason: "want host:port"})
		return true
	}
	l.MasterAddr, l.MasterPort, l.StoreAddr = host, p, v
	l.Launcher, l.StoreKind = LauncherFairrun, StoreFairgo
	return true
}

// masterAddr reads MASTER_ADDR, under Slurm defaulting to its first host
// (see slurmMasterAddr). false: it failed, recorded in e.err.
func (e *envReader) masterAddr(source string) (string, bool) {
	addr, ok := e.get("MASTER_ADDR")
	if !ok && source == LauncherSlurm {
		var err error
		if addr, ok, err = e.slurmMasterAddr(); err != nil {
			e.fail(err)
			return "", false
		}
	}
	if !ok {
		e.fail(&EnvError{Var: "MASTER_ADDR", Reason: missingMasterAddr(source)})
		return "", false
	}
	return addr, true
}

// slurmMasterAddr is the first host of SLURM_STEP_NODELIST, else
// SLURM_JOB_NODELIST, SLURM_NODELIST, else SLURM_LAUNCH_NODE_IPADDR; false
// when none is set.
func (e *envReader) slurmMasterAddr() (string, bool, error) {
	for _, name := range []string{"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
		if v, set := e.get(name); set {
			hosts, err := SlurmHostlist(v, 1)
			if err != nil {
				return "", false, &EnvError{Var: name, Value: v, Reason: err.Error()}
			}
			return hosts[0], true, nil
		}
	}
	addr, ok := e.get("SLURM_LAUNCH_NODE_IPADDR")
	return addr, ok, nil
}

// missingMasterAddr is the reason of a missing MASTER_ADDR: what else
// could have named the host under the source's launcher.
func missingMasterAddr(source string) string {
	switch source {
	case LauncherSlurm:
		return "missing (and SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST, " +
			"SLURM_LAUNCH_NODE_IPADDR and " + EnvStoreAddr + " too)"
	case LauncherOpenMPI:
		return "missing: Open MPI names no host to meet at; give the host of rank 0 (mpirun -x " +
			"MASTER_ADDR=host -x MASTER_PORT=port), or " + EnvStoreAddr + "=host:port of a running fairgo store"
	}
	return "missing (and " + EnvStoreAddr + " too)"
}

// masterPort reads MASTER_PORT (required with torchrun's variables), under
// Slurm defaulting to SlurmPort(SLURM_JOB_ID), else DefaultMasterPort.
// false: it failed, recorded in e.err.
func (e *envReader) masterPort(source string) (int, bool) {
	switch {
	case source == "torchrun" || e.has("MASTER_PORT"):
		port := e.int("MASTER_PORT", DefaultMasterPort)
		if e.err != nil {
			return 0, false
		}
		if port < 1 || port > 65535 {
			e.fail(&EnvError{Var: "MASTER_PORT", Value: strconv.Itoa(port), Reason: "outside [1, 65535]"})
			return 0, false
		}
		return port, true
	case source == LauncherSlurm && e.has("SLURM_JOB_ID"):
		id, err := strconv.ParseUint(mustGet(e, "SLURM_JOB_ID"), 10, 64)
		if err != nil {
			e.fail(&EnvError{Var: "SLURM_JOB_ID", Value: mustGet(e, "SLURM_JOB_ID"), Reason: "not a job number"})
			return 0, false
		}
		return SlurmPort(id), true
	}
	return DefaultMasterPort, true
}

// rank0StorePort is the port of the store rank 0 hosts: FAIRGO_STORE_PORT,
// else MASTER_PORT+1. false: it failed, recorded in e.err.
func (e *envReader) rank0StorePort(masterPort int) (int, bool) {
	if !e.has(EnvStorePort) {
		if sp := masterPort + 1; sp <= 65535 {
			return sp, true
		}
		e.fail(&EnvError{Var: "MASTER_PORT", Value: strconv.Itoa(masterPort),
			Reason: "the store rank 0 hosts goes on MASTER_PORT+1, which is no port: set " + EnvStorePort})
		return 0, false
	}
	sp := e.int(EnvStorePort, 0)
	if e.err != nil {
		return 0, false
	}
	if sp < 1 || sp > 65535 {
		e.fail(&EnvError{Var: EnvStorePort, Value: strconv.Itoa(sp), Reason: "outside [1, 65535]"})
		return 0, false
	}
	return sp, true
}

func mustGet(e *envReader, name string) string { v, _ := e.get(name); return v }

// SlurmPort is the MASTER_PORT derived from a Slurm job id when none is
// given: 10000 + id mod 20000, in [10000, 29999] (unprivileged, below
// Linux's ephemeral range from 32768, so that it does not collide with
// outgoing connections); the store rank 0 hosts then listens on the next
// port. Jobs whose ids differ by a multiple of 20000 and share a node, or
// concurrent job steps, collide: give them MASTER_PORT or FAIRGO_STORE_PORT.
func SlurmPort(jobID uint64) int { return 10000 + int(jobID%20000) }
