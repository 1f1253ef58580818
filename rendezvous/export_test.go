package rendezvous

import "testing"

// StartFakeC10dForTest serves the in-test c10d TCPStore (c10d_fake_test.go)
// on addr ("" picks a port) until t ends, for the external tests: it
// returns the address and a func that reads a raw server key.
func StartFakeC10dForTest(t *testing.T, addr string) (string, func(key string) ([]byte, bool)) {
	s := startFakeC10d(t, addr)
	return s.Addr(), s.get
}
