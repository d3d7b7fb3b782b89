"""Tensor handles of the Python API.

A :class:`DTensor` is a tensor in device memory of one kernel graph; an :class:`STensor` is a
tile of one threadblock graph. Both are light handles (graph, id) that cache their dims and
dtype; the graphs themselves live in Rust.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._dtypes import DType, as_dtype

if TYPE_CHECKING:
    from .kernel import KNGraph
    from .threadblock import TBGraph

__all__ = ["DTensor", "STensor"]


class _TensorHandle:
    __slots__ = ("_dims", "_dtype", "_graph", "_id")

    def __init__(self, graph: KNGraph | TBGraph, tid: int) -> None:
        self._graph = graph
        self._id = tid
        core = graph._core
        self._dims: tuple[int, ...] = tuple(core.tensor_dims(tid))
        self._dtype: DType = as_dtype(core.tensor_dtype(tid))

    @property
    def id(self) -> int:
        """The tensor's index in its graph."""
        return self._id

    @property
    def dims(self) -> tuple[int, ...]:
        """The tensor's dims."""
        return self._dims

    @property
    def shape(self) -> tuple[int, ...]:
        """Alias of :attr:`dims`."""
        return self._dims

    @property
    def dtype(self) -> DType:
        """The tensor's element type."""
        return self._dtype

    @property
    def num_dims(self) -> int:
        """The tensor's rank."""
        return len(self._dims)

    def dim(self, i: int) -> int:
        """Size of dim ``i`` (negative counts from the end)."""
        return self._dims[i]

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and other._graph is self._graph  # type: ignore[attr-defined]
            and other._id == self._id  # type: ignore[attr-defined]
        )

    def __hash__(self) -> int:
        return hash((id(self._graph), self._id))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(#{self._id}, dims={self._dims}, dtype={self._dtype!r})"


class DTensor(_TensorHandle):
    """A tensor in device memory, produced by an op of a :class:`~mirage.KNGraph`."""

    __slots__ = ()

    @property
    def graph(self) -> KNGraph:
        """The kernel graph the tensor belongs to."""
        return self._graph  # type: ignore[return-value]


class STensor(_TensorHandle):
    """A tile tensor of a :class:`~mirage.TBGraph` (what one thread block holds)."""

    __slots__ = ()

    @property
    def graph(self) -> TBGraph:
        """The threadblock graph the tensor belongs to."""
        return self._graph  # type: ignore[return-value]
