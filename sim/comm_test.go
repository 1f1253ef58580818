package sim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/internal/elem"
)

// world is an n-rank cluster (n machines of one device) with one stream per
// rank.
type world struct {
	c     *Cluster
	comms []*Comm
	devs  []*Device
	ss    []*Stream
}

func newWorld(t testing.TB, n int, cfg Config) *world {
	t.Helper()
	cfg.Machines, cfg.Devices = n, 1
	w := &world{c: newCluster(t, cfg)}
	for g := range n {
		w.devs = append(w.devs, w.c.Device(g))
		w.comms = append(w.comms, w.c.Comms(g).World.(*Comm))
		w.ss = append(w.ss, mkStream(t, w.c.Device(g)))
	}
	return w
}

func (w *world) sync(t testing.TB) []error {
	t.Helper()
	errs := make([]error, len(w.ss))
	for i, s := range w.ss {
		errs[i] = syncStream(t, s)
	}
	return errs
}

func (w *world) requireOK(t testing.TB) {
	t.Helper()
	for r, err := range w.sync(t) {
		require.NoError(t, err, "rank %d", r)
	}
}

// inputs draws one buffer of count elements per rank. exact: small values
// whose float reductions are exact; otherwise random values (floats in a
// range that cannot overflow, integers over their whole range).
func inputs(rng *rand.Rand, n, count int, dt fairgo.DType, op fairgo.Op, exact bool) [][]byte {
	out := make([][]byte, n)
	for r := range out {
		b := make([]byte, count*dt.Size())
		for i := range count {
			switch {
			case !dt.IsFloat():
				for j := range dt.Size() {
					b[i*dt.Size()+j] = byte(rng.Uint32())
				}
			case exact && op == fairgo.Prod:
				elem.Set(dt, b, i, []float64{-2, -1, 1, 2}[rng.IntN(4)])
			case exact:
				elem.Set(dt, b, i, float64(rng.IntN(17)-8))
			case op == fairgo.Prod:
				elem.Set(dt, b, i, 0.5+1.5*rng.Float64())
			default:
				elem.Set(dt, b, i, 8*rng.Float64()-4)
			}
		}
		out[r] = b
	}
	return out
}

// reference reduces element i of every input: exactly (wrapping) for
// integers, in float64 for floats; tol is the error a ring of n hops may
// add in the element type.
func reference(dt fairgo.DType, op fairgo.Op, ins [][]byte, i int) (want []byte, ref, tol float64) {
	n := len(ins)
	want = make([]byte, dt.Size())
	if !dt.IsFloat() {
		signed := dt.IsSigned()
		acc := elem.GetUint(dt, ins[0], i)
		for _, b := range ins[1:] {
			x := elem.GetUint(dt, b, i)
			switch op {
			case fairgo.Sum, fairgo.Avg:
				acc += x
			case fairgo.Prod:
				acc *= x
			case fairgo.Max, fairgo.Min:
				less := x < acc
				if signed {
					less = int64(x) < int64(acc)
				}
				if less == (op == fairgo.Min) {
					acc = x
				}
			}
		}
		elem.SetUint(dt, want, 0, acc)
		if op == fairgo.Avg {
			if signed {
				elem.SetInt(dt, want, 0, elem.GetInt(dt, want, 0)/int64(n))
			} else {
				elem.SetUint(dt, want, 0, elem.GetUint(dt, want, 0)/uint64(n))
			}
		}
		return want, 0, 0
	}
	ref = elem.Get(dt, ins[0], i)
	mag := math.Abs(ref)
	for _, b := range ins[1:] {
		x := elem.Get(dt, b, i)
		mag += math.Abs(x)
		switch op {
		case fairgo.Sum, fairgo.Avg:
			ref += x
		case fairgo.Prod:
			ref *= x
		case fairgo.Max:
			ref = math.Max(ref, x)
		case fairgo.Min:
			ref = math.Min(ref, x)
		}
	}
	eps := dt.Epsilon()
	switch op {
	case fairgo.Sum:
		tol = float64(n) * eps * mag
	case fairgo.Avg:
		ref /= float64(n)
		tol = float64(n+2) * eps * mag / float64(n)
	case fairgo.Prod:
		tol = float64(n) * 2 * eps * math.Abs(ref)
	}
	elem.Set(dt, want, 0, ref)
	return want, ref, tol
}

