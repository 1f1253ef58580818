/*
 * fairgo.h: the C ABI of libfairgo.so, fairgo's two-level allreduce
 * (NCCL inside a machine, the rail exchange between machines) for programs
 * that are not written in Go, such as the PyTorch DDP comm hook of
 * python/fairgo_torch.
 *
 * Build:   make libfairgo      (lib/libfairgo.so and this header next to it;
 *                               only Go is needed to build it)
 * Link:    cc ... -Ilib -Llib -lfairgo -Wl,--allow-shlib-undefined
 *          The library leaves NVML's functions (go-nvml) unresolved until
 *          NVML is loaded at run time, so it needs lazy binding: link with
 *          --allow-shlib-undefined, not with -z now, and run without
 *          LD_BIND_NOW; dlopen it with RTLD_LAZY (Python's ctypes.CDLL
 *          forces RTLD_NOW: fairgo_torch calls dlopen itself).
 * Run:     the library loads on any Linux host. The CUDA driver
 *          (libcuda.so.1, or the path in FAIRGO_CUDA_LIBRARY) is loaded
 *          with dlopen by the first fairgo_init*, and NCCL (libnccl.so.2,
 *          or FAIRGO_NCCL_LIBRARY) when the first communicator is made.
 *          Without a GPU or a driver, fairgo_init* returns
 *          FAIRGO_ERR_NO_DEVICE and fairgo_last_error() names what is
 *          missing and every path tried.
 *
 * Conventions
 *  - Every function returns a fairgo_result_t (FAIRGO_OK = 0) unless said
 *    otherwise. A Go panic inside the library is recovered and reported as
 *    FAIRGO_ERR_INTERNAL, never a crash (fatal runtime errors, such as
 *    running out of memory, still end the process).
 *  - When a function returns an error code, fairgo_last_error() gives its
 *    text on the same thread (per-thread, like errno; successful calls leave
 *    it unchanged).
 *  - Handles (fairgo_comm_t, fairgo_work_t, fairgo_store_t) are opaque
 *    positive ids handed out by the library, never pointers; 0 is never a
 *    valid handle. A closed or freed handle, or one of another kind, gives
 *    FAIRGO_ERR_BAD_HANDLE. All functions are thread-safe.
 *  - Every blocking call is bounded: by a timeout argument, by
 *    fairgo_config_t's timeouts, or by a short internal grace period.
 *  - Collectives must be called by every rank in the same order with the
 *    same count, dtype and op, as with NCCL.
 */
#ifndef FAIRGO_H
#define FAIRGO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* fairgo's version (semantic: fairgo.Version of the Go module, the
 * fairgo_torch wheel's); fairgo_version() returns the library's. */
#define FAIRGO_VERSION "0.1.0"

/* The version of this ABI; fairgo_abi_version() returns the library's. */
#define FAIRGO_ABI_VERSION 5 /* 2: fairgo_config_t.algorithm, fairgo_config_from_env, FAIRGO_ERR_NO_DEVICE;
                                3: fairgo_comm_algorithm; 4: FAIRGO_ALGORITHM_RECURSIVE_DOUBLING;
                                5: fairgo_allreduce_async, fairgo_work_stream_wait */

/* Result codes. FAIRGO_OK and FAIRGO_NOT_READY are not errors. */
typedef enum fairgo_result {
  FAIRGO_OK = 0,
  FAIRGO_NOT_READY = 1,            /* fairgo_work_wait: the timeout passed, the work goes on */
  FAIRGO_ERR_INVALID_ARGUMENT = 2, /* a bad argument, config field or launch environment */
  FAIRGO_ERR_BAD_HANDLE = 3,       /* unknown, freed or closed handle (or one of another kind) */
  FAIRGO_ERR_MISMATCH = 4,         /* ranks made different calls (where fairgo can tell) */
  FAIRGO_ERR_TIMEOUT = 5,          /* the watchdog (op_timeout_ms) or a deadline of init expired */
  FAIRGO_ERR_ABORTED = 6,          /* the communicators were aborted (a failed peer or communicator) */
  FAIRGO_ERR_CLOSED = 7,           /* the communicator was closed while the work was pending */
  FAIRGO_ERR_CUDA = 8,             /* a CUDA driver error */
  FAIRGO_ERR_NCCL = 9,             /* an NCCL error, or NCCL could not be loaded */
  FAIRGO_ERR_SYSTEM = 10,          /* anything else: the store, the network, the operating system */
  FAIRGO_ERR_INTERNAL = 11,        /* a bug in fairgo (a recovered Go panic); please report it */
  FAIRGO_ERR_NO_DEVICE = 12        /* no GPU or no GPU driver on this host (the text says what is missing) */
} fairgo_result_t;

