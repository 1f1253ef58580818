package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/harness"
)

// Record kinds.
const (
	KindSweep   = "sweep"   // one size, one method
	KindOverlap = "overlap" // K buckets back to back, one method
	KindLink    = "link"    // a 2-rank allreduce over one link (links)
)

// Record is one measured point: one method at one size (sweep, link) or
// one round of Buckets calls (overlap). Times are per call for sweep and
// link, per round for overlap.
type Record struct {
	Kind       string `json:"kind"`
	Run        string `json:"run,omitempty"`     // the run's label (-run), grouping records for targets
	Label      string `json:"label,omitempty"`   // free text (-label)
	Link       string `json:"link,omitempty"`    // links: "nvlink" or "net"
	Command    string `json:"command,omitempty"` // the fairbench command that measured it
	Backend    string `json:"backend"`
	SimTimings bool   `json:"sim_timings,omitempty"`
	Machines   int    `json:"machines"`
	Devices    int    `json:"devices"`
	Processes  int    `json:"processes"`
	Testbed    Setup  `json:"testbed"`
	// Invalid says why the timing means nothing (ranks of different
	// machines time-slicing one GPU without MPS); "" when valid.
	Invalid string `json:"invalid,omitempty"`

	DType     string `json:"dtype"`
	Op        string `json:"op"`
	Algorithm string `json:"algorithm"` // flat, flat-ring, flat-tree, naive, or a fairgo variant
	Bytes     int64  `json:"bytes"`     // per call (sweep, link) or per bucket (overlap)
	Count     int64  `json:"count"`
	Buckets   int    `json:"buckets,omitempty"`
	Iters     int    `json:"iters"` // calls back to back per timed repetition
	Reps      int    `json:"reps"`
	// Rounds is how many rounds of Iters calls, each waited for, one
	// repetition spans (Config.RepBytes); 0: one.
	Rounds int `json:"rounds,omitempty"`
	// WorksAtEnd: fairgo's Works were waited for after the repetition's
	// last round, not after each (Config.WorksAtEnd).
	WorksAtEnd bool `json:"works_at_end,omitempty"`
	// Fairgo is the variant's configuration and choices; nil for flat and
	// naive.
	Fairgo *FairgoSetup `json:"fairgo,omitempty"`

	TimeUS float64   `json:"time_us"` // median over repetitions
	MinUS  float64   `json:"min_us"`
	MaxUS  float64   `json:"max_us"`
	RepsUS []float64 `json:"reps_us,omitempty"`
	// SlowestRankUS is the median over repetitions of the slowest rank's
	// time (TimeUS is of the mean over ranks): what a call costs the rank
	// that waits longest, and what Auto's calibration compares (it takes
	// each candidate's slowest rank).
	SlowestRankUS float64 `json:"slowest_rank_us,omitempty"`
	AlgBW         float64 `json:"algbw_gbps"` // bytes moved per timed unit / time, GB/s (1e9)
	BusBW         float64 `json:"busbw_gbps"` // algbw · 2(n−1)/n
	// IdealBusBW is the NIC-bound ideal busbw when the testbed's NIC rate
	// is known and M > 1 (IdealBusBW), else 0.
	IdealBusBW float64 `json:"ideal_busbw_gbps,omitempty"`
	Wrong      int64   `json:"wrong"` // wrong elements over all ranks; -1: not checked
	// Load is the hosts' CPU time and TCP segments per timed unit.
	Load *Load `json:"load,omitempty"`
	// HostUS is where the ranks' host time went per call.
	HostUS *HostUS `json:"host_us,omitempty"`

	NCCLVersion string   `json:"nccl_version,omitempty"`
	NCCLEnv     []string `json:"nccl_env,omitempty"`
	Host        string   `json:"host,omitempty"`
	When        string   `json:"when,omitempty"`
}

// Setup is the testbed a record was measured on, as the launcher described
// it and as the ranks sat on the GPUs and NCCL hosts.
type Setup struct {
	harness.Emulation
	harness.Placement
	// FlatTopologyUnaware: flat NCCL did not know the machines (every rank
	// its own NCCL host while machines hold several ranks), so flat and
	// flat-ring ran a ring over all ranks, flat-tree a tree of every rank
	// (harness.Info.FlatTopologyUnaware).
	FlatTopologyUnaware bool `json:"flat_topology_unaware,omitempty"`
}