// checkElem compares element i of got with the reduction of element j of ins.
func checkElem(
	t testing.TB,
	dt fairgo.DType,
	op fairgo.Op,
	exact bool,
	got []byte,
	i int,
	ins [][]byte,
	j int,
	what string,
) {
	t.Helper()
	want, ref, tol := reference(dt, op, ins, j)
	g := got[i*dt.Size() : (i+1)*dt.Size()]
	if !dt.IsFloat() || (exact && op != fairgo.Avg) || op == fairgo.Max || op == fairgo.Min {
		require.Equal(t, want, g, "%s %v %v element %d", what, dt, op, i)
		return
	}
	require.InDelta(t, ref, elem.Get(dt, g, 0), tol+1e-300, "%s %v %v element %d", what, dt, op, i)
}

func TestReduceCollectivesAgainstReference(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		t.Run(fmt.Sprint("n=", n), func(t *testing.T) {
			w := newWorld(t, n, Config{})
			rng := rand.New(rand.NewPCG(uint64(n), 1))
			for _, dt := range fairgo.DTypes {
				for _, op := range fairgo.Ops {
					for _, exact := range []bool{true, false} {
						if exact && !dt.IsFloat() {
							continue
						}
						what := fmt.Sprintf("n=%d %v %v exact=%v", n, dt, op, exact)
						testAllReduce(t, w, rng, dt, op, exact, what)
						testReduceScatter(t, w, rng, dt, op, exact, false, what)
						testReduceScatter(t, w, rng, dt, op, exact, true, what)
					}
				}
			}
		})
	}
}

func testAllReduce(t *testing.T, w *world, rng *rand.Rand, dt fairgo.DType, op fairgo.Op, exact bool, what string) {
	n := len(w.comms)
	count := 2*n + 1
	ins := inputs(rng, n, count, dt, op, exact)
	recvs := make([]fairgo.Tensor, n)
	for r, cm := range w.comms {
		send := tensorBytes(t, w.devs[r], dt, ins[r])
		recvs[r] = send
		if r%2 == 1 { // odd ranks out of place
			var err error
			recvs[r], err = w.devs[r].AllocTensor(int64(count), dt)
			require.NoError(t, err)
		}
		require.NoError(t, cm.AllReduce(send.Ptr, recvs[r].Ptr, int64(count), dt, op, w.ss[r]))
	}
	w.requireOK(t)
	got := download(t, w.devs[0], recvs[0])
	for r := 1; r < n; r++ {
		require.Equal(
			t,
			got,
			download(t, w.devs[r], recvs[r]),
			"%s: all-reduce results must be bit-identical on every rank",
			what,
		)
	}
	for i := range count {
		checkElem(t, dt, op, exact, got, i, ins, i, "all-reduce "+what)
	}
}

func testReduceScatter(
	t *testing.T,
	w *world,
	rng *rand.Rand,
	dt fairgo.DType,
	op fairgo.Op,
	exact, inPlace bool,
	what string,
) {
	n := len(w.comms)
	const rc = 3
	ins := inputs(rng, n, n*rc, dt, op, exact)
	recvs := make([]fairgo.Tensor, n)
	for r, cm := range w.comms {
		send := tensorBytes(t, w.devs[r], dt, ins[r])
		if inPlace {
			recvs[r] = send.Slice(int64(r*rc), rc)
		} else {
			var err error
			recvs[r], err = w.devs[r].AllocTensor(rc, dt)
			require.NoError(t, err)
		}
		require.NoError(t, cm.ReduceScatter(send.Ptr, recvs[r].Ptr, rc, dt, op, w.ss[r]))
	}
	w.requireOK(t)
	for r := range n {
		got := download(t, w.devs[r], recvs[r])
		for i := range rc {
			checkElem(
				t,
				dt,
				op,
				exact,
				got,
				i,
				ins,
				r*rc+i,
				fmt.Sprintf("reduce-scatter (in place %v) rank %d %s", inPlace, r, what),
			)
		}
	}
}

