package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/bench"
	"github.com/fairgo/fairgo/bench/model"
	"github.com/fairgo/fairgo/bench/report"
	"github.com/fairgo/fairgo/internal/cli"
	"github.com/fairgo/fairgo/internal/harness"
)

// The flags come in groups; a flag belongs to one group, so it means the
// same in every command that takes it, and a command's -h lists only the
// groups it takes. A group that a launched worker needs again can give its
// flags back as arguments (args).

// sizeValue is a flag of bytes with K, M, G suffixes. It keeps the text it
// was given: errors echo it, in the user's units, and workers get it.
type sizeValue struct {
	n    *int64
	text string
}

func (v *sizeValue) String() string {
	switch {
	case v == nil || v.n == nil:
		return ""
	case v.text != "":
		return v.text
	}
	return bench.FormatSize(*v.n)
}

func (v *sizeValue) Set(s string) error {
	n, err := bench.ParseSize(s)
	if err != nil {
		return cli.Reason(err)
	}
	*v.n, v.text = n, s
	return nil
}

// sizeFlag declares a size flag of bytes, with K, M, G suffixes, into dst.
func sizeFlag(fs *flag.FlagSet, dst *int64, name, def, usage string) *sizeValue {
	*dst, _ = bench.ParseSize(def)
	v := &sizeValue{n: dst, text: def}
	fs.Var(v, name, usage+" (K, M, G suffixes)")
	return v
}

// durationValue is a flag of a Go duration that keeps the text it was
// given, as sizeValue does: errors echo "60s", not "1m0s".
type durationValue struct {
	d    *time.Duration
	text string
}

func (v *durationValue) String() string {
	switch {
	case v == nil || v.d == nil:
		return "0s" // the zero value, which flag's help does not print as a default
	case v.text != "":
		return v.text
	}
	return v.d.String()
}

func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("not a duration (300ms, 1.5s, 2m, 1h)")
	}
	*v.d, v.text = d, s
	return nil
}

// durationFlag declares a duration flag into dst, with def as its default
// (a valid duration).
func durationFlag(fs *flag.FlagSet, dst *time.Duration, name, def, usage string) *durationValue {
	*dst, _ = time.ParseDuration(def)
	v := &durationValue{d: dst, text: def}
	fs.Var(v, name, usage)
	return v
}

// given lists the flags of names that were set, as "-name=value".
func given(fs *flag.FlagSet, names ...string) []string {
	var out []string
	fs.Visit(func(f *flag.Flag) {
		for _, n := range names {
			if f.Name == n {
				out = append(out, "-"+f.Name+"="+f.Value.String())
			}
		}
	})
	return out
}

// backendFlags: where the ranks run.
type backendFlags struct {
	backend    string
	jitter     time.Duration
	jitterFlag *durationValue // -jitter as given
}

func (b *backendFlags) register(fs *flag.FlagSet) {
	cli.Choice(
		fs,
		&b.backend,
		"backend",
		"sim",
		"the `backend` the ranks run on: sim, or cuda (GPUs; one rank per process under a launcher)",
		cli.OneOf("sim", "cuda"),
	)
	b.jitterFlag = durationFlag(fs, &b.jitter, "jitter", "0s", "sim: random `delay` before each device operation")
}

// check refuses what the flags cannot mean.
func (b *backendFlags) check(fs *flag.FlagSet) error {
	if b.jitter < 0 {
		return cli.Usagef("-jitter %s: negative", b.jitterFlag)
	}
	return nil
}

func (b *backendFlags) args(fs *flag.FlagSet) []string {
	return append([]string{"-backend=" + b.backend}, given(fs, "jitter")...)
}

// gridFlags: the grid one process drives (ignored under a launcher, where
// the grid is discovered).
type gridFlags struct {
	machines, devices int
	withMachines      bool
}

func (g *gridFlags) register(fs *flag.FlagSet, withMachines bool) {
	g.withMachines = withMachines
	if withMachines {
		fs.IntVar(
			&g.machines,
			"machines",
			0,
			"machines M one process drives (default: sim 2, cuda 1; under a launcher the grid is discovered)",
		)
	}
	fs.IntVar(&g.devices, "devices", 0, "devices per machine D (default: sim 2, cuda the visible GPUs / M; scale: 2)")
}

