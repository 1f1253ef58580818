// Package nccl is a binding to NVIDIA's NCCL that loads libnccl with dlopen
// at run time and calls it without cgo, so that it builds with neither NCCL,
// CUDA nor a C compiler installed.
// Device pointers and CUDA streams (cudaStream_t = CUstream) cross it as
// uintptr, and failures are typed errors that match the package's sentinels.
package nccl

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/fairgo/fairgo"
)

// EnvLibrary names the environment variable that, when set, is the only path
// Load tries.
const EnvLibrary = "FAIRGO_NCCL_LIBRARY"

// DefaultLibraries are the names Load passes to the dynamic loader's default
// search when EnvLibrary is not set.
var DefaultLibraries = []string{"libnccl.so.2", "libnccl.so"}

// optional symbols: a library may lack them; calling one then fails with a
// *MissingSymbolError (or *VersionError) wrapping ErrNotSupported.
var optionalSyms = map[sym]int{
	symCommInitRankConfig: ConfigMinVersion,
	symCommSplit:          SplitMinVersion,
}

// Library is a loaded libnccl with all its symbols resolved. Load returns the
// process-wide instance and counts references; Close drops one. Communicators
// hold a reference of their own until Destroy or Abort, so the library is
// never unloaded under them.
type Library struct {
	*dso
	closed atomic.Bool // this reference was closed
}

// dso is the loaded library shared by every reference.
type dso struct {
	path     string // what was passed to dlopen
	file     string // the file it resolved to, when known
	version  int
	handle   uintptr
	table    *symTable
	missing  map[sym]string
	unloaded atomic.Bool
}

var global struct {
	mu   sync.Mutex
	lib  *dso
	refs int
}

// Load opens NCCL, or returns the already-open library with one more
// reference. The path is $FAIRGO_NCCL_LIBRARY when set (and then only that),
// else libnccl.so.2 and libnccl.so through the loader's default search. It
// fails with a *LoadError listing every path tried, when the library lacks a
// required symbol, or when it is older than MinVersion.
func Load() (*Library, error) {
	global.mu.Lock()
	defer global.mu.Unlock()
	if global.lib != nil {
		global.refs++
		return &Library{dso: global.lib}, nil
	}
	paths := DefaultLibraries
	if p := os.Getenv(EnvLibrary); p != "" {
		paths = []string{p}
	}
	lerr := &LoadError{}
	for _, p := range paths {
		lib, err := open(p)
		if err != nil {
			lerr.Attempts = append(lerr.Attempts, LoadAttempt{Path: p, Err: err})
			continue
		}
		global.lib, global.refs = lib, 1
		return &Library{dso: lib}, nil
	}
	return nil, lerr
}

func open(path string) (*dso, error) {
	h, text := dlopen(path)
	if h == 0 {
		return nil, &DLError{Text: text}
	}
	table, missing := resolve(h)
	fail := func(err error) (*dso, error) {
		dlclose(h)
		return nil, err
	}
	for s := sym(0); s < numSyms; s++ {
		if text, ok := missing[s]; ok {
			if _, opt := optionalSyms[s]; !opt {
				return fail(&DLError{Symbol: symName(s), Text: text})
			}
		}
	}
	v, r := cGetVersion(table)
	if r != Success {
		return fail(&Error{Code: r, Op: "ncclGetVersion"})
	}
	if v < MinVersion {
		return fail(&VersionError{What: "fairgo", Have: v, Need: MinVersion})
	}
	return &dso{
		path:    path,
		file:    origin(table, symGetVersion),
		version: v,
		handle:  h,
		table:   table,
		missing: missing,
	}, nil
}

// Close drops this reference; the library is unloaded when the last
// reference (communicators included) is gone. A second Close returns
// ErrClosed.
func (l *Library) Close() error {
	if !l.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	return l.release()
}

func (l *dso) acquire() {
	global.mu.Lock()
	global.refs++
	global.mu.Unlock()
}

func (l *dso) release() error {
	global.mu.Lock()
	defer global.mu.Unlock()
	if global.lib != l || global.refs <= 0 {
		return ErrClosed
	}
	global.refs--
	if global.refs == 0 {
		l.unloaded.Store(true)
		dlclose(l.handle)
		global.lib = nil
	}
	return nil
}

// Path is the name or path the library was opened by.
func (l *Library) Path() string { return l.path }

// File is the file the loader resolved Path to (from dladdr), or "".
func (l *Library) File() string { return l.file }

// Version is the version code the library reported at load time.
func (l *Library) Version() int { return l.version }

func (l *Library) String() string {
	M, m, p := SplitVersion(l.version)
	f := l.file
	if f == "" {
		f = l.path
	}
	return fmt.Sprintf("NCCL %d.%d.%d (%s)", M, m, p, f)
}

// Supports reports whether the loaded library exports an NCCL function, by
// its C name ("ncclCommSplit").
func (l *Library) Supports(fn string) bool {
	for s := sym(0); s < numSyms; s++ {
		if symName(s) == fn {
			_, miss := l.missing[s]
			return !miss && l.version >= optionalSyms[s]
		}
	}
	return false
}

func (l *Library) check(s sym) error {
	if l.closed.Load() {
		return ErrClosed
	}
	return l.dso.check(s)
}

