package rendezvous

// The TCP store's wire format. Every message is a frame:
//
//	u32 length of the rest of the frame (big endian), at most MaxFrameLen
//	u64 request id, chosen by the client and echoed in the reply
//	u8  op code (requests) or status (replies)
//	fields, each a u32 length followed by that many bytes
//
// The first frame a client sends is Hello(magic, token): magic is
// helloMagic (it names the protocol and its version), token the shared
// secret or empty. The server answers statusOK with one field, its idle
// timeout in milliseconds as 8 bytes (the client pings well within it), or
// statusError (codeUnauthorized, codeBusy, codeProtocol) and closes the
// connection. Nothing else is served before a Hello succeeded.
//
// Requests and their fields: Set(key, value), Get(key), Add(key, i64 delta
// as 8 bytes), CompareSet(key, expected, desired), Wait(key...), Delete(key),
// Ping(), and Cancel(u64 id of a pending request; no reply). A reply has
// status statusOK and the result fields (Get, CompareSet: the value; Add: 8
// bytes; Delete: one byte 0 or 1), or statusError with an error code byte and
// a message. Replies may come in any order; a client multiplexes many
// requests over one connection. A frame the server cannot parse gets an error
// reply when its id could be read, and otherwise the connection is closed.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// MaxFrameLen bounds the length word of a frame: room for CompareSet's two
// values and a key.
const MaxFrameLen = 2*MaxValueLen + MaxKeyLen + 1024

const frameHeader = 8 + 1 // id, op

type opCode uint8

const (
	opSet opCode = iota + 1
	opGet
	opAdd
	opCompareSet
	opWait
	opDelete
	opPing
	opCancel
	opHello
)

// helloMagic opens the Hello frame: the protocol's name and version.
const helloMagic = "fairgo-store/1"

// MaxTokenLen bounds the shared token (bytes).
const MaxTokenLen = 256

// helloMaxFrame bounds the frame a client may send before it is
// authenticated: a Hello with the longest token.
const helloMaxFrame = frameHeader + 4 + len(helloMagic) + 4 + MaxTokenLen

