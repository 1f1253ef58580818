// Package topology finds out who is where: each rank publishes its machine
// identity and device through a rendezvous store, and every rank computes the
// same M × D grid, its own machine and local index, and the ranks of each
// machine and each rail.
//
// Machines are ordered by the smallest global rank on each, and ranks within
// a machine by global rank, so any global rank order (contiguous, round-robin
// or shuffled) gives one well-defined grid.
//
// A machine is known by FAIRGO_MACHINE_ID, else NCCL_HOSTID, else its
// hostname and boot id; a device within its machine by FAIRGO_DEVICE_ID,
// else its GPU (UUID, else index). Two ranks of one machine that claim one
// device are refused (DuplicateDeviceError): ranks that share a GPU count as
// devices of their own only with identities of their own in
// FAIRGO_DEVICE_ID, set on every rank of their machine.
package topology
