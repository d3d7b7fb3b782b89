"""Normalisation of user arguments (ints, dim tuples, grid maps) with clear error messages."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

from . import _core

__all__ = [
    "MAX_EXTENT",
    "MAX_NUMEL",
    "as_dim3",
    "as_dims",
    "as_float",
    "as_int",
    "as_map3",
    "short_repr",
]


#: Largest dim, grid extent and loop range; largest element count of a tensor (the core's
#: limits, `mirage._core.MAX_EXTENT` and `MAX_NUMEL`).
MAX_EXTENT: int = _core.MAX_EXTENT
MAX_NUMEL: int = _core.MAX_NUMEL
#: Most entries of a dims or map argument looked at before it is refused as too long.
_MAX_ENTRIES = 64
#: Most characters of a user value quoted in an error message.
_MAX_ECHO = 200


def short_repr(value: Any) -> str:
    """``repr(value)``, cut to a few hundred characters for error messages."""
    try:
        r = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the real error
        r = f"<{type(value).__name__} object>"
    return (
        r if len(r) <= _MAX_ECHO else f"{r[:_MAX_ECHO]}... ({len(r) - _MAX_ECHO} more characters)"
    )


def as_int(op: str, name: str, value: Any) -> int:
    """An integer argument (within int64); ``TypeError`` for anything that is not an integer."""
    if isinstance(value, bool):
        raise TypeError(f"{op}: {name} must be an integer, got {short_repr(value)}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{op}: {name} must be an integer, got {short_repr(value)}") from None
    if not -(2**63) <= v < 2**63:
        raise ValueError(f"{op}: {name} {short_repr(v)} is out of range (a 64-bit integer)")
    return v


def as_float(op: str, name: str, value: Any) -> float:
    """A real-number argument; ``TypeError`` for anything else, ``ValueError`` when it does
    not fit a float."""
    if isinstance(value, (bool, str, bytes)):
        raise TypeError(f"{op}: {name} must be a number, got {short_repr(value)}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{op}: {name} {short_repr(value)} is out of the float range") from None
    except (TypeError, ValueError):
        raise TypeError(f"{op}: {name} must be a number, got {short_repr(value)}") from None


def as_eps(op: str, value: Any) -> float:
    """An RMS epsilon: a finite number ``>= 0`` (``ValueError`` names the op otherwise)."""
    eps = as_float(op, "eps", value)
    if not math.isfinite(eps) or eps < 0.0:
        raise ValueError(f"{op}: eps {short_repr(value)} must be a finite number >= 0")
    if eps > 3.4e38:
        raise ValueError(f"{op}: eps {short_repr(value)} does not fit a float32")
    return eps


def _as_seq(op: str, name: str, value: Any) -> Sequence[Any]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{op}: {name} must be a tuple of integers, got {short_repr(value)}")
    out = []
    for v in value:
        out.append(v)
        if len(out) > _MAX_ENTRIES:
            raise ValueError(f"{op}: {name} has more than {_MAX_ENTRIES} entries")
    return out


def as_dims(
    op: str, name: str, value: Any, allow_int: bool = False, most: int = MAX_EXTENT
) -> tuple[int, ...]:
    """A tuple of non-negative integers of at most ``most`` each (dims, or strides with
    ``most=MAX_NUMEL``); the core checks ranks, zeros and element counts."""
    if allow_int and not hasattr(value, "__iter__"):
        value = (value,)
    out = tuple(as_int(op, f"{name}[{i}]", v) for i, v in enumerate(_as_seq(op, name, value)))
    if any(v < 0 for v in out):
        raise ValueError(f"{op}: {name} {out} has a negative entry")
    if any(v > most for v in out):
        raise ValueError(f"{op}: {name} {out} has an entry over the largest supported {most}")
    return out


def as_map3(op: str, name: str, value: Any) -> tuple[int, int, int]:
    """An input/output map: one data dim (or -1) per grid axis x, y, z; missing axes are -1."""
    vals = [as_int(op, name, v) for v in _as_seq(op, name, value)]
    if not 1 <= len(vals) <= 3:
        raise ValueError(f"{op}: {name} {tuple(vals)} must have 1 to 3 entries (grid axes x, y, z)")
    vals += [-1] * (3 - len(vals))
    return (vals[0], vals[1], vals[2])


def as_dim3(op: str, name: str, value: Any) -> tuple[int, int, int]:
    """A launch shape (x, y, z) of positive integers; an int or missing axes count as 1."""
    if not hasattr(value, "__iter__"):
        value = (value,)
    vals = [as_int(op, name, v) for v in _as_seq(op, name, value)]
    if not 1 <= len(vals) <= 3:
        raise ValueError(f"{op}: {name} {tuple(vals)} must have 1 to 3 entries (x, y, z)")
    if any(v < 1 for v in vals):
        raise ValueError(f"{op}: {name} {tuple(vals)} must be positive")
    if any(v > MAX_EXTENT for v in vals):
        raise ValueError(
            f"{op}: {name} {tuple(vals)} has an entry over the largest supported {MAX_EXTENT}"
        )
    vals += [1] * (3 - len(vals))
    return (vals[0], vals[1], vals[2])
