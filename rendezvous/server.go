package rendezvous

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
)

// MaxPendingPerConn bounds the requests one connection may have in flight
// on the server; more get an error reply.
const MaxPendingPerConn = 1 << 14

// Server serves a MemoryStore over TCP to Clients. Blocking Get and Wait
// requests wait on the server (one goroutine per pending request) while the
// connection goes on serving other requests.
//
// A Server holds against hostile connections: every connection must open
// with a Hello (carrying the token when WithToken is set) within the
// handshake timeout, and only a bounded number may be at that stage; frames
// must finish within the frame timeout and connections that send nothing
// for the idle timeout are closed (clients ping); frame buffers grow only as
// bytes arrive, charged to a server-wide budget; connections over the cap
// are refused. See the With* options for the limits and their defaults.
type Server struct {
	ln     net.Listener
	store  *MemoryStore
	log    *slog.Logger
	cfg    serverConfig
	budget *semaphore.Weighted
	tokenH [sha256.Size]byte // digest of the token, compared in constant time

	reserved atomic.Int64 // request bytes reserved from the budget
	held     atomic.Int64 // capacity of the request buffers allocated

	mu          sync.Mutex
	conns       map[net.Conn]*sconn
	handshaking int // connections in conns that have not completed their Hello
	closed      bool
	done        chan struct{}
	wg          sync.WaitGroup
}

// Listen binds a TCP listener on addr ("host:port"; port 0 picks a free
// one) and returns a Server that serves once Serve is called. Invalid
// options are reported before anything is bound.
func Listen(addr string, opts ...ServerOption) (*Server, error) {
	cfg, err := newServerConfig(opts)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: listen on %s: %w", addr, err)
	}
	return newServer(ln, cfg), nil
}

func newServer(ln net.Listener, cfg serverConfig) *Server {
	s := &Server{
		ln:     ln,
		store:  NewMemoryStore(),
		log:    cfg.log,
		cfg:    cfg,
		budget: semaphore.NewWeighted(cfg.maxBufferedBytes),
		conns:  make(map[net.Conn]*sconn),
		done:   make(chan struct{}),
	}
	if cfg.tokenSet {
		s.tokenH = sha256.Sum256(cfg.token)
	}
	return s
}

// Addr returns the address the server listens on, as "host:port".
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Store returns the server's data, for use by the hosting process without a
// connection.
func (s *Server) Store() *MemoryStore { return s.store }

// Serve accepts connections until ctx ends or Close is called, then closes
// every connection and waits for their goroutines. It returns nil after
// Close and ctx.Err() when ctx ended. Transient accept errors (such as
// running out of file descriptors) are logged and retried after a pause.
func (s *Server) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-ctx.Done():
		case <-s.done:
		}
		s.shutdown()
	}()
	var err error
	var pause time.Duration
	for {
		conn, aerr := s.ln.Accept()
		if aerr != nil {
			if ctx.Err() != nil || s.isClosed() {
				break
			}
			if errors.Is(aerr, net.ErrClosed) {
				err = fmt.Errorf("rendezvous: accept: %w", aerr)
				break
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			s.log.Warn("rendezvous: accept failed; retrying", "err", aerr, "pause", pause)
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		pause = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			conn.Close()
			break
		}
		if len(s.conns) >= s.cfg.maxConns || s.handshaking >= s.cfg.maxHandshakes {
			n, h := len(s.conns), s.handshaking
			s.mu.Unlock()
			s.refuse(conn, n, h)
			continue
		}
		c := &sconn{s: s, conn: conn, pending: make(map[uint64]context.CancelFunc)}
		s.conns[conn] = c
		s.handshaking++
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(ctx, c)
	}
	cancel()
	s.shutdown()
	s.wg.Wait()
	if err != nil {
		return err
	}
	if s.isClosedByClose() {
		return nil
	}
	return ctx.Err()
}

