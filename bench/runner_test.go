package bench

import (
	"bytes"
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/elem"
	"github.com/fairgo/fairgo/internal/harness"
	"github.com/fairgo/fairgo/internal/refdata"
)

func openSimT(t testing.TB, m, d int, jitter time.Duration) *harness.Testbed {
	t.Helper()
	tb, err := harness.OpenSim(harness.Spec{Machines: m, Devices: d, Seed: 7, Jitter: jitter})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tb.Close() })
	return tb
}

func variants(t testing.TB, specs ...string) []Variant {
	t.Helper()
	var vs []Variant
	for _, s := range specs {
		v, err := ParseVariant(s)
		require.NoError(t, err)
		vs = append(vs, v)
	}
	return vs
}

func methods(t testing.TB, list string, specs ...string) []Method {
	t.Helper()
	ms, err := Methods(list, variants(t, specs...))
	require.NoError(t, err)
	return ms
}

// observed records what an Observer is told.
type observed struct {
	headers []Header
	points  [][]Record
}

func (o *observed) Start(h Header)    { o.headers = append(o.headers, h) }
func (o *observed) Point(rs []Record) { o.points = append(o.points, rs) }

// TestSweepChecksEveryTypeAndOp runs the methods on odd counts (padding in
// fairgo and the naive hierarchy), with random delays in the simulated
// streams, and expects no wrong element.
func TestSweepChecksEveryTypeAndOp(t *testing.T) {
	cases := []struct {
		m, d int
		dt   fairgo.DType
		op   fairgo.Op
		algo string
	}{
		{2, 3, fairgo.Float32, fairgo.Sum, "rail-a2a"},
		{3, 2, fairgo.BFloat16, fairgo.Avg, "rail-rsag"},
		{2, 2, fairgo.Float16, fairgo.Max, "auto"},
		{1, 4, fairgo.Int32, fairgo.Min, "auto"},
		{4, 1, fairgo.Float64, fairgo.Prod, "rail-rsag"},
	}
	for _, c := range cases {
		tb := openSimT(t, c.m, c.d, 50*time.Microsecond)
		var obs observed
		cfg := Config{
			Sizes:    []int64{6, 1000, 12345, 100003},
			DType:    c.dt,
			Op:       c.op,
			Iters:    2,
			Reps:     2,
			Warmup:   1,
			Check:    true,
			Seed:     3,
			Methods:  methods(t, DefaultMethods, "fairgo=slice:16K,flat:2K,algo:"+c.algo),
			Observer: &obs,
		}
		recs, err := Sweep(context.Background(), tb, cfg)
		require.NoError(t, err, "%d×%d %v %v", c.m, c.d, c.dt, c.op)
		require.NotEmpty(t, recs)
		require.Zero(t, len(recs)%5)
		for _, r := range recs {
			require.Zero(t, r.Wrong, "%d×%d %v %v %s %d elements", c.m, c.d, c.dt, c.op, r.Algorithm, r.Count)
			require.Positive(t, r.TimeUS)
			require.LessOrEqual(t, r.MinUS, r.TimeUS)
			require.GreaterOrEqual(t, r.MaxUS, r.TimeUS)
			require.GreaterOrEqual(t, r.SlowestRankUS, r.TimeUS*(1-1e-9), "the slowest rank is no faster than the mean")
			require.Len(t, r.RepsUS, 2)
			require.Empty(t, r.Invalid)
			if r.Algorithm == DefaultVariant {
				require.NotNil(t, r.Fairgo)
				require.Equal(t, c.algo, r.Fairgo.Algorithm)
				require.NotEmpty(t, r.Fairgo.Chosen)
				require.NotEmpty(t, r.Fairgo.Choices)
				require.InDelta(t, 16<<10, r.Fairgo.SliceBytes, 1<<10, "the slice, rounded to the grid")
				require.Equal(t, int64(2<<10), r.Fairgo.FlatThreshold)
			} else {
				require.Nil(t, r.Fairgo)
			}
		}
		require.Len(t, obs.headers, 1)
		require.Len(t, obs.headers[0].Fairgo, 1)
		require.Len(t, obs.points, len(recs)/5)
		require.Equal(
			t,
			[]string{Flat, FlatRing, FlatTree, Naive, DefaultVariant},
			[]string{recs[0].Algorithm, recs[1].Algorithm, recs[2].Algorithm, recs[3].Algorithm, recs[4].Algorithm},
		)
	}
}