// A float16 ring rounds at every hop: 2048 (+1 → 2048) (+1 → 2048) (+0),
// where one float32 accumulation would give 2050.
func TestRingRoundsEveryHop(t *testing.T) {
	w := newWorld(t, 4, Config{})
	data := [][]float64{{0, 0, 0, 0}, {2048, 0, 0, 0}, {1, 0, 0, 0}, {1, 0, 0, 0}}
	ts := make([]fairgo.Tensor, 4)
	for r, cm := range w.comms {
		ts[r] = tensorOf(t, w.devs[r], fairgo.Float16, data[r]...)
		require.NoError(t, cm.AllReduce(ts[r].Ptr, ts[r].Ptr, 4, fairgo.Float16, fairgo.Sum, w.ss[r]))
	}
	w.requireOK(t)
	for r := range 4 {
		require.Equal(t, []float64{2048, 0, 0, 0}, values(t, w.devs[r], ts[r]))
	}
	// Avg pre-multiplies by 1/n rounded in the element type, as NCCL does,
	// then rounds at every hop: averaging 1, 2, 4 over 3 ranks in float16
	// gives (r(1/3) + 2·r(1/3) → 1.0, tie to even) + 4·r(1/3) = 2.3330078125
	// → 2.33203125 (tie to even), where the correctly rounded 7/3 is
	// 2.333984375.
	w3 := newWorld(t, 3, Config{})
	for r, cm := range w3.comms {
		ts[r] = tensorOf(t, w3.devs[r], fairgo.Float16, []float64{1, 2, 4}[r])
		require.NoError(t, cm.AllReduce(ts[r].Ptr, ts[r].Ptr, 1, fairgo.Float16, fairgo.Avg, w3.ss[r]))
	}
	w3.requireOK(t)
	for r := range 3 {
		require.Equal(t, []float64{2.33203125}, values(t, w3.devs[r], ts[r]))
	}
}

func TestAllGatherAndBroadcast(t *testing.T) {
	for _, n := range []int{1, 2, 4} {
		for _, dt := range []fairgo.DType{fairgo.Float16, fairgo.Float64, fairgo.Int8, fairgo.Uint32} {
			t.Run(fmt.Sprintf("n=%d/%v", n, dt), func(t *testing.T) {
				w := newWorld(t, n, Config{Jitter: 50 * time.Microsecond})
				rng := rand.New(rand.NewPCG(uint64(n), uint64(dt)))
				const sc = 3
				ins := inputs(rng, n, sc, dt, fairgo.Sum, false)
				for _, inPlace := range []bool{false, true} {
					recvs := make([]fairgo.Tensor, n)
					for r, cm := range w.comms {
						var err error
						recvs[r], err = w.devs[r].AllocTensor(int64(n*sc), dt)
						require.NoError(t, err)
						send := recvs[r].Slice(int64(r*sc), sc)
						if inPlace {
							require.NoError(t, w.devs[r].Upload(send.Ptr, ins[r]))
						} else {
							send = tensorBytes(t, w.devs[r], dt, ins[r])
						}
						require.NoError(t, cm.AllGather(send.Ptr, recvs[r].Ptr, sc, dt, w.ss[r]))
					}
					w.requireOK(t)
					var want []byte
					for _, b := range ins {
						want = append(want, b...)
					}
					for r := range n {
						require.Equal(
							t,
							want,
							download(t, w.devs[r], recvs[r]),
							"all-gather in place %v rank %d",
							inPlace,
							r,
						)
					}
				}
				for root := range n {
					recvs := make([]fairgo.Tensor, n)
					for r, cm := range w.comms {
						send := tensorBytes(t, w.devs[r], dt, ins[r])
						recvs[r] = send
						if r != root {
							recvs[r] = tensorBytes(t, w.devs[r], dt, make([]byte, sc*dt.Size()))
						}
						require.NoError(t, cm.Broadcast(send.Ptr, recvs[r].Ptr, sc, dt, root, w.ss[r]))
					}
					w.requireOK(t)
					for r := range n {
						require.Equal(
							t,
							ins[root],
							download(t, w.devs[r], recvs[r]),
							"broadcast from %d, rank %d",
							root,
							r,
						)
					}
				}
			})
		}
	}
}

