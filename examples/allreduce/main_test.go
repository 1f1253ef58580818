package main

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/internal/cli"
	"github.com/fairgo/fairgo/internal/cli/clitest"
	"github.com/fairgo/fairgo/internal/elem"
	"github.com/fairgo/fairgo/internal/refdata"
)

func TestRunOnSim(t *testing.T) {
	for _, tc := range []flags{
		{backend: "sim", machines: 3, devices: 5, count: 10007, dtype: "bfloat16", op: "avg", seed: 1, iters: 1},
		{backend: "sim", machines: 2, devices: 1, count: 4099, dtype: "int32", op: "max", seed: 2, iters: 2, flat: -1},
		{backend: "sim", machines: 1, devices: 3, count: 7, dtype: "float64", op: "prod", seed: 3, iters: 1},
	} {
		var out bytes.Buffer
		require.NoError(t, reduce(tc, &out), "%+v", tc)
		require.Contains(t, out.String(), "ok max_abs_error=")
	}
	require.Error(
		t,
		reduce(flags{backend: "cuda-not-built", machines: 1, devices: 1, dtype: "float32", op: "sum"}, io.Discard),
	)
}

// TestCLIRules: help on stdout with status 0; a bad command line one
// message on stderr with status 2, choices listed, values as given, no
// extra arguments; a run that works status 0 with its output on stdout.
func TestCLIRules(t *testing.T) {
	a := func(s string) []string { return strings.Fields(s) }
	usage := func(name, args string, stderr ...string) clitest.Case {
		return clitest.Usage("allreduce", name, args, stderr...)
	}
	help := []string{"usage: allreduce [flags]", "  -dtype type", "  -count int", "bfloat16"}
	clitest.Check(t, "allreduce", run, []clitest.Case{
		{Name: "-h", Args: a("-h"), Code: cli.ExitOK, Stdout: help},
		{Name: "--help", Args: a("--help"), Code: cli.ExitOK, Stdout: help},
		{Name: "-help after a flag", Args: a("-count 4 -help"), Code: cli.ExitOK, Stdout: help},
		usage("unknown flag", "-bogus", "allreduce: flag provided but not defined: -bogus"),
		usage("bad number", "-count many", `invalid value "many" for flag -count`),
		usage("extra argument", "extra-arg", `unexpected argument "extra-arg"`),
		usage("argument after flags", "-count 4 extra-arg", `unexpected argument "extra-arg"`),
		usage("arguments after --", "-count 4 -- a b", `unexpected arguments "a" "b"`),
		usage(
			"dtype lists the types",
			"-dtype float8",
			`invalid value "float8" for flag -dtype: not one of float16, bfloat16, float32, float64, int8, uint8, `+
				`int32, uint32, int64, uint64`,
		),
		usage(
			"op lists the operators",
			"-op xor",
			`invalid value "xor" for flag -op: not one of sum, avg, max, min, prod`,
		),
		usage(
			"backend lists the backends",
			"-backend tpu",
			`invalid value "tpu" for flag -backend: not one of sim, cuda`,
		),
		usage("no machines", "-machines 0", "-machines 0: must be at least 1"),
		usage("no devices", "-devices -2", "-devices -2: must be at least 1"),
		usage("negative count", "-count -1", "-count -1: negative"),
		usage("negative iterations", "-iters -1", "-iters -1: must be at least 1"),
		usage("no iteration: ok would check nothing", "-iters 0", "-iters 0: must be at least 1"),
		usage("no iteration, as written", "-iters=0x0", "-iters 0x0: must be at least 1"),
		usage("jitter as given", "-jitter -1500us", "-jitter -1500us: negative"),
		usage("slice", "-slice -5", "-slice -5: must be positive, or 0 for the default"),
		usage("flat threshold", "-flat-threshold -7", "-flat-threshold -7: must be ≥ 0, or FlatNever (-1)"),
	})
	var stdout, stderr bytes.Buffer
	require.Zero(
		t,
		run(a("-machines 2 -devices 2 -count 1001 -dtype bf16 -op mean -iters 2"), &stdout, &stderr),
		stderr.String(),
	)
	require.Empty(t, stderr.String())
	require.Contains(t, stdout.String(), "iteration 1: 1001 × bfloat16 avg on 2×2 ranks")
	require.Contains(t, stdout.String(), "ok max_abs_error=")
}

// check accepts the reference and rejects one wrong element.
func TestCheckCatchesAWrongElement(t *testing.T) {
	const world, n = 4, 300
	dt, op := fairgo.Float32, fairgo.Sum
	out := make([]byte, n*dt.Size())
	for i := int64(0); i < n; i++ {
		want, _ := refdata.Expected(dt, op, 9, world, i)
		elem.Set(dt, out, int(i), want)
	}
	_, _, err := check(dt, op, 9, world, out)
	require.NoError(t, err)
	elem.Set(dt, out, 123, elem.Get(dt, out, 123)+1e-3)
	_, _, err = check(dt, op, 9, world, out)
	require.True(t, errors.Is(err, errMismatch), "got %v", err)
}
