"""Communicators, work handles and stores of libfairgo, for Python.

PyTorch is imported only by the calls that take tensors.
"""

from __future__ import annotations

import collections
import ctypes
import os
import socket
import threading
import time
from typing import Optional, Tuple

from . import _dtypes, _lib


def _ms(seconds: Optional[float]) -> int:
    """Seconds as the library's milliseconds (None: 0). A value that is not
    zero stays so and keeps its sign (0.0001 s is 1 ms, -0.0001 s is -1 ms):
    the library judges it (a negative timeout is its InvalidArgumentError)."""
    if seconds is None or seconds == 0:
        return 0
    ms = int(round(seconds * 1000))
    return max(1, ms) if seconds > 0 else min(-1, ms)


class Work:
    """One collective call in flight (a fairgo_work_t). The caller's stream
    already waits for its result; test and wait observe its outcome on the
    host. Freed by free(), or when garbage collected."""

    __slots__ = ("_lib", "_handle")

    def __init__(self, lib: _lib.Library, handle: int):
        self._lib = lib
        self._handle = handle

    @property
    def handle(self) -> int:
        return self._handle

    def test(self) -> bool:
        """True once the work has completed; raises its error if it failed."""
        done = ctypes.c_int(0)
        self._lib.call("fairgo_work_test", self._handle, ctypes.byref(done))
        return bool(done.value)

    def wait(self, timeout: Optional[float] = None) -> None:
        """Blocks until the work has completed on the GPU (raises its error
        if it failed), or raises NotReadyError after timeout seconds (None:
        no limit; the library is called in bounded steps)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = 1000 if deadline is None else max(0, min(1000, int((deadline - time.monotonic()) * 1000)))
            if self._lib.call("fairgo_work_wait", self._handle, step) == _lib.OK:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise _lib.NotReadyError(_lib.NOT_READY, f"fairgo: work {self._handle} not complete after {timeout} s")

    def stream_wait(self, stream: int = 0) -> None:
        """Makes the cudaStream_t stream (a raw handle of the work's GPU; 0:
        the legacy default stream) wait for the result, without blocking
        the host: what is enqueued on it afterwards reads the reduced data.
        Needed after Comm.allreduce_async; a no-op's worth after allreduce."""
        self._lib.call("fairgo_work_stream_wait", self._handle, ctypes.c_void_p(stream or None))

    def free(self) -> None:
        """Releases the handle (the work itself goes on if pending)."""
        h, self._handle = self._handle, 0
        if h:
            self._lib.call("fairgo_work_free", h)

    def __del__(self):
        try:
            if self._handle:
                self._lib.dll.fairgo_work_free(self._handle)
        except Exception:
            pass


def _pending_still(w: Work) -> bool:
    """Whether w is still running (a failed work counts as done)."""
    try:
        return not w.test()
    except _lib.FairgoError:
        return False


class Store:
    """A fairgo rendezvous store served by this process (fairgo_store_t)."""

    def __init__(self, lib: _lib.Library, handle: int, address: str):
        self._lib = lib
        self._handle = handle
        self.address = address  # as the library listens, e.g. "[::]:41234"

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def close(self) -> None:
        h, self._handle = self._handle, 0
        if h:
            self._lib.call("fairgo_store_close", h)


def serve_store(listen: str = ":0", lib: Optional[_lib.Library] = None) -> Store:
    """Serves a fairgo rendezvous store on listen ("host:port"; ":0": every
    interface, a free port)."""
    lib = lib or _lib.load()
    handle = ctypes.c_int64(0)
    buf = ctypes.create_string_buffer(256)
    lib.call("fairgo_store_serve", listen.encode(), ctypes.byref(handle), buf, len(buf))
    return Store(lib, handle.value, buf.value.decode())


# _REAP_AT is how many tracked works a Comm keeps before a call frees the
# completed ones (testing each is a library call; a call each time cost the
# comm hook a few of them per bucket). Their errors are raised by a later
# call then, or by synchronize.
_REAP_AT = 8

# _DTYPE_OF caches fairgo's element type of each torch.dtype a call took.
_DTYPE_OF: dict = {}