// refuse answers a connection over the caps with ErrBusy and closes it. The
// reply is a few dozen bytes into a fresh socket's buffer: it does not
// block the accept loop.
func (s *Server) refuse(conn net.Conn, conns, handshaking int) {
	s.log.Debug(
		"rendezvous: connection refused: server busy",
		"remote", conn.RemoteAddr().String(),
		"conns", conns,
		"handshaking", handshaking,
	)
	conn.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	msg := fmt.Sprintf(
		"store busy: %d connections open (cap %d), %d in handshake (cap %d)",
		conns,
		s.cfg.maxConns,
		handshaking,
		s.cfg.maxHandshakes,
	)
	conn.Write(appendFrame(nil, 0, statusError, []byte{codeBusy}, []byte(msg)))
	conn.Close()
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Server) isClosedByClose() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// shutdown stops accepting and closes every connection.
func (s *Server) shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
}

// pendingRequests counts the blocking requests waiting on the server, and
// the open connections.
func (s *Server) pendingRequests() (pending, conns int) {
	st := s.stats()
	return st.pending, st.conns
}

// serverStats is a snapshot of what the server holds, for tests.
type serverStats struct {
	conns, handshaking, pending int
	reserved, held              int64 // see Server.reserved, Server.held
}

func (s *Server) stats() serverStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := serverStats{conns: len(s.conns), handshaking: s.handshaking, reserved: s.reserved.Load(), held: s.held.Load()}
	for _, c := range s.conns {
		c.mu.Lock()
		st.pending += len(c.pending)
		c.mu.Unlock()
	}
	return st
}

// Close stops the server: Serve returns, connections are closed and the
// store is closed (blocked callers of Store() get ErrClosed).
func (s *Server) Close() error {
	s.mu.Lock()
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	s.mu.Unlock()
	s.shutdown()
	return s.store.Close()
}

// reserve takes n bytes from the budget, waiting until ctx ends; the
// returned func gives them back.
func (s *Server) reserve(ctx context.Context, n int) (func(), error) {
	if !s.budget.TryAcquire(int64(n)) {
		if err := s.budget.Acquire(ctx, int64(n)); err != nil {
			return nil, fmt.Errorf(
				"no room for a frame of %d bytes in the server's buffer budget (%d bytes) before the frame deadline: %w",
				n/2,
				s.cfg.maxBufferedBytes,
				ErrBusy,
			)
		}
	}
	s.reserved.Add(int64(n))
	return func() {
		s.reserved.Add(-int64(n))
		s.budget.Release(int64(n))
	}, nil
}

// sconn is the server side of one client connection.
type sconn struct {
	s      *Server
	conn   net.Conn
	authed bool // its Hello succeeded; owned by serveConn until it returns

	wmu sync.Mutex
	mu  sync.Mutex
	// pending maps the ids of blocking requests in flight to their cancel.
	pending map[uint64]context.CancelFunc
	wg      sync.WaitGroup
}

// Close closes the connection; its goroutines end.
func (c *sconn) Close() error { return c.conn.Close() }

func (c *sconn) log() *slog.Logger {
	return c.s.log.With("remote", c.conn.RemoteAddr().String())
}

func (s *Server) serveConn(ctx context.Context, c *sconn) {
	defer s.wg.Done()
	conn := c.conn
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		conn.Close()
		c.wg.Wait()
		s.mu.Lock()
		delete(s.conns, conn)
		if !c.authed {
			s.handshaking--
		}
		s.mu.Unlock()
	}()
	br := bufio.NewReader(conn)
	if !s.handshake(ctx, c, br) {
		return
	}
	for {
		conn.SetReadDeadline(time.Now().Add(s.cfg.idleTimeout))
		f, release, err := s.readFrame(ctx, conn, br, s.cfg.maxFrameBytes, time.Time{})
		if err != nil {
			release()
			var fe *frameError
			if errors.As(err, &fe) {
				c.log().Warn("rendezvous: malformed request", "id", fe.id, "err", err)
				c.replyErr(fe.id, "request", err)
				continue
			}
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return
			}
			c.log().Warn("rendezvous: closing connection", "err", err)
			if errors.Is(err, ErrProtocol) || errors.Is(err, ErrTooLarge) {
				c.replyErr(0, "request", err) // best effort: the id is unknown
			}
			return
		}
		c.dispatch(ctx, f)
		release() // dispatch copied what outlives it
	}
}

