package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"runtime"
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
			Stderr: []string{
				"flag provided but not defined: --bogus",
				"usage: fairrun",
				`run "fairrun --help" for every flag`,
			}},
		{Name: "bad number", Args: []string{"--nproc_per_node", "two", "--", "p"}, Code: cli.ExitUsage,
			Stderr: []string{`invalid value "two" for flag --nproc_per_node`}},
		{
			Name:   "no program",
			Args:   []string{"--nproc-per-node", "2"},
			Code:   cli.ExitUsage,
			Stderr: []string{"no worker program"},
		},
		{
			Name:   "no program after --",
			Args:   []string{"--nproc-per-node", "2", "--"},
			Code:   cli.ExitUsage,
			Stderr: []string{"no worker program"},
		},
		{
			Name:   "no workers",
			Args:   []string{"--nproc-per-node", "0", "--", "p"},
			Code:   cli.ExitUsage,
			Stderr: []string{"--nproc-per-node 0: must be at least 1"},
		},
		{
			Name:   "mps lists its modes",
			Args:   []string{"--nproc-per-node", "2", "--mps", "yes", "--", "p"},
			Code:   cli.ExitUsage,
			Stderr: []string{`invalid value "yes" for flag --mps: "yes" is not auto, on or off`},
		},
		{
			Name: "latency as given",
			Args: []string{
				"--nproc_per_node",
				"2",
				"--emulate_machines",
				"2",
				"--nic_gbit",
				"10",
				"--nic_latency",
				"1500ms",
				"--",
				"p",
			},
			Code:   cli.ExitUsage,
			Stderr: []string{"fairrun: --nic-latency 1500ms: must be in [0, 1s]"},
		},
		{
			Name:   "nic without machines",
			Args:   []string{"--nproc-per-node", "2", "--nic-gbit", "10", "--", "p"},
			Code:   cli.ExitUsage,
			Stderr: []string{"--nic-gbit 10", "needs --emulate-machines"},
		},
		{
			Name:   "standalone on two nodes",
			Args:   []string{"--standalone", "--nnodes", "2", "--nproc_per_node", "2", "--", "p"},
			Code:   cli.ExitUsage,
			Stderr: []string{"--nnodes 2: not allowed with --standalone"},
		},
		{
			Name:   "standalone with a master address",
			Args:   []string{"--standalone", "--master_addr", "10.1.2.3", "--nproc_per_node", "2", "--", "p"},
			Code:   cli.ExitUsage,
			Stderr: []string{"--master-addr 10.1.2.3: not allowed with --standalone"},
		},
		{
			Name:   "standalone with a master port",
			Args:   []string{"--standalone", "--master-port", "29400", "--nproc_per_node", "2", "--", "p"},
			Code:   cli.ExitUsage,
			Stderr: []string{"--master-port 29400: not allowed with --standalone"},
		},
		{
			Name:   "a flag of torchrun fairrun lacks",
			Args:   []string{"--log_dir", "logs", "--nproc_per_node", "2", "--", "p"},
			Code:   cli.ExitUsage,
			Stderr: []string{"flag provided but not defined: --log_dir"},
		},
	})
}

// TestNodeDependentUsage: what fairrun decides from this node's GPUs
// (--nproc-per-node gpu|auto, --nvlink-gbit's condition) is a bad command
// line like any other: exit 2, one message with the value as written,
// nothing started.
func TestNodeDependentUsage(t *testing.T) {
	t.Setenv("CUDA_VISIBLE_DEVICES", "0,1")
	clitest.Check(t, "fairrun", runFairrun, []clitest.Case{
		{Name: "nvlink-gbit where ranks have GPUs of their own",
			Args: []string{
				"--nproc-per-node",
				"4",
				"--emulate-machines",
				"2",
				"--nic-gbit",
				"10",
				"--nvlink-gbit",
				"20.0",
				"--",
				"p",
			}, Code: cli.ExitUsage,
			Stderr: []string{
				"fairrun: --nvlink-gbit 20.0: the ranks of each emulated machine have GPUs of their own (2 per machine, 2 GPUs)",
				"usage: fairrun",
			}},
		{
			Name:   "machines that do not divide the GPUs",
			Args:   []string{"--nproc_per_node", "gpu", "--emulate_machines", "3", "--", "p"},
			Code:   cli.ExitUsage,
			Stderr: []string{"fairrun: --emulate-machines 3: does not divide --nproc-per-node=2"},
		},
		{Name: "not a count", Args: []string{"--nproc-per-node", "gpus", "--", "p"}, Code: cli.ExitUsage,
			Stderr: []string{`invalid value "gpus" for flag --nproc-per-node: not a number, gpu, auto or cpu`}},
	})
	t.Setenv("CUDA_VISIBLE_DEVICES", "")
	clitest.Check(t, "fairrun", runFairrun, []clitest.Case{
		{Name: "gpu without a GPU", Args: []string{"--nproc_per_node", "gpu", "--", "p"}, Code: cli.ExitUsage,
			Stderr: []string{`fairrun: --nproc-per-node gpu: no GPU is visible (CUDA_VISIBLE_DEVICES="")`}},
	})
}

// TestNProcFromTheNode runs torchrun's --nproc_per_node gpu, auto and cpu:
// one worker per visible GPU, else per CPU.
func TestNProcFromTheNode(t *testing.T) {
	cpus := runtime.NumCPU()
	for _, tc := range []struct {
		flag, nproc, visible string
		workers              int
	}{
		{flag: "--nproc_per_node", nproc: "gpu", visible: "0,1", workers: 2},
		{flag: "--nproc-per-node", nproc: "auto", visible: "0,1,2", workers: 3},
		{flag: "--nproc-per-node", nproc: "auto", visible: "", workers: cpus},
		{flag: "--nproc_per_node", nproc: "cpu", visible: "0", workers: cpus},
	} {
		t.Run(tc.flag+" "+tc.nproc+" CUDA_VISIBLE_DEVICES="+tc.visible, func(t *testing.T) {
			t.Setenv("CUDA_VISIBLE_DEVICES", tc.visible)
			var stdout, stderr bytes.Buffer
			code := runFairrun([]string{tc.flag, tc.nproc, "sh", "-c", `echo "$RANK/$WORLD_SIZE"`}, &stdout, &stderr)
			require.Equal(t, 0, code, "stderr:\n%s", stderr.String())
			lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			require.Len(t, lines, tc.workers)
			require.Contains(t, lines, fmt.Sprintf("[0] 0/%d", tc.workers))
			require.Contains(t, stderr.String(), fmt.Sprintf("--nproc-per-node %s\" workers=%d", tc.nproc, tc.workers))
		})
	}
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