// SetupOf is the Setup of a testbed.
func SetupOf(i harness.Info) Setup {
	return Setup{Emulation: i.Emulation, Placement: i.Placement, FlatTopologyUnaware: i.FlatTopologyUnaware()}
}

// IntraLine says in one line what the intra-machine link was and whether
// flat NCCL knew the machines, e.g. "intra-machine link: emulated
// (loopback TCP, shaped to 20 Gbit/s); flat NCCL is topology-unaware here";
// "" when the testbed told neither.
func (s Setup) IntraLine() string {
	link := s.IntraLink()
	switch {
	case link == "" && !s.FlatTopologyUnaware:
		return ""
	case link == "":
		link = "not told"
	}
	line := "intra-machine link: " + link
	if s.FlatTopologyUnaware {
		line += "; flat NCCL is topology-unaware here"
	}
	return line
}

// FairgoSetup is a fairgo variant as a record carries it.
type FairgoSetup struct {
	Spec          string   `json:"spec,omitempty"`  // as given to -fairgo
	Algorithm     string   `json:"algorithm"`       // the configured one (auto: chosen per size)
	Chosen        string   `json:"chosen"`          // what the Reducer used at this size (AlgorithmFor)
	Route         string   `json:"route,omitempty"` // the same with its form: "rail-rsag-serial" (ChoiceFor)
	Choices       []Choice `json:"choices"`         // the Reducer's choice per size class
	SliceBytes    int64    `json:"slice_bytes"`
	Parallelism   int      `json:"parallelism"`
	FlatThreshold int64    `json:"flat_threshold"` // hier.FlatNever (-1): never flat
	Inline        bool     `json:"inline"`         // calls in one piece or one slice enqueued inline (hier.WithInlineEnqueue)
	// Calibration is what Auto measured to choose this size's route (rank
	// 0 of the process); nil where it measured nothing (a fixed
	// algorithm, a flat size).
	Calibration *Calibration `json:"calibration,omitempty"`
}

// Calibration is hier.Calibration in µs: each candidate route's time, the
// slowest rank's best, back to back and one call alone.
type Calibration struct {
	Bytes        int64              `json:"bytes"`
	BurstUS      map[string]float64 `json:"burst_us"`
	OneAtATimeUS map[string]float64 `json:"one_at_a_time_us,omitempty"`
	Samples      map[string]int     `json:"samples,omitempty"`
	SetupUS      float64            `json:"setup_us,omitempty"` // making world variants
	CostUS       float64            `json:"cost_us"`            // what the class's first call waited for it
}

// calibrationOf is c in µs; nil for nil.
func calibrationOf(c *hier.Calibration) *Calibration {
	if c == nil {
		return nil
	}
	us := func(m map[string]time.Duration) map[string]float64 {
		if m == nil {
			return nil
		}
		out := make(map[string]float64, len(m))
		for k, d := range m {
			out[k] = microseconds(d)
		}
		return out
	}
	return &Calibration{Bytes: c.Bytes, BurstUS: us(c.Times), OneAtATimeUS: us(c.OneAtATime), Samples: c.Samples,
		SetupUS: microseconds(c.Setup), CostUS: microseconds(c.Cost)}
}

func microseconds(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// Choice is one size class of a Reducer's choices.
type Choice struct {
	MinBytes  int64  `json:"min_bytes"`
	Algorithm string `json:"algorithm"`
	Route     string `json:"route,omitempty"` // with its form, as hier.Choice.String names it
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

// IdealBusBW is the busbw in GB/s of an allreduce of bytes on M machines ×
// D devices that is bound only by one NIC of nicBytesPerSec per machine: a
// hierarchical allreduce sends 2(M−1)/M of the bytes out of each machine,
// so t = 2(M−1)/M · bytes / B, and busbw = bytes/t · 2(W−1)/W with W = M·D.
// M is the machines (fairgo's grid), also where every rank is an NCCL host
// of its own. It is 0 when M < 2 or the rate is unknown.
func IdealBusBW(bytes int64, m, d int, nicBytesPerSec float64) float64 {
	if m < 2 || nicBytesPerSec <= 0 || bytes <= 0 {
		return 0
	}
	t := 2 * float64(m-1) / float64(m) * float64(bytes) / nicBytesPerSec
	_, bus := Bandwidths(bytes, t, m*d)
	return bus
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
