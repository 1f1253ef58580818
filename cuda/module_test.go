package cuda

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
)

// TestModuleLaunch loads a module and launches one of its kernels with
// typed arguments: the fill kernel of the package's own PTX, t[i] = offset
// + scale·(i mod modulus).
func TestModuleLaunch(t *testing.T) {
	d := devices(t, 1)[0]
	s := stream(t, d)
	m, err := d.LoadModule([]byte(reducePTX))
	require.NoError(t, err)
	f, err := m.Function("fg_fill_float32")
	require.NoError(t, err)
	require.Equal(t, "fg_fill_float32", f.Name())
	const n = 1000
	tn, err := d.AllocTensor(n, fairgo.Float32)
	require.NoError(t, err)
	require.NoError(t, f.Launch(Dim3{X: 4}, Dim3{X: 256}, 0, s, tn, int64(n), 1.5, 2.0, int64(7)))
	got, err := fairgo.Download[float32](d, tn)
	require.NoError(t, err)
	for i, v := range got {
		require.Equal(t, float32(1.5+2*float64(i%7)), v, "element %d", i)
	}

	var ce *Error
	_, err = m.Function("fg_no_such_kernel")
	require.ErrorAs(t, err, &ce)
	_, _, err = m.Global("fg_no_such_global")
	require.ErrorAs(t, err, &ce)
	require.ErrorIs(
		t,
		f.Launch(Dim3{X: 1}, Dim3{X: 1}, 0, s, tn, n, 1.5, 2.0, int64(7)),
		fairgo.ErrInvalidArgument,
		"a Go int",
	)
	require.ErrorIs(t, f.Launch(Dim3{X: -1}, Dim3{X: 1}, 0, s), fairgo.ErrInvalidArgument)
	// A launch on another device's stream: GPU 0 over a context of its own
	// (the module is not loaded there), and GPU 1 where there is one.
	for _, o := range othersOf(t, d) {
		require.ErrorIs(
			t,
			f.Launch(Dim3{X: 1}, Dim3{X: 1}, 0, stream(t, o.d), tn, int64(n), 1.5, 2.0, int64(7)),
			fairgo.ErrInvalidArgument,
			o.name,
		)
	}
}

// TestModuleErrors: an empty image, PTX that does not compile (the JIT's
// log in the error), and calls after Close.
func TestModuleErrors(t *testing.T) {
	d := devices(t, 1)[0]
	s := stream(t, d)
	_, err := d.LoadModule(nil)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	_, err = d.LoadModule(
		[]byte(".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry broken( { not ptx }\n"),
	)
	require.ErrorIs(t, err, ErrCUDA)
	t.Logf("bad PTX: %v", err)

	m, err := d.LoadModule([]byte(reducePTX))
	require.NoError(t, err)
	f, err := m.Function("fg_delay")
	require.NoError(t, err)
	require.NoError(t, f.Launch(Dim3{}, Dim3{}, 0, s, uint64(time.Millisecond)))
	require.NoError(t, m.Close(), "waits for the kernel, then unloads")
	require.NoError(t, m.Close(), "twice")
	require.ErrorIs(t, f.Launch(Dim3{}, Dim3{}, 0, s, uint64(1)), fairgo.ErrClosed)
	_, err = m.Function("fg_delay")
	require.ErrorIs(t, err, fairgo.ErrClosed)

	// A module still loaded when the device closes is unloaded by it.
	d2, err := Open(0)
	require.NoError(t, err)
	m2, err := d2.LoadModule([]byte(reducePTX))
	require.NoError(t, err)
	require.NoError(t, d2.Close())
	require.NoError(t, m2.Close())
	_, err = m2.Function("fg_delay")
	require.ErrorIs(t, err, fairgo.ErrClosed)
}

// TestUploadAsyncDownloadAfter: copies from and to Go memory ordered on a
// stream: the upload's source may be reused at once, and the download
// waits for the stream's earlier work (a delay, then a fill).
func TestUploadAsyncDownloadAfter(t *testing.T) {
	d := devices(t, 1)[0]
	s := stream(t, d)
	const n = 4096
	p := alloc(t, d, n)
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i * 7)
	}
	require.NoError(t, d.UploadAsync(p, src, s))
	want := append([]byte(nil), src...)
	clear(src) // reusable once UploadAsync returned
	got := make([]byte, n)
	require.NoError(t, d.DownloadAfter(got, p, s))
	require.Equal(t, want, got)

	tn := fairgo.Tensor{Ptr: p, Bytes: n, Count: n / 4, DType: fairgo.Float32}
	require.NoError(t, d.DelayAsync(20*time.Millisecond, s))
	require.NoError(t, d.FillAsync(tn, 3, 0, 0, s))
	require.NoError(t, d.DownloadAfter(got, p, s))
	for i := 0; i < n; i += 4 {
		require.Equal(t, float32(3), math.Float32frombits(binary.LittleEndian.Uint32(got[i:])), "element %d", i/4)
	}

	pinned, err := d.AllocHost(16)
	require.NoError(t, err)
	defer d.FreeHost(pinned)
	for _, err := range []error{
		d.UploadAsync(0, []byte{1}, s),
		d.UploadAsync(p, pinned, s),
		d.DownloadAfter(got, 0, s),
		d.DownloadAfter(pinned, p, s),
	} {
		require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	}
}

// TestTypedCopies: fairgo.Upload and Download on a GPU.
func TestTypedCopies(t *testing.T) {
	d := devices(t, 1)[0]
	vals := []int64{math.MinInt64, -1, 0, 1, math.MaxInt64}
	tn, err := fairgo.Upload(d, vals)
	require.NoError(t, err)
	defer d.Free(tn.Ptr)
	got, err := fairgo.Download[int64](d, tn)
	require.NoError(t, err)
	require.Equal(t, vals, got)
}
