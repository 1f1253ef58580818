package cuda

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/streams"
)

// ErrStreamClosed is returned for use of a stream or event after its Close.
var ErrStreamClosed = fmt.Errorf("cuda: stream or event closed: %w", fairgo.ErrClosed)

// Stream is a CUDA stream of a Device.
type Stream struct {
	d      *Device
	h      cStream
	owned  bool
	closed atomic.Bool
}

var _ streams.Stream = (*Stream)(nil)

// CreateStream creates a non-blocking stream (no implicit synchronisation
// with the legacy default stream) at the device's highest priority.
func (d *Device) CreateStream() (*Stream, error) {
	if err := d.alive(); err != nil {
		return nil, err
	}
	h, err := streamCreate(d.ctx, d.priority)
	if err != nil {
		return nil, err
	}
	return adopt(d, &Stream{d: d, h: h, owned: true})
}

// resource is what a Device tracks and destroys on Close: its streams and
// events.
type resource interface{ destroy() error }

// adopt tracks r, just created on d; where d has been closed meanwhile, it
// destroys r again and fails.
func adopt[R resource](d *Device, r R) (R, error) {
	if err := d.track(r); err != nil {
		_ = r.destroy()
		var none R
		return none, err
	}
	return r, nil
}

// NewStream is CreateStream for streams.Factory.
func (d *Device) NewStream() (streams.Stream, error) {
	s, err := d.CreateStream()
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return s, nil
}

// WrapStream wraps a stream made elsewhere (a PyTorch stream's cuda_stream,
// or 0 for the legacy default stream) of this device's primary context.
// Close on it does not destroy it.
func (d *Device) WrapStream(handle uintptr) *Stream {
	return &Stream{d: d, h: cStreamFromHandle(handle)}
}

// Handle is the CUstream (= cudaStream_t), for NCCL or other libraries.
func (s *Stream) Handle() uintptr { return handleOfStream(s.h) }

// Device returns the stream's device.
func (s *Stream) Device() *Device { return s.d }

func (s *Stream) String() string { return fmt.Sprintf("stream %#x on %v", s.Handle(), s.d) }

func (s *Stream) alive() error {
	if s.closed.Load() {
		return ErrStreamClosed
	}
	return s.d.alive()
}

// WaitEvent makes work enqueued on s from now on wait for e's latest record.
func (s *Stream) WaitEvent(e streams.Event) error {
	if err := s.alive(); err != nil {
		return err
	}
	ce, ok := e.(*Event)
	if !ok || ce == nil {
		return &fairgo.ArgError{Arg: "event", Value: fmt.Sprintf("%T", e), Reason: "not a *cuda.Event"}
	}
	if err := ce.alive(); err != nil {
		return err
	}
	return streamWait(s.d.ctx, s.h, ce.h)
}

// Synchronize blocks until the work enqueued on s has completed.
func (s *Stream) Synchronize() error {
	if err := s.alive(); err != nil {
		return err
	}
	return streamSync(s.d.ctx, s.h)
}

// Close destroys the stream (not a wrapped one). Work already enqueued
// still completes.
func (s *Stream) Close() error {
	if !s.closed.CompareAndSwap(false, true) || !s.owned {
		return nil
	}
	s.d.untrack(s)
	if s.d.closed.Load() {
		return nil // Close of the device destroyed it
	}
	return streamDestroy(s.d.ctx, s.h)
}

func (s *Stream) destroy() error {
	s.closed.Store(true)
	return streamDestroy(s.d.ctx, s.h)
}

// Event is a CUDA event of a Device.
type Event struct {
	d      *Device
	h      cEvent
	timing bool
	closed atomic.Bool
}

var _ streams.Event = (*Event)(nil)

// CreateEvent creates an event; timing events (for Elapsed) cost more to
// record, so the pipeline uses events without timing.
func (d *Device) CreateEvent(timing bool) (*Event, error) {
	if err := d.alive(); err != nil {
		return nil, err
	}
	h, err := eventCreate(d.ctx, timing)
	if err != nil {
		return nil, err
	}
	return adopt(d, &Event{d: d, h: h, timing: timing})
}