// check refuses negative counts (0 is the default).
func (g *gridFlags) check() error {
	switch {
	case g.machines < 0:
		return cli.Usagef("-machines %d: negative", g.machines)
	case g.devices < 0:
		return cli.Usagef("-devices %d: negative", g.devices)
	}
	return nil
}

// grid resolves the defaults for a backend.
func (g *gridFlags) grid(backend string) (int, int) {
	m, d := g.machines, g.devices
	if m == 0 {
		m = map[bool]int{true: 2, false: 1}[backend == "sim"]
	}
	if d == 0 {
		d = 2
		if n, ok := gpuCount(); ok && backend != "sim" {
			d = max(n/m, 1)
		}
	}
	return m, d
}

// sizeFlags: the sizes of a sweep, as nccl-tests reads them.
type sizeFlags struct {
	begin, end, factor int64
	b, e               *sizeValue // the flags, which echo the sizes as given
}

func (s *sizeFlags) register(fs *flag.FlagSet) {
	s.b = sizeFlag(fs, &s.begin, "b", "1M", "smallest `size` in bytes")
	s.e = sizeFlag(fs, &s.end, "e", "64M", "largest `size` in bytes")
	fs.Int64Var(&s.factor, "f", 4, "size multiplication factor")
}

// sizes are the sizes of the flags; its errors are usage errors that echo
// the sizes as given.
func (s *sizeFlags) sizes() ([]int64, error) {
	switch {
	case s.begin < 1:
		return nil, cli.Usagef("-b %s: must be at least 1 byte", s.b)
	case s.end < s.begin:
		return nil, cli.Usagef("-e %s: smaller than -b %s", s.e, s.b)
	}
	sizes, err := bench.Sizes(s.begin, s.end, s.factor)
	return sizes, cli.Arg(err)
}

// holds checks that the largest size holds one element of dt.
func (s *sizeFlags) holds(dt fairgo.DType) error {
	if s.end < int64(dt.Size()) {
		return cli.Usagef("-e %s: holds no %s (%d bytes)", s.e, dt, dt.Size())
	}
	return nil
}

func (s *sizeFlags) args(fs *flag.FlagSet) []string { return given(fs, "b", "e", "f") }

// timingFlags: how each point is measured and labelled.
type timingFlags struct {
	dtype, op, run, label string
	workWait              string // -work-wait: each or end
	warmup, iters, reps   int
	minRounds             int
	repBytes              int64
	check                 bool
	seed                  uint64
	timeout               time.Duration
	timeoutFlag           *durationValue // -timeout as given
}

func (t *timingFlags) register(fs *flag.FlagSet) {
	cli.Choice(
		fs,
		&t.dtype,
		"dtype",
		"float32",
		"element `type`: float16, bfloat16, float32, float64, int8, uint8, int32, uint32, int64, uint64",
		cli.DType(),
	)
	cli.Choice(fs, &t.op, "op", "sum", "`reduction`: sum, avg, max, min, prod", cli.Op)
	fs.IntVar(&t.warmup, "w", 1, "untimed rounds of each method per point")
	fs.IntVar(&t.iters, "n", 1, "calls back to back per timed repetition (1: one call at a time)")
	fs.IntVar(&t.reps, "reps", 3, "timed repetitions of each method, alternating, each in another order (median and spread)")
	sizeFlag(fs, &t.repBytes, "rep-bytes", "0",
		"each repetition repeats its -n calls, waiting for them each round, until the rounds moved this many `bytes` "+
			"(steadies small sizes; 0: one round)")
	fs.IntVar(&t.minRounds, "min-rounds", 1,
		"the fewest rounds a repetition times, whatever -rep-bytes asks (at the largest sizes -rep-bytes is one "+
			"call, and a median of three calls moves with one slow call)")
	cli.Choice(fs, &t.workWait, "work-wait", "each",
		"`when` fairgo's Works are waited for: each round of -rep-bytes, or the end of the repetition "+
			"(its rounds then end, as the baselines' do, when the device has run them)",
		func(s string) error {
			if s != "each" && s != "end" {
				return errors.New("not one of each, end")
			}
			return nil
		})
	fs.BoolVar(&t.check, "check", false, "check every rank's result against a float64 reference")
	fs.Uint64Var(&t.seed, "seed", 1, "seed of the check inputs and of the sim's delays")
	fs.StringVar(&t.run, "run", "", "the run's label, stored in every record (targets group records by it)")
	fs.StringVar(&t.label, "label", "", "free text stored in every record")
	t.timeoutFlag = durationFlag(fs, &t.timeout, "timeout", "30m", "give up after this `duration`")
}

