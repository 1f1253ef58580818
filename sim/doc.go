// Package sim is an in-process simulated cluster of M machines × D devices
// whose streams, events, memory and communicators behave like CUDA's and
// NCCL's (asynchronous, ordered, event-chained, matched by per-communicator
// sequence, rounded like a ring), so that fairgo's engine runs and is tested
// without GPUs. It is a faithful model rather than a mock: under
// Config.Jitter a missing event wait shows up as a wrong result, an
// out-of-bounds access fails as an illegal address, and collectives enqueued
// in inconsistent orders fail with a *MismatchError or *StallError instead of
// hanging. Under Config.ConnectAtFirstCall a communicator's first
// collective holds its caller until every rank has made one, as NCCL's
// connection at first use does.
package sim
