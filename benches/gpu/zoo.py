"""The paper's workloads as (reference program, hand-written µGraph) pairs, built with the
Python API: the fixtures of the GPU benchmark's checks and of the test suite.

They are the graphs of the Rust zoo (``crates/ugraph/src/zoo.rs``); ``tests/test_zoo_fixtures.py``
checks that each builder gives the same graphs as the JSON files the Rust zoo writes
(``tests/fixtures/zoo/``, checked against the zoo by ``cargo test -p mirage-ugraph --test
zoo_fixtures``).

``pair(name, dtype, params)`` takes the workload's name and parameters: ``rmsnorm_linear`` /
``gated_mlp`` ``[m, k, n, grid, frange]``, ``lora`` ``[m, k, n, rank, grid, frange]``,
``attention`` / ``qknorm_attention`` / ``attention_online`` / ``qnorm_attention_online`` /
``qknorm_attention_online`` / ``attention_one_kernel`` / ``qknorm_attention_one_kernel``
``[b, h, d, s, splits, frange]`` (or with ``qsplit`` after them), ``ntrans`` ``[b, n]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mirage as mi

BLOCK = (128, 1, 1)
NONE3 = (-1, -1, -1)

Pair = tuple[mi.KNGraph, mi.KNGraph]


def _dtype(name: str) -> Any:
    dt = {"float16": mi.float16, "bfloat16": mi.bfloat16, "float32": mi.float32}.get(name)
    if dt is None:
        raise ValueError(f"zoo: unknown dtype {name!r} (float16, bfloat16 or float32)")
    return dt


def _inputs(g: mi.KNGraph, shapes: Sequence[Sequence[int]], dt: Any) -> list[Any]:
    return [g.new_input(dims=tuple(s), dtype=dt) for s in shapes]


def _tb(grid: Sequence[int], forloop_range: int, reduction_dimx: int) -> Any:
    return mi.new_threadblock_graph(
        grid_dim=tuple(grid),
        block_dim=BLOCK,
        forloop_range=forloop_range,
        reduction_dimx=reduction_dimx,
    )


def rmsnorm_linear(m: int, k: int, n: int, grid: int, frange: int, dt: Any) -> Pair:
    """``rms_norm(X) @ W``; one kernel with ``grid`` blocks over n and a loop over k."""
    r = mi.new_kernel_graph()
    x, w = _inputs(r, [(m, k), (k, n)], dt)
    r.mark_output(r.matmul(r.rms_norm(x, normalized_shape=(k,)), w))
    g = mi.new_kernel_graph()
    x, w = _inputs(g, [(m, k), (k, n)], dt)
    tb = _tb((grid, 1, 1), frange, 64)
    tx = tb.new_input(x, input_map=NONE3, forloop_dim=1)
    tw = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    acc = tb.forloop_accum(tb.matmul(tx, tw))
    rms = tb.forloop_accum(tx, "rms")
    tb.new_output(tb.div(acc, rms), output_map=(1, -1, -1))
    g.mark_output(g.customized([x, w], tb)[0])
    return r, g


def gated_mlp(m: int, k: int, n: int, grid: int, frange: int, dt: Any) -> Pair:
    """``silu(X @ W1) * (X @ W2)``; one kernel accumulating both matmuls."""
    r = mi.new_kernel_graph()
    x, w1, w2 = _inputs(r, [(m, k), (k, n), (k, n)], dt)
    a, b = r.matmul(x, w1), r.matmul(x, w2)
    r.mark_output(r.mul(r.silu(a), b))
    g = mi.new_kernel_graph()
    v = _inputs(g, [(m, k), (k, n), (k, n)], dt)
    tb = _tb((grid, 1, 1), frange, 64)
    tx = tb.new_input(v[0], input_map=NONE3, forloop_dim=1)
    t1 = tb.new_input(v[1], input_map=(1, -1, -1), forloop_dim=0)
    t2 = tb.new_input(v[2], input_map=(1, -1, -1), forloop_dim=0)
    m1, m2 = tb.matmul(tx, t1), tb.matmul(tx, t2)
    a1, a2 = tb.forloop_accum(m1), tb.forloop_accum(m2)
    tb.new_output(tb.mul(tb.silu(a1), a2), output_map=(1, -1, -1))
    g.mark_output(g.customized(v, tb)[0])
    return r, g


def lora(m: int, k: int, n: int, rank: int, grid: int, frange: int, dt: Any) -> Pair:
    """``X W + (X A) B``; the loop accumulates X W and X A, then adds (X A) B."""
    shapes = [(m, k), (k, n), (k, rank), (rank, n)]
    r = mi.new_kernel_graph()
    x, w, a, b = _inputs(r, shapes, dt)
    xw = r.matmul(x, w)
    r.mark_output(r.add(xw, r.matmul(r.matmul(x, a), b)))
    g = mi.new_kernel_graph()
    v = _inputs(g, shapes, dt)
    tb = _tb((grid, 1, 1), frange, 64)
    tx = tb.new_input(v[0], input_map=NONE3, forloop_dim=1)
    tw = tb.new_input(v[1], input_map=(1, -1, -1), forloop_dim=0)
    ta = tb.new_input(v[2], input_map=NONE3, forloop_dim=0)
    tbm = tb.new_input(v[3], input_map=(1, -1, -1), forloop_dim=-1)
    xw, xa = tb.matmul(tx, tw), tb.matmul(tx, ta)
    aw, aa = tb.forloop_accum(xw), tb.forloop_accum(xa)
    tb.new_output(tb.add(aw, tb.matmul(aa, tbm)), output_map=(1, -1, -1))
    g.mark_output(g.customized(v, tb)[0])
    return r, g


def _attn_shapes(b: int, h: int, d: int, s: int) -> list[tuple[int, ...]]:
    return [(b, h, d), (b, d, s), (b, s, d)]


def _attention_reference(
    b: int, h: int, d: int, s: int, norm_q: bool, norm_v: bool, dt: Any
) -> mi.KNGraph:
    """``softmax(Q K) V``, with ``rms_norm`` over d of Q and of V first where asked."""
    r = mi.new_kernel_graph()
    q, k, v = _inputs(r, _attn_shapes(b, h, d, s), dt)
    if norm_q:
        q = r.rms_norm(q, normalized_shape=(d,))
    if norm_v:
        v = r.rms_norm(v, normalized_shape=(d,))
    r.mark_output(r.matmul(r.softmax(r.matmul(q, k), dim=-1), v))
    return r


def _flash_kernel1(
    b: int, h: int, d: int, s: int, splits: int, frange: int, qsplit: int, dt: Any
) -> tuple[mi.KNGraph, list[Any], Any, list[Any]]:
    """The µGraph's Q, K, V and kernel 1's iterators: keys over grid y and the loop, query
    rows over grid z."""
    g = mi.new_kernel_graph()
    v = _inputs(g, _attn_shapes(b, h, d, s), dt)
    k1 = _tb((b, splits, qsplit), frange, d)
    tq = k1.new_input(v[0], input_map=(0, -1, 1), forloop_dim=-1)
    tk = k1.new_input(v[1], input_map=(0, 2, -1), forloop_dim=2)
    tv = k1.new_input(v[2], input_map=(0, 1, -1), forloop_dim=1)
    return g, v, k1, [tq, tk, tv]


def _attn_params(p: Sequence[int], name: str) -> tuple[int, int, int, int, int, int, int]:
    if len(p) == 6:
        return (*p, 1)  # type: ignore[return-value]
    if len(p) == 7:
        return tuple(p)  # type: ignore[return-value]
    raise ValueError(f"zoo: wrong parameter count {len(p)} for {name}")


def attention(p: Sequence[int], qknorm: bool, dt: Any) -> Pair:
    """Two kernels (flash decoding): split-KV partial sums of ``exp(Q K) V`` and ``exp(Q K)``,
    then their sums and one division."""
    b, h, d, s, splits, frange, qsplit = _attn_params(p, "attention")
    r = _attention_reference(b, h, d, s, qknorm, qknorm, dt)
    g, v, k1, (tq, tk, tv) = _flash_kernel1(b, h, d, s, splits, frange, qsplit, dt)
    if qknorm:
        tq, tv = k1.rms_norm(tq), k1.rms_norm(tv)
    e = k1.exp(k1.matmul(tq, tk))
    acc_o = k1.forloop_accum(k1.matmul(e, tv))
    acc_l = k1.forloop_accum(e, "sum")
    k1.new_output(acc_o, output_map=(0, 2, 1))
    k1.new_output(acc_l, output_map=(0, 2, 1))
    part = g.customized(v, k1)
    k2 = _tb((b, qsplit, 1), 1, d)
    po = k2.new_input(part[0], input_map=(0, 1, -1), forloop_dim=-1)
    pl = k2.new_input(part[1], input_map=(0, 1, -1), forloop_dim=-1)
    out = k2.div(k2.forloop_accum(po, "sum_todimx"), k2.forloop_accum(pl, "sum"))
    k2.new_output(out, output_map=(0, 1, -1))
    g.mark_output(g.customized(part, k2)[0])
    return r, g


def _online_loop(k1: Any, q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
    """The online-softmax loop body: P V and row-sum accumulators rescaled by exp(change of
    the max), and the iteration's row max."""
    s = k1.matmul(q, k)
    mx, diff = k1.reduction_max(s, 2)
    e = k1.exp(k1.sub(s, mx))
    scale = k1.exp(diff)
    o = k1.forloop_accum_rescale(k1.matmul(e, v), scale)
    ll = k1.forloop_accum_rescale(e, scale, "sum")
    return o, ll, mx


