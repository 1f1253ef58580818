package capi

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"sync"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/hier/setup"
	"github.com/fairgo/fairgo/rendezvous"
	"github.com/fairgo/fairgo/streams"
)

// Backend is what a Table needs from a device backend: the backend.Backend
// that builds the devices and communicators, and a way to turn a caller's
// raw stream handle (a cudaStream_t) into a stream of a device.
type Backend interface {
	backend.Backend
	// ForeignStream returns the stream of dev that handle names. The stream
	// belongs to the caller: closing the result must not destroy it.
	ForeignStream(dev backend.Device, handle uintptr) (streams.Stream, error)
}

// Config configures a Table.
type Config struct {
	Backend Backend
	Classes Classes
	// Store, when not nil, is the store every Init meets the other ranks
	// through (tests: a shared in-memory store); nil means the launcher's
	// (setup.New's default) or the address InitRank is given.
	Store rendezvous.Store
	// Setup options are added to every Init and InitRank (tests: the
	// environment and machine identity of each simulated process go in
	// Options.Setup instead).
	Setup []setup.Option
}

// Defaults of Options.
const (
	DefaultInitTimeout    = 5 * time.Minute
	DefaultEnqueueTimeout = 5 * time.Minute
)

// Options are the per-communicator settings (fairgo_config_t). Init
// validates them: those that become hier options (Settings' Option) with
// hier.ValidateOptions, the C ABI's own (InitTimeout, Device) itself; an
// invalid one is an *fairgo.ArgError naming its fairgo_config_t field.
type Options struct {
	// Device is the CUDA ordinal of this rank; -1: the default (the only
	// GPU CUDA_VISIBLE_DEVICES names, else LOCAL_RANK).
	Device int
	// InitTimeout bounds Init (store, discovery, communicators); zero:
	// DefaultInitTimeout.
	InitTimeout time.Duration
	// OpTimeout arms the Reducer's watchdog (hier.WithTimeout); zero: off.
	// It also bounds how long AllReduce waits for the engine to enqueue
	// the call (else DefaultEnqueueTimeout).
	OpTimeout time.Duration
	// SliceBytes and FlatThreshold are hier.WithSliceSize and
	// hier.WithFlatThreshold; zero: fairgo's defaults.
	SliceBytes    int64
	FlatThreshold int64
	// Algorithm is hier.WithAlgorithm (Auto: measure each size class).
	Algorithm hier.Algorithm
	// Setup are more setup options (Go callers only).
	Setup []setup.Option
}

// DefaultOptions are the defaults of fairgo_config_init.
func DefaultOptions() Options { return Options{Device: -1, InitTimeout: DefaultInitTimeout} }

// Table holds the handles of one C caller (libfairgo.so has one for the
// process). Its methods are safe for concurrent use.
type Table struct {
	cfg Config

	mu     sync.Mutex
	next   int64 // the last id handed out; ids of all kinds share it
	comms  map[int64]*comm
	works  map[int64]work
	stores map[int64]*store
}

// work is a work handle's call and the communicator it was made on (a
// stream wait needs the communicator's device and enqueue limit).
type work struct {
	w *hier.Work
	c *comm
}

type comm struct {
	r    *hier.Reducer
	opts Options
}

type store struct {
	srv  *rendezvous.Server
	stop context.CancelFunc
	done chan struct{}
}

// NewTable returns an empty table.
func NewTable(cfg Config) *Table {
	return &Table{cfg: cfg, comms: map[int64]*comm{}, works: map[int64]work{}, stores: map[int64]*store{}}
}

// Classify is the table's Classes.Classify.
func (t *Table) Classify(err error) Code { return t.cfg.Classes.Classify(err) }

// Guard runs fn, turning a panic into an Internal error with its stack, so
// that no Go panic crosses into the C caller.
func Guard(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &Error{Code: Internal, Err: fmt.Errorf("fairgo: internal error (Go panic): %v\n%s", p, debug.Stack())}
		}
	}()
	return fn()
}

func (t *Table) add(put func(id int64)) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	put(t.next)
	return t.next
}

// Init builds the communicator of this process from the launch environment
// (setup.New: torchrun, fairrun, Slurm or Open MPI variables; the store the
// launcher names). It returns the communicator's handle.
func (t *Table) Init(o Options) (int64, error) {
	return t.init(nil, o)
}