// TestChosenAlgorithmIsRecorded: below the flat threshold fairgo is flat,
// above it the configured rail form.
func TestChosenAlgorithmIsRecorded(t *testing.T) {
	tb := openSimT(t, 2, 2, 0)
	cfg := Config{Sizes: []int64{1 << 10, 64 << 10}, Iters: 1, Reps: 1, Check: true,
		Methods: methods(
			t,
			"fairgo",
			"rsag=algo:rail-rsag,flat:4K,inline:on",
			"a2a=algo:rail-a2a,flat:never,inline:off",
		)}
	recs, err := Sweep(context.Background(), tb, cfg)
	require.NoError(t, err)
	chosen := map[string]string{}
	for _, r := range recs {
		require.Zero(t, r.Wrong)
		chosen[r.Algorithm+"/"+FormatSize(r.Bytes)] = r.Fairgo.Chosen
	}
	require.Equal(
		t,
		map[string]string{"rsag/1K": "flat", "rsag/64K": "rail-rsag", "a2a/1K": "rail-a2a", "a2a/64K": "rail-a2a"},
		chosen,
	)
	for _, r := range recs {
		require.Equal(
			t,
			r.Algorithm != "a2a",
			r.Fairgo.Inline,
			"inline unless the variant turns it off: every rank has its goroutine",
		)
	}
}

func TestOverlapRecords(t *testing.T) {
	tb := openSimT(t, 2, 2, 0)
	cfg := Config{
		DType:       fairgo.Float32,
		Op:          fairgo.Sum,
		Iters:       1,
		Reps:        1,
		Check:       true,
		Buckets:     5,
		BucketBytes: 10 << 10,
		Methods:     methods(t, "naive,fairgo", "p1=parallelism:1,slice:4K", "p3=parallelism:3,slice:4K"),
	}
	recs, err := Overlap(context.Background(), tb, cfg)
	require.NoError(t, err)
	require.Len(t, recs, 3)
	for _, r := range recs {
		require.Equal(t, KindOverlap, r.Kind)
		require.Equal(t, 5, r.Buckets)
		require.Zero(t, r.Wrong)
		require.Equal(t, int64(5*10<<10), r.TotalBytes())
	}
	require.Equal(t, []string{"naive", "p1", "p3"}, []string{recs[0].Algorithm, recs[1].Algorithm, recs[2].Algorithm})
	require.Equal(t, 1, recs[1].Fairgo.Parallelism)
	require.Equal(t, 3, recs[2].Fairgo.Parallelism)
	_, err = Overlap(context.Background(), tb, Config{Iters: 1, Reps: 1})
	require.Error(t, err, "overlap without buckets")
}

func TestRecordsCarryTheTestbed(t *testing.T) {
	r := &run{
		cfg: Config{DType: fairgo.Float32, Op: fairgo.Sum, Run: "r1", Command: "fairbench sweep"},
		info: harness.Info{
			Backend: "cuda-mp", Machines: 2, Devices: 2, Processes: 4,
			Emulation: harness.Emulation{Machines: 2, NICGbit: 10, NetNS: true},
			Placement: harness.Placement{RanksPerGPU: 2, SharedAcrossMachines: true},
		},
	}
	p := r.proto(KindSweep, 1<<20, 1<<18)
	require.Equal(t, "r1", p.Run)
	require.Equal(t, "fairbench sweep", p.Command)
	require.Equal(t, 10.0, p.Testbed.NICGbit)
	require.Equal(t, 2, p.Testbed.RanksPerGPU)
	require.Contains(t, p.Invalid, "without MPS")
	r.info.Emulation.MPS = true
	require.Empty(t, r.proto(KindSweep, 1<<20, 1<<18).Invalid)
	require.False(t, p.Testbed.FlatTopologyUnaware)
	require.Empty(t, p.Testbed.IntraLine())
}