// AllToAllv with uneven (and zero) counts, overlapping sends and scattered
// receives: every chunk lands where its receiver asked, and nothing else
// is touched.
func TestAllToAllvProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 4).Draw(rt, "n")
		dt := rapid.SampledFrom([]fairgo.DType{fairgo.BFloat16, fairgo.Float32, fairgo.Uint8, fairgo.Int64}).
			Draw(rt, "dt")
		size := dt.Size()
		c, err := NewCluster(Config{Machines: 1, Devices: n, Seed: 3, Jitter: 20 * time.Microsecond})
		require.NoError(rt, err)
		defer c.Close()
		counts := make([][]int64, n) // counts[from][to]
		for r := range counts {
			counts[r] = make([]int64, n)
			for k := range counts[r] {
				counts[r][k] = int64(rapid.IntRange(0, 4).Draw(rt, "count"))
			}
		}
		const sendLen, recvLen = 6, 40
		sendData := make([][]byte, n)
		sendDispls := make([][]int64, n)
		recvDispls := make([][]int64, n)
		recvs := make([]fairgo.Tensor, n)
		for r := range n {
			d := c.Device(r)
			cm := c.Comms(r).IntraReduceScatter.(*Comm)
			require.Equal(rt, r, cm.Rank())
			sendData[r] = make([]byte, sendLen*size)
			for i := range sendData[r] {
				sendData[r][i] = byte(r*50 + i + 1)
			}
			send := tensorBytes(rt, d, dt, sendData[r])
			sendDispls[r] = make([]int64, n)
			recvCounts := make([]int64, n)
			for k := range n {
				// Sends may overlap: any start that fits.
				sendDispls[r][k] = int64(rapid.IntRange(0, int(sendLen-counts[r][k])).Draw(rt, "sendDispl"))
				recvCounts[k] = counts[k][r]
			}
			// Receives in a random order, with random gaps.
			recvDispls[r] = make([]int64, n)
			at := int64(0)
			for _, k := range rapid.Permutation(seq(n)).Draw(rt, "order") {
				at += int64(rapid.IntRange(0, 2).Draw(rt, "gap"))
				recvDispls[r][k] = at
				at += recvCounts[k]
			}
			recvs[r] = tensorBytes(rt, d, dt, bytesOf(0xEE, recvLen*size))
			s, err := d.NewStream()
			require.NoError(rt, err)
			require.NoError(
				rt,
				cm.AllToAllv(send.Ptr, counts[r], sendDispls[r], recvs[r].Ptr, recvCounts, recvDispls[r], dt, s),
			)
		}
		require.NoError(rt, waitAll(c))
		for r := range n {
			want := bytesOf(0xEE, recvLen*size)
			for k := range n {
				from := sendData[k][sendDispls[k][r]*int64(size) : (sendDispls[k][r]+counts[k][r])*int64(size)]
				copy(want[recvDispls[r][k]*int64(size):], from)
			}
			got := make([]byte, recvLen*size)
			require.NoError(rt, c.Device(r).Download(got, recvs[r].Ptr))
			require.Equal(rt, want, got, "rank %d", r)
		}
	})
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

func bytesOf(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

func waitAll(c *Cluster) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for g := range c.Size() {
		if err := c.Device(g).Synchronize(ctx); err != nil {
			return err
		}
	}
	return nil
}

