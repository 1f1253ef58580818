package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/logging"
)

// ErrUnreachable is wrapped by the error of a rank that could not reach its
// store before Open's deadline. It wraps fairgo.ErrTimeout.
var ErrUnreachable = fmt.Errorf("rendezvous: store unreachable: %w", fairgo.ErrTimeout)

// OpenError is Open's failure: which launcher was detected, which store was
// tried where, and which variables the launch was read from.
type OpenError struct {
	Launcher  string // Launch.Launcher ("" for a Launch made by hand)
	Kind      string // the store kind tried (Store* constants)
	Addr      string // the address dialled, or the one rank 0 tried to listen on
	Hosting   bool   // this rank was to host the store
	Rank      int
	WorldSize int
	Vars      string // the launch variables read, as Launch.VarsString
	Err       error
}

func (e *OpenError) Error() string {
	var what string
	switch {
	case e.Hosting:
		what = "could not host the store at " + e.Addr
	case e.Kind == StoreC10d:
		what = "could not reach torchrun's agent store (c10d TCPStore) at " + e.Addr
	case e.Kind == StoreRank0:
		what = "could not reach the store rank 0 hosts at " + e.Addr
	default:
		what = "could not reach the fairgo store at " + e.Addr
	}
	launcher := e.Launcher
	if launcher == "" {
		launcher = "none (a Launch made by hand)"
	}
	vars := e.Vars
	if vars == "" {
		vars = "none"
	}
	return fmt.Sprintf("rendezvous: rank %d of %d %s (launcher %s, store %s): %v; variables read: %s",
		e.Rank, e.WorldSize, what, launcher, e.Kind, e.Err, vars)
}

func (e *OpenError) Unwrap() error { return e.Err }

// OpenOption configures Open. Options only record values; Open validates
// them.
type OpenOption func(*openConfig)

type openConfig struct {
	log      *slog.Logger
	dialOpts []DialOption
	bindHost string
	bindSet  bool
}

// WithOpenLogger sets the logger of Open and of the store it hosts or
// dials. Nil means logging.Default().
func WithOpenLogger(l *slog.Logger) OpenOption { return func(c *openConfig) { c.log = l } }

// WithDialOptions adds options for dialling the store (WithRetryInterval,
// for one). The token comes from Launch.StoreToken.
func WithDialOptions(opts ...DialOption) OpenOption {
	return func(c *openConfig) { c.dialOpts = append(c.dialOpts, opts...) }
}

// WithBindHost sets the host rank 0's store listens on: "" (the default)
// means the host of Launch.StoreAddr (MASTER_ADDR), which must then be an
// address of rank 0's machine; "0.0.0.0" or "::" listen on every interface
// (set a token then).
func WithBindHost(host string) OpenOption {
	return func(c *openConfig) { c.bindHost, c.bindSet = host, true }
}

// LaunchStore is the store Open returns: this process's Store, the launch
// it came from, and, on the rank that hosts it, the server. Its Close
// releases the connection or, on the hosting rank, stops serving: see
// Leave for ending a job without cutting off ranks still using the store.
//
// Under torchrun's agent store the keys are put under
// "fairgo/attempt_<TORCHELASTIC_RESTART_COUNT>/", since that store outlives
// the workers across torchrun's restarts (and PyTorch's TCPStore adds its
// own "/" before every key, see C10dClient).
type LaunchStore struct {
	Store         // what this process uses
	Launch Launch // where it came from
	Kind   string // the store kind (Store* constants)
	Addr   string // the address dialled or served; "" in memory

	server *Server
	stop   context.CancelFunc
	served chan struct{}
	closer interface{ Close() error }
}

// Hosting reports whether this process serves the store (rank 0 of a
// rank-0-hosted store).
func (s *LaunchStore) Hosting() bool { return s.server != nil }

// Server returns the server this process hosts, or nil.
func (s *LaunchStore) Server() *Server { return s.server }

// Close releases the store: it closes this process's connection, or, on the
// hosting rank, stops the server (every other rank's calls then fail with
// ErrClosed). Close on the hosting rank only once no rank needs the store,
// for instance after Leave.
func (s *LaunchStore) Close() error {
	err := s.closer.Close()
	if s.server != nil {
		s.stop()
		if cerr := s.server.Close(); err == nil {
			err = cerr
		}
		<-s.served
	}
	return err
}

// Leave and its keys: every rank but the host adds one to leaveCount when
// it no longer needs the store; the last sets leaveDone. The host then waits
// up to leaveGrace for the connections to close.
const (
	leaveCount = "fairgo-open/left"
	leaveDone  = "fairgo-open/all-left"
	leaveGrace = 10 * time.Second
)

