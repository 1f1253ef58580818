package rendezvous

// A client of PyTorch's c10d TCPStore protocol, the store torchrun's agent
// serves at MASTER_ADDR:MASTER_PORT when it sets
// TORCHELASTIC_USE_AGENT_STORE=True. The facts below are read from PyTorch's
// torch/csrc/distributed/c10d/TCPStore.cpp, TCPStoreBackend.hpp and
// TCPStoreLibUvBackend.cpp (the libuv server, TCPStore's default):
//
//   - A request is one query-type byte followed by its arguments; a reply
//     has no header. Integers are native little-endian (every supported
//     platform): sizes and counts u64, ADD's delta and results i64. A string
//     or byte vector is its u64 length followed by its bytes.
//   - Query types: VALIDATE 0, SET 1, COMPARE_SET 2, GET 3, ADD 4, CHECK 5,
//     WAIT 6, GETNUMKEYS 7, DELETE_KEY 8, APPEND 9, MULTI_GET 10,
//     MULTI_SET 11, CANCEL_WAIT 12, PING 13 (then QUEUE_PUSH 14, QUEUE_POP
//     15, QUEUE_LEN 16, LIST_KEYS 17, BARRIER 18, unused here).
//   - A connection's first request must be VALIDATE with the u32 magic
//     0x3C85F7CE (no reply); TCPStore then sends PING with a u32 nonce (its
//     pid) and expects the nonce back.
//   - SET key value: no reply. GET key: the value (an empty vector when the
//     key is missing, so TCPStore::get first WAITs for the key). ADD key
//     delta: the new i64 (a value that is not a decimal integer makes the
//     server throw and close the connection). COMPARE_SET key expected
//     desired: the value after the operation (desired when set; expected
//     when the key is missing and expected is not empty). DELETE_KEY key:
//     i64 count deleted. CHECK n keys...: u8 READY 0 / NOT_READY 1. WAIT n
//     keys...: u8 STOP_WAITING 0 once every key exists; one WAIT at a time per
//     connection; CANCEL_WAIT: u8 WAIT_CANCELED 1 (possibly after a
//     STOP_WAITING that crossed it). PING nonce: the nonce.
//   - TCPStore prefixes every user key with "/" (its keyPrefix_), so
//     Python's store.set("k") writes the server key "/k". This client does
//     the same: its keys and Python's are the same keys.
//   - The libuv server refuses keys over 8 KiB and values over 8 MiB by
//     closing the connection; this client checks both first.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"
)

// c10d query types and replies (TCPStoreBackend.hpp).
const (
	c10dValidate   byte = 0
	c10dSet        byte = 1
	c10dCompareSet byte = 2
	c10dGet        byte = 3
	c10dAdd        byte = 4
	c10dCheck      byte = 5
	c10dWait       byte = 6
	c10dGetNumKeys byte = 7
	c10dDeleteKey  byte = 8
	c10dCancelWait byte = 12
	c10dPing       byte = 13

	c10dStopWaiting byte = 0 // WaitResponseType::STOP_WAITING
	c10dReady       byte = 0 // CheckResponseType::READY

	c10dMagic uint32 = 0x3C85F7CE // validationMagicNumber
)

// Limits of PyTorch's libuv TCPStore server (MAX_STRING_LEN,
// MAX_PAYLOAD_LEN); the C10dClient refuses larger keys and values with
// ErrTooLarge rather than have the server drop the connection.
const (
	C10dMaxKeyLen   = 8 << 10
	C10dMaxValueLen = 8 << 20
)

// c10dKeyPrefix is what PyTorch's TCPStore puts before every user key.
const c10dKeyPrefix = "/"

// maxIdleWaitConns bounds the idle connections kept for blocking calls.
const maxIdleWaitConns = 4

