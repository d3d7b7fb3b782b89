"""JSON round trips, graph hashes and DOT visualisation."""

import json
import os
import subprocess
import sys

import mirage as mi
import numpy as np
import pytest
from conftest import gpu_script, randn, uniform
from test_ugraphs import GRAPHS as UGRAPHS

F32 = mi.float32


def every_kernel_op(rng, dtype=F32):
    """One kernel graph using every kernel-level op, with explicit output strides."""
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 6), dtype=dtype)
    P = g.new_input(dims=(4, 6), dtype=dtype, strides=(6, 1))
    W = g.new_input(dims=(6, 3), dtype=dtype)
    N = g.new_input(dims=(6,), dtype=dtype)
    H = g.add(g.gelu(X), g.silu(X))
    H = g.sub(g.mul(H, g.relu(X)), g.clamp(X, -0.5, 0.5))
    H = g.div(g.exp(H), g.sqrt(g.square(P)))
    H = g.pow(P, g.rms_norm(H, normalized_shape=(6,), weight=N))
    g.mark_output(g.matmul(H, W), strides=(1, 4))
    g.mark_output(g.softmax(g.reduction(H, 0), dim=1))
    g.mark_output(g.rms_norm(g.reduction(P, 1), normalized_shape=(4, 1)))
    inputs = [
        randn(rng, 4, 6),
        uniform(rng, 0.5, 2.0, 4, 6),
        randn(rng, 6, 3),
        uniform(rng, 0.5, 1.5, 6),
    ]
    if dtype == mi.float16:
        inputs = [x.astype(np.float16) for x in inputs]
    return g, inputs, None


def every_block_op(rng):
    """Customized ops using the block ops the µGraphs of test_ugraphs do not."""
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 6, 24), dtype=F32)
    S = g.new_input(dims=(4, 6, 1), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(2, 3, 1), block_dim=(64, 2, 1), forloop_range=2, reduction_dimx=3
    )
    tx = tb.new_input(X, input_map=(0, 1, -1), forloop_dim=2)  # (2, 2, 12)
    ts = tb.new_input(S, input_map=(0, 1, -1), forloop_dim=-1)  # (2, 2, 1)
    h = tb.gelu(tb.relu(tb.clamp(tx, -1.0, 1.5)))
    h = tb.sub(tb.pow(tb.sqrt(tb.square(tx)), ts), tb.mul_scalar(h, 0.5))
    m, d = tb.reduction_max(h, 2)
    tb.new_output(tb.rms_norm(h), output_map=(0, 1, -1), forloop_dim=2)
    tb.new_output(tb.forloop_accum(h, "mean"), output_map=(0, 1, -1))
    tb.new_output(tb.forloop_accum(tb.reduction(h, 1), "rms"), output_map=(0, 2, -1))
    tb.new_output(tb.forloop_accum(h, "sum_todimx"), output_map=(0, 1, -1))
    tb.new_output(tb.forloop_accum_max(m), output_map=(1, 0, -1))
    tb.new_output(tb.forloop_accum_rescale(h, tb.exp(d), "sum"), output_map=(0, 1, -1))
    g.customized([X, S], tb)

    tb2 = mi.new_threadblock_graph(
        grid_dim=(2, 3, 2), block_dim=(128, 1, 1), forloop_range=1, reduction_dimx=64
    )
    t2 = tb2.new_input(X, input_map=(0, 1, 2), forloop_dim=-1)
    tb2.new_output(tb2.concat(t2, tb2.exp(t2), 2), output_map=(2, 0, 1))
    g.customized([X], tb2)
    return g, [randn(rng, 4, 6, 24), uniform(rng, 0.5, 2.0, 4, 6, 1)], None


GRAPHS = {
    **UGRAPHS,
    "every_kernel_op": every_kernel_op,
    "every_kernel_op_float16": lambda rng: every_kernel_op(rng, mi.float16),
    "every_block_op": every_block_op,
}