class Comm:
    """This process's fairgo communicator (a fairgo_comm_t): one rank, one GPU.

    allreduce_ reduces a CUDA tensor in place, ordered after the work on a
    stream (default: PyTorch's current stream) and making that stream wait
    for the result, without blocking the host. Errors of earlier calls'
    device work are raised by later calls (within eight calls)
    and by synchronize."""

    def __init__(self, lib: _lib.Library, handle: int, store: Optional[Store] = None):
        self._lib = lib
        self._handle = handle
        self._store = store
        self._pending: "collections.deque[Work]" = collections.deque()
        self._lock = threading.Lock()
        # The comm hook's asynchronous calls whose stream wait and future
        # wait for the last bucket of the backward pass: (Work, Future, buffer).
        self._hook_pending: list = []
        info = _lib.CommInfo()
        lib.call("fairgo_comm_info", handle, ctypes.byref(info))
        self.rank = info.rank
        self.world_size = info.world_size
        self.machines = info.machines
        self.devices_per_machine = info.devices
        self.machine = info.machine
        self.local = info.local
        self.device = info.device

    def __repr__(self) -> str:
        return (f"fairgo_torch.Comm(rank {self.rank} of {self.world_size}: machine {self.machine} of {self.machines}, "
                f"local {self.local} of {self.devices_per_machine}, cuda:{self.device})")

    @property
    def handle(self) -> int:
        if not self._handle:
            raise _lib.BadHandleError(_lib.ERR_BAD_HANDLE, "fairgo: communicator closed")
        return self._handle

    def algorithm_for(self, nbytes: int) -> Tuple[str, bool]:
        """The algorithm an allreduce of nbytes bytes takes ("flat",
        "flat-tree", ...), and whether it is settled: True where the
        settings, a rule or fairgo's measurement of that size gave it, False
        where it is a guess for a size no call has reached yet, which the
        first such call may change. The same on every rank."""
        algo, settled = ctypes.c_int32(), ctypes.c_int32()
        self._lib.call("fairgo_comm_algorithm", self.handle, int(nbytes), ctypes.byref(algo), ctypes.byref(settled))
        names = {v: k for k, v in _lib.ALGORITHMS.items()}
        return names.get(algo.value, str(algo.value)), bool(settled.value)

    def _reap(self) -> None:
        """Frees the completed works at the front; raises the first failure."""
        with self._lock:
            while self._pending:
                w = self._pending[0]
                try:
                    if not w.test():
                        return
                except _lib.FairgoError:
                    self._pending.popleft()
                    w.free()
                    raise
                self._pending.popleft()
                w.free()

    def _refuse(self, reason: Exception, bad_op: bool = False) -> None:
        """Refuses a call this process judged invalid before the library
        could: the library is given a call it refuses too (no operator when
        bad_op, else no element type), so that the call still takes its
        place in the call order and the other ranks' calls fail at once with
        a MismatchError naming this rank and the library's reason, instead
        of waiting for a call that never comes. Raises InvalidArgumentError
        with this process's reason."""
        handle = ctypes.c_int64(0)
        dtype, op = (_lib.FLOAT32, 0) if bad_op else (0, _lib.SUM)
        try:
            self._lib.call("fairgo_allreduce", self.handle, ctypes.c_void_p(None), 0, dtype, op, ctypes.c_void_p(None),
                           ctypes.byref(handle))
        except _lib.FairgoError as e:
            if e.code != _lib.ERR_INVALID_ARGUMENT:
                raise  # a closed or broken communicator says so
        raise _lib.InvalidArgumentError(_lib.ERR_INVALID_ARGUMENT, str(reason)) from reason

    def allreduce(self, ptr: int, count: int, dtype: int, op, stream: int = 0, track: bool = False) -> Optional[Work]:
        """The raw call: count elements of fairgo dtype at device address ptr,
        ordered after the cudaStream_t stream (0: the legacy default stream),
        which then waits for the result. Returns the Work, or None with
        track=True (the communicator then frees it and raises its error from
        a later call or synchronize)."""
        w = self._call("fairgo_allreduce", ptr, count, dtype, op, stream)
        if track:
            self._track(w)
            return None
        return w

    def allreduce_async(self, ptr: int, count: int, dtype: int, op, stream: int = 0) -> Work:
        """allreduce, except that stream does not wait for the result: the
        reduction is ordered after the work on stream so far, and stream
        runs on. Call the Work's stream_wait before reading the data on a
        stream; free the Work (or track it) when done."""
        return self._call("fairgo_allreduce_async", ptr, count, dtype, op, stream)

    def _call(self, name: str, ptr: int, count: int, dtype: int, op, stream: int) -> Work:
        """fairgo_allreduce or fairgo_allreduce_async: frees the completed
        tracked works once _REAP_AT are kept, refuses an unknown op in its
        place in the call order, and returns the call's Work."""
        if len(self._pending) >= _REAP_AT:
            self._reap()
        if type(op) is not int:  # the comm hook passes fairgo's number: no lookup
            try:
                op = _dtypes.fairgo_op(op)
            except ValueError as e:  # an unknown name: refused in its place in the call order
                self._refuse(e, bad_op=True)
        handle = ctypes.c_int64(0)
        code = getattr(self._lib.dll, name)(self.handle, ptr or None, count, dtype, op, stream or None, ctypes.byref(handle))
        if code:
            self._lib.check(code)
        return Work(self._lib, handle.value)

    def _track(self, w: Work) -> None:
        """Hands w to the communicator, which frees it once complete and
        raises its error from a later call or synchronize."""
        with self._lock:
            self._pending.append(w)

    def allreduce_(self, tensor, op="avg", stream=None, track: bool = True) -> Optional[Work]:
        """Reduces a contiguous CUDA tensor of this communicator's GPU in
        place across all ranks (op: "sum", "avg", "max", "min", "prod" or a
        torch.distributed.ReduceOp). stream (a torch.cuda.Stream or a raw
        handle; default: torch.cuda.current_stream()) orders the call after
        its work so far and waits for the result. Returns at once; with
        track=False the Work is returned for the caller to test/wait/free.
        A tensor or stream it refuses still takes the call's place in the call
        order (the other ranks' calls fail with a MismatchError naming this
        rank), as a call the library refuses does."""
        dt, stream = self._tensor_args(tensor, stream)
        return self.allreduce(tensor.data_ptr(), tensor.numel(), dt, op, stream, track=track)

    def _tensor_args(self, tensor, stream) -> Tuple[int, int]:
        """allreduce_'s checks of a tensor and a stream: fairgo's element
        type of the tensor and the raw stream handle (default: PyTorch's
        current stream of the tensor's device), or the call refused in its
        place in the call order with the reason."""
        import torch

        if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
            self._refuse(ValueError(f"fairgo: allreduce_ needs a CUDA tensor, got {type(tensor).__name__}"
                                    + (f" on {tensor.device}" if isinstance(tensor, torch.Tensor) else "")))
        if self.device >= 0 and tensor.device.index != self.device:
            self._refuse(ValueError(f"fairgo: tensor on {tensor.device}, communicator on cuda:{self.device}"))
        if not tensor.is_contiguous():
            self._refuse(ValueError("fairgo: allreduce_ needs a contiguous tensor"))
        try:
            dt = _dtypes.fairgo_dtype(tensor.dtype)
            _DTYPE_OF[tensor.dtype] = dt
        except TypeError as e:  # refused in its place in the call order, raised as before
            try:
                self._refuse(e)
            except _lib.InvalidArgumentError:
                raise e from None
        if stream is None:
            stream = torch.cuda.current_stream(tensor.device)
        if isinstance(stream, torch.cuda.Stream):
            if stream.device != tensor.device:
                self._refuse(ValueError(f"fairgo: stream of {stream.device}, tensor on {tensor.device}"))
            stream = stream.cuda_stream
        return dt, int(stream)

    def _allreduce_tensor(self, tensor, op, stream: int, device: int, track: bool = False,
                          asynchronous: bool = False) -> Optional[Work]:
        """allreduce_ (asynchronous: allreduce_async) for the comm hook, on
        a raw stream handle of the tensor's device (device: its index): a
        bucket DDP made is a contiguous CUDA tensor, so only what could
        differ is checked here (the element type, the device); anything else
        takes allreduce_'s checks, which refuse with their reasons."""
        dt = _DTYPE_OF.get(tensor.dtype)
        if dt is None or (self.device >= 0 and device != self.device) or not tensor.is_contiguous():
            dt, stream = self._tensor_args(tensor, stream)
        if asynchronous:
            return self.allreduce_async(tensor.data_ptr(), tensor.numel(), dt, op, stream)
        return self.allreduce(tensor.data_ptr(), tensor.numel(), dt, op, stream, track=track)

    def synchronize(self, timeout: Optional[float] = None) -> None:
        """Waits for every tracked call to complete on the GPU; raises the
        first failure."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._pending:
                    return
                w = self._pending[0]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                w.wait(left)  # NotReadyError: still pending, it stays tracked
            finally:
                with self._lock:
                    if self._pending and self._pending[0] is w and not _pending_still(w):
                        self._pending.popleft()
                        w.free()

    def close(self) -> None:
        """Closes the communicator (pending device work gets a short grace
        period, then is aborted) and the store this process served for it."""
        h, self._handle = self._handle, 0
        errors = []
        if h:
            with self._lock:
                pending, self._pending = list(self._pending), collections.deque()
            for w in pending:
                try:
                    w.free()
                except _lib.FairgoError as e:
                    errors.append(e)
            try:
                self._lib.call("fairgo_comm_close", h)
            except _lib.FairgoError as e:
                errors.append(e)
        if self._store is not None:
            store, self._store = self._store, None
            try:
                store.close()
            except _lib.FairgoError as e:
                errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()

# The settings: keyword argument -> environment variable (fairgo.h and the
# README list them; fairgo_config_from_env reads the variables).
SETTINGS = {
    "algorithm": "FAIRGO_ALGORITHM",
    "slice_bytes": "FAIRGO_SLICE_BYTES",
    "flat_threshold_bytes": "FAIRGO_FLAT_THRESHOLD_BYTES",
    "timeout": "FAIRGO_TIMEOUT",
    "init_timeout": "FAIRGO_INIT_TIMEOUT",
    "device": "FAIRGO_DEVICE",
}

DEFAULT_TIMEOUT = 600.0  # seconds: fairgo_torch arms the watchdog unless told otherwise


def _env_set(name: str) -> bool:
    return bool(os.environ.get(name, "").strip())


def _algorithm(a) -> int:
    """The fairgo_algorithm_t of an algorithm's name (fairgo.h's enumerators,
    _lib.ALGORITHMS), or of an int, which is passed on as it is: the library
    judges it. A name that is none of the enumerators' cannot be translated."""
    if isinstance(a, int) and not isinstance(a, bool):
        return int(a)
    code = _lib.ALGORITHMS.get(a.strip().lower()) if isinstance(a, str) else None
    if code is None:
        raise _lib.InvalidArgumentError(_lib.ERR_INVALID_ARGUMENT, f"fairgo: algorithm {a!r}: want one of {', '.join(_lib.ALGORITHMS)}")
    return code


