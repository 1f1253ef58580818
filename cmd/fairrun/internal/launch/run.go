package launch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/fairgo/fairgo/rendezvous"
)

// SignalError is the cause to give a context cancelled by a signal, so that
// Run exits with 128 + the signal number, as shells do.
type SignalError struct{ Signal syscall.Signal }

func (e *SignalError) Error() string { return "fairrun: received " + e.Signal.String() }

// exit codes of Run besides the workers' own.
const (
	ExitLaunchFailure = 1   // the store or a worker could not start
	ExitStartFailure  = 127 // the worker program could not be executed
)

// Run starts the workers, hosts the store on node rank 0, and waits. It
// returns the exit code fairrun should end with: 0 when every worker
// exited 0; otherwise the first failure's code (128 + N for a worker killed
// by signal N), or 128 + N when fairrun itself was stopped by signal N (the
// cause of ctx, see SignalError). The error explains a non-zero code.
func Run(ctx context.Context, c Config) (int, error) {
	if err := c.Validate(); err != nil {
		return ExitLaunchFailure, err
	}
	log := c.logger()
	base := c.Env
	if base == nil {
		base = os.Environ()
	}

	// The store.
	storeAddr := net.JoinHostPort(c.MasterAddr, strconv.Itoa(c.MasterPort))
	if c.NodeRank == 0 {
		listen := storeAddr
		if c.NNodes > 1 {
			listen = net.JoinHostPort("", strconv.Itoa(c.MasterPort)) // every interface
		}
		srv, err := rendezvous.Listen(listen, rendezvous.WithServerLogger(log))
		if err != nil {
			return ExitLaunchFailure, fmt.Errorf("fairrun: host the store: %w", err)
		}
		_, port, _ := net.SplitHostPort(srv.Addr())
		storeAddr = net.JoinHostPort(c.MasterAddr, port)
		sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		served := make(chan struct{})
		go func() { srv.Serve(sctx); close(served) }()
		defer func() { stop(); srv.Close(); <-served }()
	}

	var gpus []string
	if c.EmulateMachines > 0 {
		gpus = GPUList(c, base, log)
		if per := c.NProcPerNode / c.EmulateMachines; per > len(gpus) {
			log.Warn("fairrun: ranks of one emulated machine share a GPU (NCCL refuses that)", "ranks_per_machine", per, "gpus", len(gpus))
		}
	}
	workers, err := Plan(c, base, storeAddr, gpus)
	if err != nil {
		return ExitLaunchFailure, err
	}
	g := &group{log: log, grace: c.Grace, stdout: &lockedWriter{w: c.stdout()}, stderr: &lockedWriter{w: c.stderr()}}
	return g.run(ctx, c, workers)
}

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

// prefixLines copies r to w line by line, each line led by prefix.
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

type group struct {
	log            *slog.Logger
	grace          time.Duration
	stdout, stderr *lockedWriter
}

type exit struct {
	w    Worker
	pid  int
	code int
	err  error
}

type proc struct {
	w       Worker
	cmd     *exec.Cmd
	running bool
}

func (g *group) run(ctx context.Context, c Config, workers []Worker) (int, error) {
	exits := make(chan exit, len(workers))
	var output sync.WaitGroup
	procs := make([]*proc, 0, len(workers))
	code, cause := 0, error(nil)
	for _, w := range workers {
		p, err := g.start(c, w, exits, &output)
		if err != nil {
			code, cause = ExitStartFailure, err
			break
		}
		procs = append(procs, p)
	}
	running := len(procs)
	var killTimer <-chan time.Time
	stopping := false
	stop := func(why string) {
		if stopping {
			return
		}
		stopping = true
		g.log.Info("fairrun: stopping workers", "why", why, "running", running, "grace", g.grace)
		for _, p := range procs {
			if p.running {
				signalGroup(p.cmd.Process.Pid, syscall.SIGTERM)
			}
		}
		killTimer = time.After(g.grace)
	}
	if cause != nil {
		stop(cause.Error())
	}
	done := ctx.Done()
	for running > 0 {
		select {
		case e := <-exits:
			running--
			for _, p := range procs {
				if p.w.Slot == e.w.Slot {
					p.running = false
				}
			}
			if e.code != 0 && !stopping {
				code, cause = e.code, fmt.Errorf("fairrun: worker rank %d (pid %d) failed: %w", e.w.Rank, e.pid, e.err)
				g.log.Error("fairrun: worker failed", "rank", e.w.Rank, "exit_code", e.code, "err", e.err)
				stop(fmt.Sprintf("rank %d exited with code %d", e.w.Rank, e.code))
			}
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
			killTimer = nil
			for _, p := range procs {
				if p.running {
					g.log.Warn("fairrun: worker ignored SIGTERM; killing it", "rank", p.w.Rank, "pid", p.cmd.Process.Pid)
					signalGroup(p.cmd.Process.Pid, syscall.SIGKILL)
				}
			}
		}
	}
	output.Wait()
	return code, cause
}

// start launches one worker in its own process group.
func (g *group) start(c Config, w Worker, exits chan<- exit, output *sync.WaitGroup) (*proc, error) {
	cmd := exec.Command(c.Program, c.Args...)
	cmd.Env = w.Env
	cmd.SysProcAttr = sysProcAttr()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("fairrun: rank %d: %w", w.Rank, err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("fairrun: rank %d: %w", w.Rank, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("fairrun: start rank %d: %w", w.Rank, err)
	}
	prefix := "[" + strconv.Itoa(w.Rank) + "] "
	output.Add(2)
	var pipes sync.WaitGroup
	pipes.Add(2)
	go func() { defer output.Done(); defer pipes.Done(); prefixLines(stdout, g.stdout, prefix) }()
	go func() { defer output.Done(); defer pipes.Done(); prefixLines(stderr, g.stderr, prefix) }()
	go func() {
		pipes.Wait() // Wait closes the pipes: read them to the end first
		err := cmd.Wait()
		code := 0
		if err != nil {
			code = 1
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					code = 128 + int(ws.Signal())
				} else if ee.ExitCode() > 0 {
					code = ee.ExitCode()
				}
			}
		}
		exits <- exit{w: w, pid: cmd.Process.Pid, code: code, err: err}
	}()
	return &proc{w: w, cmd: cmd, running: true}, nil
}

// signalGroup signals the worker's whole process group (its children too).
func signalGroup(pid int, sig syscall.Signal) {
	if err := syscall.Kill(-pid, sig); err != nil {
		syscall.Kill(pid, sig)
	}
}
