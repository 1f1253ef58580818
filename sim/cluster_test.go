package sim

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/logging"
)

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		arg  string
	}{
		{"no machines", Config{Devices: 1}, "Machines"},
		{"no devices", Config{Machines: 1}, "Devices"},
		{"too many", Config{Machines: 1000, Devices: 8}, "Machines"},
		{"negative jitter", Config{Machines: 1, Devices: 1, Jitter: -1}, "Jitter"},
		{"negative stall", Config{Machines: 1, Devices: 1, StallTimeout: -1}, "StallTimeout"},
		{"negative memory", Config{Machines: 1, Devices: 1, MemoryLimit: -1}, "MemoryLimit"},
		{"short order", Config{Machines: 2, Devices: 1, RankOrder: []int{0}}, "RankOrder"},
		{"repeated order", Config{Machines: 2, Devices: 1, RankOrder: []int{1, 1}}, "RankOrder"},
		{"order out of range", Config{Machines: 2, Devices: 1, RankOrder: []int{0, 2}}, "RankOrder"},
		{"negative world delay", Config{Machines: 1, Devices: 1, WorldDelay: -1}, "WorldDelay"},
		{"negative algo delay", Config{Machines: 1, Devices: 1,
			AlgoDelay: map[backend.NCCLAlgo]time.Duration{backend.AlgoRing: -1}}, "AlgoDelay"},
		{"unknown algo", Config{Machines: 1, Devices: 1,
			AlgoDelay: map[backend.NCCLAlgo]time.Duration{"nvls": 1}}, "AlgoDelay"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewCluster(tc.cfg)
			var ae *fairgo.ArgError
			require.ErrorAs(t, err, &ae)
			require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
			require.Equal(t, "sim.Config."+tc.arg, ae.Arg)
		})
	}
}

func TestRankOrderGivesGridCoordinates(t *testing.T) {
	// 2 machines × 3 devices; global rank g sits at grid rank order[g].
	order := []int{4, 0, 3, 5, 1, 2}
	c := newCluster(t, Config{Machines: 2, Devices: 3, RankOrder: order})
	require.Equal(t, 6, c.Size())
	require.Equal(t, order, c.Config().RankOrder)
	require.Equal(t, DefaultStallTimeout, c.Config().StallTimeout)
	for g, gr := range order {
		r := c.Rank(g)
		require.Equal(t, hier.Grid{Machines: 2, Devices: 3, Machine: gr / 3, Local: gr % 3}, r.Grid, "global %d", g)
		require.Equal(t, gr, r.Grid.Rank())
		require.Same(t, c.Device(g), r.Device)
		require.False(t, r.OwnsResources)
		require.Equal(t, g, r.Comms.World.Rank())
		require.Equal(t, 6, r.Comms.World.Size())
		require.Equal(t, "world", r.Comms.World.Name())
		for _, cm := range []backend.Comm{r.Comms.IntraReduceScatter, r.Comms.IntraAllGather} {
			require.Equal(t, 3, cm.Size())
			require.Equal(t, gr%3, cm.Rank())
		}
		require.Equal(t, "intra-rs/machine="+itoa(gr/3), r.Comms.IntraReduceScatter.Name())
		require.Equal(t, "intra-ag/machine="+itoa(gr/3), r.Comms.IntraAllGather.Name())
		for _, cm := range []backend.Comm{r.Comms.RailCollect, r.Comms.RailDiffuse} {
			require.Equal(t, 2, cm.Size())
			require.Equal(t, gr/3, cm.Rank())
		}
		require.Equal(t, "rail-collect/local="+itoa(gr%3), r.Comms.RailCollect.Name())
		require.Equal(t, "rail-diffuse/local="+itoa(gr%3), r.Comms.RailDiffuse.Name())
	}
	require.Nil(t, c.Device(6))
	require.Nil(t, c.Rank(-1).Device)

	// The data agrees: an intra all-gather of global ranks lists machine m's
	// devices in local order; a rail all-gather lists local d's machines.
	var ss []*Stream
	intra := make([]fairgo.Tensor, 6)
	rail := make([]fairgo.Tensor, 6)
	for g := range 6 {
		d := c.Device(g)
		s := mkStream(t, d)
		ss = append(ss, s)
		me := tensorOf(t, d, fairgo.Int32, float64(g))
		intra[g] = tensorOf(t, d, fairgo.Int32, 0, 0, 0)
		rail[g] = tensorOf(t, d, fairgo.Int32, 0, 0)
		require.NoError(t, c.Comms(g).IntraAllGather.AllGather(me.Ptr, intra[g].Ptr, 1, fairgo.Int32, s))
		require.NoError(t, c.Comms(g).RailDiffuse.AllGather(me.Ptr, rail[g].Ptr, 1, fairgo.Int32, s))
	}
	global := make([]float64, 6) // grid rank -> global rank
	for g, gr := range order {
		global[gr] = float64(g)
	}
	for g, s := range ss {
		require.NoError(t, syncStream(t, s))
		m, l := order[g]/3, order[g]%3
		require.Equal(t, global[m*3:m*3+3], values(t, c.Device(g), intra[g]))
		require.Equal(t, []float64{global[l], global[3+l]}, values(t, c.Device(g), rail[g]))
	}
}

