package rendezvous

import "testing"

// StartFakeC10dForTest serves the in-test c10d TCPStore (c10d_fake_test.go)
// on addr ("" picks a port) until t ends, for the external tests: it
// returns the address and a func that reads a raw server key.
func StartFakeC10dForTest(t *testing.T, addr string) (string, func(key string) ([]byte, bool)) {
	s := startFakeC10d(t, addr)
	return s.Addr(), s.get
}

// TryFakeC10dForTest is StartFakeC10dForTest that returns the listen
// error instead of failing the test (a fixed port another process took).
func TryFakeC10dForTest(t *testing.T, addr string) (func(key string) ([]byte, bool), error) {
	s, err := tryFakeC10d(t, addr)
	if err != nil {
		return nil, err
	}
	return s.get, nil
}
