"""ctypes binding of libfairgo.so (cmd/libfairgo/fairgo.h). No PyTorch here.

The library is found at $FAIRGO_LIB (a file, or a directory holding
libfairgo.so), else inside this package (where the wheel puts it), else in
lib/ of the fairgo repository this package sits in. It loads on any host: it
loads the CUDA driver itself when the first communicator is made, and
without a GPU that fails with :class:`NoDeviceError`.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ABI_VERSION = 5
LIB_NAME = "libfairgo.so"
ENV_LIB = "FAIRGO_LIB"

# fairgo_result_t
OK = 0
NOT_READY = 1
ERR_INVALID_ARGUMENT = 2
ERR_BAD_HANDLE = 3
ERR_MISMATCH = 4
ERR_TIMEOUT = 5
ERR_ABORTED = 6
ERR_CLOSED = 7
ERR_CUDA = 8
ERR_NCCL = 9
ERR_SYSTEM = 10
ERR_INTERNAL = 11
ERR_NO_DEVICE = 12

RESULT_NAMES: Dict[int, str] = {
    OK: "FAIRGO_OK",
    NOT_READY: "FAIRGO_NOT_READY",
    ERR_INVALID_ARGUMENT: "FAIRGO_ERR_INVALID_ARGUMENT",
    ERR_BAD_HANDLE: "FAIRGO_ERR_BAD_HANDLE",
    ERR_MISMATCH: "FAIRGO_ERR_MISMATCH",
    ERR_TIMEOUT: "FAIRGO_ERR_TIMEOUT",
    ERR_ABORTED: "FAIRGO_ERR_ABORTED",
    ERR_CLOSED: "FAIRGO_ERR_CLOSED",
    ERR_CUDA: "FAIRGO_ERR_CUDA",
    ERR_NCCL: "FAIRGO_ERR_NCCL",
    ERR_SYSTEM: "FAIRGO_ERR_SYSTEM",
    ERR_INTERNAL: "FAIRGO_ERR_INTERNAL",
    ERR_NO_DEVICE: "FAIRGO_ERR_NO_DEVICE",
}

# fairgo_dtype_t (fairgo.DType)
FLOAT16 = 1
BFLOAT16 = 2
FLOAT32 = 3
FLOAT64 = 4
INT8 = 5
UINT8 = 6
INT32 = 7
UINT32 = 8
INT64 = 9
UINT64 = 10

# fairgo_op_t (fairgo.Op)
SUM = 1
AVG = 2
MAX = 3
MIN = 4
PROD = 5

OPS: Dict[str, int] = {"sum": SUM, "avg": AVG, "mean": AVG, "max": MAX, "min": MIN, "prod": PROD, "product": PROD}

# fairgo_algorithm_t (hier.Algorithm)
ALGORITHM_AUTO = 0
ALGORITHM_FLAT = 1
ALGORITHM_RAIL_A2A = 2
ALGORITHM_RAIL_RSAG = 3
ALGORITHM_RAIL_ALLREDUCE = 4
ALGORITHM_FLAT_RING = 5
ALGORITHM_FLAT_TREE = 6
ALGORITHM_HALVING_DOUBLING = 7
ALGORITHM_RECURSIVE_DOUBLING = 8

ALGORITHMS: Dict[str, int] = {
    "auto": ALGORITHM_AUTO, "flat": ALGORITHM_FLAT, "rail-a2a": ALGORITHM_RAIL_A2A, "rail-rsag": ALGORITHM_RAIL_RSAG,
    "rail-allreduce": ALGORITHM_RAIL_ALLREDUCE, "flat-ring": ALGORITHM_FLAT_RING, "flat-tree": ALGORITHM_FLAT_TREE,
    "halving-doubling": ALGORITHM_HALVING_DOUBLING, "recursive-doubling": ALGORITHM_RECURSIVE_DOUBLING,
}


class FairgoError(RuntimeError):
    """An error reported by libfairgo: ``code`` is the fairgo_result_t,
    ``name`` its C name, and the message the library's text."""

    def __init__(self, code: Optional[int], message: str):
        self.code = code
        self.name = RESULT_NAMES.get(code, "FAIRGO_UNKNOWN_RESULT") if code is not None else None
        super().__init__(message if code is None else f"{message} [{self.name}]")


class NotReadyError(FairgoError):
    """FAIRGO_NOT_READY: Work.wait's timeout passed before the work completed
    (not a failure of the work: it goes on)."""


class InvalidArgumentError(FairgoError, ValueError):
    """FAIRGO_ERR_INVALID_ARGUMENT: a bad argument, config or launch environment."""


class BadHandleError(FairgoError):
    """FAIRGO_ERR_BAD_HANDLE: a closed or freed communicator, work or store."""


class MismatchError(FairgoError):
    """FAIRGO_ERR_MISMATCH: the ranks made different calls."""


class FairgoTimeoutError(FairgoError):
    """FAIRGO_ERR_TIMEOUT: the watchdog (op_timeout) or a deadline of init expired."""


