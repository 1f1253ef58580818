package netbed

import (
	"errors"
	"fmt"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Kernel features, as MissingError names them.
const (
	featureNetNS  = "network namespaces (CONFIG_NET_NS)"
	featureBridge = "the bridge device (CONFIG_BRIDGE, module bridge)"
	featureVeth   = "the veth device (CONFIG_VETH, module veth)"
	featureTbf    = "the tbf qdisc (CONFIG_NET_SCH_TBF, module sch_tbf)"
	featureNetem  = "the netem qdisc (CONFIG_NET_SCH_NETEM, module sch_netem)"
)

// The flags that ask for what the testbed builds, as MissingError names
// them.
const (
	flagNIC      = "nic-gbit"
	flagLatency  = "nic-latency"
	flagLoopback = "nvlink-gbit"
)

// probeKernel builds a bridge, a veth pair and the qdiscs of spec (on the
// veth, and on lo when spec shapes it) in a scratch network namespace,
// which vanishes with everything in it when its handle is closed.
func probeKernel(spec Spec) error {
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return &MissingError{Flag: "nic-gbit", Feature: featureNetNS, Err: err}
	}
	ns, err := newNetNS()
	if err != nil {
		return nsErr(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("testbed: netlink in a scratch namespace: %w", err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "probe-br"}}); err != nil {
		return linkErr("bridge", "probe-br", featureBridge, err)
	}
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "probe-a"}, PeerName: "probe-b"}); err != nil {
		return linkErr("veth", "probe-a", featureVeth, err)
	}
	link, err := h.LinkByName("probe-a")
	if err != nil {
		return fmt.Errorf("testbed: probe: %w", err)
	}
	if err := addQdiscs(h, link, ShapingFor(spec.Gbit, spec.Latency, spec.Queue), spec.Latency > 0, flagNIC); err != nil {
		return err
	}
	if spec.LoopbackGbit == 0 {
		return nil
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("testbed: probe: lo: %w", err)
	}
	return addQdiscs(h, lo, ShapingFor(spec.LoopbackGbit, 0, spec.Queue), false, flagLoopback)
}

// linkErr explains a failure to create a link: a kernel without that kind
// of link answers EOPNOTSUPP.
func linkErr(kind, name, feature string, err error) error {
	switch {
	case errors.Is(err, unix.EOPNOTSUPP):
		return &MissingError{Flag: "nic-gbit", Feature: feature, Err: err}
	case errors.Is(err, unix.EPERM):
		return &MissingError{Flag: "nic-gbit", Capability: "CAP_NET_ADMIN", Err: err}
	}
	return fmt.Errorf("testbed: create %s %s: %w", kind, name, err)
}

// qdiscErr explains a failure to add a qdisc that flag asked for: a kernel
// without that qdisc answers ENOENT.
func qdiscErr(flag, kind, link, feature string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.EOPNOTSUPP):
		return &MissingError{Flag: flag, Feature: feature, Err: err}
	case errors.Is(err, unix.EPERM):
		return &MissingError{Flag: flag, Capability: "CAP_NET_ADMIN", Err: err}
	}
	return fmt.Errorf("testbed: add %s qdisc on %s: %w", kind, link, err)
}

// nsErr explains a failure to create a network namespace.
func nsErr(err error) error {
	switch {
	case errors.Is(err, unix.EPERM):
		return &MissingError{Flag: "nic-gbit", Capability: "CAP_SYS_ADMIN", Err: err}
	case errors.Is(err, unix.EINVAL):
		return &MissingError{Flag: "nic-gbit", Feature: featureNetNS, Err: err}
	}
	return fmt.Errorf("testbed: create a network namespace: %w", err)
}