func (t *timingFlags) args(fs *flag.FlagSet) []string {
	return given(fs, "dtype", "op", "w", "n", "reps", "rep-bytes", "min-rounds", "check", "seed", "run", "label")
}

// config is the bench configuration the flags describe; its errors are
// usage errors.
func (t *timingFlags) config() (bench.Config, error) {
	dt, err := fairgo.ParseDType(t.dtype)
	if err != nil {
		return bench.Config{}, cli.Arg(err)
	}
	op, err := fairgo.ParseOp(t.op)
	if err != nil {
		return bench.Config{}, cli.Arg(err)
	}
	switch {
	case t.warmup < 0:
		return bench.Config{}, cli.Usagef("-w %d: negative", t.warmup)
	case t.iters < 1:
		return bench.Config{}, cli.Usagef("-n %d: must be at least 1", t.iters)
	case t.reps < 1:
		return bench.Config{}, cli.Usagef("-reps %d: must be at least 1", t.reps)
	case t.minRounds < 1 || t.minRounds > bench.MaxRounds:
		return bench.Config{}, cli.Usagef("-min-rounds %d: not within 1–%d", t.minRounds, bench.MaxRounds)
	case t.timeout <= 0:
		return bench.Config{}, cli.Usagef("-timeout %s: must be positive", t.timeoutFlag)
	}
	return bench.Config{DType: dt, Op: op, Warmup: t.warmup, Iters: t.iters, Reps: t.reps, RepBytes: t.repBytes,
		MinRounds:  t.minRounds,
		WorksAtEnd: t.workWait == "end", Check: t.check, Seed: t.seed, Run: t.run, Label: t.label}, nil
}

// variantList is the repeatable -fairgo flag.
type variantList []bench.Variant

func (v *variantList) String() string {
	var s []string
	for _, x := range *v {
		s = append(s, variantString(x))
	}
	return strings.Join(s, " ")
}

func (v *variantList) Set(s string) error {
	x, err := bench.ParseVariant(s)
	if err != nil {
		return cli.Reason(err)
	}
	*v = append(*v, x)
	return nil
}

func variantString(v bench.Variant) string {
	if v.Spec == "" {
		return v.Name
	}
	return v.Name + "=" + v.Spec
}

// methodFlags: what is measured.
type methodFlags struct {
	algos    string
	variants variantList
}

// methodNames checks a comma-separated list of methods (-algos).
func methodNames(list string) error {
	valid := append(slices.Clone(bench.Baselines), bench.DefaultVariant)
	n := 0
	for _, f := range strings.Split(list, ",") {
		switch f = strings.TrimSpace(f); {
		case f == "":
		case slices.Contains(valid, f):
			n++
		default:
			return fmt.Errorf("%q is not one of %s", f, strings.Join(valid, ", "))
		}
	}
	if n == 0 {
		return fmt.Errorf("no method (%s)", strings.Join(valid, ", "))
	}
	return nil
}