class AbortedError(FairgoError):
    """FAIRGO_ERR_ABORTED: the communicators were aborted (a failed peer)."""


class ClosedError(FairgoError):
    """FAIRGO_ERR_CLOSED: the communicator was closed while work was pending."""


class CudaError(FairgoError):
    """FAIRGO_ERR_CUDA: a CUDA driver error."""


class NcclError(FairgoError):
    """FAIRGO_ERR_NCCL: an NCCL error, or NCCL could not be loaded."""


class NoDeviceError(CudaError):
    """FAIRGO_ERR_NO_DEVICE: no GPU or no GPU driver on this host; the message
    names what is missing and every path tried."""


class FairgoSystemError(FairgoError):
    """FAIRGO_ERR_SYSTEM: the store, the network, the operating system."""


class InternalError(FairgoError):
    """FAIRGO_ERR_INTERNAL: a bug in fairgo (a recovered Go panic)."""


class LibraryError(FairgoError):
    """libfairgo.so could not be found or loaded (``code`` is None)."""

    def __init__(self, message: str):
        super().__init__(None, message)


ERRORS = {
    ERR_INVALID_ARGUMENT: InvalidArgumentError,
    ERR_BAD_HANDLE: BadHandleError,
    ERR_MISMATCH: MismatchError,
    ERR_TIMEOUT: FairgoTimeoutError,
    ERR_ABORTED: AbortedError,
    ERR_CLOSED: ClosedError,
    ERR_CUDA: CudaError,
    ERR_NCCL: NcclError,
    ERR_SYSTEM: FairgoSystemError,
    ERR_INTERNAL: InternalError,
    ERR_NO_DEVICE: NoDeviceError,
}


def error_for(code: int, text: str) -> FairgoError:
    """The exception of a result code and the library's error text."""
    return ERRORS.get(code, FairgoError)(code, text or "fairgo: error without text")