/* Element types; the values are fairgo.DType's. */
typedef enum fairgo_dtype {
  FAIRGO_FLOAT16 = 1,
  FAIRGO_BFLOAT16 = 2,
  FAIRGO_FLOAT32 = 3,
  FAIRGO_FLOAT64 = 4,
  FAIRGO_INT8 = 5,
  FAIRGO_UINT8 = 6,
  FAIRGO_INT32 = 7,
  FAIRGO_UINT32 = 8,
  FAIRGO_INT64 = 9,
  FAIRGO_UINT64 = 10
} fairgo_dtype_t;

/* Reduction operators; the values are fairgo.Op's. FAIRGO_AVG is the sum
 * divided by the number of ranks (integers: truncated toward zero, as
 * ncclAvg); 16-bit floats accumulate in float32. */
typedef enum fairgo_op {
  FAIRGO_SUM = 1,
  FAIRGO_AVG = 2,
  FAIRGO_MAX = 3,
  FAIRGO_MIN = 4,
  FAIRGO_PROD = 5
} fairgo_op_t;

/* How an allreduce crosses the machines; the values are hier.Algorithm's. */
typedef enum fairgo_algorithm {
  FAIRGO_ALGORITHM_AUTO = 0,     /* measure the others for each size class and take the fastest (default) */
  FAIRGO_ALGORITHM_FLAT = 1,     /* one NCCL allreduce over all ranks */
  FAIRGO_ALGORITHM_RAIL_A2A = 2, /* fairring's pipeline: all-to-all on the rail and a reduction kernel */
  FAIRGO_ALGORITHM_RAIL_RSAG = 3, /* the same pipeline with NCCL's reduce-scatter and all-gather on the rail */
  FAIRGO_ALGORITHM_RAIL_ALLREDUCE = 4, /* the hierarchy in one piece: intra reduce-scatter, rail allreduce, intra all-gather */
  FAIRGO_ALGORITHM_FLAT_RING = 5,      /* one NCCL allreduce on a world communicator where NCCL runs its ring only */
  FAIRGO_ALGORITHM_FLAT_TREE = 6,      /* the same with NCCL's tree only */
  FAIRGO_ALGORITHM_HALVING_DOUBLING = 7, /* recursive halving then doubling over all ranks, for small calls on many */
  FAIRGO_ALGORITHM_RECURSIVE_DOUBLING = 8 /* log2(ranks) exchanges of the whole call: the smallest calls on many ranks */
} fairgo_algorithm_t;

typedef int64_t fairgo_comm_t;  /* a communicator: this process's rank of the job */
typedef int64_t fairgo_work_t;  /* one collective call in flight */
typedef int64_t fairgo_store_t; /* a rendezvous store served by this process */

/* Settings of a communicator. Call fairgo_config_init first, then
 * fairgo_config_from_env to take the settings of the environment, then
 * change fields; struct_size tells the library which version of the struct
 * it got (a version 1 struct, which ends before algorithm, is still
 * accepted). Passing NULL instead of a config means the defaults with the
 * environment's settings applied.
 *
 * Each setting has three spellings, the same as in fairgo_torch.init():
 *
 *   environment                  fairgo_torch.init()    fairgo_config_t
 *   FAIRGO_ALGORITHM             algorithm              algorithm
 *   FAIRGO_SLICE_BYTES           slice_bytes            slice_bytes
 *   FAIRGO_FLAT_THRESHOLD_BYTES  flat_threshold_bytes   flat_threshold_bytes
 *   FAIRGO_TIMEOUT               timeout                op_timeout_ms
 *   FAIRGO_INIT_TIMEOUT          init_timeout           init_timeout_ms
 *   FAIRGO_DEVICE                device                 device
 *
 * In the environment, algorithms are named auto, flat, rail-a2a,
 * rail-rsag, rail-allreduce, flat-ring, flat-tree, halving-doubling and
 * recursive-doubling;
 * sizes are bytes with an optional K, M or
 * G (binary) suffix; timeouts are seconds or Go durations ("90s", "10m").
 * fairgo_init judges the values (a bad one gives
 * FAIRGO_ERR_INVALID_ARGUMENT naming the field), with the same rules as
 * fairgo's Go options. */
