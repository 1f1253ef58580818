// Package rendezvous is how the ranks of a job find each other: a key-value
// Store with blocking reads (in memory, or served over TCP by the launcher),
// and helpers that read the launch environment of torchrun, Slurm and Open MPI.
//
// Every blocking call takes a context and returns ctx.Err() unchanged when it
// ends; values are opaque bytes except for Add's counters, which are decimal
// integers as in PyTorch's c10d stores.
package rendezvous
