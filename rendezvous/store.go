package rendezvous

import (
	"context"
	"errors"
	"fmt"

	"github.com/fairgo/fairgo"
)

// Store is a key-value store shared by the ranks of a job, with the semantics
// of PyTorch's c10d stores. Every method is safe for concurrent use. Every
// blocking call returns ctx.Err() unchanged when ctx ends first.
type Store interface {
	// Set stores value under key, replacing any previous value and waking
	// the callers blocked on key.
	Set(ctx context.Context, key string, value []byte) error
	// Get returns the value of key, blocking until the key exists.
	Get(ctx context.Context, key string) ([]byte, error)
	// Add adds delta to the decimal integer stored under key (a missing key
	// counts as 0), stores the sum and returns it. A value that is not a
	// decimal integer gives an error wrapping ErrNotCounter.
	Add(ctx context.Context, key string, delta int64) (int64, error)
	// CompareSet sets key to desired when its current value equals expected,
	// or when the key is missing and expected is empty, and returns the
	// value after the operation: desired when it was set; expected when the
	// key is missing and expected is not empty (nothing is set); otherwise
	// the current value.
	CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error)
	// Wait blocks until every key exists.
	Wait(ctx context.Context, keys ...string) error
	// Delete removes key and reports whether it existed.
	Delete(ctx context.Context, key string) (bool, error)
	// Close releases the store; calls blocked in it, and later calls, fail
	// with an error wrapping ErrClosed.
	Close() error
}

// Size limits, enforced by every store so that a program behaves the same in
// memory and over TCP.
const (
	MaxKeyLen   = 4 << 10  // bytes in a key
	MaxValueLen = 16 << 20 // bytes in a value
	MaxWaitKeys = 1 << 16  // keys in one Wait
)

// Errors returned by stores; test with errors.Is.
var (
	// ErrClosed: the store, or the connection to the server, was closed.
	ErrClosed = fmt.Errorf("rendezvous: store closed: %w", fairgo.ErrClosed)
	// ErrTooLarge: a key, a value or a frame exceeds the limits.
	ErrTooLarge = fmt.Errorf("rendezvous: too large: %w", fairgo.ErrInvalidArgument)
	// ErrNotCounter: Add on a key whose value is not a decimal integer.
	ErrNotCounter = fmt.Errorf("rendezvous: value is not a decimal counter: %w", fairgo.ErrInvalidArgument)
	// ErrProtocol: a malformed frame was sent or received.
	ErrProtocol = errors.New("rendezvous: protocol error")
	// ErrUnauthorized: the server refused the client's token (or its lack
	// of one).
	ErrUnauthorized = errors.New("rendezvous: store refused the token")
	// ErrBusy: the server is at its connection limit; Dial retries.
	ErrBusy = errors.New("rendezvous: store busy")
)

func checkKey(key string) error {
	if len(key) > MaxKeyLen {
		return fmt.Errorf("key of %d bytes (limit %d): %w", len(key), MaxKeyLen, ErrTooLarge)
	}
	return nil
}

func checkValue(v []byte) error {
	if len(v) > MaxValueLen {
		return fmt.Errorf("value of %d bytes (limit %d): %w", len(v), MaxValueLen, ErrTooLarge)
	}
	return nil
}

// WithPrefix returns a view of s in which every key is prefix + "/" + key,
// so that independent users (jobs, communicators, retries) share one store
// without collisions. Closing the view does not close s.
func WithPrefix(s Store, prefix string) Store {
	return &prefixStore{s: s, p: prefix + "/"}
}

type prefixStore struct {
	s Store
	p string
}

func (p *prefixStore) Set(ctx context.Context, key string, value []byte) error {
	return p.s.Set(ctx, p.p+key, value)
}

func (p *prefixStore) Get(ctx context.Context, key string) ([]byte, error) {
	return p.s.Get(ctx, p.p+key)
}

func (p *prefixStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	return p.s.Add(ctx, p.p+key, delta)
}

func (p *prefixStore) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	return p.s.CompareSet(ctx, p.p+key, expected, desired)
}

func (p *prefixStore) Wait(ctx context.Context, keys ...string) error {
	pk := make([]string, len(keys))
	for i, k := range keys {
		pk[i] = p.p + k
	}
	return p.s.Wait(ctx, pk...)
}

func (p *prefixStore) Delete(ctx context.Context, key string) (bool, error) {
	return p.s.Delete(ctx, p.p+key)
}

func (p *prefixStore) Close() error { return nil }