func TestMismatchNamesCommAndSeq(t *testing.T) {
	c := newCluster(t, Config{Machines: 2, Devices: 1})
	ss := []*Stream{mkStream(t, c.Device(0)), mkStream(t, c.Device(1))}
	bufs := []fairgo.Tensor{
		tensorOf(t, c.Device(0), fairgo.Float32, make([]float64, 192)...),
		tensorOf(t, c.Device(1), fairgo.Float32, make([]float64, 192)...),
	}
	rail := []*Comm{c.Comms(0).RailCollect.(*Comm), c.Comms(1).RailCollect.(*Comm)}
	require.Equal(t, "rail-collect/local=0", rail[0].Name())
	// Three matching calls, then a mismatch at seq 3.
	for range 3 {
		for r, cm := range rail {
			require.NoError(t, cm.AllReduce(bufs[r].Ptr, bufs[r].Ptr, 8, fairgo.Float32, fairgo.Sum, ss[r]))
		}
	}
	require.NoError(
		t,
		rail[0].AllToAllv(
			bufs[0].Ptr,
			[]int64{48, 48},
			[]int64{0, 48},
			bufs[0].Ptr+96*4,
			[]int64{48, 48},
			[]int64{0, 48},
			fairgo.Float32,
			ss[0],
		),
	)
	require.NoError(t, rail[1].AllGather(bufs[1].Ptr, bufs[1].Ptr+100*4, 12, fairgo.Float32, ss[1]))
	for r := range 2 {
		err := syncStream(t, ss[r])
		var me *MismatchError
		require.ErrorAs(t, err, &me, "rank %d", r)
		require.ErrorIs(t, err, ErrMismatch)
		require.Contains(t, err.Error(), "rail-collect/local=0 seq 3: rank 0 enqueued all-to-all of 96 float32")
		require.Contains(t, err.Error(), "rank 1 enqueued all-gather of 12 float32")
		require.Equal(t, uint64(3), me.Seq)
		require.ErrorIs(t, rail[r].Err(), ErrMismatch, "the communicator is failed")
	}
	// The failed communicator fails later calls at once.
	s := mkStream(t, c.Device(0))
	require.NoError(t, rail[0].AllReduce(bufs[0].Ptr, bufs[0].Ptr, 8, fairgo.Float32, fairgo.Sum, s))
	require.ErrorIs(t, syncStream(t, s), ErrMismatch)
	require.NoError(t, c.Comms(0).RailDiffuse.Err(), "other communicators are unaffected")
}

// With HangOnMismatch a mismatched collective hangs as NCCL's does: no
// rank fails until one aborts its handle (then every rank ends in the
// abort) or the stall timeout passes (a *StallError, never a
// *MismatchError).
func TestHangOnMismatch(t *testing.T) {
	mismatched := func(w *world) {
		for r, cm := range w.comms {
			b := tensorOf(t, w.devs[r], fairgo.Float32, make([]float64, 4)...)
			require.NoError(t, cm.AllReduce(b.Ptr, b.Ptr, int64(1+r), fairgo.Float32, fairgo.Sum, w.ss[r]))
		}
	}
	t.Run("an abort ends it", func(t *testing.T) {
		w := newWorld(t, 3, Config{StallTimeout: time.Minute, HangOnMismatch: true})
		mismatched(w)
		done := make(chan []error, 1)
		go func() { done <- w.sync(t) }()
		select {
		case errs := <-done:
			t.Fatalf("a mismatched collective ended before any abort: %v", errs)
		case <-time.After(100 * time.Millisecond):
		}
		require.NoError(t, w.comms[2].Abort())
		for r, err := range <-done {
			require.ErrorIs(t, err, fairgo.ErrAborted, "rank %d", r)
			require.NotErrorIs(t, err, ErrMismatch, "rank %d", r)
		}
	})
	t.Run("the stall timeout ends it", func(t *testing.T) {
		w := newWorld(t, 2, Config{StallTimeout: 100 * time.Millisecond, HangOnMismatch: true})
		mismatched(w)
		for r, err := range w.sync(t) {
			var se *StallError
			require.ErrorAs(t, err, &se, "rank %d", r)
			require.NotErrorIs(t, err, ErrMismatch, "rank %d", r)
		}
	})
	t.Run("matching calls run", func(t *testing.T) {
		w := newWorld(t, 2, Config{StallTimeout: time.Minute, HangOnMismatch: true})
		for r, cm := range w.comms {
			b := tensorOf(t, w.devs[r], fairgo.Float32, 1, 2)
			require.NoError(t, cm.AllReduce(b.Ptr, b.Ptr, 2, fairgo.Float32, fairgo.Sum, w.ss[r]))
		}
		w.requireOK(t)
	})
}

func TestAllToAllvCountMismatch(t *testing.T) {
	w := newWorld(t, 2, Config{})
	for r, cm := range w.comms {
		b := tensorOf(t, w.devs[r], fairgo.Int32, make([]float64, 8)...)
		recvCounts := []int64{2, 2}
		if r == 1 {
			recvCounts = []int64{1, 2} // rank 0 sends 2
		}
		require.NoError(
			t,
			cm.AllToAllv(
				b.Ptr,
				[]int64{2, 2},
				[]int64{0, 2},
				b.Ptr+16,
				recvCounts,
				[]int64{0, 2},
				fairgo.Int32,
				w.ss[r],
			),
		)
	}
	for _, err := range w.sync(t) {
		require.ErrorIs(t, err, ErrMismatch)
		require.ErrorContains(t, err, "world seq 0")
		require.ErrorContains(t, err, "receive counts [1 2]")
	}
}

