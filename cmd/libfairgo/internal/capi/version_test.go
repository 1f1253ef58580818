package capi_test

import (
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
)

// TestHeaderVersion: fairgo.h's FAIRGO_VERSION is fairgo.Version, which
// the library's fairgo_version returns (make capi-test compares the two
// from C).
func TestHeaderVersion(t *testing.T) {
	h, err := os.ReadFile("../../fairgo.h")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^#define FAIRGO_VERSION "([^"]*)"$`).FindStringSubmatch(string(h))
	require.NotNil(t, m, "fairgo.h defines FAIRGO_VERSION")
	require.Equal(t, fairgo.Version, m[1])
}
