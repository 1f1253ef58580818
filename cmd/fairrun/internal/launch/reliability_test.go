package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The test binary doubles as a worker for the reliability tests: with
// envRole set, TestMain runs one of these roles instead of the tests.
const (
	envRole       = "FAIRRUN_TEST_ROLE"        // "bgchild", "setsid", "sleeper" or "netcheck"
	envDir        = "FAIRRUN_TEST_DIR"         // where pids and times are written
	envFailRank   = "FAIRRUN_TEST_FAIL_RANK"   // bgchild: the rank that exits
	envFailCode   = "FAIRRUN_TEST_FAIL_CODE"   // bgchild: its exit code
	envIgnoreTerm = "FAIRRUN_TEST_IGNORE_TERM" // "worker", "child" or "both" ignore SIGTERM
)

// runRole plays a worker role and returns the process's exit code.
//
//   - bgchild: every rank writes its pid and hangs, except the fail rank,
//     which waits for the others' pids, starts a sleeper that inherits its
//     stdout and stderr, writes the time and exits with the fail code.
//   - setsid: every rank starts a sleeper in a session of its own (it leaves
//     the worker's process group) that inherits stdout, then hangs.
//   - sleeper: writes its pid and sleeps 60 s.
func runRole(role string) int {
	dir := os.Getenv(envDir)
	rank := os.Getenv("RANK")
	ignore := os.Getenv(envIgnoreTerm)
	write := func(name, v string) {
		tmp := filepath.Join(dir, "."+name)
		if err := os.WriteFile(tmp, []byte(v), 0o644); err == nil {
			os.Rename(tmp, filepath.Join(dir, name))
		}
	}
	child := func(setsid bool) error {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), envRole+"=sleeper")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: setsid}
		if err := cmd.Start(); err != nil {
			return err
		}
		write("child-"+rank, strconv.Itoa(cmd.Process.Pid))
		return nil
	}
	switch role {
	case "netcheck":
		return netcheck()
	case "sleeper":
		if ignore == "child" || ignore == "both" {
			signal.Ignore(syscall.SIGTERM)
		}
		write("sleeper-"+strconv.Itoa(os.Getpid()), "")
		time.Sleep(60 * time.Second)
		return 0
	case "bgchild", "setsid":
		if ignore == "worker" || ignore == "both" {
			signal.Ignore(syscall.SIGTERM)
		}
		fmt.Println("worker", rank, "up")
		if role == "bgchild" && rank == os.Getenv(envFailRank) {
			// Fail once every other rank is up.
			world, _ := strconv.Atoi(os.Getenv("WORLD_SIZE"))
			for r := range world {
				for i := 0; i < 500 && strconv.Itoa(r) != rank; i++ {
					if _, err := os.Stat(filepath.Join(dir, "worker-"+strconv.Itoa(r))); err == nil {
						break
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			if err := child(false); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			code, _ := strconv.Atoi(os.Getenv(envFailCode))
			write("worker-"+rank, strconv.Itoa(os.Getpid()))
			write("died-"+rank, strconv.FormatInt(time.Now().UnixNano(), 10))
			return code
		}
		if role == "setsid" {
			if err := child(true); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		write("worker-"+rank, strconv.Itoa(os.Getpid()))
		time.Sleep(60 * time.Second)
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}

// waitFiles waits until dir holds every named file and returns their
// contents.
func waitFiles(t *testing.T, dir string, names ...string) []string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	out := make([]string, len(names))
	for i, name := range names {
		for {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err == nil {
				out[i] = string(b)
				break
			}
			require.True(t, time.Now().Before(deadline), "%s never appeared in %s", name, dir)
			time.Sleep(5 * time.Millisecond)
		}
	}
	return out
}

func atoiAll(t *testing.T, ss []string) []int {
	t.Helper()
	out := make([]int, len(ss))
	for i, s := range ss {
		v, err := strconv.Atoi(s)
		require.NoError(t, err, "%q", s)
		out[i] = v
	}
	return out
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// requireAllGone waits up to within for every pid to be dead, then fails
// naming those that are not.
func requireAllGone(t *testing.T, within time.Duration, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var left []int
		for _, pid := range pids {
			if alive(pid) {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes still alive after %v: %v", within, left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killAll makes sure nothing a test started outlives it.
func killAll(dir string) {
	names, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, n := range names {
		base := filepath.Base(n)
		var pid int
		switch {
		case strings.HasPrefix(base, "sleeper-"):
			pid, _ = strconv.Atoi(strings.TrimPrefix(base, "sleeper-"))
		case strings.HasPrefix(base, "worker-"), strings.HasPrefix(base, "child-"):
			b, _ := os.ReadFile(n)
			pid, _ = strconv.Atoi(string(b))
		}
		if pid > 0 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func roleEnv(role, dir string, extra ...string) []string {
	return append(append(os.Environ(), envRole+"="+role, envDir+"="+dir), extra...)
}

// A worker exits 3 while a child of it still holds its stdout and stderr:
// fairrun notices the exit at once (from the process status, not from the
// output closing), stops the others, returns 3 naming the rank, and the
// child is dead afterwards. Ranks are shuffled so that the rank is not the
// worker's slot.
func TestRunExitWhileChildHoldsOutput(t *testing.T) {
	dir := t.TempDir()
	t.Cleanup(func() { killAll(dir) })
	var so, se syncBuffer
	c := Config{NProcPerNode: 3, NNodes: 1, MasterAddr: DefaultMasterAddr, Grace: 2 * time.Second,
		Shuffle: true, ShuffleSeed: 4, Program: os.Args[0],
		Env:    roleEnv("bgchild", dir, envFailRank+"=2", envFailCode+"=3"),
		Stdout: &so, Stderr: &se}
	ws, err := Plan(c, c.Env, "127.0.0.1:1", nil, Extras{})
	require.NoError(t, err)
	require.NotEqual(t, 2, ws[2].Rank, "seed 4 must move rank 2 off slot 2")

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() { code, err := Run(ctx, c); done <- result{code, err} }()
	var r result
	select {
	case r = <-done:
	case <-time.After(9 * time.Second):
		t.Fatal("Run did not return")
	}
	returned := time.Now()
	died := atoiAll(t, waitFiles(t, dir, "died-2"))[0]
	reaction := returned.Sub(time.Unix(0, int64(died)))
	t.Logf("Run returned %d %v, %v after rank 2 exited", r.code, r.err, reaction)
	require.Equal(t, 3, r.code, "stderr: %s", se.String())
	require.ErrorContains(t, r.err, "rank 2 ")
	require.Less(t, reaction, time.Second, "fairrun took too long to notice the exit")
	require.Regexp(t, `rank=2 .*exit_code=3`, se.String(), "the log names the failed rank")
	pids := atoiAll(t, waitFiles(t, dir, "worker-0", "worker-1", "worker-2", "child-2"))
	requireAllGone(t, 0, pids...)
}

// SIGTERM to fairrun ends every worker and the children they started in
// sessions of their own (outside the workers' process groups), within
// grace + 1 s; children that ignore SIGTERM are killed after the grace.
func TestFairrunSIGTERMEndsSetsidChildren(t *testing.T) {
	_, fairrun := binaries(t)
	const grace = 500 * time.Millisecond
	for _, ignore := range []string{"", "child", "both"} {
		t.Run("ignore="+ignore, func(t *testing.T) {
			dir := t.TempDir()
			t.Cleanup(func() { killAll(dir) })
			cmd := exec.Command(fairrun, "--nproc-per-node", "2", "--grace", grace.String(), "--", os.Args[0])
			cmd.Env = roleEnv("setsid", dir, envIgnoreTerm+"="+ignore)
			var so, se syncBuffer
			cmd.Stdout, cmd.Stderr = &so, &se
			require.NoError(t, cmd.Start())
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() {
				cmd.Process.Kill()
				<-exited
			})
			pids := atoiAll(t, waitFiles(t, dir, "worker-0", "worker-1", "child-0", "child-1"))
			time.Sleep(50 * time.Millisecond) // let the sleepers set up their signal handling

			sent := time.Now()
			require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
			select {
			case err := <-exited:
				exited <- err
				var ee *exec.ExitError
				require.ErrorAs(t, err, &ee, "stderr: %s", se.String())
				require.Equal(t, 128+int(syscall.SIGTERM), ee.ExitCode(), "stderr: %s", se.String())
				t.Logf("fairrun exited %v after SIGTERM", time.Since(sent))
			case <-time.After(grace + time.Second):
				t.Fatalf("fairrun still running %v after SIGTERM; stderr: %s", grace+time.Second, se.String())
			}
			requireAllGone(t, grace+time.Second-time.Since(sent), pids...)
		})
	}
}

// A worker killed by a signal is reported as 128 + the signal, naming its
// rank, also when the others keep their output open.
func TestRunWorkerKilled(t *testing.T) {
	dir := t.TempDir()
	t.Cleanup(func() { killAll(dir) })
	var so, se syncBuffer
	c := Config{NProcPerNode: 2, NNodes: 1, MasterAddr: DefaultMasterAddr, Grace: 2 * time.Second,
		Program: os.Args[0], Env: roleEnv("setsid", dir), Stdout: &so, Stderr: &se}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() { code, err := Run(ctx, c); done <- result{code, err} }()
	pids := atoiAll(t, waitFiles(t, dir, "worker-0", "worker-1", "child-0", "child-1"))
	killed := time.Now()
	require.NoError(t, syscall.Kill(pids[1], syscall.SIGKILL))
	select {
	case r := <-done:
		t.Logf("Run returned %d %v after %v", r.code, r.err, time.Since(killed))
		require.Equal(t, 128+int(syscall.SIGKILL), r.code, "stderr: %s", se.String())
		require.ErrorContains(t, r.err, "rank 1 ")
		require.Less(t, time.Since(killed), 1500*time.Millisecond)
	case <-time.After(9 * time.Second):
		t.Fatal("Run did not return")
	}
	requireAllGone(t, 0, pids...)
}
