package rendezvous

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
)

// MaxPendingPerConn bounds the requests one connection may have in flight
// on the server; more get an error reply.
const MaxPendingPerConn = 1 << 14

// writeTimeout bounds one reply's write, so that a client that stops reading
// cannot hold a server goroutine forever.
const writeTimeout = 30 * time.Second

// Server serves a MemoryStore over TCP to Clients. Blocking Get and Wait
// requests wait on the server (one goroutine per pending request) while the
// connection goes on serving other requests.
type Server struct {
	ln    net.Listener
	store *MemoryStore
	log   *slog.Logger

	mu     sync.Mutex
	conns  map[net.Conn]*sconn
	closed bool
	done   chan struct{}
	wg     sync.WaitGroup
}

// ServerOption configures a Server.
type ServerOption func(*Server)

// WithServerLogger sets the server's logger (connections, malformed frames).
// Nil means slog.Default().
func WithServerLogger(l *slog.Logger) ServerOption { return func(s *Server) { s.log = l } }

// Listen binds a TCP listener on addr ("host:port"; port 0 picks a free
// one) and returns a Server that serves once Serve is called.
func Listen(addr string, opts ...ServerOption) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: listen on %s: %w", addr, err)
	}
	return NewServer(ln, opts...), nil
}

// NewServer returns a Server that will accept connections on ln.
func NewServer(ln net.Listener, opts ...ServerOption) *Server {
	s := &Server{ln: ln, store: NewMemoryStore(), conns: make(map[net.Conn]*sconn), done: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	if s.log == nil {
		s.log = slog.Default()
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
// Close and ctx.Err() when ctx ended.
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
	for {
		conn, aerr := s.ln.Accept()
		if aerr != nil {
			if ctx.Err() == nil && !s.isClosed() {
				var ne net.Error
				if errors.As(aerr, &ne) && ne.Timeout() {
					continue
				}
				err = fmt.Errorf("rendezvous: accept: %w", aerr)
			}
			break
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			conn.Close()
			break
		}
		c := &sconn{s: s, conn: conn, log: s.log.With("remote", conn.RemoteAddr().String()), pending: make(map[uint64]context.CancelFunc)}
		s.conns[conn] = c
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
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.mu.Lock()
		pending += len(c.pending)
		c.mu.Unlock()
	}
	return pending, len(s.conns)
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

// sconn is the server side of one client connection.
type sconn struct {
	s    *Server
	conn net.Conn
	log  *slog.Logger

	wmu sync.Mutex
	mu  sync.Mutex
	// pending maps the ids of blocking requests in flight to their cancel.
	pending map[uint64]context.CancelFunc
	wg      sync.WaitGroup
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
		s.mu.Unlock()
	}()
	br := bufio.NewReader(conn)
	for {
		f, err := readFrame(br)
		if err != nil {
			var fe *frameError
			if errors.As(err, &fe) {
				c.log.Warn("rendezvous: malformed request", "id", fe.id, "err", err)
				c.replyErr(fe.id, "request", err)
				continue
			}
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return
			}
			c.log.Warn("rendezvous: closing connection", "err", err)
			if errors.Is(err, ErrProtocol) || errors.Is(err, ErrTooLarge) {
				c.replyErr(0, "request", err) // best effort: the id is unknown
			}
			return
		}
		c.dispatch(ctx, f)
	}
}

func (c *sconn) write(b []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
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
			c.replyErr(f.id, op.String(), fmt.Errorf("add delta of %d bytes, want 8: %w", len(f.fields[1]), ErrProtocol))
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
		c.replyErr(f.id, op.String(), fmt.Errorf("%d requests pending on this connection: %w", len(c.pending), ErrTooLarge))
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
