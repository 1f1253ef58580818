package rendezvous

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/logging"
)

// Client is a Store served by a Server over one TCP connection. Requests
// from many goroutines are multiplexed on the connection; a blocking Get or
// Wait does not hold up the others. The client opens with a Hello carrying
// its token (WithDialToken) and then pings the server at a third of the idle
// timeout the server announced, so that a connection blocked in a long Get
// or Wait stays open. When the connection breaks, pending and later calls
// fail with an error wrapping ErrClosed; the client does not reconnect.
type Client struct {
	conn net.Conn
	br   *bufio.Reader
	addr string
	log  *slog.Logger

	wmu      sync.Mutex   // serializes frame writes
	lastSend atomic.Int64 // unix nanoseconds of the last frame written

	mu      sync.Mutex
	pending map[uint64]chan frame
	nextID  uint64
	err     error         // why the connection ended; set once
	done    chan struct{} // closed when the connection ended
}

// DialOption configures Dial (and DialC10d). Options only record values;
// Dial validates them and reports the first invalid one by name.
type DialOption func(*dialConfig)

type dialConfig struct {
	retry    time.Duration
	log      *slog.Logger
	token    string
	tokenSet bool
	c10d     bool // DialC10d: a token is meaningless there
}

// DefaultRetryInterval is the longest pause between connection attempts.
const DefaultRetryInterval = 500 * time.Millisecond

// handshakeTimeout bounds the client's wait for the Hello reply.
const handshakeTimeout = 10 * time.Second

// WithRetryInterval sets the longest pause between connection attempts
// (attempts start 10ms apart and back off to this). Zero means
// DefaultRetryInterval.
func WithRetryInterval(d time.Duration) DialOption { return func(c *dialConfig) { c.retry = d } }

// WithClientLogger sets the client's logger. Nil means logging.Default().
func WithClientLogger(l *slog.Logger) DialOption { return func(c *dialConfig) { c.log = l } }

// WithDialToken sends token in the Hello, for a server started WithToken
// (1 to MaxTokenLen bytes). Launchers pass it in FAIRGO_STORE_TOKEN.
func WithDialToken(token string) DialOption {
	return func(c *dialConfig) { c.token, c.tokenSet = token, true }
}

func newDialConfig(opts []DialOption, c10d bool) (dialConfig, error) {
	cfg := dialConfig{c10d: c10d}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	switch {
	case cfg.retry < 0:
		return cfg, &fairgo.ArgError{Arg: "rendezvous.WithRetryInterval", Value: cfg.retry, Reason: "negative"}
	case cfg.tokenSet && cfg.c10d:
		return cfg, &fairgo.ArgError{
			Arg:    "rendezvous.WithDialToken",
			Value:  "(token)",
			Reason: "the c10d TCPStore protocol has no token",
		}
	case cfg.tokenSet && (cfg.token == "" || len(cfg.token) > MaxTokenLen):
		return cfg, &fairgo.ArgError{
			Arg:    "rendezvous.WithDialToken",
			Value:  fmt.Sprintf("(%d bytes)", len(cfg.token)),
			Reason: fmt.Sprintf("want 1 to %d bytes (leave the option out for a store without a token)", MaxTokenLen),
		}
	}
	if cfg.retry == 0 {
		cfg.retry = DefaultRetryInterval
	}
	if cfg.log == nil {
		cfg.log = logging.Default()
	}
	return cfg, nil
}

// Dial connects to the Server at addr, retrying until it answers or ctx ends
// (workers usually start before the server listens, and a busy server
// refuses connections for a while). When ctx ends first the error wraps
// ctx.Err() and tells the last connection failure. A server that refuses
// the token fails Dial at once with an error wrapping ErrUnauthorized.
func Dial(ctx context.Context, addr string, opts ...DialOption) (*Client, error) {
	cfg, err := newDialConfig(opts, false)
	if err != nil {
		return nil, err
	}
	var c *Client
	err = retryDial(ctx, addr, cfg, func(conn net.Conn) error {
		var herr error
		c, herr = helloClient(ctx, conn, addr, cfg)
		return herr
	})
	return c, err
}

// fatalDialError marks a connection failure that retrying cannot cure.
type fatalDialError struct{ err error }

func (e *fatalDialError) Error() string { return e.err.Error() }
func (e *fatalDialError) Unwrap() error { return e.err }

