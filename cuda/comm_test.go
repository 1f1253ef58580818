package cuda

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/nccl"
)

// needNCCL skips the test when libnccl cannot be loaded.
func needNCCL(t *testing.T) {
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
func perRank(t *testing.T, ranks []hier.Rank, ss []*Stream, fn func(r int, rk hier.Rank, d *Device, s *Stream) error) {
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

func checkComm(t *testing.T, name string, c hier.Comm, size, rank int) {
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

// TestLocalRanks builds the 1×2 and 2×1 grids over two GPUs and runs every
// hier.Comm operation on the world communicator and on the two-rank
// intra or rail one.
func TestLocalRanks(t *testing.T) {
	devs := devices(t, 2)
	needNCCL(t)
	for _, g := range []struct{ M, D int }{{1, 2}, {2, 1}} {
		t.Run(fmt.Sprintf("%dx%d", g.M, g.D), func(t *testing.T) {
			ranks, err := NewLocalRanks(devs, g.M, g.D)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := CloseRanks(ranks); err != nil {
					t.Errorf("CloseRanks: %v", err)
				}
			}()
			for r, rk := range ranks {
				gr := rk.Grid
				if gr.Machines != g.M || gr.Devices != g.D || gr.Rank() != r || rk.Device != devs[r] {
					t.Fatalf("rank %d: grid %v device %v", r, gr, rk.Device)
				}
				checkComm(t, "world", rk.Comms.World, 2, r)
				checkComm(t, "intra-rs", rk.Comms.IntraReduceScatter, g.D, gr.Local)
				checkComm(t, "intra-ag", rk.Comms.IntraAllGather, g.D, gr.Local)
				checkComm(t, "rail-collect", rk.Comms.RailCollect, g.M, gr.Machine)
				checkComm(t, "rail-diffuse", rk.Comms.RailDiffuse, g.M, gr.Machine)
			}
			sub := func(rk hier.Rank) hier.Comm {
				if g.D == 2 {
					return rk.Comms.IntraReduceScatter
				}
				return rk.Comms.RailCollect
			}
			sub2 := func(rk hier.Rank) hier.Comm {
				if g.D == 2 {
					return rk.Comms.IntraAllGather
				}
				return rk.Comms.RailDiffuse
			}
			ss := []*Stream{stream(t, devs[0]), stream(t, devs[1])}
			for _, comm := range []struct {
				name string
				get  func(hier.Rank) hier.Comm
			}{{"world", func(rk hier.Rank) hier.Comm { return rk.Comms.World }}, {"sub", sub}, {"sub2", sub2}} {
				t.Run(comm.name, func(t *testing.T) { testCollectives(t, ranks, ss, comm.get) })
			}
			t.Run("group", func(t *testing.T) {
				const n = 1000
				a := []fairgo.Tensor{tensor(t, devs[0], n, fairgo.Float32), tensor(t, devs[1], n, fairgo.Float32)}
				b := []fairgo.Tensor{tensor(t, devs[0], 2*n, fairgo.Int64), tensor(t, devs[1], 2*n, fairgo.Int64)}
				perRank(t, ranks, ss, func(r int, rk hier.Rank, d *Device, s *Stream) error {
					if err := d.FillAsync(a[r], float64(r+1), 0, 1, s); err != nil {
						return err
					}
					if err := d.FillAsync(b[r].Slice(int64(r)*n, n), float64(-100*(r+1)), 1, 0, s); err != nil {
						return err
					}
					return d.Group(func() error {
						if err := rk.Comms.World.AllReduce(a[r].Ptr, a[r].Ptr, n, fairgo.Float32, fairgo.Prod, s); err != nil {
							return err
						}
						ib := b[r].Slice(int64(sub(rk).Rank())*n, n)
						return sub2(rk).AllGather(ib.Ptr, b[r].Ptr, n, fairgo.Int64, s)
					})
				})
				for r, d := range devs {
					for i, v := range download[float32](t, d, a[r].Ptr, n) {
						if v != 2 {
							t.Fatalf("rank %d: grouped all-reduce element %d = %v, want 2", r, i, v)
						}
					}
					got := download[int64](t, d, b[r].Ptr, 2*n)
					for q := 0; q < 2; q++ {
						for i := 0; i < n; i++ {
							if want := int64(-100*(q+1) + i); got[q*n+i] != want {
								t.Fatalf("rank %d: grouped all-gather block %d element %d = %d, want %d", r, q, i, got[q*n+i], want)
							}
						}
					}
				}
			})
		})
	}
}

func testCollectives(t *testing.T, ranks []hier.Rank, ss []*Stream, get func(hier.Rank) hier.Comm) {
	const count = 1<<20 + 3
	devs := []*Device{ranks[0].Device.(*Device), ranks[1].Device.(*Device)}
	// rank position in this communicator
	pos := func(r int) int { return get(ranks[r]).Rank() }
	mk := func(n int64, dt fairgo.DType) []fairgo.Tensor {
		return []fairgo.Tensor{tensor(t, devs[0], n, dt), tensor(t, devs[1], n, dt)}
	}
	sum, avg, rsSend, rsRecv := mk(count, fairgo.Float32), mk(count, fairgo.BFloat16), mk(2*count, fairgo.Float32), mk(count, fairgo.Float32)
	agSend, agRecv, bc, mx := mk(count, fairgo.Int32), mk(2*count, fairgo.Int32), mk(count, fairgo.Float64), mk(count, fairgo.Int64)
	// all-to-all-v: rank p sends counts[p][k] elements to rank k, both sends from displacement 0.
	a2aCounts := [2][2]int64{{5, 0}, {3, 7}}
	a2aSend, a2aRecv := mk(16, fairgo.Uint8), mk(32, fairgo.Uint8)

	perRank(t, ranks, ss, func(r int, rk hier.Rank, d *Device, s *Stream) error {
		c, p := get(rk), pos(r)
		steps := []func() error{
			func() error { return d.FillAsync(sum[r], float64(p+1), 1, 7, s) },
			func() error { return c.AllReduce(sum[r].Ptr, sum[r].Ptr, count, fairgo.Float32, fairgo.Sum, s) },
			func() error { return d.FillAsync(avg[r], float64(2*(p+1)), 0, 1, s) },
			func() error { return c.AllReduce(avg[r].Ptr, avg[r].Ptr, count, fairgo.BFloat16, fairgo.Avg, s) },
			func() error { return d.FillAsync(rsSend[r], float64(p+1), 1, 5, s) },
			func() error {
				return c.ReduceScatter(rsSend[r].Ptr, rsRecv[r].Ptr, count, fairgo.Float32, fairgo.Sum, s)
			},
			func() error { return d.FillAsync(agSend[r], float64(10*(p+1)), 1, 3, s) },
			func() error { return c.AllGather(agSend[r].Ptr, agRecv[r].Ptr, count, fairgo.Int32, s) },
			func() error { return d.FillAsync(bc[r], float64(42*p), 0, 1, s) },
			func() error { return c.Broadcast(bc[r].Ptr, bc[r].Ptr, count, fairgo.Float64, 1, s) },
			func() error { return d.FillAsync(mx[r], float64(-1000*p), 3, 11, s) },
			func() error { return c.AllReduce(mx[r].Ptr, mx[r].Ptr, count, fairgo.Int64, fairgo.Max, s) },
			func() error { return d.FillAsync(a2aSend[r], float64(100*p), 1, 0, s) },
			func() error { return d.FillAsync(a2aRecv[r], 255, 0, 1, s) },
			func() error {
				send := a2aCounts[p][:]
				recv := []int64{a2aCounts[0][p], a2aCounts[1][p]}
				return c.AllToAllv(a2aSend[r].Ptr, send, []int64{0, 0}, a2aRecv[r].Ptr, recv, []int64{0, 16}, fairgo.Uint8, s)
			},
		}
		for i, f := range steps {
			if err := f(); err != nil {
				return fmt.Errorf("step %d on %s: %w", i, c.Name(), err)
			}
		}
		return nil
	})

	for r, d := range devs {
		p := pos(r)
		for i, v := range download[float32](t, d, sum[r].Ptr, count) {
			if want := float32(3 + 2*(i%7)); v != want {
				t.Fatalf("rank %d all-reduce sum: element %d = %v, want %v", r, i, v, want)
			}
		}
		for i, v := range download[uint16](t, d, avg[r].Ptr, count) {
			if bf16ToF32(v) != 3 {
				t.Fatalf("rank %d all-reduce avg bf16: element %d = %v, want 3", r, i, bf16ToF32(v))
			}
		}
		for i, v := range download[float32](t, d, rsRecv[r].Ptr, count) {
			if want := float32(3 + 2*((p*count+i)%5)); v != want {
				t.Fatalf("rank %d reduce-scatter: element %d = %v, want %v", r, i, v, want)
			}
		}
		ag := download[int32](t, d, agRecv[r].Ptr, 2*count)
		for q := 0; q < 2; q++ {
			for i := 0; i < count; i++ {
				if want := int32(10*(q+1) + i%3); ag[q*count+i] != want {
					t.Fatalf("rank %d all-gather: block %d element %d = %d, want %d", r, q, i, ag[q*count+i], want)
				}
			}
		}
		for i, v := range download[float64](t, d, bc[r].Ptr, count) {
			if v != 42 {
				t.Fatalf("rank %d broadcast: element %d = %v, want 42", r, i, v)
			}
		}
		for i, v := range download[int64](t, d, mx[r].Ptr, count) {
			if want := int64(3 * (i % 11)); v != want { // rank 0's values (p=0) dominate rank 1's (−1000+…)
				t.Fatalf("rank %d all-reduce max: element %d = %d, want %d", r, i, v, want)
			}
		}
		got := download[uint8](t, d, a2aRecv[r].Ptr, 32)
		for src := 0; src < 2; src++ {
			n := a2aCounts[src][p]
			for j := int64(0); j < 16; j++ {
				want := uint8(0xff)
				if j < n {
					want = uint8(100*src + int(j))
				}
				if got[int64(src)*16+j] != want {
					t.Fatalf("rank %d all-to-all-v: from %d element %d = %d, want %d", r, src, j, got[int64(src)*16+j], want)
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

func TestCommArgs(t *testing.T) {
	devs := devices(t, 2)
	needNCCL(t)
	ranks, err := NewLocalRanks(devs, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer CloseRanks(ranks)
	c := ranks[0].Comms.World
	s0 := stream(t, devs[0])
	s1 := stream(t, devs[1])
	if err := c.AllReduce(0, 0, 1, fairgo.DType(0), fairgo.Sum, s0); !isInvalid(err) {
		t.Errorf("bad dtype: %v", err)
	}
	if err := c.AllReduce(0, 0, 1, fairgo.Float32, fairgo.Op(0), s0); !isInvalid(err) {
		t.Errorf("bad op: %v", err)
	}
	if err := c.AllReduce(0, 0, 1, fairgo.Float32, fairgo.Sum, s1); !isInvalid(err) {
		t.Errorf("other device's stream: %v", err)
	}
	if err := c.AllToAllv(0, []int64{1}, []int64{0}, 0, []int64{1}, []int64{0}, fairgo.Float32, s0); !isInvalid(err) {
		t.Errorf("short count slices: %v", err)
	}
	if err := c.AllToAllv(0, []int64{1, -1}, []int64{0, 0}, 0, []int64{1, 1}, []int64{0, 0}, fairgo.Float32, s0); !isInvalid(err) {
		t.Errorf("negative count: %v", err)
	}
	if _, err := NewLocalRanks(devs, 2, 2); !isInvalid(err) {
		t.Errorf("grid larger than the devices: %v", err)
	}
	if _, err := NewLocalRanks([]*Device{devs[0], devs[0]}, 1, 2); !isInvalid(err) {
		t.Errorf("one GPU twice: %v", err)
	}
}

func TestCommAbort(t *testing.T) {
	devs := devices(t, 2)
	needNCCL(t)
	ranks, err := NewLocalRanks(devs, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	s := stream(t, devs[0])
	for r := range ranks {
		if err := ranks[r].Comms.RailCollect.Abort(); err != nil {
			t.Fatalf("rank %d Abort: %v", r, err)
		}
		if err := ranks[r].Comms.RailCollect.Err(); !errors.Is(err, fairgo.ErrAborted) {
			t.Errorf("rank %d Err after Abort = %v, want fairgo.ErrAborted", r, err)
		}
	}
	if err := ranks[0].Comms.RailCollect.AllReduce(0, 0, 1, fairgo.Float32, fairgo.Sum, s); !errors.Is(err, fairgo.ErrAborted) {
		t.Errorf("all-reduce after Abort = %v, want fairgo.ErrAborted", err)
	}
	if err := CloseRanks(ranks); err != nil {
		t.Errorf("CloseRanks after Abort: %v", err)
	}
}

// Duplicate copies the world communicator of one or two GPUs: same ranks,
// its own name, and every collective right on the copy (on two GPUs).
func TestDuplicate(t *testing.T) {
	n, err := Count()
	if err != nil || n < 1 {
		t.Skipf("needs a GPU (%d, %v)", n, err)
	}
	devs := devices(t, min(n, 2))
	needNCCL(t)
	ranks, err := NewLocalRanks(devs, 1, len(devs))
	if err != nil {
		t.Fatal(err)
	}
	defer CloseRanks(ranks)
	worlds := make([]*Comm, len(ranks))
	for i, rk := range ranks {
		worlds[i] = rk.Comms.World.(*Comm)
	}
	dups, err := Duplicate(context.Background(), worlds, "flat-ring")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range dups {
			if err := c.Close(); err != nil {
				t.Errorf("closing %v: %v", c, err)
			}
		}
	}()
	for i, c := range dups {
		if c.Size() != len(devs) || c.Rank() != i || c.Name() != "flat-ring" || c.Device() != devs[i] || c.NCCL() == worlds[i].NCCL() {
			t.Fatalf("copy %d: %v (rank %d of %d) of %v", i, c, c.Rank(), c.Size(), worlds[i])
		}
		if err := c.Err(); err != nil {
			t.Errorf("copy %d: Err = %v", i, err)
		}
	}
	if len(devs) == 2 {
		dupOf := func(rk hier.Rank) hier.Comm {
			for i := range ranks {
				if ranks[i].Device == rk.Device {
					return dups[i]
				}
			}
			return nil
		}
		testCollectives(t, ranks, []*Stream{stream(t, devs[0]), stream(t, devs[1])}, dupOf)
		return
	}
	const count = 1001
	x := tensor(t, devs[0], count, fairgo.Float32)
	perRank(t, ranks, []*Stream{stream(t, devs[0])}, func(_ int, _ hier.Rank, d *Device, s *Stream) error {
		if err := d.FillAsync(x, 3, 1, 5, s); err != nil {
			return err
		}
		return dups[0].AllReduce(x.Ptr, x.Ptr, count, fairgo.Float32, fairgo.Sum, s)
	})
	for i, v := range download[float32](t, devs[0], x.Ptr, count) {
		if want := float32(3 + i%5); v != want {
			t.Fatalf("one-rank all-reduce on the copy: element %d = %v, want %v", i, v, want)
		}
	}
	if _, err := Duplicate(context.Background(), nil, "x"); !isInvalid(err) {
		t.Errorf("nothing to duplicate: %v", err)
	}
}
