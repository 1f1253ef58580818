// Command fairbench times fairgo's two-level allreduce against the flat NCCL
// allreduce (NCCL's choice, its ring alone and its tree alone), and the
// naive hand-written hierarchy, and turns the records into tables, plots,
// the cost model's report, the report across node counts and the targets:
//
//	fairbench sweep -backend sim -machines 2 -devices 4 -b 1K -e 4M -f 4 -check
//	fairbench sweep -backend cuda -machines 1 -devices 2 -b 64K -e 1G -n 1 -check   (GPUs, one process)
//	fairrun --emulate-machines 2 --nic-gbit 10 --nproc-per-node 4 -- fairbench sweep -backend cuda -b 1M -e 1G
//	fairbench targets -in r1.jsonl,r2.jsonl -set S -out bench/results/targets.json
//	fairbench nodes -in r1.jsonl -plot plots
//
// "fairbench help" lists the commands, "fairbench help COMMAND" (or
// "fairbench COMMAND -h") a command's flags, on stdout. A flag means the
// same in every command that takes it. A bad command line (an unknown
// command or flag, a value outside its choices, an argument after the
// flags) gives one message on stderr and exit status 2, a failure exit
// status 1. On sim, timings are wall clock on the host, not GPU timings, and
// the output says so.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/fairgo/fairgo/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is one subcommand: its flags (declared on fs by setup) and what
// it does with them.
type command struct {
	name, summary string
	// setup declares the command's flags and returns what runs it. What
	// runs it returns the errors of the flags' values it checks marked
	// with cli.Usage (or cli.Arg), before it starts anything.
	setup func(fs *flag.FlagSet) func(ctx context.Context, env env) error
}

// env is what a command runs with.
type env struct {
	stdout, stderr io.Writer
	args           []string // the whole command line, for the records
}

func commands() []command {
	return []command{
		{
			"sweep",
			"time flat, flat-ring, flat-tree, naive and every fairgo variant over a range of sizes, one call after another",
			setupSweep,
		},
		{"overlap", "time K buckets of B bytes enqueued back to back (T5: 64 × 25M), for every method", setupOverlap},
		{
			"scale",
			"sweep over machine counts: in this process on sim, through fairrun --emulate-machines on GPUs",
			setupScale,
		},
		{"links", "2-rank allreduce over an NVLink pair and a network pair: the model's inputs", setupLinks},
		{
			"model",
			"fit the cost model to records: its error at every point, its predictions for larger clusters",
			setupModel,
		},
		{"report", "a digest of records, with -csv and -plot their CSV and plots", setupReport},
		{
			"nodes",
			"fairgo/best by size for each layout across node counts, measured and modelled, and 64 × 8 at real links",
			setupNodes,
		},
		{
			"targets",
			"the targets (T1–T8, U1–U7, S1–S8; -set) from the records of one or more runs (grouped by -run label)",
			setupTargets,
		},
	}
}

// commandNames lists the commands, help included, for errors.
func commandNames() string {
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	return strings.Join(append(names, "help"), ", ")
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: fairbench COMMAND [flags]\n\ncommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-8s %s\n", "help", "this list; help COMMAND: the command's flags")
	fmt.Fprintf(w, "  %-8s %s\n\n", "version", "fairgo's version (also --version)")
	fmt.Fprintf(
		w,
		"a flag means the same in every command that takes it; fairbench COMMAND -h lists the command's flags\n",
	)
	fmt.Fprintf(w, "a bad command line exits with status 2, a failure with 1\n")
}

func find(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// newFlags makes a command's flag set.
func newFlags(c command) (*flag.FlagSet, func(context.Context, env) error) {
	fs := flag.NewFlagSet("fairbench "+c.name, flag.ContinueOnError)
	do := c.setup(fs)
	return fs, do
}

// program is fairbench, or one of its commands, for cli.Program.Status.
func program(c *command) cli.Program {
	if c == nil {
		return cli.Program{Name: "fairbench", Help: usage, Hint: `run "fairbench help" for the commands`}
	}
	fs, _ := newFlags(*c)
	return cli.Program{
		Name: "fairbench",
		Help: func(w io.Writer) {
			fmt.Fprintf(w, "usage: fairbench %s [flags]\n\n%s\n\nflags:\n", c.name, c.summary)
			fs.SetOutput(w)
			fs.PrintDefaults()
		},
		Hint: fmt.Sprintf("run %q for its flags", "fairbench "+c.name+" -h"),
	}
}

// run is fairbench's command line args (without the program name): it
// returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := dispatch(ctx, args, stdout, stderr)
	return program(c).Status(err, stdout, stderr)
}

// dispatch runs the command line, and returns the command it named (nil:
// none, or help of fairbench itself) and its outcome: flag.ErrHelp for
// help, a cli.ErrUsage error for a bad command line.
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) (*command, error) {
	unknown := func(name string) error {
		return cli.Usagef(
			"unknown command %q (%s; a command comes first: fairbench sweep -b 1M …)",
			name,
			commandNames(),
		)
	}
	if len(args) == 0 {
		return nil, cli.Usagef("no command (%s)", commandNames())
	}
	switch name := args[0]; name {
	case "-version", "--version", "version":
		if err := cli.NoArgs(args[1:]); err != nil {
			return nil, err
		}
		return nil, cli.ErrVersion
	case "-h", "-help", "--help", "help":
		// help [COMMAND], -h [COMMAND]
		if len(args) == 1 {
			return nil, flag.ErrHelp
		}
		if err := cli.NoArgs(args[2:]); err != nil {
			return nil, err
		}
		c, ok := find(args[1])
		if !ok {
			return nil, unknown(args[1])
		}
		return &c, flag.ErrHelp
	}
	c, ok := find(args[0])
	if !ok {
		return nil, unknown(args[0])
	}
	fs, do := newFlags(c)
	if err := cli.Parse(fs, args[1:]); err != nil {
		return &c, err
	}
	return &c, do(ctx, env{stdout: stdout, stderr: stderr, args: append([]string{"fairbench"}, args...)})
}

// commandLine is the command as the records store it.
func (e env) commandLine() string { return strings.Join(e.args, " ") }