func (m *methodFlags) register(fs *flag.FlagSet) {
	cli.Choice(
		fs,
		&m.algos,
		"algos",
		bench.DefaultMethods,
		"`methods` to measure, comma-separated: flat (NCCL's choice), "+
			"flat-ring and flat-tree (NCCL_ALGO=allreduce:ring, allreduce:tree, each on a world communicator of its own), "+
			"naive, fairgo (every -fairgo variant)",
		methodNames,
	)
	fs.Var(
		&m.variants,
		"fairgo",
		"a fairgo variant, measured as its own column, repeatable: NAME or NAME=key:value,… with keys\n"+
			"algo (any of hier's algorithms: auto, flat, flat-ring, flat-tree, rail-a2a, rail-rsag, rail-allreduce,\n"+
			"halving-doubling, recursive-doubling), slice (size), parallelism, "+
			"flat (flat threshold: size or never), spin (duration),\n"+
			"inline (on, off; default on: the bench gives every rank a goroutine), rail (serial, overlap), check (on, off),\n"+
			"fp (size: the largest call whose check travels in its data; 0: a separate check; every variant has a 5-minute watchdog),\n"+
			"shm (on, off: off checks through the collective, never through shared memory),\n"+
			"routes (an earlier variant's NAME: follow its routes, one calibration for both);\n"+
			"e.g. -fairgo rsag=algo:rail-rsag,slice:64M or -fairgo fairgo -fairgo nocheck=check:off,routes:fairgo\n"+
			"(default: one variant \"fairgo\" with fairgo's defaults)",
	)
}

// methods are the methods of the flags; its errors are usage errors.
func (m *methodFlags) methods() ([]bench.Method, error) {
	ms, err := bench.Methods(m.algos, m.variants)
	return ms, cli.Arg(err)
}

func (m *methodFlags) args(fs *flag.FlagSet) []string {
	out := given(fs, "algos")
	for _, v := range m.variants {
		out = append(out, "-fairgo="+variantString(v))
	}
	return out
}

// overlapFlags: the bucket round of overlap.
type overlapFlags struct {
	buckets     int
	bucketBytes int64
	flag        *sizeValue // -bucket-bytes as given
}

func (o *overlapFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&o.buckets, "buckets", 64, "buckets per round")
	o.flag = sizeFlag(fs, &o.bucketBytes, "bucket-bytes", "25M", "`size` of a bucket in bytes")
}

// check refuses an empty round, or buckets that hold no element of dt.
func (o *overlapFlags) check(dt fairgo.DType) error {
	switch {
	case o.buckets < 1:
		return cli.Usagef("-buckets %d: must be at least 1", o.buckets)
	case o.bucketBytes < int64(dt.Size()):
		return cli.Usagef("-bucket-bytes %s: holds no %s (%d bytes)", o.flag, dt, dt.Size())
	}
	return nil
}

// outputFlags: where records, CSV and plots go.
type outputFlags struct{ json, csv, plot string }

func (o *outputFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&o.json, "json", "", "write the records as JSON lines to this file")
	fs.StringVar(&o.csv, "csv", "", "write the records as CSV to this file")
	fs.StringVar(&o.plot, "plot", "", "write PNG and SVG plots into this folder")
}

// launchFlags: how scale and links start workers on GPUs.
type launchFlags struct{ fairrun, fairrunFlags string }

func (l *launchFlags) register(fs *flag.FlagSet) {
	fs.StringVar(
		&l.fairrun,
		"fairrun",
		"",
		"the fairrun launcher for emulated machines (default: beside this program, else PATH)",
	)
	fs.StringVar(&l.fairrunFlags, "fairrun-flags", "", `further fairrun flags, e.g. "--nic-gbit 10 --mps on"`)
}

// inputFlags: records to read.
type inputFlags struct {
	in         string
	includeSim bool
}

func (i *inputFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&i.in, "in", "", "comma-separated JSON-lines files of records (from -json)")
	fs.BoolVar(&i.includeSim, "include-sim", false, "count records with sim timings (wall clock, not GPU timings)")
}

// check refuses a command line without records.
func (i *inputFlags) check() error {
	if strings.Trim(i.in, ", ") == "" {
		return cli.Usagef("-in %q: needs records (JSON lines from -json)", i.in)
	}
	return nil
}

// records reads the records; a file that cannot be read is a failure,
// not a usage error.
func (i *inputFlags) records() ([]bench.Record, error) {
	return bench.ReadJSONLFiles(strings.Split(i.in, ","))
}

// linkFlags: links given to the model instead of fitted (model, targets).
type linkFlags struct {
	nvAlpha, nvGBps, netAl, netGBs float64
}