// Leave ends this process's use of the store and closes it. On a rank-0
// hosted store every other rank announces that it has left and closes its
// connection, and the hosting rank waits (until ctx ends) for all of them
// to have announced it, and up to 10s more for their connections to
// close, before it stops serving: no rank loses the store while it still
// uses it. Call it once
// per process, at the end of the job (or of the store's use), on every
// rank. Elsewhere it is Close. When ctx ends first the store is closed all
// the same and ctx.Err() returned.
func (s *LaunchStore) Leave(ctx context.Context) error {
	if s.Kind != StoreRank0 || s.Launch.WorldSize < 2 {
		return s.Close()
	}
	var err error
	if s.Hosting() {
		err = s.Wait(ctx, leaveDone)
		if err == nil {
			// The last rank's Set is applied; let its reply reach it, and
			// every rank close its connection, before the server stops.
			grace, cancel := context.WithTimeout(ctx, leaveGrace)
			for s.server.stats().conns > 0 && grace.Err() == nil {
				select {
				case <-grace.Done():
				case <-time.After(5 * time.Millisecond):
				}
			}
			cancel()
		}
	} else {
		var n int64
		if n, err = s.Add(ctx, leaveCount, 1); err == nil && n == int64(s.Launch.WorldSize-1) {
			err = s.Set(ctx, leaveDone, nil)
		}
	}
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	return err
}

// Open returns the store this process should use, whoever launched it, as
// l says (see FromLookup; a Launch made by hand with StoreKind "" gets a
// memory store for a single process, else the fairgo store at StoreAddr):
//
//   - StoreMemory (a single process): a MemoryStore.
//   - StoreFairgo (fairrun, FAIRGO_STORE_ADDR): Dial StoreAddr with the token.
//   - StoreC10d (torchrun with TORCHELASTIC_USE_AGENT_STORE=True): DialC10d
//     MASTER_ADDR:MASTER_PORT, keys under fairgo/attempt_<restart count>/.
//   - StoreRank0 (torchrun without agent store, Slurm, Open MPI, any
//     launcher setting torchrun's variables): rank 0 listens on StoreAddr
//     (MASTER_ADDR:FAIRGO_STORE_PORT, else MASTER_PORT+1; see WithBindHost)
//     with the token, and uses the store in memory; the others dial it.
//
// Dialling retries until the store answers. When ctx has a deadline, Open
// gives up a little before it (a tenth of the time left, between 50ms and
// 2s), so that the caller gets an *OpenError that says which address it
// tried, which launcher it detected and which variables it read, wrapping
// ErrUnreachable and the last failure, rather than a bare deadline. Without
// a deadline it tries until ctx is cancelled. A refused token fails at once
// (ErrUnauthorized).
func Open(ctx context.Context, l Launch, opts ...OpenOption) (*LaunchStore, error) {
	if ctx == nil {
		return nil, &fairgo.ArgError{Arg: "ctx", Value: nil, Reason: "nil"}
	}
	cfg := newOpenConfig(opts)
	kind, err := launchStoreKind(l)
	if err != nil {
		return nil, err
	}
	if kind == StoreMemory {
		m := NewMemoryStore()
		return &LaunchStore{Store: m, Launch: l, Kind: kind, closer: m}, nil
	}
	o := &opener{l: l, kind: kind, cfg: cfg}
	if err := o.setDialOptions(); err != nil {
		return nil, err
	}
	dctx, cancel := openDeadline(ctx)
	defer cancel()
	switch kind {
	case StoreFairgo:
		return o.dial(dctx)
	case StoreC10d:
		return o.dialC10d(dctx)
	case StoreRank0:
		if l.Rank != 0 {
			return o.dial(dctx)
		}
		return o.host()
	}
	return nil, &fairgo.ArgError{Arg: "rendezvous.Launch.StoreKind", Value: kind, Reason: "unknown"}
}

// newOpenConfig applies Open's options (nil ones skipped) and fills in the
// logger.
func newOpenConfig(opts []OpenOption) openConfig {
	var cfg openConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.log == nil {
		cfg.log = logging.Default()
	}
	return cfg
}

// launchStoreKind checks l's rank and decides the kind of store Open gets:
// memory for a single process, else l.StoreKind, the fairgo store when a
// Launch made by hand names only StoreAddr.
func launchStoreKind(l Launch) (string, error) {
	if l.WorldSize < 1 || l.Rank < 0 || l.Rank >= l.WorldSize {
		return "", &fairgo.ArgError{
			Arg:    "rendezvous.Launch",
			Value:  fmt.Sprintf("rank %d of %d", l.Rank, l.WorldSize),
			Reason: "want 0 <= Rank < WorldSize",
		}
	}
	kind := l.StoreKind
	switch {
	case l.WorldSize == 1:
		kind = StoreMemory
	case kind == "" && l.StoreAddr != "":
		kind = StoreFairgo
	case kind == "":
		return "", &fairgo.ArgError{
			Arg:    "rendezvous.Launch",
			Value:  fmt.Sprintf("rank %d of %d", l.Rank, l.WorldSize),
			Reason: "no store address (StoreAddr) for a job of several processes",
		}
	}
	return kind, nil
}

// opener gets the store of one launch that is not in memory: it dials it,
// or on rank 0 of a rank-0-hosted store, serves it.
type opener struct {
	l        Launch
	kind     string // the store kind (Store* constants)
	cfg      openConfig
	dialOpts []DialOption
}

