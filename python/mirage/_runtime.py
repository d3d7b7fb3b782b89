"""Running a kernel graph on the CPU interpreter: per-call input checks and conversion.

Every call checks every input before any work: count (``ValueError``), kind (``TypeError``),
device (``ValueError``), dtype (``TypeError``), shape (``ValueError``) and, where the graph
declared explicit strides, the layout (``ValueError``). Inputs then travel to Rust as float32
little-endian row-major ``bytes``; outputs come back the same way and are rebuilt as torch
tensors (when any input was a torch tensor) or numpy arrays, in each output's dtype and layout.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._dtypes import DType, bfloat16, float16, float32

__all__ = ["InputSpec", "as_input_list", "build_outputs", "prepare_inputs"]

_NUMPY_DTYPES = {np.dtype(np.float16): float16, np.dtype(np.float32): float32}


@dataclass(frozen=True)
class InputSpec:
    """What one graph input must be: dims, dtype and (optionally) an exact layout."""

    dims: tuple[int, ...]
    dtype: DType
    strides: tuple[int, ...] | None  # explicit layout in elements; None accepts any layout


def _torch_module() -> Any:
    return sys.modules.get("torch")


def is_torch_tensor(x: object) -> bool:
    """Whether ``x`` is a torch tensor (never imports torch)."""
    torch = _torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def _layout_matches(dims: Sequence[int], have: Sequence[int], want: Sequence[int]) -> bool:
    # A dim of size 1 may have any stride.
    return len(have) == len(want) and all(h == w for d, h, w in zip(dims, have, want) if d != 1)


def _check_one(i: int, spec: InputSpec, x: Any) -> bool:
    """Checks input ``i``; returns whether it is a torch tensor."""
    if is_torch_tensor(x):
        torch = _torch_module()
        if x.device.type != "cpu":
            raise ValueError(
                f"input {i} is on device {x.device}: the CPU interpreter needs CPU tensors; "
                "CUDA execution comes with code generation"
            )
        if x.layout != torch.strided:
            raise ValueError(f"input {i} has layout {x.layout}; only dense tensors are supported")
        want = spec.dtype.to_torch()
        if x.dtype != want:
            raise TypeError(
                f"input {i}: expected dtype {want} (graph dtype {spec.dtype!r}), got {x.dtype}"
            )
        shape, strides = tuple(x.shape), tuple(x.stride())
        is_torch = True
    elif isinstance(x, np.ndarray):
        got = _NUMPY_DTYPES.get(x.dtype)
        if spec.dtype == bfloat16:
            raise TypeError(
                f"input {i}: the graph declares bfloat16, which numpy lacks; pass a torch tensor "
                f"of dtype torch.bfloat16 (got a numpy array of dtype {x.dtype})"
            )
        if got != spec.dtype:
            raise TypeError(
                f"input {i}: expected a numpy array of dtype {spec.dtype.name}, got dtype {x.dtype}"
            )
        shape = tuple(x.shape)
        item = x.itemsize
        strides = tuple(s // item if s % item == 0 else -1 for s in x.strides)
        is_torch = False
    else:
        raise TypeError(
            f"input {i}: expected a torch tensor or a numpy array, got {type(x).__name__}"
        )
    if shape != spec.dims:
        raise ValueError(f"input {i}: expected shape {spec.dims}, got {shape}")
    if spec.strides is not None and not _layout_matches(shape, strides, spec.strides):
        raise ValueError(
            f"input {i}: the graph declares strides {spec.strides} for this input, "
            f"but the tensor has strides {strides}"
        )
    return is_torch


def _to_f32_bytes(x: Any, is_torch: bool) -> bytes:
    if is_torch:
        torch = _torch_module()
        x = x.detach().resolve_neg()
        # numpy widens float16 faster than torch; bfloat16 has no numpy dtype.
        x = x.to(torch.float32).numpy() if x.dtype == torch.bfloat16 else x.numpy()
    # One pass: widen to float32 and compact to row-major.
    return np.ascontiguousarray(x, dtype="<f4").tobytes()


def as_input_list(inputs: Any) -> list[Any]:
    """The ``inputs`` of a graph call as a list, read once (a generator is consumed here and
    only here); ``TypeError`` for a single tensor or a non-iterable."""
    if inputs is None:
        return []
    if isinstance(inputs, np.ndarray) or is_torch_tensor(inputs):
        raise TypeError("inputs must be a list of tensors, got a single tensor (wrap it in a list)")
    if isinstance(inputs, (str, bytes, Mapping)):
        raise TypeError(f"inputs must be a list of tensors, got {type(inputs).__name__}")
    try:
        return list(inputs)
    except TypeError:
        raise TypeError(f"inputs must be a list of tensors, got {type(inputs).__name__}") from None


def prepare_inputs(specs: Sequence[InputSpec], inputs: Any) -> tuple[list[bytes], bool]:
    """Checks ``inputs`` against ``specs`` and encodes them.

    Returns the float32 little-endian bytes of each input and whether any input was a torch
    tensor (outputs are then torch tensors too).
    """
    items = as_input_list(inputs)
    if len(items) != len(specs):
        raise ValueError(f"the graph has {len(specs)} inputs but {len(items)} were given")
    kinds = [_check_one(i, spec, x) for i, (spec, x) in enumerate(zip(specs, items))]
    return [_to_f32_bytes(x, k) for x, k in zip(items, kinds)], any(kinds)


def _apply_layout(a: Any, strides: Sequence[int], is_torch: bool) -> Any:
    """Returns ``a`` (row-major) re-laid out with the dense ``strides`` (in elements)."""
    dims = tuple(a.shape)
    if _layout_matches(dims, row_major(dims), strides):
        return a
    order = sorted(range(len(dims)), key=lambda d: (-strides[d], d))
    inverse = [order.index(d) for d in range(len(dims))]
    if is_torch:
        return a.permute(order).contiguous().permute(inverse)
    return np.ascontiguousarray(a.transpose(order)).transpose(inverse)


def row_major(dims: Sequence[int]) -> tuple[int, ...]:
    """The strides (in elements) of a dense row-major tensor of ``dims``."""
    out = [1] * len(dims)
    for d in range(len(dims) - 2, -1, -1):
        out[d] = out[d + 1] * dims[d + 1]
    return tuple(out)


def build_outputs(
    raw: Sequence[bytes],
    dims: Sequence[Sequence[int]],
    dtypes: Sequence[DType],
    strides: Sequence[Sequence[int]],
    as_torch: bool,
) -> list[Any]:
    """Rebuilds interpreter outputs (float32 bytes) as torch tensors or numpy arrays."""
    outs: list[Any] = []
    for b, d, dt, st in zip(raw, dims, dtypes, strides):
        arr = np.frombuffer(b, dtype="<f4").reshape(tuple(d))
        if as_torch or dt == bfloat16:
            import torch

            t = torch.from_numpy(arr.copy())  # writable (bytes are read-only)
            if dt != float32:
                t = t.to(dt.to_torch())
            outs.append(_apply_layout(t, st, True))
        else:
            out = arr.astype(np.float16 if dt == float16 else np.float32)
            outs.append(_apply_layout(out, st, False))
    return outs
