package bench

import (
	"bytes"
	"math"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestBandwidths(t *testing.T) {
	alg, bus := Bandwidths(1e9, 1, 8)
	if alg != 1 || math.Abs(bus-1.75) > 1e-12 {
		t.Errorf("Bandwidths(1 GB, 1 s, 8) = %g, %g; want 1, 1.75", alg, bus)
	}
	if _, bus := Bandwidths(1e9, 1, 1); bus != 0 {
		t.Errorf("one rank: busbw %g", bus)
	}
	if a, b := Bandwidths(1e9, 0, 8); a != 0 || b != 0 {
		t.Error("zero time gives a bandwidth")
	}
}

func sampleRecords() []Record {
	var recs []Record
	for _, a := range []struct {
		alg string
		us  float64
	}{{"flat", 200}, {"naive", 300}, {"fairgo", 100}} {
		r := Record{Kind: KindSweep, Backend: "sim", SimTimings: true, Machines: 2, Devices: 2, DType: "float32", Op: "sum",
			Algorithm: a.alg, Bytes: 4 << 20, Count: 1 << 20, Parallelism: 4, TimeUS: a.us, MinUS: a.us * 0.9, MaxUS: a.us * 1.1, Wrong: 0}
		r.AlgBW, r.BusBW = Bandwidths(r.Bytes, r.TimeUS/1e6, 4)
		recs = append(recs, r)
	}
	return recs
}

func TestTableRow(t *testing.T) {
	var buf bytes.Buffer
	tab := NewTable(&buf)
	tab.Header(Info{Backend: "sim", Timing: "wall clock", SimTimings: true, Machines: 2, Devices: 2, Processes: 1},
		Config{Algorithms: Algorithms, Iters: 1, Reps: 1}, nil)
	tab.Row(sampleRecords())
	if err := tab.Err(); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"not GPU timings", "grid 2×2", "NCCL env:", "#wrong", "fairgo/flat", "fairgo/naive", "busbw = algbw·2(n−1)/n"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	row := lines[len(lines)-1]
	// size count type op par, then time ±% algbw busbw #wrong × 3, then 2 ratios.
	f := strings.Fields(row)
	if len(f) != 5+3*5+2 {
		t.Fatalf("row has %d fields, want 22: %q", len(f), row)
	}
	if f[0] != "4M" || f[1] != "1048576" || f[2] != "float32" || f[3] != "sum" {
		t.Errorf("row starts %v", f[:4])
	}
	if f[5] != "200.0" || f[9] != "0" || f[20] != "2.00" || f[21] != "3.00" {
		t.Errorf("row %q: flat time %s, #wrong %s, ratios %s %s", row, f[5], f[9], f[20], f[21])
	}
	// busbw of 4 MiB in 200 µs on 4 ranks: 4194304/200e-6/1e9 · 1.5 = 31.46.
	if f[8] != "31.46" {
		t.Errorf("flat busbw %s, want 31.46", f[8])
	}
	// Columns line up: the header's "#wrong" ends where the rows' counts end.
	head := lines[len(lines)-2]
	i := utf8.RuneCountInString(head[:strings.Index(head, "#wrong")+len("#wrong")])
	j := utf8.RuneCountInString(row[:regexp.MustCompile(`\s0\s`).FindStringIndex(row)[1]-1])
	if i != j {
		t.Errorf("#wrong column ends at %d in the header and %d in the row:\n%s\n%s", i, j, head, row)
	}
}

func TestTableUncheckedAndMissing(t *testing.T) {
	var buf bytes.Buffer
	tab := NewTable(&buf)
	recs := sampleRecords()[:2] // no fairgo
	recs[0].Wrong = -1
	tab.Row(recs)
	f := strings.Fields(buf.String())
	if f[9] != "-" {
		t.Errorf("unchecked #wrong shows %q", f[9])
	}
	if len(f) != 5+2*5 {
		t.Errorf("row without fairgo has %d fields: %v", len(f), f)
	}
}

func TestJSONAndCSV(t *testing.T) {
	recs := sampleRecords()
	var buf bytes.Buffer
	if err := WriteJSONL(&buf, recs); err != nil {
		t.Fatal(err)
	}
	prefixed := "[0] " + strings.ReplaceAll(buf.String(), "\n", "\nnoise\n")
	back, err := ReadJSONL(strings.NewReader(prefixed))
	if err != nil || len(back) != 3 || back[2].Algorithm != "fairgo" || back[0].BusBW != recs[0].BusBW {
		t.Fatalf("round trip: %v, %+v", err, back)
	}
	buf.Reset()
	if err := WriteCSV(&buf, recs); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(buf.String(), "\n"); lines != 4 {
		t.Errorf("CSV has %d lines, want 4", lines)
	}
}
