"""Threadblock graphs (:class:`TBGraph`): what one thread block of a customized op computes.

Build one with ``mi.new_threadblock_graph(grid_dim, block_dim, forloop_range, reduction_dimx)``,
add input iterators over kernel-graph tensors (``new_input``), tile ops, for-loop accumulators
and output savers (``new_output``), then add it to a kernel graph with
``KNGraph.customized(inputs, tb)``. Maps, loop splits and phases are checked by the Rust core
as each op is added.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _core
from ._args import MAX_EXTENT, as_dim3, as_eps, as_float, as_int, as_map3
from ._ops import install_unary_methods
from .tensor import DTensor, STensor

__all__ = ["TBGraph"]


class TBGraph:
    """A threadblock graph run by a grid of ``grid_dim`` blocks of ``block_dim`` threads."""

    def __init__(
        self,
        grid_dim: Any,
        block_dim: Any,
        forloop_range: int,
        reduction_dimx: int,
    ) -> None:
        op = "new_threadblock_graph"
        self._core = _core.BlockGraph(
            list(as_dim3(op, "grid_dim", grid_dim)),
            list(as_dim3(op, "block_dim", block_dim)),
            _positive(op, "forloop_range", forloop_range),
            _positive(op, "reduction_dimx", reduction_dimx),
        )
        self._inputs: list[DTensor] = []

    # ----------------------------------------------------------------- helpers
    def _sid(self, op: str, t: Any, what: str = "A") -> int:
        if not isinstance(t, STensor):
            raise TypeError(f"{op}: {what} must be an STensor of this threadblock graph, got {t!r}")
        if t.graph is not self:
            raise ValueError(f"{op}: {what} ({t!r}) belongs to another threadblock graph")
        return t.id

    def _wrap(self, sid: int) -> STensor:
        return STensor(self, sid)

    if TYPE_CHECKING:
        # The registry's unary ops (``exp``, ``silu``, ``tanh`` ...) are installed below.
        def __getattr__(self, name: str) -> Callable[[STensor], STensor]: ...

    def _unary(self, name: str, A: STensor, **params: float) -> STensor:
        return self._wrap(self._core.unary(name, self._sid(f"tb.{name}", A), **params))

    def _binary(self, name: str, A: STensor, B: STensor) -> STensor:
        op = f"tb.{name}"
        return self._wrap(self._core.binary(name, self._sid(op, A), self._sid(op, B, "B")))

    # ------------------------------------------------------- inputs, outputs
    def new_input(self, dtensor: DTensor, input_map: Any, forloop_dim: int) -> STensor:
        """Adds an input iterator over ``dtensor`` (its dims and dtype).

        ``input_map[axis]``: the data dim split across grid axis x/y/z, or -1 to replicate;
        ``forloop_dim``: the dim split into ``forloop_range`` tiles, or -1 for none. The
        customized op's ``i``-th input must match the ``i``-th ``new_input``'s tensor.
        """
        op = "tb.new_input"
        if not isinstance(dtensor, DTensor):
            raise TypeError(f"{op}: dtensor must be a DTensor of a kernel graph, got {dtensor!r}")
        imap = as_map3(op, "input_map", input_map)
        fdim = as_int(op, "forloop_dim", forloop_dim)
        sid = self._core.new_input(list(dtensor.dims), dtensor.dtype.name, list(imap), fdim)
        self._inputs.append(dtensor)
        return self._wrap(sid)

    def new_output(self, stensor: STensor, output_map: Any, forloop_dim: int = -1) -> None:
        """Adds an output saver for ``stensor``.

        ``output_map[axis]``: the output dim each grid axis places blocks along; with
        ``forloop_dim >= 0`` every iteration's tile is saved along that dim instead.
        """
        op = "tb.new_output"
        omap = as_map3(op, "output_map", output_map)
        fdim = as_int(op, "forloop_dim", forloop_dim)
        self._core.new_output(self._sid(op, stensor, "stensor"), list(omap), fdim)

    # --------------------------------------------------------------------- ops
    def matmul(self, A: STensor, B: STensor) -> STensor:
        """Tile matmul ``[.., m, k] x [.., k, n]``."""
        op = "tb.matmul"
        return self._wrap(self._core.matmul(self._sid(op, A), self._sid(op, B, "B")))

    def clamp(self, A: STensor, min_val: float, max_val: float) -> STensor:
        """Element-wise ``min(max(A, min_val), max_val)``."""
        lo = as_float("tb.clamp", "min_val", min_val)
        hi = as_float("tb.clamp", "max_val", max_val)
        return self._unary("clamp", A, min=lo, max=hi)

    def mul_scalar(self, A: STensor, scalar: float) -> STensor:
        """Element-wise ``A * scalar``."""
        return self._unary("mul_scalar", A, scalar=as_float("tb.mul_scalar", "scalar", scalar))

    def add(self, A: STensor, B: STensor) -> STensor:
        """``A + B`` (a dim broadcasts when it is 1)."""
        return self._binary("add", A, B)

    def mul(self, A: STensor, B: STensor) -> STensor:
        """``A * B`` (a dim broadcasts when it is 1)."""
        return self._binary("mul", A, B)

    def div(self, A: STensor, B: STensor) -> STensor:
        """``A / B`` (a dim broadcasts when it is 1)."""
        return self._binary("div", A, B)

    def sub(self, A: STensor, B: STensor) -> STensor:
        """``A - B`` (a dim broadcasts when it is 1)."""
        return self._binary("sub", A, B)

    def pow(self, A: STensor, B: STensor) -> STensor:
        """``A ** B`` (a dim broadcasts when it is 1)."""
        return self._binary("pow", A, B)

    def reduction(self, A: STensor, dim: int) -> STensor:
        """Sum over ``dim``, kept with size 1."""
        op = "tb.reduction"
        return self._wrap(self._core.reduction(self._sid(op, A), as_int(op, "dim", dim)))

    def reduction_max(self, A: STensor, dim: int) -> tuple[STensor, STensor]:
        """Running max of ``A`` over ``dim`` and the iterations so far, and its change
        ``(max, diff)`` with ``diff = previous max - max`` (for online softmax)."""
        op = "tb.reduction_max"
        m, d = self._core.reduction_max(self._sid(op, A), as_int(op, "dim", dim))
        return self._wrap(m), self._wrap(d)

    def rms_norm(self, A: STensor, eps: float = 0.0) -> STensor:
        """``A / sqrt(mean(A^2) + eps)`` over the last dim."""
        op = "tb.rms_norm"
        return self._wrap(self._core.rms_norm(self._sid(op, A), as_eps(op, eps)))

    def concat(self, A: STensor, B: STensor, dim: int) -> STensor:
        """Concatenation along ``dim``."""
        op = "tb.concat"
        return self._wrap(
            self._core.concat(self._sid(op, A), self._sid(op, B, "B"), as_int(op, "dim", dim))
        )

    def forloop_accum(self, A: STensor, acc: str | None = None, eps: float = 0.0) -> STensor:
        """Closes the for-loop: ``None`` sums tiles element-wise over iterations; ``"sum"`` also
        sums the last dim to 1; ``"mean"`` / ``"rms"`` divide by the element count (rms: of
        squares, plus ``eps``, then the root); ``"sum_todimx"`` folds the last dim to
        ``reduction_dimx``. ``eps`` is allowed with ``"rms"`` only."""
        op = "tb.forloop_accum"
        e = as_eps(op, eps)
        return self._wrap(self._core.forloop_accum(self._sid(op, A), _acc(op, acc), e))

    def forloop_accum_rescale(self, A: STensor, B: STensor, acc: str | None = None) -> STensor:
        """Rescaling accumulator ``acc = acc * B + A`` (``acc`` is None or ``"sum"``)."""
        op = "tb.forloop_accum_rescale"
        return self._wrap(
            self._core.forloop_accum_rescale(self._sid(op, A), self._sid(op, B, "B"), _acc(op, acc))
        )

    def forloop_accum_max(self, A: STensor) -> STensor:
        """Element-wise max over iterations."""
        return self._wrap(self._core.forloop_accum_max(self._sid("tb.forloop_accum_max", A)))

    # ---------------------------------------------------------------- queries
    @property
    def inputs(self) -> list[DTensor]:
        """The kernel-graph tensors given to ``new_input``, in order."""
        return list(self._inputs)

    @property
    def num_outputs(self) -> int:
        """Number of ``new_output`` calls so far."""
        return self._core.num_outputs

    @property
    def grid_dim(self) -> tuple[int, int, int]:
        """Blocks per grid axis."""
        return tuple(self._core.grid_dim)  # type: ignore[return-value]

    @property
    def block_dim(self) -> tuple[int, int, int]:
        """Threads per block axis."""
        return tuple(self._core.block_dim)  # type: ignore[return-value]

    @property
    def forloop_range(self) -> int:
        """Iterations of the for-loop."""
        return self._core.forloop_range

    @property
    def reduction_dimx(self) -> int:
        """Width the ``sum_todimx`` accumulator folds to."""
        return self._core.reduction_dimx

    def __repr__(self) -> str:
        return (
            f"TBGraph(grid_dim={self.grid_dim}, block_dim={self.block_dim}, "
            f"forloop_range={self.forloop_range}, {self._core.num_ops} ops)"
        )


def _positive(op: str, name: str, value: Any) -> int:
    v = as_int(op, name, value)
    if not 1 <= v <= MAX_EXTENT:
        raise ValueError(f"{op}: {name} must be 1 to {MAX_EXTENT}, got {v}")
    return v


def _acc(op: str, acc: str | None) -> str | None:
    if acc is not None and not isinstance(acc, str):
        raise TypeError(f"{op}: acc must be None or a string, got {acc!r}")
    return acc


install_unary_methods(TBGraph)
