package fairgo

import (
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by fairgo wrap one of these where it
// applies, so callers can test with errors.Is.
var (
	// ErrInvalidArgument is wrapped by every validation error.
	ErrInvalidArgument = errors.New("fairgo: invalid argument")
	// ErrUnknownDType is an element type outside DTypes.
	ErrUnknownDType = fmt.Errorf("%w: unknown element type", ErrInvalidArgument)
	// ErrUnknownOp is an operator outside Ops.
	ErrUnknownOp = fmt.Errorf("%w: unknown reduction operator", ErrInvalidArgument)
	// ErrClosed is returned for use after Close, and ends work still pending
	// when Close was called.
	ErrClosed = errors.New("fairgo: closed")
	// ErrAborted ends work whose communicators were aborted (a failed peer, a
	// watchdog timeout, or an explicit Abort).
	ErrAborted = errors.New("fairgo: aborted")
	// ErrTimeout is reported when the watchdog gives up on work that did not
	// complete in time, on the rank that timed out and on its peers.
	ErrTimeout = errors.New("fairgo: timed out")
	// ErrMismatch is reported when the ranks made different calls at the
	// same place in their call order (kind, count, element type, operator
	// or root differ).
	ErrMismatch = errors.New("fairgo: ranks made mismatched calls")
	// ErrNoDevice is returned where a GPU backend is asked for on a host
	// without a GPU or without a GPU driver. A typed error wraps it and
	// says what is missing and where it was looked for (package cuda's
	// *LoadError). A driver that is present but broken is not this error.
	ErrNoDevice = errors.New("fairgo: no GPU or GPU driver")
)

// ArgError describes an argument or option that failed validation. It wraps
// ErrInvalidArgument (or a more specific sentinel that wraps it).
type ArgError struct {
	Arg    string // the argument or option name, e.g. "count" or "WithSliceSize"
	Value  any    // the offending value
	Reason string // what is wrong with it
	Err    error  // the sentinel it wraps; ErrInvalidArgument when nil
}

func (e *ArgError) Error() string {
	return fmt.Sprintf("fairgo: invalid %s %v: %s", e.Arg, e.Value, e.Reason)
}

// Unwrap returns the sentinel the error wraps.
func (e *ArgError) Unwrap() error {
	if e.Err != nil {
		return e.Err
	}
	return ErrInvalidArgument
}
