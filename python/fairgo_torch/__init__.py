"""fairgo_torch: fairgo's two-level allreduce as a PyTorch DDP comm hook.

    import torch.distributed as dist, fairgo_torch
    dist.init_process_group("nccl")                     # DDP's own process group stays
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev])
    comm = fairgo_torch.init()                          # after torch.cuda.set_device(dev)
    ddp.register_comm_hook(comm, fairgo_torch.allreduce_hook)

The hook averages each gradient bucket in place with fairgo, ordered after
the backward work already on PyTorch's current stream, on a side stream of
its own (so that the backward goes on while the bucket is reduced, as with
DDP's own allreduce), and returns a completed CUDA future of that side
stream without blocking the host: whoever waits on the future waits for the
reduction. It uses libfairgo.so through ctypes (no compiled extension): the
wheel carries it (`pip install fairgo_torch-*.whl`, built by `make wheel`);
FAIRGO_LIB names another copy.

Settings come from the environment (FAIRGO_ALGORITHM, FAIRGO_SLICE_BYTES,
FAIRGO_FLAT_THRESHOLD_BYTES, FAIRGO_TIMEOUT, FAIRGO_INIT_TIMEOUT,
FAIRGO_DEVICE) or from init()'s keyword arguments of the same names, which
win.
"""

from __future__ import annotations

import os
import threading
from typing import Optional

from ._comm import _UNSET, SETTINGS, Comm, Store, Work, init_env, init_rank, init_torch, serve_store
from ._dtypes import fairgo_dtype, fairgo_op
from ._lib import (
    AbortedError,
    BadHandleError,
    ClosedError,
    CudaError,
    FairgoError,
    FairgoSystemError,
    FairgoTimeoutError,
    InternalError,
    InvalidArgumentError,
    LibraryError,
    MismatchError,
    NcclError,
    NoDeviceError,
    NotReadyError,
    candidate_paths,
    load,
)
from ._version import __version__

__all__ = [
    "init", "init_env", "init_rank", "init_torch", "default_comm", "shutdown", "allreduce_hook",
    "init_process_group", "torch_master_port",
    "Comm", "Work", "Store", "serve_store", "fairgo_dtype", "fairgo_op", "load", "candidate_paths",
    "FairgoError", "InvalidArgumentError", "BadHandleError", "MismatchError", "FairgoTimeoutError",
    "AbortedError", "ClosedError", "CudaError", "NcclError", "FairgoSystemError", "InternalError", "LibraryError",
    "NotReadyError", "NoDeviceError", "SETTINGS",
]

_default: Optional[Comm] = None
_default_lock = threading.Lock()


def init(*, algorithm: Optional[str] = None, slice_bytes: Optional[int] = None,
         flat_threshold_bytes: Optional[int] = None, timeout: Optional[float] = None,
         init_timeout: Optional[float] = None, device: Optional[int] = None,
         op_timeout=_UNSET, flat_threshold=_UNSET) -> Comm:
    """Builds this process's fairgo communicator from the launch environment
    and makes it the default of allreduce_hook. Every rank must call it.

    - Under fairrun (FAIRGO_STORE_ADDR set): fairrun's store (init_env).
    - Else, when torch.distributed's default process group is initialised
      (torchrun): rank 0 serves a fairgo store and shares its address through
      the process group (init_torch). DDP keeps its own process group.
    - Else: the launch environment as fairgo's Go API reads it (init_env:
      torchrun, Slurm or Open MPI variables, the store at
      MASTER_ADDR:MASTER_PORT).

    Settings, each from its keyword argument when not None, else from the
    environment variable in parentheses, else the default:

    - algorithm (FAIRGO_ALGORITHM): "auto" (measure each size class and take
      the fastest), "flat", "flat-ring", "flat-tree", "halving-doubling",
      "recursive-doubling", "rail-a2a", "rail-rsag" or "rail-allreduce".
    - slice_bytes (FAIRGO_SLICE_BYTES): the pipeline's slice; 0: fairgo's choice.
    - flat_threshold_bytes (FAIRGO_FLAT_THRESHOLD_BYTES): below it one flat
      NCCL allreduce; -1: never; 0: fairgo's choice.
    - timeout (FAIRGO_TIMEOUT): seconds, default 600, 0: off. fairgo's
      watchdog: a collective not complete by then aborts the communicators
      and raises FairgoTimeoutError from a later call instead of hanging.
    - init_timeout (FAIRGO_INIT_TIMEOUT): seconds, default 300; bounds the setup.
    - device (FAIRGO_DEVICE): the CUDA ordinal; default
      torch.cuda.current_device() once PyTorch has initialised CUDA (call
      torch.cuda.set_device first).

    op_timeout and flat_threshold are the former names of timeout and
    flat_threshold_bytes (op_timeout=None: off). Without a GPU or a GPU
    driver it raises NoDeviceError."""
    global _default
    kw = dict(algorithm=algorithm, slice_bytes=slice_bytes, flat_threshold_bytes=flat_threshold_bytes, timeout=timeout,
              init_timeout=init_timeout, device=device)
    if op_timeout is not _UNSET:
        kw["op_timeout"] = op_timeout
    if flat_threshold is not _UNSET:
        kw["flat_threshold"] = flat_threshold
    if os.environ.get("FAIRGO_STORE_ADDR"):
        comm = init_env(**kw)
    elif _torch_dist_initialized():
        comm = init_torch(**kw)
    else:
        comm = init_env(**kw)
    with _default_lock:
        _default = comm
    return comm


