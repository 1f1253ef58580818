// Command fairbench times fairgo's two-level allreduce against the flat NCCL
// allreduce and the naive hand-written hierarchy, and prints a table like
// nccl-tests' all_reduce_perf:
//
//	fairbench -backend sim -machines 2 -devices 4 -b 1K -e 4M -f 4 -check
//	fairbench -backend cuda -machines 1 -devices 2 -b 1M -e 256M -f 4 -check   (cuda build, one process)
//	fairrun --emulate-machines 2 --nproc-per-node 4 -- fairbench -backend cuda -b 1M -e 256M -f 4
//
// Modes (-mode): sweep (sizes -b to -e by -f), overlap (-buckets calls of
// -bucket-bytes back to back, for each -parallelism), scale (sweep over
// -machines-list emulated machine counts, through fairrun on GPUs), links
// (2-rank allreduce over an NVLink pair and a network pair, for the model)
// model (fit the cost model to -in records and predict at scale) and report
// (a compact digest of -in records; with -plot and -csv, their plots and CSV).
// -json, -csv and -plot write the records and plots; on sim, timings are
// wall clock on the host, not GPU timings, and the output says so.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/bench"
	"github.com/fairgo/fairgo/bench/model"
	"github.com/fairgo/fairgo/hier"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "fairbench:", err)
		os.Exit(1)
	}
}

