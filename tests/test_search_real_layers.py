"""``superoptimize`` on programs from real model layers (CPU, cost-model choice): RMSNorm with
its weight before a projection, scaled and chained matmuls, the gated MLP with its down
projection and attention over a projected query are found fused (structure checked), run on the
CPU like the reference, and generate CUDA that NVRTC compiles; a program the search cannot fuse
still gets a correct plan."""

from __future__ import annotations

import json
import warnings

import mirage as mi
import numpy as np
import pytest
import torch
from conftest import nvrtc_or_skip, rel_err
from mirage.kernel import KNGraph
from real_layers import (
    gated_mlp_down,
    lora_chain,
    matmul_scale,
    projected_attention,
    rms_weight_linear,
    unfusable,
)


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path / "cache"))


def _block_graphs(g: KNGraph) -> list[dict]:
    ops = json.loads(g.to_json())["graph"]["ops"]
    return [o["kind"]["graph"] for o in ops if o["kind"]["kind"] == "customized"]


def _launches(g: KNGraph) -> int:
    ops = json.loads(g.to_json())["graph"]["ops"]
    return sum(1 for o in ops if o["kind"]["kind"] != "input")


def _kinds(bg: dict) -> list[str]:
    out = []
    for o in bg["ops"]:
        k = o["kind"]
        name = k["kind"]
        if name in ("unary", "binary"):
            op = k["op"]
            name = op if isinstance(op, str) else op["op"]
        out.append(name)
    return out


def _compiles(g: KNGraph, name: str) -> None:
    nvrtc_or_skip()
    for arch in (80, 90):
        try:
            cubin = g.compile_cuda(arch)
        except RuntimeError as e:
            pytest.fail(f"{name}: sm_{arch}: {e}")
        assert cubin[:4] == b"\x7fELF"


def _inputs(g: KNGraph, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in g.inputs:
        x = torch.randn(*t.dims, generator=gen) / (t.dims[0] ** 0.5 if len(t.dims) > 1 else 1)
        out.append(x.to(torch.float32))
    return out


def _same_values(ref: KNGraph, got: KNGraph, tol: float = 1e-4) -> None:
    ins = _inputs(ref)
    (want,) = ref(inputs=ins)
    (have,) = got(inputs=ins)
    assert rel_err(have, want.double()) < tol


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((8, 256, 256), mi.bfloat16), ((7, 400, 300), mi.float16), ((7, 400, 300), mi.float32)],
)
def test_rms_norm_with_weight_then_linear_is_one_kernel(shape, dtype):
    g = rms_weight_linear(*shape, dtype)
    best = g.superoptimize(backend="cpu")
    assert best.search_stats["winner"]["verification"] == "passed"
    assert _launches(best) == 1
    (bg,) = _block_graphs(best)
    # The weight is read as [1, k] tiles and multiplies the x tiles before the matmul; the
    # row rms divides the result.
    weight = bg["ops"][1]["kind"]
    assert weight["kind"] == "input" and weight["dims"] == [1, shape[1]]
    kinds = _kinds(bg)
    assert {"mul", "matmul", "div", "forloop_accum"} <= set(kinds), kinds
    assert kinds.index("mul") < kinds.index("matmul") < kinds.index("div"), kinds
    assert mi.verify(g, best).equivalent
    if dtype == mi.float32:
        _same_values(g, best)
    _compiles(best, f"rms_norm(weight)@W {shape}")


def test_rms_norm_with_weight_matches_torch_in_half_precision():
    m, k, n = 7, 400, 300
    g = rms_weight_linear(m, k, n, mi.float16)
    best = g.superoptimize(backend="cpu")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((m, k)).astype(np.float16)
    w = (1 + rng.standard_normal(k) / 4).astype(np.float16)
    wo = (rng.standard_normal((k, n)) / 20).astype(np.float16)
    (out,) = best(inputs=[x, w, wo])
    xd = torch.tensor(x).double()
    ref = (
        xd / xd.square().mean(-1, keepdim=True).sqrt() * torch.tensor(w).double()
    ) @ torch.tensor(wo).double()
    assert rel_err(out, ref) < 1e-2


def test_matmul_times_scale_is_one_kernel():
    g = matmul_scale()
    best = g.superoptimize(backend="cpu")
    assert _launches(best) == 1
    (bg,) = _block_graphs(best)
    assert {"matmul", "mul"} <= set(_kinds(bg))
    _compiles(best, "X@W*s")


