package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"strings"

	"github.com/fairgo/fairgo/bench"
	"github.com/fairgo/fairgo/bench/model"
	"github.com/fairgo/fairgo/bench/report"
	"github.com/fairgo/fairgo/internal/cli"
	"github.com/fairgo/fairgo/internal/harness"
)

// measureFn is bench.Sweep or bench.Overlap.
type measureFn func(context.Context, *harness.Testbed, bench.Config) ([]bench.Record, error)

// measurement is what sweep, overlap and links share: where the ranks run,
// how points are timed, where the records go.
type measurement struct {
	backend backendFlags
	timing  timingFlags
	output  outputFlags
}

func (m *measurement) register(fs *flag.FlagSet) {
	m.backend.register(fs)
	m.timing.register(fs)
	m.output.register(fs)
}

// config is the bench configuration of the flags, methods included; its
// errors are usage errors.
func (m *measurement) config(fs *flag.FlagSet, e env, methods *methodFlags) (bench.Config, error) {
	if err := m.backend.check(fs); err != nil {
		return bench.Config{}, err
	}
	cfg, err := m.timing.config()
	if err != nil {
		return cfg, err
	}
	cfg.Command = e.commandLine()
	if methods != nil {
		cfg.Methods, err = methods.methods()
	}
	return cfg, err
}

// on measures on one testbed, printing the table and writing the outputs
// on the root process.
func (m *measurement) on(
	ctx context.Context,
	e env,
	tb *harness.Testbed,
	cfg bench.Config,
	fn measureFn,
	name string,
) ([]bench.Record, error) {
	var tab *report.Table
	if tb.Root() {
		tab = report.NewTable(e.stdout)
		cfg.Observer = tab
		cfg.Progress = progress(e.stderr, name)
	}
	recs, err := fn(ctx, tb, cfg)
	if cfg.Progress != nil {
		cfg.Progress.Close()
	}
	if tab != nil {
		if tb.Info().SimTimings {
			tab.Footer("sim timings are wall clock on the simulated cluster, not GPU timings")
		}
		err = errors.Join(err, tab.Err())
	}
	return recs, err
}

// single opens the grid's testbed and measures on it.
func (m *measurement) single(
	ctx context.Context,
	e env,
	g gridFlags,
	cfg bench.Config,
	fn measureFn,
	name string,
) error {
	ctx, cancel := context.WithTimeout(ctx, m.timing.timeout)
	defer cancel()
	machines, devices := g.grid(m.backend.backend)
	if note := harness.SimUnderLauncher(m.backend.backend, harness.Spec{Machines: machines, Devices: devices}); note != "" {
		fmt.Fprintln(e.stderr, "fairbench: "+note)
	}
	tb, err := harness.Open(ctx, m.backend.backend, spec(m.backend, m.timing, machines, devices))
	if err != nil {
		return err
	}
	recs, err := m.on(ctx, e, tb, cfg, fn, name)
	err = errors.Join(err, tb.Close())
	if tb.Root() {
		err = errors.Join(err, m.output.write(recs, e.stdout))
	}
	return err
}

// setupPoints declares what sweep and overlap share, and with more the
// flags of what they measure, whose function completes the configuration
// (its errors are usage errors).
func setupPoints(
	fs *flag.FlagSet,
	name string,
	fn measureFn,
	more func(*flag.FlagSet) func(*bench.Config) error,
) func(context.Context, env) error {
	var m measurement
	var g gridFlags
	var methods methodFlags
	var cpuProfile, execTrace string
	m.register(fs)
	g.register(fs, true)
	methods.register(fs)
	fs.StringVar(&cpuProfile, "cpuprofile", "",
		"write a Go CPU profile of the run to this file (go tool pprof); a process launched as one rank of "+
			"several (RANK set) writes FILE.rankN")
	fs.StringVar(&execTrace, "trace", "",
		"write a Go execution trace of the run to this file (go tool trace: where each goroutine ran, waited "+
			"for a processor, blocked or slept); a process launched as one rank of several writes FILE.rankN")
	complete := more(fs)
	return func(ctx context.Context, e env) (err error) {
		cfg, err := m.config(fs, e, &methods)
		if err != nil {
			return err
		}
		if err := g.check(); err != nil {
			return err
		}
		if err := complete(&cfg); err != nil {
			return err
		}
		for _, rec := range []struct {
			path  string
			start func(io.Writer) error
			stop  func()
		}{
			{cpuProfile, pprof.StartCPUProfile, pprof.StopCPUProfile},
			{execTrace, trace.Start, trace.Stop},
		} {
			if rec.path == "" {
				continue
			}
			stop, err := startRecording(rec.path, os.Getenv("RANK"), rec.start, rec.stop)
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, stop()) }()
		}
		return m.single(ctx, e, g, cfg, fn, name)
	}
}

