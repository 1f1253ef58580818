package rendezvous

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
)

var quiet = slog.New(slog.DiscardHandler)

// serve starts a server with opts on loopback for the test's lifetime.
func serve(t *testing.T, opts ...ServerOption) *Server {
	t.Helper()
	srv, err := Listen("127.0.0.1:0", append([]ServerOption{WithServerLogger(quiet)}, opts...)...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.ErrorIs(t, <-served, context.Canceled)
	})
	return srv
}

// closedWithin reports whether the server closes r's connection within d
// (reading and dropping whatever it sends first).
func (r *rawConn) closedWithin(d time.Duration) bool {
	r.c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, r.br)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// expectRefusal reads the server's error reply and checks its code.
func (r *rawConn) expectRefusal(code byte) string {
	r.t.Helper()
	f, err := r.next()
	require.NoError(r.t, err)
	require.EqualValues(r.t, statusError, f.code)
	require.Len(r.t, f.fields, 2)
	require.Equal(r.t, code, f.fields[0][0], "message %q", f.fields[1])
	require.True(r.t, r.closedWithin(2*time.Second), "connection must be closed after a refusal")
	return string(f.fields[1])
}

func TestServerOptionsValidated(t *testing.T) {
	for _, tc := range []struct {
		opt  ServerOption
		name string
	}{
		{WithToken(""), "WithToken"},
		{WithToken(strings.Repeat("x", MaxTokenLen+1)), "WithToken"},
		{WithMaxConns(-1), "WithMaxConns"},
		{WithMaxHandshakes(-1), "WithMaxHandshakes"},
		{WithMaxHandshakes(DefaultMaxConns + 1), "WithMaxHandshakes"},
		{WithHandshakeTimeout(-time.Second), "WithHandshakeTimeout"},
		{WithIdleTimeout(-time.Second), "WithIdleTimeout"},
		{WithIdleTimeout(time.Millisecond), "WithIdleTimeout"},
		{WithFrameTimeout(-1), "WithFrameTimeout"},
		{WithWriteTimeout(-1), "WithWriteTimeout"},
		{WithMaxFrameBytes(100), "WithMaxFrameBytes"},
		{WithMaxFrameBytes(MaxFrameLen + 1), "WithMaxFrameBytes"},
		{WithMaxBufferedBytes(-1), "WithMaxBufferedBytes"},
		{WithMaxBufferedBytes(MaxFrameLen), "WithMaxBufferedBytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			addr := ln.Addr().String()
			ln.Close()
			_, err = Listen(addr, tc.opt)
			require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
			var ae *fairgo.ArgError
			require.ErrorAs(t, err, &ae)
			require.Equal(t, "rendezvous."+tc.name, ae.Arg)
			// Nothing was bound.
			ln, err = net.Listen("tcp", addr)
			require.NoError(t, err, "Listen bound %s despite an invalid option", addr)
			ln.Close()
		})
	}
	for _, opt := range []DialOption{WithRetryInterval(-1), WithDialToken(""),
		WithDialToken(strings.Repeat("x", MaxTokenLen+1))} {
		_, err := Dial(context.Background(), "127.0.0.1:1", opt)
		require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	}
	// Defaults are valid, and a smaller frame cap lowers the default budget's floor.
	_, err := newServerConfig(nil)
	require.NoError(t, err)
	c, err := newServerConfig([]ServerOption{WithMaxFrameBytes(1 << 20), WithMaxBufferedBytes(2 << 20)})
	require.NoError(t, err)
	require.EqualValues(t, 2<<20, c.maxBufferedBytes)
}

