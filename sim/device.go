package sim

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/elem"
	"github.com/fairgo/fairgo/streams"
)

// Device is one simulated GPU: its own address space (base (index+1)<<40,
// 256-byte aligned allocations with unmapped gaps between them, zeroed when
// allocated), streams run by goroutines, events, and the copy and reduce
// operations of backend.Device. Every access a stream operation makes is
// bounds-checked against the device's allocations.
type Device struct {
	cluster *Cluster
	index   int // global rank
	grid    hier.Grid
	seed    int64
	jitter  time.Duration
	mem     memory

	ctx    context.Context // cancelled by Close: blocked stream work gives up
	cancel context.CancelFunc
	wg     sync.WaitGroup // stream goroutines

	mu         sync.Mutex
	streams    []*Stream // live (not destroyed) streams
	nextStream int
	closed     bool
}

var (
	_ backend.Device    = (*Device)(nil)
	_ fairgo.HostCopier = (*Device)(nil) // fairgo.Upload and Download
)

func newDevice(c *Cluster, index int, grid hier.Grid) *Device {
	d := &Device{cluster: c, index: index, grid: grid, seed: c.cfg.Seed, jitter: c.cfg.Jitter}
	d.mem = memory{owner: d, limit: c.cfg.MemoryLimit}
	d.mem.next = d.mem.base()
	d.ctx, d.cancel = context.WithCancel(context.Background())
	return d
}

func (d *Device) String() string {
	return fmt.Sprintf("sim device %d (machine %d, local %d)", d.index, d.grid.Machine, d.grid.Local)
}

// Index is the device's global rank in its cluster.
func (d *Device) Index() int { return d.index }

// Grid is the device's place in the cluster's grid.
func (d *Device) Grid() hier.Grid { return d.grid }

func (d *Device) closedErr() error { return fmt.Errorf("sim: %s closed: %w", d, fairgo.ErrClosed) }

// elsewhere names the other device of the cluster an address belongs to,
// for error messages ("" when it is none).
func (d *Device) elsewhere(ptr uintptr) string {
	i := int(ptr>>addrShift) - 1
	if i == d.index || i < 0 || d.cluster == nil || i >= len(d.cluster.devices) {
		return ""
	}
	return "; the address belongs to " + d.cluster.devices[i].String()
}

func (d *Device) checkOpen() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return d.closedErr()
	}
	return nil
}

// NewStream creates a stream (a *Stream) run by its own goroutine until the
// device closes or the stream is destroyed.
func (d *Device) NewStream() (streams.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, d.closedErr()
	}
	s := newStream(d, d.nextStream, d.seed, d.jitter)
	d.nextStream++
	d.streams = append(d.streams, s)
	d.wg.Add(1)
	go s.loop(d.ctx)
	return s, nil
}

// NewEvent creates an event (an *Event) of this device.
func (d *Device) NewEvent() (streams.Event, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	return &Event{dev: d}, nil
}

// NewTimingEvent creates an event whose completion time Elapsed reads
// (backend.EventTimer).
func (d *Device) NewTimingEvent() (streams.Event, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	return &Event{dev: d, timing: true}, nil
}

var (
	_ backend.EventTimer = (*Device)(nil)
	_ backend.PairCopier = (*Device)(nil)
	_ backend.HostMapper = (*Device)(nil)
)

// Elapsed is the wall time between the moments the streams reached two
// completed timing events of d, start recorded before end.
func (d *Device) Elapsed(start, end streams.Event) (time.Duration, error) {
	s, ok1 := start.(*Event)
	e, ok2 := end.(*Event)
	if !ok1 || !ok2 || !s.timing || !e.timing || s.dev != d || e.dev != d {
		return 0, &fairgo.ArgError{Arg: "event", Value: fmt.Sprintf("%T, %T", start, end),
			Reason: fmt.Sprintf("not timing events of %v", d)}
	}
	rs, re := s.latest(), e.latest()
	for _, r := range []*record{rs, re} {
		if r == nil {
			return 0, &fairgo.ArgError{Arg: "event", Value: "never recorded", Reason: "Elapsed needs recorded events"}
		}
		select {
		case <-r.done:
		default:
			return 0, &fairgo.ArgError{Arg: "event", Value: "not complete", Reason: "Elapsed needs completed events"}
		}
	}
	return re.at.Sub(rs.at), nil
}

