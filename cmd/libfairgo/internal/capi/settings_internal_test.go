package capi

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSettingsComplete: every setting parses its variable and shows its
// fairgo_config_t value; it is either a hier option (named, and built) or
// one of the C ABI's own (judged here), never both nor neither.
func TestSettingsComplete(t *testing.T) {
	for _, s := range Settings {
		t.Run(s.Env, func(t *testing.T) {
			require.NotNil(t, s.parse)
			require.NotNil(t, s.field)
			hierOption := s.Option != "" && s.option != nil
			own := s.Option == "" && s.option == nil && s.invalid != nil
			require.True(t, hierOption != own, "a hier option (Option and option) or the C ABI's own (invalid)")
			if hierOption {
				require.Nil(t, s.invalid, "hier judges its options")
			}
		})
	}
	require.Len(t, DefaultOptions().reducerOptions(), 4, "algorithm, slice, flat threshold, watchdog")
}
