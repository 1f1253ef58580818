package fairgo_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// quickStart returns the commands of README.md's first sh block, without
// their comments.
func quickStart(t *testing.T) []string {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(readme), "```sh\n")
	require.True(t, ok, "README.md needs a ```sh block with the quick start")
	block, _, ok := strings.Cut(rest, "```")
	require.True(t, ok, "the README's sh block is not closed")
	var cmds []string
	for _, line := range strings.Split(block, "\n") {
		cmd, _, _ := strings.Cut(line, "#")
		if cmd = strings.TrimSpace(cmd); cmd != "" {
			cmds = append(cmds, cmd)
		}
	}
	return cmds
}

// makeTargets returns the Makefile's targets.
func makeTargets(t *testing.T) map[string]bool {
	t.Helper()
	mk, err := os.ReadFile("Makefile")
	require.NoError(t, err)
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Za-z0-9_.-]+):`).FindAllStringSubmatch(string(mk), -1) {
		targets[m[1]] = true
	}
	return targets
}

// TestReadmeQuickStart: the quick start lists `make demo` and `make test`
// first, every make target it names exists, and `make demo` trains with a
// falling loss and identical replicas. `make test` itself is what runs
// this test, so it is not run again.
func TestReadmeQuickStart(t *testing.T) {
	cmds := quickStart(t)
	require.GreaterOrEqual(t, len(cmds), 2)
	require.Equal(t, []string{"make demo", "make test"}, cmds[:2], "the quick start begins with the two commands")
	targets := makeTargets(t)
	for _, c := range cmds {
		if target, ok := strings.CutPrefix(c, "make "); ok {
			require.Truef(t, targets[target], "README runs %q, but the Makefile has no target %q", c, target)
		}
	}
	if testing.Short() {
		t.Skip("-short: not running make demo")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command in PATH")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var cmd *exec.Cmd
	if makeBin, err := exec.LookPath("make"); err == nil {
		cmd = exec.CommandContext(ctx, makeBin, "--no-print-directory", "demo", "GO="+goBin)
	} else { // what `make demo` runs
		cmd = exec.CommandContext(ctx, goBin, "run", "./examples/ddp", "-machines", "2", "-devices", "4")
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	require.NoError(t, cmd.Run(), "%s:\n%s", cmd, out.String())
	t.Logf("%s took %s:\n%s", cmd, time.Since(start).Round(time.Millisecond), out.String())

	var losses []float64
	for _, m := range regexp.MustCompile(`(?m)^epoch \d+\s+loss ([0-9.]+)`).FindAllStringSubmatch(out.String(), -1) {
		l, err := strconv.ParseFloat(m[1], 64)
		require.NoError(t, err)
		losses = append(losses, l)
	}
	require.GreaterOrEqual(t, len(losses), 2, "the demo prints a loss per epoch:\n%s", out.String())
	require.Less(t, losses[len(losses)-1], losses[0]/2, "the demo's loss falls:\n%s", out.String())
	require.Contains(t, out.String(), "replicas identical")
	require.Contains(t, out.String(), "2×4 ranks")
}