def assert_same_results(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_json_round_trip_is_identity(rng, name):
    g, inputs, _ = GRAPHS[name](rng)
    text = g.to_json()
    json.loads(text)  # valid JSON
    g2 = mi.from_json(text)
    assert g2.to_json() == text
    assert mi.from_json(g2.to_json()).to_json() == text
    assert_same_results(g2(inputs=inputs), g(inputs=inputs))


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_hash_survives_round_trip(rng, name):
    g, _, _ = GRAPHS[name](rng)
    h = g.hash()
    assert isinstance(h, str) and len(h) >= 16
    int(h, 16)  # hex
    assert mi.from_json(g.to_json()).hash() == h
    g_again, _, _ = GRAPHS[name](np.random.default_rng(12345))  # same structure, other data
    assert g_again.hash() == h


def test_save_and_load_json(rng, tmp_path):
    g, inputs, _ = GRAPHS["gqa_online_softmax"](rng)
    path = tmp_path / "gqa.json"
    g.save_json(str(path))
    assert path.read_text() == g.to_json()
    g2 = mi.load_json(str(path))
    assert g2.to_json() == g.to_json()
    assert g2.hash() == g.hash()
    assert_same_results(g2(inputs=inputs), g(inputs=inputs))


def test_json_is_versioned(rng):
    g, _, _ = GRAPHS["rmsnorm_linear"](rng)
    doc = json.loads(g.to_json())
    assert isinstance(doc, dict)
    assert isinstance(doc["version"], int) and doc["version"] >= 1


def test_round_trip_keeps_dtypes_and_dims(rng):
    g, inputs, _ = every_kernel_op(rng, mi.float16)
    g2 = mi.from_json(g.to_json())
    outs = g2(inputs=inputs)
    assert [o.shape for o in outs] == [(4, 3), (1, 6), (4, 1)]
    assert all(o.dtype == np.float16 for o in outs)


def variants():
    """Graphs that differ from the base in one detail each."""

    def build(
        dims=(8, 12),
        op="exp",
        imap=(0, -1, -1),
        frange=2,
        acc=None,
        bound=1.0,
        grid=(2, 1, 1),
        out_strides=None,
        dtype=F32,
        scalar=0.5,
        in_strides=None,
    ):
        g = mi.new_kernel_graph()
        X = g.new_input(dims=dims, dtype=dtype, strides=in_strides)
        tb = mi.new_threadblock_graph(
            grid_dim=grid, block_dim=(128, 1, 1), forloop_range=frange, reduction_dimx=2
        )
        tx = tb.new_input(X, input_map=imap, forloop_dim=1)
        t = tb.clamp(tb.mul_scalar(getattr(tb, op)(tx), scalar), -bound, bound)
        tb.new_output(tb.forloop_accum(t, acc), output_map=imap)
        (Y,) = g.customized([X], tb)
        g.mark_output(Y, strides=out_strides)
        return g

    return {
        "base": build(),
        "dims": build(dims=(8, 16)),
        "op": build(op="silu"),
        "imap": build(imap=(1, -1, -1)),
        "frange": build(frange=3),
        "acc": build(acc="sum"),
        "bound": build(bound=2.0),
        "grid": build(grid=(4, 1, 1)),
        "out_strides": build(out_strides=(1, 8)),
        "dtype": build(dtype=mi.bfloat16),
        "scalar": build(scalar=0.25),
        "in_strides": build(in_strides=(1, 8)),
    }


def test_hash_differs_for_changed_graphs():
    hashes = {name: g.hash() for name, g in variants().items()}
    assert len(set(hashes.values())) == len(hashes), hashes
    texts = {g.to_json() for g in variants().values()}
    assert len(texts) == len(hashes)


def test_hash_is_stable_across_processes(rng):
    """Hashes name cache files: they must not depend on the process (no random seeding)."""
    g, _, _ = GRAPHS["every_block_op"](rng)
    code = "import sys, mirage as mi; print(mi.from_json(sys.stdin.read()).hash())"
    res = subprocess.run(
        [sys.executable, "-c", code],
        input=g.to_json(),
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    )
    assert res.stdout.strip() == g.hash()


def test_hash_differs_for_kernel_op_order():
    def build(first):
        g = mi.new_kernel_graph()
        A = g.new_input(dims=(3, 3), dtype=F32)
        B = g.new_input(dims=(3, 3), dtype=F32)
        g.mark_output(g.matmul(A, B) if first else g.matmul(B, A))
        return g

    assert build(True).hash() != build(False).hash()


def read_dot(paths):
    assert isinstance(paths, list) and paths
    for p in paths:
        assert os.path.exists(p), p
    dots = [p for p in paths if str(p).endswith(".dot")]
    assert len(dots) == 1, paths
    with open(dots[0]) as f:
        return f.read()


def test_visualize_kernel_graph(rng, tmp_path):
    g, _, _ = every_kernel_op(rng)
    text = read_dot(g.visualize(str(tmp_path / "kernel")))
    assert "digraph" in text
    for name in [
        "matmul",
        "exp",
        "silu",
        "gelu",
        "relu",
        "sqrt",
        "square",
        "clamp",
        "add",
        "mul",
        "div",
        "sub",
        "pow",
        "reduction",
        "rms_norm",
        "softmax",
    ]:
        assert name in text, name


def test_visualize_customized_graph(rng, tmp_path):
    g, _, _ = GRAPHS["gqa_online_softmax"](rng)
    text = read_dot(g.visualize(str(tmp_path / "gqa")))
    assert "digraph" in text
    for name in [
        "customized",
        "matmul",
        "exp",
        "reduction_max",
        "forloop_accum_rescale",
        "forloop_accum_max",
        "div",
        "mul",
    ]:
        assert name in text, name


def _twin_with(rows: int, key: str, value: object) -> tuple[mi.KNGraph, dict]:
    """RMSNorm+Linear (`rows` rows, 1024 x 512) and its JSON with `key` set to `value` on its
    block graphs (checked absent before): the twin must round-trip through JSON, hash apart
    from the original and compute the same values. Returns (original, twin's JSON)."""
    _, g = gpu_script("zoo").pair("rmsnorm_linear", "float16", [rows, 1024, 512, 8, 4])
    data = json.loads(g.to_json())
    for op in data["graph"]["ops"]:
        if op["kind"]["kind"] == "customized":
            assert key not in op["kind"]["graph"]
            op["kind"]["graph"][key] = value
    twin = mi.from_json(json.dumps(data))
    assert json.loads(twin.to_json()) == data
    assert twin.hash() != g.hash()
    rng = np.random.default_rng(rows)
    xs = [rng.standard_normal((rows, 1024)) * 0.5, rng.standard_normal((1024, 512)) * 0.5]
    xs = [x.astype(np.float16) for x in xs]
    np.testing.assert_array_equal(twin(inputs=xs)[0], g(inputs=xs)[0])
    return g, data


def _set_on_block_graphs(data: dict, key: str, value: object) -> str:
    for op in data["graph"]["ops"]:
        if op["kind"]["kind"] == "customized":
            op["kind"]["graph"][key] = value
    return json.dumps(data)


def test_the_warpgroup_flag_round_trips_changes_the_hash_not_the_values():
    # `warpgroup_acc` (a warpgroup twin's form) is kept by JSON, left out where false, changes
    # the hash (the twin is another candidate) and leaves the values alone.
    g, data = _twin_with(32, "warpgroup_acc", True)
    assert mi.from_json(_set_on_block_graphs(data, "warpgroup_acc", False)).hash() == g.hash()


def test_a_shared_memory_cap_round_trips_changes_the_hash_and_is_checked():
    # `smem_cap` (a co-resident twin's stage cap) is kept by JSON, changes the hash (the twin
    # is another candidate), leaves the values alone, and a zero cap is refused by name.
    _, data = _twin_with(2, "smem_cap", 64 * 1024)
    with pytest.raises(ValueError, match="smem_cap: a shared-memory cap must be at least 1 byte"):
        mi.from_json(_set_on_block_graphs(data, "smem_cap", 0))
