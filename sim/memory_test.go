package sim

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/internal/elem"
)

func TestAddressSpace(t *testing.T) {
	c := newCluster(t, Config{Machines: 1, Devices: 2})
	d0, d1 := c.Device(0), c.Device(1)
	p, err := d0.Alloc(100)
	require.NoError(t, err)
	q, err := d0.Alloc(0)
	require.NoError(t, err)
	r, err := d1.Alloc(10)
	require.NoError(t, err)
	require.Equal(t, uintptr(1)<<40, p, "device 0's space starts at 1<<40")
	require.Equal(t, uintptr(2)<<40, r, "device 1's space starts at 2<<40")
	require.Zero(t, q%256)
	require.Greater(t, q, p+256, "a gap separates allocations")
	require.Equal(t, int64(512), d0.MemoryInUse())

	require.NoError(t, d0.CheckRange(p, 100))
	require.NoError(t, d0.CheckRange(p+99, 1))
	require.NoError(t, d0.CheckRange(p+100, 0))
	require.NoError(t, d0.CheckRange(0, 0))
	for _, tc := range []struct {
		name  string
		ptr   uintptr
		bytes int64
		msg   string
	}{
		{"past the end", p, 101, "past the end"},
		{"in the gap", p + 200, 1, "not inside any allocation of sim device 0"},
		{"below the space", 0x1000, 4, "not inside any allocation"},
		{"other device", r, 4, "belongs to sim device 1 (machine 0, local 1)"},
		{"negative", p, -1, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := d0.CheckRange(tc.ptr, tc.bytes)
			require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
			require.ErrorContains(t, err, tc.msg)
		})
	}
	require.ErrorContains(t, d0.CheckRange(p, 101), "0x10000000000")

	require.ErrorIs(t, d0.Free(p+8), fairgo.ErrInvalidArgument)
	require.ErrorIs(t, d0.Free(r), fairgo.ErrInvalidArgument)
	require.NoError(t, d0.Free(p))
	require.ErrorIs(t, d0.CheckRange(p, 1), fairgo.ErrInvalidArgument)
	require.NoError(t, d0.Free(0))
	require.ErrorIs(t, d0.Free(p), fairgo.ErrInvalidArgument, "double free")
	_, err = d0.Alloc(-1)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
}

func TestMemoryLimit(t *testing.T) {
	c := newCluster(t, Config{Machines: 1, Devices: 1, MemoryLimit: 1024})
	d := c.Device(0)
	p, err := d.Alloc(1000)
	require.NoError(t, err)
	_, err = d.Alloc(1)
	require.ErrorIs(t, err, ErrOutOfMemory)
	require.NoError(t, d.Free(p))
	_, err = d.Alloc(1024)
	require.NoError(t, err)
}

func TestUploadDownload(t *testing.T) {
	c := newCluster(t, Config{Machines: 1, Devices: 2})
	d := c.Device(0)
	tn, err := d.AllocTensor(5, fairgo.Int32)
	require.NoError(t, err)
	require.Equal(t, fairgo.Tensor{Ptr: tn.Ptr, Bytes: 20, Count: 5, DType: fairgo.Int32}, tn)
	require.Equal(t, make([]byte, 20), download(t, d, tn), "fresh memory reads as zeros")
	in := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	require.NoError(t, d.Upload(tn.Ptr+4, in))
	out := make([]byte, 8)
	require.NoError(t, d.Download(out, tn.Ptr+4))
	require.Equal(t, in, out)
	require.ErrorIs(t, d.Upload(tn.Ptr+16, in), fairgo.ErrInvalidArgument)
	require.ErrorIs(t, d.Download(make([]byte, 21), tn.Ptr), fairgo.ErrInvalidArgument)
	require.ErrorIs(t, c.Device(1).Download(out, tn.Ptr), fairgo.ErrInvalidArgument)
	_, err = d.AllocTensor(-1, fairgo.Float32)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	_, err = d.AllocTensor(1, fairgo.DType(0))
	require.ErrorIs(t, err, fairgo.ErrUnknownDType)
}

