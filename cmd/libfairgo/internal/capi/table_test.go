package capi_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/cmd/libfairgo/internal/capi"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/reftest"
	"github.com/fairgo/fairgo/rendezvous"
	"github.com/fairgo/fairgo/sim"
)

// TestAllReduce runs allreduces through the table as a C caller would: the
// input is written by work on the caller's own stream just before the call,
// and the result is read by work enqueued on that stream just after it,
// with no wait on the host. With jitter, a missing After (the call not
// ordered after the stream) or a missing StreamWait (the stream not waiting
// for the result) shows up as a wrong result.
func TestAllReduce(t *testing.T) {
	cases := []struct {
		machines []string
		dt       fairgo.DType
		op       fairgo.Op
		count    int64
		flat     int64
	}{
		{[]string{"a", "a", "b", "b"}, fairgo.Float32, fairgo.Avg, 10007, hier.FlatNever},
		{[]string{"a", "b", "a", "b"}, fairgo.BFloat16, fairgo.Sum, 4099, hier.FlatNever},
		{[]string{"a", "a", "a"}, fairgo.Int64, fairgo.Max, 333, 0},
		{[]string{"x", "y"}, fairgo.Float16, fairgo.Avg, 1025, hier.FlatNever},
		{[]string{"a", "a", "b", "b"}, fairgo.Uint8, fairgo.Min, 17, 0},
		{[]string{"solo"}, fairgo.Float64, fairgo.Prod, 100, 0},
	}
	for i, c := range cases {
		t.Run(fmt.Sprintf("%dranks/%v/%v", len(c.machines), c.dt, c.op), func(t *testing.T) {
			f := newFixture(t, sim.Config{Seed: int64(i + 1), Jitter: 200 * time.Microsecond})
			w := len(c.machines)
			o := capi.DefaultOptions()
			o.SliceBytes, o.FlatThreshold = 2048, c.flat
			ids := f.initRanks(c.machines, o)
			for p, id := range ids {
				info, err := f.tbl.Info(id)
				require.NoError(t, err)
				require.Equal(t, p, info.Rank)
				require.Equal(t, w, info.WorldSize)
				require.Equal(t, w, info.Machines*info.Devices)
			}
			inputs := reftest.RandomInputs(rand.New(rand.NewPCG(uint64(i), 9)), c.dt, c.op, w, int(c.count))
			ref := reftest.ComputeReference(c.dt, c.op, inputs)
			outputs := make([][]byte, w)
			ctx := ctxFor(t, 30*time.Second)
			errs := spawn(w, func(p int) error {
				dev := f.device(ids[p])
				handle, caller := f.b.register(t, dev)
				src, buf, out := alloc(t, dev, c.count, c.dt), alloc(t, dev, c.count, c.dt),
					alloc(t, dev, c.count, c.dt)
				if err := stageInput(dev, caller, src, buf, inputs[p]); err != nil {
					return err
				}
				wid, err := f.tbl.AllReduce(ids[p], buf.Ptr, c.count, c.dt, c.op, handle)
				if err != nil {
					return err
				}
				if outputs[p], err = readBack(ctx, dev, caller, buf, out, len(inputs[p])); err != nil {
					return err
				}
				if err := f.tbl.Wait(wid, 10*time.Second); err != nil {
					return err
				}
				done, err := f.tbl.Test(wid)
				if !done || err != nil {
					return fmt.Errorf("Test after Wait: done %v, err %v", done, err)
				}
				return f.tbl.FreeWork(wid)
			})
			require.NoError(t, errors.Join(errs...))
			require.NoError(t, reftest.CheckResults(c.dt, ref, outputs))
			comms, works, _ := f.tbl.Handles()
			require.Equal(t, w, comms)
			require.Zero(t, works, "every work handle was freed")
		})
	}
}

// TestAllReduceAsync: the asynchronous call is ordered after the caller's
// stream but leaves it free (rank 0's stream drains while rank 1 has not
// called yet, so its reduction cannot have run), and StreamWait then makes
// the stream wait for the result: work enqueued after it reads the reduced
// data. A missing After or a stream wait that does not hold shows up as a
// wrong result under jitter; a stream made to wait at the call shows up as
// a stream that never drains. Bad handles and streams fail typed.
func TestAllReduceAsync(t *testing.T) {
	// Through the engine (slices of a hierarchical route), and inline (one
	// flat piece, which a synchronous call runs on the caller's stream).
	t.Run("engine", func(t *testing.T) {
		o := capi.DefaultOptions()
		o.SliceBytes, o.FlatThreshold = 2048, hier.FlatNever
		testAllReduceAsync(t, []string{"a", "a", "b", "b"}, o, 5003)
	})
	t.Run("inline", func(t *testing.T) {
		o := capi.DefaultOptions()
		o.Algorithm = hier.Flat
		testAllReduceAsync(t, []string{"a", "a", "a", "a"}, o, 1001)
	})
}

