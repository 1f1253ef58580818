// Package shm maps a file into memory that the processes of one machine,
// and the goroutines of one process, share as 64-bit words. It is the
// medium of checks and flags that must cost a store and a load, not a
// system call or a collective.
//
// The words are meant for sync/atomic: a writer that stores a word last
// with atomic.StoreUint64 publishes the words it stored before to a reader
// that loads it with atomic.LoadUint64.
package shm

import (
	"errors"
	"fmt"
)

// ErrSize reports a file whose size is not the size the caller expects: a
// region of another job, or of another layout.
var ErrSize = errors.New("shm: the file is not of the expected size")

// Region is one mapping of a shared file. Close unmaps it; Remove unlinks
// the file, which the mappings outlive.
type Region struct {
	path  string
	mem   []byte
	words []uint64
}

// Path is the file the region maps.
func (r *Region) Path() string { return r.path }

// Words is the region as 64-bit words, zero when Create made it. Read and
// write words other goroutines or processes share only with sync/atomic.
func (r *Region) Words() []uint64 { return r.words }

// Create makes a new file at path (it must not exist) of words 64-bit
// words, zeroed, readable and writable by its owner only, and maps it.
func Create(path string, words int) (*Region, error) {
	if words <= 0 {
		return nil, fmt.Errorf("shm: a region of %d words", words)
	}
	return mapFile(path, words, true)
}

// Open maps the existing file at path, which must hold exactly words
// 64-bit words (ErrSize otherwise).
func Open(path string, words int) (*Region, error) {
	if words <= 0 {
		return nil, fmt.Errorf("shm: a region of %d words", words)
	}
	return mapFile(path, words, false)
}