// options are the parsed command line.
type options struct {
	mode                        string
	backend                     string
	machines, devices           int
	begin, end, factor          int64
	dtype                       fairgo.DType
	op                          fairgo.Op
	warmup, iters, reps         int
	check                       bool
	seed                        uint64
	slice, flatThresh           int64
	parallelism                 []int
	buckets                     int
	bucketBytes                 int64
	algos                       []bench.Algorithm
	jsonOut, csvOut, plotDir    string
	label                       string
	machinesList                []int
	fairrun                     string
	link                        string
	in                          []string
	modelDevices                int
	modelMachines               []int
	modelSizes                  []float64
	nvAlpha, nvGBps             float64
	netAlpha, netGBps, netCap   float64
	netTotal                    float64
	peerAlpha                   float64
	jitter, timeout             time.Duration
	raw                         map[string]string // flags given, for the workers scale and links launch
	parallelismSet, machinesSet bool
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("fairbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	size := func(name string, dst *int64, def, usage string) {
		v, _ := bench.ParseSize(def)
		*dst = v
		fs.Var((*sizeValue)(dst), name, usage+" (K, M, G suffixes)")
	}
	fs.StringVar(&o.mode, "mode", "sweep", "sweep, overlap, scale, links, model, or report (digest of -in records, with -plot and -csv)")
	fs.StringVar(&o.backend, "backend", "sim", "where the ranks run: sim, or cuda (cuda build; one rank per process under a launcher)")
	fs.IntVar(&o.machines, "machines", 0, "machines M of a single-process testbed (default: sim 2, cuda 1)")
	fs.IntVar(&o.devices, "devices", 0, "devices per machine D (default: sim 2, cuda the GPUs visible / M; scale: 2)")
	size("b", &o.begin, "1M", "smallest size in bytes")
	size("e", &o.end, "64M", "largest size in bytes")
	fs.Int64Var(&o.factor, "f", 4, "size multiplication factor")
	dtype := fs.String("dtype", "float32", "element type (float16, bfloat16, float32, float64, int8, …)")
	op := fs.String("op", "sum", "reduction: sum, avg, max, min, prod")
	fs.IntVar(&o.warmup, "w", 2, "warm-up calls of each algorithm per size")
	fs.IntVar(&o.iters, "n", 5, "timed calls per repetition")
	fs.IntVar(&o.reps, "reps", 3, "repetitions (median and spread)")
	fs.BoolVar(&o.check, "check", false, "check every rank's result against a float64 reference")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the check inputs")
	size("slice", &o.slice, "0", "fairgo slice size in bytes (0: fairgo's default)")
	flat := fs.String("flat-threshold", "0", "fairgo flat threshold in bytes, 0 for the default, or never")
	par := fs.String("parallelism", "", "fairgo parallelism, a list (sweep uses the first; default: fairgo's, overlap 1,2,4,8)")
	fs.IntVar(&o.buckets, "buckets", 64, "overlap: buckets per round")
	size("bucket-bytes", &o.bucketBytes, "25M", "overlap: bytes per bucket")
	algos := fs.String("algos", "flat,naive,fairgo", "algorithms to run")
	fs.StringVar(&o.jsonOut, "json", "", "write the records as JSON lines to this file")
	fs.StringVar(&o.csvOut, "csv", "", "write the records as CSV to this file")
	fs.StringVar(&o.plotDir, "plot", "", "write PNG and SVG plots into this folder")
	fs.StringVar(&o.label, "label", "", "free text stored in every record")
	ml := fs.String("machines-list", "1,2,4", "scale: machine counts")
	fs.StringVar(&o.fairrun, "fairrun", "", "scale, links: the fairrun launcher (default: beside this program, else PATH)")
	fs.StringVar(&o.link, "link", "", "links: nvlink, net, or both (empty)")
	in := fs.String("in", "", "model, report: comma-separated JSON-lines files of records")
	fs.IntVar(&o.modelDevices, "model-devices", 8, "model: GPUs per machine of the predictions")
	mm := fs.String("model-machines", "1,2,4,8,16,32,64,128,256,512,1024", "model: machine counts of the predictions")
	ms := fs.String("model-sizes", "1M,16M,256M,1G", "model: sizes of the predictions")
	fs.Float64Var(&o.nvAlpha, "nvlink-alpha-us", 0, "model: NVLink latency in µs (with -nvlink-gbps; default: fit to link records)")
	fs.Float64Var(&o.nvGBps, "nvlink-gbps", 0, "model: NVLink bandwidth in GB/s")
	fs.Float64Var(&o.netAlpha, "net-alpha-us", 0, "model: network latency in µs (with -net-gbps; default: fit to link records)")
	fs.Float64Var(&o.netGBps, "net-gbps", 0, "model: network bandwidth per GPU in GB/s")
	fs.Float64Var(&o.netCap, "net-machine-gbps", 0, "model: cap on a machine's total network bandwidth in GB/s (0: none)")
	fs.Float64Var(&o.netTotal, "net-total-gbps", 0, "model: cap on all machines' network bandwidth together in GB/s, for emulated machines sharing one host (0: none)")
	fs.Float64Var(&o.peerAlpha, "peer-alpha-us", -1, "model: all-to-all cost per further peer in µs (negative: fit, else the network latency)")
	fs.DurationVar(&o.jitter, "jitter", 0, "sim: random delay before each device operation")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.raw = map[string]string{}
	fs.Visit(func(f *flag.Flag) { o.raw[f.Name] = f.Value.String() })
	_, o.parallelismSet = o.raw["parallelism"]
	_, o.machinesSet = o.raw["machines"]
	var err error
	if o.dtype, err = fairgo.ParseDType(*dtype); err != nil {
		return nil, err
	}
	if o.op, err = fairgo.ParseOp(*op); err != nil {
		return nil, err
	}
	switch *flat {
	case "never":
		o.flatThresh = hier.FlatNever
	default:
		if o.flatThresh, err = bench.ParseSize(*flat); err != nil {
			return nil, fmt.Errorf("-flat-threshold: %w", err)
		}
	}
	switch {
	case *par != "":
		if o.parallelism, err = bench.ParseIntList("-parallelism", *par); err != nil {
			return nil, err
		}
	case o.mode == "overlap":
		o.parallelism = []int{1, 2, 4, 8}
	}
	if o.algos, err = bench.ParseAlgorithms(*algos); err != nil {
		return nil, err
	}
	if o.machinesList, err = bench.ParseIntList("-machines-list", *ml); err != nil {
		return nil, err
	}
	if o.modelMachines, err = bench.ParseIntList("-model-machines", *mm); err != nil {
		return nil, err
	}
	for _, s := range strings.Split(*ms, ",") {
		v, err := bench.ParseSize(s)
		if err != nil {
			return nil, fmt.Errorf("-model-sizes: %w", err)
		}
		o.modelSizes = append(o.modelSizes, float64(v))
	}
	if *in != "" {
		o.in = strings.Split(*in, ",")
	}
	switch o.mode {
	case "sweep", "overlap", "scale", "links", "model", "report":
	default:
		return nil, &fairgo.ArgError{Arg: "-mode", Value: o.mode, Reason: "one of sweep, overlap, scale, links, model, report"}
	}
	switch o.link {
	case "", "nvlink", "net":
	default:
		return nil, &fairgo.ArgError{Arg: "-link", Value: o.link, Reason: "nvlink, net, or empty for both"}
	}
	return o, nil
}

