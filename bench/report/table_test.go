package report

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/bench"
	"github.com/fairgo/fairgo/internal/harness"
)

// sampleRecords is one point of flat, naive and fairgo on a 2 × 2 testbed.
func sampleRecords() []bench.Record {
	var recs []bench.Record
	for _, a := range []struct {
		alg string
		us  float64
	}{{"flat", 200}, {"naive", 300}, {"fairgo", 100}} {
		r := bench.Record{
			Kind:       bench.KindSweep,
			Backend:    "sim",
			SimTimings: true,
			Machines:   2,
			Devices:    2,
			DType:      "float32",
			Op:         "sum",
			Algorithm:  a.alg,
			Bytes:      4 << 20,
			Count:      1 << 20,
			Iters:      1,
			TimeUS:     a.us,
			MinUS:      a.us * 0.9,
			MaxUS:      a.us * 1.1,
			Wrong:      0,
		}
		r.AlgBW, r.BusBW = bench.Bandwidths(r.Bytes, r.TimeUS/1e6, 4)
		r.IdealBusBW = bench.IdealBusBW(r.Bytes, 2, 2, 25e9)
		if a.alg == "fairgo" {
			r.Fairgo = &bench.FairgoSetup{Algorithm: "auto", Chosen: "rail-a2a", Parallelism: 4}
		}
		recs = append(recs, r)
	}
	return recs
}

func header(info harness.Info) bench.Header {
	ms, _ := bench.Methods("flat,naive,fairgo", nil)
	return bench.Header{Testbed: info, Config: bench.Config{Methods: ms, Iters: 1, Reps: 1},
		Fairgo: []bench.FairgoSetup{{Algorithm: "auto", SliceBytes: 16 << 20, Parallelism: 4, FlatThreshold: 256 << 10,
			Choices: []bench.Choice{{MinBytes: 0, Algorithm: "flat"}, {MinBytes: 256 << 10, Algorithm: "rail-a2a"}}}}}
}

func TestTableRow(t *testing.T) {
	var buf bytes.Buffer
	tab := NewTable(&buf)
	tab.Start(
		header(
			harness.Info{Backend: "sim", Timing: "wall clock", SimTimings: true, Machines: 2, Devices: 2, Processes: 1},
		),
	)
	tab.Point(sampleRecords())
	require.NoError(t, tab.Err())
	out := buf.String()
	for _, want := range []string{"not GPU timings", "grid 2×2", "NCCL env:", "#wrong", "fairgo/flat",
		"fairgo/best", "fairgo/ideal",
		"busbw = algbw·2(n−1)/n", "testbed: not emulated", "choices 0+ flat, 256K+ rail-a2a"} {
		require.Contains(t, out, want)
	}
	require.NotContains(t, out, "INVALID")
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	row := lines[len(lines)-1]
	// size count type op, then time ±% algbw busbw #wrong × 3, ideal, 3 ratios.
	f := strings.Fields(row)
	require.Len(t, f, 4+3*5+1+3, row)
	require.Equal(t, []string{"4M", "1048576", "float32", "sum"}, f[:4])
	require.Equal(t, "200.0", f[4], "flat time")
	require.Equal(t, "0", f[8], "#wrong")
	// busbw of 4 MiB in 200 µs on 4 ranks: 4194304/200e-6/1e9 · 1.5 = 31.46.
	require.Equal(t, "31.46", f[7])
	// ideal at 25 GB/s per machine on 2 × 2: 25·1.5 = 37.5; fairgo 62.91/37.5.
	require.Equal(t, []string{"37.50", "2.00", "2.00", "1.68"}, f[19:])
	// Columns line up: the header's "#wrong" ends where the rows' counts end.
	head := lines[len(lines)-2]
	i := utf8.RuneCountInString(head[:strings.Index(head, "#wrong")+len("#wrong")])
	j := utf8.RuneCountInString(row[:regexp.MustCompile(`\s0\s`).FindStringIndex(row)[1]-1])
	require.Equal(t, i, j, "#wrong column\n%s\n%s", head, row)
}