// Machines of several ranks on one GPU: every record says the intra-machine
// link is emulated and that flat NCCL did not know the machines, and the
// NIC-bound ideal counts M machines, not the W NCCL hosts.
func TestRecordsOfRanksSharingAGPU(t *testing.T) {
	r := &run{
		cfg: Config{DType: fairgo.Float32, Op: fairgo.Sum, Reps: 1, Methods: methods(t, "flat,flat-ring,naive")},
		info: harness.Info{
			Backend: "cuda-mp", Machines: 2, Devices: 4, Processes: 8,
			Emulation: harness.Emulation{
				Machines:   2,
				NICGbit:    2.5,
				NetNS:      true,
				MPS:        true,
				Intra:      harness.IntraLoopback,
				NVLinkGbit: 20,
			},
			Placement: harness.Placement{RanksPerGPU: 8, SharedAcrossMachines: true, NCCLHosts: 8},
		},
	}
	p := r.proto(KindSweep, 256<<20, 64<<20)
	require.True(t, p.Testbed.FlatTopologyUnaware)
	require.Equal(
		t,
		"intra-machine link: emulated (loopback TCP, shaped to 20 Gbit/s); flat NCCL is topology-unaware here",
		p.Testbed.IntraLine(),
	)
	require.Empty(t, p.Invalid, "under MPS")
	times := [][][]float64{{{1.0}}, {{1.0}}, {{1.0}}} // [method][rep][local rank]
	recs := r.summarize([]rankResult{{Times: times}}, p)
	require.Len(t, recs, 3)
	want := IdealBusBW(256<<20, 2, 4, 2.5e9/8)
	require.InDelta(t, want, recs[0].IdealBusBW, 1e-12)
	require.NotEqual(
		t,
		IdealBusBW(256<<20, 8, 1, 2.5e9/8),
		recs[0].IdealBusBW,
		"not as if every NCCL host were a machine",
	)
	// 2 × 4 at 2.5 Gbit/s: t = S/B, busbw = B·2·7/8 = 0.547 GB/s (GPU.md's 0.55).
	require.InDelta(t, 0.546875, want, 1e-9)

	// The records travel through JSON and come back alike; records of
	// before these fields read as not told.
	var buf bytes.Buffer
	require.NoError(t, WriteJSONL(&buf, recs))
	back, err := ReadJSONL(&buf)
	require.NoError(t, err)
	require.Equal(t, recs, back)
	old, err := ReadJSONL(
		strings.NewReader(
			`{"kind":"sweep","algorithm":"flat","machines":2,"devices":2,` +
				`"testbed":{"launcher_machines":2,"nic_gbit":10,"mps":true,"netns":true,"ranks_per_gpu":2,` +
				`"shared_across_machines":true}}`,
		),
	)
	require.NoError(t, err)
	require.False(t, old[0].Testbed.FlatTopologyUnaware)
	require.Empty(t, old[0].Testbed.IntraLine())
}

// flat-ring and flat-tree each run on the testbed's world communicator of
// their algorithm, made only when asked for.
func TestFlatAlgorithmsUseTheirOwnCommunicators(t *testing.T) {
	ctx := context.Background()
	tb := openSimT(t, 2, 2, 0)
	r, err := newRun(ctx, tb, Config{Iters: 1, Reps: 1, Methods: methods(t, "flat,naive")})
	require.NoError(t, err)
	for _, c := range r.callers {
		require.Empty(t, c.worlds, "no flat-ring or flat-tree asked for")
	}
	r, err = newRun(ctx, tb, Config{Iters: 1, Reps: 1, Methods: methods(t, "flat-tree,flat-ring")})
	require.NoError(t, err)
	for name, algo := range map[string]backend.NCCLAlgo{FlatRing: backend.AlgoRing, FlatTree: backend.AlgoTree} {
		world, err := tb.AlgoWorld(ctx, algo)
		require.NoError(t, err)
		for i, c := range r.callers {
			require.Same(t, world[i], c.worlds[name])
			require.NotSame(t, c.rank.Hier.Comms.World, c.worlds[name])
			require.Equal(t, name, c.worlds[name].Name())
		}
	}
	require.NotSame(t, r.callers[0].worlds[FlatRing], r.callers[0].worlds[FlatTree])
}

