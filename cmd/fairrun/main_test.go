package main

import (
	"bytes"
	"context"
	"io"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/internal/cli"
	"github.com/fairgo/fairgo/internal/cli/clitest"
)

func runFairrun(args []string, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return run(ctx, args, stdout, stderr)
}

// TestCLIRules: fairrun's help, exit statuses, messages and arguments.
func TestCLIRules(t *testing.T) {
	help := []string{"usage: fairrun", "--nproc-per-node N", "--standalone", "--nproc_per_node"}
	clitest.Check(t, "fairrun", runFairrun, []clitest.Case{
		{Name: "-h", Args: []string{"-h"}, Code: cli.ExitOK, Stdout: help},
		{Name: "--help", Args: []string{"--help"}, Code: cli.ExitOK, Stdout: help},
		{Name: "-help before the program", Args: []string{"-help", "--", "prog"}, Code: cli.ExitOK, Stdout: help},
		{Name: "help among flags", Args: []string{"--nproc_per_node", "2", "--help"}, Code: cli.ExitOK, Stdout: help},
		{Name: "unknown flag", Args: []string{"--bogus", "--", "p"}, Code: cli.ExitUsage,
			Stderr: []string{"flag provided but not defined: -bogus", "usage: fairrun", `run "fairrun --help" for every flag`}},
		{Name: "bad number", Args: []string{"--nproc_per_node", "two", "--", "p"}, Code: cli.ExitUsage,
			Stderr: []string{`invalid value "two" for flag -nproc_per_node`}},
		{Name: "no program", Args: []string{"--nproc-per-node", "2"}, Code: cli.ExitUsage, Stderr: []string{"no worker program"}},
		{Name: "no program after --", Args: []string{"--nproc-per-node", "2", "--"}, Code: cli.ExitUsage, Stderr: []string{"no worker program"}},
		{Name: "no nproc", Args: []string{"--", "p"}, Code: cli.ExitUsage, Stderr: []string{"--nproc-per-node 0: must be at least 1"}},
		{Name: "mps lists its modes", Args: []string{"--nproc-per-node", "2", "--mps", "yes", "--", "p"}, Code: cli.ExitUsage,
			Stderr: []string{`invalid value "yes" for flag -mps: "yes" is not auto, on or off`}},
		{Name: "latency as given", Args: []string{"--nproc_per_node", "2", "--emulate_machines", "2", "--nic_gbit", "10", "--nic_latency", "1500ms", "--", "p"},
			Code: cli.ExitUsage, Stderr: []string{"fairrun: --nic-latency 1500ms: must be in [0, 1s]"}},
		{Name: "nic without machines", Args: []string{"--nproc-per-node", "2", "--nic-gbit", "10", "--", "p"}, Code: cli.ExitUsage,
			Stderr: []string{"--nic-gbit 10", "needs --emulate-machines"}},
		{Name: "standalone on two nodes", Args: []string{"--standalone", "--nnodes", "2", "--nproc_per_node", "2", "--", "p"}, Code: cli.ExitUsage,
			Stderr: []string{"--nnodes 2: not allowed with --standalone"}},
		{Name: "standalone with a master address", Args: []string{"--standalone", "--master_addr", "10.1.2.3", "--nproc_per_node", "2", "--", "p"},
			Code: cli.ExitUsage, Stderr: []string{"--master-addr 10.1.2.3: not allowed with --standalone"}},
		{Name: "standalone with a master port", Args: []string{"--standalone", "--master-port", "29400", "--nproc_per_node", "2", "--", "p"},
			Code: cli.ExitUsage, Stderr: []string{"--master-port 29400: not allowed with --standalone"}},
		{Name: "a flag of torchrun fairrun lacks", Args: []string{"--rdzv_backend", "c10d", "--nproc_per_node", "2", "--", "p"}, Code: cli.ExitUsage,
			Stderr: []string{"flag provided but not defined: -rdzv_backend"}},
	})
}

// TestTorchrunSpelling runs a job the torchrun way: underscores and
// --standalone; the program's own flags and arguments pass through.
func TestTorchrunSpelling(t *testing.T) {
	for _, args := range [][]string{
		{"--standalone", "--nproc_per_node", "2", "sh", "-c", `echo "$RANK/$WORLD_SIZE $MASTER_ADDR $1"`, "sh", "-h"},
		{"--nproc-per-node=2", "--", "sh", "-c", `echo "$RANK/$WORLD_SIZE $MASTER_ADDR $1"`, "sh", "-h"},
	} {
		var stdout, stderr bytes.Buffer
		code := runFairrun(args, &stdout, &stderr)
		require.Equal(t, 0, code, "fairrun %q\nstderr:\n%s", args, stderr.String())
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		sort.Strings(lines)
		require.Equal(t, []string{"[0] 0/2 127.0.0.1 -h", "[1] 1/2 127.0.0.1 -h"}, lines, "fairrun %q", args)
	}
}