func itoa(i int) string { return string(rune('0' + i)) }

func TestCloseLeaksNoGoroutines(t *testing.T) {
	base := quietGoroutines()
	c, err := NewCluster(Config{Machines: 2, Devices: 2, Jitter: time.Millisecond, StallTimeout: time.Minute})
	require.NoError(t, err)
	var events []*Event
	for g := range c.Size() {
		d := c.Device(g)
		for range 3 {
			mkStream(t, d)
		}
		s := mkStream(t, d)
		b := tensorOf(t, d, fairgo.Float32, 1, 2)
		if g == 0 { // blocked forever in a collective: the others never join
			require.NoError(t, c.Comms(g).World.AllReduce(b.Ptr, b.Ptr, 2, fairgo.Float32, fairgo.Sum, s))
		}
		require.NoError(t, d.CopyAsync(b.Ptr, b.Ptr+4, 4, s))
		e := newEvent(t, d)
		require.NoError(t, e.Record(s))
		events = append(events, e)
	}
	require.Greater(t, runtime.NumGoroutine(), base+15)
	require.NoError(t, c.Close())
	settleGoroutines(t, base)
	require.ErrorIs(t, events[0].Wait(context.Background()), fairgo.ErrClosed, "work pending at Close fails")
	require.ErrorIs(t, c.Comms(0).World.Err(), fairgo.ErrClosed)
	_, err = c.Device(0).NewStream()
	require.ErrorIs(t, err, fairgo.ErrClosed)
	require.NoError(t, c.Close())
}

func TestReducers(t *testing.T) {
	base := runtime.NumGoroutine()
	c := newCluster(t, Config{Machines: 2, Devices: 2})
	rs, err := c.Reducers(context.Background(), hier.WithFlatThreshold(hier.FlatNever))
	if err != nil {
		// hier.NewReducer may still be a placeholder: the failure names a rank
		// and nothing is left behind.
		require.Nil(t, rs)
		require.ErrorContains(t, err, "reducer of rank")
	} else {
		require.Len(t, rs, c.Size())
		for _, r := range rs {
			require.NoError(t, r.Close())
		}
	}
	require.NoError(t, c.Close())
	settleGoroutines(t, base)
}