// C10dClient is a Store served by PyTorch's c10d TCPStore (torchrun's agent
// store, or one a Python rank 0 hosts). Non-blocking calls share one
// connection, one call at a time as the protocol requires; each blocking Get
// or Wait takes a connection of its own (kept for reuse), since the server
// answers a WAIT only when its keys exist. A call whose ctx ends
// mid-exchange closes its connection (the server drops the connection's
// wait with it), so no reply can be mistaken for another's; the next call
// dials again. Keys are prefixed with "/" as PyTorch's TCPStore does, so
// Python code on the same store sees the same keys.
//
// Add on a value that is not a decimal integer makes the server close the
// connection; the client then reads the value on a new connection and
// reports ErrNotCounter. Values are limited to C10dMaxValueLen.
type C10dClient struct {
	addr  string
	log   *slog.Logger
	nonce func() uint32

	main chan *c10dConn // holds the shared connection (nil: not dialled); receiving it is the lock

	mu     sync.Mutex
	idle   []*c10dConn
	live   map[*c10dConn]struct{}
	closed bool
}

type c10dConn struct {
	conn net.Conn
	br   *bufio.Reader
}

// DialC10d connects to the c10d TCPStore at addr, retrying until it answers
// or ctx ends (a store that is not up yet, or whose backlog is full). It
// validates the connection as TCPStore does (VALIDATE, then PING with a
// nonce that must come back). WithDialToken does not apply.
func DialC10d(ctx context.Context, addr string, opts ...DialOption) (*C10dClient, error) {
	cfg, err := newDialConfig(opts, true)
	if err != nil {
		return nil, err
	}
	return dialC10d(ctx, addr, cfg, rand.Uint32)
}