func TestTableSaysLoudlyWhenInvalid(t *testing.T) {
	var buf bytes.Buffer
	tab := NewTable(&buf)
	tab.Start(header(harness.Info{Backend: "cuda-mp", Machines: 2, Devices: 2, Processes: 4,
		Emulation: harness.Emulation{
			Machines: 2,
		}, Placement: harness.Placement{RanksPerGPU: 2, SharedAcrossMachines: true}}))
	recs := sampleRecords()
	for i := range recs {
		recs[i].Invalid = "shared"
	}
	tab.Point(recs)
	out := buf.String()
	require.Contains(t, out, "INVALID TESTBED: ranks of different machines share a GPU")
	require.Contains(t, out, "!!!!!!!!!!")
	require.True(t, strings.HasSuffix(strings.TrimSpace(out), "INVALID"), "the row is marked")
}

func TestTableUncheckedAndMissing(t *testing.T) {
	var buf bytes.Buffer
	tab := NewTable(&buf)
	recs := sampleRecords()[:2] // no fairgo
	recs[0].Wrong = -1
	recs[0].IdealBusBW, recs[1].IdealBusBW = 0, 0
	tab.Point(recs)
	f := strings.Fields(buf.String())
	require.Equal(t, "-", f[8], "unchecked #wrong")
	require.Len(t, f, 4+2*5+1, "a row without fairgo")
	require.Equal(t, "-", f[14], "no ideal")
}

func TestSummaryAndCSV(t *testing.T) {
	recs := sampleRecords()
	recs = append(
		recs,
		bench.Record{Kind: bench.KindLink, Link: "net", Algorithm: "flat", Bytes: 1 << 20, TimeUS: 1000},
		bench.Record{Kind: bench.KindLink, Link: "net", Algorithm: "flat", Bytes: 4 << 20, TimeUS: 3400},
	)
	var buf bytes.Buffer
	require.NoError(t, Summary(&buf, recs))
	out := buf.String()
	for _, want := range []string{"fairgo/best", "2×2", "4M", "2.00", "sim(not GPU timings)", "link net:"} {
		require.Contains(t, out, want)
	}
	require.NotContains(t, out, "# host time", "no record says where its host time went")
	buf.Reset()
	require.NoError(t, WriteCSV(&buf, recs))
	require.Equal(t, 6, strings.Count(buf.String(), "\n"))
	require.Contains(t, buf.String(), "ideal_busbw_gbps")

	recs[0].HostUS = &bench.HostUS{Enqueue: 12.5, Settle: 3, SettleP99: 40, StartSkew: 10, StartSkewP90: 20}
	buf.Reset()
	require.NoError(t, Summary(&buf, recs))
	_, host, ok := strings.Cut(buf.String(), "# host time a call")
	require.True(t, ok, "a record that says where its host time went gets the host table")
	lines := strings.Split(strings.TrimSpace(host), "\n")
	require.Len(t, lines, 4, "the legend, the head, one row (only that record's), then the link's fit")
	require.True(t, strings.HasPrefix(lines[3], "link net:"), lines[3])
	require.Equal(t,
		[]string{"2×2", bench.FormatSize(recs[0].Bytes), fmt.Sprint(recs[0].Iters), recs[0].Algorithm,
			fmtTime(recs[0].TimeUS), "12.50", "3.00", "40.00", "10/20", "-"},
		strings.Fields(lines[2]))
}

func TestPlotsRender(t *testing.T) {
	dir := t.TempDir()
	var recs []bench.Record
	for _, m := range []int{1, 2, 4} {
		for _, size := range []int64{1 << 20, 4 << 20} {
			for _, r := range sampleRecords() {
				r.Machines, r.Bytes = m, size
				recs = append(recs, r)
			}
		}
	}
	for _, r := range sampleRecords() {
		r.Kind, r.Buckets = bench.KindOverlap, 8
		recs = append(recs, r)
	}
	files, err := Plot(dir, recs)
	require.NoError(t, err)
	for _, w := range []string{"busbw_1x2_float32", "busbw_4x2_float32", "speedup_2gpus_float32",
		"overlap_2x2_float32_8x4M"} {
		for _, ext := range []string{".png", ".svg"} {
			st, err := os.Stat(filepath.Join(dir, w+ext))
			require.NoError(t, err)
			require.Greater(t, st.Size(), int64(1000), w+ext)
		}
	}
	require.Len(t, files, 2*(3+1+1), "%v", files)
	svg, err := os.ReadFile(filepath.Join(dir, "speedup_2gpus_float32.svg"))
	require.NoError(t, err)
	require.Contains(t, string(svg), "not GPU timings", "sim plot title lacks the sim note")
}