// flat-tree is measured on the sim, checked like every method, and is one
// of the baselines.
func TestFlatTreeIsMeasured(t *testing.T) {
	tb := openSimT(t, 3, 2, 20*time.Microsecond)
	recs, err := Sweep(context.Background(), tb, Config{Sizes: []int64{4 << 10, 100003}, Iters: 1, Reps: 2,
		Check: true, Methods: methods(t, "flat-tree,fairgo")})
	require.NoError(t, err)
	require.Len(t, recs, 4)
	for i, r := range recs {
		require.Equal(t, []string{FlatTree, DefaultVariant}[i%2], r.Algorithm)
		require.Zero(t, r.Wrong)
		require.Positive(t, r.TimeUS)
	}
	require.True(t, IsBaseline(FlatTree))
}

// TestCountWrong: identical outputs are checked once, and a corrupted one
// on its own.
func TestCountWrong(t *testing.T) {
	const world, n = 3, 1000
	dt, op := fairgo.Float32, fairgo.Sum
	good := make([]byte, n*4)
	for i := range n {
		want, _ := refdata.Expected(dt, op, 5, world, int64(i))
		elem.Set(dt, good, i, want)
	}
	bad := slices.Clone(good)
	for _, i := range []int{3, 500, 999} {
		elem.Set(dt, bad, i, elem.Get(dt, bad, i)+1)
	}
	require.Equal(
		t,
		[]int64{0, 3, 0, 0, 3},
		countWrong(dt, op, 5, world, [][]byte{good, bad, slices.Clone(good), good, bad}),
	)
}

func TestIdealBusBW(t *testing.T) {
	// 2 × 2 at 10 Gbit/s: t = 2·(1/2)·S/1.25e9, busbw = S/t·2·3/4 = 1.875 GB/s.
	require.InDelta(t, 1.875, IdealBusBW(256<<20, 2, 2, 1.25e9), 1e-12)
	// 4 × 2: t = 2·(3/4)·S/B, busbw = B/1.5·2·7/8 = 1.458 GB/s.
	require.InDelta(t, 1.25*1.75/1.5, IdealBusBW(1<<30, 4, 2, 1.25e9), 1e-12)
	// 2 × 1: busbw = B = 1.25 GB/s.
	require.InDelta(t, 1.25, IdealBusBW(1<<20, 2, 1, 1.25e9), 1e-12)
	require.Zero(t, IdealBusBW(1<<20, 1, 8, 1.25e9), "one machine")
	require.Zero(t, IdealBusBW(1<<20, 2, 2, 0), "rate unknown")
}

// A variant with routes:NAME follows NAME's routes: the two share each
// size class's calibration (measured once), so they differ only in their
// other keys (here the check) at every point of the sweep.
func TestVariantFollowsAnotherVariantsRoutes(t *testing.T) {
	tb := openSimT(t, 2, 2, 100*time.Microsecond)
	// Two size classes, Auto's smallest: calibrating them is quick under -race.
	cfg := Config{Sizes: []int64{64 << 10, 128 << 10}, Iters: 1, Reps: 2, Check: true,
		Methods: methods(t, "fairgo", "fairgo", "nocheck=check:off,routes:fairgo", "own=check:off")}
	r, err := newRun(context.Background(), tb, cfg)
	require.NoError(t, err)
	recs, err := r.sweep()
	require.NoError(t, err)
	routes := map[string]string{}
	for _, rec := range recs {
		require.Zero(t, rec.Wrong)
		routes[rec.Algorithm+"/"+FormatSize(rec.Bytes)] = rec.Fairgo.Route
		// The record says what Auto measured to choose.
		cal := rec.Fairgo.Calibration
		require.NotNil(t, cal, "%s at %s", rec.Algorithm, FormatSize(rec.Bytes))
		require.Positive(t, cal.Bytes) // the size its class was timed at
		require.Contains(t, cal.BurstUS, rec.Fairgo.Route)
		require.Positive(t, cal.BurstUS[rec.Fairgo.Route])
		require.Positive(t, cal.CostUS)
	}
	for _, size := range cfg.Sizes {
		at := "/" + FormatSize(size)
		require.NotEmpty(t, routes["fairgo"+at])
		require.Equal(t, routes["fairgo"+at], routes["nocheck"+at], "size %s", FormatSize(size))
		for _, c := range r.callers {
			mine, follower := c.reds["fairgo"].ChoiceFor(size), c.reds["nocheck"].ChoiceFor(size)
			require.NotNil(t, mine.Calibration)
			require.Same(t, mine.Calibration, follower.Calibration, "one calibration for both")
			require.NotSame(t, mine.Calibration, c.reds["own"].ChoiceFor(size).Calibration, "own measures its own")
		}
	}
}