func (l *linkFlags) register(fs *flag.FlagSet) {
	fs.Float64Var(&l.nvAlpha, "nvlink-alpha-us", 0, "NVLink latency in µs (with -nvlink-gbps; default: fitted)")
	fs.Float64Var(&l.nvGBps, "nvlink-gbps", 0, "NVLink bandwidth in GB/s (default: fitted)")
	fs.Float64Var(&l.netAl, "net-alpha-us", 0, "network latency in µs (with -net-gbps; default: fitted)")
	fs.Float64Var(&l.netGBs, "net-gbps", 0, "network bandwidth of one NIC in GB/s (default: fitted)")
}

// links returns the given links (a zero Link where fitted).
func (l *linkFlags) links() (intra, net model.Link) {
	if l.nvGBps > 0 {
		intra = model.Link{Alpha: l.nvAlpha * 1e-6, BW: l.nvGBps * 1e9}
	}
	if l.netGBs > 0 {
		net = model.Link{Alpha: l.netAl * 1e-6, BW: l.netGBs * 1e9}
	}
	return intra, net
}

// modelFlags: the model's given links and its predictions.
type modelFlags struct {
	linkFlags
	devices, parallelism int
	machines, sizes      string
	gbit                 float64
}

func (m *modelFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&m.devices, "model-devices", 8, "GPUs per machine of the predictions")
	fs.StringVar(&m.machines, "model-machines", "8,16,32,64", "machine counts of the predictions")
	fs.StringVar(&m.sizes, "model-sizes", "1M,16M,256M,1G", "sizes of the predictions")
	fs.IntVar(&m.parallelism, "model-parallelism", 0, "fairgo's parallelism in the predictions (0: fairgo's default)")
	fs.Float64Var(&m.gbit, "nic-gbit", 0,
		"fit to the testbed records of this NIC rate in Gbit/s (0: every record, which must share one rate)")
	m.linkFlags.register(fs)
}

// options are the model's options of the flags; its errors are usage
// errors.
func (m *modelFlags) options(includeSim bool) (report.ModelOptions, error) {
	o := report.ModelOptions{Devices: m.devices, Parallelism: m.parallelism, IncludeSim: includeSim, NICGbit: m.gbit}
	var err error
	if o.Machines, err = bench.ParseIntList("-model-machines", m.machines); err != nil {
		return o, cli.Arg(err)
	}
	for _, s := range strings.Split(m.sizes, ",") {
		v, err := bench.ParseSize(s)
		if err != nil {
			return o, cli.Usagef("-model-sizes %s: %w", m.sizes, cli.Reason(err))
		}
		o.Sizes = append(o.Sizes, float64(v))
	}
	o.Intra, o.Net = m.links()
	switch {
	case m.devices < 1:
		return o, cli.Usagef("-model-devices %d: must be at least 1", m.devices)
	case m.parallelism < 0:
		return o, cli.Usagef("-model-parallelism %d: negative", m.parallelism)
	case m.gbit < 0 || math.IsNaN(m.gbit) || math.IsInf(m.gbit, 0):
		return o, cli.Usagef("-nic-gbit %g: must be positive, or 0 for every record", m.gbit)
	}
	return o, nil
}

// targetFlags: the targets' inputs and output.
type targetFlags struct {
	linkFlags
	out, variant, enqueue, enqueueBench, sets, hook string
	hookFiles                                       []string // -hook expanded (check)
}

// targetSets checks a comma-separated list of target sets (-set).
func targetSets(list string) error {
	n := 0
	for _, s := range strings.Split(list, ",") {
		switch s = strings.TrimSpace(s); {
		case s == "":
		case s == "all" || slices.Contains(report.TargetSets, s):
			n++
		default:
			return fmt.Errorf("%q is not one of %s, all", s, strings.Join(report.TargetSets, ", "))
		}
	}
	if n == 0 {
		return fmt.Errorf("no set (%s, all)", strings.Join(report.TargetSets, ", "))
	}
	return nil
}

