package cuda

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/nccl"
)

// needNCCL skips the test when libnccl cannot be loaded.
func needNCCL(t testing.TB) {
	t.Helper()
	lib, err := nccl.Load()
	if err != nil {
		t.Skipf("NCCL not available: %v", err)
	}
	t.Logf("using %v", lib)
	lib.Close()
}

// perRank runs fn for every rank on a goroutine of its own, bound to the
// rank's device, as hier's engine does, and fails the test on any error.
func perRank(t *testing.T, ranks []backend.Rank, ss []*Stream, fn func(r int, rk backend.Rank, d *Device, s *Stream) error) {
	t.Helper()
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for r, rk := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := rk.Device.(*Device)
			release, err := d.Bind()
			if err != nil {
				errs[r] = err
				return
			}
			defer release()
			if err := fn(r, rk, d, ss[r]); err != nil {
				errs[r] = err
				return
			}
			errs[r] = ss[r].Synchronize()
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func tensor(t *testing.T, d *Device, count int64, dt fairgo.DType) fairgo.Tensor {
	t.Helper()
	tn, err := d.AllocTensor(count, dt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Free(tn.Ptr) })
	return tn
}

func checkComm(t *testing.T, name string, c backend.Comm, size, rank int) {
	t.Helper()
	if size == 1 {
		if c != nil {
			t.Errorf("%s: a one-rank communicator should be nil, got %v", name, c)
		}
		return
	}
	if c == nil {
		t.Fatalf("%s: missing", name)
	}
	if c.Size() != size || c.Rank() != rank || c.Name() == "" {
		t.Errorf("%s: %q rank %d of %d, want rank %d of %d", name, c.Name(), c.Rank(), c.Size(), rank, size)
	}
	if err := c.Err(); err != nil {
		t.Errorf("%s: Err = %v", name, err)
	}
}

// worldRank is a local rank's place in the world communicator.
func worldRank(rk backend.Rank) int { return rk.Comms.World.Rank() }

// namedComm picks one communicator of a rank.
type namedComm struct {
	name string
	get  func(backend.Rank) backend.Comm
}

// gridComms are the communicators of an M×D grid that have two ranks or
// more, and the world communicator (of one rank on 1×1), in the same order
// on every rank.
func gridComms(m, d int) []namedComm {
	out := []namedComm{{"world", func(rk backend.Rank) backend.Comm { return rk.Comms.World }}}
	if d >= 2 {
		out = append(out,
			namedComm{"intra-rs", func(rk backend.Rank) backend.Comm { return rk.Comms.IntraReduceScatter }},
			namedComm{"intra-ag", func(rk backend.Rank) backend.Comm { return rk.Comms.IntraAllGather }})
	}
	if m >= 2 {
		out = append(out,
			namedComm{"rail-collect", func(rk backend.Rank) backend.Comm { return rk.Comms.RailCollect }},
			namedComm{"rail-diffuse", func(rk backend.Rank) backend.Comm { return rk.Comms.RailDiffuse }})
	}
	return out
}

