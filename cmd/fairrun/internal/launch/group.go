package launch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Timing of the group's supervision.
const (
	// pollInterval backs up SIGCHLD: the group looks for exited processes
	// at least this often, and, while stopping, for adopted orphans to end.
	pollInterval = 100 * time.Millisecond
	// outputDrain is how long the output of processes that are all dead may
	// still be copied before the pipes are closed under the copiers (a pipe
	// can stay open in a process outside the job's process tree).
	outputDrain = time.Second
)

// lockedWriter writes whole lines from many goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) writeLine(prefix, line []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	buf := make([]byte, 0, len(prefix)+len(line)+1)
	buf = append(append(buf, prefix...), line...)
	if len(line) == 0 || line[len(line)-1] != '\n' {
		buf = append(buf, '\n')
	}
	l.w.Write(buf)
}

// prefixLines copies r to w line by line, each line led by prefix, until r
// ends or fails.
func prefixLines(r io.Reader, w *lockedWriter, prefix string) {
	br := bufio.NewReaderSize(r, 64<<10)
	p := []byte(prefix)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			w.writeLine(p, line)
		}
		if err != nil {
			return
		}
	}
}

// starter runs fn, which starts one worker's process, where the worker of
// the given emulated machine must start (its network namespace). nil: here.
type starter func(machine int, fn func() error) error

// group runs the workers of one node as a unit: the first failure or a
// signal ends all of them and everything they started.
//
// The group reaps its children itself (wait4 on any pid), so a worker's
// exit is known from its process status at once, whatever happens to its
// output. The process is a child subreaper while the group runs (Linux), so
// the workers' descendants whose parents die are adopted and reaped here,
// and are ended with the workers: those that left the workers' process
// groups (setsid) too.
type group struct {
	log            *slog.Logger
	grace          time.Duration
	stdout, stderr *lockedWriter
	start          starter
}

// proc is one started worker.
type proc struct {
	w       Worker
	pid     int // also its process group id
	running bool
}

// run starts the workers, supervises them and returns the exit code and
// its cause. It ends every child process of this process before it
// returns, so it must be the only code starting children meanwhile.
func (g *group) run(ctx context.Context, c Config, workers []Worker) (int, error) {
	restore, err := becomeSubreaper()
	if err != nil {
		g.log.Warn(
			"fairrun: cannot adopt orphaned processes; descendants that leave a worker's process group may survive it",
			"err", err,
		)
	}
	defer restore()
	sigchld := make(chan os.Signal, 1)
	signal.Notify(sigchld, syscall.SIGCHLD)
	defer signal.Stop(sigchld)

	var copiers sync.WaitGroup
	var pipes []*os.File
	procs := map[int]*proc{}
	code, cause := 0, error(nil)
	for _, w := range workers {
		p, outs, err := g.startWorker(c, w, &copiers)
		pipes = append(pipes, outs...)
		if err != nil {
			code, cause = ExitStartFailure, err
			break
		}
		procs[p.pid] = p
	}
	running := len(procs)

	stopping, killing := false, false
	var killTimer <-chan time.Time
	termed := map[int]bool{} // adopted processes already sent SIGTERM
	stop := func(why string) {
		if stopping {
			return
		}
		stopping = true
		g.log.Info("fairrun: stopping workers", "why", why, "running", running, "grace", g.grace)
		for _, p := range procs {
			if p.running {
				signalGroup(p.pid, syscall.SIGTERM)
			}
		}
		killTimer = time.After(g.grace)
	}
	if cause != nil {
		stop(cause.Error())
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	done := ctx.Done()
	for {
		// Reap whatever has exited: workers and adopted orphans.
		for {
			pid, ws, ok := reapOne()
			if !ok {
				break
			}
			p := procs[pid]
			if p == nil || !p.running {
				delete(termed, pid)
				continue
			}
			p.running = false
			running--
			ecode := exitCode(ws)
			if ecode != 0 && !stopping {
				code = ecode
				cause = &ExitError{Rank: p.w.Rank, Pid: pid, Code: ecode, Status: describe(ws)}
				g.log.Error(
					"fairrun: worker failed",
					"rank", p.w.Rank,
					"pid", pid,
					"exit_code", ecode,
					"status", describe(ws),
				)
				stop(fmt.Sprintf("rank %d exited with code %d", p.w.Rank, ecode))
			}
		}
		if running == 0 || stopping {
			orphans := adoptedChildren(procs)
			if running == 0 && len(orphans) == 0 {
				break
			}
			if !stopping {
				stop("every worker exited; ending the processes they left behind")
			}
			for _, pid := range orphans {
				switch {
				case killing:
					signalTree(pid, syscall.SIGKILL)
				case !termed[pid]:
					termed[pid] = true
					signalTree(pid, syscall.SIGTERM)
				}
			}
		}
		select {
		case <-sigchld:
		case <-tick.C:
		case <-done:
			done = nil
			if !stopping {
				code, cause = 1, context.Cause(ctx)
				var se *SignalError
				if errors.As(cause, &se) {
					code = 128 + int(se.Signal)
				}
				stop(cause.Error())
			}
		case <-killTimer:
			killTimer, killing = nil, true
			for _, p := range procs {
				if p.running {
					g.log.Warn("fairrun: worker ignored SIGTERM; killing it", "rank", p.w.Rank, "pid", p.pid)
					signalGroup(p.pid, syscall.SIGKILL)
				}
			}
			for _, pid := range adoptedChildren(procs) {
				g.log.Warn("fairrun: process left by a worker ignored SIGTERM; killing it", "pid", pid)
				signalTree(pid, syscall.SIGKILL)
			}
		}
	}
	g.drain(pipes, &copiers)
	return code, cause
}

// drain lets the output copiers finish, then closes the pipes under those
// still reading.
func (g *group) drain(pipes []*os.File, copiers *sync.WaitGroup) {
	finished := make(chan struct{})
	go func() { copiers.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(outputDrain):
		g.log.Warn("fairrun: worker output still open after every process ended; closing it")
		for _, f := range pipes {
			f.Close()
		}
		<-finished
	}
}

// startWorker starts one worker in its own process group, its stdout and
// stderr on pipes whose read ends it returns (a goroutine copies each, with
// the rank's prefix, and closes it at the end).
func (g *group) startWorker(c Config, w Worker, copiers *sync.WaitGroup) (*proc, []*os.File, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("fairrun: rank %d: %w", w.Rank, err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, nil, fmt.Errorf("fairrun: rank %d: %w", w.Rank, err)
	}
	cmd := exec.Command(c.Program, c.Args...)
	cmd.Env = w.Env
	cmd.Stdout, cmd.Stderr = outW, errW
	cmd.SysProcAttr = sysProcAttr()
	startErr := cmd.Start
	if g.start != nil {
		startErr = func() error { return g.start(w.Machine, cmd.Start) }
	}
	err = startErr()
	outW.Close() // the worker holds its own copies
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, nil, fmt.Errorf("fairrun: start rank %d: %w", w.Rank, err)
	}
	pid := cmd.Process.Pid
	cmd.Process.Release() // the group reaps it by pid
	prefix := "[" + strconv.Itoa(w.Rank) + "] "
	copiers.Add(2)
	go func() { defer copiers.Done(); prefixLines(outR, g.stdout, prefix); outR.Close() }()
	go func() { defer copiers.Done(); prefixLines(errR, g.stderr, prefix); errR.Close() }()
	return &proc{w: w, pid: pid, running: true}, []*os.File{outR, errR}, nil
}

