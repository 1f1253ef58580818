package rendezvous

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
)

// One client multiplexes: a Get blocked on the server does not hold up
// other requests on the same connection.
func TestTCPMultiplexing(t *testing.T) {
	_, c := startTCP(t)
	ctx := testCtx(t)
	got := make(chan string, 1)
	go func() {
		v, err := c.Get(ctx, "later")
		if err != nil {
			v = []byte(err.Error())
		}
		got <- string(v)
	}()
	start := time.Now()
	for i := range 100 {
		require.NoError(t, c.Set(ctx, fmt.Sprint("k", i), []byte("v")))
		_, err := c.Get(ctx, fmt.Sprint("k", i))
		require.NoError(t, err)
	}
	require.Less(t, time.Since(start), 5*time.Second)
	require.NoError(t, c.Set(ctx, "later", []byte("x")))
	require.Equal(t, "x", <-got)
}

// Many clients, each with many goroutines, run a barrier through the store.
func TestTCPManyClients(t *testing.T) {
	srv, _ := startTCP(t)
	ctx := testCtx(t)
	const clients, perClient = 12, 8
	var g errgroup.Group
	for ci := range clients {
		c := dial(t, srv.Addr())
		for gi := range perClient {
			g.Go(func() error {
				me := ci*perClient + gi
				if err := c.Set(ctx, fmt.Sprint("member/", me), []byte(fmt.Sprint(me))); err != nil {
					return err
				}
				n, err := c.Add(ctx, "arrived", 1)
				if err != nil {
					return err
				}
				if n == clients*perClient {
					if err := c.Set(ctx, "all", nil); err != nil {
						return err
					}
				}
				if err := c.Wait(ctx, "all"); err != nil {
					return err
				}
				peer := (me + 1) % (clients * perClient)
				v, err := c.Get(ctx, fmt.Sprint("member/", peer))
				if err != nil {
					return err
				}
				if string(v) != fmt.Sprint(peer) {
					return fmt.Errorf("member %d: got %q", peer, v)
				}
				return nil
			})
		}
	}
	require.NoError(t, g.Wait())
}

// waitFor polls cond until it holds or a few seconds pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A cancelled Get releases its waiter on the server.
func TestTCPCancelReleasesServerWaiter(t *testing.T) {
	srv, c := startTCP(t)
	ctx := testCtx(t)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := c.Get(short, "never")
	require.Equal(t, context.DeadlineExceeded, err)
	require.Equal(t, context.DeadlineExceeded, c.Wait(short, "never", "nor-this"))
	waitFor(t, "no pending request", func() bool { p, _ := srv.pendingRequests(); return p == 0 })
	// The connection is still good.
	require.NoError(t, c.Set(ctx, "never", []byte("now")))
	v, err := c.Get(ctx, "never")
	require.NoError(t, err)
	require.Equal(t, "now", string(v))
}

// rawConn is a client speaking frames by hand.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

// rawDial connects and completes the Hello (with token, if any).
func rawDial(t *testing.T, addr string, token ...string) *rawConn {
	r := rawConnect(t, addr)
	tok := ""
	if len(token) > 0 {
		tok = token[0]
	}
	r.send(appendFrame(nil, 0, uint8(opHello), []byte(helloMagic), []byte(tok)))
	f, err := r.next()
	require.NoError(t, err)
	require.EqualValues(t, statusOK, f.code, "hello refused: %q", f.fields)
	return r
}

