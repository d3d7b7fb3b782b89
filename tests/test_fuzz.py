"""Fuzzing of the Python builders and the JSON loader: random graphs (random ops, dims
including huge, zero and negative ones, dtypes, concat chains, block graphs with random grids
and loop ranges) and random or mutated JSON. Every call either succeeds or raises
``ValueError``/``TypeError``; a panic (pyo3's ``PanicException`` derives from
``BaseException``), an abort or a hang fails the run.

CI runs a bounded number of examples; set ``MIRAGE_FUZZ_EXAMPLES`` (e.g. 5000) for more.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import mirage as mi
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("MIRAGE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
OK_ERRORS = (ValueError, TypeError)
#: Graphs whose tensors all hold at most this many elements are also run on the CPU.
RUN_NUMEL = 1 << 12

ODD = [0, -1, 2**31, 2**31 + 1, 2**40, 2**48 + 1, 2**63, 2**64]
small = st.integers(1, 8)
extent = st.one_of(small, small, small, st.sampled_from([16, 64, 2**20] + ODD))
dims_st = st.lists(extent, min_size=0, max_size=5)
dtype_st = st.sampled_from([mi.float16, mi.bfloat16, mi.float32, "float32", "int8", None])
dim_idx = st.one_of(st.integers(-5, 5), st.sampled_from([2**63, -(2**63) - 1, 2**70]))
map_st = st.lists(st.one_of(st.integers(-2, 4), st.sampled_from([2**64])), min_size=0, max_size=4)
UNARY = ["exp", "silu", "gelu", "relu", "sqrt", "square"]
BINARY = ["add", "sub", "mul", "div", "pow"]


def attempt(f: Any, *args: Any, **kwargs: Any) -> Any:
    """``f(*args)``, or None when it raises an allowed error."""
    try:
        return f(*args, **kwargs)
    except OK_ERRORS:
        return None


def numel(dims: tuple[int, ...]) -> int:
    return math.prod(dims)


def build_block_graph(data: st.DataObject, g: mi.KNGraph, pool: list[Any]) -> None:
    """A random threadblock graph over tensors of ``pool``, added to ``g`` when it builds."""
    grid = data.draw(st.lists(extent, min_size=0, max_size=4), label="grid")
    block = data.draw(st.sampled_from([(128, 1, 1), (32, 4, 1), (2048, 1, 1), (0, 1, 1)]))
    frange = data.draw(extent, label="forloop_range")
    dimx = data.draw(extent, label="reduction_dimx")
    tb = attempt(mi.new_threadblock_graph, grid, block, frange, dimx)
    if tb is None or not pool:
        return
    tiles: list[Any] = []
    ins: list[Any] = []
    for _ in range(data.draw(st.integers(1, 3), label="block inputs")):
        x = data.draw(st.sampled_from(pool))
        t = attempt(tb.new_input, x, data.draw(map_st), data.draw(dim_idx))
        if t is not None:
            tiles.append(t)
            ins.append(x)
    for _ in range(data.draw(st.integers(0, 8), label="block ops")):
        if not tiles:
            break
        a, b = data.draw(st.sampled_from(tiles)), data.draw(st.sampled_from(tiles))
        kind = data.draw(st.sampled_from(["unary", "binary", "matmul", "concat", "chain", "acc"]))
        if kind == "unary":
            r = attempt(getattr(tb, data.draw(st.sampled_from([*UNARY, "exp"]))), a)
        elif kind == "binary":
            r = attempt(getattr(tb, data.draw(st.sampled_from(BINARY))), a, b)
        elif kind == "matmul":
            r = attempt(tb.matmul, a, b)
        elif kind == "concat" or kind == "chain":
            r = a
            for _ in range(61 if kind == "chain" else 1):
                nxt = attempt(tb.concat, r, r if kind == "chain" else b, data.draw(dim_idx))
                if nxt is None:
                    break
                r = nxt
        else:
            acc = data.draw(st.sampled_from([None, "sum", "mean", "rms", "sum_todimx", "bad"]))
            r = attempt(tb.forloop_accum, a, acc)
        if r is not None:
            tiles.append(r)
    for t in data.draw(st.lists(st.sampled_from(tiles), max_size=2)) if tiles else []:
        attempt(tb.new_output, t, data.draw(map_st), data.draw(st.sampled_from([-1, -1, 0, 1])))
    outs = attempt(g.customized, ins, tb)
    pool.extend(outs or [])


def random_graph(data: st.DataObject) -> mi.KNGraph:
    g = mi.new_kernel_graph()
    pool: list[Any] = []
    for _ in range(data.draw(st.integers(0, 3), label="inputs")):
        t = attempt(g.new_input, data.draw(dims_st), dtype=data.draw(dtype_st) or mi.float32)
        if t is not None:
            pool.append(t)
    for _ in range(data.draw(st.integers(0, 6), label="ops")):
        if not pool:
            break
        a, b = data.draw(st.sampled_from(pool)), data.draw(st.sampled_from(pool))
        kind = data.draw(st.sampled_from(["unary", "binary", "matmul", "reduce", "norm", "block"]))
        if kind == "unary":
            r = attempt(getattr(g, data.draw(st.sampled_from(UNARY))), a)
        elif kind == "binary":
            r = attempt(getattr(g, data.draw(st.sampled_from(BINARY))), a, b)
        elif kind == "matmul":
            r = attempt(g.matmul, a, b)
        elif kind == "reduce":
            op = data.draw(st.sampled_from([g.reduction, g.softmax]))
            r = attempt(op, a, data.draw(dim_idx))
        elif kind == "norm":
            r = attempt(g.rms_norm, a, data.draw(dims_st), data.draw(st.sampled_from([None, b])))
        else:
            build_block_graph(data, g, pool)
            r = None
        if r is not None:
            pool.append(r)
    for t in data.draw(st.lists(st.sampled_from(pool), max_size=2)) if pool else []:
        attempt(g.mark_output, t)
    return g


def maybe_run(g: mi.KNGraph) -> None:
    if not g.outputs:
        return
    core = g._core
    sizes = [numel(tuple(core.tensor_dims(t))) for t in range(core.num_tensors)]
    if max(sizes, default=0) > RUN_NUMEL:
        return
    # Long loops are legitimate (Ctrl-C stops them, see test_limits.py) but slow: skip them.
    for op in json.loads(g.to_json())["graph"]["ops"]:
        if op["kind"]["kind"] == "customized":
            b = op["kind"]["graph"]
            if math.prod(b["grid_dim"]) * b["forloop_range"] > RUN_NUMEL:
                return
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(t.dims, generator=gen).to(t.dtype.to_torch()) for t in g.inputs]
    try:
        g(inputs=inputs)
    except OK_ERRORS:
        pass


@FUZZ
@given(st.data())
def test_random_graphs_build_run_and_round_trip_or_raise_clear_errors(data):
    g = random_graph(data)
    text = g.to_json()
    again = mi.from_json(text)
    assert again.hash() == g.hash()
    maybe_run(g)


def mutate(node: Any, data: st.DataObject, depth: int = 0) -> Any:
    """``node`` with a few random changes: numbers become odd sizes, keys vanish, values swap."""
    choice = data.draw(st.integers(0, 9), label="mutation")
    if isinstance(node, dict) and node:
        out = dict(node)
        key = data.draw(st.sampled_from(sorted(out)))
        if choice == 0:
            del out[key]
        else:
            out[key] = mutate(out[key], data, depth + 1)
        return out
    if isinstance(node, list) and node:
        out = list(node)
        i = data.draw(st.integers(0, len(out) - 1))
        if choice == 0:
            out.pop(i)
        elif choice == 1:
            out.append(out[i])
        else:
            out[i] = mutate(out[i], data, depth + 1)
        return out
    if isinstance(node, bool) or node is None or choice > 6:
        return data.draw(st.sampled_from([None, True, "x" * 1000, [], {}, 1.5, "nan"]))
    if isinstance(node, (int, float)):
        return data.draw(st.sampled_from([*ODD, 3, 1.0e300, -0.5]))
    return data.draw(st.sampled_from(["", "matmul", "float16", "customized", "exp"]))


VALID_GRAPHS: list[str] = []


def valid_json() -> list[str]:
    """JSON of a few valid graphs (a kernel-level chain and a customized op) to mutate."""
    if not VALID_GRAPHS:
        g = mi.new_kernel_graph()
        x = g.new_input((8, 64), dtype=mi.float16)
        w = g.new_input((64, 32), dtype=mi.float16)
        g.mark_output(g.exp(g.matmul(g.rms_norm(x, (64,)), w)))
        VALID_GRAPHS.append(g.to_json())
        g = mi.new_kernel_graph()
        x = g.new_input((8, 64), dtype=mi.float16)
        w = g.new_input((64, 32), dtype=mi.float16)
        tb = mi.new_threadblock_graph((2, 1, 1), (128, 1, 1), 4, 16)
        tx = tb.new_input(x, (-1, -1, -1), 1)
        tw = tb.new_input(w, (1, -1, -1), 0)
        acc = tb.forloop_accum(tb.matmul(tx, tw))
        tb.new_output(tb.concat(acc, acc, 0), (1, -1, -1))
        g.mark_output(g.customized([x, w], tb)[0])
        VALID_GRAPHS.append(g.to_json())
    return VALID_GRAPHS


@FUZZ
@given(st.data())
def test_mutated_json_loads_or_raises_clear_errors(data):
    base = json.loads(data.draw(st.sampled_from(valid_json())))
    tree = base
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        tree = mutate(tree, data)
    g = attempt(mi.from_json, json.dumps(tree))
    if g is not None:
        maybe_run(g)


@FUZZ
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin1"))))
def test_random_text_is_rejected_as_json(text):
    attempt(mi.from_json, text)
