// Package rendezvous is how the ranks of a job find each other: a key-value
// Store with blocking reads, whoever launched the job. FromEnv reads where
// this process sits (rank, world, local rank) from the launcher's
// variables, and Open returns the store it should use: fairrun's, torchrun's
// own (PyTorch's c10d TCPStore protocol, C10dClient), one that rank 0 hosts
// (Server), or one in memory.
//
//	launcher                  recognised by                        store (Launch.StoreKind)
//	fairrun                   FAIRGO_STORE_ADDR                    fairrun's, at FAIRGO_STORE_ADDR (fairgo)
//	torchrun, agent store     TORCHELASTIC_USE_AGENT_STORE=True    torchrun's agent, MASTER_ADDR:MASTER_PORT (c10d)
//	torchrun, no agent store  other TORCHELASTIC_* values          rank 0 hosts, MASTER_ADDR:MASTER_PORT+1 (rank0)
//	torchrun-style env        RANK, WORLD_SIZE, MASTER_ADDR/PORT   rank 0 hosts, MASTER_ADDR:MASTER_PORT+1 (rank0)
//	Slurm (srun)              SLURM_PROCID, SLURM_NTASKS, ...      rank 0 hosts, MASTER_ADDR:MASTER_PORT+1 (rank0) [1]
//	Open MPI (mpirun)         OMPI_COMM_WORLD_RANK, _SIZE, ...     rank 0 hosts, MASTER_ADDR:MASTER_PORT+1 (rank0) [2]
//	one process               world size 1                         in memory (memory)
//
// [1] Unless given, MASTER_ADDR is the first host of SLURM_STEP_NODELIST
// (else SLURM_JOB_NODELIST, SLURM_NODELIST, SLURM_LAUNCH_NODE_IPADDR) and
// MASTER_PORT is SlurmPort(SLURM_JOB_ID). [2] Open MPI names no host to
// meet at: give MASTER_ADDR (mpirun -x MASTER_ADDR=host-of-rank-0), or
// FAIRGO_STORE_ADDR.
//
// FAIRGO_STORE_PORT replaces MASTER_PORT+1, which stays clear of the
// TCPStore PyTorch's rank 0 (or torchrun's agent) serves on MASTER_PORT.
// FAIRGO_STORE_TOKEN, the same on every rank, makes the store rank 0 hosts
// require that token (WithToken, WithDialToken). Other ranks dial with
// retries until Open's ctx is nearly over; a rank that reaches no store gets
// an *OpenError naming the address, the launcher and the variables read.
// The hosting rank serves while its process lives: end with
// LaunchStore.Leave on every rank (the host stops serving once all have
// left), or Close it only when no rank needs the store any more.
//
// The Server holds against hostile clients: a Hello with the token first,
// handshake, idle and per-frame deadlines, frame buffers that grow only as
// bytes arrive under a server-wide budget, and caps on connections (see
// the With* server options and their defaults).
//
// Every blocking call takes a context and returns ctx.Err() unchanged when it
// ends; values are opaque bytes except for Add's counters, which are decimal
// integers as in PyTorch's c10d stores.
package rendezvous
