package logging

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseLevel(t *testing.T) {
	for _, c := range []struct {
		in   string
		want slog.Level
		ok   bool
	}{
		{"debug", slog.LevelDebug, true},
		{"info", slog.LevelInfo, true},
		{"warn", slog.LevelWarn, true},
		{"error", slog.LevelError, true},
		{"DEBUG", slog.LevelDebug, true},
		{"Info", slog.LevelInfo, true},
		{"WaRn", slog.LevelWarn, true},
		{" error\n", slog.LevelError, true},
		{"", 0, false},
		{"warning", 0, false},
		{"trace", 0, false},
		{"0", 0, false},
		{"-4", 0, false},
		{"info+2", 0, false},
	} {
		got, err := ParseLevel(c.in)
		if !c.ok {
			require.Error(t, err, "%q", c.in)
			require.Contains(t, err.Error(), ValidLevels)
			continue
		}
		require.NoError(t, err, "%q", c.in)
		require.Equal(t, c.want, got, "%q", c.in)
	}
}

// capture sets slog's default logger to a text handler that passes every
// level into the returned buffer, for the test's duration.
func capture(t *testing.T) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return &buf
}

// TestDefault: without FAIRGO_LOG_LEVEL the default logger drops info and
// keeps warnings; the variable lowers or raises the bar.
func TestDefault(t *testing.T) {
	log := func(l *slog.Logger) {
		l.Debug("d")
		l.Info("i")
		l.With("rank", 3).Warn("w")
		l.WithGroup("g").Error("e", "k", 1)
	}
	for _, c := range []struct {
		env  string
		want []string
	}{
		{"", []string{"level=WARN msg=w rank=3", "level=ERROR msg=e g.k=1"}},
		{"info", []string{"level=INFO msg=i", "level=WARN msg=w", "level=ERROR msg=e"}},
		{"INFO", []string{"level=INFO msg=i", "level=WARN msg=w", "level=ERROR msg=e"}},
		{"debug", []string{"level=DEBUG msg=d", "level=INFO msg=i", "level=WARN msg=w", "level=ERROR msg=e"}},
		{"warn", []string{"level=WARN msg=w", "level=ERROR msg=e"}},
		{"error", []string{"level=ERROR msg=e"}},
	} {
		t.Run("env="+c.env, func(t *testing.T) {
			buf := capture(t)
			t.Setenv(EnvLevel, c.env)
			log(Default())
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			require.Len(t, lines, len(c.want), buf.String())
			for i, w := range c.want {
				require.Contains(t, lines[i], w)
			}
		})
	}
}

// TestDefaultUnset: the variable unset (not only empty) is warn too.
func TestDefaultUnset(t *testing.T) {
	buf := capture(t)
	l := FromEnv(func(string) (string, bool) { return "", false })
	l.Info("dropped")
	l.Warn("kept")
	require.NotContains(t, buf.String(), "dropped")
	require.Contains(t, buf.String(), "msg=kept")
}

// TestDefaultHandlerLevel: the variable's level decides alone, so debug
// lines come out of slog's default handler, which stops at info; unset,
// a handler that stops at error keeps its level.
func TestDefaultHandlerLevel(t *testing.T) {
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError})))
	t.Cleanup(func() { slog.SetDefault(prev) })
	FromEnv(func(string) (string, bool) { return "", false }).Warn("quiet")
	require.Empty(t, buf.String())
	FromEnv(func(string) (string, bool) { return "debug", true }).Debug("asked")
	require.Contains(t, buf.String(), "level=DEBUG msg=asked")
}

// TestDefaultInvalid: a value that names no level is ignored (warn), and
// said so once per value, with the valid values.
func TestDefaultInvalid(t *testing.T) {
	buf := capture(t)
	t.Setenv(EnvLevel, "verbose-TestDefaultInvalid")
	l := Default()
	l.Info("dropped")
	l.Warn("kept")
	Default().Warn("kept")
	out := buf.String()
	require.Equal(t, 1, strings.Count(out, "names no log level"), out)
	require.Contains(t, out, `value=verbose-TestDefaultInvalid`)
	require.Contains(t, out, `valid="debug, info, warn, error"`)
	require.NotContains(t, out, "dropped")
	require.Equal(t, 2, strings.Count(out, "msg=kept"), out)
}

func TestFactLevel(t *testing.T) {
	require.Equal(t, slog.LevelInfo, FactLevel(0))
	for _, r := range []int{1, 2, 7, 1023} {
		require.Equal(t, slog.LevelDebug, FactLevel(r))
	}
	// On a rank other than 0, a fact passes only where debug is asked for.
	ctx := context.Background()
	t.Setenv(EnvLevel, "info")
	require.True(t, Default().Enabled(ctx, FactLevel(0)))
	require.False(t, Default().Enabled(ctx, FactLevel(1)))
	t.Setenv(EnvLevel, "debug")
	require.True(t, Default().Enabled(ctx, FactLevel(1)))
	t.Setenv(EnvLevel, "")
	require.False(t, Default().Enabled(ctx, FactLevel(0)))
}
