package topology

import (
	"fmt"
	"os"
	"strings"

	"github.com/fairgo/fairgo/rendezvous"
)

// Environment variables that name the machine.
const (
	// EnvMachineID overrides the machine identity (fairrun sets it for
	// emulated machines).
	EnvMachineID = "FAIRGO_MACHINE_ID"
	// EnvNCCLHostID is NCCL's host identity; fairgo follows it when set so
	// that fairgo and NCCL agree on which ranks share a machine.
	EnvNCCLHostID = "NCCL_HOSTID"
)

// BootIDPath is where Linux keeps the identity of the current boot.
const BootIDPath = "/proc/sys/kernel/random/boot_id"

// Host is the process's view of its machine: the environment, the hostname
// and files. Nil fields mean the operating system's (os.LookupEnv,
// os.Hostname, os.ReadFile); tests substitute their own.
type Host struct {
	Lookup   rendezvous.LookupFunc
	Hostname func() (string, error)
	ReadFile func(name string) ([]byte, error)
}

// rawLookup reads a variable as it is (an empty value counts as set).
func (h Host) rawLookup(name string) (string, bool) {
	if h.Lookup == nil {
		return os.LookupEnv(name)
	}
	return h.Lookup(name)
}

// lookup reads a variable; empty counts as unset.
func (h Host) lookup(name string) (string, bool) {
	v, ok := h.rawLookup(name)
	v = strings.TrimSpace(v)
	return v, ok && v != ""
}

func (h Host) hostname() (string, error) {
	if h.Hostname != nil {
		return h.Hostname()
	}
	return os.Hostname()
}

func (h Host) readFile(name string) ([]byte, error) {
	if h.ReadFile != nil {
		return h.ReadFile(name)
	}
	return os.ReadFile(name)
}

// Identity is a machine identity and where it came from.
type Identity struct {
	ID     string // equal on every process of one machine, different across machines
	Source string // EnvMachineID, EnvNCCLHostID, "hostname+boot_id" or "hostname"
}

// MachineIdentity returns this machine's identity: FAIRGO_MACHINE_ID when
// set, else NCCL_HOSTID when set, else the hostname joined with the boot id
// (so a reused hostname after a reinstall, or two containers with the same
// hostname on different hosts, still differ). Without a readable boot id it
// falls back to the hostname alone.
func MachineIdentity(h Host) (Identity, error) {
	if v, ok := h.lookup(EnvMachineID); ok {
		return Identity{ID: v, Source: EnvMachineID}, nil
	}
	if v, ok := h.lookup(EnvNCCLHostID); ok {
		return Identity{ID: v, Source: EnvNCCLHostID}, nil
	}
	name, err := h.hostname()
	if err != nil || name == "" {
		return Identity{}, fmt.Errorf(
			"topology: machine identity: no %s or %s, and no hostname: %v",
			EnvMachineID,
			EnvNCCLHostID,
			err,
		)
	}
	boot, err := h.readFile(BootIDPath)
	if b := strings.TrimSpace(string(boot)); err == nil && b != "" {
		return Identity{ID: name + "/" + b, Source: "hostname+boot_id"}, nil
	}
	return Identity{ID: name, Source: "hostname"}, nil
}