typedef struct fairgo_config {
  uint32_t struct_size;         /* sizeof(fairgo_config_t), set by fairgo_config_init */
  int32_t device;               /* CUDA ordinal of this rank's GPU (as the CUDA runtime and
                                   PyTorch number them); -1 (default): the only GPU
                                   CUDA_VISIBLE_DEVICES names, else LOCAL_RANK */
  int64_t init_timeout_ms;      /* bound of fairgo_init*: store, discovery, NCCL setup;
                                   default 300000. NCCL's own setup cannot be interrupted:
                                   after a timeout there the process should exit. */
  int64_t op_timeout_ms;        /* watchdog: a collective not complete this long after it was
                                   enqueued aborts the communicators and fails with
                                   FAIRGO_ERR_TIMEOUT (later calls fail too); 0 (default): off.
                                   Also bounds how long fairgo_allreduce waits for fairgo's
                                   engine thread to enqueue the call (else 300000). */
  int64_t slice_bytes;          /* pipeline slice size; 0 (default): fairgo's choice */
  int64_t flat_threshold_bytes; /* below this one flat NCCL allreduce; 0 (default): fairgo's
                                   choice; -1: never flat */
  int32_t algorithm;            /* a fairgo_algorithm_t; FAIRGO_ALGORITHM_AUTO (default) */
} fairgo_config_t;

/* Information about a communicator. */
typedef struct fairgo_comm_info {
  int32_t rank;       /* this rank in the launcher's global order */
  int32_t world_size; /* ranks in the job = machines * devices_per_machine */
  int32_t machines;   /* M: machines (or emulated machines) */
  int32_t devices;    /* D: ranks per machine */
  int32_t machine;    /* this rank's machine index in [0, M) */
  int32_t local;      /* this rank's index on its machine in [0, D) */
  int32_t device;     /* the CUDA ordinal it uses */
} fairgo_comm_info_t;

/* ---- Library ---------------------------------------------------------- */

/* The ABI version of the loaded library (returns the value, not a result
 * code); compare with FAIRGO_ABI_VERSION. */
int fairgo_abi_version(void);

/* The fairgo version of the loaded library, e.g. "0.1.0" (static storage);
 * compare with FAIRGO_VERSION. Libraries before 0.1.0 lack it. */
const char* fairgo_version(void);

/* The name of a result code, e.g. "FAIRGO_ERR_TIMEOUT" (static storage;
 * "FAIRGO_UNKNOWN_RESULT" for other values). */
const char* fairgo_result_string(int result);

/* The text of the last error code returned on the calling thread ("" if
 * none). Valid until the next fairgo call on this thread; copy it to keep
 * it. Errors of a collective's device work are reported by the
 * fairgo_work_test or fairgo_work_wait call that returned their code. */
const char* fairgo_last_error(void);

/* Fills cfg with the defaults (returns nothing). */
void fairgo_config_init(fairgo_config_t* cfg);

/* Applies the settings of the environment (FAIRGO_ALGORITHM, ...: the table
 * above) to cfg; variables that are unset or empty leave their field alone.
 * A value that does not parse gives FAIRGO_ERR_INVALID_ARGUMENT naming the
 * variable, and cfg is left unchanged. */
int fairgo_config_from_env(fairgo_config_t* cfg);

/* ---- Communicators ------------------------------------------------------ */

/* Builds this process's communicator from the launch environment, as
 * fairgo's Go API (setup.New) does: torchrun's RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, or Slurm's or Open
 * MPI's, and the store FAIRGO_STORE_ADDR names (fairrun sets it), else
 * MASTER_ADDR:MASTER_PORT. Every rank of the job must call it; it returns
 * when all have joined and the communicators are built, or fails within
 * cfg->init_timeout_ms. One communicator per process (per GPU). Without a
 * GPU or a GPU driver it returns FAIRGO_ERR_NO_DEVICE. */
int fairgo_init(const fairgo_config_t* cfg, fairgo_comm_t* comm);

/* fairgo_init with this process's place given explicitly: rank in
 * [0, world_size), local_rank in [0, local_world_size) on its machine, and
 * store_addr, the "host:port" of a fairgo rendezvous store that every rank
 * can reach (served by fairgo_store_serve or fairrun; may be NULL when
 * world_size is 1). Machine identity still comes from the environment
 * (FAIRGO_MACHINE_ID, else NCCL_HOSTID, else hostname and boot id). */
int fairgo_init_rank(int rank, int world_size, int local_rank, int local_world_size,
                     const char* store_addr, const fairgo_config_t* cfg, fairgo_comm_t* comm);

/* Describes a communicator. */
int fairgo_comm_info(fairgo_comm_t comm, fairgo_comm_info_t* info);

/* The algorithm an allreduce of `bytes` bytes takes on this communicator:
 * *algorithm gets a fairgo_algorithm_t other than AUTO; *settled 1 where
 * the settings, a rule (the flat threshold, one rank) or Auto's measurement
 * of the call's size class gave it, 0 where it is Auto's guess for a size
 * class no call has reached yet, which that class's first call may change.
 * The same on every rank. Either pointer may be NULL. */
int fairgo_comm_algorithm(fairgo_comm_t comm, int64_t bytes, int32_t* algorithm, int32_t* settled);