def online(p: Sequence[int], qnorm: bool, vnorm: bool, dt: Any) -> Pair:
    """Split-KV attention with a running max (online softmax), Q and V normalised where asked."""
    b, h, d, s, splits, frange, qsplit = _attn_params(p, "attention_online")
    r = _attention_reference(b, h, d, s, qnorm, vnorm, dt)
    g, v, k1, (tq, tk, tv) = _flash_kernel1(b, h, d, s, splits, frange, qsplit, dt)
    if qnorm:
        tq = k1.rms_norm(tq)
    if vnorm:
        tv = k1.rms_norm(tv)
    acc_o, acc_l, mx = _online_loop(k1, tq, tk, tv)
    acc_m = k1.forloop_accum_max(mx)
    for t in (acc_o, acc_l, acc_m):
        k1.new_output(t, output_map=(0, 2, 1))
    part = g.customized(v, k1)
    k2 = _tb((b, qsplit, 1), splits, d)
    po, pl, pm = (k2.new_input(t, input_map=(0, 1, -1), forloop_dim=2) for t in part)
    mx, diff = k2.reduction_max(pm, 2)
    w = k2.exp(k2.sub(pm, mx))
    scale = k2.exp(diff)
    ow, lw = k2.mul(po, w), k2.mul(pl, w)
    so = k2.forloop_accum_rescale(ow, scale)
    sl = k2.forloop_accum_rescale(lw, scale)
    k2.new_output(k2.div(so, sl), output_map=(0, 1, -1))
    g.mark_output(g.customized(part, k2)[0])
    return r, g


