//go:build fairgo_sim && !cuda

package main

import (
	"fmt"
	"sync"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/cmd/libfairgo/internal/capi"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/sim"
	"github.com/fairgo/fairgo/streams"
)

// simBackend runs the library on the simulated cluster (build tag
// fairgo_sim), to test callers of the C ABI without a GPU. Stream handle 0
// is a stream of the device made on first use; no other handle exists.
type simBackend struct {
	*sim.Backend
	mu      sync.Mutex
	streams map[hier.Device]streams.Stream
}

func (b *simBackend) ForeignStream(dev hier.Device, handle uintptr) (streams.Stream, error) {
	if handle != 0 {
		return nil, &fairgo.ArgError{Arg: "stream", Value: fmt.Sprintf("%#x", handle), Reason: "the simulated library knows only stream 0"}
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
		Backend: &simBackend{Backend: sim.NewBackend(sim.Config{}), streams: map[hier.Device]streams.Stream{}},
		Classes: capi.Classes{
			Mismatch: []error{sim.ErrMismatch},
			Backend:  []capi.Class{capi.Is(sim.ErrStall, capi.Timeout)},
		},
	}
}