func TestServerToken(t *testing.T) {
	srv := serve(t, WithToken("s3cret"))
	ctx := testCtx(t)

	c, err := Dial(ctx, srv.Addr(), WithDialToken("s3cret"))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Set(ctx, "k", []byte("v")))

	for name, opts := range map[string][]DialOption{
		"no token":    nil,
		"wrong token": {WithDialToken("s3cre7")},
		"longer":      {WithDialToken("s3cret!")},
	} {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			_, err := Dial(ctx, srv.Addr(), opts...)
			require.ErrorIs(t, err, ErrUnauthorized)
			require.Less(t, time.Since(start), 2*time.Second, "a refused token must not be retried")
			require.Contains(t, err.Error(), srv.Addr())
		})
	}
	// A request before the Hello is refused and nothing is served.
	r := rawConnect(t, srv.Addr())
	r.send(appendFrame(nil, 5, uint8(opSet), []byte("k"), []byte("evil")))
	r.expectRefusal(codeProtocol)
	// A Hello of another protocol version.
	r = rawConnect(t, srv.Addr())
	r.send(appendFrame(nil, 5, uint8(opHello), []byte("fairgo-store/0"), []byte("s3cret")))
	r.expectRefusal(codeProtocol)
	v, err := c.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "v", string(v))

	// A server without a token serves clients that send one.
	open := serve(t)
	c2, err := Dial(ctx, open.Addr(), WithDialToken("whatever"))
	require.NoError(t, err)
	defer c2.Close()
	require.NoError(t, c2.Ping(ctx))
}

func TestServerHandshakeTimeout(t *testing.T) {
	srv := serve(t, WithHandshakeTimeout(100*time.Millisecond))
	idle := rawConnect(t, srv.Addr())
	half := rawConnect(t, srv.Addr())
	hello := appendFrame(nil, 0, uint8(opHello), []byte(helloMagic), nil)
	half.send(hello[:len(hello)-3])
	drip := rawConnect(t, srv.Addr())
	start := time.Now()
	go func() { // one byte of the Hello every 30ms: never complete in time
		for _, b := range hello {
			if _, err := drip.c.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(30 * time.Millisecond)
		}
	}()
	for _, r := range []*rawConn{idle, half, drip} {
		require.True(t, r.closedWithin(3*time.Second))
	}
	require.Less(t, time.Since(start), 2*time.Second)
	waitFor(t, "no connection", func() bool { return srv.stats().conns == 0 })
}

func TestServerIdleTimeout(t *testing.T) {
	srv := serve(t, WithIdleTimeout(150*time.Millisecond))
	ctx := testCtx(t)

	// A raw client that sends nothing after its Hello is closed.
	r := rawDial(t, srv.Addr())
	start := time.Now()
	require.True(t, r.closedWithin(3*time.Second))
	require.Less(t, time.Since(start), 2*time.Second)

	// The library client pings: a Get blocked for several idle timeouts is
	// answered, and the connection survives a pause with nothing to do.
	c := dial(t, srv.Addr())
	got := make(chan error, 1)
	go func() { _, err := c.Get(ctx, "late"); got <- err }()
	time.Sleep(600 * time.Millisecond)
	require.NoError(t, c.Set(ctx, "late", []byte("x")))
	require.NoError(t, <-got)
	time.Sleep(600 * time.Millisecond)
	require.NoError(t, c.Ping(ctx))
}

