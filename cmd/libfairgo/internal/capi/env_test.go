package capi_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/cmd/libfairgo/internal/capi"
	"github.com/fairgo/fairgo/hier"
)

func lookupIn(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
}

// TestOptionsFromEnv: each variable sets its option; unset and empty
// variables leave the option alone; a bad value names the variable.
func TestOptionsFromEnv(t *testing.T) {
	base := capi.DefaultOptions()
	base.SliceBytes = 123
	cases := []struct {
		name string
		env  map[string]string
		want func(o *capi.Options)
		bad  string
	}{
		{"none", nil, func(*capi.Options) {}, ""},
		{
			"empty values are unset",
			map[string]string{"FAIRGO_SLICE_BYTES": " ", "FAIRGO_ALGORITHM": ""},
			func(*capi.Options) {},
			"",
		},
		{
			"algorithm",
			map[string]string{"FAIRGO_ALGORITHM": "Rail-RSAG"},
			func(o *capi.Options) { o.Algorithm = hier.RailRSAG },
			"",
		},
		{"sizes", map[string]string{"FAIRGO_SLICE_BYTES": "16M", "FAIRGO_FLAT_THRESHOLD_BYTES": "-1"},
			func(o *capi.Options) { o.SliceBytes, o.FlatThreshold = 16<<20, hier.FlatNever }, ""},
		{"timeouts", map[string]string{"FAIRGO_TIMEOUT": "90", "FAIRGO_INIT_TIMEOUT": "2m"},
			func(o *capi.Options) { o.OpTimeout, o.InitTimeout = 90*time.Second, 2*time.Minute }, ""},
		{"timeout off", map[string]string{"FAIRGO_TIMEOUT": "0"}, func(o *capi.Options) { o.OpTimeout = 0 }, ""},
		{"device", map[string]string{"FAIRGO_DEVICE": "3"}, func(o *capi.Options) { o.Device = 3 }, ""},
		{"bad algorithm", map[string]string{"FAIRGO_ALGORITHM": "ring"}, nil, "FAIRGO_ALGORITHM"},
		{"bad size", map[string]string{"FAIRGO_SLICE_BYTES": "lots"}, nil, "FAIRGO_SLICE_BYTES"},
		{"negative size", map[string]string{"FAIRGO_SLICE_BYTES": "-5"}, nil, "FAIRGO_SLICE_BYTES"},
		{"bad threshold", map[string]string{"FAIRGO_FLAT_THRESHOLD_BYTES": "-2"}, nil, "FAIRGO_FLAT_THRESHOLD_BYTES"},
		{"negative timeout", map[string]string{"FAIRGO_TIMEOUT": "-1"}, nil, "FAIRGO_TIMEOUT"},
		{"bad init timeout", map[string]string{"FAIRGO_INIT_TIMEOUT": "soon"}, nil, "FAIRGO_INIT_TIMEOUT"},
		{"bad device", map[string]string{"FAIRGO_DEVICE": "-2"}, nil, "FAIRGO_DEVICE"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := base.FromEnv(lookupIn(c.env))
			if c.bad != "" {
				require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
				require.ErrorContains(t, err, c.bad)
				return
			}
			require.NoError(t, err)
			want := base
			c.want(&want)
			require.Equal(t, want, got)
		})
	}
}

// hierReason is the reason hier.ValidateOptions gives for opt.
func hierReason(t *testing.T, opt hier.Option) string {
	t.Helper()
	var bad *fairgo.ArgError
	require.ErrorAs(t, hier.ValidateOptions(opt), &bad)
	return bad.Reason
}

// TestOptionsFromEnvInvalid: a variable that parses but holds a value
// hier (or, for the C ABI's own settings, this package) rejects is an
// *fairgo.ArgError naming the variable with its text, hier's reason and
// fairgo.ErrInvalidArgument; the options come back unchanged.
func TestOptionsFromEnvInvalid(t *testing.T) {
	_, parseErr := hier.ParseAlgorithm("ring")
	var unknownAlgorithm *fairgo.ArgError
	require.ErrorAs(t, parseErr, &unknownAlgorithm)
	cases := []struct {
		variable, text string
		reason         string // "": only checked to be given
	}{
		{"FAIRGO_SLICE_BYTES", "-1", hierReason(t, hier.WithSliceSize(-1))},
		{"FAIRGO_SLICE_BYTES", "-2M", hierReason(t, hier.WithSliceSize(-2<<20))},
		{"FAIRGO_FLAT_THRESHOLD_BYTES", "-2", hierReason(t, hier.WithFlatThreshold(-2))},
		{"FAIRGO_TIMEOUT", "-1", hierReason(t, hier.WithTimeout(-time.Second))},
		{"FAIRGO_TIMEOUT", "-90s", hierReason(t, hier.WithTimeout(-90*time.Second))},
		{"FAIRGO_ALGORITHM", "ring", unknownAlgorithm.Reason},
		{"FAIRGO_INIT_TIMEOUT", "-1", ""},
		{"FAIRGO_DEVICE", "-2", ""},
	}
	base := capi.DefaultOptions()
	for _, c := range cases {
		t.Run(c.variable+"="+c.text, func(t *testing.T) {
			env := map[string]string{c.variable: c.text, "FAIRGO_ALGORITHM": "flat"}
			if c.variable == "FAIRGO_ALGORITHM" {
				env["FAIRGO_SLICE_BYTES"] = "1M"
			}
			got, err := base.FromEnv(lookupIn(env))
			require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
			var bad *fairgo.ArgError
			require.ErrorAs(t, err, &bad)
			require.Equal(t, "environment variable "+c.variable, bad.Arg)
			require.Equal(t, `"`+c.text+`"`, bad.Value)
			if c.reason != "" {
				require.Equal(t, c.reason, bad.Reason)
			}
			require.NotEmpty(t, bad.Reason)
			require.Equal(t, base, got, "a bad variable changes nothing")
		})
	}
}

// TestOptionsFromEnvJudgesOnlyItsVariables: FromEnv judges the values of
// the variables it read, not those it was given (a C caller's config is
// judged by init, which names its field).
func TestOptionsFromEnvJudgesOnlyItsVariables(t *testing.T) {
	base := capi.DefaultOptions()
	base.SliceBytes = -1
	got, err := base.FromEnv(lookupIn(map[string]string{"FAIRGO_ALGORITHM": "rail-a2a"}))
	require.NoError(t, err)
	require.Equal(t, hier.RailAllToAll, got.Algorithm)
	require.Equal(t, int64(-1), got.SliceBytes)
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "4096": 4096, "16M": 16 << 20, "16mib": 16 << 20, "2KB": 2 << 10, "1G": 1 << 30, " 7 ": 7,
		"-1": -1, "12B": 12,
	} {
		got, err := capi.ParseBytes(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "M", "1.5M", "16T", "9999999999G", "x1"} {
		_, err := capi.ParseBytes(in)
		require.Error(t, err, in)
	}
}

func TestParseSeconds(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"0": 0, "600": 10 * time.Minute, "0.5": 500 * time.Millisecond, "90s": 90 * time.Second, "10m": 10 * time.Minute,
		// Negative durations parse: hier.WithTimeout and the init
		// timeout's check judge them.
		"-1": -time.Second, "-2s": -2 * time.Second,
	} {
		got, err := capi.ParseSeconds(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "soon", "NaN", "1e300", "-1e300"} {
		_, err := capi.ParseSeconds(in)
		require.Error(t, err, in)
	}
}
