"""Normalisation of user arguments (ints, dim tuples, grid maps) with clear error messages."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

__all__ = ["as_dim3", "as_dims", "as_int", "as_map3"]


def as_int(op: str, name: str, value: Any) -> int:
    """An integer argument; ``TypeError`` for anything that is not an integer."""
    if isinstance(value, bool):
        raise TypeError(f"{op}: {name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{op}: {name} must be an integer, got {value!r}") from None


def _as_seq(op: str, name: str, value: Any) -> Sequence[Any]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{op}: {name} must be a tuple of integers, got {value!r}")
    return list(value)


def as_dims(op: str, name: str, value: Any, allow_int: bool = False) -> tuple[int, ...]:
    """A tuple of non-negative integers (dims or strides); the core checks ranks and zeros."""
    if allow_int and not hasattr(value, "__iter__"):
        value = (value,)
    out = tuple(as_int(op, name, v) for v in _as_seq(op, name, value))
    if any(v < 0 for v in out):
        raise ValueError(f"{op}: {name} {out} has a negative entry")
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
    vals += [1] * (3 - len(vals))
    return (vals[0], vals[1], vals[2])