// TestLocalRanks checks every rank's communicators against its grid and
// runs every backend.Comm operation on each communicator of two ranks or more
// and on the world communicator, then a group of two communicators' calls.
// In one process: the 1×2 and 2×1 grids over two GPUs (NewLocalRanks), or
// 1×1 on one GPU; under a launcher: the launcher's grid, one rank per
// process (fairrun's M×D on one GPU).
func TestLocalRanks(t *testing.T) {
	for _, g := range commGrids(t) {
		t.Run(fmt.Sprintf("%dx%d", g[0], g[1]), func(t *testing.T) {
			M, D := g[0], g[1]
			W := M * D
			ranks := commRanks(t, M, D)
			devs := rankDevices(ranks)
			for r, rk := range ranks {
				gr := rk.Grid
				require.Equal(t, [2]int{M, D}, [2]int{gr.Machines, gr.Devices}, "rank %d's grid", r)
				require.NotNil(t, rk.Comms.World, "rank %d: world communicator", r)
				wr := worldRank(rk)
				if launched() {
					require.Equal(t, job.Launch.Rank, wr, "the world rank is the launcher's rank")
				} else {
					require.Equal(t, r, gr.Rank(), "rank %d's place in the grid", r)
					require.Equal(t, r, wr, "rank %d's world rank", r)
				}
				if W == 1 { // the world communicator is made even of one rank; the others are nil then
					require.Equal(t, [2]int{1, 0}, [2]int{rk.Comms.World.Size(), wr}, "the one-rank world communicator")
				} else {
					checkComm(t, "world", rk.Comms.World, W, wr)
				}
				checkComm(t, "intra-rs", rk.Comms.IntraReduceScatter, D, gr.Local)
				checkComm(t, "intra-ag", rk.Comms.IntraAllGather, D, gr.Local)
				checkComm(t, "rail-collect", rk.Comms.RailCollect, M, gr.Machine)
				checkComm(t, "rail-diffuse", rk.Comms.RailDiffuse, M, gr.Machine)
			}
			ss := rankStreams(t, ranks)
			for _, c := range gridComms(M, D) {
				t.Run(c.name, func(t *testing.T) { testCollectives(t, ranks, ss, c.get, collectiveCount()) })
			}
			t.Run("group", func(t *testing.T) {
				// One group: a product all-reduce on the world communicator and
				// an in-place all-gather on the last communicator of gridComms
				// (intra-ag, rail-diffuse or, on 1×1, the world).
				cs := gridComms(M, D)
				ag := cs[len(cs)-1].get
				k := ag(ranks[0]).Size()
				const n = 1000
				a := make([]fairgo.Tensor, len(ranks))
				b := make([]fairgo.Tensor, len(ranks))
				for i, d := range devs {
					a[i], b[i] = tensor(t, d, n, fairgo.Float32), tensor(t, d, int64(k)*n, fairgo.Int64)
				}
				perRank(t, ranks, ss, func(r int, rk backend.Rank, d *Device, s *Stream) error {
					q := int64(ag(rk).Rank())
					if err := d.FillAsync(a[r], float64(worldRank(rk)+1), 0, 1, s); err != nil {
						return err
					}
					if err := d.FillAsync(b[r].Slice(q*n, n), float64(-100*(q+1)), 1, 0, s); err != nil {
						return err
					}
					return d.Group(func() error {
						if err := rk.Comms.World.AllReduce(a[r].Ptr, a[r].Ptr, n, fairgo.Float32, fairgo.Prod, s); err != nil {
							return err
						}
						return ag(rk).AllGather(b[r].Slice(q*n, n).Ptr, b[r].Ptr, n, fairgo.Int64, s)
					})
				})
				fact := float32(1)
				for w := 2; w <= W; w++ {
					fact *= float32(w)
				}
				for r, d := range devs {
					for i, v := range download[float32](t, d, a[r].Ptr, n) {
						require.Equal(t, fact, v, "rank %d: grouped all-reduce (product) element %d", r, i)
					}
					got := download[int64](t, d, b[r].Ptr, k*n)
					for q := 0; q < k; q++ {
						for i := 0; i < n; i++ {
							require.Equal(
								t,
								int64(-100*(q+1)+i),
								got[q*n+i],
								"rank %d: grouped all-gather block %d element %d",
								r,
								q,
								i,
							)
						}
					}
				}
			})
		})
	}
}

// a2aCount is how many elements rank p of an all-to-all-v sends to rank k
// (0 to 8; some pairs send nothing).
func a2aCount(p, k int) int64 { return int64((5 + 3*p + 4*k) % 9) }