func (o opCode) String() string {
	switch o {
	case opSet:
		return "set"
	case opGet:
		return "get"
	case opAdd:
		return "add"
	case opCompareSet:
		return "compare-set"
	case opWait:
		return "wait"
	case opDelete:
		return "delete"
	case opPing:
		return "ping"
	case opCancel:
		return "cancel"
	case opHello:
		return "hello"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

const (
	statusOK    = 0
	statusError = 1
)

// Error codes of an error reply; the client maps them back to sentinels.
const (
	codeOther    = 1
	codeTooLarge = 2
	codeNotCount = 3
	codeClosed   = 4
	codeProtocol = 5
	codeAuth     = 6
	codeBusy     = 7
)

func errorCode(err error) byte {
	switch {
	case errors.Is(err, ErrTooLarge):
		return codeTooLarge
	case errors.Is(err, ErrNotCounter):
		return codeNotCount
	case errors.Is(err, ErrClosed):
		return codeClosed
	case errors.Is(err, ErrProtocol):
		return codeProtocol
	case errors.Is(err, ErrUnauthorized):
		return codeAuth
	case errors.Is(err, ErrBusy):
		return codeBusy
	}
	return codeOther
}

// RemoteError is an error the server reported for one request. It unwraps
// to the matching sentinel (ErrTooLarge, ErrNotCounter, ErrClosed,
// ErrProtocol, ErrUnauthorized, ErrBusy) when there is one.
type RemoteError struct {
	Op      string
	Code    byte
	Message string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("rendezvous: server: %s: %s", e.Op, e.Message)
}

// Unwrap returns the sentinel matching the error code, or nil.
func (e *RemoteError) Unwrap() error {
	switch e.Code {
	case codeTooLarge:
		return ErrTooLarge
	case codeNotCount:
		return ErrNotCounter
	case codeClosed:
		return ErrClosed
	case codeProtocol:
		return ErrProtocol
	case codeAuth:
		return ErrUnauthorized
	case codeBusy:
		return ErrBusy
	}
	return nil
}

// frame is one decoded message.
type frame struct {
	id     uint64
	code   uint8 // op or status
	fields [][]byte
}

// appendFrame encodes a frame; the caller checks the limits beforehand.
func appendFrame(dst []byte, id uint64, code uint8, fields ...[]byte) []byte {
	n := frameHeader
	for _, f := range fields {
		n += 4 + len(f)
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	dst = binary.BigEndian.AppendUint64(dst, id)
	dst = append(dst, code)
	for _, f := range fields {
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(f)))
		dst = append(dst, f...)
	}
	return dst
}

// frameError is a frame that could be read whole but not parsed; the
// connection stays usable.
type frameError struct {
	id  uint64
	err error
}

func (e *frameError) Error() string { return e.err.Error() }
func (e *frameError) Unwrap() error { return e.err }

// allocHook is told of every frame buffer allocated (delta = its capacity)
// and dropped (delta < 0), so that the server can account for the bytes it
// holds.
type allocHook func(delta int)

// firstChunk is the first allocation for a frame body: frames up to this
// size are read into one buffer; larger ones grow by doubling as their bytes
// arrive, so that a length word alone never allocates what it announces.
const firstChunk = 4 << 10

// readFrame reads one frame of at most MaxFrameLen bytes (after the length
// word); see readFrameBudget.
func readFrame(r *bufio.Reader) (frame, error) {
	f, _, err := readFrameBudget(r, MaxFrameLen, nil, nil)
	return f, err
}

// readFrameBudget reads one frame of at most maxLen bytes. begin, when not
// nil, is called once the length word is read and accepted (the server
// starts the frame's deadline and reserves its memory budget there); an
// error from it abandons the frame. The body is allocated as its bytes
// arrive (see firstChunk), alloc being told of each buffer. It returns the
// capacity of the frame's buffer, still held by the frame's fields. An error
// of type *frameError leaves the stream at the next frame; any other error
// means the stream is unusable.
func readFrameBudget(r *bufio.Reader, maxLen int, begin func(n int) error, alloc allocHook) (frame, int, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return frame{}, 0, err // io.EOF between frames is a clean end
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < frameHeader {
		return frame{}, 0, fmt.Errorf("frame length %d shorter than its header: %w", n, ErrProtocol)
	}
	if uint64(n) > uint64(maxLen) {
		return frame{}, 0, fmt.Errorf("frame length %d over the limit %d: %w", n, maxLen, ErrTooLarge)
	}
	if begin != nil {
		if err := begin(int(n)); err != nil {
			return frame{}, 0, err
		}
	}
	buf, err := readBody(r, int(n), alloc)
	if err != nil {
		return frame{}, cap(buf), err
	}
	f, err := parseFrame(buf)
	return f, cap(buf), err
}

// readBody reads n bytes into a buffer that grows (by doubling, from
// firstChunk) only as they arrive: its capacity never exceeds the larger of
// firstChunk and twice the bytes received. On error the returned slice
// still tells the capacity held.
func readBody(r io.Reader, n int, alloc allocHook) ([]byte, error) {
	var buf []byte
	for len(buf) < n {
		if len(buf) == cap(buf) {
			next := min(n, max(firstChunk, 2*cap(buf)))
			nb := make([]byte, len(buf), next)
			if alloc != nil {
				alloc(next)
			}
			copy(nb, buf)
			if alloc != nil && cap(buf) > 0 {
				alloc(-cap(buf)) // the old buffer is garbage now
			}
			buf = nb
		}
		m, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err != nil && len(buf) < n {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return buf, fmt.Errorf("truncated frame (%d of %d bytes): %w", len(buf), n, err)
		}
	}
	return buf, nil
}

// parseFrame splits a frame body into its id, code and fields; the fields
// alias buf.
func parseFrame(buf []byte) (frame, error) {
	f := frame{id: binary.BigEndian.Uint64(buf), code: buf[8]}
	rest := buf[frameHeader:]
	for len(rest) > 0 {
		if len(rest) < 4 {
			return f, &frameError{f.id, fmt.Errorf("field length cut short: %w", ErrProtocol)}
		}
		l := binary.BigEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(l) > uint64(len(rest)) {
			return f, &frameError{
				f.id,
				fmt.Errorf("field of %d bytes overruns the frame (%d left): %w", l, len(rest), ErrProtocol),
			}
		}
		f.fields = append(f.fields, rest[:l:l])
		rest = rest[l:]
	}
	return f, nil
}