// InitRank builds the communicator of this process from an explicit place
// in the job; l.StoreAddr is the store's "host:port" (not needed for a
// world of one, nor with Config.Store).
func (t *Table) InitRank(l rendezvous.Launch, o Options) (int64, error) {
	return t.init(&l, o)
}

func (t *Table) init(l *rendezvous.Launch, o Options) (int64, error) {
	if t.cfg.Backend == nil {
		return 0, &Error{Code: Internal, Err: errors.New("fairgo: capi table without a backend")}
	}
	if err := o.validate(); err != nil {
		return 0, err
	}
	if o.InitTimeout == 0 {
		o.InitTimeout = DefaultInitTimeout
	}
	sopts := append([]setup.Option{setup.WithReducer(o.reducerOptions()...)}, t.cfg.Setup...)
	sopts = append(sopts, o.Setup...)
	if l != nil {
		sopts = append(sopts, setup.WithLaunch(*l))
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.InitTimeout)
	defer cancel()
	var r *hier.Reducer
	var err error
	if o.Device >= 0 {
		var rs []*hier.Reducer
		rs, err = setup.NewLocal(ctx, t.cfg.Store, t.cfg.Backend, []int{o.Device}, sopts...)
		if err == nil {
			r = rs[0]
		}
	} else {
		r, err = setup.New(ctx, t.cfg.Store, t.cfg.Backend, sopts...)
	}
	if err != nil {
		return 0, fmt.Errorf("fairgo: init: %w", err)
	}
	c := &comm{r: r, opts: o}
	return t.add(func(id int64) { t.comms[id] = c }), nil
}

func (t *Table) comm(id int64) (*comm, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.comms[id]
	if !ok {
		return nil, badHandle("communicator", id)
	}
	return c, nil
}

// Reducer returns the Reducer behind a communicator handle.
func (t *Table) Reducer(id int64) (*hier.Reducer, error) {
	c, err := t.comm(id)
	if err != nil {
		return nil, err
	}
	return c.r, nil
}

// Info describes a communicator (fairgo_comm_info_t).
type Info struct {
	Rank      int // world rank (the launcher's order)
	WorldSize int
	Machines  int // M
	Devices   int // D, ranks per machine
	Machine   int // this rank's machine index
	Local     int // this rank's index on its machine
	Device    int // the CUDA ordinal; -1 when the backend has none
}

// Info describes the communicator id.
func (t *Table) Info(id int64) (Info, error) {
	c, err := t.comm(id)
	if err != nil {
		return Info{}, err
	}
	g := c.r.Grid()
	info := Info{
		Rank:      c.r.WorldRank(),
		WorldSize: g.Size(),
		Machines:  g.Machines,
		Devices:   g.Devices,
		Machine:   g.Machine,
		Local:     g.Local,
		Device:    -1,
	}
	if d, ok := c.r.Device().(interface{ Ordinal() int }); ok {
		info.Device = d.Ordinal()
	}
	return info, nil
}

// Algorithm is the algorithm an allreduce of bytes bytes takes on the
// communicator id (fairgo_comm_algorithm), and whether it is settled (by
// the settings, a rule or Auto's measurement; hier.Choice.Measured): false
// only for Auto's guess for a size class no call has reached yet, which
// the class's first call may change.
func (t *Table) Algorithm(id, bytes int64) (hier.Algorithm, bool, error) {
	c, err := t.comm(id)
	if err != nil {
		return 0, false, err
	}
	if bytes < 0 {
		return 0, false, &fairgo.ArgError{Arg: "bytes", Value: fmt.Sprint(bytes), Reason: "must not be negative"}
	}
	ch := c.r.ChoiceFor(bytes)
	return ch.Algorithm, ch.Measured, nil
}

// AllReduce reduces count elements of dt at the device address ptr in place
// across all ranks with op. The device work is ordered after the work
// enqueued on the caller's stream so far, and the caller's stream is made to
// wait for the result; AllReduce returns once the call is enqueued on the
// device (the host never waits for the GPU). Errors found before anything is
// enqueued are returned here; the work's own outcome is observed through
// the returned work handle (Test, Wait), which must be freed (FreeWork).
func (t *Table) AllReduce(id int64, ptr uintptr, count int64, dt fairgo.DType, op fairgo.Op, stream uintptr) (int64, error) {
	return t.allReduce(id, ptr, count, dt, op, stream, true)
}

