package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/streams"
)

// op is one unit of stream work. run performs it (nil for a marker such as
// an event record); done, if set, is called exactly once with the outcome:
// nil, the error run returned, or the stream's sticky error when the op was
// skipped.
type op struct {
	name string
	run  func(ctx context.Context) error
	done func(err error)
}

// Stream is a simulated CUDA stream: an asynchronous FIFO of device work run
// by its own goroutine. Enqueueing returns at once. Once an operation fails,
// the stream is failed for good (like a CUDA sticky error): later operations
// are skipped and fail with the same error, and events recorded on it carry
// that error.
type Stream struct {
	dev    *Device
	id     int
	jitter time.Duration
	rng    *rand.Rand  // used only by the stream's goroutine
	timer  *time.Timer // delay's, reused from operation to operation; the stream's goroutine's alone

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []op
	closing bool  // no more enqueues; the goroutine drains the queue and exits
	err     error // sticky error
}

var _ streams.Stream = (*Stream)(nil)

func newStream(d *Device, id int, seed int64, jitter time.Duration) *Stream {
	s := &Stream{
		dev:    d,
		id:     id,
		jitter: jitter,
		rng:    rand.New(rand.NewPCG(uint64(seed), uint64(d.index)<<32|uint64(id))),
	}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *Stream) String() string { return fmt.Sprintf("%s stream %d", s.dev, s.id) }

// Device returns the device the stream belongs to.
func (s *Stream) Device() *Device { return s.dev }

// Err returns the stream's sticky error: the first failure of an operation
// it ran, or nil.
func (s *Stream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// WaitEvent makes work enqueued on s after the call wait until the work
// captured by e's latest Record (at the time of this call) has completed. A
// never-recorded event makes it a no-op. If that work failed, s fails with
// the same error. e may belong to another device, as in CUDA.
func (s *Stream) WaitEvent(e streams.Event) error {
	ev, ok := e.(*Event)
	if !ok || ev == nil {
		return &fairgo.ArgError{Arg: "event", Value: fmt.Sprintf("%T", e), Reason: "not a sim event"}
	}
	r := ev.latest()
	if r == nil {
		return nil
	}
	return s.enqueue(op{name: "wait event", run: func(ctx context.Context) error {
		select {
		case <-r.done:
			return r.err
		case <-ctx.Done():
			return s.dev.closedErr()
		}
	}})
}

// Synchronize blocks until the work enqueued on s so far has completed, and
// returns the stream's error, if any; or ctx.Err() if ctx ends first.
func (s *Stream) Synchronize(ctx context.Context) error {
	r := &record{done: make(chan struct{})}
	if err := s.enqueue(op{name: "synchronize", done: r.complete}); err != nil {
		return err
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Destroy releases the stream once its pending work has run (like
// cudaStreamDestroy it returns at once); enqueueing on it afterwards fails.
func (s *Stream) Destroy() error {
	s.mu.Lock()
	already := s.closing
	s.closing = true
	s.cond.Broadcast()
	s.mu.Unlock()
	if !already {
		s.dev.forget(s)
	}
	return nil
}

// enqueue appends o, or fails if the stream was destroyed or its device closed.
func (s *Stream) enqueue(o op) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return fmt.Errorf("sim: enqueueing %s on %s: %w", o.name, s, fairgo.ErrClosed)
	}
	s.queue = append(s.queue, o)
	s.cond.Signal()
	return nil
}

// loop is the stream's goroutine.
func (s *Stream) loop(ctx context.Context) {
	defer s.dev.wg.Done()
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closing {
			s.cond.Wait()
		}
		if len(s.queue) == 0 {
			s.mu.Unlock()
			return
		}
		o := s.queue[0]
		s.queue[0] = op{}
		s.queue = s.queue[1:]
		err := s.err
		s.mu.Unlock()

		if err == nil && ctx.Err() != nil {
			err = s.fail(s.dev.closedErr())
		}
		if err == nil {
			s.delay(ctx)
			if o.run != nil {
				if err = o.run(ctx); err != nil {
					err = s.fail(err)
				}
			}
		}
		if o.done != nil {
			o.done(err)
		}
	}
}

// fail makes err the stream's sticky error unless it already has one, and
// returns the sticky error.
func (s *Stream) fail(err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
	return s.err
}

// delay is the seeded random delay before each operation (Config.Jitter).
func (s *Stream) delay(ctx context.Context) {
	if s.jitter <= 0 {
		return
	}
	if s.rng.IntN(2) == 0 {
		runtime.Gosched()
	}
	d := time.Duration(s.rng.Int64N(int64(s.jitter)))
	if d <= 0 {
		return
	}
	if s.timer == nil {
		s.timer = time.NewTimer(d)
	} else {
		s.timer.Reset(d) // since Go 1.23 no value of an earlier run is left to receive
	}
	select {
	case <-s.timer.C:
	case <-ctx.Done():
		s.timer.Stop()
	}
}

// record is one capture of an event: done is closed when the work enqueued
// before it has completed, err is that work's failure.
type record struct {
	done chan struct{}
	err  error
	at   time.Time // when the stream reached it
}

func (r *record) complete(err error) {
	r.err = err
	r.at = time.Now()
	close(r.done)
}

// Event is a simulated CUDA event. Record captures the work enqueued on a
// stream so far; waits and queries see the latest capture, and a wait
// enqueued earlier keeps the capture it saw. An event never recorded is
// complete.
type Event struct {
	dev    *Device
	timing bool // made by NewTimingEvent: Elapsed reads it
	mu     sync.Mutex
	rec    *record
}

var _ streams.Event = (*Event)(nil)

// Record captures the work enqueued on st so far. st must be a stream of
// the event's device.
func (e *Event) Record(st streams.Stream) error {
	s, ok := st.(*Stream)
	if !ok || s == nil {
		return &fairgo.ArgError{Arg: "stream", Value: fmt.Sprintf("%T", st), Reason: "not a sim stream"}
	}
	if s.dev != e.dev {
		return &fairgo.ArgError{
			Arg:    "stream",
			Value:  s.String(),
			Reason: fmt.Sprintf("an event of %s cannot be recorded on a stream of another device", e.dev),
		}
	}
	r := &record{done: make(chan struct{})}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := s.enqueue(op{name: "record event", done: r.complete}); err != nil {
		return err
	}
	e.rec = r
	return nil
}

func (e *Event) latest() *record {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rec
}

// Query reports whether the captured work has completed, and its error.
func (e *Event) Query() (bool, error) {
	r := e.latest()
	if r == nil {
		return true, nil
	}
	select {
	case <-r.done:
		return true, r.err
	default:
		return false, nil
	}
}

// Wait blocks until the captured work has completed and returns its error,
// or returns ctx.Err() unchanged if ctx ends first.
func (e *Event) Wait(ctx context.Context) error {
	r := e.latest()
	if r == nil {
		return nil
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}
