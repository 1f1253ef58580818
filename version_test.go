package fairgo_test

import (
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
)

// TestVersionEverywhere: fairgo.Version is semantic, and the Python
// package's version (python/fairgo_torch/_version.py, which the wheel
// takes) and pyproject.toml's say the same, so that they cannot drift.
func TestVersionEverywhere(t *testing.T) {
	require.Regexp(t, `^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?$`, fairgo.Version)
	for _, tc := range []struct{ file, pattern string }{
		{"python/fairgo_torch/_version.py", `(?m)^__version__ = "([^"]*)"$`},
		{"python/pyproject.toml", `(?m)^version = "([^"]*)"$`},
		{"cmd/libfairgo/fairgo.h", `(?m)^#define FAIRGO_VERSION "([^"]*)"$`},
	} {
		b, err := os.ReadFile(tc.file)
		require.NoError(t, err)
		m := regexp.MustCompile(tc.pattern).FindSubmatch(b)
		require.NotNil(t, m, "%s states no version", tc.file)
		require.Equal(t, fairgo.Version, string(m[1]), "%s's version", tc.file)
	}
	changelog, err := os.ReadFile("CHANGELOG.md")
	require.NoError(t, err)
	require.Contains(t, string(changelog), "## ["+fairgo.Version+"]", "CHANGELOG.md has a section for %s", fairgo.Version)
}