// startRecording starts a recording of the process (Go's CPU profile,
// its execution trace) into path (path.rankN for a process that is rank N
// of a launched job) and returns what stops it and closes the file.
func startRecording(path, rank string, start func(io.Writer) error, stop func()) (func() error, error) {
	if rank != "" {
		path += ".rank" + rank
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("fairbench: recording into %s: %w", path, err)
	}
	if err := start(f); err != nil {
		return nil, errors.Join(fmt.Errorf("fairbench: recording into %s: %w", path, err), f.Close())
	}
	return func() error { stop(); return f.Close() }, nil
}

func setupSweep(fs *flag.FlagSet) func(context.Context, env) error {
	return setupPoints(fs, "sweep", bench.Sweep, func(fs *flag.FlagSet) func(*bench.Config) error {
		var s sizeFlags
		s.register(fs)
		return func(cfg *bench.Config) (err error) {
			if cfg.Sizes, err = s.sizes(); err != nil {
				return err
			}
			return s.holds(cfg.DType)
		}
	})
}

func setupOverlap(fs *flag.FlagSet) func(context.Context, env) error {
	return setupPoints(fs, "overlap", bench.Overlap, func(fs *flag.FlagSet) func(*bench.Config) error {
		var o overlapFlags
		o.register(fs)
		return func(cfg *bench.Config) error {
			cfg.Buckets, cfg.BucketBytes = o.buckets, o.bucketBytes
			return o.check(cfg.DType)
		}
	})
}

func progress(stderr io.Writer, name string) bench.Progress {
	if f, ok := stderr.(*os.File); ok {
		return report.NewProgress(f, name)
	}
	return nil
}

// launcher starts this program as the workers of emulated machines.
type launcher struct{ launch launchFlags }

func (l *launcher) run(ctx context.Context, e env, machines, nproc int, args []string) ([]bench.Record, error) {
	fr, err := bench.FindFairrun(l.launch.fairrun)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return bench.LaunchEmulated(
		ctx,
		fr,
		strings.Fields(l.launch.fairrunFlags),
		machines,
		nproc,
		self,
		args,
		e.stdout,
		e.stderr,
	)
}

func setupScale(fs *flag.FlagSet) func(context.Context, env) error {
	var m measurement
	var g gridFlags
	var s sizeFlags
	var methods methodFlags
	var l launcher
	m.register(fs)
	g.register(fs, false)
	s.register(fs)
	methods.register(fs)
	l.launch.register(fs)
	list := fs.String("machines-list", "1,2,4", "machine counts")
	return func(ctx context.Context, e env) error {
		machines, err := bench.ParseIntList("-machines-list", *list)
		if err != nil {
			return cli.Arg(err)
		}
		cfg, err := m.config(fs, e, &methods)
		if err != nil {
			return err
		}
		if err := g.check(); err != nil {
			return err
		}
		if cfg.Sizes, err = s.sizes(); err != nil {
			return err
		}
		if err := s.holds(cfg.DType); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, m.timing.timeout)
		defer cancel()
		d := g.devices
		if d == 0 {
			d = 2
		}
		var all []bench.Record
		for _, mc := range machines {
			fmt.Fprintf(e.stdout, "# scale: %d machine(s) × %d devices\n", mc, d)
			var recs []bench.Record
			if m.backend.backend == "sim" {
				tb, err := harness.OpenSim(spec(m.backend, m.timing, mc, d))
				if err != nil {
					return err
				}
				recs, err = m.on(ctx, e, tb, cfg, bench.Sweep, "scale")
				if err = errors.Join(err, tb.Close()); err != nil {
					return err
				}
			} else {
				args := append([]string{"sweep"}, m.backend.args(fs)...)
				args = append(append(append(args, s.args(fs)...), m.timing.args(fs)...), methods.args(fs)...)
				if recs, err = l.run(ctx, e, mc, mc*d, args); err != nil {
					return err
				}
			}
			all = append(all, recs...)
		}
		return errors.Join(report.Scale(e.stdout, all), m.output.write(all, e.stdout))
	}
}

