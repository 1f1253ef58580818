package hier_test

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/streams"
)

// deviceClock is a device that runs its collectives one after another,
// each taking lag: end is when the last one enqueued finishes.
type deviceClock struct {
	mu  sync.Mutex
	lag time.Duration
	end time.Time
}

func (c *deviceClock) launch() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); c.end.Before(now) {
		c.end = now
	}
	c.end = c.end.Add(c.lag)
}

func (c *deviceClock) due() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.end
}

// clockEvent completes when the work enqueued before its record has run
// on its clock; a query costs a clock read, not a driver call.
type clockEvent struct {
	c  *deviceClock
	at atomic.Int64 // since clockEpoch, ns
}

// clockEpoch is what clock events count from: the monotonic clock, which
// the settle is measured by too (events on the wall clock put the floor's
// mean settle at −1 µs on a GPU host).
var clockEpoch = time.Now()

func (e *clockEvent) Record(streams.Stream) error {
	e.at.Store(int64(e.c.due().Sub(clockEpoch)))
	return nil
}

func (e *clockEvent) Query() (bool, error) { return int64(time.Since(clockEpoch)) >= e.at.Load(), nil }

func (e *clockEvent) Wait(ctx context.Context) error {
	for done, _ := e.Query(); !done; done, _ = e.Query() {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// clockDevice is the null device whose events follow its clock.
type clockDevice struct {
	*nullDevice
	c *deviceClock
}

func (d clockDevice) NewEvent() (streams.Event, error) { return &clockEvent{c: d.c}, nil }

// clockComm is a null communicator whose allreduces take the clock's lag.
type clockComm struct {
	nullComm
	c *deviceClock
}

func (c clockComm) AllReduce(_, _ uintptr, _ int64, _ fairgo.DType, _ fairgo.Op, _ streams.Stream) error {
	c.c.launch()
	return nil
}

// BenchmarkWaitSettle is the host's share of a call's settle: how long
// after its device work ends a Wait returns, one call at a time, on a
// device whose allreduces take lag and whose event queries cost a clock
// read, so that what it measures is the Wait's spin, its naps (the host's
// nanosleep) and the call's finish, apart from the driver. settle-ns/op is
// the mean, settle-p99-ns the 99th percentile; "floor" polls the same
// clock without pause, for the host's own jitter.
func BenchmarkWaitSettle(b *testing.B) {
	for _, lag := range []time.Duration{30 * time.Microsecond, 200 * time.Microsecond} {
		b.Run(lag.String(), func(b *testing.B) {
			c := &deviceClock{lag: lag}
			rk := nullRank(1, 2)
			rk.Device = clockDevice{rk.Device.(*nullDevice), c}
			rk.Comms.World = clockComm{rk.Comms.World.(nullComm), c}
			ctx := context.Background()
			r, err := hier.NewReducer(ctx, rk, hier.WithCheck(false), hier.WithInlineEnqueue(true),
				hier.WithLogger(slog.New(slog.DiscardHandler)))
			require.NoError(b, err)
			b.Cleanup(func() { _ = r.Close() })
			ptr, err := rk.Device.Alloc(64 << 10)
			require.NoError(b, err)
			t := fairgo.Tensor{Ptr: ptr, Bytes: 64 << 10, Count: 16 << 10, DType: fairgo.Float32}
			var settles []time.Duration
			for b.Loop() {
				w := r.AllReduce(ctx, t, fairgo.Sum)
				due := c.due()
				if err := w.Wait(ctx); err != nil {
					b.Fatal(err)
				}
				settles = append(settles, time.Since(due))
			}
			reportSettle(b, settles)
			b.ReportMetric(float64(hier.HelpedCalls(r))/float64(len(settles)), "helped/op")
		})
	}
	b.Run("floor", func(b *testing.B) { // a bare poll of the same clock
		c := &deviceClock{lag: 30 * time.Microsecond}
		ev := &clockEvent{c: c}
		var settles []time.Duration
		for b.Loop() {
			c.launch()
			_ = ev.Record(nil)
			due := c.due()
			_ = ev.Wait(context.Background())
			settles = append(settles, time.Since(due))
		}
		reportSettle(b, settles)
	})
}

func reportSettle(b *testing.B, settles []time.Duration) {
	var sum time.Duration
	for _, s := range settles {
		sum += s
	}
	slices.Sort(settles)
	b.ReportMetric(float64(sum.Nanoseconds())/float64(len(settles)), "settle-ns/op")
	b.ReportMetric(float64(settles[len(settles)*99/100].Nanoseconds()), "settle-p99-ns")
}

// The clock device stands in for the null device everywhere.
var _ backend.Device = clockDevice{}
