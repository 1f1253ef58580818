package capi_test

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/cmd/libfairgo/internal/capi"
	"github.com/fairgo/fairgo/hier"
)

// headerEnums reads the FAIRGO_* enumerators of fairgo.h.
func headerEnums(t *testing.T) map[string]int {
	t.Helper()
	h, err := os.ReadFile("../../fairgo.h")
	require.NoError(t, err)
	enums := map[string]int{}
	enumLine := regexp.MustCompile(`(?m)^\s*(FAIRGO_[A-Z0-9_]+)\s*=\s*(-?\d+)\s*,?`)
	for _, m := range enumLine.FindAllStringSubmatch(string(h), -1) {
		v, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		enums[m[1]] = v
	}
	return enums
}

// TestHeaderMatchesGo: the result codes, dtypes, ops and algorithms of
// fairgo.h have the values of capi.Code, fairgo.DType, fairgo.Op and
// hier.Algorithm, and nothing more.
// (The cgo build checks the exported functions' prototypes against the
// header; this checks the numbers.)
func TestHeaderMatchesGo(t *testing.T) {
	enums := headerEnums(t)
	want := map[string]int{}
	for _, c := range capi.Codes {
		want[c.String()] = int(c)
	}
	for _, d := range fairgo.DTypes {
		want["FAIRGO_"+strings.ToUpper(d.String())] = int(d)
	}
	for _, o := range fairgo.Ops {
		want["FAIRGO_"+strings.ToUpper(o.String())] = int(o)
	}
	for a := hier.Auto; a.Valid(); a++ {
		want["FAIRGO_ALGORITHM_"+strings.ToUpper(strings.ReplaceAll(a.String(), "-", "_"))] = int(a)
	}
	require.Equal(t, want, enums)
}

// TestSettingsDocumented: fairgo.h's table of settings and README.md's
// environment table name every setting with its three spellings.
func TestSettingsDocumented(t *testing.T) {
	h, err := os.ReadFile("../../fairgo.h")
	require.NoError(t, err)
	readme, err := os.ReadFile("../../../../README.md")
	require.NoError(t, err)
	for _, s := range capi.Settings {
		row := regexp.MustCompile(`(?m)^ \*   ` + s.Env + ` +` + s.Keyword + ` +` + s.Field + `$`)
		require.Regexp(t, row, string(h), "fairgo.h's settings table lacks %s", s.Env)
		require.Regexp(
			t,
			regexp.MustCompile("(?m)^\\| `"+s.Env+"` \\|"),
			string(readme),
			"README.md's environment table lacks %s",
			s.Env,
		)
		require.Contains(t, string(readme), "`"+s.Keyword+"`", "README.md does not name the keyword of %s", s.Env)
	}
}

// TestAlgorithmsDocumented: FAIRGO_ALGORITHM's setting lists hier's
// algorithms by name, and README.md's row of FAIRGO_ALGORITHM and fairgo.h's
// note on the environment name every one.
func TestAlgorithmsDocumented(t *testing.T) {
	readme, err := os.ReadFile("../../../../README.md")
	require.NoError(t, err)
	row := regexp.MustCompile("(?m)^\\| `FAIRGO_ALGORITHM` \\|.*$").FindString(string(readme))
	require.NotEmpty(t, row, "README.md's settings table lacks FAIRGO_ALGORITHM")
	h, err := os.ReadFile("../../fairgo.h")
	require.NoError(t, err)
	note := regexp.MustCompile(`(?s)In the environment, algorithms are named (.*?);`).FindSubmatch(h)
	require.NotNil(t, note, "fairgo.h does not say how algorithms are named in the environment")
	var want []string
	for a := hier.Auto; a.Valid(); a++ {
		want = append(want, a.String())
	}
	for _, s := range capi.Settings {
		if s.Env != "FAIRGO_ALGORITHM" {
			continue
		}
		names := regexp.MustCompile(`[a-z0-9-]+`).FindAllString(strings.ReplaceAll(s.Value, " or ", ", "), -1)
		require.Equal(t, want, names, "the setting's value lists hier's algorithms")
		for _, name := range names {
			require.Contains(t, row, "`"+name+"`", "README.md's FAIRGO_ALGORITHM row lacks %s", name)
			require.Regexp(t, `\b`+regexp.QuoteMeta(name)+`\b`, string(note[1]), "fairgo.h's note lacks %s", name)
		}
		return
	}
	t.Fatal("no FAIRGO_ALGORITHM among capi.Settings")
}
