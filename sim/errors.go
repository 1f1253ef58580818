package sim

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fairgo/fairgo"
)

// Sentinel errors of the simulated cluster, wrapped by the typed errors below.
var (
	// ErrMismatch: the ranks of a communicator enqueued different calls at
	// the same sequence number.
	ErrMismatch = fmt.Errorf("sim: mismatched collectives: %w", fairgo.ErrMismatch)
	// ErrStall: a collective did not gather all its ranks within
	// Config.StallTimeout (on NCCL it would hang). It wraps
	// fairgo.ErrTimeout, as the watchdog's error does: a rank that did not
	// come is a timeout, whichever side noticed it.
	ErrStall = fmt.Errorf("sim: collective stalled: %w", fairgo.ErrTimeout)
	// ErrIllegalAddress: a stream operation accessed memory outside the
	// allocations of its device (cudaErrorIllegalAddress on a GPU).
	ErrIllegalAddress = errors.New("sim: illegal address")
	// ErrOutOfMemory: an allocation exceeded Config.MemoryLimit.
	ErrOutOfMemory = errors.New("sim: out of memory")
)

// MismatchError reports ranks of a communicator that enqueued different
// calls at the same sequence number. Every participant fails with it.
type MismatchError struct {
	Comm  string   // communicator name, e.g. "rail-collect/local=0"
	Seq   uint64   // the call's sequence number on the communicator
	Calls []string // what each rank (by communicator rank) enqueued
}

func (e *MismatchError) Error() string {
	parts := make([]string, len(e.Calls))
	for r, c := range e.Calls {
		parts[r] = fmt.Sprintf("rank %d enqueued %s", r, c)
	}
	return fmt.Sprintf("sim: collective mismatch: %s seq %d: %s", e.Comm, e.Seq, strings.Join(parts, ", "))
}

// Unwrap returns ErrMismatch.
func (e *MismatchError) Unwrap() error { return ErrMismatch }

// StallError reports a collective whose ranks did not all arrive within the
// stall timeout. Every rank waiting on it fails with it, and so does the
// communicator afterwards.
type StallError struct {
	Comm    string
	Seq     uint64
	Timeout time.Duration
	Arrived []int    // communicator ranks whose streams reached the call
	Calls   []string // what each arrived rank enqueued, parallel to Arrived
	Missing []int    // communicator ranks that never reached it
	// NotCalled is the missing ranks that never enqueued the call at all:
	// their program did not make it (a skipped call, or one never reached
	// because the goroutine that would make it is blocked, often in a Wait
	// on another rank's call).
	NotCalled []int
}

func (e *StallError) Error() string {
	parts := make([]string, len(e.Arrived))
	for i, r := range e.Arrived {
		parts[i] = fmt.Sprintf("rank %d (%s)", r, e.Calls[i])
	}
	s := fmt.Sprintf("sim: collective stalled: %s seq %d: ranks %v did not arrive within %v; arrived: %s",
		e.Comm, e.Seq, e.Missing, e.Timeout, strings.Join(parts, ", "))
	if len(e.NotCalled) > 0 {
		s += fmt.Sprintf("; ranks %v never made the call: every rank must make a collective before any rank "+
			"waits on one (the usual cause: a program that drives several ranks waited on one rank's Work before "+
			"making the call on the others)", e.NotCalled)
	}
	return s
}

// Unwrap returns ErrStall (which wraps fairgo.ErrTimeout).
func (e *StallError) Unwrap() error { return ErrStall }

// IllegalAddressError reports a stream operation that accessed memory
// outside one allocation of its device. The stream then fails with it
// (sticky, like a CUDA illegal address).
type IllegalAddressError struct {
	Device string  // the device whose stream ran the operation
	Op     string  // the operation, e.g. "copy" or "reduce"
	Ptr    uintptr // start of the offending range
	Bytes  int64
	Reason string
}

func (e *IllegalAddressError) Error() string {
	return fmt.Sprintf("sim: illegal address: %s in %s: [%#x, +%d bytes): %s", e.Device, e.Op, e.Ptr, e.Bytes, e.Reason)
}

// Unwrap returns ErrIllegalAddress.
func (e *IllegalAddressError) Unwrap() error { return ErrIllegalAddress }