// testCollectives runs every backend.Comm operation on get's communicator of
// the local ranks (n ranks in all, in this process or not) and checks each
// local rank's results, which are functions of the ranks' places alone.
func testCollectives(t *testing.T, ranks []backend.Rank, ss []*Stream, get func(backend.Rank) backend.Comm, count int) {
	devs := rankDevices(ranks)
	n := get(ranks[0]).Size()
	pos := func(r int) int { return get(ranks[r]).Rank() }
	root := n - 1
	mk := func(c int64, dt fairgo.DType) []fairgo.Tensor {
		out := make([]fairgo.Tensor, len(devs))
		for i, d := range devs {
			out[i] = tensor(t, d, c, dt)
		}
		return out
	}
	cnt, nn := int64(count), int64(n)
	sum, avg, rsSend, rsRecv := mk(cnt, fairgo.Float32), mk(cnt, fairgo.BFloat16), mk(nn*cnt, fairgo.Float32),
		mk(cnt, fairgo.Float32)
	agSend, agRecv, bc, mx := mk(cnt, fairgo.Int32), mk(nn*cnt, fairgo.Int32), mk(cnt, fairgo.Float64),
		mk(cnt, fairgo.Int64)
	// all-to-all-v: every send from displacement 0, each receive into a
	// 16-element slot of its own.
	a2aSend, a2aRecv := mk(16, fairgo.Uint8), mk(16*nn, fairgo.Uint8)

	perRank(t, ranks, ss, func(r int, rk backend.Rank, d *Device, s *Stream) error {
		c, p := get(rk), pos(r)
		send, recv := make([]int64, n), make([]int64, n)
		zeros, slots := make([]int64, n), make([]int64, n)
		for k := range n {
			send[k], recv[k], slots[k] = a2aCount(p, k), a2aCount(k, p), int64(16*k)
		}
		steps := []func() error{
			func() error { return d.FillAsync(sum[r], float64(p+1), 1, 7, s) },
			func() error { return c.AllReduce(sum[r].Ptr, sum[r].Ptr, cnt, fairgo.Float32, fairgo.Sum, s) },
			func() error { return d.FillAsync(avg[r], float64(2*(p+1)), 0, 1, s) },
			func() error { return c.AllReduce(avg[r].Ptr, avg[r].Ptr, cnt, fairgo.BFloat16, fairgo.Avg, s) },
			func() error { return d.FillAsync(rsSend[r], float64(p+1), 1, 5, s) },
			func() error {
				return c.ReduceScatter(rsSend[r].Ptr, rsRecv[r].Ptr, cnt, fairgo.Float32, fairgo.Sum, s)
			},
			func() error { return d.FillAsync(agSend[r], float64(10*(p+1)), 1, 3, s) },
			func() error { return c.AllGather(agSend[r].Ptr, agRecv[r].Ptr, cnt, fairgo.Int32, s) },
			func() error { return d.FillAsync(bc[r], float64(42*p), 0, 1, s) },
			func() error { return c.Broadcast(bc[r].Ptr, bc[r].Ptr, cnt, fairgo.Float64, root, s) },
			func() error { return d.FillAsync(mx[r], float64(-1000*p), 3, 11, s) },
			func() error { return c.AllReduce(mx[r].Ptr, mx[r].Ptr, cnt, fairgo.Int64, fairgo.Max, s) },
			func() error { return d.FillAsync(a2aSend[r], float64(16*p), 1, 0, s) },
			func() error { return d.FillAsync(a2aRecv[r], 255, 0, 1, s) },
			func() error {
				return c.AllToAllv(a2aSend[r].Ptr, send, zeros, a2aRecv[r].Ptr, recv, slots, fairgo.Uint8, s)
			},
		}
		for i, f := range steps {
			if err := f(); err != nil {
				return fmt.Errorf("step %d on %s: %w", i, c.Name(), err)
			}
		}
		return nil
	})

	tri := n * (n + 1) / 2 // Σ (p+1) over the n ranks
	for r, d := range devs {
		p := pos(r)
		for i, v := range download[float32](t, d, sum[r].Ptr, count) {
			if want := float32(tri + n*(i%7)); v != want {
				t.Fatalf("rank %d all-reduce sum: element %d = %v, want %v", r, i, v, want)
			}
		}
		// The mean of 2(p+1) is n+1; NCCL may scale by 1/n in bfloat16 before
		// summing, so allow bfloat16 rounding (exact where n is a power of two).
		for i, v := range download[uint16](t, d, avg[r].Ptr, count) {
			if got, want := float64(bf16ToF32(v)), float64(n+1); math.Abs(got-want) > want/64 {
				t.Fatalf("rank %d all-reduce avg bf16: element %d = %v, want %v", r, i, got, want)
			}
		}
		for i, v := range download[float32](t, d, rsRecv[r].Ptr, count) {
			if want := float32(tri + n*((p*count+i)%5)); v != want {
				t.Fatalf("rank %d reduce-scatter: element %d = %v, want %v", r, i, v, want)
			}
		}
		ag := download[int32](t, d, agRecv[r].Ptr, n*count)
		for q := 0; q < n; q++ {
			for i := 0; i < count; i++ {
				if want := int32(10*(q+1) + i%3); ag[q*count+i] != want {
					t.Fatalf("rank %d all-gather: block %d element %d = %d, want %d", r, q, i, ag[q*count+i], want)
				}
			}
		}
		for i, v := range download[float64](t, d, bc[r].Ptr, count) {
			if want := float64(42 * root); v != want {
				t.Fatalf("rank %d broadcast from %d: element %d = %v, want %v", r, root, i, v, want)
			}
		}
		for i, v := range download[int64](t, d, mx[r].Ptr, count) {
			if want := int64(3 * (i % 11)); v != want { // place 0's values dominate the others' (−1000·p+…)
				t.Fatalf("rank %d all-reduce max: element %d = %d, want %d", r, i, v, want)
			}
		}
		got := download[uint8](t, d, a2aRecv[r].Ptr, 16*n)
		for src := 0; src < n; src++ {
			c := a2aCount(src, p)
			for j := int64(0); j < 16; j++ {
				want := uint8(0xff)
				if j < c {
					want = uint8(16*src + int(j))
				}
				if got[int64(src)*16+j] != want {
					t.Fatalf(
						"rank %d all-to-all-v: from %d element %d = %d, want %d",
						r,
						src,
						j,
						got[int64(src)*16+j],
						want,
					)
				}
			}
		}
	}
	for r := range ranks {
		if err := get(ranks[r]).Err(); err != nil {
			t.Errorf("rank %d: Err = %v", r, err)
		}
	}
}

