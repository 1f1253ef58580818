package bench

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/harness"
)

// The baselines fairgo is measured against.
const (
	// Flat is one NCCL allreduce on the world communicator: NCCL's own
	// choice of algorithm.
	Flat = "flat"
	// FlatRing is one NCCL allreduce on a world communicator of its own
	// that NCCL initialised with NCCL_ALGO=allreduce:ring
	// (harness.AlgoWorld with backend.AlgoRing): the ring, whatever NCCL
	// would choose. On the simulated cluster it is the sim's allreduce on
	// a communicator of its own.
	FlatRing = "flat-ring"
	// FlatTree is FlatRing with NCCL's tree (NCCL_ALGO=allreduce:tree,
	// backend.AlgoTree): where NCCL's own choice misses the tree (or the
	// ring), the best baseline still has it, so fairgo is measured against
	// the fastest allreduce NCCL can run.
	FlatTree = "flat-tree"
	// Naive is the hierarchy written by hand on one stream: NCCL
	// reduce-scatter inside the machine, allreduce on the rail, all-gather
	// inside the machine.
	Naive = "naive"
	// DefaultVariant is the name of fairgo with its default options.
	DefaultVariant = "fairgo"
	// DefaultMethods is what a run measures unless told: every baseline and
	// fairgo.
	DefaultMethods = Flat + "," + FlatRing + "," + FlatTree + "," + Naive + "," + DefaultVariant
)

// Baselines are the baselines' names, in the order runs measure them. The
// best baseline at a point is the fastest of those measured.
var Baselines = []string{Flat, FlatRing, FlatTree, Naive}

// flatAlgos are the baselines that run on a world communicator of one NCCL
// algorithm, with that algorithm.
var flatAlgos = map[string]backend.NCCLAlgo{FlatRing: backend.AlgoRing, FlatTree: backend.AlgoTree}

// IsBaseline reports whether name is one of Baselines.
func IsBaseline(name string) bool { return slices.Contains(Baselines, name) }

// Variant is one configuration of fairgo's Reducer, measured as a column of
// its own under its Name.
type Variant struct {
	Name string
	Spec string // the options as given, "algo:rail-rsag,slice:64M"; "" for the defaults

	Algorithm     hier.Algorithm
	Slice         int64 // 0: fairgo's default
	Parallelism   int   // 0: fairgo's default
	FlatThreshold int64 // 0: fairgo's default; hier.FlatNever: never flat
	Spin          time.Duration
	SpinSet       bool
	// Inline (hier.WithInlineEnqueue) when InlineSet; else on (the bench
	// drives every rank from a goroutine of its own).
	Inline, InlineSet bool
	// Serial (hier.WithSerialRail) when SerialSet.
	Serial, SerialSet bool
	// NoCheck turns the cross-rank check off (hier.WithCheck(false)).
	NoCheck bool
	// FingerprintMax (hier.WithFingerprintMax) when FingerprintSet: "fp:0"
	// gives small calls the separate check.
	FingerprintMax int64
	FingerprintSet bool
	// NoSharedMemory checks through the collective and the fingerprints
	// (hier.WithSharedMemoryDir("")): "shm:off".
	NoSharedMemory bool
	// RoutesOf names an earlier variant whose routes this one follows
	// (hier.WithRoutesOf: one calibration serves both); "" measures its own.
	RoutesOf string
}

// Watchdog is the timeout of every variant's Reducer (hier.WithTimeout): a
// benchmark never hangs, and fairgo runs as a trainer would run it (with the
// watchdog armed, small calls carry their check in their data).
const Watchdog = 5 * time.Minute

// Options are the variant's hier options.
func (v Variant) Options() []hier.Option {
	opts := []hier.Option{
		hier.WithTimeout(Watchdog),
		hier.WithAlgorithm(v.Algorithm),
		hier.WithSliceSize(v.Slice),
		hier.WithParallelism(v.Parallelism),
		hier.WithFlatThreshold(v.FlatThreshold),
	}
	if v.SpinSet {
		opts = append(opts, hier.WithSpin(v.Spin))
	}
	if v.InlineSet {
		opts = append(opts, hier.WithInlineEnqueue(v.Inline))
	}
	if v.SerialSet {
		opts = append(opts, hier.WithSerialRail(v.Serial))
	}
	if v.NoCheck {
		opts = append(opts, hier.WithCheck(false))
	}
	if v.FingerprintSet {
		opts = append(opts, hier.WithFingerprintMax(v.FingerprintMax))
	}
	if v.NoSharedMemory {
		opts = append(opts, hier.WithSharedMemoryDir(""))
	}
	return opts
}