// AllReduceAsync is AllReduce without the stream wait: the device work is
// ordered after the caller's stream, but the stream does not wait for the
// result until StreamWait is called on the returned handle (a comm hook
// lets the backward pass run on while the bucket is reduced). It returns
// without waiting for the engine to enqueue the call.
func (t *Table) AllReduceAsync(id int64, ptr uintptr, count int64, dt fairgo.DType, op fairgo.Op, stream uintptr) (int64, error) {
	return t.allReduce(id, ptr, count, dt, op, stream, false)
}

func (t *Table) allReduce(
	id int64,
	ptr uintptr,
	count int64,
	dt fairgo.DType,
	op fairgo.Op,
	stream uintptr,
	wait bool,
) (int64, error) {
	c, err := t.comm(id)
	if err != nil {
		return 0, err
	}
	var bytes int64
	if size := int64(dt.Size()); size > 0 && count >= 0 && count <= math.MaxInt64/size {
		bytes = count * size
	}
	tensor := fairgo.Tensor{Ptr: ptr, Bytes: bytes, Count: count, DType: dt}
	s, err := t.cfg.Backend.ForeignStream(c.r.Device(), stream)
	if err != nil || tensor.Validate() != nil || !op.Valid() {
		// The Reducer refuses the call itself, in its place in the call
		// order: the peers that accepted theirs then fail at once with a
		// *hier.MismatchError naming this rank and its reason, instead of
		// waiting for a call that never comes. A bad stream rides in as the
		// cause of a cancelled context (the tensor and op are judged first).
		ctx := context.Background()
		if err != nil {
			refused, cancel := context.WithCancelCause(ctx)
			cancel(fmt.Errorf("fairgo: allreduce: stream %#x: %w", stream, err))
			ctx = refused
		}
		return 0, c.r.AllReduce(ctx, tensor, op).Wait(context.Background())
	}
	opts := []hier.CallOption{hier.After(s)}
	if !wait {
		opts = append(opts, hier.Detached()) // an inline call would run on s
	}
	w := c.r.AllReduce(context.Background(), tensor, op, opts...)
	if wait {
		if err := streamWait(w, s, c.enqueueLimit()); err != nil {
			return 0, err
		}
	}
	return t.add(func(wid int64) { t.works[wid] = work{w: w, c: c} }), nil
}

// StreamWait makes the caller's stream (a raw handle of the work's device)
// wait for the result of the work: work enqueued on it afterwards sees the
// reduced data. It may be called for any work handle, more than once and
// on several streams; for a call made by AllReduce it adds nothing. It waits
// on the host only for the engine to enqueue the call, as AllReduce does.
func (t *Table) StreamWait(id int64, stream uintptr) error {
	e, err := t.work(id)
	if err != nil {
		return err
	}
	s, err := t.cfg.Backend.ForeignStream(e.c.r.Device(), stream)
	if err != nil {
		return fmt.Errorf("fairgo: work_stream_wait: stream %#x: %w", stream, err)
	}
	return streamWait(e.w, s, e.c.enqueueLimit())
}

// enqueueLimit bounds how long a stream wait waits for the engine to
// enqueue a call: the watchdog's timeout, else DefaultEnqueueTimeout.
func (c *comm) enqueueLimit() time.Duration {
	if c.opts.OpTimeout > 0 {
		return c.opts.OpTimeout
	}
	return DefaultEnqueueTimeout
}

// streamWait makes s wait for w's result. Work that fails before the
// engine enqueues it (checks at execution, a broken or closed Reducer)
// counts as enqueued once complete, and its own result is then final (its
// device work, if any, has completed: no stream wait is needed). A call
// already enqueued, as an inline call always is, takes no timer: the
// caller's thread pays only the stream wait, if any.
func streamWait(w *hier.Work, s streams.Stream, limit time.Duration) error {
	ctx := context.Background()
	select {
	case <-w.Enqueued():
	default:
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, limit)
		defer cancel()
	}
	err := w.StreamWait(ctx, s)
	if err == nil {
		return nil
	}
	if w.IsCompleted() {
		return w.Err()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("fairgo: allreduce: the engine did not enqueue the call within %v: %w", limit, err)
	}
	return err
}