func setupLinks(fs *flag.FlagSet) func(context.Context, env) error {
	var m measurement
	var s sizeFlags
	var l launcher
	m.register(fs)
	s.register(fs)
	l.launch.register(fs)
	var link string
	cli.Choice(fs, &link, "link", "", "the `link` to measure: nvlink, net, or both (empty)", linkName)
	return func(ctx context.Context, e env) error {
		cfg, err := m.config(fs, e, nil)
		if err != nil {
			return err
		}
		if cfg.Sizes, err = s.sizes(); err != nil {
			return err
		}
		if err := s.holds(cfg.DType); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, m.timing.timeout)
		defer cancel()
		cfg.Methods, cfg.Kind = []bench.Method{{Name: bench.Flat}}, bench.KindLink
		measure := func(tb *harness.Testbed, name string) ([]bench.Record, error) {
			defer tb.Close()
			if w := tb.Info().World(); w != 2 {
				return nil, fmt.Errorf("links: a link is measured on 2 ranks, this testbed has %d", w)
			}
			c := cfg
			c.Link = name
			return m.on(ctx, e, tb, c, bench.Sweep, "links")
		}
		if harness.UnderLauncher() { // a worker of the network pair
			tb, err := harness.Open(ctx, m.backend.backend, harness.Spec{})
			if err != nil {
				return err
			}
			root := tb.Root()
			recs, err := measure(tb, map[bool]string{true: "net", false: "nvlink"}[tb.Info().Machines > 1])
			if root {
				err = errors.Join(err, m.output.write(recs, e.stdout))
			}
			return err
		}
		var all []bench.Record
		for _, pair := range []struct {
			name string
			m, d int
		}{{"nvlink", 1, 2}, {"net", 2, 1}} {
			if link != "" && link != pair.name {
				continue
			}
			var recs []bench.Record
			if m.backend.backend == "sim" || pair.name == "nvlink" {
				tb, err := harness.Open(ctx, m.backend.backend, spec(m.backend, m.timing, pair.m, pair.d))
				if err != nil {
					return err
				}
				if recs, err = measure(tb, pair.name); err != nil {
					return err
				}
			} else {
				args := append([]string{"links", "-link=net"}, m.backend.args(fs)...)
				args = append(append(args, s.args(fs)...), m.timing.args(fs)...)
				if recs, err = l.run(ctx, e, 2, 2, args); err != nil {
					return err
				}
			}
			all = append(all, recs...)
		}
		printLinkFits(e.stdout, all)
		return m.output.write(all, e.stdout)
	}
}

// printLinkFits prints the fit of T = 2α + n/B to each link's records.
func printLinkFits(w io.Writer, recs []bench.Record) {
	for _, l := range []string{"nvlink", "net"} {
		var pts []model.Point
		for _, r := range recs {
			if r.Link == l {
				pts = append(pts, model.Point{Bytes: float64(r.Bytes), Seconds: r.TimeUS / 1e6})
			}
		}
		if len(pts) == 0 {
			continue
		}
		if fit, err := model.FitLink(pts); err == nil {
			fmt.Fprintf(w, "# link %s: %v (fit of T = 2α + n/B to %d sizes)\n", l, fit, len(pts))
		} else {
			fmt.Fprintf(w, "# link %s: no fit: %v\n", l, err)
		}
	}
}

// write writes the records as JSON lines and CSV, and the plots.
func (o *outputFlags) write(recs []bench.Record, stdout io.Writer) error {
	var errs []error
	file := func(path string, fn func(io.Writer, []bench.Record) error) {
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
	file(o.json, bench.WriteJSONL)
	file(o.csv, report.WriteCSV)
	if o.plot != "" {
		files, err := report.Plot(o.plot, recs)
		errs = append(errs, err)
		if len(files) > 0 {
			fmt.Fprintf(stdout, "# plots: %d files (PNG and SVG) in %s\n", len(files), o.plot)
		}
	}
	return errors.Join(errs...)
}