// sizeValue is a flag of bytes with K, M, G suffixes.
type sizeValue int64

func (v *sizeValue) String() string { return bench.FormatSize(int64(*v)) }
func (v *sizeValue) Set(s string) error {
	n, err := bench.ParseSize(s)
	*v = sizeValue(n)
	return err
}

// sizes is the sweep's size list.
func (o *options) sizes() ([]int64, error) { return bench.Sizes(o.begin, o.end, o.factor) }

func (o *options) config(sizes []int64) bench.Config {
	return bench.Config{Sizes: sizes, DType: o.dtype, Op: o.op, Warmup: o.warmup, Iters: o.iters, Reps: o.reps,
		Check: o.check, Seed: o.seed, Algorithms: o.algos, Slice: o.slice, FlatThresh: o.flatThresh,
		Parallelism: o.parallelism, Label: o.label}
}

func (o *options) spec(machines, devices int) bench.TestbedSpec {
	return bench.TestbedSpec{Machines: machines, Devices: devices, Seed: int64(o.seed), Jitter: o.jitter}
}

// grid is the single-process grid: the flags, else the backend's default.
func (o *options) grid() (int, int) {
	m, d := o.machines, o.devices
	if o.backend == "sim" {
		if m == 0 {
			m = 2
		}
		if d == 0 {
			d = 2
		}
		return m, d
	}
	if m == 0 {
		m = 1
	}
	if d == 0 {
		if n, ok := gpuCount(); ok {
			d = max(n/m, 1)
		} else {
			d = 2
		}
	}
	return m, d
}

// workerArgs are the flags a launched worker gets: the ones given, less
// those that only concern this process, with mode replaced.
func (o *options) workerArgs(mode string, extra ...string) []string {
	args := []string{"-mode", mode, "-backend", o.backend}
	skip := map[string]bool{"mode": true, "backend": true, "json": true, "csv": true, "plot": true, "machines": true,
		"devices": true, "machines-list": true, "fairrun": true, "link": true, "in": true, "timeout": true}
	for k, v := range o.raw {
		if !skip[k] && !strings.HasPrefix(k, "model-") {
			args = append(args, "-"+k+"="+v)
		}
	}
	return append(args, extra...)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var recs []bench.Record
	root := true
	switch o.mode {
	case "sweep", "overlap":
		recs, root, err = runSingle(ctx, o, stdout, stderr)
	case "scale":
		recs, err = runScale(ctx, o, stdout, stderr)
	case "links":
		recs, root, err = runLinks(ctx, o, stdout, stderr)
	case "model":
		return runModel(o, stdout)
	case "report":
		if len(o.in) == 0 {
			return &fairgo.ArgError{Arg: "-in", Value: "", Reason: "report mode needs records (JSON lines from -json)"}
		}
		if recs, err = bench.ReadJSONLFiles(o.in); err != nil {
			return err
		}
		err = bench.Summary(stdout, recs)
	}
	if root {
		err = errors.Join(err, writeOutputs(o, recs, stdout))
	}
	return err
}

// runSingle runs sweep or overlap on one testbed (this process's ranks).
func runSingle(ctx context.Context, o *options, stdout, stderr io.Writer) ([]bench.Record, bool, error) {
	sizes, err := o.sizes()
	if err != nil && o.mode == "sweep" {
		return nil, true, err
	}
	m, d := o.grid()
	tb, err := bench.Open(ctx, o.backend, o.spec(m, d))
	if err != nil {
		return nil, true, err
	}
	defer tb.Close()
	cfg := o.config(sizes)
	root := tb.Root()
	if root {
		cfg.Table = bench.NewTable(stdout)
		cfg.Progress = progress(stderr, o.mode)
	}
	var recs []bench.Record
	if o.mode == "overlap" {
		cfg.Buckets, cfg.BucketBytes = o.buckets, o.bucketBytes
		recs, err = bench.RunOverlap(ctx, tb, cfg)
	} else {
		recs, err = bench.Run(ctx, tb, cfg)
	}
	if cfg.Progress != nil {
		cfg.Progress.Close()
	}
	if cfg.Table != nil {
		err = errors.Join(err, cfg.Table.Err())
		if tb.Info().SimTimings {
			cfg.Table.Footer("sim timings are wall clock on the simulated cluster, not GPU timings")
		}
	}
	return recs, root, err
}

