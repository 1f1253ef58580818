// Package hier is fairgo's public API: a Reducer runs allreduce,
// reduce-scatter and all-gather in two levels (NVLink inside a machine, rail
// all-to-all between machines), cut into slices that overlap in a five-stage
// pipeline of streams, with flat Broadcast and AllToAll(v) on the side.
//
// # The pipeline
//
// Ranks form a grid of M machines × D devices. A slice of n elements is
// viewed as [D][M][shard]; device d of machine m runs five stages, each on
// its own stream, handing over to the next with an event:
//
//	1 reduce-scatter  intra-machine  slot [d] gets the machine's sum of its M shards
//	2 collect         rail           shard [d][k] goes to machine k
//	3 add             (kernel)       the M received shards are reduced into [d][m]
//	4 diffuse         rail           shard [d][m] goes back to every machine
//	5 all-gather      intra-machine  every device gets the whole slice
//
// M = 1 is one flat allreduce; D = 1 skips stages 1 and 5 and receives into
// a ring of staging slots; M = D = 1 is a no-op. Calls smaller than the flat
// threshold are one flat allreduce on the world communicator. Elements that
// do not fill the grid ride in a padding slot through the same calls.
//
// # Calls and their order
//
// Every call returns a *Work at once. A Reducer owns one goroutine that
// enqueues the device work of its calls in the order the calls arrived; every
// rank must make the same calls in the same order, as with NCCL. Calls on
// overlapping memory are ordered on the device; calls on disjoint memory
// overlap. Errors are values: invalid input completes the Work with an error
// wrapping fairgo.ErrInvalidArgument before anything is enqueued.
package hier
