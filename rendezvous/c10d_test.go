package rendezvous

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
)

// step is one move of a recorded dialogue on one connection: bytes the
// client must send (recv) or bytes the server answers (send), as hex with
// spaces and comments ("# ...") for reading.
type step struct{ recv, send string }

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	var clean strings.Builder
	for _, line := range strings.Split(s, "\n") {
		line, _, _ = strings.Cut(line, "#")
		clean.WriteString(strings.ReplaceAll(strings.TrimSpace(line), " ", ""))
	}
	b, err := hex.DecodeString(clean.String())
	require.NoError(t, err, s)
	return b
}

// scriptServer plays recorded dialogues: connection i follows scripts[i].
// Every byte the client sends is compared with the recording.
func scriptServer(t *testing.T, scripts [][]step) (addr string, done <-chan struct{}) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		defer ln.Close()
		for i, script := range scripts {
			conn, err := ln.Accept()
			if err != nil {
				t.Errorf("accept connection %d: %v", i, err)
				return
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			go func() {
				for j, st := range script {
					if st.recv != "" {
						want := unhex(t, st.recv)
						got := make([]byte, len(want))
						conn.SetReadDeadline(time.Now().Add(2 * time.Second))
						if n, err := io.ReadFull(conn, got); err != nil {
							t.Errorf(
								"connection %d step %d: client sent\n%swant\n%s(%v)",
								i,
								j,
								hex.Dump(got[:n]),
								hex.Dump(want),
								err,
							)
							conn.Close()
							return
						}
						if string(got) != string(want) {
							t.Errorf(
								"connection %d step %d: client sent\n%swant\n%s",
								i,
								j,
								hex.Dump(got),
								hex.Dump(want),
							)
							conn.Close()
							return
						}
					}
					if st.send != "" {
						conn.Write(unhex(t, st.send))
					}
				}
			}()
		}
		time.Sleep(200 * time.Millisecond)
	}()
	return ln.Addr().String(), finished
}

// A dialogue written byte by byte from PyTorch's sources (TCPStore.cpp's
// SendBuffer and TCPStoreLibUvBackend.cpp's parse_* and StreamWriter): the
// client must produce exactly these bytes and understand these replies.
func TestC10dRecordedExchange(t *testing.T) {
	validate := func(nonce string) []step {
		return []step{
			{recv: "00 ce f7 85 3c   # VALIDATE, magic 0x3C85F7CE little-endian"},
			{recv: "0d " + nonce + " # PING, nonce", send: nonce + " # the nonce back"},
		}
	}
	main := append(validate("01 00 00 00"),
		step{recv: `01                        # SET
			02 00 00 00 00 00 00 00   # key length 2
			2f 6b                     # "/k": TCPStore's "/" prefix, then "k"
			01 00 00 00 00 00 00 00   # value length 1
			76                        # "v"
			0d 02 00 00 00            # PING after SET (SET has no reply)`,
			send: "02 00 00 00"},
		step{recv: `04 02 00 00 00 00 00 00 00 2f 6e   # ADD "/n"
			03 00 00 00 00 00 00 00            # delta 3, i64 LE`,
			send: "03 00 00 00 00 00 00 00   # 3"},
		step{recv: `04 02 00 00 00 00 00 00 00 2f 6e
			fb ff ff ff ff ff ff ff            # delta -5`,
			send: "fe ff ff ff ff ff ff ff   # -2"},
		step{recv: `02 02 00 00 00 00 00 00 00 2f 6b   # COMPARE_SET "/k"
			01 00 00 00 00 00 00 00 76         # expected "v"
			01 00 00 00 00 00 00 00 77         # desired "w"`,
			send: "01 00 00 00 00 00 00 00 77   # the value after: w"},
		step{recv: "08 02 00 00 00 00 00 00 00 2f 6b   # DELETE_KEY \"/k\"",
			send: "01 00 00 00 00 00 00 00   # 1 deleted"},
		step{recv: "08 02 00 00 00 00 00 00 00 2f 6b",
			send: "00 00 00 00 00 00 00 00   # 0 deleted"},
	)
	waiter := append(validate("03 00 00 00"),
		step{recv: `06                        # WAIT
			01 00 00 00 00 00 00 00   # 1 key
			02 00 00 00 00 00 00 00 2f 6e`,
			send: "00   # STOP_WAITING"},
		step{recv: "03 02 00 00 00 00 00 00 00 2f 6e   # GET \"/n\"",
			send: "02 00 00 00 00 00 00 00 2d 32   # \"-2\""},
		step{recv: `06 02 00 00 00 00 00 00 00   # WAIT, 2 keys, on the same connection
			02 00 00 00 00 00 00 00 2f 6e
			03 00 00 00 00 00 00 00 2f 6b 32   # "/k2"`,
			send: "00"},
	)
	addr, done := scriptServer(t, [][]step{main, waiter})
	ctx := testCtx(t)
	var nonce atomic.Uint32
	cfg, err := newDialConfig(nil, true)
	require.NoError(t, err)
	c, err := dialC10d(ctx, addr, cfg, func() uint32 { return nonce.Add(1) })
	require.NoError(t, err)
	defer c.Close()

	require.NoError(t, c.Set(ctx, "k", []byte("v")))
	n, err := c.Add(ctx, "n", 3)
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	n, err = c.Add(ctx, "n", -5)
	require.NoError(t, err)
	require.EqualValues(t, -2, n)
	v, err := c.CompareSet(ctx, "k", []byte("v"), []byte("w"))
	require.NoError(t, err)
	require.Equal(t, "w", string(v))
	ok, err := c.Delete(ctx, "k")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = c.Delete(ctx, "k")
	require.NoError(t, err)
	require.False(t, ok)
	v, err = c.Get(ctx, "n")
	require.NoError(t, err)
	require.Equal(t, "-2", string(v))
	require.NoError(t, c.Wait(ctx, "n", "k2"))
	require.NoError(t, c.Close())
	<-done
}