func progress(stderr io.Writer, name string) bench.Progress {
	if f, ok := stderr.(*os.File); ok {
		return bench.NewProgress(f, name)
	}
	return nil
}

// runScale sweeps over machine counts: in this process on sim, through
// fairrun --emulate-machines on GPUs.
func runScale(ctx context.Context, o *options, stdout, stderr io.Writer) ([]bench.Record, error) {
	sizes, err := o.sizes()
	if err != nil {
		return nil, err
	}
	d := o.devices
	if d == 0 {
		d = 2
	}
	var all []bench.Record
	for _, m := range o.machinesList {
		fmt.Fprintf(stdout, "# scale: %d machine(s) × %d devices\n", m, d)
		var recs []bench.Record
		if o.backend == "sim" {
			tb, err := bench.Open(ctx, "sim", o.spec(m, d))
			if err != nil {
				return all, err
			}
			cfg := o.config(sizes)
			cfg.Table = bench.NewTable(stdout)
			recs, err = bench.Run(ctx, tb, cfg)
			err = errors.Join(err, tb.Close())
			if err != nil {
				return all, err
			}
		} else {
			fr, err := bench.FindFairrun(o.fairrun)
			if err != nil {
				return all, err
			}
			self, err := os.Executable()
			if err != nil {
				return all, err
			}
			if recs, err = bench.LaunchEmulated(ctx, fr, m, m*d, self, o.workerArgs("sweep"), stdout, stderr); err != nil {
				return all, err
			}
		}
		all = append(all, recs...)
	}
	printScale(stdout, all)
	return all, nil
}

// printScale prints fairgo's speedup per machine count and size.
func printScale(w io.Writer, recs []bench.Record) {
	type key struct {
		m     int
		bytes int64
		dt    string
	}
	times := map[key]map[string]float64{}
	var order []key
	for _, r := range recs {
		k := key{r.Machines, r.Bytes, r.DType}
		if times[k] == nil {
			times[k] = map[string]float64{}
			order = append(order, k)
		}
		times[k][r.Algorithm] = r.TimeUS
	}
	fmt.Fprintf(w, "#\n# scale summary: median time per call (us); fairgo/x = time(x)/time(fairgo)\n")
	fmt.Fprintf(w, "# %8s %8s %9s %12s %12s %12s %12s %12s\n", "machines", "size", "type", "flat", "naive", "fairgo", "fairgo/flat", "fairgo/naive")
	ratio := func(a, b float64) string {
		if a <= 0 || b <= 0 {
			return "-"
		}
		return strconv.FormatFloat(a/b, 'f', 2, 64)
	}
	for _, k := range order {
		t := times[k]
		fmt.Fprintf(w, "  %8d %8s %9s %12.1f %12.1f %12.1f %12s %12s\n", k.m, bench.FormatSize(k.bytes), k.dt,
			t["flat"], t["naive"], t["fairgo"], ratio(t["flat"], t["fairgo"]), ratio(t["naive"], t["fairgo"]))
	}
}

