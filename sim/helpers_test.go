package sim

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/internal/elem"
)

func newCluster(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	c, err := NewCluster(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

func mkStream(t tb, d *Device) *Stream {
	helper(t)
	s, err := d.NewStream()
	require.NoError(t, err)
	return s.(*Stream)
}

func newEvent(t tb, d *Device) *Event {
	helper(t)
	e, err := d.NewEvent()
	require.NoError(t, err)
	return e.(*Event)
}

// tensorOf allocates a tensor on d holding vs.
func tensorOf(t tb, d *Device, dt fairgo.DType, vs ...float64) fairgo.Tensor {
	helper(t)
	b := make([]byte, len(vs)*dt.Size())
	for i, v := range vs {
		elem.Set(dt, b, i, v)
	}
	return tensorBytes(t, d, dt, b)
}

func tensorBytes(t tb, d *Device, dt fairgo.DType, b []byte) fairgo.Tensor {
	helper(t)
	tn, err := d.AllocTensor(int64(len(b)/dt.Size()), dt)
	require.NoError(t, err)
	require.NoError(t, d.Upload(tn.Ptr, b))
	return tn
}

func download(t tb, d *Device, tn fairgo.Tensor) []byte {
	helper(t)
	b := make([]byte, tn.ByteLen())
	require.NoError(t, d.Download(b, tn.Ptr))
	return b
}

func values(t tb, d *Device, tn fairgo.Tensor) []float64 {
	helper(t)
	b := download(t, d, tn)
	out := make([]float64, tn.Count)
	for i := range out {
		out[i] = elem.Get(tn.DType, b, i)
	}
	return out
}

func syncStream(t tb, s *Stream) error {
	helper(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := s.Synchronize(ctx)
	require.NoError(t, ctx.Err(), "stream did not finish")
	return err
}

// settleGoroutines waits until the goroutine count drops to at most base.
// quietGoroutines is the goroutine count once it has held still for 20 ms
// (at most a second): the base a leak check compares with, without the
// goroutines of earlier tests that are still ending.
func quietGoroutines() int {
	n := runtime.NumGoroutine()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			return n
		}
		n = m
	}
	return n
}

func settleGoroutines(t testing.TB, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines leaked: %d > %d\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// requireSameErr checks that got is the very error value want (sticky
// errors are propagated, not re-created).
func requireSameErr(t tb, want, got error, msgAndArgs ...any) {
	helper(t)
	require.Error(t, got)
	require.Truef(t, want == got, "got %v, want the same value as %v %v", got, want, msgAndArgs)
}

// tb is what the helpers need: *testing.T and *rapid.T both qualify.
type tb = require.TestingT

func helper(t tb) {
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
}
