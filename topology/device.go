package topology

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/fairgo/fairgo"
)

// EnvVisibleDevices is CUDA's device mask.
const EnvVisibleDevices = "CUDA_VISIBLE_DEVICES"

// EnvDeviceID, when set, is the device's identity within its machine,
// whatever GPU it is: ranks that share one GPU but must count as devices of
// their own (fairrun sets it when it emulates machines of more ranks than
// it has GPUs) each set a different value. Set it for one rank per
// process: a process that drives several GPUs would give all of them the
// same identity, which Build refuses.
const EnvDeviceID = "FAIRGO_DEVICE_ID"

// MaxDeviceIDLen bounds the length of FAIRGO_DEVICE_ID.
const MaxDeviceIDLen = 256

// Device sources: where a Device's facts came from.
const (
	SourceNVML    = "nvml"                 // NVML answered
	SourceVisible = "CUDA_VISIBLE_DEVICES" // NVML unavailable; the mask named the device
	SourceOrdinal = "ordinal"              // NVML unavailable, no mask: the CUDA ordinal is the physical index
	// SourceExplicit prefixes the source of the facts when the identity
	// came from FAIRGO_DEVICE_ID: "FAIRGO_DEVICE_ID+nvml".
	SourceExplicit = EnvDeviceID + "+"
)

// Device is what a rank knows about its GPU.
type Device struct {
	// ID identifies the device within its machine: FAIRGO_DEVICE_ID when
	// set, else the GPU UUID when known, else "cuda:N" with N the physical
	// index (or the mask entry as given).
	ID string `json:"id"`
	// Index is the physical (NVML, PCI-ordered) index, or -1 when unknown.
	Index       int      `json:"index"`
	UUID        string   `json:"uuid,omitempty"`
	PCIBusID    string   `json:"pci,omitempty"`
	NVLinkPeers []string `json:"nvlink,omitempty"` // PCI bus ids at the far end of active NVLinks, one per link
	// Source says where the facts came from (SourceNVML, SourceVisible,
	// SourceOrdinal), prefixed with SourceExplicit when ID came from
	// FAIRGO_DEVICE_ID.
	Source string `json:"source"`
}

// ExplicitID reports whether the device's identity came from
// FAIRGO_DEVICE_ID rather than from the GPU.
func (d Device) ExplicitID() bool { return strings.HasPrefix(d.Source, SourceExplicit) }

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

// ExplicitDeviceID reads FAIRGO_DEVICE_ID through lookup: its value
// without surrounding blanks, and whether it is set (an empty value counts
// as unset). A value with blanks or control characters inside, or longer
// than MaxDeviceIDLen bytes, is an error wrapping fairgo.ErrInvalidArgument.
func ExplicitDeviceID(lookup func(string) (string, bool)) (string, bool, error) {
	v, ok := lookup(EnvDeviceID)
	v = strings.TrimSpace(v)
	if !ok || v == "" {
		return "", false, nil
	}
	bad := func(reason string) (string, bool, error) {
		return "", false, &fairgo.ArgError{Arg: EnvDeviceID, Value: strconv.Quote(v), Reason: reason}
	}
	if len(v) > MaxDeviceIDLen {
		return bad(fmt.Sprintf("longer than %d bytes", MaxDeviceIDLen))
	}
	if strings.IndexFunc(v, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return bad("contains blanks or control characters")
	}
	return v, true, nil
}

// DescribeDevice describes the device of CUDA ordinal ordinal in this
// process: it maps the ordinal through CUDA_VISIBLE_DEVICES to a physical
// device, then asks nv (nil: no NVML). Without NVML, or when NVML does not
// know the device, the facts come from the mask or the ordinal and Source
// says so. CUDA's ordinal order is taken to be the PCI order, as NVML's is
// (set CUDA_DEVICE_ORDER=PCI_BUS_ID to make sure).
//
// With FAIRGO_DEVICE_ID set, ID is its value and Source starts with
// SourceExplicit; the physical facts (index, UUID, PCI bus id, NVLinks)
// are described all the same.
func DescribeDevice(ordinal int, lookup func(string) (string, bool), nv NVML) (Device, error) {
	id, explicit, err := ExplicitDeviceID(lookup)
	if err != nil {
		return Device{}, err
	}
	d, err := describePhysical(ordinal, lookup, nv)
	if err != nil {
		return Device{}, err
	}
	if explicit {
		d.ID, d.Source = id, SourceExplicit+d.Source
	}
	return d, nil
}

// describePhysical is DescribeDevice without FAIRGO_DEVICE_ID.
func describePhysical(ordinal int, lookup func(string) (string, bool), nv NVML) (Device, error) {
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
