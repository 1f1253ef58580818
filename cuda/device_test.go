package cuda

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/streams"
)

type fakeStream struct{}

func (fakeStream) WaitEvent(streams.Event) error { return nil }

type fakeEvent struct{}

func (fakeEvent) Record(streams.Stream) error    { return nil }
func (fakeEvent) Query() (bool, error)           { return true, nil }
func (fakeEvent) Wait(ctx context.Context) error { return nil }

func TestOpen(t *testing.T) {
	start := time.Now()
	d := devices(t, 1)[0]
	t.Logf(
		"opened %v (%d SMs) in %v (includes JIT of the PTX unless cached)",
		d,
		d.Multiprocessors(),
		time.Since(start),
	)
	var _ backend.Device = d
	if _, err := Open(-1); !isInvalid(err) {
		t.Errorf("Open(-1): %v", err)
	}
	n, _ := Count()
	if _, err := Open(n); !isInvalid(err) {
		t.Errorf("Open(%d): %v", n, err)
	}
}

func TestBind(t *testing.T) {
	d := devices(t, 1)[0]
	done := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := ctxSet(0); err != nil {
			done <- err
			return
		}
		release, err := d.Bind()
		if err != nil {
			done <- err
			return
		}
		cur, err := ctxGet()
		if err == nil && cur != d.ctx {
			err = errors.New("primary context not current after Bind")
		}
		release()
		if cur, _ := ctxGet(); err == nil && cur != 0 {
			err = errors.New("release did not restore the previous (no) context")
		}
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestAllocFree(t *testing.T) {
	d := devices(t, 1)[0]
	p, err := d.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Free(p); err != nil {
		t.Fatal(err)
	}
	if err := d.Free(p); !isInvalid(err) {
		t.Errorf("double free: %v", err)
	}
	if _, err := d.Alloc(0); !isInvalid(err) {
		t.Errorf("Alloc(0): %v", err)
	}
	tn, err := d.AllocTensor(1000, fairgo.BFloat16)
	if err != nil || tn.Bytes != 2000 || tn.Validate() != nil {
		t.Fatalf("AllocTensor = %+v, %v", tn, err)
	}
	w := WrapDevicePtr(tn.Ptr, 1000, fairgo.BFloat16)
	if w != tn {
		t.Errorf("WrapDevicePtr = %+v, want %+v", w, tn)
	}
	// A buffer allocated outside fairgo goes in without a copy and passes CheckRange.
	ext, err := memAlloc(d.ctx, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer memFree(d.ctx, ext)
	wt := WrapDevicePtr(ext, 1024, fairgo.Float32)
	if err := d.CheckRange(wt.Ptr, wt.Bytes); err != nil {
		t.Errorf("CheckRange of a wrapped buffer: %v", err)
	}
}

// TestOwnContext: a Device over a CUDA context of its own (what the
// cross-device tests use for another device on one GPU) is a working device
// distinct from the primary context's: its kernels run and its streams and
// memory are its context's; Close destroys it.
func TestOwnContext(t *testing.T) {
	d := devices(t, 1)[0]
	o, err := openOwnContext(d.Ordinal())
	require.NoError(t, err)
	// Contexts compare by handle (testify's Equal would compare the opaque
	// structs they point to).
	require.True(t, d.ctx != o.ctx, "a context of its own is not the primary one")
	require.NotEqual(t, d.String(), o.String())
	s := stream(t, o)
	owner, err := streamCtx(o.ctx, s.h)
	require.NoError(t, err)
	require.True(t, owner == o.ctx, "the stream's context")
	const n = 4099
	tn, err := o.AllocTensor(n, fairgo.Float32)
	require.NoError(t, err)
	a, err := pointerAttrs(d.ctx, tn.Ptr)
	require.NoError(t, err)
	require.True(t, a.ctx == o.ctx, "the allocation's context, asked from the primary one")
	require.NoError(t, o.FillAsync(tn, 2, 3, 5, s))
	got, err := fairgo.Download[float32](o, tn)
	require.NoError(t, err)
	for i, v := range got {
		require.Equal(t, float32(2+3*(i%5)), v, "element %d", i)
	}
	// The thread's context is left as it was (cuCtxCreate pushes it).
	done := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := ctxSet(d.ctx); err != nil {
			done <- err
			return
		}
		o2, err := openOwnContext(d.Ordinal())
		if err != nil {
			done <- err
			return
		}
		cur, err := ctxGet()
		if err == nil && cur != d.ctx {
			err = errors.New("openOwnContext changed the thread's current context")
		}
		done <- errors.Join(err, o2.Close(), ctxSet(0))
	}()
	require.NoError(t, <-done)
	require.NoError(t, o.Close())
	_, err = o.Alloc(16)
	require.ErrorIs(t, err, fairgo.ErrClosed)
}

func TestCheckRange(t *testing.T) {
	devs := devices(t, 1)
	d := devs[0]
	const size = 1 << 16
	p := alloc(t, d, size)
	for _, c := range []struct {
		name  string
		ptr   uintptr
		bytes int64
		ok    bool
	}{
		{"whole", p, size, true},
		{"inside", p + 100, size - 100, true},
		{"empty", 0, 0, true},
		{"one past the end", p, size + 1, false},
		{"offset past the end", p + 100, size, false},
		{"null", 0, 4, false},
		{"unmapped", 0x10, 4, false},
	} {
		err := d.CheckRange(c.ptr, c.bytes)
		if c.ok && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if !c.ok && !isInvalid(err) {
			t.Errorf("%s: error %v, want one wrapping fairgo.ErrInvalidArgument", c.name, err)
		}
	}
	host := make([]byte, 4096)
	if err := d.CheckRange(uintptr(unsafe.Pointer(&host[0])), 4096); !isInvalid(err) {
		t.Errorf("host pointer: %v", err)
	}
	for _, o := range othersOf(t, d) {
		t.Run(o.name, func(t *testing.T) {
			q := alloc(t, o.d, 4096)
			require.ErrorIs(t, d.CheckRange(q, 4096), fairgo.ErrInvalidArgument, "%v's pointer on %v", o.d, d)
			require.NoError(t, o.d.CheckRange(q, 4096), "%v's pointer on itself", o.d)
			require.ErrorIs(t, o.d.CheckRange(p, size), fairgo.ErrInvalidArgument, "%v's pointer on %v", d, o.d)
			require.NoError(t, d.CheckRange(p, size), "%v's pointer on itself, after the other's check", d)
		})
	}
}

func TestCopies(t *testing.T) {
	d := devices(t, 1)[0]
	s := stream(t, d)
	const n = 4096
	host := make([]uint32, n)
	for i := range host {
		host[i] = uint32(i)
	}
	src := alloc(t, d, n*4)
	dst := alloc(t, d, n*4)
	upload(t, d, src, host)
	if err := d.CopyAsync(dst, src, n*4, s); err != nil {
		t.Fatal(err)
	}
	s.Synchronize()
	got := download[uint32](t, d, dst, n)
	for i := range got {
		if got[i] != host[i] {
			t.Fatalf("copy: element %d = %d", i, got[i])
		}
	}
	// 2D: 8 rows of 10 elements from pitch 64 elements to pitch 16.
	d.Memset(dst, 0, n*4)
	if err := d.Copy2DAsync(dst, 16*4, src, 64*4, 10*4, 8, s); err != nil {
		t.Fatal(err)
	}
	s.Synchronize()
	got = download[uint32](t, d, dst, n)
	for r := 0; r < 8; r++ {
		for c := 0; c < 16; c++ {
			want := uint32(0)
			if c < 10 {
				want = uint32(r*64 + c)
			}
			if got[r*16+c] != want {
				t.Fatalf("2D copy: row %d col %d = %d, want %d", r, c, got[r*16+c], want)
			}
		}
	}
	// Contiguous rows and a single row take the flat path.
	d.Memset(dst, 0, n*4)
	if err := d.Copy2DAsync(dst, 40, src, 40, 40, 3, s); err != nil {
		t.Fatal(err)
	}
	if err := d.Copy2DAsync(dst+1000*4, 1, src+1000*4, 1, 16, 1, s); err != nil {
		t.Fatal(err)
	}
	s.Synchronize()
	got = download[uint32](t, d, dst, n)
	for i := 0; i < 30; i++ {
		if got[i] != uint32(i) {
			t.Fatalf("contiguous 2D: element %d = %d", i, got[i])
		}
	}
	for i := 1000; i < 1004; i++ {
		if got[i] != uint32(i) {
			t.Fatalf("one-row 2D: element %d = %d", i, got[i])
		}
	}
	if err := d.Copy2DAsync(dst, 8, src, 64, 16, 2, s); !isInvalid(err) {
		t.Errorf("pitch shorter than width: %v", err)
	}
}

func TestEventNeverRecorded(t *testing.T) {
	d := devices(t, 1)[0]
	e := event(t, d)
	if done, err := e.Query(); !done || err != nil {
		t.Fatalf("Query of an unrecorded event = %v, %v", done, err)
	}
	if err := e.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestEventOrdering holds stream A back with a delay kernel and checks that
// B, waiting on A's event, sees A's result; that Query and Wait see the
// pending work; and that re-recording the event does not disturb a wait
// already enqueued.
func TestEventOrdering(t *testing.T) {
	d := devices(t, 1)[0]
	a, b, c := stream(t, d), stream(t, d), stream(t, d)
	e, eb := event(t, d), event(t, d)
	const n = 1 << 16
	x := fairgo.Tensor{Ptr: alloc(t, d, n*4), Bytes: n * 4, Count: n, DType: fairgo.Float32}
	y := alloc(t, d, n*4)
	if err := d.Memset(x.Ptr, 0, n*4); err != nil {
		t.Fatal(err)
	}
	if err := d.DelayAsync(300*time.Millisecond, a); err != nil {
		t.Fatal(err)
	}
	if err := d.FillAsync(x, 7, 0, 1, a); err != nil {
		t.Fatal(err)
	}
	if err := e.Record(a); err != nil {
		t.Fatal(err)
	}
	if done, err := e.Query(); done || err != nil {
		t.Fatalf("Query right after recording behind a delay = %v, %v; want false, nil", done, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	err := e.Wait(ctx)
	cancel()
	if err != context.DeadlineExceeded {
		t.Fatalf("Wait with a short deadline = %v, want context.DeadlineExceeded unchanged", err)
	}
	if err := b.WaitEvent(e); err != nil {
		t.Fatal(err)
	}
	// Re-record e on an idle stream: b's wait must still be on A's work.
	if err := e.Record(c); err != nil {
		t.Fatal(err)
	}
	if err := d.CopyAsync(y, x.Ptr, n*4, b); err != nil {
		t.Fatal(err)
	}
	if err := eb.Record(b); err != nil {
		t.Fatal(err)
	}
	// Query from another goroutine (any goroutine may use events).
	var wg sync.WaitGroup
	wg.Add(1)
	var gerr error
	go func() {
		defer wg.Done()
		gerr = eb.Wait(context.Background())
	}()
	wg.Wait()
	if gerr != nil {
		t.Fatal(gerr)
	}
	got := download[float32](t, d, y, n)
	for i, v := range got {
		if v != 7 {
			t.Fatalf("element %d = %v: B did not wait for A", i, v)
		}
	}
	if err := a.WaitEvent(fakeEvent{}); !isInvalid(err) {
		t.Errorf("WaitEvent with a foreign event: %v", err)
	}
	if err := e.Record(fakeStream{}); !isInvalid(err) {
		t.Errorf("Record on a foreign stream: %v", err)
	}
}

func TestTimeRegion(t *testing.T) {
	d := devices(t, 1)[0]
	s := stream(t, d)
	el, err := d.TimeRegion(s, func() error { return d.DelayAsync(50*time.Millisecond, s) })
	if err != nil {
		t.Fatal(err)
	}
	if el < 45*time.Millisecond || el > 5*time.Second {
		t.Errorf("a 50 ms delay measured %v", el)
	}
	e := event(t, d)
	if _, err := Elapsed(e, e); !isInvalid(err) {
		t.Errorf("Elapsed on events without timing: %v", err)
	}
	// The same through backend.EventTimer, as the calibration times.
	var timer backend.EventTimer = d
	start, err := timer.NewTimingEvent()
	require.NoError(t, err)
	defer streams.Release(start)
	end, err := timer.NewTimingEvent()
	require.NoError(t, err)
	defer streams.Release(end)
	require.NoError(t, start.Record(s))
	require.NoError(t, d.DelayAsync(50*time.Millisecond, s))
	require.NoError(t, end.Record(s))
	require.NoError(t, end.Wait(context.Background()))
	time.Sleep(20 * time.Millisecond) // looked at late: not counted
	el, err = timer.Elapsed(start, end)
	require.NoError(t, err)
	require.True(t, el >= 45*time.Millisecond && el < 65*time.Millisecond, "a 50 ms delay measured %v", el)
	_, err = timer.Elapsed(start, e)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument, "an event without timing")
}

// TestCrossDevice: an event of one device recorded on another's stream
// and a copy enqueued on another device's stream are refused; a stream
// waiting on another device's event is allowed, as in CUDA, and waits. The
// other device is GPU 0 over a context of its own, and GPU 1 where there
// is one.
func TestCrossDevice(t *testing.T) {
	d := devices(t, 1)[0]
	for _, o := range othersOf(t, d) {
		t.Run(o.name, func(t *testing.T) {
			s1 := stream(t, o.d)
			e0 := event(t, d)
			require.ErrorIs(t, e0.Record(s1), fairgo.ErrInvalidArgument, "recording %v's event on %v's stream", d, o.d)
			p := alloc(t, d, 64)
			require.ErrorIs(
				t,
				d.CopyAsync(p, p+32, 32, s1),
				fairgo.ErrInvalidArgument,
				"%v's copy on %v's stream",
				d,
				o.d,
			)

			s0 := stream(t, d)
			require.NoError(t, d.DelayAsync(300*time.Millisecond, s0))
			require.NoError(t, e0.Record(s0))
			require.NoError(t, s1.WaitEvent(e0), "%v's stream waiting on %v's event", o.d, d)
			e1 := event(t, o.d)
			require.NoError(t, e1.Record(s1))
			done, err := e1.Query()
			require.NoError(t, err)
			require.False(t, done, "%v's stream did not wait for %v's delayed event", o.d, d)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			require.NoError(t, e1.Wait(ctx))
			done, err = e0.Query()
			require.NoError(t, err)
			require.True(t, done, "the waiting stream's work completed before the event it waited on")
		})
	}
}

func TestWrapStream(t *testing.T) {
	d := devices(t, 1)[0]
	s := stream(t, d)
	w := d.WrapStream(s.Handle())
	if w.Handle() != s.Handle() {
		t.Fatal("handle differs")
	}
	e := event(t, d)
	if err := e.Record(w); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil { // does not destroy s
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	legacy := d.WrapStream(0)
	if err := legacy.Synchronize(); err != nil {
		t.Errorf("legacy default stream: %v", err)
	}
}

func TestClose(t *testing.T) {
	devices(t, 1) // skip without a GPU
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	s := stream(t, d)
	e := event(t, d)
	if _, err := d.Alloc(1 << 20); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil { // closed before the device: not destroyed twice
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := d.Alloc(16); !errors.Is(err, fairgo.ErrClosed) {
		t.Errorf("Alloc after Close: %v", err)
	}
	if err := s.Synchronize(); !errors.Is(err, fairgo.ErrClosed) {
		t.Errorf("stream after Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("stream Close after device Close: %v", err)
	}
	if _, err := d.CreateStream(); !errors.Is(err, fairgo.ErrClosed) {
		t.Errorf("CreateStream after Close: %v", err)
	}
}

// Memset sets bytes of device memory to b and waits for the device to be
// idle (a helper for tests and examples).
func (d *Device) Memset(ptr uintptr, b byte, bytes int64) error {
	if bytes <= 0 {
		return nil
	}
	if err := d.alive(); err != nil {
		return err
	}
	if err := memsetSync(d.ctx, ptr, b, bytes); err != nil {
		return fmt.Errorf("cuda: memset on %v: %w", d, err)
	}
	return nil
}