// readFrame reads one frame of at most maxLen bytes: the connection's read
// deadline (set by the caller) bounds the wait for its length word, and from
// there the frame must be complete within the frame timeout (or by limit
// when it is earlier). A frame longer than firstChunk first reserves twice
// its length (the peak of its growing buffer) from the server's budget, in
// one piece, waiting for it within the frame's deadline: a frame waits while
// holding nothing, so frames cannot deadlock each other over the budget.
// Shorter frames (a Hello among them) are not charged: they cost at most
// firstChunk per connection. The returned func gives back what the frame
// holds; call it, also on error, once done with the frame's fields.
func (s *Server) readFrame(
	ctx context.Context,
	conn net.Conn,
	br *bufio.Reader,
	maxLen int,
	limit time.Time,
) (frame, func(), error) {
	unreserve := func() {}
	begin := func(n int) error {
		deadline := time.Now().Add(s.cfg.frameTimeout)
		if !limit.IsZero() && limit.Before(deadline) {
			deadline = limit
		}
		conn.SetReadDeadline(deadline)
		if n <= firstChunk {
			return nil
		}
		rctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		r, err := s.reserve(rctx, 2*n)
		if err != nil {
			return err
		}
		unreserve = r
		return nil
	}
	f, held, err := readFrameBudget(br, maxLen, begin, func(delta int) { s.held.Add(int64(delta)) })
	return f, func() { s.held.Add(-int64(held)); unreserve() }, err
}

// handshake reads the connection's Hello within the handshake timeout and
// checks its token; it answers and reports whether to go on serving.
func (s *Server) handshake(ctx context.Context, c *sconn, br *bufio.Reader) bool {
	limit := time.Now().Add(s.cfg.handshakeTimeout)
	c.conn.SetReadDeadline(limit)
	f, release, err := s.readFrame(ctx, c.conn, br, helloMaxFrame, limit)
	defer release()
	refuse := func(code byte, msg string, args ...any) bool {
		c.log().Debug("rendezvous: handshake refused", append([]any{"reason", msg}, args...)...)
		c.write(appendFrame(nil, f.id, statusError, []byte{code}, []byte(msg)))
		return false
	}
	switch {
	case err != nil:
		if errors.Is(err, ErrTooLarge) || errors.Is(err, ErrProtocol) {
			return refuse(codeProtocol, "expected a Hello frame first: "+err.Error())
		}
		c.log().Debug("rendezvous: handshake failed", "err", err)
		return false
	case opCode(f.code) != opHello || len(f.fields) != 2 || string(f.fields[0]) != helloMagic:
		return refuse(codeProtocol, fmt.Sprintf("expected a Hello frame (%s) first", helloMagic), "op", opCode(f.code))
	case s.cfg.tokenSet:
		got := sha256.Sum256(f.fields[1])
		if subtle.ConstantTimeCompare(got[:], s.tokenH[:]) != 1 {
			if len(f.fields[1]) == 0 {
				return refuse(codeAuth, "this store requires a token (FAIRGO_STORE_TOKEN)")
			}
			return refuse(codeAuth, "wrong token")
		}
	}
	s.mu.Lock()
	c.authed = true
	s.handshaking--
	s.mu.Unlock()
	c.write(
		appendFrame(
			nil,
			f.id,
			statusOK,
			binary.BigEndian.AppendUint64(nil, uint64(s.cfg.idleTimeout/time.Millisecond)),
		),
	)
	return true
}

func (c *sconn) write(b []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.conn.SetWriteDeadline(time.Now().Add(c.s.cfg.writeTimeout))
	if _, err := c.conn.Write(b); err != nil {
		c.conn.Close() // the read loop ends and cleans up
	}
}

func (c *sconn) reply(id uint64, fields ...[]byte) {
	c.write(appendFrame(nil, id, statusOK, fields...))
}

func (c *sconn) replyErr(id uint64, op string, err error) {
	msg := err.Error()
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	c.write(appendFrame(nil, id, statusError, []byte{errorCode(err)}, []byte(msg)))
}