def one_kernel(p: Sequence[int], qknorm: bool, dt: Any) -> Pair:
    """Attention in one kernel (the search's MQA form): the online loop over every key, O / l
    after it; ``splits`` must be 1."""
    name = "qknorm_attention_one_kernel" if qknorm else "attention_one_kernel"
    b, h, d, s, splits, frange, qsplit = _attn_params(p, name)
    if splits != 1:
        raise ValueError(f"{name}: splits {splits} must be 1 (keys are split only by the loop)")
    r = _attention_reference(b, h, d, s, qknorm, qknorm, dt)
    g, v, k1, (tq, tk, tv) = _flash_kernel1(b, h, d, s, splits, frange, qsplit, dt)
    if qknorm:
        tq, tv = k1.rms_norm(tq), k1.rms_norm(tv)
    o, ll, _ = _online_loop(k1, tq, tk, tv)
    k1.new_output(k1.div(o, ll), output_map=(0, -1, 1))
    g.mark_output(g.customized(v, k1)[0])
    return r, g


def ntrans(b: int, n: int, dt: Any) -> Pair:
    """``rms_norm(X + alpha * (rms_norm(H) + X))`` over rows of n; a block per row."""
    shapes = [(b, n)] * 3
    r = mi.new_kernel_graph()
    h, x, a = _inputs(r, shapes, dt)
    t = r.add(x, r.mul(a, r.add(r.rms_norm(h, normalized_shape=(n,)), x)))
    r.mark_output(r.rms_norm(t, normalized_shape=(n,)))
    g = mi.new_kernel_graph()
    v = _inputs(g, shapes, dt)
    tb = _tb((b, 1, 1), 1, 64)
    th, tx, ta = (tb.new_input(t, input_map=(0, -1, -1), forloop_dim=-1) for t in v)
    t = tb.add(tx, tb.mul(ta, tb.add(tb.rms_norm(th), tx)))
    tb.new_output(tb.rms_norm(t), output_map=(0, -1, -1))
    g.mark_output(g.customized(v, tb)[0])
    return r, g