def _config(lib: _lib.Library, *, device=None, algorithm=None, slice_bytes=None, flat_threshold_bytes=None,
            timeout=None, init_timeout=None, op_timeout=_UNSET, flat_threshold=_UNSET) -> _lib.Config:
    """The fairgo_config_t of the settings: each keyword argument that is not
    None overrides its environment variable (SETTINGS), which overrides the
    default. op_timeout and flat_threshold are the former names of timeout
    and flat_threshold_bytes (op_timeout=None meant off). Values are only
    translated (seconds to milliseconds, algorithm names to numbers): the
    library judges them, fairgo_config_from_env here for the environment's,
    fairgo_init* for the rest, and an invalid one is its
    InvalidArgumentError naming the variable or the fairgo_config_t field."""
    if op_timeout is not _UNSET:
        if timeout is not None:
            raise _lib.InvalidArgumentError(_lib.ERR_INVALID_ARGUMENT, "fairgo: give timeout or its former name op_timeout, not both")
        timeout = 0 if op_timeout is None else op_timeout
    if flat_threshold is not _UNSET:
        if flat_threshold_bytes is not None:
            raise _lib.InvalidArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                            "fairgo: give flat_threshold_bytes or its former name flat_threshold, not both")
        flat_threshold_bytes = flat_threshold
    if timeout is None and not _env_set(SETTINGS["timeout"]):
        timeout = DEFAULT_TIMEOUT
    if device is None and not _env_set(SETTINGS["device"]):
        device = _default_device()
    return lib.config(
        device=device,
        algorithm=None if algorithm is None else _algorithm(algorithm),
        init_timeout_ms=None if init_timeout is None else _ms(init_timeout),
        op_timeout_ms=None if timeout is None else _ms(timeout),
        slice_bytes=slice_bytes,
        flat_threshold_bytes=flat_threshold_bytes,
    )