func TestStallWhenARankNeverEnqueues(t *testing.T) {
	w := newWorld(t, 3, Config{StallTimeout: 100 * time.Millisecond})
	for r := range 2 { // rank 2 never calls
		b := tensorOf(t, w.devs[r], fairgo.Float32, 1, 2)
		require.NoError(t, w.comms[r].AllReduce(b.Ptr, b.Ptr, 2, fairgo.Float32, fairgo.Sum, w.ss[r]))
	}
	start := time.Now()
	for r := range 2 {
		err := syncStream(t, w.ss[r])
		var se *StallError
		require.ErrorAs(t, err, &se)
		require.ErrorIs(t, err, ErrStall)
		require.ErrorIs(t, err, fairgo.ErrTimeout, "a rank that did not come is a timeout")
		require.Equal(t, []int{0, 1}, se.Arrived)
		require.Equal(t, []int{2}, se.Missing)
		require.Equal(t, []int{2}, se.NotCalled)
		require.Contains(t, err.Error(), "world seq 0: ranks [2] did not arrive within 100ms")
		require.Contains(t, err.Error(), "rank 0 (all-reduce sum of 2 float32)")
		require.Contains(t, err.Error(), "ranks [2] never made the call: every rank must make a collective before any rank waits on one")
	}
	require.Less(t, time.Since(start), 5*time.Second)
	require.ErrorIs(t, w.comms[2].Err(), ErrStall)
}

// Two communicators used in opposite orders by two ranks deadlock on NCCL;
// the sim reports a stall.
func TestOrderInversionStalls(t *testing.T) {
	c := newCluster(t, Config{Machines: 1, Devices: 2, StallTimeout: 100 * time.Millisecond})
	var ss []*Stream
	for g := range 2 {
		d := c.Device(g)
		s := mkStream(t, d)
		ss = append(ss, s)
		b := tensorOf(t, d, fairgo.Float32, 1, 2, 3, 4)
		rs, ag := c.Comms(g).IntraReduceScatter, c.Comms(g).IntraAllGather
		first := func() error { return rs.ReduceScatter(b.Ptr, b.Ptr+uintptr(8*g), 2, fairgo.Float32, fairgo.Sum, s) }
		second := func() error { return ag.AllGather(b.Ptr+uintptr(8*g), b.Ptr, 2, fairgo.Float32, s) }
		if g == 1 {
			first, second = second, first
		}
		require.NoError(t, first())
		require.NoError(t, second())
	}
	for _, s := range ss {
		err := syncStream(t, s)
		require.ErrorIs(t, err, ErrStall)
		require.ErrorIs(t, err, fairgo.ErrTimeout)
		require.ErrorContains(t, err, "seq 0")
		// Every rank made its calls: the hint about waiting before calling
		// would mislead here.
		require.NotContains(t, err.Error(), "never made the call")
	}
}

func TestAbortUnblocks(t *testing.T) {
	w := newWorld(t, 2, Config{StallTimeout: time.Minute})
	b := tensorOf(t, w.devs[0], fairgo.Float32, 1)
	require.NoError(t, w.comms[0].AllReduce(b.Ptr, b.Ptr, 1, fairgo.Float32, fairgo.Sum, w.ss[0]))
	time.Sleep(10 * time.Millisecond)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.comms[1].Abort()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Abort blocked")
	}
	err := syncStream(t, w.ss[0])
	require.ErrorIs(t, err, fairgo.ErrAborted)
	require.ErrorContains(t, err, "world aborted by rank 1")
	require.ErrorIs(t, w.comms[0].Err(), fairgo.ErrAborted)
	// Future calls fail too, on every handle.
	b1 := tensorOf(t, w.devs[1], fairgo.Float32, 1)
	require.NoError(t, w.comms[1].AllReduce(b1.Ptr, b1.Ptr, 1, fairgo.Float32, fairgo.Sum, w.ss[1]))
	require.ErrorIs(t, syncStream(t, w.ss[1]), fairgo.ErrAborted)
	require.NoError(t, w.comms[0].Abort(), "aborting twice is fine")
	require.NoError(t, w.comms[0].Close())
	require.ErrorIs(t, w.comms[0].AllReduce(b.Ptr, b.Ptr, 1, fairgo.Float32, fairgo.Sum, w.ss[0]), fairgo.ErrClosed)
}