def torch_master_port(environ=None) -> int:
    """The port torch.distributed's own store should use: MASTER_PORT, except
    under fairrun, whose FAIRGO_STORE_ADDR is fairgo's store at
    MASTER_ADDR:MASTER_PORT (a c10d TCPStore cannot share it): then
    FAIRGO_TORCH_PORT, else MASTER_PORT + 1."""
    env = os.environ if environ is None else environ
    port = int(env.get("MASTER_PORT", "29500"))
    store = env.get("FAIRGO_STORE_ADDR", "")
    if store and store.rsplit(":", 1)[-1] == str(port):
        return int(env.get("FAIRGO_TORCH_PORT") or port + 1)
    return port


def init_process_group(backend: str = "nccl", **kwargs) -> None:
    """torch.distributed.init_process_group(backend, init_method="env://",
    ...) that also works under fairrun: MASTER_PORT is moved off fairgo's
    store first (torch_master_port). Under torchrun it changes nothing."""
    import torch.distributed as dist

    os.environ["MASTER_PORT"] = str(torch_master_port())
    kwargs.setdefault("init_method", "env://")
    dist.init_process_group(backend, **kwargs)


def _torch_dist_initialized() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_initialized()


def default_comm() -> Comm:
    """The communicator of the last init()."""
    with _default_lock:
        if _default is None:
            raise BadHandleError(3, "fairgo: no communicator: call fairgo_torch.init() first")
        return _default


def shutdown() -> None:
    """Closes the default communicator."""
    global _default
    with _default_lock:
        comm, _default = _default, None
    if comm is not None:
        comm.close()


class _Side:
    """A device's side stream for the hook, and what every call needs of it
    made once: the raw handle the library takes, its ids for making it the
    current stream, and an event that orders it after the current stream
    (recorded anew by each call under lock: a stream's wait follows the
    event's record at the time of the wait, so reusing it is safe, and it
    spares each call an event's creation and destruction)."""

    __slots__ = ("stream", "handle", "ids", "ready", "lock")

    def __init__(self, stream, ready):
        self.stream = stream
        self.handle = stream.cuda_stream
        self.ids = (stream.stream_id, stream.device_index, stream.device_type)
        self.ready = ready
        self.lock = threading.Lock()


_sides: dict = {}
_side_lock = threading.Lock()


def _side(device) -> _Side:
    """The hook's side of a device (one per device and process)."""
    side = _sides.get(device)
    if side is None:
        import torch

        with _side_lock:
            side = _sides.get(device)
            if side is None:
                side = _sides[device] = _Side(torch.cuda.Stream(device=device), torch.cuda.Event())
    return side


def _set_result_on(fut, value, side: _Side) -> None:
    """Completes the CUDA future fut with value as of side's stream: its
    waiters wait for what side's stream has enqueued so far. Through
    PyTorch's own stream switch (what torch.cuda.stream does, without its
    Python) where the device is the current one, else the public way."""
    import torch

    c = torch._C
    index = side.ids[1]
    if hasattr(c, "_cuda_setStream") and hasattr(c, "_cuda_getCurrentStream") and torch.cuda.current_device() == index:
        prev = c._cuda_getCurrentStream(index)
        c._cuda_setStream(stream_id=side.ids[0], device_index=index, device_type=side.ids[2])
        try:
            fut.set_result(value)
        finally:
            c._cuda_setStream(stream_id=prev[0], device_index=prev[1], device_type=prev[2])
        return
    with torch.cuda.stream(side.stream):
        fut.set_result(value)


def allreduce_hook(state, bucket):
    """DDP comm hook (DistributedDataParallel.register_comm_hook): averages
    bucket.buffer() in place across all ranks with fairgo.

    state is the Comm to use (None: the default from init()). The reduction
    runs on a side stream of the buffer's device after the work already
    enqueued on torch.cuda.current_stream(); the current stream does not
    wait for it, so the backward pass overlaps it. The returned
    torch.futures.Future is already completed with the buffer as a CUDA
    future of the side stream: waiting on it (DDP does, before it copies the
    buckets back into the gradients) syncs the waiter's stream with the
    reduction, without blocking the host. Errors of earlier buckets' device
    work are raised here, from a later bucket.

    A training step that is bound by the host (a small model, small
    batches) pays the hook's host time in full, and the hook runs in
    Python: it makes the fewest calls it can (one library call, one event
    reused rather than one made a call, the checks a DDP bucket can fail)."""
    import torch

    comm = state if isinstance(state, Comm) else default_comm()
    buf = bucket.buffer()
    dev = buf.device
    side = _side(dev)
    with side.lock:
        side.ready.record(torch.cuda.current_stream(dev))
        side.stream.wait_event(side.ready)
    comm._allreduce_tensor(buf, "avg", side.handle, dev.index, track=True)
    buf.record_stream(side.stream)  # the caching allocator keeps it until the side stream is past the reduction
    fut = torch.futures.Future(devices=[dev])
    _set_result_on(fut, buf, side)
    return fut
