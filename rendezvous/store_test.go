package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
)

// stores returns a fresh instance of every Store implementation.
func stores(t *testing.T) map[string]func(t *testing.T) Store {
	return map[string]func(t *testing.T) Store{
		"memory":      func(t *testing.T) Store { return NewMemoryStore() },
		"memory-zero": func(t *testing.T) Store { return &MemoryStore{} },
		"prefix":      func(t *testing.T) Store { return WithPrefix(NewMemoryStore(), "job") },
		"tcp":         func(t *testing.T) Store { _, c := startTCP(t); return c },
		"tcp-prefix":  func(t *testing.T) Store { _, c := startTCP(t); return WithPrefix(c, "a/b") },
		"c10d":        func(t *testing.T) Store { _, c := dialFakeC10d(t); return c },
	}
}

// startTCP serves a store on loopback and dials it; both end with the test.
func startTCP(t *testing.T) (*Server, *Client) {
	t.Helper()
	srv, err := Listen("127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	c := dial(t, srv.Addr())
	t.Cleanup(func() {
		c.Close()
		cancel()
		require.ErrorIs(t, <-served, context.Canceled)
	})
	return srv, c
}

func dial(t *testing.T, addr string) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestStoreSemantics(t *testing.T) {
	for name, mk := range stores(t) {
		t.Run(name, func(t *testing.T) {
			s := mk(t)
			ctx := testCtx(t)

			require.NoError(t, s.Set(ctx, "k", []byte("v1")))
			v, err := s.Get(ctx, "k")
			require.NoError(t, err)
			require.Equal(t, []byte("v1"), v)
			require.NoError(t, s.Set(ctx, "k", []byte("v2")))
			v, err = s.Get(ctx, "k")
			require.NoError(t, err)
			require.Equal(t, []byte("v2"), v)

			// Empty values and binary data round-trip.
			require.NoError(t, s.Set(ctx, "empty", nil))
			v, err = s.Get(ctx, "empty")
			require.NoError(t, err)
			require.Empty(t, v)
			bin := []byte{0, 1, 2, 255, 0}
			require.NoError(t, s.Set(ctx, "bin", bin))
			v, err = s.Get(ctx, "bin")
			require.NoError(t, err)
			require.Equal(t, bin, v)

			// Add on a missing key counts from 0; values are decimal.
			n, err := s.Add(ctx, "ctr", 5)
			require.NoError(t, err)
			require.EqualValues(t, 5, n)
			n, err = s.Add(ctx, "ctr", -7)
			require.NoError(t, err)
			require.EqualValues(t, -2, n)
			v, err = s.Get(ctx, "ctr")
			require.NoError(t, err)
			require.Equal(t, "-2", string(v))
			_, err = s.Add(ctx, "k", 1)
			require.ErrorIs(t, err, ErrNotCounter)

			// CompareSet, c10d semantics.
			for _, tc := range []struct {
				name              string
				key               string
				expected, desired string
				want              string
				after             string // "" : key must stay missing
			}{
				{"missing, empty expected: set", "cs1", "", "a", "a", "a"},
				{"missing, expected given: unchanged", "cs2", "x", "a", "x", ""},
				{"equal: set", "cs1", "a", "b", "b", "b"},
				{"different: current returned", "cs1", "zzz", "c", "b", "b"},
			} {
				got, err := s.CompareSet(ctx, tc.key, []byte(tc.expected), []byte(tc.desired))
				require.NoError(t, err, tc.name)
				require.Equal(t, tc.want, string(got), tc.name)
				if tc.after == "" {
					ok, err := s.Delete(ctx, tc.key)
					require.NoError(t, err)
					require.False(t, ok, "%s: key must not exist", tc.name)
					continue
				}
				v, err := s.Get(ctx, tc.key)
				require.NoError(t, err)
				require.Equal(t, tc.after, string(v), tc.name)
			}

			// Delete.
			ok, err := s.Delete(ctx, "k")
			require.NoError(t, err)
			require.True(t, ok)
			ok, err = s.Delete(ctx, "k")
			require.NoError(t, err)
			require.False(t, ok)

			// Wait with no keys, and with keys that exist.
			require.NoError(t, s.Wait(ctx))
			require.NoError(t, s.Wait(ctx, "bin", "ctr"))

			// Limits.
			big := make([]byte, MaxKeyLen+1)
			require.ErrorIs(t, s.Set(ctx, string(big), nil), ErrTooLarge)
			require.ErrorIs(t, s.Set(ctx, "x", make([]byte, MaxValueLen+1)), ErrTooLarge)
		})
	}
}

func TestStoreBlocking(t *testing.T) {
	for name, mk := range stores(t) {
		t.Run(name, func(t *testing.T) {
			s := mk(t)
			ctx := testCtx(t)

			got := make(chan []byte, 1)
			go func() {
				v, err := s.Get(ctx, "late")
				if err != nil {
					v = []byte(err.Error())
				}
				got <- v
			}()
			waited := make(chan error, 1)
			go func() { waited <- s.Wait(ctx, "late", "later") }()
			time.Sleep(20 * time.Millisecond)
			select {
			case v := <-got:
				t.Fatalf("Get returned %q before the key existed", v)
			default:
			}
			require.NoError(t, s.Set(ctx, "late", []byte("here")))
			require.Equal(t, "here", string(<-got))
			select {
			case err := <-waited:
				t.Fatalf("Wait returned %v before every key existed", err)
			case <-time.After(20 * time.Millisecond):
			}
			_, err := s.Add(ctx, "later", 1)
			require.NoError(t, err)
			require.NoError(t, <-waited)

			// A context that ends returns ctx.Err() unchanged.
			short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
			defer cancel()
			_, err = s.Get(short, "never")
			require.Equal(t, context.DeadlineExceeded, err)
			require.Equal(t, context.DeadlineExceeded, s.Wait(short, "never"))
			cctx, ccancel := context.WithCancel(ctx)
			ccancel()
			_, err = s.Get(cctx, "never")
			require.Equal(t, context.Canceled, err)
			require.Equal(t, context.Canceled, s.Set(cctx, "x", nil))

			// The store still works afterwards.
			require.NoError(t, s.Set(ctx, "never", []byte("1")))
			v, err := s.Get(ctx, "never")
			require.NoError(t, err)
			require.Equal(t, "1", string(v))
		})
	}
}

func TestStoreConcurrentAdd(t *testing.T) {
	for name, mk := range stores(t) {
		t.Run(name, func(t *testing.T) {
			s := mk(t)
			ctx := testCtx(t)
			const workers, adds = 16, 50
			var g errgroup.Group
			for w := range workers {
				g.Go(func() error {
					for range adds {
						if _, err := s.Add(ctx, "n", 1); err != nil {
							return err
						}
					}
					return s.Set(ctx, fmt.Sprintf("done/%d", w), nil)
				})
			}
			keys := make([]string, workers)
			for w := range keys {
				keys[w] = fmt.Sprintf("done/%d", w)
			}
			require.NoError(t, s.Wait(ctx, keys...))
			require.NoError(t, g.Wait())
			v, err := s.Get(ctx, "n")
			require.NoError(t, err)
			require.Equal(t, strconv.Itoa(workers*adds), string(v))
		})
	}
}

func TestStoreClose(t *testing.T) {
	s := NewMemoryStore()
	ctx := testCtx(t)
	errc := make(chan error, 1)
	go func() { _, err := s.Get(ctx, "never"); errc <- err }()
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, s.Close())
	require.ErrorIs(t, <-errc, ErrClosed)
	require.ErrorIs(t, s.Set(ctx, "k", nil), ErrClosed)
	require.True(t, errors.Is(ErrClosed, ErrClosed))
	require.NoError(t, s.Close(), "Close twice")

	// The prefix view does not close the store under it.
	m := NewMemoryStore()
	require.NoError(t, WithPrefix(m, "p").Close())
	require.NoError(t, m.Set(ctx, "k", nil))
	require.NoError(t, WithPrefix(m, "p").Set(ctx, "k", []byte("x")))
	v, err := m.Get(ctx, "p/k")
	require.NoError(t, err)
	require.Equal(t, "x", string(v))
}

// Values handed to and returned by the memory store are copies.
func TestMemoryStoreCopies(t *testing.T) {
	s := NewMemoryStore()
	ctx := testCtx(t)
	b := []byte("abc")
	require.NoError(t, s.Set(ctx, "k", b))
	b[0] = 'X'
	v, err := s.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "abc", string(v))
	v[0] = 'Y'
	v, err = s.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "abc", string(v))
}
