package rendezvous

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/logging"
)

// The Server's limits when no option sets them. They hold a job of a few
// thousand processes (one connection each) and values up to MaxValueLen,
// while a flood of hostile connections costs at most DefaultMaxHandshakes ×
// (helloMaxFrame + 4 KiB of read buffer) until they time out.
const (
	DefaultMaxConns         = 4096             // open connections, authenticated or not
	DefaultMaxHandshakes    = 256              // connections that have not completed their Hello yet
	DefaultHandshakeTimeout = 10 * time.Second // from accept to a complete Hello
	DefaultIdleTimeout      = 60 * time.Second // between frames; clients ping at a third of it
	DefaultFrameTimeout     = 30 * time.Second // from a frame's length word to its last byte
	DefaultWriteTimeout     = 30 * time.Second // one reply's write
	DefaultMaxFrameBytes    = MaxFrameLen      // one request frame, after its length word
	DefaultMaxBufferedBytes = 2 * MaxFrameLen  // request bytes held by all connections together
)

// ServerOption configures a Server. Options only record values; Listen
// validates them and reports the first invalid one by name (an error
// wrapping fairgo.ErrInvalidArgument). Zero means the default.
type ServerOption func(*serverConfig)

type serverConfig struct {
	log              *slog.Logger
	token            []byte
	tokenSet         bool
	maxConns         int
	maxHandshakes    int
	handshakeTimeout time.Duration
	idleTimeout      time.Duration
	frameTimeout     time.Duration
	writeTimeout     time.Duration
	maxFrameBytes    int
	maxBufferedBytes int64
}

// WithServerLogger sets the server's logger (connections, malformed frames).
// Nil means logging.Default().
func WithServerLogger(l *slog.Logger) ServerOption { return func(c *serverConfig) { c.log = l } }

// WithToken makes the server require token in every client's Hello (see
// WithDialToken); connections without it, or with another, are refused with
// ErrUnauthorized and closed before anything is served. The comparison
// takes constant time. The token must be 1 to MaxTokenLen bytes; without
// this option any client is served (bind to a trusted interface then).
// Launchers pass it to workers in FAIRGO_STORE_TOKEN.
func WithToken(token string) ServerOption {
	return func(c *serverConfig) { c.token, c.tokenSet = []byte(token), true }
}

// WithMaxConns caps the open connections; a connection over the cap is
// answered ErrBusy and closed (Dial retries). Zero means DefaultMaxConns.
func WithMaxConns(n int) ServerOption { return func(c *serverConfig) { c.maxConns = n } }

// WithMaxHandshakes caps the connections that have not completed their
// Hello yet, so that unauthenticated connections cannot take the places of
// authenticated ones. At most the connection cap. Zero means
// DefaultMaxHandshakes.
func WithMaxHandshakes(n int) ServerOption { return func(c *serverConfig) { c.maxHandshakes = n } }

// WithHandshakeTimeout bounds the time from accept to a complete Hello.
// Zero means DefaultHandshakeTimeout.
func WithHandshakeTimeout(d time.Duration) ServerOption {
	return func(c *serverConfig) { c.handshakeTimeout = d }
}

// WithIdleTimeout closes a connection on which no frame starts for d. The
// server tells clients d in its Hello reply and they ping at a third of it,
// so a live client blocked in a long Get or Wait is never cut. Zero means
// DefaultIdleTimeout.
func WithIdleTimeout(d time.Duration) ServerOption {
	return func(c *serverConfig) { c.idleTimeout = d }
}

// WithFrameTimeout bounds the time from a frame's length word to its last
// byte: a frame started must finish, whatever its length. Zero means
// DefaultFrameTimeout.
func WithFrameTimeout(d time.Duration) ServerOption {
	return func(c *serverConfig) { c.frameTimeout = d }
}

// WithWriteTimeout bounds one reply's write, so that a client that stops
// reading cannot hold a server goroutine. Zero means DefaultWriteTimeout.
func WithWriteTimeout(d time.Duration) ServerOption {
	return func(c *serverConfig) { c.writeTimeout = d }
}