def _default_device() -> int:
    """PyTorch's current device when PyTorch has initialised CUDA, else -1
    (the library's default: the one visible GPU, else LOCAL_RANK)."""
    try:
        import torch
    except ImportError:
        return -1
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return -1


def init_rank(rank: int, world_size: int, local_rank: int, local_world_size: int, store_addr: Optional[str],
              *, lib: Optional[_lib.Library] = None, **settings) -> Comm:
    """A communicator from an explicit place in the job (fairgo_init_rank).
    settings are those of init()."""
    lib = lib or _lib.load()
    cfg = _config(lib, **settings)
    handle = ctypes.c_int64(0)
    lib.call("fairgo_init_rank", rank, world_size, local_rank, local_world_size,
             store_addr.encode() if store_addr else None, ctypes.byref(cfg), ctypes.byref(handle))
    return Comm(lib, handle.value)


def init_env(*, lib: Optional[_lib.Library] = None, **settings) -> Comm:
    """A communicator from the launch environment (fairgo_init): fairrun's
    FAIRGO_STORE_ADDR, else MASTER_ADDR:MASTER_PORT as a fairgo store.
    settings are those of init()."""
    lib = lib or _lib.load()
    cfg = _config(lib, **settings)
    handle = ctypes.c_int64(0)
    lib.call("fairgo_init", ctypes.byref(cfg), ctypes.byref(handle))
    return Comm(lib, handle.value)