// Alloc allocates bytes of zeroed device memory (CUDA leaves it undefined).
// A zero-byte allocation gets an address of its own.
func (d *Device) Alloc(bytes int64) (uintptr, error) {
	if err := d.checkOpen(); err != nil {
		return 0, err
	}
	return d.mem.alloc(bytes)
}

// Free releases an allocation at once. Unlike cudaFree it does not wait for
// the device: pending work that touches the memory fails with an illegal
// address. Free(0) does nothing.
func (d *Device) Free(ptr uintptr) error { return d.mem.free(ptr) }

// CheckRange returns an error wrapping fairgo.ErrInvalidArgument, naming
// the device and the address, unless [ptr, ptr+bytes) lies inside one
// allocation of this device. An empty range at ptr 0 is accepted.
func (d *Device) CheckRange(ptr uintptr, bytes int64) error { return d.mem.checkRange(ptr, bytes) }

// AllocTensor allocates a tensor of count elements of dt.
func (d *Device) AllocTensor(count int64, dt fairgo.DType) (fairgo.Tensor, error) {
	// Validate the shape with a stand-in address, then allocate.
	t := fairgo.Tensor{Ptr: d.mem.base(), Count: count, DType: dt, Bytes: count * int64(dt.Size())}
	if err := t.Validate(); err != nil {
		return fairgo.Tensor{}, err
	}
	ptr, err := d.Alloc(t.Bytes)
	if err != nil {
		return fairgo.Tensor{}, err
	}
	t.Ptr = ptr
	return t, nil
}

// Upload copies src from the host to dst, synchronously (it does not wait
// for streams). The range must lie inside one allocation of this device.
func (d *Device) Upload(dst uintptr, src []byte) error {
	if err := d.mem.checkRange(dst, int64(len(src))); err != nil {
		return fmt.Errorf("sim: upload to %s: %w", d, err)
	}
	if err := d.mem.write("upload", dst, src); err != nil {
		return fmt.Errorf("sim: upload: %w: %w", fairgo.ErrInvalidArgument, err)
	}
	return nil
}

// Download copies device memory at src into dst, synchronously (it does
// not wait for streams).
func (d *Device) Download(dst []byte, src uintptr) error {
	if err := d.mem.checkRange(src, int64(len(dst))); err != nil {
		return fmt.Errorf("sim: download from %s: %w", d, err)
	}
	if err := d.mem.readInto("download", src, dst); err != nil {
		return fmt.Errorf("sim: download: %w: %w", fairgo.ErrInvalidArgument, err)
	}
	return nil
}

// Synchronize waits for the work enqueued so far on every stream of the
// device and returns the first stream error, or ctx.Err().
func (d *Device) Synchronize(ctx context.Context) error {
	d.mu.Lock()
	ss := append([]*Stream(nil), d.streams...)
	d.mu.Unlock()
	var first error
	for _, s := range ss {
		if err := s.Synchronize(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if first == nil {
				first = err
			}
		}
	}
	return first
}

func (d *Device) forget(s *Stream) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, x := range d.streams {
		if x == s {
			d.streams = append(d.streams[:i], d.streams[i+1:]...)
			return
		}
	}
}

// stream returns st as a stream of this device.
func (d *Device) stream(st streams.Stream) (*Stream, error) {
	s, ok := st.(*Stream)
	if !ok || s == nil {
		return nil, &fairgo.ArgError{Arg: "stream", Value: fmt.Sprintf("%T", st), Reason: "not a sim stream"}
	}
	if s.dev != d {
		return nil, &fairgo.ArgError{
			Arg:    "stream",
			Value:  s.String(),
			Reason: "belongs to another device than " + d.String(),
		}
	}
	return s, nil
}

// AllocHost returns host memory for the asynchronous copies (any memory
// would do on the host; the CUDA backend's is page-locked). FreeHost
// releases it.
func (d *Device) AllocHost(bytes int) ([]byte, error) {
	if bytes < 1 {
		return nil, &fairgo.ArgError{Arg: "bytes", Value: bytes, Reason: "must be at least 1"}
	}
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	return make([]byte, bytes), nil
}

// FreeHost releases memory from AllocHost.
func (d *Device) FreeHost(b []byte) error {
	d.mem.unmapHost(b)
	return nil
}

