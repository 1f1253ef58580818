// Command fairbench times fairgo's two-level allreduce against the flat NCCL
// allreduce (NCCL's choice, and its ring alone), and the naive hand-written
// hierarchy, and turns the records into tables, plots, the cost model's
// report and issue 11's targets:
//
//	fairbench sweep -backend sim -machines 2 -devices 4 -b 1K -e 4M -f 4 -check
//	fairbench sweep -backend cuda -machines 1 -devices 2 -b 64K -e 1G -n 1 -check   (cuda build, one process)
//	fairrun --emulate-machines 2 --nic-gbit 10 --nproc-per-node 4 -- fairbench sweep -backend cuda -b 1M -e 1G
//	fairbench targets -in r1.jsonl,r2.jsonl -out bench/results/targets.json
//
// "fairbench help" lists the commands, "fairbench help COMMAND" (or
// "fairbench COMMAND -h") a command's flags. A flag means the same in every
// command that takes it. On sim, timings are wall clock on the host, not GPU
// timings, and the output says so.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		fmt.Fprintln(os.Stderr, "fairbench:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "fairbench:", err)
		os.Exit(1)
	}
}

// errUsage marks a command line that names no command, or an unknown one.
var errUsage = errors.New("bad command line")

// command is one subcommand: its flags (declared on fs by setup) and what
// it does with them.
type command struct {
	name, summary string
	// setup declares the command's flags and returns what runs it.
	setup func(fs *flag.FlagSet) func(ctx context.Context, env env) error
}

// env is what a command runs with.
type env struct {
	stdout, stderr io.Writer
	args           []string // the whole command line, for the records
}

func commands() []command {
	return []command{
		{"sweep", "time flat, flat-ring, naive and every fairgo variant over a range of sizes, one call after another", setupSweep},
		{"overlap", "time K buckets of B bytes enqueued back to back (T5: 64 × 25M), for every method", setupOverlap},
		{"scale", "sweep over machine counts: in this process on sim, through fairrun --emulate-machines on GPUs", setupScale},
		{"links", "2-rank allreduce over an NVLink pair and a network pair: the model's inputs", setupLinks},
		{"model", "fit the cost model to records: its error at every point, its predictions for larger clusters", setupModel},
		{"report", "a digest of records, with -csv and -plot their CSV and plots", setupReport},
		{"targets", "the targets (issue 11's T1–T8, issue 18's U1–U7) from the records of one or more runs (grouped by -run label)", setupTargets},
	}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: fairbench COMMAND [flags]\n\ncommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-8s %s\n\n", "help", "this list; help COMMAND: the command's flags")
	fmt.Fprintf(w, "a flag means the same in every command that takes it; fairbench COMMAND -h lists the command's flags\n")
}

func find(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// newFlags makes a command's flag set, printing its usage to w.
func newFlags(c command, w io.Writer) (*flag.FlagSet, func(context.Context, env) error) {
	fs := flag.NewFlagSet("fairbench "+c.name, flag.ContinueOnError)
	fs.SetOutput(w)
	do := c.setup(fs)
	fs.Usage = func() {
		fmt.Fprintf(w, "usage: fairbench %s [flags]\n\n%s\n\nflags:\n", c.name, c.summary)
		fs.PrintDefaults()
	}
	return fs, do
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		usage(stderr)
		return fmt.Errorf("%w: no command", errUsage)
	}
	switch name := args[0]; name {
	case "-h", "-help", "--help", "help":
		if len(args) > 1 && name == "help" {
			c, ok := find(args[1])
			if !ok {
				return fmt.Errorf("%w: unknown command %q", errUsage, args[1])
			}
			fs, _ := newFlags(c, stdout)
			fs.Usage()
			return nil
		}
		usage(stdout)
		return nil
	}
	c, ok := find(args[0])
	if !ok {
		usage(stderr)
		return fmt.Errorf("%w: unknown command %q (a command comes first: fairbench sweep -b 1M …)", errUsage, args[0])
	}
	fs, do := newFlags(c, stderr)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return do(ctx, env{stdout: stdout, stderr: stderr, args: append([]string{"fairbench"}, args...)})
}

// commandLine is the command as the records store it.
func (e env) commandLine() string { return strings.Join(e.args, " ") }