// The header says what the intra-machine link was and whether flat NCCL
// knew the machines, in one line; testbeds that do not tell say nothing.
func TestTableSaysTheIntraMachineLink(t *testing.T) {
	for _, tc := range []struct {
		name string
		info harness.Info
		want string // "": no such line
	}{
		{"2x4 on one GPU, lo shaped", harness.Info{Backend: "cuda-mp", Machines: 2, Devices: 4, Processes: 8,
			Emulation: harness.Emulation{Machines: 2, NICGbit: 2.5, MPS: true, NetNS: true,
				Intra: harness.IntraLoopback, NVLinkGbit: 20},
			Placement: harness.Placement{RanksPerGPU: 8, SharedAcrossMachines: true, NCCLHosts: 8}},
			"# intra-machine link: emulated (loopback TCP, shaped to 20 Gbit/s); flat NCCL is topology-unaware here\n"},
		{"2x2 on one GPU, lo not shaped", harness.Info{Backend: "cuda-mp", Machines: 2, Devices: 2, Processes: 4,
			Emulation: harness.Emulation{Machines: 2, NICGbit: 2.5, MPS: true, NetNS: true, Intra: harness.IntraLoopback},
			Placement: harness.Placement{RanksPerGPU: 4, SharedAcrossMachines: true, NCCLHosts: 4}},
			"# intra-machine link: emulated (loopback TCP, not shaped); flat NCCL is topology-unaware here\n"},
		{"4x2 on two GPUs", harness.Info{Backend: "cuda-mp", Machines: 4, Devices: 2, Processes: 8,
			Emulation: harness.Emulation{Machines: 4, NICGbit: 10, MPS: true, NetNS: true, Intra: harness.IntraNVLink},
			Placement: harness.Placement{RanksPerGPU: 4, SharedAcrossMachines: true, NCCLHosts: 4}},
			"# intra-machine link: GPU to GPU (NVLink where the GPUs have it)\n"},
		{"sim", harness.Info{Backend: "sim", Machines: 2, Devices: 2, Processes: 1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			NewTable(&buf).Start(header(tc.info))
			if tc.want == "" {
				require.NotContains(t, buf.String(), "intra-machine link")
				return
			}
			require.Contains(t, buf.String(), tc.want)
			require.Equal(t, 1, strings.Count(buf.String(), "intra-machine link"), "one line")
		})
	}
}