/* Closes a communicator and releases its GPU resources and NCCL
 * communicators. Calls not yet enqueued fail with FAIRGO_ERR_CLOSED; device
 * work still running gets a grace period (2 s, or op_timeout_ms if shorter)
 * and is then aborted (close then returns within about 10 s more). Work
 * handles of the communicator stay valid until freed. The
 * handle is invalid afterwards (a second close gives FAIRGO_ERR_BAD_HANDLE).
 * Some ranks' close may wait for their peers' (NCCL destroys collectively). */
int fairgo_comm_close(fairgo_comm_t comm);

/* ---- Collectives -------------------------------------------------------- */

/* Reduces count elements of dtype at the device address data in place
 * across all ranks with op.
 *
 * stream is a cudaStream_t (= CUstream) of the communicator's GPU, in the
 * primary context (the CUDA runtime's; PyTorch's streams are); NULL is the
 * legacy default stream. The reduction starts after the work enqueued on
 * stream before this call, and work enqueued on stream after this call
 * waits for the result. The call returns as soon as fairgo's engine thread
 * has enqueued the device work: it never waits for the GPU.
 *
 * *work receives a handle to observe the outcome (fairgo_work_test,
 * fairgo_work_wait); free it with fairgo_work_free. Errors found before
 * anything is enqueued (bad arguments, a closed or aborted communicator)
 * are returned here and no handle is made. A call refused for a bad
 * argument (dtype, op, count, data, stream) still takes its place in the
 * call order: where the other ranks made a valid call, theirs fail at once
 * with FAIRGO_ERR_MISMATCH, whose text names this rank, the call and the
 * reason ("rank 1 refused call 3 (...): ..."), and every rank's
 * communicator is then broken (close it and make a new one). A call every
 * rank refuses alike breaks nothing. data must stay allocated until
 * the work has completed or the stream has passed this point. */
int fairgo_allreduce(fairgo_comm_t comm, void* data, int64_t count, fairgo_dtype_t dtype, fairgo_op_t op,
                     void* stream, fairgo_work_t* work);

/* fairgo_allreduce, except that stream does not wait for the result: the
 * reduction starts after the work enqueued on stream before this call, and
 * work enqueued on stream afterwards runs on without waiting for it (a DDP
 * comm hook lets the backward pass go on while a bucket is reduced). Make a
 * stream wait for the result with fairgo_work_stream_wait before reading
 * data on it. The call does not wait for fairgo's engine thread. */
int fairgo_allreduce_async(fairgo_comm_t comm, void* data, int64_t count, fairgo_dtype_t dtype, fairgo_op_t op,
                           void* stream, fairgo_work_t* work);

/* Makes stream (a cudaStream_t of the work's GPU; NULL: the legacy default
 * stream) wait for the work's result: work enqueued on it afterwards sees
 * the reduced data. Never blocks the host for the GPU (only, at most, for
 * fairgo's engine thread to enqueue the call, as fairgo_allreduce does).
 * May be called more than once, on several streams. A work that failed
 * before its device work was enqueued returns its error here. */
int fairgo_work_stream_wait(fairgo_work_t work, void* stream);

/* Non-blocking: *done = 1 when the work has completed (then the result is
 * FAIRGO_OK or the work's error code), else 0 (and FAIRGO_OK). */
int fairgo_work_test(fairgo_work_t work, int* done);

/* Waits up to timeout_ms (>= 0; 0 polls) for the work to complete on the
 * GPU. Returns FAIRGO_OK when it succeeded, its error code when it failed,
 * or FAIRGO_NOT_READY when the timeout passed first (the work goes on; wait
 * again or free the handle). Not needed for stream ordering: the caller's
 * stream already waits for the result. */
int fairgo_work_wait(fairgo_work_t work, int64_t timeout_ms);

/* Releases a work handle. Pending work goes on (its errors are then only
 * seen by later calls on the communicator). A second free gives
 * FAIRGO_ERR_BAD_HANDLE. */
int fairgo_work_free(fairgo_work_t work);

/* ---- Rendezvous store --------------------------------------------------- */

/* Serves a fairgo rendezvous store on listen_addr ("host:port"; port 0
 * picks a free one; ":0" listens on every interface) for the ranks'
 * fairgo_init_rank, when the launcher serves none (under torchrun, rank 0
 * serves it and shares the address through torch.distributed). Writes the
 * address it listens on, NUL-terminated, into addr (addr_len bytes; 64 are
 * enough; FAIRGO_ERR_INVALID_ARGUMENT if too short, then the store is not
 * started). Keep it open until every rank's fairgo_init_rank returned;
 * closing it after the communicators exist is safe. */
int fairgo_store_serve(const char* listen_addr, fairgo_store_t* store, char* addr, size_t addr_len);

/* Stops a store served by fairgo_store_serve. */
int fairgo_store_close(fairgo_store_t store);

#ifdef __cplusplus
}
#endif

#endif /* FAIRGO_H */
