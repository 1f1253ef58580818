package cuda

import (
	"errors"
	"fmt"
	"strings"

	"github.com/fairgo/fairgo"
)

// ErrDeviceClosed is returned for use of a Device (or its streams, events
// and modules) after Close.
var ErrDeviceClosed = fmt.Errorf("cuda: device closed: %w", fairgo.ErrClosed)

// ErrCUDA is wrapped by every *Error, for errors.Is.
var ErrCUDA = errors.New("cuda: driver error")

// Error is a failed CUDA driver call.
type Error struct {
	Code int    // the CUresult
	Op   string // the driver function, e.g. "cuMemAlloc"
	Name string // cuGetErrorName, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Text string // cuGetErrorString
}

func newError(op string, code int) *Error {
	name, text := errorName(code)
	return &Error{Code: code, Op: op, Name: name, Text: text}
}

// knownErrors name the results the package reasons about, for when the
// driver cannot name them (the stub library names nothing).
var knownErrors = map[int][2]string{
	cudaInvalidValue: {"CUDA_ERROR_INVALID_VALUE", ""},
	cudaStubLibrary:  {"CUDA_ERROR_STUB_LIBRARY", "the CUDA toolkit's stub libcuda, not a driver"},
	cudaNoDevice:     {"CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	cudaNotReady:     {"CUDA_ERROR_NOT_READY", ""},
}

func (e *Error) Error() string {
	name, text := e.Name, e.Text
	if k, ok := knownErrors[e.Code]; ok && name == "" {
		name, text = k[0], k[1]
	}
	if name == "" {
		name = fmt.Sprintf("CUresult %d", e.Code)
	}
	if text == "" {
		return fmt.Sprintf("cuda: %s: %s", e.Op, name)
	}
	return fmt.Sprintf("cuda: %s: %s (%s)", e.Op, name, text)
}

// Unwrap returns ErrCUDA, and fairgo.ErrInvalidArgument as well for
// CUDA_ERROR_INVALID_VALUE.
func (e *Error) Unwrap() []error {
	if e.Code == cudaInvalidValue {
		return []error{ErrCUDA, fairgo.ErrInvalidArgument}
	}
	return []error{ErrCUDA}
}

// LoadAttempt is one library Load tried and why it could not be used.
type LoadAttempt struct {
	Path string // as passed to dlopen
	File string // the file it resolved to, when it loaded
	// Version is the CUDA version the driver supports
	// (cuDriverGetVersion), when it answered.
	Version int
	// Err is a *DLError (not loaded, or a function missing), a
	// *VersionError (too old) or an *Error (cuDriverGetVersion or cuInit
	// failed).
	Err error
}

// absent reports whether the attempt found no driver or no GPU: the
// library is not there, or cuInit says there is no device (or that the
// library is the toolkit's stub, not a driver).
func (a LoadAttempt) absent() bool {
	var de *DLError
	if errors.As(a.Err, &de) {
		return de.Symbol == "" && de.NotFound
	}
	var ce *Error
	if errors.As(a.Err, &ce) { // the stub answers every call so
		return ce.Code == cudaStubLibrary || ce.Op == "cuInit" && ce.Code == cudaNoDevice
	}
	return false
}

// LoadError says why the CUDA driver could not be used: every path Load
// tried and what failed there. It matches fairgo.ErrNoDevice when there is
// no driver or no GPU (every library was absent, or cuInit reported no
// device); a driver that is there but unusable (a function missing, too
// old, cuInit failing otherwise) does not match it: errors.As finds the
// attempt's *DLError, *VersionError or *Error.
type LoadError struct {
	Attempts []LoadAttempt
}

// NoDevice reports whether the error means that no driver or no GPU is
// there (errors.Is(err, fairgo.ErrNoDevice)).
func (e *LoadError) NoDevice() bool {
	for _, a := range e.Attempts {
		if !a.absent() {
			return false
		}
	}
	return len(e.Attempts) > 0
}

func (e *LoadError) Error() string {
	var b strings.Builder
	if e.NoDevice() {
		b.WriteString("cuda: no GPU or no NVIDIA driver: tried ")
	} else {
		b.WriteString("cuda: cannot use the CUDA driver: tried ")
	}
	for i, a := range e.Attempts {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%q", a.Path)
		var about []string
		if a.File != "" && a.File != a.Path {
			about = append(about, a.File)
		}
		if a.Version > 0 {
			about = append(about, "CUDA "+versionString(a.Version))
		}
		if len(about) > 0 {
			fmt.Fprintf(&b, " (%s)", strings.Join(about, ", "))
		}
		fmt.Fprintf(&b, ": %s", strings.TrimPrefix(a.Err.Error(), "cuda: "))
	}
	fmt.Fprintf(&b, " (%s names the driver library's path)", EnvLibrary)
	return b.String()
}

// Unwrap returns fairgo.ErrNoDevice when NoDevice, and the errors of the
// attempts.
func (e *LoadError) Unwrap() []error {
	var errs []error
	if e.NoDevice() {
		errs = append(errs, fairgo.ErrNoDevice)
	}
	for _, a := range e.Attempts {
		errs = append(errs, a.Err)
	}
	return errs
}

// DLError is the text of a failed dlopen or dlsym.
type DLError struct {
	Symbol   string // the missing function; empty for dlopen
	Text     string // dlerror()
	NotFound bool   // dlopen: the library is not there (rather than unloadable)
}

func (e *DLError) Error() string {
	if e.Symbol != "" {
		return fmt.Sprintf("missing symbol %s: %s", e.Symbol, e.Text)
	}
	return e.Text
}

// VersionError is a driver older than MinDriverVersion.
type VersionError struct {
	Have int // cuDriverGetVersion
	Need int
}

func (e *VersionError) Error() string {
	return fmt.Sprintf(
		"the driver supports CUDA %s; fairgo needs CUDA %s or later (an NVIDIA driver of the 520 series or newer)",
		versionString(e.Have),
		versionString(e.Need),
	)
}
