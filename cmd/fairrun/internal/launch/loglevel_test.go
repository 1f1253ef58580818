package launch

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/logging"
)

// TestPlanPassesLogLevel: FAIRGO_LOG_LEVEL reaches every worker as given,
// emulated machines or not; fairrun sets none of its own.
func TestPlanPassesLogLevel(t *testing.T) {
	for _, c := range []Config{
		{NProcPerNode: 2, NNodes: 1, MasterAddr: "a", Program: "p"},
		{NProcPerNode: 4, NNodes: 1, MasterAddr: "127.0.0.1", EmulateMachines: 2, Program: "p"},
	} {
		ws, err := Plan(c, []string{"PATH=/bin", logging.EnvLevel + "=Debug"}, "a:1", []string{"0", "1"}, Extras{})
		require.NoError(t, err)
		require.Len(t, ws, c.NProcPerNode)
		for _, w := range ws {
			require.Equal(t, "Debug", envMap(w.Env)[logging.EnvLevel])
		}
		ws, err = Plan(c, []string{"PATH=/bin"}, "a:1", []string{"0", "1"}, Extras{})
		require.NoError(t, err)
		for _, w := range ws {
			require.NotContains(t, envMap(w.Env), logging.EnvLevel)
		}
	}
}

// TestLoggerLevel: fairrun's own logger says info by default, and follows
// FAIRGO_LOG_LEVEL where it is set.
func TestLoggerLevel(t *testing.T) {
	for _, c := range []struct {
		env        string
		info, dbug bool
	}{
		{"", true, false},
		{"warn", false, false},
		{"debug", true, true},
	} {
		t.Setenv(logging.EnvLevel, c.env)
		var buf bytes.Buffer
		log := Config{Stderr: &buf}.logger()
		log.Debug("fairrun: d")
		log.Info("fairrun: i")
		log.Warn("fairrun: w")
		require.Equal(t, c.info, bytes.Contains(buf.Bytes(), []byte("level=INFO")), "%q: %s", c.env, buf.String())
		require.Equal(t, c.dbug, bytes.Contains(buf.Bytes(), []byte("level=DEBUG")), "%q: %s", c.env, buf.String())
		require.Contains(t, buf.String(), "level=WARN")
	}
}