// CopyFromHostAsync enqueues a copy of src to dst on s; src is read when
// the stream runs the copy, as on a GPU.
func (d *Device) CopyFromHostAsync(dst uintptr, src []byte, st streams.Stream) error {
	s, err := d.stream(st)
	if err != nil {
		return err
	}
	if err := d.mem.checkRange(dst, int64(len(src))); err != nil {
		return fmt.Errorf("sim: copy from the host to %s: %w", d, err)
	}
	return s.enqueue(op{name: "copy from host", run: func(context.Context) error {
		return d.mem.write("copy from host", dst, src)
	}})
}

// CopyToHostAsync enqueues a copy of device memory at src into dst on s;
// dst holds the bytes once the stream has run the copy.
func (d *Device) CopyToHostAsync(dst []byte, src uintptr, st streams.Stream) error {
	s, err := d.stream(st)
	if err != nil {
		return err
	}
	if err := d.mem.checkRange(src, int64(len(dst))); err != nil {
		return fmt.Errorf("sim: copy to the host from %s: %w", d, err)
	}
	return s.enqueue(op{name: "copy to host", run: func(context.Context) error {
		return d.mem.readInto("copy to host", src, dst)
	}})
}

// DelayAsync enqueues an operation that takes dur (a slow producer, for
// tests; the CUDA backend has the same).
func (d *Device) DelayAsync(dur time.Duration, st streams.Stream) error {
	s, err := d.stream(st)
	if err != nil {
		return err
	}
	return s.enqueue(op{name: "delay", run: func(ctx context.Context) error {
		t := time.NewTimer(dur)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}})
}

// CopyAsync enqueues a copy of bytes from src to dst, both on this device.
func (d *Device) CopyAsync(dst, src uintptr, bytes int64, st streams.Stream) error {
	s, err := d.stream(st)
	if err != nil {
		return err
	}
	if bytes < 0 {
		return &fairgo.ArgError{Arg: "bytes", Value: bytes, Reason: "negative copy size"}
	}
	if bytes == 0 {
		return nil
	}
	return s.enqueue(op{name: "copy", run: func(context.Context) error {
		data, free := newScratch(bytes)
		defer free()
		if err := d.mem.readInto("copy", src, data); err != nil {
			return err
		}
		return d.mem.write("copy", dst, data)
	}})
}

// CopyPairAsync enqueues the two copies of backend.PairCopier as one
// operation: every byte read before any is written, as with CopyAsync.
func (d *Device) CopyPairAsync(dst1, src1 uintptr, n1 int64, dst2, src2 uintptr, n2 int64, st streams.Stream) error {
	s, err := d.stream(st)
	if err != nil {
		return err
	}
	if err := backend.CheckCopyPair(dst1, src1, n1, dst2, src2, n2); err != nil || n1 == 0 && n2 == 0 {
		return err
	}
	return s.enqueue(op{name: "copy pair", run: func(context.Context) error {
		data, free := newScratch(n1 + n2)
		defer free()
		if err := d.mem.readInto("copy pair", src1, data[:n1]); err != nil {
			return err
		}
		if err := d.mem.readInto("copy pair", src2, data[n1:]); err != nil {
			return err
		}
		if err := d.mem.write("copy pair", dst1, data[:n1]); err != nil {
			return err
		}
		return d.mem.write("copy pair", dst2, data[n1:])
	}})
}

// Copy2DAsync enqueues height copies of width bytes, row i from
// src+i·srcPitch to dst+i·dstPitch. As in CUDA, both pitches must be at
// least width.
func (d *Device) Copy2DAsync(dst uintptr, dstPitch int64, src uintptr, srcPitch int64, width, height int64,
	st streams.Stream) error {
	s, err := d.stream(st)
	if err != nil {
		return err
	}
	switch {
	case width < 0 || height < 0:
		return &fairgo.ArgError{Arg: "2D copy extent", Value: fmt.Sprintf("%d×%d", width, height), Reason: "negative"}
	case width == 0 || height == 0:
		return nil
	case dstPitch < width || srcPitch < width:
		return &fairgo.ArgError{
			Arg:    "2D copy pitch",
			Value:  fmt.Sprintf("dst %d, src %d", dstPitch, srcPitch),
			Reason: fmt.Sprintf("smaller than the width %d", width),
		}
	}
	return s.enqueue(op{name: "2D copy", run: func(context.Context) error {
		rows, free := newScratch(height * width) // every row read before any is written
		defer free()
		for i := range height {
			if err := d.mem.readInto("2D copy", src+uintptr(i*srcPitch), rows[i*width:(i+1)*width]); err != nil {
				return err
			}
		}
		for i := range height {
			if err := d.mem.write("2D copy", dst+uintptr(i*dstPitch), rows[i*width:(i+1)*width]); err != nil {
				return err
			}
		}
		return nil
	}})
}

