//go:build !cgo || fairgo_nonvml

package topology

import "fmt"

// OpenNVML reports ErrNoNVML: this build has no cgo, which go-nvml needs.
func OpenNVML() (NVML, error) {
	return nil, fmt.Errorf("%w: built without cgo", ErrNoNVML)
}