// TestCommArgs: calls with bad arguments fail with fairgo.ErrInvalidArgument
// before they reach NCCL (so every rank may make them alone): a bad dtype
// or op, a stream of another device (GPU 0 over a context of its own, and
// GPU 1 in one process of two GPUs), all-to-all-v count slices of the
// wrong length or with a negative count, and grids NewLocalRanks refuses.
func TestCommArgs(t *testing.T) {
	g := commGrids(t)[0]
	ranks := commRanks(t, g[0], g[1])
	rk := ranks[0]
	d := rk.Device.(*Device)
	c := rk.Comms.World
	n := c.Size()
	s := stream(t, d)
	require.ErrorIs(t, c.AllReduce(0, 0, 1, fairgo.DType(0), fairgo.Sum, s), fairgo.ErrInvalidArgument, "bad dtype")
	require.ErrorIs(t, c.AllReduce(0, 0, 1, fairgo.Float32, fairgo.Op(0), s), fairgo.ErrInvalidArgument, "bad op")
	others := []otherDevice{{"other context", ownContext(t, d.Ordinal())}}
	if len(ranks) > 1 {
		others = append(others, otherDevice{"other GPU", ranks[1].Device.(*Device)})
	}
	for _, o := range others {
		require.ErrorIs(
			t,
			c.AllReduce(0, 0, 1, fairgo.Float32, fairgo.Sum, stream(t, o.d)),
			fairgo.ErrInvalidArgument,
			"a stream of %s",
			o.name,
		)
	}
	short, long := make([]int64, n-1), make([]int64, n+1)
	full := make([]int64, n)
	require.ErrorIs(
		t,
		c.AllToAllv(0, short, full, 0, full, full, fairgo.Float32, s),
		fairgo.ErrInvalidArgument,
		"short send counts",
	)
	require.ErrorIs(
		t,
		c.AllToAllv(0, full, full, 0, full, long, fairgo.Float32, s),
		fairgo.ErrInvalidArgument,
		"long receive displacements",
	)
	neg := make([]int64, n)
	neg[n-1] = -1
	require.ErrorIs(
		t,
		c.AllToAllv(0, full, full, 0, neg, full, fairgo.Float32, s),
		fairgo.ErrInvalidArgument,
		"negative receive count",
	)
	_, err := NewLocalRanks([]*Device{d}, 2, 2)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument, "grid larger than the devices")
	_, err = NewLocalRanks([]*Device{d, d}, 1, 2)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument, "one GPU twice")
	require.NoError(t, c.Err(), "the refused calls left the communicator alone")
}