func testAllReduceAsync(t *testing.T, machines []string, o capi.Options, count int) {
	f := newFixture(t, sim.Config{Seed: 11, Jitter: 200 * time.Microsecond, StallTimeout: time.Minute})
	ids := f.initRanks(machines, o)
	dt, op := fairgo.Float32, fairgo.Sum
	w := len(machines)
	inputs := reftest.RandomInputs(rand.New(rand.NewPCG(11, 3)), dt, op, w, count)
	ref := reftest.ComputeReference(dt, op, inputs)
	outputs := make([][]byte, w)
	ctx := ctxFor(t, 30*time.Second)
	called := make(chan struct{})
	errs := spawn(w, func(p int) error {
		dev := f.device(ids[p])
		handle, caller := f.b.register(t, dev)
		src, buf, out := alloc(t, dev, int64(count), dt), alloc(t, dev, int64(count), dt), alloc(t, dev, int64(count), dt)
		if err := stageInput(dev, caller, src, buf, inputs[p]); err != nil {
			return err
		}
		if p != 0 {
			<-called // rank 0's stream has drained with its call pending
		}
		wid, err := f.tbl.AllReduceAsync(ids[p], buf.Ptr, int64(count), dt, op, handle)
		if err != nil {
			return err
		}
		if p == 0 {
			drain, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := caller.Synchronize(drain)
			cancel()
			done, testErr := f.tbl.Test(wid)
			close(called) // the others call now, whatever rank 0 found
			if err != nil {
				return fmt.Errorf("the caller's stream waits for an asynchronous call: %w", err)
			}
			if done || testErr != nil {
				return fmt.Errorf("rank 0's call completed alone: done %v, err %v", done, testErr)
			}
		}
		if err := f.tbl.StreamWait(wid, handle); err != nil {
			return err
		}
		if err := f.tbl.StreamWait(wid, handle); err != nil { // a second wait adds nothing
			return err
		}
		if outputs[p], err = readBack(ctx, dev, caller, buf, out, len(inputs[p])); err != nil {
			return err
		}
		if err := f.tbl.Wait(wid, 10*time.Second); err != nil {
			return err
		}
		return f.tbl.FreeWork(wid)
	})
	require.NoError(t, errors.Join(errs...))
	require.NoError(t, reftest.CheckResults(dt, ref, outputs))

	// Every rank refuses a call on a stream it does not know (alike: nothing
	// breaks), then makes a valid one and waits on a stream of another
	// device (refused, the work unharmed) and on its own.
	other := f.device(ids[2])
	otherHandle, _ := f.b.register(t, other)
	var wid int64
	errs = spawn(w, func(p int) error {
		dev := f.device(ids[p])
		h, _ := f.b.register(t, dev)
		bad, err := f.tbl.AllReduceAsync(ids[p], 0, 0, dt, op, 0x1)
		if code(err) != capi.InvalidArgument || bad != 0 {
			return fmt.Errorf("an unknown stream: handle %d, %v", bad, err)
		}
		buf := alloc(t, dev, 64, dt)
		id, err := f.tbl.AllReduceAsync(ids[p], buf.Ptr, 64, dt, op, h)
		if err != nil {
			return err
		}
		if p == 0 {
			wid = id
			if err := f.tbl.StreamWait(id, otherHandle); code(err) != capi.InvalidArgument {
				return fmt.Errorf("a stream of another device: %v", err)
			}
		}
		if err := f.tbl.StreamWait(id, h); err != nil {
			return err
		}
		if err := f.tbl.Wait(id, 10*time.Second); err != nil {
			return err
		}
		return f.tbl.FreeWork(id)
	})
	require.NoError(t, errors.Join(errs...))
	for name, err := range map[string]error{
		"freed":        f.tbl.StreamWait(wid, otherHandle),
		"never issued": f.tbl.StreamWait(123456, otherHandle),
		"comm id":      f.tbl.StreamWait(ids[0], otherHandle),
	} {
		require.Equal(t, capi.BadHandle, code(err), "%s: %v", name, err)
		require.ErrorIs(t, err, capi.ErrBadHandle, name)
	}
}

// TestAlgorithm: fairgo_comm_algorithm's answer is the same on every rank:
// flat by rule below the flat threshold, Auto's guess (not settled) for a
// size class no call has reached, and what Auto measured once a call has;
// bad input fails typed.
func TestAlgorithm(t *testing.T) {
	f := newFixture(t, sim.Config{Seed: 3})
	machines := []string{"a", "a", "b", "b"}
	ids := f.initRanks(machines, capi.DefaultOptions())
	const small, big = 1 << 10, 300 << 10
	for _, id := range ids {
		a, settled, err := f.tbl.Algorithm(id, small)
		require.NoError(t, err)
		require.Equal(t, hier.Flat, a)
		require.True(t, settled, "below the flat threshold by rule")
		_, settled, err = f.tbl.Algorithm(id, big)
		require.NoError(t, err)
		require.False(t, settled, "no call of that size yet")
	}
	count := int64(big / 4)
	errs := spawn(len(ids), func(p int) error {
		dev := f.device(ids[p])
		handle, caller := f.b.register(t, dev)
		buf := alloc(t, dev, count, fairgo.Float32)
		wid, err := f.tbl.AllReduce(ids[p], buf.Ptr, count, fairgo.Float32, fairgo.Sum, handle)
		if err != nil {
			return err
		}
		if err := caller.Synchronize(ctxFor(t, 30*time.Second)); err != nil {
			return err
		}
		if err := f.tbl.Wait(wid, 10*time.Second); err != nil {
			return err
		}
		return f.tbl.FreeWork(wid)
	})
	require.NoError(t, errors.Join(errs...))
	first, settled, err := f.tbl.Algorithm(ids[0], big)
	require.NoError(t, err)
	require.True(t, settled, "measured by the call")
	r, err := f.tbl.Reducer(ids[0])
	require.NoError(t, err)
	require.Equal(t, r.AlgorithmFor(big), first)
	for _, id := range ids[1:] {
		a, settled, err := f.tbl.Algorithm(id, big)
		require.NoError(t, err)
		require.True(t, settled)
		require.Equal(t, first, a, "every rank alike")
	}
	_, _, err = f.tbl.Algorithm(ids[0], -1)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	_, _, err = f.tbl.Algorithm(12345, small)
	require.ErrorIs(t, err, capi.ErrBadHandle, "a handle that is no communicator")
}