// ReduceAsync enqueues the add stage's kernel (see backend.Device):
// dst[i] = op over k in [0, n) of src[k·stride + i] for i in [0, count),
// computed by elem.ReduceShards. dst may be one of the sources exactly but
// must not partly overlap any (checked here; a GPU would silently compute
// garbage).
func (d *Device) ReduceAsync(dst, src uintptr, n int, stride, count int64, dt fairgo.DType, rop fairgo.Op, divisor int,
	st streams.Stream) error {
	s, err := d.stream(st)
	if err != nil {
		return err
	}
	switch {
	case !dt.Valid():
		return &fairgo.ArgError{Arg: "dtype", Value: dt, Reason: "unknown element type", Err: fairgo.ErrUnknownDType}
	case !rop.Valid():
		return &fairgo.ArgError{Arg: "op", Value: rop, Reason: "unknown reduction operator", Err: fairgo.ErrUnknownOp}
	case n < 1:
		return &fairgo.ArgError{Arg: "n", Value: n, Reason: "a reduction needs at least one source"}
	case stride < 0 || count < 0:
		return &fairgo.ArgError{Arg: "stride/count", Value: fmt.Sprintf("%d/%d", stride, count), Reason: "negative"}
	case rop == fairgo.Avg && divisor < 1:
		return &fairgo.ArgError{Arg: "divisor", Value: divisor, Reason: "avg needs a divisor of at least 1"}
	}
	size := int64(dt.Size())
	bytes := count * size
	if count == 0 {
		return nil
	}
	for k := range int64(n) {
		shard := src + uintptr(k*stride*size)
		if shard != dst && overlaps(dst, bytes, shard, bytes) {
			return &fairgo.ArgError{
				Arg:    "dst",
				Value:  fmt.Sprintf("%#x", dst),
				Reason: fmt.Sprintf("partly overlaps source shard %d at %#x", k, shard),
			}
		}
	}
	return s.enqueue(op{name: "reduce", run: func(context.Context) error {
		// A GPU's reduce kernel loads and stores whole elements: at an
		// address that is not a multiple of the element's size it faults
		// (CUDA_ERROR_MISALIGNED_ADDRESS), and so does the sim.
		for _, at := range []uintptr{dst, src} {
			if int64(at)%size != 0 {
				return d.mem.illegal("reduce", at, bytes, fmt.Sprintf("misaligned for %v elements", dt))
			}
		}
		srcs := make([][]byte, n)
		var frees []func()
		defer func() {
			for _, free := range frees {
				free()
			}
		}()
		for k := range srcs {
			b, free := newScratch(bytes)
			frees = append(frees, free)
			if err := d.mem.readInto("reduce", src+uintptr(int64(k)*stride*size), b); err != nil {
				return err
			}
			srcs[k] = b
		}
		out, free := newScratch(bytes)
		frees = append(frees, free)
		if err := elem.ReduceShards(dt, rop, out, srcs, divisor); err != nil {
			return fmt.Errorf("sim: reduce on %s: %w", d, err)
		}
		return d.mem.write("reduce", dst, out)
	}})
}

func overlaps(a uintptr, an int64, b uintptr, bn int64) bool {
	return an > 0 && bn > 0 && a < b+uintptr(bn) && b < a+uintptr(an)
}

// Group runs fn. Sim collectives need no fusing: each stays in order on its
// stream, so groups nest trivially.
func (d *Device) Group(fn func() error) error {
	if fn == nil {
		return &fairgo.ArgError{Arg: "fn", Value: nil, Reason: "missing group function"}
	}
	return fn()
}

// Close stops the device's streams: work still pending fails with an error
// wrapping fairgo.ErrClosed, and the stream goroutines exit before Close
// returns. Memory stays readable (Download) until the cluster closes.
// Closing twice is a no-op.
func (d *Device) Close() error {
	ss, first := closeOnce(&d.mu, &d.closed, func() []*Stream { return d.streams })
	if !first {
		return nil
	}
	d.cancel()
	for _, s := range ss {
		s.mu.Lock()
		s.closing = true
		s.cond.Broadcast()
		s.mu.Unlock()
	}
	d.wg.Wait()
	return nil
}