// The encodings round-trip through the fake server's decoding, for any key
// and value: property test of the length arithmetic.
func TestC10dEncodingProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		key := rapid.StringN(0, 64, -1).Draw(t, "key")
		val := rapid.SliceOfN(rapid.Byte(), 0, 300).Draw(t, "value")
		keys := rapid.SliceOfN(rapid.StringN(0, 16, -1), 0, 8).Draw(t, "keys")

		b := appendC10dBytes(appendC10dKey(nil, key), val)
		if len(b) != 8+1+len(key)+8+len(val) {
			t.Fatalf("encoded length %d", len(b))
		}
		r := bufio.NewReader(strings.NewReader(string(b)))
		gotKey, err := readC10dBytes(r, 1<<20)
		if err != nil || string(gotKey) != c10dKeyPrefix+key {
			t.Fatalf("key: %q, %v", gotKey, err)
		}
		gotVal, err := readC10dBytes(r, 1<<20)
		if err != nil || string(gotVal) != string(val) {
			t.Fatalf("value: %q, %v", gotVal, err)
		}

		w := c10dWaitRequest(c10dWait, keys...)
		if w[0] != c10dWait || binary.LittleEndian.Uint64(w[1:]) != uint64(len(keys)) {
			t.Fatalf("wait header % x", w[:9])
		}
		r = bufio.NewReader(strings.NewReader(string(w[9:])))
		for _, k := range keys {
			got, err := readC10dBytes(r, 1<<20)
			if err != nil || string(got) != c10dKeyPrefix+k {
				t.Fatalf("wait key %q: %q, %v", k, got, err)
			}
		}
		if _, err := r.ReadByte(); err != io.EOF {
			t.Fatalf("bytes left after the wait request")
		}
	})
	// A reply announcing more than the limit is refused before reading it.
	b := binary.LittleEndian.AppendUint64(nil, C10dMaxValueLen+1)
	_, err := readC10dBytes(bufio.NewReader(strings.NewReader(string(b))), C10dMaxValueLen)
	require.ErrorIs(t, err, ErrProtocol)
}