// retryDial connects to addr and runs open on the connection, retrying both
// with backoff until open succeeds, open returns a *fatalDialError, or ctx
// ends. open owns the connection (it closes it on failure).
func retryDial(ctx context.Context, addr string, cfg dialConfig, open func(net.Conn) error) error {
	var d net.Dialer
	pause := 10 * time.Millisecond
	var last error // the last failure not caused by ctx ending
	giveUp := func(attempt int, err error) error {
		if last == nil {
			last = err
		}
		return fmt.Errorf(
			"rendezvous: dial %s: gave up after %d attempts (last: %v): %w",
			addr,
			attempt,
			last,
			ctx.Err(),
		)
	}
	for attempt := 1; ; attempt++ {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
				tc.SetKeepAlive(true)
			}
			if err = open(conn); err == nil {
				return nil
			}
			var fe *fatalDialError
			if errors.As(err, &fe) {
				return fmt.Errorf("rendezvous: dial %s: %w", addr, fe.err)
			}
		}
		if ctx.Err() != nil {
			return giveUp(attempt, err)
		}
		var ne net.Error
		if last == nil || !errors.As(err, &ne) || !ne.Timeout() {
			last = err // a timeout is most likely ctx's deadline arriving
		}
		cfg.log.Debug("rendezvous: store not reachable yet", "addr", addr, "attempt", attempt, "err", err)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return giveUp(attempt, err)
		case <-t.C:
		}
		pause = min(2*pause, cfg.retry)
	}
}

// helloClient sends the Hello on a fresh connection and reads the reply.
func helloClient(ctx context.Context, conn net.Conn, addr string, cfg dialConfig) (*Client, error) {
	dl := time.Now().Add(handshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	conn.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	br := bufio.NewReader(conn)
	_, err := conn.Write(appendFrame(nil, 0, uint8(opHello), []byte(helloMagic), []byte(cfg.token)))
	var f frame
	if err == nil {
		f, err = readFrame(br)
	}
	if err == nil && f.code == statusError {
		re := &RemoteError{Op: opHello.String(), Code: codeOther, Message: "(no message)"}
		if len(f.fields) == 2 && len(f.fields[0]) == 1 {
			re.Code, re.Message = f.fields[0][0], string(f.fields[1])
		}
		err = re
		if re.Code == codeAuth || re.Code == codeProtocol {
			err = &fatalDialError{re}
		}
	}
	if err == nil && (len(f.fields) != 1 || len(f.fields[0]) != 8) {
		err = &fatalDialError{
			fmt.Errorf("hello reply with %d fields (is %s a fairgo store?): %w", len(f.fields), addr, ErrProtocol),
		}
	}
	if !stop() && err == nil {
		err = ctx.Err() // the deadline was cut short: the connection is suspect
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	idle := time.Duration(binary.BigEndian.Uint64(f.fields[0])) * time.Millisecond
	c := &Client{
		conn:    conn,
		br:      br,
		addr:    addr,
		log:     cfg.log,
		pending: make(map[uint64]chan frame),
		done:    make(chan struct{}),
	}
	go c.readLoop()
	if idle > 0 {
		go c.keepalive(idle / 3)
	}
	return c, nil
}

// keepalive pings when nothing was sent for every, so that the server's idle
// timeout never closes a live connection (a long Get or Wait included).
func (c *Client) keepalive(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		if time.Since(time.Unix(0, c.lastSend.Load())) < every {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		c.Ping(ctx) // a dead connection is reported by the read loop
		cancel()
	}
}

// Addr returns the server address the client dialled.
func (c *Client) Addr() string { return c.addr }

func (c *Client) readLoop() {
	for {
		f, err := readFrame(c.br)
		if err != nil {
			var fe *frameError
			if errors.As(err, &fe) {
				err = fmt.Errorf("malformed reply: %w", err)
			}
			c.fail(err)
			return
		}
		c.mu.Lock()
		ch, ok := c.pending[f.id]
		delete(c.pending, f.id)
		c.mu.Unlock()
		if ok {
			ch <- f // buffered; the caller may have gone
		}
	}
}

// fail ends the connection: pending and later calls get an ErrClosed error.
func (c *Client) fail(cause error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	if cause == nil {
		c.err = ErrClosed
	} else {
		c.err = fmt.Errorf("%w: connection to %s: %v", ErrClosed, c.addr, cause)
	}
	c.conn.Close()
	close(c.done)
}

// Close closes the connection; pending calls fail with ErrClosed.
func (c *Client) Close() error {
	c.fail(nil)
	return nil
}

func (c *Client) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *Client) send(ctx context.Context, b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		c.conn.SetWriteDeadline(dl)
	} else {
		c.conn.SetWriteDeadline(time.Time{})
	}
	_, err := c.conn.Write(b)
	c.lastSend.Store(time.Now().UnixNano())
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
			// A frame may be half written: the stream is unusable.
			c.fail(err)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return context.DeadlineExceeded
		}
		c.fail(err)
		return c.closedErr()
	}
	return nil
}

