package nccl

import (
	"errors"
	"fmt"
	"strings"

	"github.com/fairgo/fairgo"
)

// Sentinels for errors.Is. An *Error wraps the one of its result code; the
// load and version errors wrap ErrNotFound or ErrNotSupported.
var (
	ErrNotFound        = errors.New("nccl: library not found")
	ErrNotSupported    = errors.New("nccl: not supported by the loaded NCCL")
	ErrClosed          = fmt.Errorf("nccl: library closed: %w", fairgo.ErrClosed)
	ErrUnhandledCuda   = errors.New("nccl: unhandled CUDA error")
	ErrSystem          = errors.New("nccl: system error")
	ErrInternal        = errors.New("nccl: internal error")
	ErrInvalidArgument = fmt.Errorf("nccl: %w", fairgo.ErrInvalidArgument)
	ErrInvalidUsage    = fmt.Errorf("nccl: invalid usage: %w", fairgo.ErrInvalidArgument)
	ErrRemote          = errors.New("nccl: remote error")
	ErrInProgress      = errors.New("nccl: operation in progress")
	ErrTimeout         = fmt.Errorf("nccl: %w", fairgo.ErrTimeout)
	// ErrAborted is returned by calls on a communicator after Abort.
	ErrAborted = fmt.Errorf("nccl: communicator aborted: %w", fairgo.ErrAborted)
	// ErrDestroyed is returned by calls on a communicator after Destroy.
	ErrDestroyed = fmt.Errorf("nccl: communicator destroyed: %w", fairgo.ErrClosed)
)

var resultSentinels = map[Result]error{
	UnhandledCudaError: ErrUnhandledCuda,
	SystemError:        ErrSystem,
	InternalError:      ErrInternal,
	InvalidArgument:    ErrInvalidArgument,
	InvalidUsage:       ErrInvalidUsage,
	RemoteError:        ErrRemote,
	InProgress:         ErrInProgress,
	Timeout:            ErrTimeout,
}

// Error is a failed NCCL call.
type Error struct {
	Code Result
	Op   string // the NCCL function, e.g. "ncclAllReduce"
	Text string // ncclGetErrorString, then ncclGetLastError when it has something
}

func (e *Error) Error() string {
	if e.Text == "" {
		return fmt.Sprintf("nccl: %s: %v", e.Op, e.Code)
	}
	return fmt.Sprintf("nccl: %s: %v: %s", e.Op, e.Code, e.Text)
}

// Unwrap returns the sentinel of the result code.
func (e *Error) Unwrap() error { return resultSentinels[e.Code] }

// LoadAttempt is one library path tried by Load and why it failed.
type LoadAttempt struct {
	Path string
	Err  error
}

// LoadError lists every path Load tried. It matches ErrNotFound, and
// ErrNotSupported when a library was found but too old.
type LoadError struct {
	Attempts []LoadAttempt
}

func (e *LoadError) Error() string {
	var b strings.Builder
	b.WriteString("nccl: cannot load NCCL; tried ")
	for i, a := range e.Attempts {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%q: %v", a.Path, a.Err)
	}
	fmt.Fprintf(&b, " (set %s to the path of libnccl.so.2)", EnvLibrary)
	return b.String()
}

// Unwrap returns ErrNotFound and the errors of the attempts.
func (e *LoadError) Unwrap() []error {
	errs := []error{ErrNotFound}
	for _, a := range e.Attempts {
		errs = append(errs, a.Err)
	}
	return errs
}

// DLError is the text of a failed dlopen or dlsym.
type DLError struct {
	Symbol string // empty for dlopen
	Text   string // dlerror()
}

func (e *DLError) Error() string {
	if e.Symbol != "" {
		return fmt.Sprintf("missing symbol %s: %s", e.Symbol, e.Text)
	}
	return e.Text
}

// VersionError is a library or function that needs a newer NCCL.
type VersionError struct {
	What string // "NCCL", "ncclCommSplit", "bfloat16", ...
	Have int    // the loaded version code
	Need int    // the required version code
}

func (e *VersionError) Error() string {
	hM, hm, hp := SplitVersion(e.Have)
	nM, nm, np := SplitVersion(e.Need)
	return fmt.Sprintf("nccl: %s needs NCCL %d.%d.%d or later, loaded %d.%d.%d", e.What, nM, nm, np, hM, hm, hp)
}

// Unwrap returns ErrNotSupported.
func (e *VersionError) Unwrap() error { return ErrNotSupported }

// MissingSymbolError is a function the loaded NCCL does not export.
type MissingSymbolError struct {
	Symbol string
	Text   string // dlerror() from load time
}

func (e *MissingSymbolError) Error() string {
	return fmt.Sprintf("nccl: %s is not available in the loaded library: %s", e.Symbol, e.Text)
}

// Unwrap returns ErrNotSupported.
func (e *MissingSymbolError) Unwrap() error { return ErrNotSupported }