// TestInitFromEnv: Init reads the launch environment (torchrun's
// variables) and finds the grid; an explicit device is accepted.
func TestInitFromEnv(t *testing.T) {
	f := newFixture(t, sim.Config{Seed: 5})
	machines := []string{"m1", "m0", "m1", "m0"}
	ids := make([]int64, len(machines))
	errs := spawn(len(machines), func(p int) error {
		o := capi.DefaultOptions()
		if p == 0 {
			o.Device = 0
		}
		var err error
		ids[p], err = f.tbl.Init(procOptions(machines, p, o))
		return err
	})
	require.NoError(t, errors.Join(errs...))
	for p, id := range ids {
		info, err := f.tbl.Info(id)
		require.NoError(t, err)
		// Machines are numbered by their smallest rank: m1 is machine 0.
		want := capi.Info{Rank: p, WorldSize: 4, Machines: 2, Devices: 2, Machine: p % 2, Local: p / 2, Device: -1}
		require.Equal(t, want, info, "rank %d", p)
	}
}

// TestInitErrors: every way init can fail gives its result code and says
// what is wrong.
func TestInitErrors(t *testing.T) {
	two := []string{"a", "a"}
	cases := []struct {
		name   string
		launch *rendezvous.Launch // nil: Init from an empty environment
		opts   func(*capi.Options)
		noEnv  bool
		want   capi.Code
		text   string
	}{
		{name: "no launch environment", noEnv: true, want: capi.InvalidArgument, text: "no launch environment"},
		{
			name:   "rank outside world",
			launch: &rendezvous.Launch{Rank: 2, WorldSize: 2, LocalWorldSize: 1},
			want:   capi.InvalidArgument,
			text:   "Rank",
		},
		{
			name:   "local world too large",
			launch: &rendezvous.Launch{Rank: 0, WorldSize: 1, LocalWorldSize: 2},
			want:   capi.InvalidArgument,
			text:   "LocalWorldSize",
		},
		{name: "negative init timeout", launch: &rendezvous.Launch{WorldSize: 1, LocalWorldSize: 1},
			opts: func(o *capi.Options) { o.InitTimeout = -time.Second }, want: capi.InvalidArgument, text: "init_timeout_ms"},
		{name: "negative op timeout", launch: &rendezvous.Launch{WorldSize: 1, LocalWorldSize: 1},
			opts: func(o *capi.Options) { o.OpTimeout = -time.Second }, want: capi.InvalidArgument, text: "op_timeout_ms"},
		{name: "negative slice", launch: &rendezvous.Launch{WorldSize: 1, LocalWorldSize: 1},
			opts: func(o *capi.Options) { o.SliceBytes = -1 }, want: capi.InvalidArgument, text: "slice_bytes"},
		{name: "flat threshold", launch: &rendezvous.Launch{WorldSize: 1, LocalWorldSize: 1},
			opts: func(o *capi.Options) { o.FlatThreshold = -7 }, want: capi.InvalidArgument, text: "flat_threshold_bytes"},
		{name: "unknown algorithm", launch: &rendezvous.Launch{WorldSize: 1, LocalWorldSize: 1},
			opts: func(o *capi.Options) { o.Algorithm = 99 }, want: capi.InvalidArgument, text: "config algorithm"},
		{name: "device below -1", launch: &rendezvous.Launch{WorldSize: 1, LocalWorldSize: 1},
			opts: func(o *capi.Options) { o.Device = -2 }, want: capi.InvalidArgument, text: "config device"},
		{name: "peer never joins", launch: ptr(launch(two, 0)),
			opts: func(o *capi.Options) { o.InitTimeout = 300 * time.Millisecond }, want: capi.Timeout, text: "init"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, sim.Config{})
			o := procOptions(two, 0, capi.DefaultOptions())
			if c.noEnv {
				o = capi.DefaultOptions()
				o.Setup = append(o.Setup, setupEnv(func(string) (string, bool) { return "", false }))
			}
			if c.opts != nil {
				c.opts(&o)
			}
			var err error
			if c.launch == nil {
				_, err = f.tbl.Init(o)
			} else {
				_, err = f.tbl.InitRank(*c.launch, o)
			}
			require.Error(t, err)
			require.Equal(t, c.want, code(err), "%v", err)
			require.Contains(t, err.Error(), c.text)
			comms, _, _ := f.tbl.Handles()
			require.Zero(t, comms)
		})
	}
	t.Run("world of 2 without a store", func(t *testing.T) {
		b := newSimBackend(sim.Config{})
		defer b.Close()
		tbl := capi.NewTable(capi.Config{Backend: b, Classes: classes}) // no Config.Store
		_, err := tbl.InitRank(launch(two, 0), procOptions(two, 0, capi.DefaultOptions()))
		require.Equal(t, capi.InvalidArgument, code(err), "%v", err)
		require.Contains(t, err.Error(), "store")
	})
	t.Run("no backend", func(t *testing.T) {
		_, err := capi.NewTable(capi.Config{}).Init(capi.DefaultOptions())
		require.Equal(t, capi.Internal, code(err), "%v", err)
	})
}