// ExitError is the first failure of a worker: its global rank, its pid,
// and the exit code fairrun returns for it (128 + N when signal N killed
// it).
type ExitError struct {
	Rank   int
	Pid    int
	Code   int
	Status string // "exited with code 3", "killed by signal 9 (killed)"
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("fairrun: worker rank %d (pid %d) %s", e.Rank, e.Pid, e.Status)
}

// reapOne reaps one exited child of this process, if any has exited.
func reapOne() (int, syscall.WaitStatus, bool) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return 0, 0, false
		}
		return pid, ws, true
	}
}

// exitCode is the shell's code for a wait status: the exit status, or 128
// + N for death by signal N.
func exitCode(ws syscall.WaitStatus) int {
	switch {
	case ws.Exited():
		return ws.ExitStatus()
	case ws.Signaled():
		return 128 + int(ws.Signal())
	}
	return 1
}

func describe(ws syscall.WaitStatus) string {
	if ws.Signaled() {
		return fmt.Sprintf("killed by signal %d (%v)", int(ws.Signal()), ws.Signal())
	}
	return "exited with code " + strconv.Itoa(ws.ExitStatus())
}

// adoptedChildren lists the children of this process that are not running
// workers: the orphans it adopted as subreaper (and zombies not yet reaped).
func adoptedChildren(procs map[int]*proc) []int {
	var out []int
	for _, pid := range childrenOf(os.Getpid()) {
		if p := procs[pid]; p == nil || !p.running {
			out = append(out, pid)
		}
	}
	return out
}

// signalGroup signals the worker's whole process group (its children too).
func signalGroup(pid int, sig syscall.Signal) {
	if err := syscall.Kill(-pid, sig); err != nil {
		syscall.Kill(pid, sig)
	}
}

// signalTree signals an adopted process, and its process group when it
// leads one (a setsid child and what it started).
func signalTree(pid int, sig syscall.Signal) {
	if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
		syscall.Kill(-pid, sig)
	}
	syscall.Kill(pid, sig)
}