// dialC10d is DialC10d with the nonce source given (tests).
func dialC10d(ctx context.Context, addr string, cfg dialConfig, nonce func() uint32) (*C10dClient, error) {
	c := newC10dClient(addr, cfg.log)
	c.nonce = nonce
	err := retryDial(ctx, addr, cfg, func(conn net.Conn) error {
		cc, err := c.validate(ctx, conn)
		if err != nil {
			return err
		}
		c.main <- cc
		return nil
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

func newC10dClient(addr string, log *slog.Logger) *C10dClient {
	return &C10dClient{
		addr:  addr,
		log:   log,
		nonce: rand.Uint32,
		main:  make(chan *c10dConn, 1),
		live:  make(map[*c10dConn]struct{}),
	}
}

// Addr returns the store's address.
func (c *C10dClient) Addr() string { return c.addr }

// validate opens the protocol on a fresh connection: VALIDATE and PING.
func (c *C10dClient) validate(ctx context.Context, conn net.Conn) (*c10dConn, error) {
	cc := &c10dConn{conn: conn, br: bufio.NewReader(conn)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		conn.Close()
		return nil, ErrClosed
	}
	c.live[cc] = struct{}{}
	c.mu.Unlock()
	nonce := c.nonce()
	req := binary.LittleEndian.AppendUint32([]byte{c10dValidate}, c10dMagic)
	req = binary.LittleEndian.AppendUint32(append(req, c10dPing), nonce)
	dctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	var got uint32
	err := c.exchange(dctx, cc, req, func(r *bufio.Reader) (err error) {
		got, err = readU32(r)
		return err
	})
	if err == nil && got != nonce {
		c.discard(cc)
		return nil, &fatalDialError{
			fmt.Errorf("ping answered %#x, want %#x (is %s a c10d TCPStore?): %w", got, nonce, c.addr, ErrProtocol),
		}
	}
	if err != nil {
		return nil, err
	}
	return cc, nil
}

// connect dials one new validated connection (one attempt).
func (c *C10dClient) connect(ctx context.Context) (*c10dConn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, c.fail(ctx, "connect", err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetKeepAlive(true)
	}
	cc, err := c.validate(ctx, conn)
	if err != nil {
		var fe *fatalDialError
		if errors.As(err, &fe) {
			err = fe.err
		}
		return nil, c.fail(ctx, "connect", err)
	}
	return cc, nil
}

// fail turns a connection failure into the error a call returns: ctx.Err()
// unchanged when ctx ended, ErrClosed after Close, else an error wrapping
// ErrClosed that names the operation and the address.
func (c *C10dClient) fail(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ne net.Error
	if dl, ok := ctx.Deadline(); ok && errors.As(err, &ne) && ne.Timeout() && !time.Now().Before(dl) {
		return context.DeadlineExceeded // the connection's deadline, ctx's, fired first
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if errors.Is(err, ErrProtocol) || errors.Is(err, ErrClosed) {
		return fmt.Errorf("rendezvous: c10d %s on %s: %w", op, c.addr, err)
	}
	return fmt.Errorf("rendezvous: c10d %s on %s: %v: %w", op, c.addr, err, ErrClosed)
}

// exchange writes req and runs read on the reply, bounded by ctx. On any
// error the connection is discarded (its state is unknown); so is it when
// ctx ended during the exchange. The error is the raw one; callers map it
// with fail.
func (c *C10dClient) exchange(ctx context.Context, cc *c10dConn, req []byte, read func(*bufio.Reader) error) error {
	dl, _ := ctx.Deadline()
	cc.conn.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { cc.conn.SetDeadline(time.Unix(1, 0)) })
	_, err := cc.conn.Write(req)
	if err == nil && read != nil {
		err = read(cc.br)
	}
	if !stop() || err != nil {
		c.discard(cc)
	}
	return err
}

// discard closes a connection and forgets it.
func (c *C10dClient) discard(cc *c10dConn) {
	cc.conn.Close()
	c.mu.Lock()
	delete(c.live, cc)
	c.mu.Unlock()
}

func (c *C10dClient) isLive(cc *c10dConn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.live[cc]
	return ok
}

// onMain runs one exchange on the shared connection, dialling it first when
// needed.
func (c *C10dClient) onMain(ctx context.Context, op string, req []byte, read func(*bufio.Reader) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var cc *c10dConn
	select {
	case cc = <-c.main:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() {
		if cc != nil && !c.isLive(cc) {
			cc = nil
		}
		c.main <- cc
	}()
	if cc == nil || !c.isLive(cc) {
		if err := c.closedErr(); err != nil {
			return err
		}
		var err error
		if cc, err = c.connect(ctx); err != nil {
			return err
		}
	}
	if err := c.exchange(ctx, cc, req, read); err != nil {
		return c.fail(ctx, op, err)
	}
	return nil
}

// onOwn runs exchanges on a connection of their own (blocking calls).
func (c *C10dClient) onOwn(ctx context.Context, op string, run func(cc *c10dConn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.closedErr(); err != nil {
		return err
	}
	c.mu.Lock()
	var cc *c10dConn
	if n := len(c.idle); n > 0 {
		cc, c.idle = c.idle[n-1], c.idle[:n-1]
	}
	c.mu.Unlock()
	if cc == nil {
		var err error
		if cc, err = c.connect(ctx); err != nil {
			return err
		}
	}
	if err := run(cc); err != nil {
		return c.fail(ctx, op, err)
	}
	c.mu.Lock()
	_, ok := c.live[cc]
	if ok && !c.closed && len(c.idle) < maxIdleWaitConns {
		c.idle = append(c.idle, cc)
		cc = nil
	}
	c.mu.Unlock()
	if cc != nil {
		c.discard(cc)
	}
	return nil
}

func (c *C10dClient) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	return nil
}

// Close closes every connection; calls in flight, and later calls, fail
// with ErrClosed.
func (c *C10dClient) Close() error {
	c.mu.Lock()
	c.closed = true
	live := c.live
	c.live = make(map[*c10dConn]struct{})
	c.idle = nil
	c.mu.Unlock()
	for cc := range live {
		cc.conn.Close()
	}
	return nil
}

func c10dCheckKey(key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if len(c10dKeyPrefix)+len(key) > C10dMaxKeyLen {
		return fmt.Errorf(
			"key of %d bytes (c10d limit %d): %w",
			len(key),
			C10dMaxKeyLen-len(c10dKeyPrefix),
			ErrTooLarge,
		)
	}
	return nil
}

func c10dCheckValue(v []byte) error {
	if len(v) > C10dMaxValueLen {
		return fmt.Errorf("value of %d bytes (c10d limit %d): %w", len(v), C10dMaxValueLen, ErrTooLarge)
	}
	return nil
}

// appendC10dBytes appends a string or byte vector: u64 length, bytes.
func appendC10dBytes(dst []byte, b []byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(b)))
	return append(dst, b...)
}

// appendC10dKey appends a user key with TCPStore's prefix.
func appendC10dKey(dst []byte, key string) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(c10dKeyPrefix)+len(key)))
	return append(append(dst, c10dKeyPrefix...), key...)
}