// NewWorld's communicator holds every rank by global rank, sums like the
// world communicator with a sequence of its own, and fails like the others
// when the cluster closes.
func TestNewWorld(t *testing.T) {
	c := newCluster(t, Config{Machines: 2, Devices: 2})
	extra, err := c.NewWorld("flat-ring")
	require.NoError(t, err)
	require.Len(t, extra, 4)
	ss := make([]*Stream, 4)
	ts := make([]fairgo.Tensor, 4)
	for g, cm := range extra {
		require.Equal(t, g, cm.Rank())
		require.Equal(t, 4, cm.Size())
		require.Equal(t, "flat-ring", cm.Name())
		require.Same(t, c.Device(g), cm.Device())
		ss[g] = mkStream(t, c.Device(g))
		ts[g] = tensorOf(t, c.Device(g), fairgo.Float32, float64(g+1), float64(10*g))
		// One call on the world communicator first: the new one does not
		// share its sequence.
		require.NoError(t, c.Comms(g).World.AllReduce(ts[g].Ptr, ts[g].Ptr, 2, fairgo.Float32, fairgo.Sum, ss[g]))
		require.NoError(t, cm.AllReduce(ts[g].Ptr, ts[g].Ptr, 2, fairgo.Float32, fairgo.Sum, ss[g]))
	}
	for g := range extra {
		require.NoError(t, syncStream(t, ss[g]))
		require.Equal(t, []float64{40, 240}, values(t, c.Device(g), ts[g]), "rank %d: summed twice over 4 ranks", g)
	}
	require.NoError(t, c.Close())
	require.ErrorIs(t, extra[0].Err(), fairgo.ErrClosed)
	_, err = c.NewWorld("late")
	require.ErrorIs(t, err, fairgo.ErrClosed)
}

// records counts the log records a handler receives, by message and level.
type records struct {
	mu  sync.Mutex
	got map[string]int
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got[rec.Level.String()+" "+rec.Message]++
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// TestClusterLogsOnce: a cluster of 4 ranks in one process, each logging
// to logging.Default(), logs the facts about the whole job (here the
// calibration of a size class) once, from rank 0 at info, and at debug on
// the other ranks, where FAIRGO_LOG_LEVEL=debug shows them.
func TestClusterLogsOnce(t *testing.T) {
	t.Setenv(logging.EnvLevel, "debug")
	rec := &records{got: map[string]int{}}
	prev := slog.Default()
	slog.SetDefault(slog.New(rec))
	t.Cleanup(func() { slog.SetDefault(prev) })
	calibrateOne(t)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Equal(t, 1, rec.got["INFO fairgo: calibrated size class"], "%v", rec.got)
	require.Equal(t, 3, rec.got["DEBUG fairgo: calibrated size class"], "%v", rec.got)
}

// TestClusterLogsWarnings: without FAIRGO_LOG_LEVEL a rank's facts are
// dropped, and every rank's warnings pass.
func TestClusterLogsWarnings(t *testing.T) {
	t.Setenv(logging.EnvLevel, "")
	rec := &records{got: map[string]int{}}
	prev := slog.Default()
	slog.SetDefault(slog.New(rec))
	t.Cleanup(func() { slog.SetDefault(prev) })
	for rank := range 4 {
		logging.Default().With("rank", rank).Warn("fairgo: aborting communicators")
		logging.Default().Log(context.Background(), logging.FactLevel(rank), "fact")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Equal(t, map[string]int{"WARN fairgo: aborting communicators": 4}, rec.got)
}

// calibrateOne runs one allreduce above the flat threshold on every rank of
// a 2 × 2 cluster, which calibrates one size class.
func calibrateOne(t *testing.T) {
	t.Helper()
	c, err := NewCluster(Config{Machines: 2, Devices: 2})
	require.NoError(t, err)
	defer c.Close()
	ctx := context.Background()
	rs, err := c.Reducers(ctx)
	require.NoError(t, err)
	defer hier.CloseAll(rs)
	works := make([]*hier.Work, len(rs))
	for g, r := range rs {
		// 128 KiB, above Auto's flat threshold (64 KiB): calibrates one class,
		// the smallest, which under -race takes a fraction of a larger one's time
		tn, err := c.Device(g).AllocTensor(32<<10, fairgo.Float32)
		require.NoError(t, err)
		works[g] = r.AllReduce(ctx, tn, fairgo.Sum)
	}
	for _, w := range works {
		require.NoError(t, w.Wait(ctx))
	}
}
