// Package capi is the logic of libfairgo's C ABI, in Go and without cgo, so
// that it is tested on the simulated cluster: the table of handles (opaque
// int64 ids, never Go pointers), argument checking, the mapping of Go errors
// to the C result codes, and the call sequence of each entry point
// (setup.New, Reducer.AllReduce after the caller's stream, Work.StreamWait
// on it). A Table is parameterised by a Backend: the CUDA one in
// libfairgo.so, the simulated one in tests. The cgo shims of
// cmd/libfairgo only convert C values and call a Table inside Guard.
package capi

import (
	"context"
	"errors"
	"fmt"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/rendezvous"
	"github.com/fairgo/fairgo/topology"
)

// Code is a result code of the C ABI (fairgo_result_t in fairgo.h; the
// values must match it, which a test checks).
type Code int32

// The result codes. OK and NotReady are not errors.
const (
	OK              Code = 0  // FAIRGO_OK
	NotReady        Code = 1  // FAIRGO_NOT_READY: the work is still running (wait timed out)
	InvalidArgument Code = 2  // FAIRGO_ERR_INVALID_ARGUMENT
	BadHandle       Code = 3  // FAIRGO_ERR_BAD_HANDLE: unknown, freed or closed handle
	Mismatch        Code = 4  // FAIRGO_ERR_MISMATCH: ranks made different calls
	Timeout         Code = 5  // FAIRGO_ERR_TIMEOUT: watchdog, or a deadline of init
	Aborted         Code = 6  // FAIRGO_ERR_ABORTED: communicators aborted (a failed peer or communicator)
	Closed          Code = 7  // FAIRGO_ERR_CLOSED: the communicator was closed
	CUDA            Code = 8  // FAIRGO_ERR_CUDA: a CUDA driver error
	NCCL            Code = 9  // FAIRGO_ERR_NCCL: an NCCL error, or NCCL not found
	System          Code = 10 // FAIRGO_ERR_SYSTEM: anything else (store, network, launch environment)
	Internal        Code = 11 // FAIRGO_ERR_INTERNAL: a bug in fairgo (a recovered Go panic)
	NoDevice        Code = 12 // FAIRGO_ERR_NO_DEVICE: no GPU or no GPU driver (fairgo.ErrNoDevice)
)

var codeNames = map[Code]string{
	OK: "FAIRGO_OK", NotReady: "FAIRGO_NOT_READY", InvalidArgument: "FAIRGO_ERR_INVALID_ARGUMENT",
	BadHandle: "FAIRGO_ERR_BAD_HANDLE", Mismatch: "FAIRGO_ERR_MISMATCH", Timeout: "FAIRGO_ERR_TIMEOUT",
	Aborted: "FAIRGO_ERR_ABORTED", Closed: "FAIRGO_ERR_CLOSED", CUDA: "FAIRGO_ERR_CUDA", NCCL: "FAIRGO_ERR_NCCL",
	System: "FAIRGO_ERR_SYSTEM", Internal: "FAIRGO_ERR_INTERNAL", NoDevice: "FAIRGO_ERR_NO_DEVICE",
}

// String is the code's C name, e.g. "FAIRGO_ERR_TIMEOUT".
func (c Code) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return fmt.Sprintf("fairgo_result_t(%d)", int32(c))
}

// Error is an error with the result code it reports through the C ABI.
// Table methods return it where the code does not follow from the cause
// (bad handles, NotReady, panics); Classify maps any other error.
type Error struct {
	Code Code
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// ErrBadHandle is wrapped by the errors of unknown, freed or closed
// handles.
var ErrBadHandle = errors.New("fairgo: no such handle (never created, already freed, or closed)")

// ErrNotReady is returned by Wait when the timeout passed before the work
// completed.
var ErrNotReady = errors.New("fairgo: work not complete yet")

func badHandle(kind string, id int64) error {
	return &Error{Code: BadHandle, Err: fmt.Errorf("%s handle %d: %w", kind, id, ErrBadHandle)}
}

// Class maps errors that Match to Code.
type Class struct {
	Code  Code
	Match func(error) bool
}

// Is is the Class of errors wrapping target.
func Is(target error, code Code) Class {
	return Class{Code: code, Match: func(err error) bool { return errors.Is(err, target) }}
}

// Classes configure Classify: which errors mean a mismatch between ranks
// (checked first: the root cause wins over the abort it led to), and the
// backend's own errors (CUDA, NCCL; checked after timeout, aborted and
// closed, before invalid argument).
type Classes struct {
	Mismatch []error
	Backend  []Class
}

// Classify returns the result code of err: OK for nil; an *Error's own
// code; then, in this order, a mismatch (Classes.Mismatch: the root cause
// wins over the abort it led to); no GPU or driver (fairgo.ErrNoDevice); a timeout (fairgo.ErrTimeout, a context
// deadline), closed (fairgo.ErrClosed) or aborted (fairgo.ErrAborted, a
// cancelled context), whichever the error tree names first (the engine puts
// the cause first: "closed (aborted)" is a close); the backend's classes;
// an invalid argument (fairgo.ErrInvalidArgument, no or an inconsistent
// launch environment or machine layout); else System.
func (cs Classes) Classify(err error) Code {
	if err == nil {
		return OK
	}
	var ce *Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	if errors.Is(err, fairgo.ErrMismatch) {
		return Mismatch
	}
	for _, m := range cs.Mismatch {
		if errors.Is(err, m) {
			return Mismatch
		}
	}
	if errors.Is(err, fairgo.ErrNoDevice) {
		return NoDevice
	}
	if c, ok := firstSentinel(err); ok {
		return c
	}
	for _, c := range cs.Backend {
		if c.Match(err) {
			return c.Code
		}
	}
	switch {
	case errors.Is(err, fairgo.ErrInvalidArgument), errors.Is(err, rendezvous.ErrNoLaunchEnv),
		errors.Is(err, topology.ErrIrregular), errors.Is(err, topology.ErrDuplicateDevice),
		errors.Is(err, topology.ErrBadMember):
		return InvalidArgument
	}
	return System
}

// sentinels are compared with == (a map would panic on an error value of
// an uncomparable type).
var sentinels = []struct {
	err  error
	code Code
}{
	{fairgo.ErrTimeout, Timeout}, {context.DeadlineExceeded, Timeout},
	{fairgo.ErrClosed, Closed},
	{fairgo.ErrAborted, Aborted}, {context.Canceled, Aborted},
}

// firstSentinel walks err's tree in the order errors.Is does (pre-order)
// and returns the code of the first timeout, closed or aborted sentinel.
func firstSentinel(err error) (Code, bool) {
	if err == nil {
		return 0, false
	}
	for _, s := range sentinels {
		if err == s.err {
			return s.code, true
		}
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return firstSentinel(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if c, ok := firstSentinel(e); ok {
				return c, true
			}
		}
	}
	return 0, false
}