func TestParseVariant(t *testing.T) {
	tests := []struct {
		in   string
		want Variant
		bad  bool
	}{
		{in: "fairgo", want: Variant{Name: "fairgo"}},
		{
			in: "rsag=algo:rail-rsag,slice:64M,parallelism:4",
			want: Variant{Name: "rsag", Spec: "algo:rail-rsag,slice:64M,parallelism:4",
				Algorithm: hier.RailRSAG, Slice: 64 << 20, Parallelism: 4},
		},
		{
			in: "a2a = algorithm:rail-a2a, flat:never, spin:0s",
			want: Variant{Name: "a2a", Spec: "algorithm:rail-a2a, flat:never, spin:0s",
				Algorithm: hier.RailAllToAll, FlatThreshold: hier.FlatNever, SpinSet: true},
		},
		{
			in:   "f=flat:1M,par:2",
			want: Variant{Name: "f", Spec: "flat:1M,par:2", FlatThreshold: 1 << 20, Parallelism: 2},
		},
		{in: "i=inline:on", want: Variant{Name: "i", Spec: "inline:on", Inline: true, InlineSet: true}},
		{in: "o=inline:off", want: Variant{Name: "o", Spec: "inline:off", InlineSet: true}},
		{ // a switch given twice: the last value wins
			in: "t=inline:on,inline:off,rail:serial,rail:overlap,check:off,check:on",
			want: Variant{Name: "t", Spec: "inline:on,inline:off,rail:serial,rail:overlap,check:off,check:on",
				InlineSet: true, SerialSet: true},
		},
		{in: "u=check:off", want: Variant{Name: "u", Spec: "check:off", NoCheck: true}},
		{
			in:   "n=check:off,routes:fairgo",
			want: Variant{Name: "n", Spec: "check:off,routes:fairgo", NoCheck: true, RoutesOf: "fairgo"},
		},
		{
			in:   "s=fp:0,routes:fairgo",
			want: Variant{Name: "s", Spec: "fp:0,routes:fairgo", FingerprintSet: true, RoutesOf: "fairgo"},
		},
		{
			in:   "s=fingerprint:1M",
			want: Variant{Name: "s", Spec: "fingerprint:1M", FingerprintMax: 1 << 20, FingerprintSet: true},
		},
		{
			in:   "m=shm:off,routes:fairgo",
			want: Variant{Name: "m", Spec: "shm:off,routes:fairgo", NoSharedMemory: true, RoutesOf: "fairgo"},
		},
		{in: "m=shm:on", want: Variant{Name: "m", Spec: "shm:on"}},
		{in: "x=shm:maybe", bad: true},
		{in: "x=fp:2G", bad: true},
		{in: "x=fp:-1", bad: true},
		{in: "x=routes:naive", bad: true},
		{in: "x=routes:1a", bad: true},
		{in: "x=inline:maybe", bad: true},
		{in: "=slice:1M", bad: true},
		{in: "flat=slice:1M", bad: true},
		{in: "naive", bad: true},
		{in: "x=slice", bad: true},
		{in: "x=algo:ring", bad: true},
		{in: "x=slice:1Q", bad: true},
		{in: "x=parallelism:0", bad: true},
		{in: "x=parallelism:2000", bad: true},
		{in: "x=colour:red", bad: true},
		{in: "x=spin:forever", bad: true},
		{in: "1x=slice:1M", bad: true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseVariant(tc.in)
			if tc.bad {
				require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
				require.Equal(t, 1, strings.Count(err.Error(), "fairgo:"), "one prefix: %v", err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	// An error names the key and its value, and lists the choices.
	for in, want := range map[string]string{
		"x=algo:ring": `invalid -fairgo "x=algo:ring": algo ring: unknown (auto, flat, rail-a2a, ` +
			`rail-rsag, rail-allreduce`, // and hier's further ones
		"x=slice:1Q":          `slice 1Q: not an integer with an optional K, M, G or T suffix`,
		"x=parallelism:two":   `parallelism two: not an integer`,
		"x=parallelism:2000":  `parallelism 2000: more than 1024 slices in flight`,
		"x=rail:both":         `rail both: serial or overlap`,
		"x=colour:red":        `unknown key "colour" (algo, slice, parallelism, flat, spin, inline, rail, check, routes)`,
		"x=spin:2000ms":       `spin 2000ms: must be between 0 and 1s`,
		"x=par:2000":          `parallelism 2000: more than 1024`,
		"x=spin:forever":      `spin forever: not a duration`,
		"x=flat:-5":           `flat -5: negative`,
		"x=algo:rail-rsag,x:": `unknown key "x"`,
	} {
		_, err := ParseVariant(in)
		require.ErrorContains(t, err, want, in)
	}
}

func TestMethods(t *testing.T) {
	names := func(ms []Method) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.Name)
		}
		return out
	}
	require.Equal(t, []string{"flat", "naive", "fairgo"}, names(methods(t, "fairgo,naive,flat")))
	require.Equal(t, []string{"flat", "flat-ring", "flat-tree", "naive", "fairgo"}, names(methods(t, DefaultMethods)))
	require.Equal(
		t,
		[]string{"flat", "flat-ring", "flat-tree", "naive", "fairgo"},
		names(methods(t, "naive,fairgo,flat-tree,flat-ring,flat,naive")),
	)
	require.Equal(t, []string{"flat-ring", "naive"}, names(methods(t, "naive,flat-ring")))
	require.Equal(t, []string{"flat-tree", "naive"}, names(methods(t, "naive,flat-tree")))
	require.Equal(t, []string{"flat", "a", "b"}, names(methods(t, "flat,fairgo", "a=slice:1M", "b")))
	require.Equal(t, []string{"naive"}, names(methods(t, "naive", "a=slice:1M")))
	for _, bad := range []struct {
		list  string
		specs []string
	}{
		{"ring", nil},
		{"", nil},
		{"fairgo", []string{"a", "a=slice:1M"}},
		{"fairgo", []string{"flat-ring=slice:1M"}},
		{"fairgo", []string{"flat-tree=slice:1M"}},
		{"tree", nil},
		{"fairgo", []string{"n=routes:a", "a"}}, // the routes' variant comes later
		{"fairgo", []string{"a", "n=routes:b"}}, // no such variant
	} {
		_, err := Methods(bad.list, variants(t, bad.specs...))
		require.Error(t, err, "%v", bad)
	}
}

// BenchmarkSimAllReduce times one method on a simulated 2×2 cluster: a
// harness self-check (sim timings are host timings, not GPU timings).
func BenchmarkSimAllReduce(b *testing.B) {
	for _, m := range methods(b, DefaultMethods) {
		for _, size := range []int64{64 << 10, 1 << 20} {
			b.Run(m.Name+"/"+FormatSize(size), func(b *testing.B) {
				tb := openSimT(b, 2, 2, 0)
				r, err := newRun(
					context.Background(),
					tb,
					Config{DType: fairgo.Float32, Iters: 1, Reps: 1, Methods: []Method{m}},
				)
				require.NoError(b, err)
				count := size / 4
				require.NoError(b, r.alloc(count))
				b.SetBytes(size)
				var total time.Duration
				for b.Loop() {
					ts, _, err := r.timeUnit(1, 1, func(c *caller) error {
						return c.call(r.ctx, m, r.bucket(c, 0, count, count+int64(r.world)))
					})
					require.NoError(b, err)
					total += time.Duration(ts[0] * 1e9)
				}
				_, bus := Bandwidths(size, total.Seconds()/float64(b.N), r.world)
				if !math.IsNaN(bus) {
					b.ReportMetric(bus, "busbw-GB/s")
				}
			})
		}
	}
}

// TestRepBytesRepeatsRounds: a repetition repeats its round until the
// rounds moved RepBytes (capped), every round's calls are made, and the
// records say how many rounds a repetition spans.
func TestRepBytesRepeatsRounds(t *testing.T) {
	tb := openSimT(t, 2, 2, 0)
	cfg := Config{Sizes: []int64{64 << 10, 1 << 20}, Iters: 2, Reps: 3, RepBytes: 1 << 20, Check: true,
		Methods: methods(t, "flat,fairgo", "fairgo=algo:rail-rsag")} // one route: the rounds are tested, not Auto
	recs, err := Sweep(context.Background(), tb, cfg)
	require.NoError(t, err)
	require.Len(t, recs, 4)
	for _, r := range recs {
		require.Zero(t, r.Wrong)
		want := map[int64]int{64 << 10: 8, 1 << 20: 0}[r.Bytes] // 2 calls of 64K a round: 8 rounds make 1M
		require.Equal(t, want, r.Rounds, "%s at %s", r.Algorithm, FormatSize(r.Bytes))
		// Where the host time went: enqueue and settle are parts of the round.
		h := r.HostUS
		require.NotNil(t, h, "%s at %s", r.Algorithm, FormatSize(r.Bytes))
		require.Greater(t, h.Enqueue, 0.0)
		require.GreaterOrEqual(t, h.Settle, 0.0)
		require.GreaterOrEqual(t, h.SettleMax, h.Settle)
		require.Greater(t, h.Round, h.Enqueue+h.Settle)
		require.Greater(t, h.StartSkewP90+h.ReturnSkewP90+h.SeenSkewP90, 0.0,
			"four ranks of one process, one clock: their skews are measured")
		require.GreaterOrEqual(t, h.SettleP99, 0.0)
	}

	r, err := newRun(context.Background(), tb, cfg)
	require.NoError(t, err)
	for _, c := range []struct {
		bytes int64
		want  int
	}{{1 << 20, 1}, {1<<20 - 1, 2}, {1 << 10, 1 << 10}, {1, MaxRounds}, {0, 1}, {4 << 20, 1}} {
		require.Equal(t, c.want, r.rounds(c.bytes), "a round of %d bytes", c.bytes)
	}
	r.cfg.RepBytes = 0
	require.Equal(t, 1, r.rounds(1))
	r.cfg.RepBytes, r.cfg.MinRounds = 1<<20, 4 // the fewest rounds, where RepBytes asks for fewer
	for _, c := range []struct {
		bytes int64
		want  int
	}{{1 << 20, 4}, {64 << 20, 4}, {256 << 10, 4}, {128 << 10, 8}, {1, MaxRounds}} {
		require.Equal(t, c.want, r.rounds(c.bytes), "a round of %d bytes, at least 4", c.bytes)
	}
	r.cfg.RepBytes = 0
	require.Equal(t, 4, r.rounds(1))
	r.cfg.MinRounds = 0

	calls := make([]int, len(r.ranks))      // per local rank; ForRanks runs them at once
	order := make([][]string, len(r.ranks)) // the methods each local rank called, a call per round
	var res rankResult
	err = r.measure(&res, 2, 5, func(m Method, c *caller) error {
		i := slices.Index(r.callers, c)
		calls[i]++
		if calls[i]%10 == 1 {
			order[i] = append(order[i], m.Name)
		}
		return nil
	})
	require.NoError(t, err)
	for i, n := range calls {
		require.Equal(t, len(cfg.Methods)*cfg.Reps*5*2, n, "local rank %d", i)
		require.Equal(t, []string{"flat", "fairgo", "fairgo", "flat", "flat", "fairgo"}, order[i],
			"local rank %d: the methods take turns going first", i)
	}
	require.Equal(t, cfg.Reps*5*2, res.Units)

	_, err = Sweep(context.Background(), tb, Config{Sizes: []int64{1 << 10}, Iters: 1, Reps: 1, RepBytes: -1})
	var arg *fairgo.ArgError
	require.ErrorAs(t, err, &arg)
	require.Equal(t, "-rep-bytes", arg.Arg)
}

// Each repetition measures every method once, in the row of a balanced
// Latin square: over a cycle of repetitions (n, or 2n for an odd n) every
// method goes first equally often and follows every other one equally
// often, so that no method always has the same neighbour.
func TestRepOrder(t *testing.T) {
	for _, tc := range []struct {
		rep, n int
		want   []int
	}{
		{0, 4, []int{0, 1, 3, 2}},
		{1, 4, []int{1, 2, 0, 3}},
		{3, 4, []int{3, 0, 2, 1}},
		{4, 4, []int{0, 1, 3, 2}},
		{0, 3, []int{0, 1, 2}},
		{3, 3, []int{2, 1, 0}},
		{0, 2, []int{0, 1}},
		{1, 2, []int{1, 0}},
		{5, 1, []int{0}},
		{0, 0, []int{}},
	} {
		require.Equal(t, tc.want, repOrder(tc.rep, tc.n), "repetition %d of %d methods", tc.rep, tc.n)
	}
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 16).Draw(t, "methods")
		cycle := n
		if n%2 == 1 {
			cycle = 2 * n
		}
		start := rapid.IntRange(0, 100).Draw(t, "first repetition")
		firsts := make([]int, n)
		follows := map[[2]int]int{} // (method, the one measured just before it)
		for rep := start; rep < start+cycle; rep++ {
			o := repOrder(rep, n)
			sorted := slices.Clone(o)
			slices.Sort(sorted)
			for i := range sorted {
				if sorted[i] != i {
					t.Fatalf("repetition %d of %d methods: %v is not a permutation", rep, n, o)
				}
			}
			firsts[o[0]]++
			for i := 1; i < n; i++ {
				follows[[2]int{o[i], o[i-1]}]++
			}
		}
		for k := range n {
			if firsts[k] != cycle/n {
				t.Fatalf("%d methods: method %d first %d times in %d repetitions", n, k, firsts[k], cycle)
			}
			for j := range n {
				if j != k && follows[[2]int{k, j}] != cycle/n {
					t.Fatalf("%d methods: method %d follows %d %d times in %d repetitions, want %d", n, k, j, follows[[2]int{k, j}], cycle, cycle/n)
				}
			}
		}
	})
}

