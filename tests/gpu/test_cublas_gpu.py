"""Predefined matmuls on cuBLAS: values against float64 torch (outputs poisoned first), the
layouts cuBLAS takes (transposed views, batches), a program mixing a generated kernel and a
cuBLAS step, a run inside CUDA-graph capture, and ``MIRAGE_CUBLAS=0`` (the default kernel).
Needs a CUDA GPU (marked ``gpu``; skipped elsewhere).
"""

from __future__ import annotations

import json
from typing import Any

import mirage as mi
import pytest
import torch
from mirage import _cuda

pytestmark = pytest.mark.gpu

#: Relative error bounds against float64: fp32 storage keeps full fp32 (TF32 would be ~1e-3).
TOL = {mi.float32: 2e-5, mi.float16: 5e-3, mi.bfloat16: 2e-2}


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.detach().double(), ref.detach().double().to(out.device)
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


def _randn(shape: tuple[int, ...], dtype: mi.DType, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype.to_torch()).cuda()


def _plan(g: mi.KNGraph) -> dict[str, Any]:
    exe = _cuda.executable(g, torch.cuda.current_device())
    return {"gemms": json.loads(exe.summary)["gemms"], "note": exe.cublas_note, "exe": exe}


def _run(g: mi.KNGraph, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    outs = _cuda.run(g, xs, poison=True)
    torch.cuda.synchronize()
    for k, o in enumerate(outs):
        assert torch.isfinite(o).all(), f"output {k} has unwritten/NaN elements"
    return outs


def _matmul_graph(
    a_dims: tuple[int, ...],
    b_dims: tuple[int, ...],
    dtype: mi.DType,
    a_strides: tuple[int, ...] | None = None,
    b_strides: tuple[int, ...] | None = None,
) -> mi.KNGraph:
    g = mi.new_kernel_graph()
    a = g.new_input(a_dims, dtype=dtype, strides=a_strides)
    b = g.new_input(b_dims, dtype=dtype, strides=b_strides)
    g.mark_output(g.matmul(a, b))
    return g


DTYPES = [mi.float16, mi.bfloat16, mi.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "a_dims, b_dims",
    [
        ((16, 4096), (4096, 1024)),
        ((7, 4000), (4000, 3000)),  # odd dims
        ((4, 64, 128), (4, 128, 96)),  # batched
    ],
)
def test_predefined_matmul_runs_on_cublas(dtype, a_dims, b_dims):
    g = _matmul_graph(a_dims, b_dims, dtype)
    plan = _plan(g)
    assert plan["note"] is None and len(plan["gemms"]) == 1, plan
    assert json.loads(plan["exe"].summary)["kernels"] == []
    gemm = plan["gemms"][0]
    assert (gemm["m"], gemm["n"], gemm["k"]) == (a_dims[-2], b_dims[-1], a_dims[-1])
    assert gemm["batch"] == (a_dims[0] if len(a_dims) == 3 else 1)
    a, b = _randn(a_dims, dtype, 1), _randn(b_dims, dtype, 2) / 16
    (out,) = _run(g, [a, b])
    assert out.dtype == dtype.to_torch() and tuple(out.shape) == (*a_dims[:-1], b_dims[-1])
    err = _rel(out, a.double() @ b.double())
    assert err < TOL[dtype], f"relative error {err:.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ["a", "b", "both"])
def test_transposed_input_views(dtype, which):
    # A stored [k, m] and/or B stored [n, k] (a Linear weight), declared through the strides.
    m, k, n = 33, 520, 70
    at, bt = which in ("a", "both"), which in ("b", "both")
    g = _matmul_graph((m, k), (k, n), dtype, (1, m) if at else None, (1, k) if bt else None)
    plan = _plan(g)
    assert len(plan["gemms"]) == 1, plan
    a = _randn((k, m), dtype, 3).t() if at else _randn((m, k), dtype, 3)
    b = _randn((n, k), dtype, 4).t() if bt else _randn((k, n), dtype, 4)
    (out,) = _run(g, [a, b])
    err = _rel(out, a.double() @ b.double())
    assert err < TOL[dtype], f"relative error {err:.3g}"


@pytest.mark.parametrize("dtype", [mi.float16, mi.bfloat16])
def test_a_generated_kernel_then_a_cublas_matmul(dtype):
    # A customized RMS norm (a generated kernel) feeding a predefined matmul (cuBLAS), in
    # that order on one stream, through the workspace.
    g = mi.new_kernel_graph()
    X = g.new_input((16, 1024), dtype=dtype)
    W = g.new_input((1024, 512), dtype=dtype)
    tb = mi.new_threadblock_graph((16, 1, 1), (128, 1, 1), 1, 4)
    tb.new_output(tb.rms_norm(tb.new_input(X, (0, -1, -1), -1)), (0, -1, -1), -1)
    (xn,) = g.customized([X], tb)
    g.mark_output(g.matmul(xn, W))
    plan = _plan(g)
    summary = json.loads(plan["exe"].summary)
    assert [k["kind"] for k in summary["kernels"]] == ["customized"]
    assert summary["steps"] == [summary["kernels"][0]["name"], plan["gemms"][0]["name"]]
    x, w = _randn((16, 1024), dtype, 5) * 3, _randn((1024, 512), dtype, 6) / 16
    (out,) = _run(g, [x, w])
    xd = x.double()
    xnorm = (xd / xd.pow(2).mean(-1, keepdim=True).sqrt()).to(dtype.to_torch()).double()
    err = _rel(out, xnorm @ w.double())
    assert err < TOL[dtype], f"relative error {err:.3g}"
    # The interpreter agrees too.
    (ref,) = g(inputs=[x.cpu(), w.cpu()])
    assert _rel(out, ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", [mi.float16, mi.float32])
def test_cublas_steps_inside_cuda_graph_capture_match_eager(dtype):
    # A chain x <- x @ w of 8 calls, each result poisoned before the replay computes it.
    g = _matmul_graph((64, 512), (512, 512), dtype)
    assert len(_plan(g)["gemms"]) == 1
    x0, w = _randn((64, 512), dtype, 7), _randn((512, 512), dtype, 8) / 24
    eager = [x0]
    for _ in range(8):
        eager.append(g(inputs=[eager[-1], w])[0])
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch recommends for capture
        g(inputs=[x0, w])
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    captured = [x0]
    with torch.cuda.graph(graph):
        for _ in range(8):
            captured.append(g(inputs=[captured[-1], w])[0])
    for _ in range(2):
        for t in captured[1:]:
            t.fill_(float("nan"))
        graph.replay()
    torch.cuda.synchronize()
    ref = x0.double()
    for i, (c, e) in enumerate(zip(captured[1:], eager[1:])):
        ref = (ref.to(dtype.to_torch()).double() @ w.double()).to(dtype.to_torch()).double()
        assert torch.isfinite(c).all(), f"call {i}: unwritten elements"
        # Same library, same shapes, same workspace size: the same algorithm, the same bits
        # up to cuBLAS's choice per stream; bound it tightly against eager and float64.
        assert _rel(c, e) < TOL[dtype], f"call {i}: {_rel(c, e):.3g} from eager"
        assert _rel(c, ref) < 4 * TOL[dtype], f"call {i}: {_rel(c, ref):.3g} from float64"


@pytest.mark.parametrize("dtype", DTYPES)
def test_forcing_the_default_kernel_gives_the_same_values(dtype, monkeypatch):
    g = _matmul_graph((4, 48, 320), (4, 320, 200), dtype)
    a, b = _randn((4, 48, 320), dtype, 9), _randn((4, 320, 200), dtype, 10) / 16
    assert len(_plan(g)["gemms"]) == 1
    (lib,) = _run(g, [a, b])
    monkeypatch.setenv("MIRAGE_CUBLAS", "0")
    plan = _plan(g)
    assert plan["gemms"] == [] and "MIRAGE_CUBLAS=0" in plan["note"], plan
    assert [k["kind"] for k in json.loads(plan["exe"].summary)["kernels"]] == ["matmul"]
    (dflt,) = _run(g, [a, b])
    ref = a.double() @ b.double()
    assert _rel(lib, ref) < TOL[dtype] and _rel(dflt, ref) < TOL[dtype]
    # Both round the same fp32 sums: at most a unit in the last place of the storage apart.
    assert _rel(lib, dflt) < TOL[dtype], f"{_rel(lib, dflt):.3g}"
    # The saved source shows the step where cuBLAS runs, and the kernel where it does not.
    monkeypatch.delenv("MIRAGE_CUBLAS")
    src = _plan(g)["exe"].source
    assert "cuBLAS gemm 48 x 200 x 320 (batch 4)" in src and "_matmul(" not in src