func (l *dso) check(s sym) error {
	if l.unloaded.Load() {
		return ErrClosed
	}
	if text, ok := l.missing[s]; ok {
		return &MissingSymbolError{Symbol: symName(s), Text: text}
	}
	if need, ok := optionalSyms[s]; ok && l.version < need {
		return &VersionError{What: symName(s), Have: l.version, Need: need}
	}
	return nil
}

// err builds the *Error of a failed call (nil on Success).
func (l *dso) err(op string, r Result, c commHandle) error {
	if r == Success {
		return nil
	}
	text := cGetErrorString(l.table, r)
	if last := cGetLastError(l.table, c); last != "" {
		text += ": " + last
	}
	return &Error{Code: r, Op: op, Text: text}
}

// GetUniqueId calls ncclGetUniqueId.
func (l *Library) GetUniqueId() (UniqueID, error) {
	if err := l.check(symGetUniqueId); err != nil {
		return UniqueID{}, err
	}
	id, r := cGetUniqueId(l.table)
	return id, l.err("ncclGetUniqueId", r, 0)
}

// GetErrorString calls ncclGetErrorString.
func (l *Library) GetErrorString(r Result) string {
	if l.check(symGetErrorString) != nil {
		return r.String()
	}
	return cGetErrorString(l.table, r)
}

// GroupStart calls ncclGroupStart. NCCL's group state belongs to the OS
// thread: call GroupEnd from the same one (runtime.LockOSThread).
func (l *Library) GroupStart() error {
	if err := l.check(symGroupStart); err != nil {
		return err
	}
	return l.err("ncclGroupStart", cGroupStart(l.table), 0)
}

// GroupEnd calls ncclGroupEnd. With non-blocking communicators it may fail
// with ErrInProgress; Comm.WaitReady then waits for each communicator used.
func (l *Library) GroupEnd() error {
	if err := l.check(symGroupEnd); err != nil {
		return err
	}
	return l.err("ncclGroupEnd", cGroupEnd(l.table), 0)
}

// CommInitRank calls ncclCommInitRank: a blocking communicator on the CUDA
// device current on the calling thread. It blocks until all nranks ranks
// have joined, unless called between GroupStart and GroupEnd.
func (l *Library) CommInitRank(nranks int, id UniqueID, rank int) (*Comm, error) {
	if err := l.check(symCommInitRank); err != nil {
		return nil, err
	}
	if err := checkRanks(nranks, rank); err != nil {
		return nil, err
	}
	c, r := cCommInitRank(l.table, nranks, &id, rank)
	if r != Success {
		return nil, l.err("ncclCommInitRank", r, 0)
	}
	if c == 0 {
		return nil, fmt.Errorf(
			"nccl: ncclCommInitRank returned no communicator (called between GroupStart and GroupEnd? creating "+
				"communicators inside a group is not supported): %w",
			ErrNotSupported,
		)
	}
	return l.dso.newComm(c, false), nil
}

// CommInitRankConfig calls ncclCommInitRankConfig with blocking = 0, then
// polls the communicator until it is ready, so that ctx can end the wait
// (the half-made communicator is then aborted and ctx.Err() returned). The
// communicator stays non-blocking: its calls wait for NCCL's ncclInProgress
// to clear before returning. Use it on the CUDA device the communicator is
// for, current on the calling thread.
func (l *Library) CommInitRankConfig(
	ctx context.Context,
	nranks int,
	id UniqueID,
	rank int,
	cfg *Config,
) (*Comm, error) {
	if err := l.check(symCommInitRankConfig); err != nil {
		return nil, err
	}
	if err := checkRanks(nranks, rank); err != nil {
		return nil, err
	}
	cc := newCConfig(cfg, 0)
	c, r := cCommInitRankConfig(l.table, nranks, &id, rank, cc)
	cc.free()
	if r != Success && r != InProgress {
		return nil, l.err("ncclCommInitRankConfig", r, c)
	}
	if c == 0 {
		return nil, &Error{Code: InternalError, Op: "ncclCommInitRankConfig", Text: "no communicator returned"}
	}
	comm := l.dso.newComm(c, true)
	if err := comm.WaitReady(ctx); err != nil {
		_ = comm.Abort()
		return nil, err
	}
	return comm, nil
}

func checkRanks(nranks, rank int) error {
	if nranks < 1 {
		return &fairgo.ArgError{Arg: "nranks", Value: nranks, Reason: "must be at least 1"}
	}
	if rank < 0 || rank >= nranks {
		return &fairgo.ArgError{Arg: "rank", Value: rank, Reason: fmt.Sprintf("outside [0, %d)", nranks)}
	}
	return nil
}

// DataType maps a fairgo element type to NCCL's, checking that the loaded
// NCCL supports it.
func (l *Library) DataType(dt fairgo.DType) (DataType, error) {
	d, need, err := DataTypeOf(dt)
	if err != nil {
		return 0, err
	}
	if l.version < need {
		return 0, &VersionError{What: dt.String(), Have: l.version, Need: need}
	}
	return d, nil
}

// RedOp maps a fairgo operator to NCCL's, checking that the loaded NCCL
// supports it.
func (l *Library) RedOp(op fairgo.Op) (RedOp, error) {
	o, need, err := RedOpOf(op)
	if err != nil {
		return 0, err
	}
	if l.version < need {
		return 0, &VersionError{What: "reduction " + op.String(), Have: l.version, Need: need}
	}
	return o, nil
}
