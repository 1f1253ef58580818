//go:build !linux

package netbed

import (
	"context"
	"errors"
	"log/slog"
)

var errNotLinux = &MissingError{Flag: "nic-gbit", Feature: "Linux network namespaces (this is not Linux)"}

// Testbed needs Linux.
type Testbed struct{ plan Plan }

// Setup fails outside Linux.
func Setup(context.Context, Spec, *slog.Logger) (*Testbed, error) { return nil, errNotLinux }

// Plan returns what was built.
func (t *Testbed) Plan() Plan { return t.plan }

// Run fails outside Linux.
func (t *Testbed) Run(int, func() error) error { return errors.New("testbed: not built") }

// Counters fails outside Linux.
func (t *Testbed) Counters() ([]MachineCounters, error) { return nil, errors.New("testbed: not built") }

// Close does nothing outside Linux.
func (t *Testbed) Close() error { return nil }

func probeKernel(Spec) error { return errNotLinux }