def _fixed(f: Callable[..., Pair], count: int, name: str) -> Callable[[Sequence[int], Any], Pair]:
    def build(p: Sequence[int], dt: Any) -> Pair:
        if len(p) != count:
            raise ValueError(f"zoo: wrong parameter count {len(p)} for {name}")
        return f(*p, dt)

    return build


BUILDERS: dict[str, Callable[[Sequence[int], Any], Pair]] = {
    "rmsnorm_linear": _fixed(rmsnorm_linear, 5, "rmsnorm_linear"),
    "gated_mlp": _fixed(gated_mlp, 5, "gated_mlp"),
    "lora": _fixed(lora, 6, "lora"),
    "attention": lambda p, dt: attention(p, False, dt),
    "qknorm_attention": lambda p, dt: attention(p, True, dt),
    "attention_online": lambda p, dt: online(p, False, False, dt),
    "qnorm_attention_online": lambda p, dt: online(p, True, False, dt),
    "qknorm_attention_online": lambda p, dt: online(p, True, True, dt),
    "attention_one_kernel": lambda p, dt: one_kernel(p, False, dt),
    "qknorm_attention_one_kernel": lambda p, dt: one_kernel(p, True, dt),
    "ntrans": _fixed(ntrans, 2, "ntrans"),
}


def pair(name: str, dtype: str, params: Sequence[int]) -> Pair:
    """``(reference, µGraph)`` of workload ``name`` in ``dtype`` (see the module docs)."""
    build = BUILDERS.get(name)
    if build is None:
        raise ValueError(f"zoo: unknown workload {name!r}")
    return build(list(params), _dtype(dtype))


def pair_json(name: str, dtype: str, params: Sequence[int]) -> tuple[str, str]:
    """:func:`pair` as JSON: ``(reference JSON, µGraph JSON)``."""
    r, g = pair(name, dtype, params)
    return r.to_json(), g.to_json()


def paper_workloads(b: int) -> list[tuple[str, mi.KNGraph, mi.KNGraph]]:
    """Every workload at the paper's shapes for batch ``b``, in fp16: ``(name, reference,
    µGraph)``."""
    dt = mi.float16
    return [
        ("gqa", *attention([2 * b, 256, 64, 4096, 16, 4, 2], False, dt)),
        ("qknorm_gqa", *attention([2 * b, 256, 64, 4096, 16, 4, 2], True, dt)),
        ("mha", *attention([32 * b, 16, 64, 4096, 16, 4, 1], False, dt)),
        ("mqa", *attention([b, 1024, 64, 4096, 16, 4, 8], False, dt)),
        ("rmsnorm_linear", *rmsnorm_linear(2 * b, 4096, 4096, 64, 64, dt)),
        ("lora", *lora(b, 256, 4096, 16, 64, 4, dt)),
        ("gated_mlp", *gated_mlp(b, 4096, 4096, 64, 32, dt)),
        ("ntrans", *ntrans(b, 4096, dt)),
    ]
