package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/fairgo/fairgo/bench"
	"github.com/fairgo/fairgo/bench/report"
)

// setupAnalysis declares the records to read (-in, -include-sim) and runs
// do on them, after check (nil, or the usage errors of the command's other
// flags).
func setupAnalysis(
	fs *flag.FlagSet,
	check func(includeSim bool) error,
	do func(e env, recs []bench.Record, includeSim bool) error,
) func(context.Context, env) error {
	var in inputFlags
	in.register(fs)
	return func(_ context.Context, e env) error {
		if err := in.check(); err != nil {
			return err
		}
		if check != nil {
			if err := check(in.includeSim); err != nil {
				return err
			}
		}
		recs, err := in.records()
		if err != nil {
			return err
		}
		return do(e, recs, in.includeSim)
	}
}

func setupModel(fs *flag.FlagSet) func(context.Context, env) error {
	var m modelFlags
	m.register(fs)
	var o report.ModelOptions
	return setupAnalysis(fs, func(includeSim bool) (err error) {
		o, err = m.options(includeSim)
		return err
	}, func(e env, recs []bench.Record, _ bool) error {
		return report.ModelReport(e.stdout, recs, o)
	})
}

func setupReport(fs *flag.FlagSet) func(context.Context, env) error {
	var out outputFlags
	out.register(fs)
	return setupAnalysis(fs, nil, func(e env, recs []bench.Record, _ bool) error {
		return errors.Join(report.Summary(e.stdout, recs), out.write(recs, e.stdout))
	})
}

func setupTargets(fs *flag.FlagSet) func(context.Context, env) error {
	var t targetFlags
	t.register(fs)
	return setupAnalysis(fs, func(bool) error { return t.check() }, func(e env, recs []bench.Record, includeSim bool) error {
		o, err := t.options(includeSim)
		if err != nil {
			return err
		}
		ts, err := report.Targets(recs, o)
		if err != nil {
			return err
		}
		fmt.Fprintf(
			e.stdout,
			"# targets (sets %s) over %d records: worst points of the first run; T8 the second against the first\n",
			t.sets,
			len(recs),
		)
		if err := report.PrintTargets(e.stdout, ts); err != nil {
			return err
		}
		if t.out == "" {
			return nil
		}
		f, err := os.Create(t.out)
		if err != nil {
			return err
		}
		if err := errors.Join(report.WriteTargetsJSON(f, ts), f.Close()); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "# targets written to %s\n", t.out)
		return nil
	})
}

func setupNodes(fs *flag.FlagSet) func(context.Context, env) error {
	var n nodesFlags
	n.register(fs)
	var o report.NodesOptions
	return setupAnalysis(fs, func(includeSim bool) (err error) {
		o, err = n.options(includeSim)
		return err
	}, func(e env, recs []bench.Record, _ bool) error {
		curves, notes, err := report.NodeCurves(recs, o)
		if err != nil {
			return err
		}
		if err := report.NodesReport(e.stdout, curves, notes); err != nil {
			return err
		}
		if n.plot == "" {
			return nil
		}
		files, err := report.NodesPlot(n.plot, curves, report.NodesTitle(o.NICGbit))
		if len(files) > 0 {
			fmt.Fprintf(e.stdout, "# plot: %s\n", strings.Join(files, ", "))
		}
		return err
	})
}