// runLinks measures the 2-rank allreduce of an NVLink pair and of a network
// pair, and prints their fitted latency and bandwidth.
func runLinks(ctx context.Context, o *options, stdout, stderr io.Writer) ([]bench.Record, bool, error) {
	sizes, err := o.sizes()
	if err != nil {
		return nil, true, err
	}
	measure := func(tb bench.Testbed, link string) ([]bench.Record, error) {
		defer tb.Close()
		if w := tb.Info().World(); w != 2 {
			return nil, fmt.Errorf("links: a link is measured on 2 ranks, this testbed has %d", w)
		}
		cfg := o.config(sizes)
		cfg.Algorithms, cfg.Kind, cfg.Link = []bench.Algorithm{bench.Flat}, bench.KindLink, link
		if tb.Root() {
			cfg.Table = bench.NewTable(stdout)
		}
		return bench.Run(ctx, tb, cfg)
	}
	want := func(l string) bool { return o.link == "" || o.link == l }
	var all []bench.Record
	root := true
	if underLauncher() { // a worker of the network pair (or of any 2-rank job)
		tb, err := bench.Open(ctx, o.backend, o.spec(0, 0))
		if err != nil {
			return nil, true, err
		}
		link := "nvlink"
		if tb.Info().Machines > 1 {
			link = "net"
		}
		root = tb.Root()
		recs, err := measure(tb, link)
		return recs, root, err
	}
	for _, l := range []struct {
		name string
		m, d int
	}{{"nvlink", 1, 2}, {"net", 2, 1}} {
		if !want(l.name) {
			continue
		}
		var recs []bench.Record
		if o.backend == "sim" || l.name == "nvlink" {
			tb, err := bench.Open(ctx, o.backend, o.spec(l.m, l.d))
			if err != nil {
				return all, true, err
			}
			if recs, err = measure(tb, l.name); err != nil {
				return all, true, err
			}
		} else {
			fr, err := bench.FindFairrun(o.fairrun)
			if err != nil {
				return all, true, err
			}
			self, err := os.Executable()
			if err != nil {
				return all, true, err
			}
			if recs, err = bench.LaunchEmulated(ctx, fr, 2, 2, self, o.workerArgs("links", "-link", "net"), stdout, stderr); err != nil {
				return all, true, err
			}
		}
		all = append(all, recs...)
	}
	// The fit, for the record.
	for _, l := range []string{"nvlink", "net"} {
		var pts []model.Point
		for _, r := range all {
			if r.Link == l {
				pts = append(pts, model.Point{Bytes: float64(r.Bytes), Seconds: r.TimeUS / 1e6})
			}
		}
		if len(pts) == 0 {
			continue
		}
		if fit, err := model.FitLink(pts); err == nil {
			fmt.Fprintf(stdout, "# link %s: %v (fit of T = 2α + n/B to %d sizes)\n", l, fit, len(pts))
		} else {
			fmt.Fprintf(stdout, "# link %s: no fit: %v\n", l, err)
		}
	}
	return all, root, nil
}

func runModel(o *options, stdout io.Writer) error {
	if len(o.in) == 0 {
		return &fairgo.ArgError{Arg: "-in", Value: "", Reason: "model mode needs records (JSON lines from -json)"}
	}
	recs, err := bench.ReadJSONLFiles(o.in)
	if err != nil {
		return err
	}
	mo := bench.ModelOptions{
		NetPerMachine: o.netCap * 1e9, NetTotal: o.netTotal * 1e9, PeerAlpha: o.peerAlpha * 1e-6,
		Devices: o.modelDevices, Machines: o.modelMachines, Sizes: o.modelSizes, Parallelism: 0,
		IncludeSim: o.backend == "sim" && o.raw["backend"] == "sim",
	}
	if o.peerAlpha < 0 {
		mo.PeerAlpha = -1
	}
	if o.nvGBps > 0 {
		mo.Intra = model.Link{Alpha: o.nvAlpha * 1e-6, BW: o.nvGBps * 1e9}
	}
	if o.netGBps > 0 {
		mo.Net = model.Link{Alpha: o.netAlpha * 1e-6, BW: o.netGBps * 1e9}
	}
	if len(o.parallelism) > 0 {
		mo.Parallelism = o.parallelism[0]
	}
	return bench.ModelReport(stdout, recs, mo)
}

// writeOutputs writes the records as JSON lines and CSV, and the plots.
func writeOutputs(o *options, recs []bench.Record, stdout io.Writer) error {
	var errs []error
	write := func(path string, fn func(io.Writer, []bench.Record) error) {
		if path == "" {
			return
		}
		f, err := os.Create(path)
		if err != nil {
			errs = append(errs, err)
			return
		}
		errs = append(errs, fn(f, recs), f.Close())
	}
	write(o.jsonOut, bench.WriteJSONL)
	write(o.csvOut, bench.WriteCSV)
	if o.plotDir != "" {
		files, err := bench.Plot(o.plotDir, recs)
		errs = append(errs, err)
		if len(files) > 0 {
			fmt.Fprintf(stdout, "# plots: %d files (PNG and SVG) in %s\n", len(files), o.plotDir)
		}
	}
	return errors.Join(errs...)
}