func ptr[T any](v T) *T { return &v }

// TestInitConfigInvalid: init passes the settings that are hier options to
// hier.ValidateOptions and reports the one it rejects by its
// fairgo_config_t field, with the value as the C caller wrote it, hier's
// reason and fairgo.ErrInvalidArgument; it judges the C ABI's own settings
// (init_timeout_ms, device) itself.
func TestInitConfigInvalid(t *testing.T) {
	cases := []struct {
		name   string
		set    func(*capi.Options)
		arg    string
		value  any
		reason string // "": only checked to be given
	}{
		{"slice_bytes -1", func(o *capi.Options) { o.SliceBytes = -1 },
			"config slice_bytes", int64(-1), hierReason(t, hier.WithSliceSize(-1))},
		{"flat_threshold_bytes -7", func(o *capi.Options) { o.FlatThreshold = -7 },
			"config flat_threshold_bytes", int64(-7), hierReason(t, hier.WithFlatThreshold(-7))},
		{"algorithm 99", func(o *capi.Options) { o.Algorithm = 99 },
			"config algorithm", 99, hierReason(t, hier.WithAlgorithm(99))},
		{"algorithm -1", func(o *capi.Options) { o.Algorithm = -1 },
			"config algorithm", -1, hierReason(t, hier.WithAlgorithm(-1))},
		{"op_timeout_ms -1500", func(o *capi.Options) { o.OpTimeout = -1500 * time.Millisecond },
			"config op_timeout_ms", int64(-1500), hierReason(t, hier.WithTimeout(-1500*time.Millisecond))},
		{"init_timeout_ms -1000", func(o *capi.Options) { o.InitTimeout = -time.Second },
			"config init_timeout_ms", int64(-1000), ""},
		{"device -2", func(o *capi.Options) { o.Device = -2 }, "config device", -2, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, sim.Config{})
			o := capi.DefaultOptions()
			c.set(&o)
			_, err := f.tbl.InitRank(rendezvous.Launch{WorldSize: 1, LocalWorldSize: 1}, o)
			require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
			require.Equal(t, capi.InvalidArgument, code(err), "%v", err)
			var bad *fairgo.ArgError
			require.ErrorAs(t, err, &bad)
			require.Equal(t, c.arg, bad.Arg)
			require.Equal(t, c.value, bad.Value)
			if c.reason != "" {
				require.Equal(t, c.reason, bad.Reason)
			}
			require.NotEmpty(t, bad.Reason)
			require.NotContains(t, err.Error(), "With", "the error names the C field, not hier's option")
			comms, _, _ := f.tbl.Handles()
			require.Zero(t, comms)
		})
	}
}

// TestAllReduceErrors: arguments the call rejects before enqueueing
// anything, with the code and text the C caller gets.
func TestAllReduceErrors(t *testing.T) {
	f := newFixture(t, sim.Config{Seed: 2})
	ids := f.initRanks([]string{"solo"}, capi.DefaultOptions())
	dev := f.device(ids[0])
	handle, _ := f.b.register(t, dev)
	buf := alloc(t, dev, 64, fairgo.Float32)
	cases := []struct {
		name   string
		comm   int64
		ptr    uintptr
		count  int64
		dt     fairgo.DType
		op     fairgo.Op
		stream uintptr
		want   capi.Code
		text   string
	}{
		{"bad comm", 999, buf.Ptr, 64, fairgo.Float32, fairgo.Sum, handle, capi.BadHandle, "communicator handle 999"},
		{"dtype zero", ids[0], buf.Ptr, 64, 0, fairgo.Sum, handle, capi.InvalidArgument, "dtype"},
		{"dtype unknown", ids[0], buf.Ptr, 64, 99, fairgo.Sum, handle, capi.InvalidArgument, "dtype"},
		{"op zero", ids[0], buf.Ptr, 64, fairgo.Float32, 0, handle, capi.InvalidArgument, "op"},
		{"op unknown", ids[0], buf.Ptr, 64, fairgo.Float32, 42, handle, capi.InvalidArgument, "op"},
		{"negative count", ids[0], buf.Ptr, -1, fairgo.Float32, fairgo.Sum, handle, capi.InvalidArgument, "count"},
		{"huge count", ids[0], buf.Ptr, 1 << 62, fairgo.Float64, fairgo.Sum, handle, capi.InvalidArgument, "count"},
		{"null pointer", ids[0], 0, 64, fairgo.Float32, fairgo.Sum, handle, capi.InvalidArgument, "ptr"},
		{"unknown stream", ids[0], buf.Ptr, 64, fairgo.Float32, fairgo.Sum, 0xdead, capi.InvalidArgument, "stream"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wid, err := f.tbl.AllReduce(c.comm, c.ptr, c.count, c.dt, c.op, c.stream)
			require.Error(t, err)
			require.Zero(t, wid)
			require.Equal(t, c.want, code(err), "%v", err)
			require.Contains(t, err.Error(), c.text)
		})
	}
	t.Run("memory of no device", func(t *testing.T) {
		// Caught by the engine (CheckRange) once the call is made: the
		// work fails at once and AllReduce reports it.
		_, err := f.tbl.AllReduce(ids[0], 0x10, 64, fairgo.Float32, fairgo.Sum, handle)
		require.Equal(t, capi.InvalidArgument, code(err), "%v", err)
	})
	t.Run("zero elements", func(t *testing.T) {
		wid, err := f.tbl.AllReduce(ids[0], 0, 0, fairgo.Float32, fairgo.Sum, handle)
		require.NoError(t, err)
		require.NoError(t, f.tbl.Wait(wid, time.Second))
		// A zero timeout on complete work is OK every time (never a race
		// with the timer).
		for range 1000 {
			require.NoError(t, f.tbl.Wait(wid, 0))
		}
		require.NoError(t, f.tbl.FreeWork(wid))
	})
}