// c10dWaitRequest encodes WAIT (or CHECK) for keys.
func c10dWaitRequest(query byte, keys ...string) []byte {
	req := binary.LittleEndian.AppendUint64([]byte{query}, uint64(len(keys)))
	for _, k := range keys {
		req = appendC10dKey(req, k)
	}
	return req
}

func readU8(r *bufio.Reader) (byte, error) {
	b, err := r.ReadByte()
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return b, err
}

func readU32(r *bufio.Reader) (uint32, error) {
	var b [4]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

func readI64(r *bufio.Reader) (int64, error) {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	return int64(binary.LittleEndian.Uint64(b[:])), nil
}

// readC10dBytes reads a byte vector of at most limit bytes, allocating as
// its bytes arrive.
func readC10dBytes(r *bufio.Reader, limit int) ([]byte, error) {
	n, err := readI64(r)
	if err != nil {
		return nil, err
	}
	if uint64(n) > uint64(limit) {
		return nil, fmt.Errorf("reply announces %d bytes (limit %d): %w", uint64(n), limit, ErrProtocol)
	}
	if n == 0 {
		return []byte{}, nil
	}
	return readBody(r, int(n), nil)
}

// expect reads one reply byte and checks it.
func expect(r *bufio.Reader, want byte, what string) error {
	b, err := readU8(r)
	if err == nil && b != want {
		err = fmt.Errorf("%s: reply %d, want %d: %w", what, b, want, ErrProtocol)
	}
	return err
}

// Set implements Store. The SET is followed by a PING on the same
// connection, so that Set returns once the server applied it (SET itself
// has no reply).
func (c *C10dClient) Set(ctx context.Context, key string, value []byte) error {
	if err := c10dCheckKey(key); err != nil {
		return err
	}
	if err := c10dCheckValue(value); err != nil {
		return err
	}
	nonce := c.nonce()
	req := appendC10dBytes(appendC10dKey([]byte{c10dSet}, key), value)
	req = binary.LittleEndian.AppendUint32(append(req, c10dPing), nonce)
	return c.onMain(ctx, "set", req, func(r *bufio.Reader) error {
		got, err := readU32(r)
		if err == nil && got != nonce {
			err = fmt.Errorf("ping after set answered %#x, want %#x: %w", got, nonce, ErrProtocol)
		}
		return err
	})
}

// Get implements Store: WAIT for the key, then GET it, on a connection of
// its own (as TCPStore::get does).
func (c *C10dClient) Get(ctx context.Context, key string) ([]byte, error) {
	if err := c10dCheckKey(key); err != nil {
		return nil, err
	}
	var v []byte
	err := c.onOwn(ctx, "get", func(cc *c10dConn) error {
		if err := c.exchange(ctx, cc, c10dWaitRequest(c10dWait, key), func(r *bufio.Reader) error {
			return expect(r, c10dStopWaiting, "wait")
		}); err != nil {
			return err
		}
		return c.exchange(ctx, cc, appendC10dKey([]byte{c10dGet}, key), func(r *bufio.Reader) (err error) {
			v, err = readC10dBytes(r, C10dMaxValueLen)
			return err
		})
	})
	if err != nil {
		return nil, err
	}
	return v, nil
}

// Wait implements Store.
func (c *C10dClient) Wait(ctx context.Context, keys ...string) error {
	if len(keys) > MaxWaitKeys {
		return fmt.Errorf("wait for %d keys (limit %d): %w", len(keys), MaxWaitKeys, ErrTooLarge)
	}
	for _, k := range keys {
		if err := c10dCheckKey(k); err != nil {
			return err
		}
	}
	if len(keys) == 0 {
		return nil
	}
	return c.onOwn(ctx, "wait", func(cc *c10dConn) error {
		return c.exchange(ctx, cc, c10dWaitRequest(c10dWait, keys...), func(r *bufio.Reader) error {
			return expect(r, c10dStopWaiting, "wait")
		})
	})
}

// Add implements Store.
func (c *C10dClient) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if err := c10dCheckKey(key); err != nil {
		return 0, err
	}
	req := binary.LittleEndian.AppendUint64(appendC10dKey([]byte{c10dAdd}, key), uint64(delta))
	var n int64
	err := c.onMain(ctx, "add", req, func(r *bufio.Reader) (err error) {
		n, err = readI64(r)
		return err
	})
	if err != nil && ctx.Err() == nil && c.closedErr() == nil && !errors.Is(err, ErrProtocol) {
		// The server closes the connection when the value is not a decimal
		// integer: look at the value to tell that from a lost connection.
		if v, ok := c.peek(ctx, key); ok {
			if _, perr := strconv.ParseInt(string(v), 10, 64); perr != nil {
				return 0, fmt.Errorf(
					"add to key %q holding %q (the server closed the connection): %w",
					key,
					truncate(v),
					ErrNotCounter,
				)
			}
		}
	}
	return n, err
}

