// Package bench is fairgo's benchmark harness: it times fairgo's two-level
// allreduce against the flat NCCL allreduce on the world communicator and
// against the naive hierarchy a user would write by hand (reduce-scatter
// inside the machine, allreduce on the rail, all-gather inside the machine,
// all on one stream), in the same processes and on the same buffers, the
// three alternating for every size. Command fairbench (bench/cmd/fairbench)
// drives it and prints an nccl-tests-like table.
//
// # Modes
//
//   - sweep: one transfer at a time over a range of sizes (fairring's
//     microbenchmark 1).
//   - overlap: K buckets of B bytes enqueued back to back, for each of a
//     list of parallelism settings (microbenchmark 2).
//   - scale: the same sizes over a list of machine counts; on GPUs through
//     fairrun --emulate-machines (microbenchmark 3).
//   - links: a 2-rank allreduce over one NVLink pair and one network pair,
//     the inputs of the cost model in bench/model.
//
// # Backends
//
// A Testbed holds the ranks this process drives. The sim testbed runs every
// rank of a simulated cluster in this process: its timings are wall clock
// on the host, not GPU timings, and say so. Builds with the cuda tag add a
// testbed over the local GPUs in one process and one for a rank per process
// under a launcher; both time with CUDA events.
//
// # Measurement
//
// For every size each algorithm first runs once on inputs that are a pure
// function of (seed, world rank, index), and every rank compares its result
// with a float64 reference (-check). Then, after warm-up, each repetition
// times Iters back-to-back calls of each algorithm in turn on every rank; a
// repetition's time is the mean over ranks of the per-call time (as
// nccl-tests reports it) and the table shows the median over repetitions and
// its spread. busbw = algbw · 2(n−1)/n, nccl-tests' definition.
package bench
