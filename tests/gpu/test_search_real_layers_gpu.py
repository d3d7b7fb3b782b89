"""Programs from real model layers superoptimized on a GPU (``backend="cuda"``): the winner's
CUDA output matches torch, and the CPU's cost-model choice (the fused forms checked in
tests/test_search_real_layers.py) runs on the GPU too. Marked ``gpu`` (skipped elsewhere)."""

from __future__ import annotations

from collections.abc import Callable

import mirage as mi
import pytest
import torch

pytestmark = pytest.mark.gpu


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    return float((o - r).norm() / r.norm())


def _rms_weight(m: int, k: int, n: int, dtype) -> mi.KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(m, k), dtype=dtype)
    Wn = g.new_input(dims=(k,), dtype=dtype)
    W = g.new_input(dims=(k, n), dtype=dtype)
    g.mark_output(g.matmul(g.rms_norm(X, normalized_shape=(k,), weight=Wn), W))
    return g


def _scale() -> mi.KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(7, 400), dtype=mi.float16)
    W = g.new_input(dims=(400, 300), dtype=mi.float16)
    S = g.new_input(dims=(1, 300), dtype=mi.float16)
    g.mark_output(g.mul(g.matmul(X, W), S))
    return g


def _lora() -> mi.KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(7, 400), dtype=mi.float16)
    A = g.new_input(dims=(400, 16), dtype=mi.float16)
    B = g.new_input(dims=(16, 300), dtype=mi.float16)
    g.mark_output(g.matmul(g.matmul(X, A), B))
    return g


def _mlp() -> mi.KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 256), dtype=mi.float16)
    Wg = g.new_input(dims=(256, 344), dtype=mi.float16)
    Wu = g.new_input(dims=(256, 344), dtype=mi.float16)
    Wd = g.new_input(dims=(344, 256), dtype=mi.float16)
    g.mark_output(g.matmul(g.mul(g.silu(g.matmul(X, Wg)), g.matmul(X, Wu)), Wd))
    return g


def _attn() -> mi.KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 256), dtype=mi.float16)
    Wq = g.new_input(dims=(256, 64), dtype=mi.float16)
    Kt = g.new_input(dims=(64, 128), dtype=mi.float16)
    V = g.new_input(dims=(128, 64), dtype=mi.float16)
    g.mark_output(g.matmul(g.softmax(g.matmul(g.matmul(X, Wq), Kt)), V))
    return g


PROGRAMS: dict[str, Callable[[], mi.KNGraph]] = {
    "rms_weight_bf16": lambda: _rms_weight(8, 256, 256, mi.bfloat16),
    "rms_weight_fp16_odd": lambda: _rms_weight(7, 400, 300, mi.float16),
    "scale": _scale,
    "lora": _lora,
    "mlp": _mlp,
    "attn": _attn,
}


def _inputs(g: mi.KNGraph) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    dt = {mi.float16: torch.float16, mi.bfloat16: torch.bfloat16}
    out = []
    for t in g.inputs:
        x = torch.randn(*t.dims, generator=gen)
        if len(t.dims) == 2:
            x = x / t.dims[0] ** 0.5
        out.append(x.to(dt[t.dtype]))
    return out


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_found_form_runs_on_the_gpu(name, backend, tmp_path):
    g = PROGRAMS[name]()
    best = g.superoptimize(backend=backend, cache_dir=tmp_path, warmup_iters=2, profile_iters=20)
    ins = _inputs(g)
    (ref,) = g(inputs=ins)
    (out,) = best(inputs=[x.cuda() for x in ins])
    assert _rel(out, ref) < 2e-2, name
