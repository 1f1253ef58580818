//go:build cuda

package cuda

import (
	"errors"
	"fmt"

	"github.com/fairgo/fairgo"
)

// ErrDeviceClosed is returned for use of a Device (or its streams and
// events) after Close.
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

func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = fmt.Sprintf("CUresult %d", e.Code)
	}
	if e.Text == "" {
		return fmt.Sprintf("cuda: %s: %s", e.Op, name)
	}
	return fmt.Sprintf("cuda: %s: %s (%s)", e.Op, name, e.Text)
}

// Unwrap returns ErrCUDA, and fairgo.ErrInvalidArgument as well for
// CUDA_ERROR_INVALID_VALUE.
func (e *Error) Unwrap() []error {
	if e.Code == 1 {
		return []error{ErrCUDA, fairgo.ErrInvalidArgument}
	}
	return []error{ErrCUDA}
}