// TestCommAbort aborts a communicator of its own on every rank (a rail
// communicator where the grid has several machines, else an intra one,
// else the one-rank world): Err then matches fairgo.ErrAborted, a call
// fails with it, and closing after Abort succeeds.
func TestCommAbort(t *testing.T) {
	g := commGrids(t)[0]
	M, D := g[0], g[1]
	ranks := freshCommRanks(t, M, D)
	jobBarrier(t) // every rank's communicators complete before any is aborted
	pick := func(c *backend.Comms) *backend.Comm {
		switch {
		case M >= 2:
			return &c.RailCollect
		case D >= 2:
			return &c.IntraReduceScatter
		}
		return &c.World
	}
	for r := range ranks {
		c := *pick(&ranks[r].Comms)
		require.NotNil(t, c)
		require.NoError(t, c.Abort(), "rank %d Abort", r)
		require.ErrorIs(t, c.Err(), fairgo.ErrAborted, "rank %d Err after Abort", r)
		s := stream(t, ranks[r].Device.(*Device))
		require.ErrorIs(
			t,
			c.AllReduce(0, 0, 1, fairgo.Float32, fairgo.Sum, s),
			fairgo.ErrAborted,
			"rank %d all-reduce after Abort",
			r,
		)
		require.NoError(t, c.Close(), "rank %d Close after Abort", r)
		*pick(&ranks[r].Comms) = nil // closed: not again at the end of the test
	}
	jobBarrier(t)
}

// TestDuplicate copies the world communicator: same ranks, its own name,
// and every collective right on the copy. In one process: over one or two
// GPUs; under a launcher: the launcher's world.
func TestDuplicate(t *testing.T) {
	g := commGrids(t)[0]
	if !launched() {
		g = [2]int{1, min(gpuCount(t), 2)}
	}
	ranks := commRanks(t, g[0], g[1])
	worlds := make([]*Comm, len(ranks))
	for i, rk := range ranks {
		worlds[i] = rk.Comms.World.(*Comm)
	}
	dups, err := Duplicate(context.Background(), worlds, "flat-ring")
	require.NoError(t, err)
	defer func() {
		for _, c := range dups {
			if err := c.Close(); err != nil {
				t.Errorf("closing %v: %v", c, err)
			}
		}
	}()
	for i, c := range dups {
		if c.Size() != worlds[i].Size() || c.Rank() != worlds[i].Rank() || c.Name() != "flat-ring" ||
			c.Device() != ranks[i].Device ||
			c.NCCL() == worlds[i].NCCL() {
			t.Fatalf("copy %d: %v (rank %d of %d) of %v", i, c, c.Rank(), c.Size(), worlds[i])
		}
		require.NoError(t, c.Err(), "copy %d", i)
	}
	dupOf := func(rk backend.Rank) backend.Comm {
		for i := range ranks {
			if ranks[i].Device == rk.Device {
				return dups[i]
			}
		}
		return nil
	}
	testCollectives(t, ranks, rankStreams(t, ranks), dupOf, collectiveCount())
	_, err = Duplicate(context.Background(), nil, "x")
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument, "nothing to duplicate")
}