func TestServerFrameTimeout(t *testing.T) {
	srv := serve(t, WithFrameTimeout(200*time.Millisecond), WithIdleTimeout(10*time.Second))
	full := appendFrame(nil, 1, uint8(opSet), []byte("k"), make([]byte, 1000))

	// Half a frame, then nothing.
	r := rawDial(t, srv.Addr())
	r.send(full[:100])
	start := time.Now()
	require.True(t, r.closedWithin(3*time.Second))
	require.Less(t, time.Since(start), 2*time.Second)

	// A byte every 20ms keeps each read short, but the frame as a whole
	// must end within the frame timeout.
	r = rawDial(t, srv.Addr())
	start = time.Now()
	conn := r.c
	go func() {
		for _, b := range full {
			if _, err := conn.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	require.True(t, r.closedWithin(5*time.Second))
	require.Less(t, time.Since(start), 2*time.Second)

	// A whole frame in time is served.
	r = rawDial(t, srv.Addr())
	r.send(full)
	r.send(appendFrame(nil, 2, uint8(opPing)))
	for _, id := range []uint64{1, 2} {
		f, err := r.next()
		require.NoError(t, err)
		require.Equal(t, id, f.id)
		require.EqualValues(t, statusOK, f.code)
	}
}

func TestServerConnectionCaps(t *testing.T) {
	srv := serve(t, WithMaxConns(3), WithMaxHandshakes(2), WithHandshakeTimeout(300*time.Millisecond))
	ctx := testCtx(t)

	// Two connections in handshake fill their places: a third is refused
	// at once, but an authenticated client is not disturbed.
	c1 := dial(t, srv.Addr())
	h1, h2 := rawConnect(t, srv.Addr()), rawConnect(t, srv.Addr())
	waitFor(t, "two handshakes", func() bool { return srv.stats().handshaking == 2 })
	msg := rawConnect(t, srv.Addr()).expectRefusal(codeBusy)
	require.Contains(t, msg, "in handshake (cap 2)")
	require.NoError(t, c1.Ping(ctx))
	// Dial retries while busy, and gets in once the stalled handshakes time out.
	start := time.Now()
	c2, err := Dial(ctx, srv.Addr(), WithRetryInterval(20*time.Millisecond))
	require.NoError(t, err)
	defer c2.Close()
	require.Greater(t, time.Since(start), 100*time.Millisecond)
	require.True(t, h1.closedWithin(time.Second))
	require.True(t, h2.closedWithin(time.Second))

	// Three connections in all: a fourth is refused; Dial gives up at its
	// deadline and says why.
	c3 := dial(t, srv.Addr())
	msg = rawConnect(t, srv.Addr()).expectRefusal(codeBusy)
	require.Contains(t, msg, "3 connections open (cap 3)")
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = Dial(short, srv.Addr())
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "busy")
	require.NoError(t, c3.Close())
	waitFor(t, "a free place", func() bool { return srv.stats().conns == 2 })
	c4 := dial(t, srv.Addr())
	require.NoError(t, c4.Ping(ctx))
}

func TestServerBufferBudget(t *testing.T) {
	const frameCap, budget = 64 << 10, 128 << 10
	srv := serve(t, WithMaxFrameBytes(frameCap), WithMaxBufferedBytes(budget), WithFrameTimeout(2*time.Second))
	ctx := testCtx(t)
	c := dial(t, srv.Addr())

	// A length word alone allocates nothing near what it announces.
	huge := rawDial(t, srv.Addr())
	huge.send(binary.BigEndian.AppendUint32(nil, frameCap))
	huge.send(make([]byte, 100))
	waitFor(
		t,
		"the frame's reservation and first chunk",
		func() bool { st := srv.stats(); return st.reserved == 2*frameCap && st.held > 0 },
	)
	require.LessOrEqual(t, srv.stats().held, int64(firstChunk))
	huge.c.Close()
	waitFor(t, "the budget back", func() bool { st := srv.stats(); return st.reserved == 0 && st.held == 0 })

	// A frame over the cap is refused and its connection closed.
	r := rawDial(t, srv.Addr())
	r.send(binary.BigEndian.AppendUint32(nil, frameCap+1))
	r.expectRefusal(codeTooLarge)

	// Three connections nearly complete a frame near the cap each; the
	// budget holds one: the others wait (the budget is never exceeded and
	// small requests go on being served) until it finishes.
	value := bytes.Repeat([]byte("v"), frameCap-100)
	conns := make([]*rawConn, 3)
	frames := make([][]byte, 3)
	sent := make(chan error, 3)
	for i := range conns {
		frames[i] = appendFrame(nil, uint64(i+1), uint8(opSet), []byte{'a' + byte(i)}, value)
		conns[i] = rawDial(t, srv.Addr())
		go func() { _, err := conns[i].c.Write(frames[i][:len(frames[i])-10]); sent <- err }()
	}
	for range conns {
		require.NoError(t, <-sent)
	}
	waitFor(t, "one frame in progress", func() bool { return srv.stats().reserved > 0 })
	for range 10 {
		st := srv.stats()
		require.LessOrEqual(t, st.reserved, int64(budget))
		require.LessOrEqual(t, st.held, int64(budget))
		require.NoError(t, c.Ping(ctx))
		time.Sleep(5 * time.Millisecond)
	}
	for i := range conns {
		go func() { _, err := conns[i].c.Write(frames[i][len(frames[i])-10:]); sent <- err }()
	}
	for i := range conns {
		require.NoError(t, <-sent)
		f, err := conns[i].next()
		require.NoError(t, err)
		require.EqualValues(t, statusOK, f.code)
	}
	for _, k := range []string{"a", "b", "c"} {
		v, err := c.Get(ctx, k)
		require.NoError(t, err)
		require.Equal(t, value, v)
	}
	waitFor(t, "the budget back", func() bool { st := srv.stats(); return st.reserved == 0 && st.held == 0 })
}

// The budget is waited for within the frame timeout only.
func TestServerBudgetWaitBounded(t *testing.T) {
	const frameCap = 64 << 10
	srv := serve(
		t,
		WithMaxFrameBytes(frameCap),
		WithMaxBufferedBytes(2*frameCap),
		WithFrameTimeout(300*time.Millisecond),
		WithIdleTimeout(10*time.Second),
	)
	hold := func() *rawConn {
		r := rawDial(t, srv.Addr())
		r.send(binary.BigEndian.AppendUint32(nil, frameCap))
		r.send(make([]byte, 1000))
		return r
	}
	// The first stalled frame holds the whole budget, the second waits for
	// it; both are closed by their frame deadline and the budget comes back.
	a, b := hold(), hold()
	start := time.Now()
	require.True(t, a.closedWithin(3*time.Second))
	require.True(t, b.closedWithin(3*time.Second))
	require.Less(t, time.Since(start), 2*time.Second)
	waitFor(t, "the budget back", func() bool { st := srv.stats(); return st.reserved == 0 && st.held == 0 })
}

// Frame buffers grow only as bytes arrive: property test of the reader's
// arithmetic against random frame lengths and random delivery.
func TestReadBodyGrowsWithArrivals(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 1<<20).Draw(t, "n")
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(i * 7)
		}
		chunks := &chunkReader{t: t, data: data}
		var held, peak int
		got, err := readBody(chunks, n, func(delta int) {
			if delta > 0 {
				// Never more than the first chunk or twice what arrived.
				if limit := max(firstChunk, 2*chunks.sent); delta > limit {
					t.Fatalf("buffer of %d after %d bytes arrived (limit %d)", delta, chunks.sent, limit)
				}
			}
			held += delta
			peak = max(peak, held)
		})
		if err != nil {
			t.Fatalf("readBody: %v", err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("wrong bytes")
		}
		if held != cap(got) || cap(got) != n {
			t.Fatalf("held %d, cap %d, n %d", held, cap(got), n)
		}
		if peak > max(firstChunk, 2*n) {
			t.Fatalf("peak %d for %d bytes", peak, n)
		}
	})
	// A stream that ends early is an unexpected EOF, with the capacity held reported.
	got, err := readBody(bytes.NewReader(make([]byte, 10)), 100, nil)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.Equal(t, 100, cap(got))
}

// chunkReader hands out data in random pieces.
type chunkReader struct {
	t    *rapid.T
	data []byte
	sent int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if r.sent == len(r.data) {
		return 0, io.EOF
	}
	k := rapid.IntRange(1, min(len(p), len(r.data)-r.sent)).Draw(r.t, "chunk")
	copy(p, r.data[r.sent:r.sent+k])
	r.sent += k
	return k, nil
}
