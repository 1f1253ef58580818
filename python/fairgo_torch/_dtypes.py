"""PyTorch element types as fairgo's (fairgo_dtype_t). No PyTorch import:
dtypes are matched by str(dtype), e.g. "torch.bfloat16"."""

from __future__ import annotations

from typing import Dict

from . import _lib

# str(torch dtype) -> fairgo_dtype_t. Aliases (torch.float, torch.half,
# torch.long, ...) print as their canonical names.
TORCH_TO_FAIRGO: Dict[str, int] = {
    "torch.float16": _lib.FLOAT16,
    "torch.bfloat16": _lib.BFLOAT16,
    "torch.float32": _lib.FLOAT32,
    "torch.float64": _lib.FLOAT64,
    "torch.int8": _lib.INT8,
    "torch.uint8": _lib.UINT8,
    "torch.int32": _lib.INT32,
    "torch.uint32": _lib.UINT32,
    "torch.int64": _lib.INT64,
    "torch.uint64": _lib.UINT64,
}

# fairgo_dtype_t -> bytes per element
SIZES: Dict[int, int] = {
    _lib.FLOAT16: 2, _lib.BFLOAT16: 2, _lib.FLOAT32: 4, _lib.FLOAT64: 8,
    _lib.INT8: 1, _lib.UINT8: 1, _lib.INT32: 4, _lib.UINT32: 4, _lib.INT64: 8, _lib.UINT64: 8,
}


def fairgo_dtype(dtype) -> int:
    """The fairgo_dtype_t of a torch.dtype; TypeError for types fairgo does
    not reduce (bool, complex, float8, ...)."""
    key = str(dtype)
    try:
        return TORCH_TO_FAIRGO[key]
    except KeyError:
        raise TypeError(
            f"fairgo: cannot reduce tensors of {key}; supported: " + ", ".join(sorted(TORCH_TO_FAIRGO))
        ) from None


def fairgo_op(op) -> int:
    """The fairgo_op_t of an op name ("sum", "avg", "max", "min", "prod"), of
    a torch.distributed.ReduceOp (SUM, AVG, MAX, MIN, PRODUCT), or of an
    int already, which is passed on as it is: the library judges it."""
    if isinstance(op, bool):
        raise TypeError(f"fairgo: not a reduction operator: {op!r}")
    if isinstance(op, int):
        return int(op)
    name = str(op).lower()
    for prefix in ("reduceop.", "redoptype.", "torch.distributed.reduceop."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    try:
        return _lib.OPS[name]
    except KeyError:
        raise ValueError(f"fairgo: unknown reduction operator {op!r}; use one of sum, avg, max, min, prod") from None
