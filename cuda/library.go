package cuda

import (
	"fmt"
	"os"
	"strings"
	"sync"
)

// EnvLibrary names the environment variable that, when set, is the only path
// Load tries for the CUDA driver library.
const EnvLibrary = "FAIRGO_CUDA_LIBRARY"

// DefaultLibraries are the names Load passes to the dynamic loader's default
// search when EnvLibrary is not set. Every NVIDIA driver installs
// libcuda.so.1.
var DefaultLibraries = []string{"libcuda.so.1", "libcuda.so"}

// MinDriverVersion is the oldest driver API version Load accepts, as
// cuDriverGetVersion reports it (major·1000 + minor·10): CUDA 11.8, the
// 520 drivers. The embedded kernels are PTX ISA 7.8, which older drivers
// cannot compile.
const MinDriverVersion = 11080

// Driver is the loaded CUDA driver library. The first Load of a process
// loads it, resolves every function the package uses and initialises it
// (cuInit); it then stays loaded for the life of the process, shared by
// every Device, as the driver's contexts are shared with the CUDA runtime
// and PyTorch. It has no Close.
type Driver struct {
	path    string // what was passed to dlopen
	file    string // the file it resolved to, when known
	version int
	handle  uintptr
	table   table
}

// Path is the name or path the driver was opened by.
func (d *Driver) Path() string { return d.path }

// File is the file the loader resolved Path to, or "".
func (d *Driver) File() string { return d.file }

// Version is the CUDA version the driver supports (cuDriverGetVersion:
// 12020 is CUDA 12.2).
func (d *Driver) Version() int { return d.version }

func (d *Driver) String() string {
	f := d.file
	if f == "" {
		f = d.path
	}
	return fmt.Sprintf("CUDA driver %s (%s)", versionString(d.version), f)
}

// discard unloads a driver that was never committed (tests of open).
func (d *Driver) discard() {
	freeTable(d.table)
	dlclose(d.handle)
}

func versionString(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

var loaded struct {
	mu sync.Mutex
	d  *Driver
}

// Load returns the process's CUDA driver, loading it on first use: the path
// is $FAIRGO_CUDA_LIBRARY when set (and then only that), else libcuda.so.1
// and libcuda.so through the loader's default search. The first library that
// loads decides: it must export every function the package uses, support
// CUDA MinDriverVersion and initialise (cuInit). Otherwise Load returns a
// *LoadError naming every path tried and what failed; it matches
// fairgo.ErrNoDevice when no driver or no GPU is there. A failed Load is
// tried again by the next call.
func Load() (*Driver, error) {
	loaded.mu.Lock()
	defer loaded.mu.Unlock()
	if loaded.d != nil {
		return loaded.d, nil
	}
	d, err := open(libraryPaths())
	if err != nil {
		return nil, err
	}
	commit(d.table)
	loaded.d = d
	return d, nil
}

func libraryPaths() []string {
	if p := os.Getenv(EnvLibrary); p != "" {
		return []string{p}
	}
	return DefaultLibraries
}

// open tries paths in order until one loads; it stops at the first library
// that loads, usable or not. The driver it returns is not committed.
func open(paths []string) (*Driver, error) {
	lerr := &LoadError{}
	for _, p := range paths {
		h, text := dlopen(p)
		if h == 0 {
			lerr.Attempts = append(
				lerr.Attempts,
				LoadAttempt{Path: p, Err: &DLError{Text: text, NotFound: notFound(p, text)}},
			)
			continue
		}
		d, a := initialise(p, h)
		if a.Err != nil {
			lerr.Attempts = append(lerr.Attempts, a)
			return nil, lerr
		}
		return d, nil
	}
	return nil, lerr
}

// initialise resolves the functions of a loaded library, checks its version
// and calls cuInit. On error the library is closed again and the attempt
// says why.
func initialise(path string, h uintptr) (*Driver, LoadAttempt) {
	t, missing, text := resolve(h)
	a := LoadAttempt{Path: path, File: origin(t)}
	fail := func(err error) (*Driver, LoadAttempt) {
		freeTable(t)
		dlclose(h)
		a.Err = err
		return nil, a
	}
	if missing != "" {
		return fail(&DLError{Symbol: missing, Text: text})
	}
	v, r := tableVersion(t)
	if r != cudaSuccess {
		return fail(tableError(t, "cuDriverGetVersion", r))
	}
	a.Version = v
	if v < MinDriverVersion {
		return fail(&VersionError{Have: v, Need: MinDriverVersion})
	}
	if r := tableInit(t); r != cudaSuccess {
		return fail(tableError(t, "cuInit", r))
	}
	return &Driver{path: path, file: a.File, version: v, handle: h, table: t}, a
}

func tableError(t table, op string, code int) *Error {
	name, text := tableErrorName(t, code)
	return &Error{Code: code, Op: op, Name: name, Text: text}
}

// notFound tells a library that is not there from one that is there but
// failed to load: an explicit path that does not exist, or a name the
// loader's search did not find.
func notFound(path, dlerror string) bool {
	if strings.Contains(path, "/") {
		_, err := os.Stat(path)
		return os.IsNotExist(err)
	}
	return strings.Contains(dlerror, "No such file or directory") ||
		strings.Contains(dlerror, "cannot open shared object file")
}

// Count is the number of CUDA devices (loading the driver first).
func Count() (int, error) {
	if _, err := Load(); err != nil {
		return 0, err
	}
	return deviceCount()
}