// rawConnect connects without a Hello.
func rawConnect(t *testing.T, addr string) *rawConn {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (r *rawConn) send(b []byte) {
	_, err := r.c.Write(b)
	require.NoError(r.t, err)
}

// next reads one reply; it fails the test on a timeout.
func (r *rawConn) next() (frame, error) {
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	return readFrame(r.br)
}

// Clients that vanish mid-request, with requests pending or with half a
// frame sent, do not disturb the server.
func TestTCPDisconnectMidRequest(t *testing.T) {
	srv, c := startTCP(t)
	ctx := testCtx(t)

	for i := range 5 {
		r := rawDial(t, srv.Addr())
		r.send(appendFrame(nil, 1, uint8(opGet), []byte("missing")))
		r.send(appendFrame(nil, 2, uint8(opWait), []byte("a"), []byte("b")))
		full := appendFrame(nil, 3, uint8(opSet), []byte("half"), []byte("value"))
		r.send(full[:len(full)-3-i%3])
		waitFor(t, "pending requests", func() bool { p, _ := srv.pendingRequests(); return p >= 2 })
		r.c.Close()
		waitFor(
			t,
			"the server to drop the connection",
			func() bool { p, n := srv.pendingRequests(); return p == 0 && n == 1 },
		)
	}
	// A library client dropped while blocked.
	c2 := dial(t, srv.Addr())
	errc := make(chan error, 1)
	go func() { _, err := c2.Get(ctx, "missing"); errc <- err }()
	waitFor(t, "pending request", func() bool { p, _ := srv.pendingRequests(); return p == 1 })
	require.NoError(t, c2.Close())
	require.ErrorIs(t, <-errc, ErrClosed)
	_, err := c2.Get(ctx, "x")
	require.ErrorIs(t, err, ErrClosed)
	waitFor(
		t,
		"the server to drop the connection",
		func() bool { p, n := srv.pendingRequests(); return p == 0 && n == 1 },
	)

	// The half-written Set never happened; the server still serves.
	ok, err := c.Delete(ctx, "half")
	require.NoError(t, err)
	require.False(t, ok)
	require.NoError(t, c.Set(ctx, "missing", []byte("ok")))
	require.NoError(t, c.Ping(ctx))
}

func TestTCPMalformedFrames(t *testing.T) {
	srv, c := startTCP(t)
	ctx := testCtx(t)
	u32 := func(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
	withLen := func(body []byte) []byte { return append(u32(uint32(len(body))), body...) }
	hdr := func(id uint64, op uint8) []byte { return append(binary.BigEndian.AppendUint64(nil, id), op) }

	for _, tc := range []struct {
		name   string
		frame  []byte
		id     uint64
		code   byte // the error reply's code; 0: no reply expected
		closes bool // the server closes the connection
	}{
		{"unknown op", appendFrame(nil, 7, 99, []byte("k")), 7, codeProtocol, false},
		{"op zero", appendFrame(nil, 8, 0), 8, codeProtocol, false},
		{"set without value", appendFrame(nil, 9, uint8(opSet), []byte("k")), 9, codeProtocol, false},
		{"get with two keys", appendFrame(nil, 10, uint8(opGet), []byte("k"), []byte("l")), 10, codeProtocol, false},
		{"add with short delta", appendFrame(nil, 11, uint8(opAdd), []byte("k"), []byte{1, 2, 3}), 11, codeProtocol, false},
		{"field overruns frame", withLen(append(hdr(12, uint8(opGet)), append(u32(100), 'k')...)), 12, codeProtocol, false},
		{"field length cut short", withLen(append(hdr(13, uint8(opGet)), 0, 0)), 13, codeProtocol, false},
		{"key too large", appendFrame(nil, 14, uint8(opSet), make([]byte, MaxKeyLen+1), nil), 14, codeTooLarge, false},
		{"frame shorter than header", withLen([]byte{1, 2, 3}), 0, codeProtocol, true},
		{"frame over the limit", u32(MaxFrameLen + 1), 0, codeTooLarge, true},
		{"length word max", u32(0xffffffff), 0, codeTooLarge, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rawDial(t, srv.Addr())
			r.send(tc.frame)
			f, err := r.next()
			require.NoError(t, err)
			require.Equal(t, tc.id, f.id)
			require.EqualValues(t, statusError, f.code)
			require.Len(t, f.fields, 2)
			require.Equal(t, tc.code, f.fields[0][0], "message %q", f.fields[1])
			if tc.closes {
				_, err := r.next()
				require.Error(t, err, "connection must be closed")
				return
			}
			// Still usable.
			r.send(appendFrame(nil, 100, uint8(opPing)))
			f, err = r.next()
			require.NoError(t, err)
			require.EqualValues(t, 100, f.id)
			require.EqualValues(t, statusOK, f.code)
		})
	}

	t.Run("truncated frame", func(t *testing.T) {
		r := rawDial(t, srv.Addr())
		full := appendFrame(nil, 1, uint8(opSet), []byte("trunc"), []byte("value"))
		r.send(full[:10])
		r.c.(*net.TCPConn).CloseWrite()
		_, err := r.next()
		require.Error(t, err, "server closes the connection")
	})

	t.Run("random garbage", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		for range 50 {
			r := rawDial(t, srv.Addr())
			junk := make([]byte, rng.IntN(64))
			for i := range junk {
				junk[i] = byte(rng.Uint32())
			}
			if len(junk) >= 4 && rng.IntN(2) == 0 {
				binary.BigEndian.PutUint32(junk, uint32(len(junk)-4)) // plausible length
			}
			r.send(junk)
			r.c.Close()
		}
	})

	// Nothing above disturbed the server.
	require.NoError(t, c.Set(ctx, "after", []byte("fine")))
	v, err := c.Get(ctx, "after")
	require.NoError(t, err)
	require.Equal(t, "fine", string(v))
	ok, err := c.Delete(ctx, "trunc")
	require.NoError(t, err)
	require.False(t, ok)
}

// Errors from the server unwrap to the sentinels.
func TestTCPRemoteErrors(t *testing.T) {
	_, c := startTCP(t)
	ctx := testCtx(t)
	require.NoError(t, c.Set(ctx, "text", []byte("abc")))
	_, err := c.Add(ctx, "text", 1)
	require.ErrorIs(t, err, ErrNotCounter)
	var re *RemoteError
	require.ErrorAs(t, err, &re)
	require.Equal(t, "add", re.Op)
}

func TestTCPServerClose(t *testing.T) {
	srv, err := Listen("127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background()) }()
	c := dial(t, srv.Addr())
	ctx := testCtx(t)
	errc := make(chan error, 1)
	go func() { _, err := c.Get(ctx, "never"); errc <- err }()
	waitFor(t, "pending request", func() bool { p, _ := srv.pendingRequests(); return p == 1 })
	require.NoError(t, srv.Close())
	require.NoError(t, <-served)
	require.ErrorIs(t, <-errc, ErrClosed)
	require.ErrorIs(t, c.Set(ctx, "k", nil), ErrClosed)
	require.ErrorIs(t, srv.Store().Set(ctx, "k", nil), ErrClosed)
}

// Dial retries until the server listens, and gives up at the deadline.
func TestDialRetry(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	ctx := testCtx(t)
	type result struct {
		c   *Client
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := Dial(ctx, addr, WithRetryInterval(20*time.Millisecond))
		done <- result{c, err}
	}()
	time.Sleep(150 * time.Millisecond)
	srv, err := Listen(addr)
	require.NoError(t, err)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go srv.Serve(sctx)
	r := <-done
	require.NoError(t, r.err)
	defer r.c.Close()
	require.NoError(t, r.c.Ping(ctx))

	short, cancel2 := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel2()
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln2.Addr().String()
	ln2.Close()
	_, err = Dial(short, dead)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), dead)
}
