package rendezvous

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
)

// MemoryStore is a Store held in this process's memory: the store of
// single-process jobs and tests, and the data behind the TCP Server. The zero
// value is an empty store ready to use.
type MemoryStore struct {
	mu      sync.Mutex
	data    map[string][]byte
	waiters map[string]chan struct{} // closed when the key is set
	closed  bool
	done    chan struct{} // closed by Close; created lazily
}

// NewMemoryStore returns an empty store.
func NewMemoryStore() *MemoryStore { return &MemoryStore{} }

func (s *MemoryStore) initLocked() {
	if s.data == nil {
		s.data = make(map[string][]byte)
		s.waiters = make(map[string]chan struct{})
	}
	if s.done == nil {
		s.done = make(chan struct{})
	}
}

// setLocked stores v (owned by the store) and wakes the waiters of key.
func (s *MemoryStore) setLocked(key string, v []byte) {
	s.data[key] = v
	if ch, ok := s.waiters[key]; ok {
		close(ch)
		delete(s.waiters, key)
	}
}

func clone(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return bytes.Clone(b)
}

// Set implements Store.
func (s *MemoryStore) Set(ctx context.Context, key string, value []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := checkValue(value); err != nil {
		return err
	}
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.setLocked(key, clone(value))
	return nil
}

// wait blocks until key exists; it returns the value when get is set.
func (s *MemoryStore) wait(ctx context.Context, key string, get bool) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	for {
		if err := s.enter(ctx); err != nil {
			return nil, err
		}
		if v, ok := s.data[key]; ok {
			if get {
				v = clone(v)
			}
			s.mu.Unlock()
			return v, nil
		}
		ch, ok := s.waiters[key]
		if !ok {
			ch = make(chan struct{})
			s.waiters[key] = ch
		}
		done := s.done
		s.mu.Unlock()
		select {
		case <-ch:
		case <-done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Get implements Store.
func (s *MemoryStore) Get(ctx context.Context, key string) ([]byte, error) {
	return s.wait(ctx, key, true)
}

// Wait implements Store.
func (s *MemoryStore) Wait(ctx context.Context, keys ...string) error {
	if len(keys) > MaxWaitKeys {
		return fmt.Errorf("wait for %d keys (limit %d): %w", len(keys), MaxWaitKeys, ErrTooLarge)
	}
	for _, k := range keys {
		if _, err := s.wait(ctx, k, false); err != nil {
			return err
		}
	}
	return nil
}

// Add implements Store.
func (s *MemoryStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	if err := s.enter(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	var n int64
	if v, ok := s.data[key]; ok {
		var err error
		if n, err = strconv.ParseInt(string(v), 10, 64); err != nil {
			return 0, fmt.Errorf("add to key %q holding %q: %w", key, truncate(v), ErrNotCounter)
		}
	}
	n += delta
	s.setLocked(key, strconv.AppendInt(nil, n, 10))
	return n, nil
}

func truncate(v []byte) string {
	if len(v) > 32 {
		return string(v[:32]) + "..."
	}
	return string(v)
}

// CompareSet implements Store.
func (s *MemoryStore) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if err := checkValue(expected); err != nil {
		return nil, err
	}
	if err := checkValue(desired); err != nil {
		return nil, err
	}
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	cur, ok := s.data[key]
	switch {
	case !ok && len(expected) == 0, ok && bytes.Equal(cur, expected):
		s.setLocked(key, clone(desired))
		return clone(desired), nil
	case !ok:
		return clone(expected), nil
	default:
		return clone(cur), nil
	}
}

// Delete implements Store.
func (s *MemoryStore) Delete(ctx context.Context, key string) (bool, error) {
	if err := checkKey(key); err != nil {
		return false, err
	}
	if err := s.enter(ctx); err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	_, ok := s.data[key]
	delete(s.data, key)
	return ok, nil
}

// Len returns the number of keys.
func (s *MemoryStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.data)
}

// enter checks ctx, locks s and readies it; on an error (ctx done, s
// closed) s is left unlocked.
func (s *MemoryStore) enter(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	s.initLocked()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// Close implements Store: blocked callers and later calls get ErrClosed.
func (s *MemoryStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	if !s.closed {
		s.closed = true
		close(s.done)
	}
	return nil
}