class Config(ctypes.Structure):
    """fairgo_config_t."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("device", ctypes.c_int32),
        ("init_timeout_ms", ctypes.c_int64),
        ("op_timeout_ms", ctypes.c_int64),
        ("slice_bytes", ctypes.c_int64),
        ("flat_threshold_bytes", ctypes.c_int64),
        ("algorithm", ctypes.c_int32),
    ]


class CommInfo(ctypes.Structure):
    """fairgo_comm_info_t: seven int32_t."""

    _fields_ = [
        (name, ctypes.c_int32) for name in ("rank", "world_size", "machines", "devices", "machine", "local", "device")
    ]


_c_handle = ctypes.c_int64
_P = ctypes.POINTER

# name: (restype, argtypes)
PROTOTYPES: Dict[str, Tuple[object, List[object]]] = {
    "fairgo_abi_version": (ctypes.c_int, []),
    "fairgo_version": (ctypes.c_char_p, []),
    "fairgo_result_string": (ctypes.c_char_p, [ctypes.c_int]),
    "fairgo_last_error": (ctypes.c_char_p, []),
    "fairgo_config_init": (None, [_P(Config)]),
    "fairgo_config_from_env": (ctypes.c_int, [_P(Config)]),
    "fairgo_init": (ctypes.c_int, [_P(Config), _P(_c_handle)]),
    "fairgo_init_rank": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, _P(Config), _P(_c_handle)],
    ),
    "fairgo_comm_info": (ctypes.c_int, [_c_handle, _P(CommInfo)]),
    "fairgo_comm_algorithm": (ctypes.c_int, [_c_handle, ctypes.c_int64, _P(ctypes.c_int32), _P(ctypes.c_int32)]),
    "fairgo_comm_close": (ctypes.c_int, [_c_handle]),
    "fairgo_allreduce": (
        ctypes.c_int,
        [_c_handle, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, _P(_c_handle)],
    ),
    "fairgo_allreduce_async": (
        ctypes.c_int,
        [_c_handle, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, _P(_c_handle)],
    ),
    "fairgo_work_stream_wait": (ctypes.c_int, [_c_handle, ctypes.c_void_p]),
    "fairgo_work_test": (ctypes.c_int, [_c_handle, _P(ctypes.c_int)]),
    "fairgo_work_wait": (ctypes.c_int, [_c_handle, ctypes.c_int64]),
    "fairgo_work_free": (ctypes.c_int, [_c_handle]),
    "fairgo_store_serve": (ctypes.c_int, [ctypes.c_char_p, _P(_c_handle), ctypes.c_char_p, ctypes.c_size_t]),
    "fairgo_store_close": (ctypes.c_int, [_c_handle]),
}


def candidate_paths() -> List[Path]:
    """Where :func:`load` looks, in order: $FAIRGO_LIB alone when set; else
    this package's directory (the wheel's copy), the directory holding it,
    and lib/ of the repository (python/fairgo_torch -> ../../lib)."""
    env = os.environ.get(ENV_LIB, "").strip()
    if env:
        p = Path(env).expanduser()
        return [p / LIB_NAME if p.is_dir() else p]
    here = Path(__file__).resolve().parent
    return [here / LIB_NAME, here.parent / LIB_NAME, here.parent.parent / "lib" / LIB_NAME]


def needed_libraries(path: Path) -> Optional[List[str]]:
    """The DT_NEEDED entries of an ELF64 little-endian shared object, or None
    when the file cannot be parsed."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    try:
        phoff, = struct.unpack_from("<Q", data, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
        loads, dynamic = [], None
        for i in range(phnum):
            p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
            if p_type == 1:  # PT_LOAD
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == 2:  # PT_DYNAMIC
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            return []
        needed, strtab = [], None
        off, end = dynamic[0], dynamic[0] + dynamic[1]
        while off + 16 <= end:
            tag, val = struct.unpack_from("<qQ", data, off)
            off += 16
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                needed.append(val)
            elif tag == 5:  # DT_STRTAB (a virtual address)
                strtab = val
        if strtab is None:
            return None
        for vaddr, foff, size in loads:
            if vaddr <= strtab < vaddr + size:
                base = foff + (strtab - vaddr)
                break
        else:
            return None
        names = []
        for n in needed:
            start = base + n
            names.append(data[start:data.index(b"\0", start)].decode("utf-8", "replace"))
        return names
    except (struct.error, ValueError):
        return None


def _dlopen_lazy(path: Path) -> int:
    """dlopen(path, RTLD_LAZY | RTLD_LOCAL). ctypes.CDLL would add RTLD_NOW,
    which fails on the NVML functions the library leaves unresolved
    (go-nvml binds them to libnvidia-ml.so.1, loaded only when NVML is
    used): they must be bound lazily."""
    libc = ctypes.CDLL(None)
    dlopen, dlerror = libc.dlopen, libc.dlerror
    dlopen.restype, dlopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
    dlerror.restype, dlerror.argtypes = ctypes.c_char_p, []
    handle = dlopen(os.fsencode(str(path)), os.RTLD_LAZY | os.RTLD_LOCAL)
    if not handle:
        err = dlerror()
        raise LibraryError(f"fairgo: cannot load {path}: {err.decode('utf-8', 'replace') if err else 'dlopen failed'}")
    return handle


class Library:
    """libfairgo.so with its prototypes set, and the calls' error handling."""

    def __init__(self, path: Path):
        self.path = path
        self.dll = ctypes.CDLL(str(path), handle=_dlopen_lazy(path))
        for name, (restype, argtypes) in PROTOTYPES.items():
            try:
                fn = getattr(self.dll, name)
            except AttributeError:
                raise LibraryError(f"fairgo: {path} has no function {name}: not a libfairgo.so of this version") from None
            fn.restype = restype
            fn.argtypes = argtypes
        v = self.dll.fairgo_abi_version()
        if v != ABI_VERSION:
            raise LibraryError(f"fairgo: {path} has ABI version {v}; this package needs {ABI_VERSION}")

    def last_error(self) -> str:
        t = self.dll.fairgo_last_error()
        return t.decode("utf-8", "replace") if t else ""

    def check(self, code: int) -> int:
        """Raises the exception of an error code (with this thread's error
        text); returns OK and NOT_READY."""
        if code in (OK, NOT_READY):
            return code
        raise error_for(code, self.last_error())

    def call(self, name: str, *args) -> int:
        return self.check(getattr(self.dll, name)(*args))

    def config(self, **fields) -> Config:
        """fairgo_config_init, then the environment's settings
        (fairgo_config_from_env: FAIRGO_ALGORITHM, ...), then the fields
        given that are not None."""
        cfg = Config()
        self.dll.fairgo_config_init(ctypes.byref(cfg))
        self.call("fairgo_config_from_env", ctypes.byref(cfg))
        for k, v in fields.items():
            if v is not None:
                setattr(cfg, k, v)
        return cfg


_lock = threading.Lock()
_lib: Optional[Library] = None


def load(paths: Optional[Sequence[Path]] = None) -> Library:
    """Loads libfairgo.so (once per process when paths is None) from the
    first of paths (default: :func:`candidate_paths`) that exists. Raises
    LibraryError naming every path tried."""
    global _lib
    if paths is None:
        with _lock:
            if _lib is None:
                _lib = _load(candidate_paths())
            return _lib
    return _load(list(paths))


def _load(paths: Sequence[Path]) -> Library:
    tried = []
    for p in paths:
        if not p.is_file():
            tried.append(f"{p} (no such file)")
            continue
        return Library(p)
    how = f"${ENV_LIB}" if os.environ.get(ENV_LIB, "").strip() else f"${ENV_LIB}, next to the package, lib/ of the repository"
    raise LibraryError(
        f"fairgo: cannot find {LIB_NAME} ({how}); tried: " + "; ".join(tried)
        + f". Install the fairgo_torch wheel (make wheel), or build it with `make libfairgo` in the fairgo "
        f"repository and set {ENV_LIB}=/path/to/{LIB_NAME}."
    )