// best is the fastest of flat, flat-ring, flat-tree and naive; records of
// before flat-ring have flat and naive.
func TestBestIsTheFastestBaseline(t *testing.T) {
	p := point{}
	for _, r := range sampleRecords() { // flat 200, naive 300, fairgo 100
		p[r.Algorithm] = r
	}
	require.InDelta(t, 2.0, p.vsBest("fairgo"), 1e-12, "without flat-ring: flat")
	p[bench.FlatRing] = bench.Record{Algorithm: bench.FlatRing, TimeUS: 150}
	require.InDelta(t, 1.5, p.vsBest("fairgo"), 1e-12, "flat-ring faster than flat")
	p[bench.Naive] = bench.Record{Algorithm: bench.Naive, TimeUS: 120}
	require.InDelta(t, 1.2, p.vsBest("fairgo"), 1e-12, "naive the fastest")
	require.InDelta(t, 2.0, p.vsFlat("fairgo"), 1e-12, "v/flat stays NCCL's choice")
	delete(p, bench.Flat)
	delete(p, bench.Naive)
	require.InDelta(t, 1.5, p.vsBest("fairgo"), 1e-12, "flat-ring alone")
	require.True(t, math.IsNaN(point{"fairgo": p["fairgo"]}.vsBest("fairgo")), "no baseline")
	// flat-tree where it is the fastest: the best is its time, whatever the
	// others are.
	p[bench.Flat] = bench.Record{Algorithm: bench.Flat, TimeUS: 200}
	p[bench.Naive] = bench.Record{Algorithm: bench.Naive, TimeUS: 120}
	p[bench.FlatTree] = bench.Record{Algorithm: bench.FlatTree, TimeUS: 90}
	require.InDelta(t, 0.9, p.vsBest("fairgo"), 1e-12, "flat-tree the fastest")
	name, best := p.best()
	require.Equal(t, bench.FlatTree, name)
	require.Equal(t, 90.0, best)
	p[bench.FlatTree] = bench.Record{Algorithm: bench.FlatTree, TimeUS: 400}
	require.InDelta(t, 1.2, p.vsBest("fairgo"), 1e-12, "flat-tree the slowest: naive")
}

// The committed records still load and report: those from before flat-ring
// and the intra-machine link without either, the one-GPU testbed's with
// both.
func TestCommittedRecordsStillReport(t *testing.T) {
	files := []string{"../results/nvlink-1x2/records.jsonl", "../results/testbed-mx1/records.jsonl"}
	recs, err := bench.ReadJSONLFiles(files)
	require.NoError(t, err)
	require.NotEmpty(t, recs)
	var buf bytes.Buffer
	require.NoError(t, Summary(&buf, recs))
	require.Contains(t, buf.String(), "fairgo/best")
	require.NotContains(t, buf.String(), "intra-machine link", "those testbeds did not tell")
	require.NotContains(t, buf.String(), "flat-ring")
	_, err = Targets(recs, TargetOptions{})
	require.NoError(t, err)
	require.NoError(t, WriteCSV(io.Discard, recs))

	recent, err := bench.ReadJSONLFiles(
		[]string{"../results/onegpu/records.jsonl", "../results/onegpu-rail/records.jsonl"},
	)
	require.NoError(t, err)
	buf.Reset()
	require.NoError(t, Summary(&buf, recent))
	require.Contains(t, buf.String(), "intra-machine link: emulated (loopback TCP")
	require.Contains(t, buf.String(), "flat-ring")
}

// A digest of records of machines sharing a GPU says once what the
// intra-machine link was, and marks the points.
func TestSummarySaysTheIntraMachineLink(t *testing.T) {
	recs := sampleRecords()
	for i := range recs {
		recs[i].Testbed.Intra = harness.IntraLoopback
		recs[i].Testbed.NVLinkGbit = 20
		recs[i].Testbed.FlatTopologyUnaware = true
	}
	recs = append(
		recs,
		bench.Record{
			Kind:      bench.KindSweep,
			Machines:  2,
			Devices:   2,
			DType:     "float32",
			Op:        "sum",
			Algorithm: bench.FlatRing,
			Bytes:     4 << 20,
			Iters:     1,
			TimeUS:    150,
			Testbed:   recs[0].Testbed,
		},
	)
	var buf bytes.Buffer
	require.NoError(t, Summary(&buf, recs))
	out := buf.String()
	require.True(
		t,
		strings.HasPrefix(
			out,
			"# intra-machine link: emulated (loopback TCP, shaped to 20 Gbit/s); flat NCCL is topology-unaware here\n",
		),
		out,
	)
	require.Contains(t, out, "intra=loopback@20Gbit flat-unaware")
	require.Contains(t, out, "flat-ring us")
	require.Contains(t, out, "1.50", "fairgo/best against flat-ring")
	buf.Reset()
	require.NoError(t, WriteCSV(&buf, recs))
	require.Contains(t, buf.String(), "intra,nvlink_gbit,nccl_hosts,flat_topology_unaware")
	require.Contains(t, buf.String(), ",loopback,20,0,true,")
}
