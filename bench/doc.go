// Package bench measures allreduce methods on a testbed: flat NCCL on the
// world communicator (NCCL's choice of algorithm, its ring alone and its
// tree alone), the
// naive hierarchy a user writes by hand, and fairgo's Reducer in named
// variants, alternating in the same processes on the same buffers, and
// returns one Record per method and point. Package
// bench/report turns records into tables, CSV, plots, the cost-model report
// and the performance targets; command fairbench (bench/cmd/fairbench) drives
// both.
//
// # Methods
//
//   - flat: one NCCL allreduce on the world communicator;
//   - flat-ring: one NCCL allreduce on a world communicator of its own that
//     NCCL initialised under NCCL_ALGO=allreduce:ring (Testbed.AlgoWorld),
//     so the ring whatever NCCL would choose;
//   - flat-tree: the same with NCCL's tree (NCCL_ALGO=allreduce:tree);
//   - naive: NCCL reduce-scatter inside the machine, allreduce on the rail,
//     all-gather inside the machine, all on one stream;
//   - fairgo variants: hier.Reducer.AllReduce with the options of a Variant
//     (ParseVariant: "rsag=algo:rail-rsag,slice:64M"), each a column.
//
// fairgo's "best" is the fastest baseline measured at the point: NCCL as it
// chooses, its ring, its tree, and the hierarchy by hand, whichever wins
// there.
//
// # Measurement
//
// For every point each method first runs once on inputs that are a pure
// function of (seed, world rank, index), and every rank compares its result
// with a float64 reference (Config.Check). Then, after warm-up, each
// repetition times Iters back-to-back calls (Sweep) or one round of Buckets
// calls (Overlap) of each method in turn on every rank; a repetition's time
// is the mean over ranks of the time per call or round (as nccl-tests
// reports it), and a record holds the median over repetitions and its
// spread. busbw = algbw · 2(n−1)/n, nccl-tests' definition; IdealBusBW is
// the busbw a hierarchical allreduce bound only by one NIC per machine
// reaches.
//
// Every record carries the testbed (emulated machines, NIC rate and
// latency, MPS, namespaces, ranks per GPU, NCCL hosts, the intra-machine
// link: GPU to GPU, or loopback TCP standing in for NVLink, with its shaped
// rate) and whether flat NCCL was topology-unaware (every rank its own NCCL
// host while machines hold several ranks: NCCL's ring then runs over all
// ranks and crosses each NIC 2(W−1)/W of the data), and is marked Invalid
// when ranks of different machines shared a GPU without MPS. The sim testbed's
// timings are wall clock on the host, not GPU timings, and say so.
package bench
