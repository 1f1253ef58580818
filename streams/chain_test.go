package streams_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/streams"
)

// A chain never made (its engine failed before) releases as nothing.
func TestNilChainReleases(t *testing.T) {
	var c *streams.Chain
	require.NoError(t, c.Release())
}