// call sends one request and waits for its reply.
func (c *Client) call(ctx context.Context, op opCode, fields ...[]byte) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ch := make(chan frame, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = ch
	c.mu.Unlock()

	if err := c.send(ctx, appendFrame(nil, id, uint8(op), fields...)); err != nil {
		c.forget(id)
		return nil, err
	}
	select {
	case f := <-ch:
		if f.code == statusError {
			re := &RemoteError{Op: op.String(), Code: codeOther, Message: "(no message)"}
			if len(f.fields) == 2 && len(f.fields[0]) == 1 {
				re.Code, re.Message = f.fields[0][0], string(f.fields[1])
			}
			return nil, re
		}
		return f.fields, nil
	case <-c.done:
		return nil, c.closedErr()
	case <-ctx.Done():
		if c.forget(id) && (op == opGet || op == opWait) {
			// Release the server-side waiter; best effort.
			go c.send(
				context.Background(),
				appendFrame(nil, 0, uint8(opCancel), binary.BigEndian.AppendUint64(nil, id)),
			)
		}
		return nil, ctx.Err()
	}
}

// forget drops a pending request and reports whether it was still pending.
func (c *Client) forget(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.pending[id]
	delete(c.pending, id)
	return ok
}

func replyErr(op opCode, want int, got [][]byte) error {
	if len(got) != want {
		return fmt.Errorf("rendezvous: %v reply has %d fields, want %d: %w", op, len(got), want, ErrProtocol)
	}
	return nil
}

// Set implements Store.
func (c *Client) Set(ctx context.Context, key string, value []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := checkValue(value); err != nil {
		return err
	}
	_, err := c.call(ctx, opSet, []byte(key), value)
	return err
}

// Get implements Store.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	r, err := c.call(ctx, opGet, []byte(key))
	if err != nil {
		return nil, err
	}
	if err := replyErr(opGet, 1, r); err != nil {
		return nil, err
	}
	return r[0], nil
}

// Add implements Store.
func (c *Client) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	r, err := c.call(ctx, opAdd, []byte(key), binary.BigEndian.AppendUint64(nil, uint64(delta)))
	if err != nil {
		return 0, err
	}
	if err := replyErr(opAdd, 1, r); err != nil {
		return 0, err
	}
	if len(r[0]) != 8 {
		return 0, fmt.Errorf("rendezvous: add reply of %d bytes: %w", len(r[0]), ErrProtocol)
	}
	return int64(binary.BigEndian.Uint64(r[0])), nil
}

// CompareSet implements Store.
func (c *Client) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if err := checkValue(expected); err != nil {
		return nil, err
	}
	if err := checkValue(desired); err != nil {
		return nil, err
	}
	r, err := c.call(ctx, opCompareSet, []byte(key), expected, desired)
	if err != nil {
		return nil, err
	}
	if err := replyErr(opCompareSet, 1, r); err != nil {
		return nil, err
	}
	return r[0], nil
}

// Wait implements Store.
func (c *Client) Wait(ctx context.Context, keys ...string) error {
	if len(keys) > MaxWaitKeys {
		return fmt.Errorf("wait for %d keys (limit %d): %w", len(keys), MaxWaitKeys, ErrTooLarge)
	}
	fields := make([][]byte, len(keys))
	size := 0
	for i, k := range keys {
		if err := checkKey(k); err != nil {
			return err
		}
		fields[i] = []byte(k)
		size += 4 + len(k)
	}
	if size+frameHeader > MaxFrameLen {
		return fmt.Errorf("wait for %d keys of %d bytes: %w", len(keys), size, ErrTooLarge)
	}
	_, err := c.call(ctx, opWait, fields...)
	return err
}

// Delete implements Store.
func (c *Client) Delete(ctx context.Context, key string) (bool, error) {
	if err := checkKey(key); err != nil {
		return false, err
	}
	r, err := c.call(ctx, opDelete, []byte(key))
	if err != nil {
		return false, err
	}
	if err := replyErr(opDelete, 1, r); err != nil {
		return false, err
	}
	return len(r[0]) == 1 && r[0][0] == 1, nil
}

// Ping checks that the server answers.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.call(ctx, opPing)
	return err
}