// setDialOptions gathers the options to dial the store with (the logger,
// Open's dial options, the token but for the c10d store) and checks them.
func (o *opener) setDialOptions() error {
	o.dialOpts = append([]DialOption{WithClientLogger(o.cfg.log)}, o.cfg.dialOpts...)
	if o.l.StoreToken != "" && o.kind != StoreC10d {
		o.dialOpts = append(o.dialOpts, WithDialToken(o.l.StoreToken))
	}
	_, err := newDialConfig(o.dialOpts, o.kind == StoreC10d)
	return err
}

// fail is Open's *OpenError for a failure at addr (hosting: rank 0 could
// not serve the store there).
func (o *opener) fail(hosting bool, addr string, err error) (*LaunchStore, error) {
	return nil, &OpenError{
		Launcher:  o.l.Launcher,
		Kind:      o.kind,
		Addr:      addr,
		Hosting:   hosting,
		Rank:      o.l.Rank,
		WorldSize: o.l.WorldSize,
		Vars:      o.l.VarsString(),
		Err:       err,
	}
}

// unreachable wraps a failure to dial the store in ErrUnreachable, but for
// a refused token or an invalid argument.
func unreachable(err error) error {
	if errors.Is(err, ErrUnauthorized) || errors.Is(err, fairgo.ErrInvalidArgument) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnreachable, err)
}

// dial dials the fairgo store at StoreAddr.
func (o *opener) dial(ctx context.Context) (*LaunchStore, error) {
	c, err := Dial(ctx, o.l.StoreAddr, o.dialOpts...)
	if err != nil {
		return o.fail(false, o.l.StoreAddr, unreachable(err))
	}
	return &LaunchStore{Store: c, Launch: o.l, Kind: o.kind, Addr: o.l.StoreAddr, closer: c}, nil
}

// dialC10d dials torchrun's agent store at StoreAddr, its keys under
// fairgo/attempt_<restart count>/.
func (o *opener) dialC10d(ctx context.Context) (*LaunchStore, error) {
	c, err := DialC10d(ctx, o.l.StoreAddr, o.dialOpts...)
	if err != nil {
		return o.fail(false, o.l.StoreAddr, unreachable(err))
	}
	return &LaunchStore{
		Store:  WithPrefix(c, "fairgo/attempt_"+strconv.Itoa(o.l.RestartCount)),
		Launch: o.l,
		Kind:   o.kind,
		Addr:   o.l.StoreAddr,
		closer: c,
	}, nil
}

// host listens, on rank 0, at StoreAddr's port on the bind host
// (WithBindHost, else StoreAddr's host) with the token, and serves the
// store until the LaunchStore is closed.
func (o *opener) host() (*LaunchStore, error) {
	host, port, err := net.SplitHostPort(o.l.StoreAddr)
	if err != nil {
		return o.fail(true, o.l.StoreAddr, fmt.Errorf("store address: %w", err))
	}
	if o.cfg.bindSet {
		host = o.cfg.bindHost
	}
	bind := net.JoinHostPort(host, port)
	sopts := []ServerOption{WithServerLogger(o.cfg.log)}
	if o.l.StoreToken != "" {
		sopts = append(sopts, WithToken(o.l.StoreToken))
	}
	srv, err := Listen(bind, sopts...)
	if err != nil {
		if errors.Is(err, fairgo.ErrInvalidArgument) {
			return nil, err
		}
		return o.fail(true, bind, fmt.Errorf("%w%s", err, listenHint(err)))
	}
	sctx, stop := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(sctx) }()
	o.cfg.log.Debug(
		"rendezvous: rank 0 hosts the store",
		"addr", srv.Addr(),
		"launcher", o.l.Launcher,
		"token", o.l.StoreToken != "",
	)
	return &LaunchStore{
		Store:  srv.Store(),
		Launch: o.l,
		Kind:   o.kind,
		Addr:   srv.Addr(),
		server: srv,
		stop:   stop,
		served: served,
		closer: nopCloser{},
	}, nil
}

// listenHint says what to do about a failure to listen: the address is not
// rank 0's, or the port is taken; "" for other failures.
func listenHint(err error) string {
	switch {
	case isAddrNotAvail(err):
		return " (MASTER_ADDR must name rank 0's machine; or see WithBindHost)"
	case isAddrInUse(err):
		return " (the port is taken: set " + EnvStorePort + ")"
	}
	return ""
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// openDeadline gives up a little before ctx does: a tenth of the time left,
// between 50ms and 2s.
func openDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	margin := min(max(time.Until(dl)/10, 50*time.Millisecond), 2*time.Second)
	return context.WithDeadline(ctx, dl.Add(-margin))
}

func isAddrInUse(err error) bool { return errors.Is(err, syscall.EADDRINUSE) }

func isAddrNotAvail(err error) bool {
	var dns *net.DNSError
	return errors.Is(err, syscall.EADDRNOTAVAIL) || errors.As(err, &dns)
}
