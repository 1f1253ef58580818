package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
)

func openSimT(t testing.TB, m, d int, jitter time.Duration) Testbed {
	t.Helper()
	tb, err := Open(context.Background(), "sim", TestbedSpec{Machines: m, Devices: d, Seed: 7, Jitter: jitter})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tb.Close() })
	return tb
}

// TestSweepChecksEveryTypeAndOp runs the three algorithms on odd counts
// (padding in fairgo and the naive hierarchy), with random delays in the
// simulated streams, and expects no wrong element.
func TestSweepChecksEveryTypeAndOp(t *testing.T) {
	cases := []struct {
		m, d int
		dt   fairgo.DType
		op   fairgo.Op
	}{
		{2, 3, fairgo.Float32, fairgo.Sum},
		{3, 2, fairgo.BFloat16, fairgo.Avg},
		{2, 2, fairgo.Float16, fairgo.Max},
		{1, 4, fairgo.Int32, fairgo.Min},
		{4, 1, fairgo.Float64, fairgo.Prod},
	}
	for _, c := range cases {
		tb := openSimT(t, c.m, c.d, 50*time.Microsecond)
		var out bytes.Buffer
		cfg := Config{Sizes: []int64{6, 1000, 12345, 100003}, DType: c.dt, Op: c.op, Iters: 2, Reps: 2, Warmup: 1, Check: true,
			Seed: 3, Slice: 16 << 10, FlatThresh: 2 << 10, Table: NewTable(&out)}
		recs, err := Run(context.Background(), tb, cfg)
		if err != nil {
			t.Fatalf("%d×%d %v %v: %v", c.m, c.d, c.dt, c.op, err)
		}
		if len(recs) == 0 || len(recs)%3 != 0 {
			t.Fatalf("%d records", len(recs))
		}
		for _, r := range recs {
			if r.Wrong != 0 {
				t.Errorf("%d×%d %v %v %s %d elements: %d wrong\n%s", c.m, c.d, c.dt, c.op, r.Algorithm, r.Count, r.Wrong, out.String())
			}
			if r.TimeUS <= 0 || r.MinUS > r.TimeUS || r.MaxUS < r.TimeUS || len(r.RepsUS) != 2 {
				t.Errorf("timing %+v", r)
			}
		}
	}
}

func TestOverlapRecords(t *testing.T) {
	tb := openSimT(t, 2, 2, 0)
	cfg := Config{DType: fairgo.Float32, Op: fairgo.Sum, Iters: 1, Reps: 1, Check: true, Buckets: 5, BucketBytes: 10 << 10,
		Parallelism: []int{1, 3}, Algorithms: []Algorithm{Fairgo, Naive}, Slice: 4 << 10}
	recs, err := RunOverlap(context.Background(), tb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 4 {
		t.Fatalf("%d records, want 4", len(recs))
	}
	for _, r := range recs {
		if r.Kind != KindOverlap || r.Buckets != 5 || r.Wrong != 0 || r.TotalBytes() != 5*10<<10 {
			t.Errorf("record %+v", r)
		}
	}
	if recs[0].Parallelism != 1 || recs[2].Parallelism != 3 {
		t.Errorf("parallelism %d, %d", recs[0].Parallelism, recs[2].Parallelism)
	}
	if _, err := RunOverlap(context.Background(), tb, Config{Iters: 1, Reps: 1}); err == nil {
		t.Error("overlap without buckets: no error")
	}
}

func TestPlotsRender(t *testing.T) {
	dir := t.TempDir()
	var recs []Record
	for _, m := range []int{1, 2, 4} {
		for _, size := range []int64{1 << 20, 4 << 20} {
			for _, r := range sampleRecords() {
				r.Machines, r.Bytes = m, size
				recs = append(recs, r)
			}
		}
	}
	for _, par := range []int{1, 2, 4} {
		for _, r := range sampleRecords() {
			r.Kind, r.Buckets, r.Parallelism, r.TimeUS = KindOverlap, 8, par, r.TimeUS/float64(par)
			recs = append(recs, r)
		}
	}
	files, err := Plot(dir, recs)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"busbw_1x2_float32", "busbw_4x2_float32", "speedup_2gpus_float32", "overlap_2x2_float32_8x4M"}
	for _, w := range want {
		for _, ext := range []string{".png", ".svg"} {
			st, err := os.Stat(filepath.Join(dir, w+ext))
			if err != nil || st.Size() < 1000 {
				t.Errorf("%s%s: %v", w, ext, err)
			}
		}
	}
	if len(files) != 2*(3+1+1) {
		t.Errorf("%d files: %v", len(files), files)
	}
	svg, _ := os.ReadFile(filepath.Join(dir, "speedup_2gpus_float32.svg"))
	if !strings.Contains(string(svg), "not GPU timings") {
		t.Error("sim plot title lacks the sim note")
	}
}

// BenchmarkSimAllReduce times one algorithm on a simulated 2×2 cluster: a
// harness self-check (sim timings are host timings, not GPU timings).
func BenchmarkSimAllReduce(b *testing.B) {
	for _, alg := range Algorithms {
		for _, size := range []int64{64 << 10, 1 << 20} {
			b.Run(alg.String()+"/"+FormatSize(size), func(b *testing.B) {
				tb := openSimT(b, 2, 2, 0)
				bn, err := newBench(context.Background(), tb, Config{DType: fairgo.Float32, Iters: 1, Reps: 1, Parallelism: []int{hier.DefaultParallelism}})
				if err != nil {
					b.Fatal(err)
				}
				defer bn.close()
				count := size / 4
				bn.bufs = make([]fairgo.Tensor, len(bn.ranks))
				if err := bn.alloc(count); err != nil {
					b.Fatal(err)
				}
				callers, err := bn.callers(hier.DefaultParallelism)
				if err != nil {
					b.Fatal(err)
				}
				b.SetBytes(size)
				var total time.Duration
				for b.Loop() {
					ts, err := bn.timeUnit(1, func(c *caller) error {
						return c.call(bn.ctx, alg, bn.bucket(c, 0, count, count+int64(bn.world)))
					}, callers)
					if err != nil {
						b.Fatal(err)
					}
					total += time.Duration(ts[0] * 1e9)
				}
				_, bus := Bandwidths(size, total.Seconds()/float64(b.N), bn.world)
				b.ReportMetric(bus, "busbw-GB/s")
			})
		}
	}
}
