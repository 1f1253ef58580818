package capi

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
)

// Setting is one setting of a communicator and its three spellings: the
// environment variable, the keyword argument of fairgo_torch.init() and
// the field of fairgo_config_t.
type Setting struct {
	Env     string // FAIRGO_...
	Keyword string // fairgo_torch.init(keyword=...)
	Field   string // fairgo_config_t's field
	Value   string // what the variable holds
	Default string
	Meaning string
}

// Settings are every setting the C ABI and fairgo_torch take. README.md
// and fairgo.h list them (a test checks).
var Settings = []Setting{
	{"FAIRGO_ALGORITHM", "algorithm", "algorithm", "auto, flat, rail-a2a, rail-rsag or rail-allreduce", "auto",
		"hier.WithAlgorithm: fix the allreduce's algorithm instead of measuring each size class"},
	{"FAIRGO_SLICE_BYTES", "slice_bytes", "slice_bytes", "bytes (K, M, G: binary multiples)", "0: fairgo's choice",
		"hier.WithSliceSize: the pipeline's slice"},
	{
		"FAIRGO_FLAT_THRESHOLD_BYTES",
		"flat_threshold_bytes",
		"flat_threshold_bytes",
		"bytes, or -1: never flat",
		"0: fairgo's choice",
		"hier.WithFlatThreshold: below it one flat NCCL allreduce",
	},
	{
		"FAIRGO_TIMEOUT",
		"timeout",
		"op_timeout_ms",
		"seconds or a Go duration (90s, 10m); 0: off",
		"C: off; fairgo_torch: 600 s",
		"hier.WithTimeout: the watchdog that turns a dead peer into an error on every rank",
	},
	{"FAIRGO_INIT_TIMEOUT", "init_timeout", "init_timeout_ms", "seconds or a Go duration", "300 s",
		"bound of init: store, discovery, NCCL setup"},
	{
		"FAIRGO_DEVICE",
		"device",
		"device",
		"CUDA ordinal, -1: default",
		"-1: the one GPU CUDA_VISIBLE_DEVICES names, else LOCAL_RANK (fairgo_torch: PyTorch's current device)",
		"this rank's GPU",
	},
}

// FromEnv returns o with the settings that lookup finds (FAIRGO_ALGORITHM,
// ...; an empty value counts as unset) applied. A value that does not
// parse is an *fairgo.ArgError naming the variable.
func (o Options) FromEnv(lookup func(string) (string, bool)) (Options, error) {
	get := func(name string) (string, bool) {
		v, ok := lookup(name)
		v = strings.TrimSpace(v)
		return v, ok && v != ""
	}
	bad := func(name, v, why string) error {
		return &fairgo.ArgError{Arg: "environment variable " + name, Value: strconv.Quote(v), Reason: why}
	}
	if v, ok := get("FAIRGO_ALGORITHM"); ok {
		a, err := hier.ParseAlgorithm(strings.ToLower(v))
		if err != nil {
			return o, bad("FAIRGO_ALGORITHM", v, "not one of auto, flat, rail-a2a, rail-rsag, rail-allreduce")
		}
		o.Algorithm = a
	}
	if v, ok := get("FAIRGO_SLICE_BYTES"); ok {
		n, err := ParseBytes(v)
		if err != nil || n < 0 {
			return o, bad("FAIRGO_SLICE_BYTES", v, "want a size in bytes such as 16777216 or 16M")
		}
		o.SliceBytes = n
	}
	if v, ok := get("FAIRGO_FLAT_THRESHOLD_BYTES"); ok {
		n, err := ParseBytes(v)
		if err != nil || (n < 0 && n != hier.FlatNever) {
			return o, bad(
				"FAIRGO_FLAT_THRESHOLD_BYTES",
				v,
				"want a size in bytes such as 262144 or 256K, or -1 (never flat)",
			)
		}
		o.FlatThreshold = n
	}
	if v, ok := get("FAIRGO_TIMEOUT"); ok {
		d, err := ParseSeconds(v)
		if err != nil {
			return o, bad("FAIRGO_TIMEOUT", v, err.Error())
		}
		o.OpTimeout = d
	}
	if v, ok := get("FAIRGO_INIT_TIMEOUT"); ok {
		d, err := ParseSeconds(v)
		if err != nil {
			return o, bad("FAIRGO_INIT_TIMEOUT", v, err.Error())
		}
		o.InitTimeout = d
	}
	if v, ok := get("FAIRGO_DEVICE"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < -1 {
			return o, bad("FAIRGO_DEVICE", v, "want a CUDA ordinal, or -1")
		}
		o.Device = n
	}
	return o, nil
}

// ParseBytes reads a byte count: an integer with an optional binary
// suffix K, M or G (also KiB, MiB, GiB; any case).
func ParseBytes(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "IB"), "B")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult, t = 1<<10, t[:n-1]
		case 'M':
			mult, t = 1<<20, t[:n-1]
		case 'G':
			mult, t = 1<<30, t[:n-1]
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	if n > math.MaxInt64/mult || n < math.MinInt64/mult {
		return 0, fmt.Errorf("size %q overflows", s)
	}
	return n * mult, nil
}

// ParseSeconds reads a duration: a number of seconds ("600", "0.5") or a
// Go duration ("10m", "90s"). It must not be negative.
func ParseSeconds(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	var d time.Duration
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(f) || f > float64(math.MaxInt64)/float64(time.Second) {
			return 0, fmt.Errorf("want seconds or a duration such as 90s or 10m")
		}
		d = time.Duration(f * float64(time.Second))
	} else if d, err = time.ParseDuration(s); err != nil {
		return 0, fmt.Errorf("want seconds or a duration such as 90s or 10m")
	}
	if d < 0 {
		return 0, fmt.Errorf("negative")
	}
	return d, nil
}
