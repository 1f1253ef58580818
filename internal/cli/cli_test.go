package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
)

func newFlags() (*flag.FlagSet, *string, *bool) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var mode string
	Choice(fs, &mode, "mode", "fast", "`mode`", OneOf("fast", "slow"))
	check := fs.Bool("check", false, "check")
	fs.Duration("wait", time.Second, "wait")
	return fs, &mode, check
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		err   string // "": no error; "help": flag.ErrHelp; else a usage error containing it
		mode  string
		check bool
	}{
		{name: "defaults", args: nil, mode: "fast"},
		{name: "flags", args: []string{"-mode", "slow", "--check"}, mode: "slow", check: true},
		{name: "-h", args: []string{"-h"}, err: "help"},
		{name: "--help after a flag", args: []string{"-check", "--help"}, err: "help"},
		{name: "-help", args: []string{"-help"}, err: "help"},
		{name: "--version", args: []string{"--version"}, err: "version"},
		{name: "-version after a flag", args: []string{"-check", "-version"}, err: "version"},
		{name: "-version=false", args: []string{"-version=false"}, mode: "fast"},
		{name: "unknown flag", args: []string{"-bogus"}, err: "flag provided but not defined: -bogus"},
		{name: "unknown flag as typed", args: []string{"--bogus=1"}, err: "flag provided but not defined: --bogus"},
		{name: "bad value as typed", args: []string{"--wait", "soon"}, err: `invalid value "soon" for flag --wait: `},
		{name: "missing value as typed", args: []string{"--mode"}, err: "flag needs an argument: --mode"},
		{name: "bad boolean as typed", args: []string{"--check=maybe"}, err: `invalid boolean value "maybe" for --check: `},
		{name: "choice lists the choices", args: []string{"-mode", "medium"},
			err: `invalid value "medium" for flag -mode: not one of fast, slow`},
		{name: "bad duration", args: []string{"-wait", "soon"}, err: `invalid value "soon" for flag -wait`},
		{name: "an argument", args: []string{"-check", "extra"}, err: `unexpected argument "extra"`},
		{name: "arguments", args: []string{"a", "-check"}, err: `unexpected arguments "a" "-check"`},
		{name: "after --", args: []string{"--", "a"}, err: `unexpected argument "a"`},
		{name: "nothing after --", args: []string{"-check", "--"}, mode: "fast", check: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, mode, check := newFlags()
			var out bytes.Buffer
			fs.SetOutput(&out)
			err := Parse(fs, tc.args)
			require.Empty(t, out.String(), "the flag set prints nothing")
			switch tc.err {
			case "":
				require.NoError(t, err)
				require.Equal(t, tc.mode, *mode)
				require.Equal(t, tc.check, *check)
			case "help":
				require.ErrorIs(t, err, flag.ErrHelp)
				require.NotErrorIs(t, err, ErrUsage)
			case "version":
				require.ErrorIs(t, err, ErrVersion)
				require.NotErrorIs(t, err, ErrUsage)
			default:
				require.ErrorIs(t, err, ErrUsage)
				require.Contains(t, err.Error(), tc.err)
			}
		})
	}
}

// ParseFlags leaves the arguments to the command.
func TestParseFlagsLeavesArguments(t *testing.T) {
	fs, _, check := newFlags()
	require.NoError(t, ParseFlags(fs, []string{"-check", "prog", "-x"}))
	require.True(t, *check)
	require.Equal(t, []string{"prog", "-x"}, fs.Args())
}

