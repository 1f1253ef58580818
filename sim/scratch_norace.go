//go:build !race || !unix

package sim

// newScratch returns n zeroed bytes and a function that releases them.
func newScratch(n int64) ([]byte, func()) { return make([]byte, n), func() {} }