// TestWorkHandles: test/wait on pending work, NotReady, bad and freed
// handles, double free, negative timeouts.
func TestWorkHandles(t *testing.T) {
	f := newFixture(t, sim.Config{Seed: 3, StallTimeout: time.Minute})
	machines := []string{"a", "a"}
	ids := f.initRanks(machines, capi.DefaultOptions())
	bufs := make([]fairgo.Tensor, 2)
	handles := make([]uintptr, 2)
	for p, id := range ids {
		dev := f.device(id)
		handles[p], _ = f.b.register(t, dev)
		bufs[p] = alloc(t, dev, 256, fairgo.Float32)
	}
	// Rank 0 calls alone: its work cannot complete until rank 1 calls.
	w0, err := f.tbl.AllReduce(ids[0], bufs[0].Ptr, 256, fairgo.Float32, fairgo.Sum, handles[0])
	require.NoError(t, err)
	done, err := f.tbl.Test(w0)
	require.NoError(t, err)
	require.False(t, done)
	start := time.Now()
	err = f.tbl.Wait(w0, 50*time.Millisecond)
	require.Equal(t, capi.NotReady, code(err), "%v", err)
	require.ErrorIs(t, err, capi.ErrNotReady)
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	require.Equal(t, capi.InvalidArgument, code(f.tbl.Wait(w0, -time.Millisecond)))

	w1, err := f.tbl.AllReduce(ids[1], bufs[1].Ptr, 256, fairgo.Float32, fairgo.Sum, handles[1])
	require.NoError(t, err)
	require.NotEqual(t, w0, w1)
	for _, w := range []int64{w0, w1} {
		require.NoError(t, f.tbl.Wait(w, 10*time.Second))
		done, err := f.tbl.Test(w)
		require.NoError(t, err)
		require.True(t, done)
	}

	require.NoError(t, f.tbl.FreeWork(w0))
	for name, err := range map[string]error{
		"double free":          f.tbl.FreeWork(w0),
		"wait on freed":        f.tbl.Wait(w0, time.Millisecond),
		"test on freed":        second(f.tbl.Test(w0)),
		"never issued":         f.tbl.FreeWork(123456),
		"zero":                 f.tbl.FreeWork(0),
		"comm id as work":      f.tbl.FreeWork(ids[0]),
		"work id as comm":      second(f.tbl.Info(w1)),
		"work id as store":     f.tbl.CloseStore(w1),
		"allreduce on work id": second(f.tbl.AllReduce(w1, bufs[0].Ptr, 1, fairgo.Float32, fairgo.Sum, handles[0])),
	} {
		require.Equal(t, capi.BadHandle, code(err), "%s: %v", name, err)
		require.ErrorIs(t, err, capi.ErrBadHandle, name)
	}
	require.NoError(t, f.tbl.FreeWork(w1))
}

func second[A any](_ A, err error) error { return err }