func TestCopies(t *testing.T) {
	c := newCluster(t, Config{Machines: 1, Devices: 2, Jitter: 100_000})
	d := c.Device(0)
	s := mkStream(t, d)
	src := tensorOf(t, d, fairgo.Uint8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
	dst := tensorOf(t, d, fairgo.Uint8, make([]float64, 12)...)
	require.NoError(t, d.CopyAsync(dst.Ptr, src.Ptr+2, 3, s))
	require.NoError(t, syncStream(t, s))
	require.Equal(t, []float64{3, 4, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0}, values(t, d, dst))

	// 3 rows of 2 bytes, source pitch 4, destination pitch 3.
	require.NoError(t, d.Copy2DAsync(dst.Ptr+3, 3, src.Ptr, 4, 2, 3, s))
	require.NoError(t, syncStream(t, s))
	require.Equal(t, []float64{3, 4, 5, 1, 2, 0, 5, 6, 0, 9, 10, 0}, values(t, d, dst))

	require.ErrorIs(t, d.Copy2DAsync(dst.Ptr, 1, src.Ptr, 4, 2, 3, s), fairgo.ErrInvalidArgument)
	require.ErrorIs(t, d.CopyAsync(dst.Ptr, src.Ptr, -1, s), fairgo.ErrInvalidArgument)
	require.ErrorIs(t, d.CopyAsync(dst.Ptr, src.Ptr, 1, mkStream(t, c.Device(1))), fairgo.ErrInvalidArgument)
	require.NoError(t, d.CopyAsync(0, 0, 0, s), "an empty copy is a no-op")

	// The last row runs past the source: illegal address, nothing written.
	before := values(t, d, dst)
	require.NoError(t, d.Copy2DAsync(dst.Ptr, 3, src.Ptr, 5, 3, 3, s))
	err := syncStream(t, s)
	var ill *IllegalAddressError
	require.ErrorAs(t, err, &ill)
	require.Equal(t, "2D copy", ill.Op)
	require.Equal(t, before, values(t, d, dst))

	// A copy from another device's memory is an illegal address too.
	s2 := mkStream(t, d)
	far := tensorOf(t, c.Device(1), fairgo.Uint8, 1)
	require.NoError(t, d.CopyAsync(dst.Ptr, far.Ptr, 1, s2))
	require.ErrorContains(t, syncStream(t, s2), "belongs to sim device 1")

	// Use after free.
	s3 := mkStream(t, d)
	tmp := tensorOf(t, d, fairgo.Uint8, 1)
	require.NoError(t, d.Free(tmp.Ptr))
	require.NoError(t, d.CopyAsync(dst.Ptr, tmp.Ptr, 1, s3))
	require.ErrorIs(t, syncStream(t, s3), ErrIllegalAddress)
}

func TestReduceAsync(t *testing.T) {
	c := newCluster(t, Config{Machines: 1, Devices: 1})
	d := c.Device(0)
	s := mkStream(t, d)
	for _, dt := range fairgo.DTypes {
		for _, op := range fairgo.Ops {
			// 3 shards of 4 elements with stride 5 (one element of gap).
			const n, stride, count = 3, 5, 4
			src := make([]byte, (n*stride)*dt.Size())
			shards := make([][]byte, n)
			for k := range n {
				for i := range count {
					elem.Set(dt, src, k*stride+i, float64((k+1)*(i+2)%7)-1)
				}
				shards[k] = src[k*stride*dt.Size() : (k*stride+count)*dt.Size()]
			}
			want := make([]byte, count*dt.Size())
			require.NoError(t, elem.ReduceShards(dt, op, want, shards, 3))
			st := tensorBytes(t, d, dt, src)
			dst, err := d.AllocTensor(count, dt)
			require.NoError(t, err)
			require.NoError(t, d.ReduceAsync(dst.Ptr, st.Ptr, n, stride, count, dt, op, 3, s))
			require.NoError(t, syncStream(t, s))
			require.Equal(t, want, download(t, d, dst), "%v %v", dt, op)
		}
	}
	buf := tensorOf(t, d, fairgo.Float32, make([]float64, 16)...)
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"overlap", d.ReduceAsync(buf.Ptr+8, buf.Ptr, 2, 4, 4, fairgo.Float32, fairgo.Sum, 1, s)},
		{"no sources", d.ReduceAsync(buf.Ptr+32, buf.Ptr, 0, 4, 4, fairgo.Float32, fairgo.Sum, 1, s)},
		{"bad dtype", d.ReduceAsync(buf.Ptr+32, buf.Ptr, 1, 4, 4, fairgo.DType(0), fairgo.Sum, 1, s)},
		{"bad op", d.ReduceAsync(buf.Ptr+32, buf.Ptr, 1, 4, 4, fairgo.Float32, fairgo.Op(0), 1, s)},
		{"avg divisor", d.ReduceAsync(buf.Ptr+32, buf.Ptr, 1, 4, 4, fairgo.Float32, fairgo.Avg, 0, s)},
	} {
		require.ErrorIs(t, tc.err, fairgo.ErrInvalidArgument, tc.name)
	}
	// Shards running past the allocation: illegal address.
	require.NoError(t, d.ReduceAsync(buf.Ptr, buf.Ptr+16, 2, 12, 4, fairgo.Float32, fairgo.Sum, 1, s))
	err := syncStream(t, s)
	require.ErrorIs(t, err, ErrIllegalAddress)
	require.ErrorContains(t, err, "reduce")
	require.NoError(t, d.Group(func() error { return d.Group(func() error { return nil }) }))
	require.Error(t, d.Group(func() error { return errors.New("inner") }))
	require.ErrorIs(t, d.Synchronize(context.Background()), ErrIllegalAddress, "the device reports its failed stream")
}

// MemoryInUse is the number of bytes currently allocated (rounded up to
// the allocation alignment).
func (d *Device) MemoryInUse() int64 { return d.mem.inUse() }

// A reduce whose destination or sources are not at a multiple of the
// element size fails its stream as a GPU's kernel would fault.
func TestReduceAsyncMisaligned(t *testing.T) {
	for _, tc := range []struct {
		name     string
		dst, src uintptr
	}{
		{"destination", 2, 32},
		{"source", 96, 6},
	} {
		c := newCluster(t, Config{Machines: 1, Devices: 1})
		d := c.Device(0)
		s := mkStream(t, d)
		buf := tensorOf(t, d, fairgo.Float32, make([]float64, 32)...)
		require.NoError(t, d.ReduceAsync(buf.Ptr+tc.dst, buf.Ptr+tc.src, 2, 8, 4, fairgo.Float32, fairgo.Sum, 1, s))
		err := syncStream(t, s)
		require.ErrorIs(t, err, ErrIllegalAddress, tc.name)
		require.ErrorContains(t, err, "misaligned for float32 elements", tc.name)
	}
}
