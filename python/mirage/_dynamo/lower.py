"""Lowering of one FX region (a torch-level graph that dynamo captured) to a mirage kernel
graph at concrete input shapes.

The region's ops are read in order and each becomes mirage ops (docs/dynamo.md lists them).
Four kinds of values flow between them:

* ``Ref``: a region input, possibly behind view ops (``transpose``, ``view``, casts ...). It
  becomes a mirage input only when a computing op uses it; the views are replayed on the real
  tensor at every call (a transposed weight is passed as a strided view, not copied).
* ``Val``: a mirage tensor, and whether it depends on the rows of the activations.
* ``float``: a Python constant (also ``x.item()`` of a 0-d region input, read at lowering).
* ``Pat``: a partial RMS-norm pattern (``x.pow(2)``, ``mean``, ``+ eps``, ``rsqrt``, ``x *
  rsqrt``), folded into one ``rms_norm(x, eps)`` when complete.

An op that is not supported raises :class:`Unsupported` with the reason; the caller then runs
the region through the fallback compiler.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from .. import _dtypes
from ..kernel import KNGraph
from ..tensor import DTensor

__all__ = ["Lowered", "Unsupported", "is_supported_node", "lower_region"]


class Unsupported(Exception):
    """The region cannot be lowered; the message says which op and why."""


# ---------------------------------------------------------------------------- op tables
_UNARY: dict[Any, str] = {
    F.silu: "silu",
    F.gelu: "gelu",
    F.relu: "relu",
    torch.relu: "relu",
    torch.exp: "exp",
    torch.sqrt: "sqrt",
    torch.tanh: "tanh",
    torch.square: "square",
}
_UNARY_METHODS = {"exp": "exp", "sqrt": "sqrt", "tanh": "tanh", "relu": "relu", "square": "square"}
_BINARY: dict[Any, str] = {
    operator.add: "add",
    operator.mul: "mul",
    operator.sub: "sub",
    operator.truediv: "div",
    torch.add: "add",
    torch.mul: "mul",
    torch.sub: "sub",
    torch.div: "div",
}
_BINARY_METHODS = {"add": "add", "mul": "mul", "sub": "sub", "div": "div"}
_MATMUL = {operator.matmul, torch.matmul, torch.mm, torch.bmm}
_LINEAR = {F.linear, torch._C._nn.linear}
_SOFTMAX = {torch.softmax, F.softmax}
_RMS_NORM = {F.rms_norm, getattr(torch, "rms_norm", F.rms_norm)}
_SDPA = {F.scaled_dot_product_attention}
_RSQRT = {torch.rsqrt}
_POW = {torch.pow, operator.pow}
_MEAN = {torch.mean}
#: View-like ops replayed on region inputs (a view of a computed value is not supported).
_VIEW_METHODS = {"transpose", "permute", "t", "view", "reshape", "contiguous", "unsqueeze"}
_VIEW_FUNCS = {torch.transpose, torch.permute, torch.t, torch.reshape, torch.unsqueeze}
#: Casts: value-preserving inside a region (mirage computes in float32 and stores the
#: region's dtype); the region's outputs get the dtype the graph expects.
_CAST_METHODS = {"to", "float", "half", "bfloat16", "type_as"}
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _is_float_dtype(x: Any) -> bool:
    return isinstance(x, torch.dtype) and x in _FLOAT_DTYPES


def is_supported_node(node: fx.Node) -> bool:
    """Whether ``node`` may join a mirage region (the partitioner's test): a supported op on
    floating tensors of float16, bfloat16 or float32. Views and casts join only when they read
    a region input directly (a placeholder, parameter or an unsupported node's value)."""
    if node.op not in ("call_function", "call_method"):
        return False
    val = node.meta.get("example_value")
    t = node.target
    if node.op == "call_method" and t == "item":
        src = node.args[0] if node.args else None
        return (
            isinstance(src, fx.Node)
            and src.op == "placeholder"
            and isinstance(val, (float, torch.SymFloat))
        )
    # Size arithmetic (ints), lists and non-floating tensors stay outside.
    if not isinstance(val, torch.Tensor) or val.dtype not in _FLOAT_DTYPES:
        return False
    if node.op == "call_method":
        if t in _CAST_METHODS:
            return all(_cast_arg_ok(a) for a in node.args[1:])
        if t == "contiguous":
            return True
        if t in _VIEW_METHODS:
            return _reads_input(node)
        return (
            t in _UNARY_METHODS
            or t in _BINARY_METHODS
            or t in ("pow", "mean", "rsqrt", "softmax", "matmul")
        )
    if t in _VIEW_FUNCS:
        return _reads_input(node)
    if t in _SDPA:
        kw = dict(node.kwargs)
        extra = list(node.args[3:])
        mask = kw.get("attn_mask", extra[0] if extra else None)
        causal = kw.get("is_causal", extra[2] if len(extra) > 2 else False)
        dropout = kw.get("dropout_p", extra[1] if len(extra) > 1 else 0.0)
        return mask is None and not causal and not dropout and not kw.get("enable_gqa", False)
    return any(
        t in table
        for table in (_UNARY, _BINARY, _MATMUL, _LINEAR, _SOFTMAX, _RMS_NORM, _RSQRT, _POW, _MEAN)
    )


def _reads_input(node: fx.Node) -> bool:
    """Whether a view has constant arguments and its source, through views and casts, is not
    computed in a region (symbolic sizes would make the region take size inputs)."""
    if any(isinstance(a, fx.Node) for a in (*node.args[1:], *node.kwargs.values())):
        return False
    src = node.args[0] if node.args else None
    while (
        isinstance(src, fx.Node)
        and src.op == "call_method"
        and (src.target in _VIEW_METHODS or src.target in _CAST_METHODS)
    ):
        src = src.args[0]
    while isinstance(src, fx.Node) and src.op == "call_function" and src.target in _VIEW_FUNCS:
        src = src.args[0]
    return not isinstance(src, fx.Node) or not is_supported_node(src)


def _cast_arg_ok(a: Any) -> bool:
    return _is_float_dtype(a) or isinstance(a, fx.Node)


# ---------------------------------------------------------------------------- values
@dataclass
class Ref:
    """A region input (index ``index``) behind the view nodes ``views`` (replayed in order)."""

    index: int
    views: tuple[fx.Node, ...] = ()


@dataclass
class Val:
    """A mirage tensor; ``act``: depends on the activation rows (flattened mode)."""

    t: DTensor
    act: bool


@dataclass
class Pat:
    """A partial RMS norm of ``x``: ``stage`` 1 = x^2, 2 = mean(x^2), 3 = mean(x^2) + eps,
    4 = rsqrt(that), 5 = x * rsqrt(that) (the normalised x, weight not yet applied)."""

    x: Any
    stage: int
    eps: float = 0.0


@dataclass
class Recipe:
    """How to get mirage input ``k`` at a call: region input ``index`` through ``views``,
    then ``flatten`` (merge the leading dims), as a strided view or a contiguous copy."""

    index: int
    views: tuple[fx.Node, ...]
    flatten: bool
    #: Leading dims of 1 added (a lower-rank operand broadcast against a higher rank).
    lead_ones: int = 0
    const: float | None = None
    const_dims: tuple[int, ...] = ()


@dataclass
class Lowered:
    """A lowered region: the mirage graph, how to feed it and how to read its outputs."""

    graph: KNGraph
    recipes: list[Recipe]
    dtype: torch.dtype
    flatten: bool
    #: Leading dims of the flattened activations (restored on the outputs).
    lead: tuple[int, ...] = ()
    #: Dims of each output as the region returns it.
    out_shapes: list[tuple[int, ...]] = field(default_factory=list)
    #: Scalars read from region inputs while lowering (part of the cache key).
    scalars: tuple[float, ...] = ()


def replay_views(t: torch.Tensor, views: Sequence[fx.Node]) -> torch.Tensor:
    """Applies the view nodes to ``t`` in order (their other arguments are constants)."""
    for v in views:
        args = [t, *v.args[1:]]
        t = (
            getattr(t, v.target)(*args[1:], **v.kwargs)
            if v.op == "call_method"
            else v.target(*args, **v.kwargs)
        )
    return t


def materialize(
    r: Recipe, inputs: Sequence[torch.Tensor], dtype: torch.dtype, device: Any
) -> torch.Tensor:
    """The tensor a mirage input gets at a call (see :class:`Recipe`)."""
    if r.const is not None:
        return torch.full(r.const_dims, r.const, dtype=dtype, device=device)
    t = replay_views(inputs[r.index], r.views)
    if t.dtype != dtype:
        t = t.to(dtype)
    if r.flatten:
        t = t.reshape(-1, t.shape[-1])
    if r.lead_ones:
        t = t.reshape(*(1,) * r.lead_ones, *t.shape)
    return t if _layout_ok(t) else t.contiguous()


def _layout_ok(t: torch.Tensor) -> bool:
    """Contiguous, or a permutation of a dense layout (passed with its strides)."""
    if t.is_contiguous():
        return True
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    expect = 1
    for d in reversed(order):
        if t.stride(d) != expect:
            return False
        expect *= t.shape[d]
    return True


# ---------------------------------------------------------------------------- lowering
class _Lowering:
    """One lowering attempt of a region at the shapes of ``inputs``."""

    def __init__(self, gm: fx.GraphModule, inputs: Sequence[Any], flatten: bool) -> None:
        self.gm = gm
        self.inputs = inputs
        self.flatten = flatten
        tensors = [x for x in inputs if isinstance(x, torch.Tensor) and x.dtype in _FLOAT_DTYPES]
        if not tensors:
            raise Unsupported("no floating tensor input")
        self.dtype = tensors[0].dtype
        self.mdtype = _dtypes.as_dtype(self.dtype, "torch.compile")
        self.g = KNGraph()
        self.recipes: list[Recipe] = []
        self.made: dict[tuple[int, tuple[str, ...], bool], Val] = {}
        self.lead: tuple[int, ...] | None = None
        self.scalars: list[float] = []

    # -- inputs
    def _real(self, r: Ref) -> torch.Tensor:
        return replay_views(self.inputs[r.index], r.views)

    def val(self, x: Any, weight_like: bool = False) -> Val:
        """A mirage tensor of ``x`` (an input is declared on first use)."""
        if isinstance(x, Val):
            return x
        if isinstance(x, Pat):
            return self.finish_pattern(x)
        if not isinstance(x, Ref):
            raise Unsupported(f"a constant {x!r} where a tensor is needed")
        real = self._real(x)
        if not isinstance(real, torch.Tensor) or real.dtype not in _FLOAT_DTYPES:
            raise Unsupported("a non-floating tensor input")
        act = self.flatten and real.dim() >= 2 and not weight_like
        if self.flatten and act:
            lead = tuple(real.shape[:-1])
            if self.lead is None:
                self.lead = lead
            elif self.lead != lead:
                raise Unsupported(f"activations with leading dims {lead} and {self.lead}")
        key = (x.index, tuple(v.name for v in x.views), act)
        if key in self.made:
            return self.made[key]
        recipe = Recipe(x.index, x.views, flatten=act)
        t = materialize(recipe, self.inputs, self.dtype, real.device)
        strides = None if t.is_contiguous() else tuple(t.stride())
        dt = self.g.new_input(dims=tuple(t.shape), strides=strides, dtype=self.mdtype)
        self.recipes.append(recipe)
        v = Val(dt, act)
        self.made[key] = v
        return v

    def const(self, c: float, rank: int) -> Val:
        """A constant as a broadcasting input of ``rank`` dims of 1."""
        dims = (1,) * rank
        key = (-1, (repr(float(c)), *map(str, dims)), False)
        if key not in self.made:
            self.recipes.append(Recipe(-1, (), False, const=float(c), const_dims=dims))
            self.made[key] = Val(self.g.new_input(dims=dims, dtype=self.mdtype), False)
        return self.made[key]

    # -- patterns
    def finish_pattern(self, p: Pat, weight: Ref | None = None) -> Val:
        if p.stage == 1:
            x = self.val(p.x)
            return Val(self.g.mul(x.t, x.t), x.act)
        if p.stage != 5:
            raise Unsupported("a partial RMS norm (mean of squares / rsqrt) used outside the norm")
        return self.rms_norm(self.val(p.x), p.eps, weight)

    def rms_norm(self, x: Val, eps: float, weight: Any) -> Val:
        """``rms_norm(x, eps)`` over the last dim with ``weight``: a 1-d weight of that dim as
        the op's own weight (one kernel op, which the search fuses as it does the broadcast
        ``mul``, and which leaves a plan that keeps the norm a kernel of its own within the
        ``mlp`` preset's two kernel ops), any other as a broadcast ``mul``."""
        k = x.t.dims[-1]
        if weight is not None and not isinstance(weight, Ref):
            raise Unsupported("an rms_norm weight that is computed")
        if weight is not None and tuple(self._real(weight).shape) == (k,):
            w1 = self.val(weight, weight_like=True)
            return Val(self.g.rms_norm(x.t, normalized_shape=(k,), weight=w1.t, eps=eps), x.act)
        y = Val(self.g.rms_norm(x.t, normalized_shape=(k,), eps=eps), x.act)
        if weight is None:
            return y
        w = self._lifted(weight, len(x.t.dims))
        if tuple(w.t.dims) != (1,) * (len(x.t.dims) - 1) + (k,):
            raise Unsupported(f"an rms_norm weight of dims {tuple(w.t.dims)} for rows of {k}")
        return Val(self.g.mul(y.t, w.t), x.act)

    # -- ops
    def binary(self, name: str, a: Any, b: Any) -> Any:
        if isinstance(a, float) and isinstance(b, float):
            return {"add": a + b, "mul": a * b, "sub": a - b, "div": a / b}[name]
        pat = self._pattern_binary(name, a, b)
        if pat is not None:
            return pat
        if isinstance(a, float) or isinstance(b, float):
            tv = self.val(b if isinstance(a, float) else a)
            c = self.const(a if isinstance(a, float) else b, len(tv.t.dims))
            a, b = (c, tv) if isinstance(a, float) else (tv, c)
        va, vb = self._broadcastable(self.val(a), self.val(b), a, b)
        return Val(getattr(self.g, name)(va.t, vb.t), va.act or vb.act)

    def _broadcastable(self, va: Val, vb: Val, a: Any, b: Any) -> tuple[Val, Val]:
        """Equal ranks: a lower-rank region input gets leading dims of 1."""
        ra, rb = len(va.t.dims), len(vb.t.dims)
        if ra == rb:
            return va, vb
        if ra < rb and isinstance(a, Ref):
            return self._lifted(a, rb), vb
        if rb < ra and isinstance(b, Ref):
            return va, self._lifted(b, ra)
        raise Unsupported(f"broadcast between ranks {ra} and {rb} of computed values")

    def _lifted(self, r: Ref, rank: int) -> Val:
        """Region input ``r`` with leading dims of 1 up to ``rank`` dims."""
        real = self._real(r)
        if real.dim() > rank:
            raise Unsupported(f"broadcast of a rank-{real.dim()} input to rank {rank}")
        if real.dim() == rank:
            return self.val(r, weight_like=True)
        ones = rank - real.dim()
        key = (r.index, tuple(v.name for v in r.views) + (f"lead{ones}",), False)
        if key not in self.made:
            recipe = Recipe(r.index, r.views, flatten=False, lead_ones=ones)
            t = materialize(recipe, self.inputs, self.dtype, real.device)
            strides = None if t.is_contiguous() else tuple(t.stride())
            self.made[key] = Val(
                self.g.new_input(dims=tuple(t.shape), strides=strides, dtype=self.mdtype), False
            )
            self.recipes.append(recipe)
        return self.made[key]

    def _pattern_binary(self, name: str, a: Any, b: Any) -> Any:
        # mean(x^2) + eps
        if name == "add":
            for p, c in ((a, b), (b, a)):
                if isinstance(p, Pat) and p.stage == 2 and isinstance(c, float) and c >= 0:
                    return Pat(p.x, 3, c)
        if name == "mul":
            for p, o in ((a, b), (b, a)):
                # x * x
                if isinstance(p, (Ref, Val)) and o is p:
                    return Pat(p, 1)
                # x * rsqrt(mean(x^2) + eps)
                if isinstance(p, Pat) and p.stage == 4 and _same(o, p.x):
                    return Pat(p.x, 5, p.eps)
                # normalised x * weight (a 1-d weight over the last dim)
                if isinstance(p, Pat) and p.stage == 5 and isinstance(o, Ref):
                    w = self._real(o)
                    x = self.val(p.x)
                    if w.dim() == 1 and w.shape[0] == x.t.dims[-1]:
                        return self.finish_pattern(p, o)
        return None

    def matmul(self, a: Any, b: Any, b_transposed_weight: bool = False) -> Val:
        va = self.val(a)
        vb = self.val(b, weight_like=True) if not b_transposed_weight else b
        if self.flatten and vb.act:
            raise Unsupported("a matmul of two activations is not row-wise")
        if len(va.t.dims) != len(vb.t.dims):
            raise Unsupported(f"matmul of ranks {len(va.t.dims)} and {len(vb.t.dims)}")
        return Val(self.g.matmul(va.t, vb.t), va.act or vb.act)

    def transposed_input(self, x: Any) -> Val:
        """``x`` with its last two dims swapped: a region input as a strided view."""
        if not isinstance(x, Ref):
            raise Unsupported("a transpose of a computed value")
        real = self._real(x)
        node = _SwapLast(real.dim())
        return self.val(Ref(x.index, (*x.views, node)), weight_like=True)  # type: ignore[arg-type]

    def check_last_dim(self, what: str, v: Val, dim: Any) -> int:
        rank = len(v.t.dims)
        if not isinstance(dim, int):
            raise Unsupported(f"{what} over a non-constant dim")
        d = dim + rank if dim < 0 else dim
        if self.flatten and d != rank - 1:
            raise Unsupported(f"{what} over dim {dim} is not row-wise")
        return d


class _SwapLast:
    """A synthetic view node: ``transpose(-2, -1)`` (for ``linear``'s weight and SDPA's K)."""

    op = "call_method"
    target = "transpose"

    def __init__(self, rank: int) -> None:
        self.args = (None, -2, -1)
        self.kwargs: dict[str, Any] = {}
        self.name = "swap_last"


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, Ref) and isinstance(b, Ref):
        return a.index == b.index and tuple(v.name for v in a.views) == tuple(
            v.name for v in b.views
        )
    return False


def _arg(node: fx.Node, i: int, name: str, default: Any) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _run_node(lw: _Lowering, node: fx.Node, env: dict[fx.Node, Any]) -> Any:
    """The value of one node (see the module docs)."""

    def get(a: Any) -> Any:
        if isinstance(a, fx.Node):
            return env[a]
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return float(a) if isinstance(a, float) else a
        return a

    t = node.target
    args = [get(a) for a in node.args]
    meth = node.op == "call_method"
    # views and casts
    if (meth and t in _VIEW_METHODS) or (not meth and t in _VIEW_FUNCS):
        src = args[0]
        if isinstance(src, Ref):
            if any(isinstance(a, fx.Node) for a in node.args[1:]) or any(
                isinstance(a, fx.Node) for a in node.kwargs.values()
            ):
                raise Unsupported(f"{node.name}: a view with computed sizes")
            if t == "contiguous":
                return src
            return Ref(src.index, (*src.views, node))
        if t == "contiguous":
            return src
        raise Unsupported(
            f"{node.name}: {t} of a computed value (only region inputs are re-viewed)"
        )
    if meth and t in _CAST_METHODS:
        return args[0]
    if meth and t == "item":
        real = lw._real(args[0]) if isinstance(args[0], Ref) else None
        if real is None or real.numel() != 1:
            raise Unsupported(f"{node.name}: item() of a computed value")
        if real.device.type not in ("cpu", "meta"):
            # Folding it would read the device at every call (a sync no CUDA graph can hold).
            raise Unsupported(f"{node.name}: item() of a {real.device.type} tensor")
        v = float(real.item())
        lw.scalars.append(v)
        return v
    # the RMS-norm pattern's steps
    if (meth and t == "pow") or (not meth and t in _POW):
        if args[1] == 2 or args[1] == 2.0:
            return Pat(args[0], 1)
        raise Unsupported(f"{node.name}: pow with exponent {args[1]!r}")
    if (meth and t == "mean") or (not meth and t in _MEAN):
        dim = _arg(node, 1, "dim", None)
        keep = node.kwargs.get("keepdim", node.args[2] if len(node.args) > 2 else False)
        if isinstance(dim, (list, tuple)) and len(dim) == 1:
            dim = dim[0]
        if isinstance(args[0], Pat) and args[0].stage == 1 and dim == -1 and keep:
            return Pat(args[0].x, 2)
        v = lw.val(args[0])
        d = lw.check_last_dim("mean", v, dim)
        if not keep:
            raise Unsupported(f"{node.name}: mean without keepdim")
        s = lw.g.reduction(v.t, d)
        return Val(lw.g.div(s, lw.const(float(v.t.dims[d]), len(v.t.dims)).t), v.act)
    if (meth and t == "rsqrt") or (not meth and t in _RSQRT):
        if isinstance(args[0], Pat) and args[0].stage == 3:
            return Pat(args[0].x, 4, args[0].eps)
        if isinstance(args[0], Pat) and args[0].stage == 2:
            return Pat(args[0].x, 4, 0.0)
        v = lw.val(args[0])
        return Val(lw.g.div(lw.const(1.0, len(v.t.dims)).t, lw.g.sqrt(v.t)), v.act)
    # element-wise
    if (meth and t in _UNARY_METHODS) or (not meth and t in _UNARY):
        name = _UNARY_METHODS[t] if meth else _UNARY[t]
        if not meth and t is F.gelu and node.kwargs.get("approximate", "none") != "none":
            raise Unsupported(f"{node.name}: gelu(approximate='tanh')")
        v = lw.val(args[0])
        return Val(getattr(lw.g, name)(v.t), v.act)
    if (meth and t in _BINARY_METHODS) or (not meth and t in _BINARY):
        if node.kwargs.get("alpha", 1) != 1 or node.kwargs.get("rounding_mode") is not None:
            raise Unsupported(f"{node.name}: {t} with alpha / rounding_mode")
        name = _BINARY_METHODS[t] if meth else _BINARY[t]
        return lw.binary(name, args[0], args[1])
    # matmuls
    if (meth and t == "matmul") or (not meth and t in _MATMUL):
        return lw.matmul(args[0], args[1])
    if not meth and t in _LINEAR:
        bias = _arg(node, 2, "bias", None)
        y = lw.matmul(args[0], lw.transposed_input(args[1]), b_transposed_weight=True)
        if bias is not None:
            return lw.binary("add", y, get(bias))
        return y
    if (meth and t == "softmax") or (not meth and t in _SOFTMAX):
        dim = _arg(node, 1, "dim", None)
        dt_pos = 3 if t is F.softmax else 2
        dt = node.kwargs.get("dtype", node.args[dt_pos] if len(node.args) > dt_pos else None)
        if dt is not None:
            raise Unsupported(f"{node.name}: softmax with a dtype")
        v = lw.val(args[0])
        return Val(lw.g.softmax(v.t, lw.check_last_dim("softmax", v, dim)), v.act)
    if not meth and t in _RMS_NORM:
        shape = _arg(node, 1, "normalized_shape", None)
        weight = get(_arg(node, 2, "weight", None))
        eps = get(_arg(node, 3, "eps", None))
        v = lw.val(args[0])
        if eps is None:
            eps = float(torch.finfo(lw.dtype).eps)
        if not isinstance(eps, float):
            raise Unsupported(f"{node.name}: eps is not a constant")
        shape = tuple(shape) if isinstance(shape, (list, tuple)) else (shape,)
        if len(shape) != 1 or shape[0] != v.t.dims[-1]:
            raise Unsupported(f"{node.name}: rms_norm over {shape}, only the last dim is lowered")
        return lw.rms_norm(v, eps, weight)
    if not meth and t in _SDPA:
        return _sdpa(lw, node, args)
    raise Unsupported(f"{node.name}: {t} is not lowered")


def _sdpa(lw: _Lowering, node: fx.Node, args: list[Any]) -> Val:
    """``softmax(q @ k^T * scale) @ v`` (no mask, no dropout, not causal)."""
    if lw.flatten:
        raise Unsupported("attention is not row-wise")
    q, k, v = lw.val(args[0]), args[1], lw.val(args[2])
    kt = lw.transposed_input(k)
    scale = node.kwargs.get("scale")
    if scale is None:
        scale = 1.0 / math.sqrt(q.t.dims[-1])
    s = lw.g.matmul(q.t, kt.t)
    s = lw.g.mul(s, lw.const(float(scale), len(q.t.dims)).t)
    return Val(lw.g.matmul(lw.g.softmax(s, -1), v.t), False)


def lower_region(gm: fx.GraphModule, inputs: Sequence[Any], flatten: bool) -> Lowered:
    """Lowers ``gm`` at the shapes of ``inputs`` (real tensors and Python numbers, one per
    placeholder). ``flatten``: treat the leading dims of the activations as rows, merged into
    one (the region must be row-wise: no op mixes rows). Raises :class:`Unsupported`."""
    lw = _Lowering(gm, inputs, flatten)
    env: dict[fx.Node, Any] = {}
    outs: list[Any] = []
    ph = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            x = inputs[ph]
            env[node] = Ref(ph) if isinstance(x, torch.Tensor) else x
            ph += 1
        elif node.op == "output":
            res = node.args[0]
            outs = list(res) if isinstance(res, (list, tuple)) else [res]
        elif node.op in ("call_function", "call_method"):
            try:
                env[node] = _run_node(lw, node, env)
            except (ValueError, TypeError, RuntimeError) as e:
                raise Unsupported(f"{node.name}: {e}") from None
        else:
            raise Unsupported(f"{node.name}: {node.op} nodes are not lowered")
    if not outs:
        raise Unsupported("the region has no outputs")
    shapes = []
    for o in outs:
        v = env[o] if isinstance(o, fx.Node) else o
        if isinstance(v, Ref):
            raise Unsupported("a region output that is an input view")
        try:
            mv = lw.val(v)
            lw.g.mark_output(mv.t)
        except (ValueError, TypeError, RuntimeError) as e:
            raise Unsupported(f"output: {e}") from None
        shapes.append(tuple(mv.t.dims))
    if not any(r.const is None for r in lw.recipes):
        raise Unsupported("the region reads no tensor input")
    lead = lw.lead or ()
    if flatten and not lead:
        raise Unsupported("no activation to flatten")
    return Lowered(lw.g, lw.recipes, lw.dtype, flatten, lead, shapes, tuple(lw.scalars))


def output_fixups(
    low: Lowered, outs: Sequence[torch.Tensor], dtypes: Sequence[torch.dtype]
) -> list[torch.Tensor]:
    """The region's outputs from the mirage outputs: leading dims restored, expected dtypes."""
    res = []
    for o, dt in zip(outs, dtypes):
        if low.flatten:
            o = o.reshape(*low.lead, o.shape[-1])
        if o.dtype != dt:
            o = o.to(dt)
        res.append(o)
    return res


Transform = Callable[[torch.Tensor], torch.Tensor]
