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
// M = 1 has no pipeline; D = 1 skips stages 1 and 5 and receives into a
// ring of staging slots; M = D = 1 is a no-op. Calls smaller than the flat
// threshold are one flat allreduce on the world communicator. Elements that
// do not fill the grid ride in a padding slot through the same calls.
//
// # Algorithms, and how Auto chooses
//
// An allreduce follows one of these (Algorithm, WithAlgorithm):
//
//	flat              one NCCL allreduce on the world communicator, NCCL's choice of algorithm
//	flat-ring         the same on a world communicator where NCCL runs its ring only
//	flat-tree         the same with NCCL's tree only
//	halving-doubling  fairgo's own: recursive halving reduce-scatter, recursive doubling
//	                  all-gather over the world, 2·log2(W) pairwise steps (+2 where W is
//	                  not a power of two)
//	recursive-doubling  fairgo's own: log2(W) pairwise exchanges of the whole call
//	                  (+2 where W is not a power of two); only by WithAlgorithm
//	rail-allreduce    the hierarchy in one piece: intra reduce-scatter, rail allreduce,
//	                  intra all-gather
//	rail-rsag         the pipeline above, the rail done by NCCL's reduce-scatter and all-gather
//	rail-a2a          the pipeline above with fairring's all-to-all rail
//
// flat-ring and flat-tree need a backend that makes world variants
// (backend.Rank.Variants); each costs one ncclCommSplit of the world when
// first used and NCCL buffers of the order of the world communicator's
// while kept.
//
// Auto, the default, is flat below the flat threshold (64 KiB unless
// WithFlatThreshold says otherwise). From there calls fall into size
// classes, powers of two up to 64 MiB; the first call of a class times the
// candidates at that call's size (1.5 times the class's smallest for the
// last class, or where the ranks' first calls differ) on the job's own
// links, every rank takes the slowest rank's time of each (the fastest
// rank's for a call alone, which early ranks spend waiting for late ones),
// and all ranks choose alike. The candidates: flat, flat-ring and flat-tree (where the backend
// makes world variants), halving-doubling (from 4 ranks, classes up to
// 4 MiB), rail-allreduce (D > 1), rail-a2a (D = 1) and rail-rsag in the
// links' slices (D > 1, where they cut the call) and, from 4 MiB, in four
// times as many (Choice.Fine), whatever the grid: one
// device per machine and one machine included. A class with one candidate
// takes it without measuring. World variants are made at the first
// calibration that has them as candidates and closed once every class is
// measured and none chose them. Choices and ChoiceFor report what each
// class measured and what it cost (Calibration).
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
