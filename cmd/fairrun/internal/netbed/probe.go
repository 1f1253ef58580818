package netbed

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrUnavailable is wrapped by every error saying that this process or this
// kernel cannot build the testbed.
var ErrUnavailable = errors.New("testbed: emulated NICs unavailable")

// MissingError says what is missing to build the testbed: a capability of
// this process or a feature of the kernel. It wraps ErrUnavailable and the
// system's answer, if any.
type MissingError struct {
	Flag       string // the flag that asked for it, e.g. "nic-gbit"
	Capability string // e.g. "CAP_NET_ADMIN"; "" for a kernel feature
	Feature    string // e.g. "the tbf qdisc (CONFIG_NET_SCH_TBF, module sch_tbf)"
	Err        error
}

func (e *MissingError) Error() string {
	var s string
	if e.Capability != "" {
		s = fmt.Sprintf("fairrun: --%s needs %s (run as root)", e.Flag, e.Capability)
	} else {
		s = fmt.Sprintf("fairrun: --%s: kernel lacks %s", e.Flag, e.Feature)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns ErrUnavailable and the system's answer.
func (e *MissingError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrUnavailable}
	}
	return []error{ErrUnavailable, e.Err}
}

// Capability bits (linux/capability.h).
const (
	CapNetAdmin = 12
	CapSysAdmin = 21
)

// Prober checks, before anything is created or started, that the testbed
// can be built here. Its zero value checks this process and this kernel.
type Prober struct {
	// EffectiveCaps returns the effective capability set of this process;
	// nil reads CapEff of the calling thread from /proc/thread-self/status
	// (capabilities are per thread; all of fairrun's threads have the
	// same).
	EffectiveCaps func() (uint64, error)
	// Kernel checks the kernel features spec needs; nil tries each of them
	// in a scratch network namespace that vanishes afterwards.
	Kernel func(Spec) error
}

// Check returns nil when spec's testbed can be built, else a *MissingError
// naming the first thing missing.
func (p Prober) Check(spec Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	caps := p.EffectiveCaps
	if caps == nil {
		caps = procEffectiveCaps
	}
	eff, err := caps()
	if err != nil {
		return &MissingError{
			Flag:       "nic-gbit",
			Capability: "CAP_NET_ADMIN and CAP_SYS_ADMIN",
			Err:        fmt.Errorf("reading the capabilities: %w", err),
		}
	}
	for _, c := range []struct {
		bit  uint
		name string
	}{{CapNetAdmin, "CAP_NET_ADMIN"}, {CapSysAdmin, "CAP_SYS_ADMIN"}} {
		if eff&(1<<c.bit) == 0 {
			return &MissingError{Flag: "nic-gbit", Capability: c.name}
		}
	}
	kernel := p.Kernel
	if kernel == nil {
		kernel = probeKernel
	}
	return kernel(spec)
}

// procEffectiveCaps reads CapEff from /proc/thread-self/status.
func procEffectiveCaps() (uint64, error) {
	b, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		return 0, err
	}
	return parseCapEff(string(b))
}

func parseCapEff(status string) (uint64, error) {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, errors.New("no CapEff line in /proc/thread-self/status")
}