// WithMaxFrameBytes caps one request frame (after its length word), and so
// the bytes one connection buffers; a longer frame is answered ErrTooLarge
// and its connection closed. Between 4 KiB and MaxFrameLen; the default,
// MaxFrameLen, admits every request the Store limits allow. Zero means
// DefaultMaxFrameBytes.
func WithMaxFrameBytes(n int) ServerOption { return func(c *serverConfig) { c.maxFrameBytes = n } }

// WithMaxBufferedBytes caps the request bytes all connections hold together
// while frames arrive. A frame's buffer grows only as its bytes arrive and
// is charged to this budget before it is allocated; a connection that
// cannot get budget waits, within its frame timeout. At least twice the
// frame cap (a growing buffer is briefly held twice). Zero means
// DefaultMaxBufferedBytes.
func WithMaxBufferedBytes(n int64) ServerOption {
	return func(c *serverConfig) { c.maxBufferedBytes = n }
}

const minFrameBytes = 4 << 10

// newServerConfig applies opts, fills defaults and validates.
func newServerConfig(opts []ServerOption) (serverConfig, error) {
	var c serverConfig
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	bad := func(opt string, v any, reason string) error {
		return &fairgo.ArgError{Arg: "rendezvous." + opt, Value: v, Reason: reason}
	}
	if c.tokenSet && (len(c.token) == 0 || len(c.token) > MaxTokenLen) {
		return c, bad(
			"WithToken",
			fmt.Sprintf("(%d bytes)", len(c.token)),
			fmt.Sprintf("want 1 to %d bytes (leave the option out for a store without a token)", MaxTokenLen),
		)
	}
	ints := []struct {
		name string
		v    *int
		def  int
	}{{"WithMaxConns", &c.maxConns, DefaultMaxConns},
		{"WithMaxHandshakes", &c.maxHandshakes, DefaultMaxHandshakes},
		{"WithMaxFrameBytes", &c.maxFrameBytes, DefaultMaxFrameBytes}}
	for _, f := range ints {
		if *f.v < 0 {
			return c, bad(f.name, *f.v, "negative")
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	durs := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"WithHandshakeTimeout", &c.handshakeTimeout, DefaultHandshakeTimeout},
		{"WithIdleTimeout", &c.idleTimeout, DefaultIdleTimeout},
		{"WithFrameTimeout", &c.frameTimeout, DefaultFrameTimeout},
		{"WithWriteTimeout", &c.writeTimeout, DefaultWriteTimeout},
	}
	for _, f := range durs {
		if *f.v < 0 {
			return c, bad(f.name, *f.v, "negative")
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.idleTimeout < 30*time.Millisecond {
		return c, bad("WithIdleTimeout", c.idleTimeout, "under 30ms: clients could not ping in time")
	}
	if c.maxBufferedBytes < 0 {
		return c, bad("WithMaxBufferedBytes", c.maxBufferedBytes, "negative")
	}
	if c.maxBufferedBytes == 0 {
		c.maxBufferedBytes = max(DefaultMaxBufferedBytes, 2*int64(c.maxFrameBytes))
	}
	switch {
	case c.maxHandshakes > c.maxConns:
		return c, bad("WithMaxHandshakes", c.maxHandshakes, fmt.Sprintf("over the connection cap %d", c.maxConns))
	case c.maxFrameBytes < minFrameBytes || c.maxFrameBytes > MaxFrameLen:
		return c, bad(
			"WithMaxFrameBytes",
			c.maxFrameBytes,
			fmt.Sprintf("outside [%d, MaxFrameLen=%d]", minFrameBytes, MaxFrameLen),
		)
	case c.maxBufferedBytes < 2*int64(c.maxFrameBytes):
		return c, bad(
			"WithMaxBufferedBytes",
			c.maxBufferedBytes,
			fmt.Sprintf("under twice the frame cap %d", c.maxFrameBytes),
		)
	}
	if c.log == nil {
		c.log = logging.Default()
	}
	return c, nil
}
