package rendezvous

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeC10d is a c10d TCPStore server written from PyTorch's
// TCPStoreLibUvBackend.cpp (see c10d.go for the protocol): one goroutine
// per connection, requests in order, WAIT answered when its keys exist,
// and the connection closed wherever the real server closes it (a first
// request other than VALIDATE or a wrong magic, an unknown query, keys over
// 8 KiB, payloads over 8 MiB, ADD on a value that is not a decimal integer).
type fakeC10d struct {
	ln net.Listener

	mu      sync.Mutex
	data    map[string][]byte
	waiting map[string][]*fakeC10dConn // key -> connections waiting on it
	awaited map[*fakeC10dConn]int      // connection -> keys it still waits for
	conns   map[*fakeC10dConn]bool
	wg      sync.WaitGroup
}

type fakeC10dConn struct {
	c   net.Conn
	wmu sync.Mutex
}

func (fc *fakeC10dConn) write(b []byte) {
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	fc.c.Write(b)
}

// startFakeC10d serves on loopback (addr "" picks a port) until the test ends.
func startFakeC10d(t *testing.T, addr string) *fakeC10d {
	t.Helper()
	s, err := tryFakeC10d(t, addr)
	require.NoError(t, err)
	return s
}

// tryFakeC10d is startFakeC10d that returns the listen error (a fixed
// port another process took).
func tryFakeC10d(t *testing.T, addr string) (*fakeC10d, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &fakeC10d{
		ln:      ln,
		data:    map[string][]byte{},
		waiting: map[string][]*fakeC10dConn{},
		awaited: map[*fakeC10dConn]int{},
		conns:   map[*fakeC10dConn]bool{},
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fc := &fakeC10dConn{c: c}
			s.mu.Lock()
			s.conns[fc] = true
			s.mu.Unlock()
			s.wg.Add(1)
			go func() { defer s.wg.Done(); s.serve(fc) }()
		}
	}()
	t.Cleanup(s.Close)
	return s, nil
}

func (s *fakeC10d) Addr() string { return s.ln.Addr().String() }

