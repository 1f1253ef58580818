package bench

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Record kinds.
const (
	KindSweep   = "sweep"   // one size, one algorithm
	KindOverlap = "overlap" // K buckets, one parallelism, one algorithm
	KindLink    = "link"    // a 2-rank allreduce over one link (links mode)
)

// Record is one measured point: one algorithm at one size (sweep, link) or
// one bucket list and parallelism (overlap). Times are per call for sweep
// and link, per round of Buckets calls for overlap.
type Record struct {
	Kind        string `json:"kind"`
	Label       string `json:"label,omitempty"` // free text from -label
	Link        string `json:"link,omitempty"`  // links mode: "nvlink" or "net"
	Backend     string `json:"backend"`
	SimTimings  bool   `json:"sim_timings,omitempty"`
	Machines    int    `json:"machines"`
	Devices     int    `json:"devices"`
	Processes   int    `json:"processes"`
	DType       string `json:"dtype"`
	Op          string `json:"op"`
	Algorithm   string `json:"algorithm"`
	Bytes       int64  `json:"bytes"` // per call (sweep, link) or per bucket (overlap)
	Count       int64  `json:"count"`
	Buckets     int    `json:"buckets,omitempty"`
	Parallelism int    `json:"parallelism"`
	SliceBytes  int64  `json:"slice_bytes"`
	FlatThresh  int64  `json:"flat_threshold"`
	Iters       int    `json:"iters"`
	Reps        int    `json:"reps"`

	TimeUS float64   `json:"time_us"` // median over repetitions
	MinUS  float64   `json:"min_us"`
	MaxUS  float64   `json:"max_us"`
	RepsUS []float64 `json:"reps_us,omitempty"`
	AlgBW  float64   `json:"algbw_gbps"` // bytes moved per call / time, GB/s (1e9)
	BusBW  float64   `json:"busbw_gbps"` // algbw · 2(n−1)/n
	Wrong  int64     `json:"wrong"`      // wrong elements over all ranks; -1: not checked

	NCCLVersion string   `json:"nccl_version,omitempty"`
	NCCLEnv     []string `json:"nccl_env,omitempty"`
	Host        string   `json:"host,omitempty"`
	When        string   `json:"when,omitempty"`
}

// World is Machines × Devices.
func (r Record) World() int { return r.Machines * r.Devices }

// TotalBytes is the bytes reduced per timed unit (one call, or a round of
// Buckets calls).
func (r Record) TotalBytes() int64 {
	if r.Buckets > 0 {
		return r.Bytes * int64(r.Buckets)
	}
	return r.Bytes
}

// Bandwidths returns algbw and busbw in GB/s for bytes reduced in sec
// seconds over n ranks, as nccl-tests defines them.
func Bandwidths(bytes int64, sec float64, n int) (algbw, busbw float64) {
	if sec <= 0 {
		return 0, 0
	}
	algbw = float64(bytes) / sec / 1e9
	if n > 1 {
		busbw = algbw * 2 * float64(n-1) / float64(n)
	}
	return algbw, busbw
}

// WriteJSONL appends records to w, one JSON object a line.
func WriteJSONL(w io.Writer, recs []Record) error {
	enc := json.NewEncoder(w)
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("bench: writing JSON: %w", err)
		}
	}
	return nil
}

// ReadJSONL reads records written by WriteJSONL; lines that are not JSON
// objects (a launcher's prefixes, blank lines) are skipped, and a "[N] "
// prefix before the object is ignored.
func ReadJSONL(r io.Reader) ([]Record, error) {
	var out []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(line, '{'); i > 0 {
			line = line[i:]
		}
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var rec Record
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			return out, fmt.Errorf("bench: JSON line %d: %w", n, err)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("bench: reading JSON lines: %w", err)
	}
	return out, nil
}

// ReadJSONLFiles reads and concatenates the records of several files.
func ReadJSONLFiles(paths []string) ([]Record, error) {
	var all []Record
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		recs, err := ReadJSONL(f)
		_ = f.Close()
		if err != nil {
			return nil, fmt.Errorf("bench: %s: %w", p, err)
		}
		all = append(all, recs...)
	}
	return all, nil
}

var csvHeader = []string{"kind", "label", "link", "backend", "sim_timings", "machines", "devices", "processes", "dtype", "op",
	"algorithm", "bytes", "count", "buckets", "parallelism", "slice_bytes", "flat_threshold", "iters", "reps",
	"time_us", "min_us", "max_us", "algbw_gbps", "busbw_gbps", "wrong", "nccl_version", "nccl_env"}

// WriteCSV writes records as CSV with a header line.
func WriteCSV(w io.Writer, recs []Record) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(csvHeader); err != nil {
		return fmt.Errorf("bench: writing CSV: %w", err)
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	for _, r := range recs {
		row := []string{r.Kind, r.Label, r.Link, r.Backend, strconv.FormatBool(r.SimTimings), i(int64(r.Machines)), i(int64(r.Devices)),
			i(int64(r.Processes)), r.DType, r.Op, r.Algorithm, i(r.Bytes), i(r.Count), i(int64(r.Buckets)), i(int64(r.Parallelism)),
			i(r.SliceBytes), i(r.FlatThresh), i(int64(r.Iters)), i(int64(r.Reps)), f(r.TimeUS), f(r.MinUS), f(r.MaxUS),
			f(r.AlgBW), f(r.BusBW), i(r.Wrong), r.NCCLVersion, strings.Join(r.NCCLEnv, " ")}
		if err := cw.Write(row); err != nil {
			return fmt.Errorf("bench: writing CSV: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("bench: writing CSV: %w", err)
	}
	return nil
}
