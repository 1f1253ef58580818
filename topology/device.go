package topology

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fairgo/fairgo"
)

// EnvVisibleDevices is CUDA's device mask.
const EnvVisibleDevices = "CUDA_VISIBLE_DEVICES"

// Device sources: where a Device's facts came from.
const (
	SourceNVML    = "nvml"                 // NVML answered
	SourceVisible = "CUDA_VISIBLE_DEVICES" // NVML unavailable; the mask named the device
	SourceOrdinal = "ordinal"              // NVML unavailable, no mask: the CUDA ordinal is the physical index
)

// Device is what a rank knows about its GPU.
type Device struct {
	// ID identifies the device within its machine: the GPU UUID when known,
	// else "cuda:N" with N the physical index (or the mask entry as given).
	ID string `json:"id"`
	// Index is the physical (NVML, PCI-ordered) index, or -1 when unknown.
	Index       int      `json:"index"`
	UUID        string   `json:"uuid,omitempty"`
	PCIBusID    string   `json:"pci,omitempty"`
	NVLinkPeers []string `json:"nvlink,omitempty"` // PCI bus ids at the far end of active NVLinks, one per link
	Source      string   `json:"source"`
}

// NVML is the part of NVIDIA's management library that topology uses;
// OpenNVML returns the real one and tests substitute their own.
type NVML interface {
	// DeviceByIndex describes the device of physical index i.
	DeviceByIndex(i int) (Device, error)
	// DeviceByUUID describes the device with this UUID ("GPU-...").
	DeviceByUUID(uuid string) (Device, error)
	// Close releases the library.
	Close() error
}

// ErrNoNVML: NVML could not be loaded (no driver, or built without cgo).
var ErrNoNVML = errors.New("topology: NVML unavailable")

// VisibleDevices parses CUDA_VISIBLE_DEVICES: nil when unset (every device
// visible), otherwise its entries (indices, "GPU-" UUIDs or "MIG-" ids).
func VisibleDevices(lookup func(string) (string, bool)) []string {
	v, ok := lookup(EnvVisibleDevices)
	if !ok {
		return nil
	}
	out := []string{}
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// DefaultOrdinal is the CUDA device a process with this local rank uses by
// convention: 0 when CUDA_VISIBLE_DEVICES names exactly one device (the
// launcher pinned it, as fairrun --emulate-machines does), else the local
// rank.
func DefaultOrdinal(localRank int, lookup func(string) (string, bool)) int {
	if vis := VisibleDevices(lookup); len(vis) == 1 {
		return 0
	}
	return localRank
}

// DescribeDevice describes the device of CUDA ordinal ordinal in this
// process: it maps the ordinal through CUDA_VISIBLE_DEVICES to a physical
// device, then asks nv (nil: no NVML). Without NVML, or when NVML does not
// know the device, the facts come from the mask or the ordinal and Source
// says so. CUDA's ordinal order is taken to be the PCI order, as NVML's is
// (set CUDA_DEVICE_ORDER=PCI_BUS_ID to make sure).
func DescribeDevice(ordinal int, lookup func(string) (string, bool), nv NVML) (Device, error) {
	if ordinal < 0 {
		return Device{}, &fairgo.ArgError{Arg: "device ordinal", Value: ordinal, Reason: "negative"}
	}
	entry, source := strconv.Itoa(ordinal), SourceOrdinal
	if vis := VisibleDevices(lookup); vis != nil {
		if ordinal >= len(vis) {
			return Device{}, &fairgo.ArgError{Arg: "device ordinal", Value: ordinal,
				Reason: fmt.Sprintf("%s=%q names %d devices", EnvVisibleDevices, strings.Join(vis, ","), len(vis))}
		}
		entry, source = vis[ordinal], SourceVisible
	}
	idx, ierr := strconv.Atoi(entry)
	if nv != nil {
		var d Device
		var err error
		switch {
		case ierr == nil:
			d, err = nv.DeviceByIndex(idx)
		case strings.HasPrefix(entry, "GPU-"):
			d, err = nv.DeviceByUUID(entry)
		default:
			err = fmt.Errorf("NVML lookup of %q not supported", entry)
		}
		if err == nil {
			d.Source = SourceNVML
			if d.UUID != "" {
				d.ID = d.UUID
			} else {
				d.ID = "cuda:" + strconv.Itoa(d.Index)
			}
			return d, nil
		}
	}
	d := Device{Index: -1, Source: source}
	switch {
	case ierr == nil:
		d.Index, d.ID = idx, "cuda:"+entry
	case strings.HasPrefix(entry, "GPU-"):
		d.UUID, d.ID = entry, entry
	default:
		d.ID = entry
	}
	return d, nil
}