func TestAbortAfterStallWrapsBoth(t *testing.T) {
	w := newWorld(t, 2, Config{StallTimeout: 20 * time.Millisecond})
	b := tensorOf(t, w.devs[0], fairgo.Float32, 1)
	require.NoError(t, w.comms[0].AllReduce(b.Ptr, b.Ptr, 1, fairgo.Float32, fairgo.Sum, w.ss[0]))
	require.ErrorIs(t, syncStream(t, w.ss[0]), ErrStall)
	require.NoError(t, w.comms[0].Abort())
	err := w.comms[1].Err()
	require.ErrorIs(t, err, fairgo.ErrAborted)
	require.ErrorIs(t, err, ErrStall)
}

func TestCollectiveIllegalAddressFailsEveryone(t *testing.T) {
	w := newWorld(t, 2, Config{})
	short := tensorOf(t, w.devs[0], fairgo.Float32, 1, 2)
	long := tensorOf(t, w.devs[1], fairgo.Float32, 1, 2, 3, 4)
	require.NoError(t, w.comms[0].AllReduce(short.Ptr, short.Ptr, 4, fairgo.Float32, fairgo.Sum, w.ss[0]))
	require.NoError(t, w.comms[1].AllReduce(long.Ptr, long.Ptr, 4, fairgo.Float32, fairgo.Sum, w.ss[1]))
	for _, err := range w.sync(t) {
		require.ErrorIs(t, err, ErrIllegalAddress)
		require.ErrorContains(t, err, "sim device 0")
		require.ErrorContains(t, err, "all-reduce on world seq 0")
	}
	require.Equal(t, []float64{1, 2, 3, 4}, values(t, w.devs[1], long), "nothing was written")
}

func TestCommValidation(t *testing.T) {
	w := newWorld(t, 2, Config{})
	cm, s, d := w.comms[0], w.ss[0], w.devs[0]
	b := tensorOf(t, d, fairgo.Float32, make([]float64, 16)...)
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"stream of another device", cm.AllReduce(b.Ptr, b.Ptr, 4, fairgo.Float32, fairgo.Sum, w.ss[1])},
		{"bad dtype", cm.AllReduce(b.Ptr, b.Ptr, 4, fairgo.DType(0), fairgo.Sum, s)},
		{"bad op", cm.ReduceScatter(b.Ptr, b.Ptr, 4, fairgo.Float32, fairgo.Op(9), s)},
		{"negative count", cm.AllGather(b.Ptr, b.Ptr, -1, fairgo.Float32, s)},
		{"root", cm.Broadcast(b.Ptr, b.Ptr, 4, fairgo.Float32, 2, s)},
		{"partial all-reduce overlap", cm.AllReduce(b.Ptr, b.Ptr+4, 4, fairgo.Float32, fairgo.Sum, s)},
		{"reduce-scatter not in place", cm.ReduceScatter(b.Ptr, b.Ptr+4, 4, fairgo.Float32, fairgo.Sum, s)},
		{"all-gather not in place", cm.AllGather(b.Ptr+20, b.Ptr, 4, fairgo.Float32, s)},
		{"alltoallv lengths",
			cm.AllToAllv(b.Ptr, []int64{1}, []int64{0}, b.Ptr+32, []int64{1, 1}, []int64{0, 1}, fairgo.Float32, s)},
		{"alltoallv negative",
			cm.AllToAllv(b.Ptr, []int64{1, -1}, []int64{0, 0}, b.Ptr+32, []int64{1, 1}, []int64{0, 1}, fairgo.Float32, s)},
		{"alltoallv overlapping receives",
			cm.AllToAllv(b.Ptr, []int64{2, 2}, []int64{0, 0}, b.Ptr+32, []int64{2, 2}, []int64{0, 1}, fairgo.Float32, s)},
	} {
		require.ErrorIs(t, tc.err, fairgo.ErrInvalidArgument, tc.name)
	}
	require.Equal(t, uint64(0), cm.Seq(), "rejected calls take no sequence number")
	// In place is accepted.
	require.NoError(t, cm.ReduceScatter(b.Ptr, b.Ptr, 4, fairgo.Float32, fairgo.Sum, s))
	require.NoError(
		t,
		w.comms[1].ReduceScatter(b.Ptr, b.Ptr+16, 4, fairgo.Float32, fairgo.Sum, w.ss[1]),
	) // device 0's memory: fails when run
	errs := w.sync(t)
	require.ErrorIs(t, errs[0], ErrIllegalAddress)
	require.ErrorContains(t, errs[0], "belongs to sim device 0")
}