// opFields is the number of fields of each request with a fixed count.
var opFields = map[opCode]int{opSet: 2, opGet: 1, opAdd: 2, opCompareSet: 3, opDelete: 1, opPing: 0, opCancel: 1}

func (c *sconn) dispatch(ctx context.Context, f frame) {
	op := opCode(f.code)
	if n, ok := opFields[op]; ok && len(f.fields) != n {
		c.replyErr(f.id, op.String(), fmt.Errorf("%v takes %d fields, got %d: %w", op, n, len(f.fields), ErrProtocol))
		return
	}
	st := c.s.store
	switch op {
	case opSet:
		if err := st.Set(ctx, string(f.fields[0]), f.fields[1]); err != nil {
			c.replyErr(f.id, op.String(), err)
			return
		}
		c.reply(f.id)
	case opAdd:
		if len(f.fields[1]) != 8 {
			c.replyErr(
				f.id,
				op.String(),
				fmt.Errorf("add delta of %d bytes, want 8: %w", len(f.fields[1]), ErrProtocol),
			)
			return
		}
		n, err := st.Add(ctx, string(f.fields[0]), int64(binary.BigEndian.Uint64(f.fields[1])))
		if err != nil {
			c.replyErr(f.id, op.String(), err)
			return
		}
		c.reply(f.id, binary.BigEndian.AppendUint64(nil, uint64(n)))
	case opCompareSet:
		v, err := st.CompareSet(ctx, string(f.fields[0]), f.fields[1], f.fields[2])
		if err != nil {
			c.replyErr(f.id, op.String(), err)
			return
		}
		c.reply(f.id, v)
	case opDelete:
		ok, err := st.Delete(ctx, string(f.fields[0]))
		if err != nil {
			c.replyErr(f.id, op.String(), err)
			return
		}
		b := byte(0)
		if ok {
			b = 1
		}
		c.reply(f.id, []byte{b})
	case opPing:
		c.reply(f.id)
	case opCancel:
		if len(f.fields[0]) == 8 {
			c.cancel(binary.BigEndian.Uint64(f.fields[0]))
		}
	case opGet, opWait:
		c.startBlocking(ctx, op, f)
	default:
		c.replyErr(f.id, op.String(), fmt.Errorf("unknown op code %d: %w", f.code, ErrProtocol))
	}
}

func (c *sconn) cancel(id uint64) {
	c.mu.Lock()
	cancel, ok := c.pending[id]
	c.mu.Unlock()
	if ok {
		cancel()
	}
}

// startBlocking runs a Get or Wait in its own goroutine; it ends when the
// keys exist, the client cancels it, or the connection closes.
func (c *sconn) startBlocking(ctx context.Context, op opCode, f frame) {
	keys := make([]string, len(f.fields))
	for i, k := range f.fields {
		keys[i] = string(k)
	}
	c.mu.Lock()
	if _, dup := c.pending[f.id]; dup {
		c.mu.Unlock()
		c.replyErr(f.id, op.String(), fmt.Errorf("request id %d already pending: %w", f.id, ErrProtocol))
		return
	}
	if len(c.pending) >= MaxPendingPerConn {
		c.mu.Unlock()
		c.replyErr(
			f.id,
			op.String(),
			fmt.Errorf("%d requests pending on this connection: %w", len(c.pending), ErrTooLarge),
		)
		return
	}
	rctx, cancel := context.WithCancel(ctx)
	c.pending[f.id] = cancel
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer func() {
			c.mu.Lock()
			delete(c.pending, f.id)
			c.mu.Unlock()
			cancel()
		}()
		var v []byte
		var err error
		if op == opGet {
			v, err = c.s.store.Get(rctx, keys[0])
		} else {
			err = c.s.store.Wait(rctx, keys...)
		}
		switch {
		case rctx.Err() != nil:
			// Cancelled by the client or the connection closed: no reply.
		case err != nil:
			c.replyErr(f.id, op.String(), err)
		case op == opGet:
			c.reply(f.id, v)
		default:
			c.reply(f.id)
		}
	}()
}
