"""Element types of mirage tensors (``mi.float16``, ``mi.bfloat16``, ``mi.float32``).

``as_dtype`` turns whatever a user passes as a dtype (a mirage dtype, a name such as
``"float16"``, a torch dtype or a numpy dtype) into a :class:`DType`, without importing torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DType", "as_dtype", "bfloat16", "float16", "float32"]


class DType:
    """A mirage element type; compares equal to itself only and hashes by name."""

    __slots__ = ("_itemsize", "_name")

    def __init__(self, name: str, itemsize: int) -> None:
        self._name = name
        self._itemsize = itemsize

    @property
    def name(self) -> str:
        """The dtype's name: ``"float16"``, ``"bfloat16"`` or ``"float32"``."""
        return self._name

    @property
    def itemsize(self) -> int:
        """Size of one element in bytes."""
        return self._itemsize

    def to_torch(self) -> Any:
        """The matching ``torch.dtype`` (imports torch)."""
        import torch

        return getattr(torch, self._name)

    def __repr__(self) -> str:
        return f"mi.{self._name}"

    def __str__(self) -> str:
        return self._name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DType) and other._name == self._name

    def __hash__(self) -> int:
        return hash(("mirage.DType", self._name))

    def __reduce__(self) -> tuple[Any, ...]:
        return (as_dtype, (self._name,))


float16 = DType("float16", 2)
bfloat16 = DType("bfloat16", 2)
float32 = DType("float32", 4)

_BY_NAME = {
    "float16": float16,
    "half": float16,
    "fp16": float16,
    "bfloat16": bfloat16,
    "bf16": bfloat16,
    "float32": float32,
    "float": float32,
    "fp32": float32,
}


def as_dtype(dtype: Any, what: str = "dtype") -> DType:
    """Converts a mirage dtype, a name, a torch dtype or a numpy dtype to a :class:`DType`.

    Raises ``TypeError`` for anything else (other element types are not supported).
    """
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str):
        name = dtype.lower()
        for prefix in ("mi.", "mirage.", "torch.", "numpy.", "np."):
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
        if name in _BY_NAME:
            return _BY_NAME[name]
        raise TypeError(
            f"{what}: unknown dtype {dtype!r}; expected mi.float16, mi.bfloat16 or mi.float32"
        )
    module = type(dtype).__module__ or ""
    if module.startswith("torch"):
        # str(torch.float16) == "torch.float16"
        name = str(dtype)
        if name.startswith("torch.") and name[6:] in ("float16", "bfloat16", "float32"):
            return _BY_NAME[name[6:]]
        raise TypeError(
            f"{what}: unsupported torch dtype {dtype}; use float16, bfloat16 or float32"
        )
    try:
        import numpy as np

        npd = np.dtype(dtype)
    except (TypeError, ValueError):
        npd = None
    if npd is not None and npd in (np.dtype(np.float16), np.dtype(np.float32)):
        return float16 if npd == np.dtype(np.float16) else float32
    raise TypeError(
        f"{what}: unsupported dtype {dtype!r}; expected mi.float16, mi.bfloat16 or mi.float32 "
        "(or their names, torch dtypes or numpy float16/float32)"
    )
