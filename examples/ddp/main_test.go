package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/internal/cli"
	"github.com/fairgo/fairgo/internal/cli/clitest"
)

// TestDemo runs the demo's configuration (fewer steps) and a few other
// grids and types: the loss must fall and the replicas must end identical.
func TestDemo(t *testing.T) {
	tests := []struct {
		name              string
		machines, devices int
		dtype             string
		minBuckets        int
		bucketKB          int64
	}{
		{"demo 2x4 float32", 2, 4, "float32", 4, 0},
		{"2x2 bfloat16", 2, 2, "bfloat16", 4, 0},
		{"3x1 small buckets", 3, 1, "float32", 1, 16},
		{"1x3 one bucket", 1, 3, "float32", 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := defaults()
			o.machines, o.devices, o.dtype = tc.machines, tc.devices, tc.dtype
			o.minBuckets, o.bucketKB = tc.minBuckets, tc.bucketKB
			o.epochs, o.steps = 4, 6
			if testing.Short() || raceEnabled {
				// The race detector makes the matrix products ~10× slower:
				// a smaller model, all of it through the two-level path.
				o.hidden, o.flat = 64, -1
			}
			var out bytes.Buffer
			sum, err := demo(context.Background(), o, &out)
			require.NoError(t, err, out.String())
			require.True(t, sum.Identical)
			require.Len(t, sum.Epochs, o.epochs)
			first, last := sum.Epochs[0].Loss, sum.Epochs[len(sum.Epochs)-1].Loss
			require.Less(t, last, first*0.8, "the loss must fall\n%s", out.String())
			require.Contains(t, out.String(), "replicas identical")
			if tc.minBuckets > 1 || tc.bucketKB > 0 {
				require.Greater(t, len(sum.Buckets), 1, "buckets to overlap")
			}
		})
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name   string
		change func(*options)
	}{
		{"unknown dtype", func(o *options) { o.dtype = "float8" }},
		{"integer dtype", func(o *options) { o.dtype = "int32" }},
		{"unknown backend", func(o *options) { o.backend = "tpu" }},
		{"zero bucket", func(o *options) { o.bucketMB = 0 }},
		{"no steps", func(o *options) { o.steps = 0 }},
		{"negative lr", func(o *options) { o.lr = -1 }},
		{"no machines", func(o *options) { o.machines = 0 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := defaults()
			tc.change(&o)
			_, err := demo(context.Background(), o, &bytes.Buffer{})
			require.Error(t, err)
		})
	}
}

// TestCLIRules: help on stdout with status 0; a bad command line one
// message on stderr with status 2 (one "ddp:" prefix), choices listed,
// values as given, no extra arguments; a run that works status 0.
func TestCLIRules(t *testing.T) {
	a := func(s string) []string { return strings.Fields(s) }
	usage := func(name, args string, stderr ...string) clitest.Case {
		return clitest.Usage("ddp", name, args, stderr...)
	}
	help := []string{"usage: ddp [flags]", "  -dtype type", "  -bucket-mb float", "float32 or bfloat16"}
	clitest.Check(t, "ddp", run, []clitest.Case{
		{Name: "-h", Args: a("-h"), Code: cli.ExitOK, Stdout: help},
		{Name: "--help", Args: a("--help"), Code: cli.ExitOK, Stdout: help},
		{Name: "-help after a flag", Args: a("-epochs 1 -help"), Code: cli.ExitOK, Stdout: help},
		usage("unknown flag", "-bogus", "ddp: flag provided but not defined: -bogus"),
		usage("bad number", "-lr fast", `invalid value "fast" for flag -lr`),
		usage("extra argument", "extra-arg", `unexpected argument "extra-arg"`),
		usage("arguments after flags", "-epochs 1 a b", `unexpected arguments "a" "b"`),
		usage(
			"dtype lists the types",
			"-dtype float8",
			`invalid value "float8" for flag -dtype: not one of float32, bfloat16`,
		),
		usage(
			"an integer dtype",
			"-dtype int32",
			`invalid value "int32" for flag -dtype: not one of float32, bfloat16`,
		),
		usage(
			"backend lists the backends",
			"-backend tpu",
			`invalid value "tpu" for flag -backend: not one of sim, cuda`,
		),
		usage(
			"bfloat16 on GPUs",
			"-backend cuda -dtype bf16",
			"-dtype bf16: the GPU trainer (-backend cuda) communicates float32 gradients",
		),
		usage("no machines", "-machines 0", "ddp: -machines 0: must be at least 1"),
		usage("no steps", "-steps 0", "-steps 0: must be at least 1"),
		usage("learning rate as given", "-lr -1e-2", "-lr -1e-2: must be > 0"),
		usage("momentum", "-momentum 1", "-momentum 1: must be in [0, 1)"),
		usage("bucket cap in MiB as given", "-bucket-mb 0e0", "-bucket-mb 0e0: the bucket cap must be at least a byte"),
		usage("bucket cap in KiB", "-bucket-kb -4", "-bucket-kb -4: negative"),
		usage("min buckets", "-min-buckets 0", "-min-buckets 0: must be at least 1"),
		usage("jitter as given", "-jitter -1000us", "-jitter -1000us: negative"),
		usage("flat threshold", "-flat-threshold -9", "-flat-threshold -9: must be ≥ 0, or FlatNever (-1)"),
	})
	var stdout, stderr bytes.Buffer
	code := run(a("-machines 2 -devices 1 -epochs 1 -steps 2 -hidden 16 -depth 1 -dtype bf16"), &stdout, &stderr)
	require.Zero(t, code, stderr.String())
	require.Empty(t, stderr.String())
	require.Contains(t, stdout.String(), "gradients in bfloat16")
	require.Contains(t, stdout.String(), "replicas identical")
}