func (s *fakeC10d) Close() {
	s.ln.Close()
	s.mu.Lock()
	for fc := range s.conns {
		fc.c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// state reports the open connections and those waiting.
func (s *fakeC10d) state() (conns, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns), len(s.awaited)
}

func (s *fakeC10d) get(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.data[key]
	return v, ok
}

func (s *fakeC10d) serve(fc *fakeC10dConn) {
	defer func() {
		fc.c.Close()
		s.mu.Lock()
		delete(s.conns, fc)
		s.clearWaitLocked(fc)
		s.mu.Unlock()
	}()
	r := bufio.NewReader(fc.c)
	u64 := func() (uint64, bool) {
		var b [8]byte
		_, err := io.ReadFull(r, b[:])
		return binary.LittleEndian.Uint64(b[:]), err == nil
	}
	vec := func(limit uint64) ([]byte, bool) {
		n, ok := u64()
		if !ok || n > limit {
			return nil, false
		}
		b := make([]byte, n)
		_, err := io.ReadFull(r, b)
		return b, err == nil
	}
	key := func() (string, bool) { b, ok := vec(C10dMaxKeyLen); return string(b), ok }
	keys := func() ([]string, bool) {
		n, ok := u64()
		if !ok || n > 128<<10 {
			return nil, false
		}
		ks := make([]string, n)
		for i := range ks {
			if ks[i], ok = key(); !ok {
				return nil, false
			}
		}
		return ks, true
	}
	reply := func(b ...byte) { fc.write(b) }
	replyVec := func(v []byte) { fc.write(appendC10dBytes(nil, v)) }
	replyI64 := func(n int64) { fc.write(binary.LittleEndian.AppendUint64(nil, uint64(n))) }

	q, err := r.ReadByte()
	if err != nil || q != c10dValidate {
		return
	}
	var m [4]byte
	if _, err := io.ReadFull(r, m[:]); err != nil || binary.LittleEndian.Uint32(m[:]) != c10dMagic {
		return
	}
	for {
		q, err := r.ReadByte()
		if err != nil {
			return
		}
		switch q {
		case c10dPing:
			if _, err := io.ReadFull(r, m[:]); err != nil {
				return
			}
			reply(m[:]...)
		case c10dSet:
			k, ok := key()
			v, ok2 := vec(C10dMaxValueLen)
			if !ok || !ok2 {
				return
			}
			s.mu.Lock()
			s.setLocked(k, v)
			s.mu.Unlock()
		case c10dCompareSet:
			k, ok := key()
			exp, ok2 := vec(C10dMaxValueLen)
			des, ok3 := vec(C10dMaxValueLen)
			if !ok || !ok2 || !ok3 {
				return
			}
			s.mu.Lock()
			cur, exists := s.data[k]
			res := cur
			switch {
			case !exists && len(exp) == 0:
				s.setLocked(k, des)
				res = des
			case !exists:
				res = exp
			case bytes.Equal(cur, exp):
				s.setLocked(k, des)
				res = des
			}
			s.mu.Unlock()
			replyVec(res)
		case c10dGet:
			k, ok := key()
			if !ok {
				return
			}
			v, _ := s.get(k)
			replyVec(v)
		case c10dAdd:
			k, ok := key()
			d, ok2 := u64()
			if !ok || !ok2 {
				return
			}
			s.mu.Lock()
			n := int64(d)
			if cur, exists := s.data[k]; exists {
				old, err := strconv.ParseInt(string(cur), 10, 64)
				if err != nil { // std::stoll throws: the server closes the connection
					s.mu.Unlock()
					return
				}
				n += old
			}
			s.setLocked(k, []byte(strconv.FormatInt(n, 10)))
			s.mu.Unlock()
			replyI64(n)
		case c10dCheck:
			ks, ok := keys()
			if !ok {
				return
			}
			s.mu.Lock()
			ready := s.allLocked(ks)
			s.mu.Unlock()
			if ready {
				reply(0)
			} else {
				reply(1)
			}
		case c10dWait:
			ks, ok := keys()
			if !ok {
				return
			}
			s.mu.Lock()
			if s.allLocked(ks) {
				s.mu.Unlock()
				reply(c10dStopWaiting)
				continue
			}
			n := 0
			for _, k := range ks {
				if _, ok := s.data[k]; !ok {
					s.waiting[k] = append(s.waiting[k], fc)
					n++
				}
			}
			s.awaited[fc] = n
			s.mu.Unlock()
		case c10dGetNumKeys:
			s.mu.Lock()
			n := len(s.data)
			s.mu.Unlock()
			replyI64(int64(n))
		case c10dDeleteKey:
			k, ok := key()
			if !ok {
				return
			}
			s.mu.Lock()
			_, exists := s.data[k]
			delete(s.data, k)
			s.mu.Unlock()
			if exists {
				replyI64(1)
			} else {
				replyI64(0)
			}
		case c10dCancelWait:
			s.mu.Lock()
			s.clearWaitLocked(fc)
			s.mu.Unlock()
			reply(1) // WAIT_CANCELED
		default:
			return
		}
	}
}

func (s *fakeC10d) allLocked(ks []string) bool {
	for _, k := range ks {
		if _, ok := s.data[k]; !ok {
			return false
		}
	}
	return true
}

func (s *fakeC10d) setLocked(k string, v []byte) {
	s.data[k] = v
	for _, fc := range s.waiting[k] {
		s.awaited[fc]--
		if s.awaited[fc] == 0 {
			delete(s.awaited, fc)
			fc.write([]byte{c10dStopWaiting})
		}
	}
	delete(s.waiting, k)
}

func (s *fakeC10d) clearWaitLocked(fc *fakeC10dConn) {
	if _, ok := s.awaited[fc]; !ok {
		return
	}
	delete(s.awaited, fc)
	for k, list := range s.waiting {
		out := list[:0]
		for _, w := range list {
			if w != fc {
				out = append(out, w)
			}
		}
		if len(out) == 0 {
			delete(s.waiting, k)
		} else {
			s.waiting[k] = out
		}
	}
}

// dialFakeC10d starts a fake server and dials it.
func dialFakeC10d(t *testing.T) (*fakeC10d, *C10dClient) {
	t.Helper()
	s := startFakeC10d(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := DialC10d(ctx, s.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return s, c
}
