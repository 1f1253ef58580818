//go:build cgo && !fairgo_nonvml

package topology

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// OpenNVML loads NVML (libnvidia-ml.so.1) and initializes it. The error wraps
// ErrNoNVML when the library is missing or fails to initialize. Close it
// when done.
func OpenNVML() (NVML, error) {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: init: %v", ErrNoNVML, ret)
	}
	return &nvmlLib{lib: lib}, nil
}

type nvmlLib struct{ lib nvml.Interface }

func (n *nvmlLib) Close() error {
	if ret := n.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("topology: NVML shutdown: %v", ret)
	}
	return nil
}

func (n *nvmlLib) DeviceByIndex(i int) (Device, error) {
	dev, ret := n.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("topology: NVML device %d: %v", i, ret)
	}
	return describe(dev, i)
}

func (n *nvmlLib) DeviceByUUID(uuid string) (Device, error) {
	dev, ret := n.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("topology: NVML device %s: %v", uuid, ret)
	}
	idx, ret := dev.GetIndex()
	if ret != nvml.SUCCESS {
		idx = -1
	}
	return describe(dev, idx)
}

func busID(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return strings.ToLower(string(b))
}

// describe reads the cheap facts: UUID, PCI bus id, and the far end of
// every active NVLink.
func describe(dev nvml.Device, idx int) (Device, error) {
	d := Device{Index: idx}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("topology: NVML device %d UUID: %v", idx, ret)
	}
	d.UUID = uuid
	if p, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
		d.PCIBusID = busID(p)
	}
	for link := range nvml.NVLINK_MAX_LINKS {
		st, ret := dev.GetNvLinkState(link)
		if ret != nvml.SUCCESS {
			break // no NVLink, or no more links
		}
		if st != nvml.FEATURE_ENABLED {
			continue
		}
		if p, ret := dev.GetNvLinkRemotePciInfo(link); ret == nvml.SUCCESS {
			d.NVLinkPeers = append(d.NVLinkPeers, busID(p))
		}
	}
	return d, nil
}