// TestWorkErrors: the codes of work that fails on the device: ranks that
// disagree (mismatch), a peer that never calls (the watchdog's timeout),
// calls after the communicators were aborted, and work pending when its
// communicator is closed.
func TestWorkErrors(t *testing.T) {
	t.Run("mismatch", func(t *testing.T) {
		f := newFixture(t, sim.Config{Seed: 4})
		ids := f.initRanks([]string{"a", "a"}, capi.DefaultOptions())
		ops := []fairgo.Op{fairgo.Sum, fairgo.Max}
		errs := spawn(2, func(p int) error {
			dev := f.device(ids[p])
			h, _ := f.b.register(t, dev)
			buf := alloc(t, dev, 64, fairgo.Float32)
			wid, err := f.tbl.AllReduce(ids[p], buf.Ptr, 64, fairgo.Float32, ops[p], h)
			if err != nil {
				return err
			}
			defer f.tbl.FreeWork(wid)
			return f.tbl.Wait(wid, 10*time.Second)
		})
		for p, err := range errs {
			require.Equal(t, capi.Mismatch, code(err), "rank %d: %v", p, err)
			require.ErrorIs(t, err, fairgo.ErrMismatch)
		}
	})
	t.Run("timeout, then aborted", func(t *testing.T) {
		f := newFixture(t, sim.Config{Seed: 5, StallTimeout: time.Minute})
		o := capi.DefaultOptions()
		o.OpTimeout = 300 * time.Millisecond
		ids := f.initRanks([]string{"a", "b"}, o)
		dev := f.device(ids[0])
		h, _ := f.b.register(t, dev)
		buf := alloc(t, dev, 64, fairgo.Float32)
		wid, err := f.tbl.AllReduce(ids[0], buf.Ptr, 64, fairgo.Float32, fairgo.Sum, h)
		require.NoError(t, err)
		err = f.tbl.Wait(wid, 20*time.Second)
		require.Equal(t, capi.Timeout, code(err), "%v", err)
		require.ErrorIs(t, err, fairgo.ErrTimeout)
		require.NoError(t, f.tbl.FreeWork(wid))
		// The watchdog aborted rank 0's communicators: later calls fail at
		// once, closed, with the cause.
		_, err = f.tbl.AllReduce(ids[0], buf.Ptr, 64, fairgo.Float32, fairgo.Sum, h)
		require.Equal(t, capi.Closed, code(err), "%v", err)
		require.ErrorIs(t, err, fairgo.ErrTimeout)
		// Rank 1's call meets a communicator its peer aborted.
		dev1 := f.device(ids[1])
		h1, _ := f.b.register(t, dev1)
		buf1 := alloc(t, dev1, 64, fairgo.Float32)
		wid1, err := f.tbl.AllReduce(ids[1], buf1.Ptr, 64, fairgo.Float32, fairgo.Sum, h1)
		if err == nil {
			err = f.tbl.Wait(wid1, 20*time.Second)
			require.NoError(t, f.tbl.FreeWork(wid1))
		}
		// It learnt of the timeout through the board: closed (a broken
		// communicator) or aborted, the cause a timeout either way.
		require.Contains(t, []capi.Code{capi.Aborted, capi.Timeout, capi.Closed}, code(err), "%v", err)
		require.ErrorIs(t, err, fairgo.ErrTimeout)
	})
	t.Run("close with work pending", func(t *testing.T) {
		f := newFixture(t, sim.Config{Seed: 6, StallTimeout: time.Minute})
		ids := f.initRanks([]string{"a", "a"}, capi.DefaultOptions())
		dev := f.device(ids[0])
		h, _ := f.b.register(t, dev)
		buf := alloc(t, dev, 4096, fairgo.Float32)
		wid, err := f.tbl.AllReduce(ids[0], buf.Ptr, 4096, fairgo.Float32, fairgo.Avg, h)
		require.NoError(t, err)
		done, err := f.tbl.Test(wid)
		require.NoError(t, err)
		require.False(t, done)
		_ = f.tbl.Close(ids[0]) // may report the abort of the pending work
		// The work handle outlives its communicator and reports the close.
		err = f.tbl.Wait(wid, 20*time.Second)
		require.Equal(t, capi.Closed, code(err), "%v", err)
		done, err = f.tbl.Test(wid)
		require.True(t, done)
		require.Equal(t, capi.Closed, code(err))
		require.NoError(t, f.tbl.FreeWork(wid))
		// The handle is gone: a second close and later calls are bad handles.
		require.Equal(t, capi.BadHandle, code(f.tbl.Close(ids[0])))
		_, err = f.tbl.AllReduce(ids[0], buf.Ptr, 1, fairgo.Float32, fairgo.Sum, h)
		require.Equal(t, capi.BadHandle, code(err))
	})
	t.Run("closed reducer", func(t *testing.T) {
		f := newFixture(t, sim.Config{Seed: 7})
		ids := f.initRanks([]string{"solo"}, capi.DefaultOptions())
		dev := f.device(ids[0])
		h, _ := f.b.register(t, dev)
		r, err := f.tbl.Reducer(ids[0])
		require.NoError(t, err)
		require.NoError(t, r.Close()) // closed behind the table's back
		_, err = f.tbl.AllReduce(ids[0], 0, 0, fairgo.Float32, fairgo.Sum, h)
		require.Equal(t, capi.Closed, code(err), "%v", err)
	})
}

// TestGuard: a panic anywhere behind an entry point becomes an Internal
// error with the panic's text, never a crash.
func TestGuard(t *testing.T) {
	err := capi.Guard(func() error { panic("boom") })
	require.Equal(t, capi.Internal, code(err))
	require.Contains(t, err.Error(), "boom")
	require.NoError(t, capi.Guard(func() error { return nil }))
	sentinel := errors.New("plain")
	require.Equal(t, sentinel, capi.Guard(func() error { return sentinel }))

	f := newFixture(t, sim.Config{})
	ids := f.initRanks([]string{"solo"}, capi.DefaultOptions())
	f.b.panics = true
	err = capi.Guard(func() error {
		_, err := f.tbl.AllReduce(ids[0], 0, 0, fairgo.Float32, fairgo.Sum, 0)
		return err
	})
	require.Equal(t, capi.Internal, code(err), "%v", err)
	require.Contains(t, err.Error(), "told to panic")
	f.b.panics = false
	// The table still works after the panic.
	_, err = f.tbl.Info(ids[0])
	require.NoError(t, err)
}

