package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// FindFairrun returns the fairrun launcher to use: explicit when set, else
// the fairrun beside this executable (bin/ holds both on the GPU machine),
// else fairrun from PATH.
func FindFairrun(explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "fairrun")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath("fairrun")
	if err != nil {
		return "", fmt.Errorf("bench: fairrun not found beside this program nor in PATH (give -fairrun): %w", err)
	}
	return p, nil
}

// LaunchEmulated runs prog with args as machines × (nproc/machines) workers
// under fairrun --emulate-machines with fairrun's further flags (such as
// --nic-gbit 10), adding "-json FILE" to args, and returns the records the
// workers wrote there. The workers' output goes to stdout and stderr
// (prefixed with their rank by fairrun).
func LaunchEmulated(
	ctx context.Context,
	fairrun string,
	flags []string,
	machines, nproc int,
	prog string,
	args []string,
	stdout, stderr io.Writer,
) ([]Record, error) {
	dir, err := os.MkdirTemp("", "fairbench-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "records.jsonl")
	full := append(
		[]string{"--emulate-machines", strconv.Itoa(machines), "--nproc-per-node", strconv.Itoa(nproc)},
		flags...)
	full = append(full, "--", prog)
	full = append(full, args...)
	full = append(full, "-json", out)
	cmd := exec.CommandContext(ctx, fairrun, full...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// fairrun stops its workers on SIGTERM; SIGKILL would orphan them.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("bench: %s with %d emulated machines × %d workers failed after %v: %w",
			filepath.Base(fairrun), machines, nproc/max(machines, 1), time.Since(start).Round(time.Second), err)
	}
	recs, err := ReadJSONLFiles([]string{out})
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, errors.New("bench: the workers wrote no records")
	}
	return recs, nil
}
