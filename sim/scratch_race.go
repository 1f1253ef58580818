//go:build race && unix

package sim

import "syscall"

// offHeapMin is the smallest temporary mapped outside the Go heap: below
// it a mapping costs more than the detector's shadow.
const offHeapMin = 64 << 10

// newScratch returns n zeroed bytes and a function that releases them:
// from an anonymous mapping outside the Go heap from offHeapMin bytes on,
// which the race detector does not instrument.
func newScratch(n int64) ([]byte, func()) {
	if n < offHeapMin {
		return make([]byte, n), func() {}
	}
	b, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return make([]byte, n), func() {}
	}
	return b, func() { _ = syscall.Munmap(b) }
}