// TestServeStore: a store served by the table lets ranks meet with only
// its address (InitRank's store_addr), as rank 0 hosts it under torchrun.
func TestServeStore(t *testing.T) {
	b := newSimBackend(sim.Config{Seed: 8})
	defer b.Close()
	tbl := capi.NewTable(capi.Config{Backend: b, Classes: classes})
	defer func() { require.NoError(t, tbl.CloseAll()) }()
	sid, addr, err := tbl.ServeStore("127.0.0.1:0")
	require.NoError(t, err)
	require.NotEmpty(t, addr)
	machines := []string{"a", "b"}
	ids := make([]int64, 2)
	errs := spawn(2, func(p int) error {
		l := launch(machines, p)
		l.StoreAddr = addr
		var err error
		ids[p], err = tbl.InitRank(l, procOptions(machines, p, capi.DefaultOptions()))
		return err
	})
	require.NoError(t, errors.Join(errs...))
	info, err := tbl.Info(ids[1])
	require.NoError(t, err)
	require.Equal(t, 2, info.Machines)
	require.NoError(t, tbl.CloseStore(sid))
	require.Equal(t, capi.BadHandle, code(tbl.CloseStore(sid)))
	_, _, err = tbl.ServeStore("256.0.0.1:x")
	require.Error(t, err)
	require.NotEqual(t, capi.OK, code(err))
	for _, id := range ids {
		require.NoError(t, tbl.Close(id))
	}
}

// TestClassify: the mapping from Go errors to result codes.
func TestClassify(t *testing.T) {
	cs := capi.Classes{
		Mismatch: []error{sim.ErrMismatch},
		Backend:  []capi.Class{capi.Is(errCUDA, capi.CUDA), capi.Is(errNCCL, capi.NCCL)},
	}
	wrap := func(err error) error { return fmt.Errorf("context: %w", err) }
	cases := []struct {
		err  error
		want capi.Code
	}{
		{nil, capi.OK},
		{&capi.Error{Code: capi.NotReady, Err: capi.ErrNotReady}, capi.NotReady},
		{wrap(&capi.Error{Code: capi.BadHandle, Err: capi.ErrBadHandle}), capi.BadHandle},
		{wrap(&fairgo.ArgError{Arg: "x"}), capi.InvalidArgument},
		{wrap(fairgo.ErrUnknownDType), capi.InvalidArgument},
		{wrap(rendezvous.ErrNoLaunchEnv), capi.InvalidArgument},
		{wrap(&sim.MismatchError{}), capi.Mismatch},
		// The root cause wins over the abort it led to.
		{fmt.Errorf("%w: %w", fairgo.ErrAborted, &sim.MismatchError{}), capi.Mismatch},
		{wrap(fairgo.ErrTimeout), capi.Timeout},
		{wrap(context.DeadlineExceeded), capi.Timeout},
		{fmt.Errorf("%w (%w)", fairgo.ErrTimeout, errNCCL), capi.Timeout},
		{wrap(fairgo.ErrAborted), capi.Aborted},
		{wrap(context.Canceled), capi.Aborted},
		{wrap(fairgo.ErrClosed), capi.Closed},
		// Of timeout, closed and aborted, the first named wins.
		{fmt.Errorf("%w (%w)", fairgo.ErrClosed, fairgo.ErrAborted), capi.Closed},
		{fmt.Errorf("%w (%w)", fairgo.ErrAborted, fairgo.ErrClosed), capi.Aborted},
		{errors.Join(wrap(context.Canceled), fairgo.ErrTimeout), capi.Aborted},
		{uncomparable{[]int{1}}, capi.System},
		{wrap(errCUDA), capi.CUDA},
		{fmt.Errorf("%w %w", errCUDA, fairgo.ErrInvalidArgument), capi.CUDA},
		{wrap(errNCCL), capi.NCCL},
		{errors.New("connection refused"), capi.System},
		{wrap(fmt.Errorf("cuda: no GPU: %w", fairgo.ErrNoDevice)), capi.NoDevice},
		{errors.Join(fairgo.ErrNoDevice, errCUDA), capi.NoDevice},
	}
	for _, c := range cases {
		require.Equal(t, c.want, cs.Classify(c.err), "%v", c.err)
	}
	for _, c := range capi.Codes {
		require.Regexp(t, `^FAIRGO_(OK|NOT_READY|ERR_[A-Z_]+)$`, c.String())
	}
	require.Equal(t, "fairgo_result_t(99)", capi.Code(99).String())
}

// uncomparable is an error value whose type cannot be compared with ==.
type uncomparable struct{ s []int }

func (uncomparable) Error() string { return "uncomparable" }

var (
	errCUDA = errors.New("cuda: driver error")
	errNCCL = errors.New("nccl: remote error")
)