def test_lora_chain_is_one_kernel():
    g = lora_chain()
    best = g.superoptimize(backend="cpu")
    assert _launches(best) == 1
    (bg,) = _block_graphs(best)
    assert _kinds(bg).count("matmul") == 2
    _compiles(best, "(X@A)@B")


def test_gated_mlp_with_down_projection():
    g = gated_mlp_down()
    best = g.superoptimize(backend="cpu")
    assert _launches(best) <= 2
    first = _kinds(_block_graphs(best)[0])
    assert {"silu", "mul"} <= set(first) and first.count("matmul") >= 2, first
    _compiles(best, "gated mlp + down")


def test_softmax_of_a_projection_is_numerically_safe():
    g = projected_attention()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not numerically stable" warning
        best = g.superoptimize(backend="cpu")
    assert best.search_stats["winner"]["verification"] == "passed"
    assert any("reduction_max" in _kinds(bg) for bg in _block_graphs(best))
    _compiles(best, "softmax(X@Wq@Kt)@V")


def test_an_unfused_op_gets_its_own_kernel():
    # No block graph holds pow: the matmul is still searched, pow runs as its own kernel.
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 64), dtype=mi.float32)
    W = g.new_input(dims=(64, 32), dtype=mi.float32)
    E = g.new_input(dims=(8, 32), dtype=mi.float32)
    g.mark_output(g.pow(g.matmul(X, W), E))
    best = g.superoptimize(backend="cpu")
    assert best.search_stats["source"] == "search"
    gen = torch.Generator().manual_seed(1)
    ins = [
        torch.randn(8, 64, generator=gen),
        torch.randn(64, 32, generator=gen),
        torch.full((8, 32), 2.0),
    ]
    (want,) = g(inputs=ins)
    (have,) = best(inputs=ins)
    assert rel_err(have, want.double()) < 1e-4


def test_an_unfusable_program_is_returned_as_given_with_a_warning():
    # Three kernel ops that no block graph holds (sub, pow): more than the search's kernel ops.
    g = unfusable()
    with pytest.warns(
        RuntimeWarning, match=r"no fused µGraph for the ops \['matmul', 'sub', 'pow'\]"
    ):
        best = g.superoptimize(backend="cpu")
    assert best is not g
    assert best.search_stats["source"] == "as_given"
    assert best.hash() == g.hash()
    gen = torch.Generator().manual_seed(2)
    ins = [
        torch.randn(8, 64, generator=gen),
        torch.randn(64, 32, generator=gen),
        torch.randn(8, 32, generator=gen),
        torch.full((8, 32), 2.0),
    ]
    (want,) = g(inputs=ins)
    (have,) = best(inputs=ins)
    assert torch.equal(have, want)


def test_an_unfusable_program_is_served_from_the_cache_as_given(tmp_path):
    g = unfusable()
    for source in ("search", "cache"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            best = g.superoptimize(backend="cpu", cache_dir=tmp_path)
        messages = [str(w.message) for w in caught]
        # One warning, the fallback's: no "searching again" for an entry that holds nothing.
        assert len(messages) == 1 and "returning the program as given" in messages[0], messages
        assert best.search_stats["source"] == "as_given"
        assert best.hash() == g.hash(), source


def test_a_preset_that_finds_nothing_returns_the_program_as_given():
    # A weighted norm whose output leaves the program beside the projection after it: no
    # µGraph with one customized kernel computes both. The `mlp` preset's loop ranges only
    # narrow the search, so finding nothing there returns the program as given; the same
    # loop ranges passed by the user are a restriction, and finding nothing is an error.
    def program() -> mi.KNGraph:
        g = mi.new_kernel_graph()
        x = g.new_input(dims=(1, 512), dtype=mi.float16)
        w = g.new_input(dims=(512,), dtype=mi.float16)
        wt = g.new_input(dims=(512, 512), dtype=mi.float16)
        xn = g.rms_norm(x, normalized_shape=(512,), weight=w, eps=1e-5)
        g.mark_output(xn)
        g.mark_output(g.matmul(xn, wt))
        return g

    with pytest.warns(RuntimeWarning, match="returning the program as given"):
        best = program().superoptimize(backend="cpu", config="mlp", use_cached_graphs=False)
    assert best.search_stats["source"] == "as_given"
    with pytest.raises(mi.SearchError, match="may exclude every µGraph"):
        program().superoptimize(
            backend="cpu",
            config={"max_kernel_ops": 2, "max_customized_ops": 1},
            franges=[1, 4, 16, 32, 64],
            use_cached_graphs=False,
        )
