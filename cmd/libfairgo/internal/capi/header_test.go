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
)

// headerEnums reads the FAIRGO_* enumerators of fairgo.h.
func headerEnums(t *testing.T) map[string]int {
	t.Helper()
	h, err := os.ReadFile("../../fairgo.h")
	require.NoError(t, err)
	enums := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^\s*(FAIRGO_[A-Z0-9_]+)\s*=\s*(-?\d+)\s*,?`).FindAllStringSubmatch(string(h), -1) {
		v, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		enums[m[1]] = v
	}
	return enums
}

// TestHeaderMatchesGo: the result codes, dtypes and ops of fairgo.h have
// the values of capi.Code, fairgo.DType and fairgo.Op, and nothing more.
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
	require.Equal(t, want, enums)
}