def _host_for_peers() -> str:
    """The host name the other ranks reach rank 0's store at: $FAIRGO_STORE_HOST,
    else $MASTER_ADDR (rank 0's node under torchrun), else this host's name."""
    host = os.environ.get("FAIRGO_STORE_HOST") or os.environ.get("MASTER_ADDR") or socket.gethostname()
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def init_torch(*, lib: Optional[_lib.Library] = None, **settings) -> Comm:
    """A communicator for a job whose torch.distributed default process group
    is initialised (torchrun): rank 0 serves a fairgo store and broadcasts its
    address through the process group; ranks and world size are
    torch.distributed's, LOCAL_RANK and LOCAL_WORLD_SIZE the launcher's.
    settings are those of init()."""
    import torch.distributed as dist

    lib = lib or _lib.load()
    _config(lib, **settings)  # bad settings fail here, before rank 0 serves a store
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        local_rank = int(os.environ["LOCAL_RANK"])
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or world
    except (KeyError, ValueError) as e:
        raise _lib.InvalidArgumentError(_lib.ERR_INVALID_ARGUMENT, f"fairgo: LOCAL_RANK/LOCAL_WORLD_SIZE unusable ({e!r}); set them as torchrun does") from None
    store = None
    addr = [None]
    if world > 1:
        if rank == 0:
            store = serve_store(os.environ.get("FAIRGO_STORE_LISTEN", ":0"), lib)
            addr = [f"{_host_for_peers()}:{store.port}"]
        try:
            dist.broadcast_object_list(addr, src=0)
        except Exception:
            if store is not None:
                store.close()
            raise
    try:
        comm = init_rank(rank, world, local_rank, local_world, addr[0], lib=lib, **settings)
    except BaseException:
        if store is not None:
            store.close()
        raise
    comm._store = store
    return comm