// inline is whether the variant enqueues calls inline where they may be
// (hier.WithInlineEnqueue: a call in one piece or one slice). The bench
// drives every local rank from a goroutine of its own (harness.ForRanks),
// which is what hier.WithInlineEnqueue asks of its caller, so it is on
// unless the variant says otherwise, also where one process drives several
// ranks.
func (v Variant) inline() bool {
	if v.InlineSet {
		return v.Inline
	}
	return true
}

// optionKeys are the variant's keys of hier's options, for its errors;
// keyAliases the other spellings of keys.
var (
	optionKeys = map[string]string{
		"WithSliceSize":     "slice",
		"WithParallelism":   "parallelism",
		"WithFlatThreshold": "flat",
		"WithSpin":          "spin",
		"WithAlgorithm":     "algo",
	}
	keyAliases = map[string]string{"algorithm": "algo", "par": "parallelism", "flat-threshold": "flat"}
)

var variantName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]*$`)

// ParseVariant reads "NAME=key:value,key:value" (or a bare NAME for the
// defaults). Keys: algo (any hier.Algorithm by name: hier.ParseAlgorithm), slice (a size),
// parallelism (slices in flight), flat (the flat threshold: a size, or
// never), spin (a duration), inline (on or off: hier.WithInlineEnqueue;
// on by default: every rank has a goroutine of its own), rail
// (serial or overlap: hier.WithSerialRail), check (on or off:
// hier.WithCheck), shm (on or off: off checks without shared memory,
// hier.WithSharedMemoryDir("")), routes (the NAME of an earlier variant whose routes
// this one follows: hier.WithRoutesOf, so that two variants compared differ
// only in their other keys). NAME may not be flat or naive.
func ParseVariant(s string) (Variant, error) {
	name, spec, _ := strings.Cut(strings.TrimSpace(s), "=")
	p := variantParser{s: s, v: Variant{Name: strings.TrimSpace(name), Spec: strings.TrimSpace(spec)}}
	if !variantName.MatchString(p.v.Name) || p.v.Name == Flat || p.v.Name == Naive {
		return p.bad("needs a NAME (a letter, then letters, digits, '_', '.', '-'; not flat or naive) before '='")
	}
	given := map[string]string{} // each key's value as written, by the key's main spelling
	for _, kv := range strings.Split(p.v.Spec, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		key, val, ok := strings.Cut(kv, ":")
		if !ok {
			return p.bad(fmt.Sprintf("%q is not key:value", kv))
		}
		val = strings.TrimSpace(val)
		k := strings.TrimSpace(key)
		known, err := p.v.set(k, val)
		if !known {
			return p.bad(fmt.Sprintf("unknown key %q (algo, slice, parallelism, flat, spin, inline, rail, check, routes)", key))
		}
		if err != nil {
			return p.badKey(k, val, err)
		}
		if a, ok := keyAliases[k]; ok {
			k = a
		}
		given[k] = val
	}
	return p.validate(given)
}

// variantParser reads one -fairgo value, s, into v.
type variantParser struct {
	s string
	v Variant
}

// bad is the error of the whole value, for why.
func (p variantParser) bad(why string) (Variant, error) {
	return Variant{}, &fairgo.ArgError{Arg: "-fairgo", Value: strconv.Quote(p.s), Reason: why}
}

// badKey names the key and its value: for a *fairgo.ArgError (of the
// library's parser or options) with its reason alone, and wrapping it.
func (p variantParser) badKey(key, val string, err error) (Variant, error) {
	why, cause := err.Error(), error(nil) // nil: ErrInvalidArgument
	var ae *fairgo.ArgError
	if errors.As(err, &ae) {
		why, cause = ae.Reason, err
	}
	return Variant{}, &fairgo.ArgError{
		Arg:    "-fairgo",
		Value:  strconv.Quote(p.s),
		Reason: fmt.Sprintf("%s %s: %s", key, val, why),
		Err:    cause,
	}
}

// validate checks the variant's options with hier, naming the key at
// fault when hier names its option (given: the keys' values as written).
func (p variantParser) validate(given map[string]string) (Variant, error) {
	err := hier.ValidateOptions(p.v.Options()...)
	if err == nil {
		return p.v, nil
	}
	var ae *fairgo.ArgError
	if errors.As(err, &ae) {
		if key, ok := optionKeys[ae.Arg]; ok {
			if val, ok := given[key]; ok {
				return p.badKey(key, val, err)
			}
		}
	}
	return p.badKey("options", p.v.Spec, err)
}

// set sets the option of key to val (a key given twice: the last value
// wins). known is false for a key that is none of ParseVariant's; err says
// what is wrong with val.
func (v *Variant) set(key, val string) (known bool, err error) {
	var yes bool
	switch key {
	case "algo", "algorithm":
		v.Algorithm, err = hier.ParseAlgorithm(val)
	case "slice":
		v.Slice, err = ParseSize(val)
	case "parallelism", "par":
		v.Parallelism, err = parseParallelism(val)
	case "flat", "flat-threshold":
		v.FlatThreshold, err = parseFlatThreshold(val)
	case "spin":
		var derr error
		if v.Spin, derr = time.ParseDuration(val); derr != nil {
			err = errors.New("not a duration (e.g. 20us)")
		}
		v.SpinSet = true
	case "inline":
		v.InlineSet = true
		if yes, err = parseChoice(val, "on", "off"); err == nil {
			v.Inline = yes
		}
	case "rail":
		v.SerialSet = true
		if yes, err = parseChoice(val, "serial", "overlap"); err == nil {
			v.Serial = yes
		}
	case "check":
		if yes, err = parseChoice(val, "on", "off"); err == nil {
			v.NoCheck = !yes
		}
	case "shm":
		if yes, err = parseChoice(val, "on", "off"); err == nil {
			v.NoSharedMemory = !yes
		}
	case "fp", "fingerprint":
		v.FingerprintMax, err = ParseSize(val)
		v.FingerprintSet = true
	case "routes":
		v.RoutesOf = val
		if !variantName.MatchString(val) || IsBaseline(val) {
			err = errors.New("not a variant's name")
		}
	default:
		return false, nil
	}
	return true, err
}

// parseParallelism reads the slices in flight: an integer, at least 1.
func parseParallelism(val string) (int, error) {
	n, err := strconv.Atoi(val)
	switch {
	case err != nil:
		return n, errors.New("not an integer")
	case n < 1:
		return n, errors.New("must be at least 1")
	}
	return n, nil
}

// parseFlatThreshold reads the flat threshold: a size, or never
// (hier.FlatNever).
func parseFlatThreshold(val string) (int64, error) {
	if val == "never" {
		return hier.FlatNever, nil
	}
	return ParseSize(val)
}

// parseChoice reads one of two words: true for yes, false for no.
func parseChoice(val, yes, no string) (bool, error) {
	switch val {
	case yes:
		return true, nil
	case no:
		return false, nil
	}
	return false, errors.New(yes + " or " + no)
}

// Method is one way to allreduce that a run measures: a baseline (Flat,
// FlatRing, FlatTree, Naive) or a fairgo Variant.
type Method struct {
	Name    string
	Variant *Variant // nil for the baselines
}

// Methods lists the baselines asked for, in the order of Baselines, and
// every variant (when fairgo is asked for). list is a comma-separated list
// of flat, flat-ring, flat-tree, naive and fairgo (DefaultMethods has them all); no
// variant means one with the defaults. A variant may not take a baseline's
// name.
func Methods(list string, variants []Variant) ([]Method, error) {
	var out []Method
	var fairgoToo bool
	for _, f := range strings.Split(list, ",") {
		switch f = strings.TrimSpace(f); {
		case f == "":
		case IsBaseline(f):
			if !slices.ContainsFunc(out, func(m Method) bool { return m.Name == f }) {
				out = append(out, Method{Name: f})
			}
		case f == DefaultVariant:
			fairgoToo = true
		default:
			return nil, &fairgo.ArgError{
				Arg:    "-algos",
				Value:  f,
				Reason: "unknown (" + strings.Join(Baselines, ", ") + ", " + DefaultVariant + ")",
			}
		}
	}
	slices.SortStableFunc(out, func(a, b Method) int {
		return slices.Index(Baselines, a.Name) - slices.Index(Baselines, b.Name)
	})
	if fairgoToo {
		if len(variants) == 0 {
			variants = []Variant{{Name: DefaultVariant}}
		}
		seen := map[string]bool{}
		for i := range variants {
			if IsBaseline(variants[i].Name) {
				return nil, &fairgo.ArgError{Arg: "-fairgo", Value: variants[i].Name, Reason: "a baseline's name"}
			}
			if seen[variants[i].Name] {
				return nil, &fairgo.ArgError{
					Arg:    "-fairgo",
					Value:  variants[i].Name,
					Reason: "two variants of one name",
				}
			}
			if src := variants[i].RoutesOf; src != "" && !seen[src] {
				return nil, &fairgo.ArgError{
					Arg:    "-fairgo",
					Value:  variants[i].Name,
					Reason: fmt.Sprintf("routes:%s names no variant before it", src),
				}
			}
			seen[variants[i].Name] = true
			out = append(out, Method{Name: variants[i].Name, Variant: &variants[i]})
		}
	}
	if len(out) == 0 {
		return nil, &fairgo.ArgError{Arg: "-algos", Value: list, Reason: "empty list"}
	}
	return out, nil
}

// caller enqueues calls of the methods for one rank on its stream.
type caller struct {
	idx  int // index among the testbed's local ranks
	rank *harness.Rank
	reds map[string]*hier.Reducer // by variant name
	// worlds are the world communicators of FlatRing and FlatTree
	// (harness.AlgoWorld), by method name; only those measured.
	worlds map[string]backend.Comm
	op     fairgo.Op
	works  []*hier.Work // fairgo calls whose completion is still to be checked
}

// call enqueues one allreduce of t with m on the rank's stream. t.Bytes
// must leave room for t.Count rounded up to a multiple of D (the naive
// hierarchy pads; padding elements are reduced too and never read back).
func (c *caller) call(ctx context.Context, m Method, t fairgo.Tensor) error {
	s := c.rank.Stream
	hr := c.rank.Hier
	cm := hr.Comms
	switch {
	case m.Variant != nil:
		w := c.reds[m.Name].AllReduce(ctx, t, c.op, hier.After(s))
		c.works = append(c.works, w)
		return w.StreamWait(ctx, s)
	case m.Name == Flat:
		return cm.World.AllReduce(t.Ptr, t.Ptr, t.Count, t.DType, c.op, s)
	case flatAlgos[m.Name] != "":
		w := c.worlds[m.Name]
		if w == nil {
			return fmt.Errorf("bench: %s: no %s world communicator", m.Name, flatAlgos[m.Name])
		}
		return w.AllReduce(t.Ptr, t.Ptr, t.Count, t.DType, c.op, s)
	case m.Name == Naive:
		g := hr.Grid
		D := int64(g.Devices)
		chunk := (t.Count + D - 1) / D
		if chunk*D*int64(t.DType.Size()) > t.Bytes {
			return fmt.Errorf(
				"bench: naive hierarchy: buffer of %d bytes has no room to pad %d elements to a multiple of %d",
				t.Bytes,
				t.Count,
				D,
			)
		}
		mine := t.Ptr + uintptr(int64(g.Local)*chunk*int64(t.DType.Size()))
		if D > 1 {
			if err := cm.IntraReduceScatter.ReduceScatter(t.Ptr, mine, chunk, t.DType, c.op, s); err != nil {
				return err
			}
		}
		if g.Machines > 1 {
			if err := cm.RailCollect.AllReduce(mine, mine, chunk, t.DType, c.op, s); err != nil {
				return err
			}
		}
		if D > 1 {
			return cm.IntraReduceScatter.AllGather(mine, t.Ptr, chunk, t.DType, s)
		}
		return nil
	}
	return fmt.Errorf("bench: %s: unknown method", m.Name)
}

// wait returns the first error of the fairgo calls enqueued since the last
// wait (their device work is complete once the stream is idle).
func (c *caller) wait(ctx context.Context) error {
	var errs []error
	for _, w := range c.works {
		errs = append(errs, w.Wait(ctx))
	}
	c.works = c.works[:0]
	return errors.Join(errs...)
}