func (t *targetFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&t.out, "out", "", "write the targets as JSON to this file (e.g. bench/results/targets.json)")
	cli.Choice(
		fs,
		&t.sets,
		"set",
		"all",
		"the `sets` of targets, comma-separated: S (S1–S8 across node counts, and T6), "+
			"T (T1–T8 on NVLink), U (U1–U7 on one GPU), or all",
		targetSets,
	)
	fs.StringVar(&t.variant, "variant", bench.DefaultVariant, "the fairgo variant the targets are about")
	fs.StringVar(
		&t.enqueue,
		"enqueue",
		"",
		"T6: µs to enqueue one single-slice AllReduce, or a file of `go test -bench` output (text or -json)",
	)
	fs.StringVar(
		&t.enqueueBench,
		"enqueue-bench",
		"Enqueue",
		"T6: the benchmarks of the -enqueue file to read (a regular expression)",
	)
	fs.StringVar(
		&t.hook,
		"hook",
		"",
		"S7: the training runs' `files` (examples/ddp_torch's --losses-out, e.g. resnet-2x2-tree.json), "+
			"comma-separated, each a file or a glob",
	)
	t.linkFlags.register(fs) // T7's model
}

func (t *targetFlags) options(includeSim bool) (report.TargetOptions, error) {
	o := report.TargetOptions{Variant: t.variant, IncludeSim: includeSim}
	var sets []string
	for _, s := range strings.Split(t.sets, ",") {
		if s = strings.TrimSpace(s); s != "" {
			sets = append(sets, s)
		}
	}
	if !slices.Contains(sets, "all") {
		o.Sets = sets // nil: every set
	}
	o.Intra, o.Net = t.links()
	if t.enqueue != "" {
		e, err := report.ParseEnqueue(t.enqueue, t.enqueueBench)
		if err != nil {
			return o, err
		}
		o.Enqueue = e
	}
	if len(t.hookFiles) > 0 {
		var err error
		if o.Hooks, err = report.ParseHookRuns(t.hookFiles); err != nil {
			return o, err
		}
	}
	return o, nil
}

// check expands -hook before any record is read: a pattern that names no
// file is a usage error.
func (t *targetFlags) check() (err error) {
	t.hookFiles, err = hookFiles(t.hook)
	return err
}

// hookFiles expands -hook: comma-separated files or globs, each of which
// must name at least one file.
func hookFiles(list string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(list, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		m, err := filepath.Glob(p)
		if err != nil {
			return nil, cli.Usagef("-hook %s: %v", p, err)
		}
		if len(m) == 0 {
			return nil, cli.Usagef("-hook %s: no such file", p)
		}
		out = append(out, m...)
	}
	return out, nil
}

// nodesFlags: the nodes report's testbed, variant, given links and plot.
type nodesFlags struct {
	linkFlags
	gbit          float64
	variant, plot string
}

func (n *nodesFlags) register(fs *flag.FlagSet) {
	fs.Float64Var(&n.gbit, "nic-gbit", report.DefaultNodesGbit,
		"the testbed's NIC rate in Gbit/s whose layouts are compared")
	fs.StringVar(&n.variant, "variant", bench.DefaultVariant, "the fairgo variant compared with the best baseline")
	fs.StringVar(&n.plot, "plot", "", "write the plot ("+report.NodesPlotName+".png and .svg) into this folder")
	n.linkFlags.register(fs) // the testbed's model
}

// options are the nodes report's options; its errors are usage errors.
func (n *nodesFlags) options(includeSim bool) (report.NodesOptions, error) {
	o := report.NodesOptions{Variant: n.variant, NICGbit: n.gbit, IncludeSim: includeSim}
	o.Intra, o.Net = n.links()
	if n.gbit <= 0 {
		return o, cli.Usagef("-nic-gbit %g: must be positive", n.gbit)
	}
	return o, nil
}

// spec is the testbed spec of a single-process grid.
func spec(b backendFlags, t timingFlags, m, d int) harness.Spec {
	return harness.Spec{Machines: m, Devices: d, Seed: int64(t.seed), Jitter: b.jitter}
}

// linkName checks -link.
func linkName(s string) error {
	switch s {
	case "", "nvlink", "net":
		return nil
	}
	return errors.New("not one of nvlink, net, or empty for both")
}
