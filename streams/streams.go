// Package streams defines the ordered-work queues (Stream) and their markers
// (Event) that the fairgo engine pipelines on, and the five-stage chain that
// hands each slice from one stage's stream to the next with an event.
//
// A backend (the CUDA one or the simulated one) implements Stream and Event
// with the semantics of CUDA streams and events; the engine never blocks the
// host inside a pipeline, it only records and waits on events.
package streams

import "context"

// Stream is an asynchronous FIFO of device work. Work enqueued on a stream
// runs in order; work on different streams may run concurrently unless an
// event orders it.
type Stream interface {
	// WaitEvent makes work enqueued on this stream after the call wait until
	// the work captured by e's most recent Record (at the time of this call)
	// has completed. Recording e again later does not affect this wait. If
	// e was never recorded the wait is a no-op, as in CUDA.
	WaitEvent(e Event) error
}

// Event marks a point in a stream.
type Event interface {
	// Record captures the work enqueued on s so far. An event may be
	// recorded again; waits and queries see the latest capture.
	Record(s Stream) error
	// Query reports whether the captured work has completed, and the error
	// it ended with (an asynchronous failure of the device or of a
	// communicator), if any. An event never recorded is complete.
	Query() (done bool, err error)
	// Wait blocks the calling goroutine until the captured work has
	// completed, or ctx is done (then it returns ctx.Err() unchanged). Once
	// the work is complete it returns nil or the work's error, which Query
	// also reports; callers that must tell the two cases apart use Query.
	Wait(ctx context.Context) error
}
