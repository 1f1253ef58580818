// Package topology finds out who is where: each rank publishes its machine
// identity and device through a rendezvous store, and every rank computes the
// same M × D grid, its own machine and local index, and the ranks of each
// machine and each rail.
//
// Machines are ordered by the smallest global rank on each, and ranks within
// a machine by global rank, so any global rank order (contiguous, round-robin
// or shuffled) gives one well-defined grid.
package topology