// TestConcurrentCalls: many goroutines per rank issuing calls and freeing
// handles while others test them (the race detector checks the table).
func TestConcurrentCalls(t *testing.T) {
	f := newFixture(t, sim.Config{Seed: 9})
	ids := f.initRanks([]string{"a", "a"}, capi.DefaultOptions())
	const calls = 20
	errs := spawn(2, func(p int) error {
		dev := f.device(ids[p])
		h, caller := f.b.register(t, dev)
		buf := alloc(t, dev, 100, fairgo.Int32)
		if err := dev.Upload(buf.Ptr, make([]byte, 400)); err != nil {
			return err
		}
		var wids []int64
		for range calls {
			wid, err := f.tbl.AllReduce(ids[p], buf.Ptr, 100, fairgo.Int32, fairgo.Sum, h)
			if err != nil {
				return err
			}
			wids = append(wids, wid)
			go func() { _, _ = f.tbl.Test(wid) }()
		}
		for _, wid := range wids {
			if err := f.tbl.Wait(wid, 10*time.Second); err != nil {
				return err
			}
			if err := f.tbl.FreeWork(wid); err != nil {
				return err
			}
		}
		return caller.Synchronize(context.Background())
	})
	require.NoError(t, errors.Join(errs...))
}

// A call one rank refuses through the C ABI (a bad argument or stream)
// takes its place in the call order: that rank gets InvalidArgument, its
// peers Mismatch at once with an error that names the rank, the call and
// the reason (the job's store is the Reducers' Board), instead of waiting
// for a call that never comes.
func TestRefusedOnOneRank(t *testing.T) {
	for _, c := range []struct {
		name   string
		dt     fairgo.DType
		op     fairgo.Op
		stream bool // an unknown stream on the refusing rank
		reason string
	}{
		{"unknown dtype", 99, fairgo.Sum, false, "unknown element type"},
		{"unknown op", fairgo.Float32, 42, false, "unknown reduction operator"},
		{"unknown stream", fairgo.Float32, fairgo.Sum, true, "stream 0xdead"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, sim.Config{Seed: 3, StallTimeout: time.Minute})
			ids := f.initRanks([]string{"a", "b"}, capi.DefaultOptions())
			start := time.Now()
			errs := spawn(2, func(p int) error {
				dev := f.device(ids[p])
				handle, _ := f.b.register(t, dev)
				buf := alloc(t, dev, 256, fairgo.Float32)
				if p == 1 { // the refusing rank
					stream := handle
					if c.stream {
						stream = 0xdead
					}
					_, err := f.tbl.AllReduce(ids[p], buf.Ptr, 256, c.dt, c.op, stream)
					return err
				}
				wid, err := f.tbl.AllReduce(ids[p], buf.Ptr, 256, fairgo.Float32, fairgo.Sum, handle)
				if err != nil { // the failure may come before the call returns
					return err
				}
				return f.tbl.Wait(wid, 20*time.Second)
			})
			require.Less(t, time.Since(start), 10*time.Second)
			require.Equal(t, capi.InvalidArgument, code(errs[1]), "%v", errs[1])
			require.Contains(t, errs[1].Error(), c.reason)
			require.Equal(t, capi.Mismatch, code(errs[0]), "%v", errs[0])
			require.ErrorContains(t, errs[0], "rank 1 refused call 1 (allreduce of 256 float32)")
			require.ErrorContains(t, errs[0], c.reason)
		})
	}
}

// Calls every rank refuses leave nothing for Close to wait on: closing
// right after returns at once, every time.
func TestCloseAfterCallsEveryRankRefused(t *testing.T) {
	for run := range 10 {
		f := newFixture(t, sim.Config{Seed: int64(run)})
		ids := f.initRanks([]string{"a", "b"}, capi.DefaultOptions())
		errs := spawn(2, func(p int) error {
			dev := f.device(ids[p])
			handle, _ := f.b.register(t, dev)
			buf := alloc(t, dev, 16, fairgo.Float32)
			_, err := f.tbl.AllReduce(ids[p], buf.Ptr, 16, 99, fairgo.Sum, handle)
			return err
		})
		for p, err := range errs {
			require.Equal(t, capi.InvalidArgument, code(err), "rank %d: %v", p, err)
		}
		start := time.Now()
		errs = spawn(2, func(p int) error { return f.tbl.Close(ids[p]) })
		require.NoError(t, errors.Join(errs...))
		require.Less(t, time.Since(start), time.Second, "run %d", run)
	}
}

// stageInput uploads input to src and zeros buf, then copies src into buf on
// the caller's stream: buf holds the input only once that stream has run, as
// a trainer's gradient does.
func stageInput(dev *sim.Device, caller *sim.Stream, src, buf fairgo.Tensor, input []byte) error {
	if err := dev.Upload(src.Ptr, input); err != nil {
		return err
	}
	if err := dev.Upload(buf.Ptr, make([]byte, len(input))); err != nil {
		return err
	}
	return dev.CopyAsync(buf.Ptr, src.Ptr, int64(len(input)), caller)
}

// readBack copies n bytes of buf into out on the caller's stream, so that the
// copy reads buf in the stream's order, drains the stream and downloads out.
func readBack(ctx context.Context, dev *sim.Device, caller *sim.Stream, buf, out fairgo.Tensor, n int) ([]byte, error) {
	if err := dev.CopyAsync(out.Ptr, buf.Ptr, int64(n), caller); err != nil {
		return nil, err
	}
	if err := caller.Synchronize(ctx); err != nil {
		return nil, err
	}
	b := make([]byte, n)
	return b, dev.Download(b, out.Ptr)
}