// With WorksAtEnd fairgo's Works are waited for once a repetition, after
// its last round: the results are still checked and right, and the
// records say how the rounds ended.
func TestWorksAtEnd(t *testing.T) {
	tb := openSimT(t, 2, 1, 0)
	for _, atEnd := range []bool{false, true} {
		cfg := Config{Sizes: []int64{64 << 10}, Iters: 1, Reps: 2, RepBytes: 1 << 20, Check: true, WorksAtEnd: atEnd,
			Methods: methods(t, "flat,fairgo", "fairgo=algo:flat")}
		recs, err := Sweep(context.Background(), tb, cfg)
		require.NoError(t, err)
		require.Len(t, recs, 2)
		for _, r := range recs {
			require.Zero(t, r.Wrong)
			require.Equal(t, 16, r.Rounds)
			require.Equal(t, atEnd, r.WorksAtEnd, "%s", r.Algorithm)
		}

		// The Works pending at each call of a repetition of 4 rounds: none
		// with a wait each round; 0, 1, 2, 3 with one at the end.
		r, err := newRun(context.Background(), tb, cfg)
		require.NoError(t, err)
		fg := cfg.Methods[1]
		bufs := make([]fairgo.Tensor, len(r.ranks))
		for i, rk := range r.ranks {
			ptr, err := rk.Hier.Device.Alloc(1 << 10)
			require.NoError(t, err)
			bufs[i] = fairgo.Tensor{Ptr: ptr, Bytes: 1 << 10, Count: 256, DType: fairgo.Float32}
		}
		pending := make([][]int, len(r.ranks))
		_, _, err = r.timeUnit(1, 4, func(c *caller) error {
			pending[c.idx] = append(pending[c.idx], len(c.works))
			return c.call(context.Background(), fg, bufs[c.idx])
		})
		require.NoError(t, err)
		for i := range pending {
			want := []int{0, 0, 0, 0}
			if atEnd {
				want = []int{0, 1, 2, 3}
			}
			require.Equal(t, want, pending[i], "local rank %d", i)
			require.Empty(t, r.callers[i].works, "all waited for by the end")
		}
	}
}
