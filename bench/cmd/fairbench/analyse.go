package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/fairgo/fairgo/bench/report"
)

func setupModel(fs *flag.FlagSet) func(context.Context, env) error {
	var in inputFlags
	var m modelFlags
	in.register(fs)
	m.register(fs)
	return func(_ context.Context, e env) error {
		recs, err := in.records()
		if err != nil {
			return err
		}
		o, err := m.options(in.includeSim)
		if err != nil {
			return err
		}
		return report.ModelReport(e.stdout, recs, o)
	}
}

func setupReport(fs *flag.FlagSet) func(context.Context, env) error {
	var in inputFlags
	var out outputFlags
	in.register(fs)
	out.register(fs)
	return func(_ context.Context, e env) error {
		recs, err := in.records()
		if err != nil {
			return err
		}
		return errors.Join(report.Summary(e.stdout, recs), out.write(recs, e.stdout))
	}
}

func setupTargets(fs *flag.FlagSet) func(context.Context, env) error {
	var in inputFlags
	var t targetFlags
	in.register(fs)
	t.register(fs)
	return func(_ context.Context, e env) error {
		recs, err := in.records()
		if err != nil {
			return err
		}
		o, err := t.options(in.includeSim)
		if err != nil {
			return err
		}
		ts, err := report.Targets(recs, o)
		if err != nil {
			return err
		}
		if t.out != "" {
			f, err := os.Create(t.out)
			if err != nil {
				return err
			}
			if err := errors.Join(report.WriteTargetsJSON(f, ts), f.Close()); err != nil {
				return err
			}
			defer fmt.Fprintf(e.stdout, "# targets written to %s\n", t.out)
		}
		fmt.Fprintf(e.stdout, "# issue 11's targets over %d records (T1–T5, T7 on the first run; T8 the second against the first)\n", len(recs))
		return report.PrintTargets(e.stdout, ts)
	}
}
