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
	s := &supervision{g: g, ctx: ctx, done: ctx.Done(), procs: map[int]*proc{}, termed: map[int]bool{}}
	pipes := s.startAll(c, workers, &copiers)
	s.supervise(sigchld)
	g.drain(pipes, &copiers)
	return s.code, s.cause
}

// supervision is one run of the group: its workers, the exit code and its
// cause so far, and how far stopping the job has got.
type supervision struct {
	g    *group
	ctx  context.Context
	done <-chan struct{} // ctx.Done() until seen; then nil

	procs   map[int]*proc // the started workers, by pid
	running int           // workers not yet reaped
	code    int
	cause   error

	stopping  bool             // every worker was sent SIGTERM
	killing   bool             // the grace period is over: SIGKILL
	killTimer <-chan time.Time // ends the grace period
	termed    map[int]bool     // adopted processes already sent SIGTERM
}

// startAll starts the workers in order until one fails to start (that
// failure is then the cause, and the ones started are stopped), and
// returns the read ends of every pipe opened.
func (s *supervision) startAll(c Config, workers []Worker, copiers *sync.WaitGroup) []*os.File {
	var pipes []*os.File
	for _, w := range workers {
		p, outs, err := s.g.startWorker(c, w, copiers)
		pipes = append(pipes, outs...)
		if err != nil {
			s.code, s.cause = ExitStartFailure, err
			break
		}
		s.procs[p.pid] = p
	}
	s.running = len(s.procs)
	if s.cause != nil {
		s.stop(s.cause.Error())
	}
	return pipes
}

// supervise reaps the workers and what they left behind until every one
// has ended, stopping the job on the first failure, when ctx ends, or when
// every worker exited but processes they started remain.
func (s *supervision) supervise(sigchld <-chan os.Signal) {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		s.reap()
		if (s.running == 0 || s.stopping) && s.endLeftovers() {
			return
		}
		select {
		case <-sigchld:
		case <-tick.C:
		case <-s.done:
			s.done = nil
			s.cancelled()
		case <-s.killTimer:
			s.killTimer, s.killing = nil, true
			s.kill()
		}
	}
}

// stop sends every running worker's process group SIGTERM (once) and
// starts the grace period.
func (s *supervision) stop(why string) {
	if s.stopping {
		return
	}
	s.stopping = true
	s.g.log.Info("fairrun: stopping workers", "why", why, "running", s.running, "grace", s.g.grace)
	for _, p := range s.procs {
		if p.running {
			signalGroup(p.pid, syscall.SIGTERM)
		}
	}
	s.killTimer = time.After(s.g.grace)
}

// reap reaps whatever has exited, workers and adopted orphans; the first
// worker to fail before the job is stopping gives the exit code and stops
// the others.
func (s *supervision) reap() {
	for {
		pid, ws, ok := reapOne()
		if !ok {
			return
		}
		p := s.procs[pid]
		if p == nil || !p.running {
			delete(s.termed, pid)
			continue
		}
		p.running = false
		s.running--
		ecode := exitCode(ws)
		if ecode != 0 && !s.stopping {
			s.code = ecode
			s.cause = &ExitError{Rank: p.w.Rank, Pid: pid, Code: ecode, Status: describe(ws)}
			s.g.log.Error(
				"fairrun: worker failed",
				"rank", p.w.Rank,
				"pid", pid,
				"exit_code", ecode,
				"status", describe(ws),
			)
			s.stop(fmt.Sprintf("rank %d exited with code %d", p.w.Rank, ecode))
		}
	}
}

// endLeftovers, once every worker exited or the job is stopping, signals
// the processes the workers left behind (SIGTERM once, SIGKILL after the
// grace period). It reports whether the job is over: no worker running
// and nothing left behind.
func (s *supervision) endLeftovers() bool {
	orphans := adoptedChildren(s.procs)
	if s.running == 0 && len(orphans) == 0 {
		return true
	}
	if !s.stopping {
		s.stop("every worker exited; ending the processes they left behind")
	}
	for _, pid := range orphans {
		switch {
		case s.killing:
			signalTree(pid, syscall.SIGKILL)
		case !s.termed[pid]:
			s.termed[pid] = true
			signalTree(pid, syscall.SIGTERM)
		}
	}
	return false
}

// cancelled stops the job because ctx ended, unless it is stopping
// already: the exit code is 128 + N when signal N ended it, else 1.
func (s *supervision) cancelled() {
	if s.stopping {
		return
	}
	s.code, s.cause = 1, context.Cause(s.ctx)
	var se *SignalError
	if errors.As(s.cause, &se) {
		s.code = 128 + int(se.Signal)
	}
	s.stop(s.cause.Error())
}

// kill ends the grace period: SIGKILL to every worker still running and
// every process left behind.
func (s *supervision) kill() {
	for _, p := range s.procs {
		if p.running {
			s.g.log.Warn("fairrun: worker ignored SIGTERM; killing it", "rank", p.w.Rank, "pid", p.pid)
			signalGroup(p.pid, syscall.SIGKILL)
		}
	}
	for _, pid := range adoptedChildren(s.procs) {
		s.g.log.Warn("fairrun: process left by a worker ignored SIGTERM; killing it", "pid", pid)
		signalTree(pid, syscall.SIGKILL)
	}
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