// Keys set through the client are the server keys PyTorch's TCPStore uses
// for the same names ("/" + key).
func TestC10dKeyPrefix(t *testing.T) {
	s, c := dialFakeC10d(t)
	ctx := testCtx(t)
	require.NoError(t, c.Set(ctx, "fairgo/x", []byte("1")))
	v, ok := s.get("/fairgo/x")
	require.True(t, ok)
	require.Equal(t, "1", string(v))
	n, err := c.NumKeys(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

// A blocking call whose ctx ends closes its own connection: the server
// forgets the wait, and the client goes on working (the shared connection
// is untouched and a new wait connection is dialled).
func TestC10dCancelledWaitLeavesNoState(t *testing.T) {
	s, c := dialFakeC10d(t)
	ctx := testCtx(t)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	require.Equal(t, context.DeadlineExceeded, c.Wait(short, "never"))
	_, err := c.Get(short, "never")
	require.Equal(t, context.DeadlineExceeded, err)
	waitFor(
		t,
		"the server to drop the waits",
		func() bool { conns, waiting := s.state(); return waiting == 0 && conns == 1 },
	)

	cctx, ccancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Wait(cctx, "later") }()
	waitFor(t, "a wait", func() bool { _, waiting := s.state(); return waiting == 1 })
	ccancel()
	require.Equal(t, context.Canceled, <-errc)
	waitFor(t, "the server to drop the wait", func() bool { _, waiting := s.state(); return waiting == 0 })

	require.NoError(t, c.Set(ctx, "never", []byte("x")))
	v, err := c.Get(ctx, "never")
	require.NoError(t, err)
	require.Equal(t, "x", string(v))
}

// Many goroutines share one client: non-blocking calls take turns on the
// shared connection while blocking ones wait on their own.
func TestC10dConcurrentBlocking(t *testing.T) {
	_, c := dialFakeC10d(t)
	ctx := testCtx(t)
	const n = 8
	errc := make(chan error, n)
	for i := range n {
		go func() {
			v, err := c.Get(ctx, "go")
			if err == nil && string(v) != "now" {
				err = io.ErrUnexpectedEOF
			}
			if err == nil {
				_, err = c.Add(ctx, "got", 1)
			}
			_ = i
			errc <- err
		}()
	}
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, c.Set(ctx, "go", []byte("now")))
	for range n {
		require.NoError(t, <-errc)
	}
	v, err := c.Get(ctx, "got")
	require.NoError(t, err)
	require.Equal(t, "8", string(v))
}

func TestC10dLimitsAndErrors(t *testing.T) {
	s, c := dialFakeC10d(t)
	ctx := testCtx(t)
	require.ErrorIs(t, c.Set(ctx, "big", make([]byte, C10dMaxValueLen+1)), ErrTooLarge)
	require.ErrorIs(t, c.Set(ctx, strings.Repeat("k", MaxKeyLen+1), nil), ErrTooLarge)
	require.NoError(t, c.Set(ctx, "max", make([]byte, C10dMaxValueLen)))
	v, err := c.Get(ctx, "max")
	require.NoError(t, err)
	require.Len(t, v, C10dMaxValueLen)

	// The server closes the connection on ADD to a non-counter: reported
	// as ErrNotCounter, and the client recovers.
	require.NoError(t, c.Set(ctx, "text", []byte("abc")))
	_, err = c.Add(ctx, "text", 1)
	require.ErrorIs(t, err, ErrNotCounter)
	n, err := c.Add(ctx, "ctr", 2)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)

	// A token makes no sense here.
	_, err = DialC10d(ctx, s.Addr(), WithDialToken("x"))
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)

	// A server that is not a c10d store (a fairgo store) is refused.
	srv := serve(t, WithHandshakeTimeout(200*time.Millisecond))
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = DialC10d(short, srv.Addr())
	require.Error(t, err)
	require.Contains(t, err.Error(), srv.Addr())

	// Close: in-flight and later calls fail with ErrClosed.
	errc := make(chan error, 1)
	go func() { errc <- c.Wait(ctx, "never") }()
	waitFor(t, "a wait", func() bool { _, waiting := s.state(); return waiting == 1 })
	require.NoError(t, c.Close())
	require.ErrorIs(t, <-errc, ErrClosed)
	require.ErrorIs(t, c.Set(ctx, "k", nil), ErrClosed)
	_, err = c.Get(ctx, "k")
	require.ErrorIs(t, err, ErrClosed)

	// The server going away mid-wait is an ErrClosed error naming the address.
	s2, c2 := dialFakeC10d(t)
	go func() { errc <- c2.Wait(ctx, "never") }()
	waitFor(t, "a wait", func() bool { _, waiting := s2.state(); return waiting == 1 })
	s2.Close()
	err = <-errc
	require.ErrorIs(t, err, ErrClosed)
	require.Contains(t, err.Error(), s2.Addr())
}

// DialC10d retries until the store listens.
func TestC10dDialRetry(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	ctx := testCtx(t)
	got := make(chan error, 1)
	go func() {
		c, err := DialC10d(ctx, addr, WithRetryInterval(20*time.Millisecond))
		if err == nil {
			err = c.Set(ctx, "k", nil)
			c.Close()
		}
		got <- err
	}()
	time.Sleep(100 * time.Millisecond)
	startFakeC10d(t, addr)
	require.NoError(t, <-got)
}
