//go:build cgo && fairgo_sim

package main

// #include "fairgo.h"
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/cmd/libfairgo/internal/capi"
	"github.com/fairgo/fairgo/sim"
	"github.com/fairgo/fairgo/streams"
)

// simBackend runs the library on the simulated cluster (build tag
// fairgo_sim), to test callers of the C ABI without a GPU. Stream handle 0
// is a stream of the device made on first use; no other handle exists.
type simBackend struct {
	*sim.Backend
	mu      sync.Mutex
	streams map[backend.Device]streams.Stream
}

func (b *simBackend) ForeignStream(dev backend.Device, handle uintptr) (streams.Stream, error) {
	if handle != 0 {
		return nil, &fairgo.ArgError{
			Arg:    "stream",
			Value:  fmt.Sprintf("%#x", handle),
			Reason: "the simulated library knows only stream 0",
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, ok := b.streams[dev]; ok {
		return s, nil
	}
	s, err := dev.NewStream()
	if err != nil {
		return nil, err
	}
	b.streams[dev] = s
	return s, nil
}

func backendConfig() capi.Config {
	return capi.Config{
		Backend: &simBackend{Backend: sim.NewBackend(sim.Config{}), streams: map[backend.Device]streams.Stream{}},
		Classes: capi.Classes{
			Mismatch: []error{sim.ErrMismatch},
			Backend:  []capi.Class{capi.Is(sim.ErrStall, capi.Timeout)},
		},
	}
}

// Test hooks of the simulated library (not in fairgo.h): device memory of a
// communicator's simulated GPU, so that callers' tests can reduce real data.

func simDevice(comm C.fairgo_comm_t) (backend.Device, error) {
	r, err := table.Reducer(int64(comm))
	if err != nil {
		return nil, err
	}
	return r.Device(), nil
}

//export fairgo_sim_alloc
func fairgo_sim_alloc(comm C.fairgo_comm_t, bytes C.int64_t, ptr *C.uint64_t) C.int {
	return result(func() error {
		d, err := simDevice(comm)
		if err != nil {
			return err
		}
		p, err := d.Alloc(int64(bytes))
		if err != nil {
			return err
		}
		*ptr = C.uint64_t(p)
		return nil
	})
}

//export fairgo_sim_upload
func fairgo_sim_upload(comm C.fairgo_comm_t, dst C.uint64_t, src unsafe.Pointer, bytes C.int64_t) C.int {
	return result(func() error {
		d, err := simDevice(comm)
		if err != nil {
			return err
		}
		return d.Upload(uintptr(dst), C.GoBytes(src, C.int(bytes)))
	})
}

//export fairgo_sim_download
func fairgo_sim_download(comm C.fairgo_comm_t, dst unsafe.Pointer, src C.uint64_t, bytes C.int64_t) C.int {
	return result(func() error {
		d, err := simDevice(comm)
		if err != nil {
			return err
		}
		return d.Download(unsafe.Slice((*byte)(dst), int(bytes)), uintptr(src))
	})
}
