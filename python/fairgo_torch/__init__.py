"""fairgo_torch: fairgo's two-level allreduce as a PyTorch DDP comm hook.

    import torch.distributed as dist, fairgo_torch
    dist.init_process_group("nccl")                     # DDP's own process group stays
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev])
    comm = fairgo_torch.init()                          # after torch.cuda.set_device(dev)
    ddp.register_comm_hook(comm, fairgo_torch.allreduce_hook)

The hook averages each gradient bucket in place with fairgo, ordered after
the backward work already on PyTorch's current stream; the backward goes on
while the buckets are reduced (as with DDP's own allreduce), and the last
bucket makes the current stream wait for every reduction and completes the
buckets' CUDA futures, without blocking the host. It uses libfairgo.so through ctypes (no compiled extension): the
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
import warnings
from pathlib import Path
from typing import Optional

from ._comm import _UNSET, SETTINGS, Comm, Store, Work, init_env, init_rank, init_torch, serve_store
from . import _lib as _lib_module
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
    "init", "init_env", "init_rank", "init_torch", "default_comm", "shutdown", "allreduce_hook", "register_hook",
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


_raw_stream = None
_AVG = _lib_module.AVG  # fairgo's number: the hook's calls skip the name's lookup
_devices: dict = {}  # device index -> [torch.device], the futures' devices


def _current_raw_stream(index: int) -> int:
    """The cudaStream_t of PyTorch's current stream of device index, without
    making a torch.cuda.Stream (PyTorch's private call where it has it)."""
    global _raw_stream
    if _raw_stream is None:
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _raw_stream = raw if raw is not None else (lambda i: torch.cuda.current_stream(i).cuda_stream)
    return _raw_stream(index)


def allreduce_hook(state, bucket):
    """DDP comm hook (DistributedDataParallel.register_comm_hook): averages
    bucket.buffer() in place across all ranks with fairgo.

    state is the Comm to use (None: the default from init()). Each bucket's
    reduction is ordered after the work already enqueued on PyTorch's
    current stream and runs on fairgo's streams while the backward pass goes
    on. The last bucket of the backward pass (bucket.is_last(); anything
    that has no is_last counts as last) makes the current stream wait for
    its reduction and for every earlier bucket's, and completes their
    futures as CUDA futures of that stream: waiting on one (DDP does, before
    it copies the buckets back into the gradients) syncs the waiter's stream
    with the reductions, without blocking the host. Until then an earlier
    bucket's future is pending. Errors of earlier buckets' device work are
    raised from a later call.

    A training step that is bound by the host (a small model, small
    batches) pays the hook's host time in full, and the hook runs in
    Python: a bucket costs one library call and a future; the last bucket
    adds a stream wait for each earlier one."""
    import torch

    comm = state if isinstance(state, Comm) else default_comm()
    buf = bucket.buffer()
    index = buf.get_device()
    stream = _current_raw_stream(index)
    is_last = getattr(bucket, "is_last", None)
    if is_last is not None and not is_last():
        work = comm._allreduce_tensor(buf, _AVG, stream, index, asynchronous=True)  # refuses what is not a CUDA tensor
        devices = _devices.get(index)
        if devices is None:
            devices = _devices[index] = [buf.device]
        fut = torch.futures.Future(devices=devices)
        with comm._lock:
            comm._hook_pending.append((work, fut, buf))
        return fut
    with comm._lock:
        earlier, comm._hook_pending = comm._hook_pending, []
    try:
        comm._allreduce_tensor(buf, "avg", stream, index, track=True)  # the current stream waits for it
    finally:
        _complete(comm, earlier, stream)
    fut = torch.futures.Future(devices=[buf.device])
    fut.set_result(buf)
    return fut


def _complete(comm: Comm, earlier: list, stream: int) -> None:
    """Makes stream wait for each earlier bucket's reduction and completes
    its future as of stream; a work that cannot be waited on fails its
    future and raises (the first such error, after every future is done)."""
    failed = None
    for work, fut, buf in earlier:
        try:
            work.stream_wait(stream)
        except FairgoError as e:
            work.free()
            fut.set_exception(e)
            failed = failed or e
            continue
        comm._track(work)
        fut.set_result(buf)
    if failed is not None:
        raise failed


# HOOK_IMPLS are register_hook's choices (FAIRGO_TORCH_HOOK).
HOOK_IMPLS = ("auto", "cpp", "python")
_extension = None
_extension_error: Optional[BaseException] = None
_extension_lock = threading.Lock()


def _hook_extension():
    """The C++ hook's module, built by torch.utils.cpp_extension on first
    use (cached by PyTorch in TORCH_EXTENSIONS_DIR, rebuilt when the source
    changes); a failure is remembered and raised again."""
    global _extension, _extension_error
    with _extension_lock:
        if _extension is None and _extension_error is None:
            try:
                from torch.utils import cpp_extension

                _extension = cpp_extension.load(name="fairgo_torch_hook", sources=[str(Path(__file__).with_name("_hook.cpp"))],
                                                extra_cflags=["-O2"], with_cuda=True, verbose=False)
            except Exception as e:  # no compiler, no headers, a build error: the caller decides
                _extension_error = e
        if _extension_error is not None:
            raise _extension_error
        return _extension


def _hook_functions(lib) -> list:
    """The addresses of the library functions the C++ hook calls, in its order."""
    import ctypes

    names = ["fairgo_allreduce", "fairgo_allreduce_async", "fairgo_work_stream_wait", "fairgo_work_test",
             "fairgo_work_free", "fairgo_last_error"]
    return [ctypes.cast(getattr(lib.dll, n), ctypes.c_void_p).value for n in names]


def register_hook(ddp, comm: Optional[Comm] = None, *, impl: Optional[str] = None) -> str:
    """Registers fairgo's comm hook on the DistributedDataParallel module
    ddp for comm (None: the default from init()), and returns which one:
    "cpp" or "python".

    Both do what allreduce_hook says. The C++ one runs inside DDP's reducer
    without the Python interpreter (no GIL, no Python call a bucket), which
    a step bound by the host pays for: it is built on first use with
    torch.utils.cpp_extension (a C++ compiler and PyTorch's headers; a minute
    or so, then cached); its errors are RuntimeErrors with the library's
    text. impl (else FAIRGO_TORCH_HOOK, else "auto"): "cpp" raises
    LibraryError where it cannot be built, "python" registers
    allreduce_hook, "auto" takes C++ where it builds and else warns once and
    falls back to Python."""
    comm = comm if comm is not None else default_comm()
    choice = (impl if impl is not None else os.environ.get("FAIRGO_TORCH_HOOK", "") or "auto").strip().lower()
    if choice not in HOOK_IMPLS:
        raise InvalidArgumentError(_lib_module.ERR_INVALID_ARGUMENT, f"fairgo: hook implementation {choice!r}: want one of {', '.join(HOOK_IMPLS)} "
                                      "(impl or FAIRGO_TORCH_HOOK)")
    if choice != "python":
        try:
            ext = _hook_extension()
        except Exception as e:
            if choice == "cpp":
                raise LibraryError(f"fairgo: the C++ comm hook could not be built: {e}") from e
            warnings.warn(f"fairgo: the C++ comm hook could not be built ({type(e).__name__}: {e}); "
                          "using the Python one (FAIRGO_TORCH_HOOK=python silences this)", stacklevel=2)
        else:
            lib = comm._lib
            ext.register(ddp.reducer, comm.handle, _hook_functions(lib),
                         [_lib_module.AVG, _lib_module.FLOAT16, _lib_module.BFLOAT16, _lib_module.FLOAT32, _lib_module.FLOAT64])
            name = getattr(getattr(ddp, "logger", None), "_set_comm_hook_name", None)
            if name is not None:
                name("fairgo_torch.allreduce_hook (C++)")
            return "cpp"
    ddp.register_comm_hook(comm, allreduce_hook)
    return "python"
