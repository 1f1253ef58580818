package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// MPSControl is the program that runs and stops a CUDA MPS daemon.
const MPSControl = "nvidia-cuda-mps-control"

// mpsDirs are searched for MPSControl after the PATH of the workers
// environment (NVIDIA's container images put it there).
var mpsDirs = []string{"/usr/local/nvidia/bin"}

// Bounds of the MPS daemon's start and stop.
const (
	mpsStartTimeout = 30 * time.Second
	mpsStopTimeout  = 30 * time.Second
	mpsExitWait     = 10 * time.Second
)

// ErrNoMPS: MPSControl is nowhere to be found (an error with --mps on, a
// warning with auto).
var ErrNoMPS = errors.New("fairrun: " + MPSControl + " not found")

// findMPSControl looks for MPSControl in the PATH of env, then in mpsDirs.
func findMPSControl(env []string) (string, error) {
	path, _ := newEnv(env).get("PATH")
	dirs := append(filepath.SplitList(path), mpsDirs...)
	for _, dir := range dirs {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, MPSControl)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w in PATH or %s", ErrNoMPS, strings.Join(mpsDirs, ", "))
}

// wantMPS decides --mps: auto means on when emulated machines' ranks share
// a GPU (more workers than GPUs: ranks of different machines, or of one
// machine that are NCCL hosts of their own), where the GPU would otherwise
// time-slice between their processes.
func wantMPS(c Config, gpus []string) bool {
	switch c.MPS {
	case MPSOn:
		return true
	case MPSOff:
		return false
	}
	return c.EmulateMachines > 0 && c.NProcPerNode > len(gpus)
}

// mpsDaemon is a private MPS control daemon: its own pipe and log
// directories, so that it serves only this job's workers and leaves the
// host's MPS setup (and every GPU setting) alone.
type mpsDaemon struct {
	control string
	dir     string // holds pipe/ and log/
	env     MPSEnv
	cmdEnv  []string
	log     *slog.Logger
}

// mpsDirPrefix starts the name of a daemon's directory in os.TempDir(),
// followed by fairrun's pid and "-".
const mpsDirPrefix = "fairrun-mps-"

// startMPS starts a private MPS control daemon (nvidia-cuda-mps-control -d
// with fresh CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY).
func startMPS(ctx context.Context, control string, base []string, log *slog.Logger) (_ *mpsDaemon, err error) {
	removeMPSLeftovers(log)
	dir, err := os.MkdirTemp("", mpsDirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return nil, fmt.Errorf("fairrun: MPS directories: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	d := &mpsDaemon{control: control, dir: dir, log: log,
		env: MPSEnv{PipeDir: filepath.Join(dir, "pipe"), LogDir: filepath.Join(dir, "log")}}
	for _, sub := range []string{d.env.PipeDir, d.env.LogDir} {
		if err := os.Mkdir(sub, 0o700); err != nil {
			return nil, fmt.Errorf("fairrun: MPS directories: %w", err)
		}
	}
	e := newEnv(base)
	e.set("CUDA_MPS_PIPE_DIRECTORY", d.env.PipeDir)
	e.set("CUDA_MPS_LOG_DIRECTORY", d.env.LogDir)
	d.cmdEnv = e.list()
	ctx, cancel := context.WithTimeout(ctx, mpsStartTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, control, "-d")
	cmd.Env = d.cmdEnv
	if out, err := cmd.CombinedOutput(); err != nil {
		d.killLeft() // a daemon may have started before the failure
		return nil, fmt.Errorf("fairrun: start the MPS daemon (%s -d): %w: %s", control, err, bytes.TrimSpace(out))
	}
	log.Info("fairrun: private MPS daemon started", "pipe_dir", d.env.PipeDir, "log_dir", d.env.LogDir)
	return d, nil
}

// Stop asks the daemon to quit (echo quit | nvidia-cuda-mps-control),
// waits for its processes to end, kills those that do not, and removes the
// directories.
func (d *mpsDaemon) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), mpsStopTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.control)
	cmd.Env = d.cmdEnv
	cmd.Stdin = strings.NewReader("quit\n")
	out, qerr := cmd.CombinedOutput()
	if qerr != nil {
		qerr = fmt.Errorf(
			"fairrun: stop the MPS daemon (echo quit | %s): %w: %s",
			d.control,
			qerr,
			bytes.TrimSpace(out),
		)
	}
	deadline := time.Now().Add(mpsExitWait)
	for len(d.processes()) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := d.killLeft(); left > 0 {
		d.log.Warn("fairrun: MPS processes did not quit; killed them", "count", left)
	}
	if err := os.RemoveAll(d.dir); err != nil {
		return errors.Join(qerr, fmt.Errorf("fairrun: remove the MPS directories: %w", err))
	}
	return qerr
}

// processes lists the MPS processes serving this daemon's directory: those
// whose environment names its pipe directory and whose program is NVIDIA's
// MPS (the control daemon and the servers it starts).
func (d *mpsDaemon) processes() []int {
	want := []byte("CUDA_MPS_PIPE_DIRECTORY=" + d.env.PipeDir + "\x00")
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		comm, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err != nil || !strings.HasPrefix(string(comm), "nvidia-cuda-mps") {
			continue
		}
		environ, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(append(environ, 0), want) {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// killLeft kills the daemon's processes that are still there and returns
// how many there were.
func (d *mpsDaemon) killLeft() int {
	pids := d.processes()
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	return len(pids)
}

// removeMPSLeftovers ends the daemons of crashed fairruns (a directory of
// theirs is left whose pid is gone) and removes their directories.
func removeMPSLeftovers(log *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), mpsDirPrefix+"*-*"))
	for _, dir := range dirs {
		rest := strings.TrimPrefix(filepath.Base(dir), mpsDirPrefix)
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
			continue // that fairrun may still be running
		}
		d := &mpsDaemon{dir: dir, env: MPSEnv{PipeDir: filepath.Join(dir, "pipe")}}
		n := d.killLeft()
		if err := os.RemoveAll(dir); err == nil {
			log.Info("fairrun: removed the MPS daemon of a crashed run", "dir", dir, "pid", pid, "processes_killed", n)
		}
	}
}