// With ConnectAtFirstCall a handle's first call blocks its caller until
// every handle has made one; its later calls do not block; a peer's abort
// leaves it blocked, its own ends the wait; a rank that never comes makes
// it a stall.
func TestConnectAtFirstCall(t *testing.T) {
	allReduce := func(w *world, r int) error {
		b := tensorOf(t, w.devs[r], fairgo.Float32, 1)
		return w.comms[r].AllReduce(b.Ptr, b.Ptr, 1, fairgo.Float32, fairgo.Sum, w.ss[r])
	}
	// inBackground makes rank r's call on a goroutine of its own and
	// returns its error's channel.
	inBackground := func(w *world, r int) <-chan error {
		errc := make(chan error, 1)
		go func() { errc <- allReduce(w, r) }()
		return errc
	}
	blocked := func(errc <-chan error) bool {
		select {
		case <-errc:
			return false
		case <-time.After(50 * time.Millisecond):
			return true
		}
	}

	t.Run("every rank comes", func(t *testing.T) {
		w := newWorld(t, 3, Config{StallTimeout: time.Minute, ConnectAtFirstCall: true})
		first := []<-chan error{inBackground(w, 0), inBackground(w, 1)}
		for _, errc := range first {
			require.True(t, blocked(errc), "a first call returned before every rank made one")
		}
		require.NoError(t, allReduce(w, 2))
		for _, errc := range first {
			require.NoError(t, <-errc)
		}
		for r := range 3 { // connected: the second calls return at once, one goroutine for all
			require.NoError(t, allReduce(w, r))
		}
		w.requireOK(t)
	})
	t.Run("only its own abort ends the wait", func(t *testing.T) {
		w := newWorld(t, 2, Config{StallTimeout: time.Minute, ConnectAtFirstCall: true})
		errc := inBackground(w, 0)
		require.NoError(t, w.comms[1].Abort())
		require.True(t, blocked(errc), "a peer's abort ended the wait")
		require.NoError(t, w.comms[0].Abort())
		err := <-errc
		require.ErrorIs(t, err, fairgo.ErrAborted)
		require.ErrorContains(t, err, "world rank 0: connecting at its first call: aborted by this rank")
	})
	t.Run("a rank that never comes", func(t *testing.T) {
		w := newWorld(t, 3, Config{StallTimeout: 100 * time.Millisecond, ConnectAtFirstCall: true})
		errc := inBackground(w, 1)
		err := allReduce(w, 0)
		var se *StallError
		require.ErrorAs(t, err, &se)
		require.ErrorIs(t, err, fairgo.ErrTimeout)
		require.Equal(t, []int{0, 1}, se.Arrived)
		require.Equal(t, []int{2}, se.NotCalled)
		require.ErrorIs(t, <-errc, ErrStall)
	})
	t.Run("a closed handle fails at once", func(t *testing.T) {
		w := newWorld(t, 2, Config{StallTimeout: time.Minute, ConnectAtFirstCall: true})
		require.NoError(t, w.comms[0].Close())
		require.ErrorIs(t, allReduce(w, 0), fairgo.ErrClosed)
	})
	t.Run("off: a first call returns at once", func(t *testing.T) {
		w := newWorld(t, 2, Config{StallTimeout: time.Minute})
		require.NoError(t, allReduce(w, 0))
		require.NoError(t, allReduce(w, 1))
		w.requireOK(t)
	})
}