func (t *Table) work(id int64) (work, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.works[id]
	if !ok {
		return work{}, badHandle("work", id)
	}
	return e, nil
}

// Test reports whether the work has completed, and its error once it has.
func (t *Table) Test(id int64) (bool, error) {
	e, err := t.work(id)
	if err != nil {
		return false, err
	}
	w := e.w
	if !w.IsCompleted() {
		return false, nil
	}
	return true, w.Err()
}

// Wait waits up to timeout for the work to complete and returns its error;
// an *Error with Code NotReady (wrapping ErrNotReady) when the timeout
// passed first (the work goes on).
func (t *Table) Wait(id int64, timeout time.Duration) error {
	e, err := t.work(id)
	if err != nil {
		return err
	}
	w := e.w
	if timeout < 0 {
		return &fairgo.ArgError{Arg: "timeout_ms", Value: timeout.Milliseconds(), Reason: "negative"}
	}
	if w.IsCompleted() { // checked first: a zero timeout must not race the timer
		return w.Err()
	}
	if timeout > 0 {
		// Work.Wait polls the call's device work and completes it itself,
		// without waiting for the Reducer's watcher to see it done.
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_ = w.Wait(ctx) // the work's error, or ctx's: read below
	}
	if w.IsCompleted() {
		return w.Err()
	}
	return &Error{Code: NotReady, Err: fmt.Errorf("work handle %d: %w after %v", id, ErrNotReady, timeout)}
}

// FreeWork releases a work handle; the work itself goes on if pending.
func (t *Table) FreeWork(id int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.works[id]; !ok {
		return badHandle("work", id)
	}
	delete(t.works, id)
	return nil
}

// Close closes a communicator: calls not yet enqueued fail with
// fairgo.ErrClosed, device work still running gets a short grace period
// and is then aborted (see hier.Reducer.Close). Its work handles stay
// valid until freed; the handle itself is gone at once.
func (t *Table) Close(id int64) error {
	t.mu.Lock()
	c, ok := t.comms[id]
	delete(t.comms, id)
	t.mu.Unlock()
	if !ok {
		return badHandle("communicator", id)
	}
	if err := c.r.Close(); err != nil {
		return fmt.Errorf("fairgo: close: %w", err)
	}
	return nil
}

// ServeStore serves a rendezvous store on addr ("host:port"; port 0 picks
// a free one) until CloseStore, and returns its handle and the address it
// listens on. A process hosts it for the others when the launcher has no
// fairgo store (rank 0 under torchrun, say).
func (t *Table) ServeStore(addr string) (int64, string, error) {
	srv, err := rendezvous.Listen(addr)
	if err != nil {
		return 0, "", fmt.Errorf("fairgo: store on %q: %w", addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &store{srv: srv, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		_ = srv.Serve(ctx)
	}()
	return t.add(func(id int64) { t.stores[id] = s }), srv.Addr(), nil
}

// CloseStore stops a store served by ServeStore.
func (t *Table) CloseStore(id int64) error {
	t.mu.Lock()
	s, ok := t.stores[id]
	delete(t.stores, id)
	t.mu.Unlock()
	if !ok {
		return badHandle("store", id)
	}
	err := s.srv.Close()
	s.stop()
	<-s.done
	return err
}

// CloseAll closes every communicator and store and frees every work
// handle (tests; a process that unloads the library).
func (t *Table) CloseAll() error {
	t.mu.Lock()
	comms, stores := t.comms, t.stores
	t.comms, t.works, t.stores = map[int64]*comm{}, map[int64]work{}, map[int64]*store{}
	t.mu.Unlock()
	var rs []*hier.Reducer
	for _, c := range comms {
		rs = append(rs, c.r)
	}
	errs := []error{hier.CloseAll(rs)}
	for _, s := range stores {
		errs = append(errs, s.srv.Close())
		s.stop()
		<-s.done
	}
	return errors.Join(errs...)
}