// NewEvent creates an event without timing, for streams.Factory.
func (d *Device) NewEvent() (streams.Event, error) {
	e, err := d.CreateEvent(false)
	if err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Event) alive() error {
	if e.closed.Load() {
		return ErrStreamClosed
	}
	return e.d.alive()
}

// Record captures the work enqueued on s so far; s must be a stream of the
// event's device.
func (e *Event) Record(s streams.Stream) error {
	if err := e.alive(); err != nil {
		return err
	}
	cs, err := e.d.stream(s)
	if err != nil {
		return err
	}
	return eventRecord(e.d.ctx, e.h, cs.h)
}

// Query reports whether the captured work has completed. A failure of the
// device (a sticky CUDA error) is reported as done with that error.
func (e *Event) Query() (bool, error) {
	if err := e.alive(); err != nil {
		return false, err
	}
	switch r := eventQuery(e.d.ctx, e.h); r {
	case cudaSuccess:
		return true, nil
	case cudaNotReady:
		return false, nil
	default:
		return true, newError("cuEventQuery", r)
	}
}

// Wait polls Query (napping between, at most a sixteenth of the wait
// so far, up to 200 µs: poll.Backoff)
// until the captured work has completed or ctx is done; it then returns
// ctx.Err() unchanged.
func (e *Event) Wait(ctx context.Context) error {
	return waitCtx(ctx, e.Query)
}

// Synchronize blocks the thread in cuEventSynchronize (no context).
func (e *Event) Synchronize() error {
	if err := e.alive(); err != nil {
		return err
	}
	return eventSync(e.d.ctx, e.h)
}

// Close destroys the event.
func (e *Event) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	e.d.untrack(e)
	if e.d.closed.Load() {
		return nil
	}
	return eventDestroy(e.d.ctx, e.h)
}

func (e *Event) destroy() error {
	e.closed.Store(true)
	return eventDestroy(e.d.ctx, e.h)
}

// NewTimingEvent creates an event with timing, for backend.EventTimer.
func (d *Device) NewTimingEvent() (streams.Event, error) {
	e, err := d.CreateEvent(true)
	if err != nil {
		return nil, err
	}
	return e, nil
}

var _ backend.EventTimer = (*Device)(nil)

// Elapsed is Elapsed of two timing events of d (backend.EventTimer).
func (d *Device) Elapsed(start, end streams.Event) (time.Duration, error) {
	s, ok1 := start.(*Event)
	e, ok2 := end.(*Event)
	if !ok1 || !ok2 || s.d != d || e.d != d {
		return 0, &fairgo.ArgError{Arg: "event", Value: fmt.Sprintf("%T, %T", start, end),
			Reason: fmt.Sprintf("not timing events of %v", d)}
	}
	return Elapsed(s, e)
}

// Elapsed is the GPU time between two recorded timing events (start
// before end); both must have completed.
func Elapsed(start, end *Event) (time.Duration, error) {
	if !start.timing || !end.timing {
		return 0, &fairgo.ArgError{
			Arg:    "event",
			Value:  "without timing",
			Reason: "Elapsed needs events from CreateEvent(true)",
		}
	}
	if err := errors.Join(start.alive(), end.alive()); err != nil {
		return 0, err
	}
	return eventElapsed(start.d.ctx, start.h, end.h)
}

// TimeRegion measures on the GPU the work fn enqueues on s: it records a
// timing event on s, calls fn, records another, waits for it, and returns
// the time between the two.
func (d *Device) TimeRegion(s *Stream, fn func() error) (time.Duration, error) {
	start, err := d.CreateEvent(true)
	if err != nil {
		return 0, err
	}
	defer start.Close()
	end, err := d.CreateEvent(true)
	if err != nil {
		return 0, err
	}
	defer end.Close()
	if err := start.Record(s); err != nil {
		return 0, err
	}
	if err := fn(); err != nil {
		return 0, err
	}
	if err := end.Record(s); err != nil {
		return 0, err
	}
	if err := end.Synchronize(); err != nil {
		return 0, err
	}
	return Elapsed(start, end)
}