// peek reads key if it exists (CHECK, then GET), on the shared connection.
func (c *C10dClient) peek(ctx context.Context, key string) ([]byte, bool) {
	var ready byte
	if err := c.onMain(ctx, "check", c10dWaitRequest(c10dCheck, key), func(r *bufio.Reader) (err error) {
		ready, err = readU8(r)
		return err
	}); err != nil || ready != c10dReady {
		return nil, false
	}
	var v []byte
	if err := c.onMain(ctx, "get", appendC10dKey([]byte{c10dGet}, key), func(r *bufio.Reader) (err error) {
		v, err = readC10dBytes(r, C10dMaxValueLen)
		return err
	}); err != nil {
		return nil, false
	}
	return v, true
}

// CompareSet implements Store.
func (c *C10dClient) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	if err := c10dCheckKey(key); err != nil {
		return nil, err
	}
	if err := c10dCheckValue(expected); err != nil {
		return nil, err
	}
	if err := c10dCheckValue(desired); err != nil {
		return nil, err
	}
	req := appendC10dBytes(appendC10dBytes(appendC10dKey([]byte{c10dCompareSet}, key), expected), desired)
	var v []byte
	err := c.onMain(ctx, "compare-set", req, func(r *bufio.Reader) (err error) {
		v, err = readC10dBytes(r, C10dMaxValueLen)
		return err
	})
	return v, err
}

// Delete implements Store.
func (c *C10dClient) Delete(ctx context.Context, key string) (bool, error) {
	if err := c10dCheckKey(key); err != nil {
		return false, err
	}
	var n int64
	err := c.onMain(ctx, "delete", appendC10dKey([]byte{c10dDeleteKey}, key), func(r *bufio.Reader) (err error) {
		n, err = readI64(r)
		return err
	})
	return n == 1, err
}

// NumKeys returns the number of keys in the whole store (GETNUMKEYS),
// PyTorch's own keys included.
func (c *C10dClient) NumKeys(ctx context.Context) (int64, error) {
	var n int64
	err := c.onMain(ctx, "getnumkeys", []byte{c10dGetNumKeys}, func(r *bufio.Reader) (err error) {
		n, err = readI64(r)
		return err
	})
	return n, err
}