func TestStatus(t *testing.T) {
	p := Program{Name: "tool", Help: func(w io.Writer) { fmt.Fprintln(w, "usage: tool [flags]") }}
	for _, tc := range []struct {
		name           string
		err            error
		code           int
		stdout, stderr string
	}{
		{name: "success", err: nil, code: ExitOK},
		{name: "help", err: fmt.Errorf("wrapped: %w", flag.ErrHelp), code: ExitOK, stdout: "usage: tool [flags]\n"},
		{name: "usage", err: Usagef("-n %s: too large", "9K"), code: ExitUsage,
			stderr: "tool: -n 9K: too large\nrun \"tool -h\" for usage\n"},
		{name: "usage with the prefix already", err: Usage(errors.New("tool: tool: bad")), code: ExitUsage,
			stderr: "tool: bad\nrun \"tool -h\" for usage\n"},
		{name: "failure", err: errors.New("disk full"), code: ExitFailure, stderr: "tool: disk full\n"},
		{name: "version", err: ErrVersion, code: ExitOK, stdout: "tool " + fairgo.Version + "\n"},
		{name: "failure with the prefix", err: fmt.Errorf("tool: open x: %w", errors.New("gone")),
			code: ExitFailure, stderr: "tool: open x: gone\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			require.Equal(t, tc.code, p.Status(tc.err, &stdout, &stderr))
			require.Equal(t, tc.stdout, stdout.String())
			require.Equal(t, tc.stderr, stderr.String())
		})
	}
	var stderr bytes.Buffer
	require.Equal(t, ExitUsage, Program{Name: "x", Hint: "see x(1)"}.Status(Usagef("bad"), io.Discard, &stderr))
	require.Equal(t, "x: bad\nsee x(1)\n", stderr.String())
}

func TestUsageKeepsTheError(t *testing.T) {
	base := errors.New("base")
	err := Usage(fmt.Errorf("ctx: %w", base))
	require.ErrorIs(t, err, ErrUsage)
	require.ErrorIs(t, err, base)
	require.Equal(t, "ctx: base", err.Error())
	require.NoError(t, Usage(nil))
	require.Same(t, err, Usage(err), "marked once")
	require.NotErrorIs(t, base, ErrUsage)
}

func TestGiven(t *testing.T) {
	fs, mode, check := newFlags()
	given := Given(fs)
	fs.Var(fs.Lookup("wait").Value, "wait_for", "an alias")
	require.NoError(t, Parse(fs, []string{"-check", "-wait_for", "1500ms", "-mode", "slow"}))
	require.True(t, *check, "a boolean flag still takes no value")
	require.Equal(t, "slow", *mode)
	require.Equal(t, map[string]string{"check": "true", "wait": "1500ms", "mode": "slow"}, given)
	require.Equal(t, "1.5s", fs.Lookup("wait").Value.String())
	require.Error(t, Parse(fs, []string{"-wait", "x"}))
	require.Equal(t, "1500ms", given["wait"], "a refused value is not recorded")
}

func TestChecksListTheChoices(t *testing.T) {
	for _, tc := range []struct {
		check func(string) error
		ok    []string
		bad   string
		want  string
	}{
		{DType(), []string{"float32", "bf16", "half", "uint64"}, "float8",
			"not one of float16, bfloat16, float32, float64, int8, uint8, int32, uint32, int64, uint64"},
		{DType(fairgo.Float32, fairgo.BFloat16), []string{"float32", "fp32", "bfloat16", "bf16"}, "int32",
			"not one of float32, bfloat16"},
		{Op, []string{"sum", "avg", "mean", "prod"}, "xor", "not one of sum, avg, max, min, prod"},
		{OneOf("sim", "cuda"), []string{"sim", "cuda"}, "tpu", "not one of sim, cuda"},
	} {
		for _, s := range tc.ok {
			require.NoError(t, tc.check(s), s)
		}
		err := tc.check(tc.bad)
		require.EqualError(t, err, tc.want)
	}
	require.ErrorIs(t, DType()("float8"), fairgo.ErrUnknownDType)
	require.ErrorIs(t, Op("xor"), fairgo.ErrUnknownOp)
}

func TestArgAndReason(t *testing.T) {
	ae := &fairgo.ArgError{Arg: "-f", Value: 1, Reason: "must be at least 2"}
	err := Arg(fmt.Errorf("sizes: %w", ae))
	require.EqualError(t, err, "-f 1: must be at least 2")
	require.ErrorIs(t, err, ErrUsage)
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	require.EqualError(t, Arg(errors.New("plain")), "plain")
	require.ErrorIs(t, Arg(errors.New("plain")), ErrUsage)
	require.NoError(t, Arg(nil))
	require.EqualError(t, Reason(ae), "must be at least 2")
	require.ErrorIs(t, Reason(ae), fairgo.ErrInvalidArgument)
	require.EqualError(t, Reason(errors.New("plain")), "plain")
}
