"""Programs from real model layers, built with the public kernel-graph API, shared by the CPU
search tests (tests/test_search_real_layers.py) and their GPU twin
(tests/gpu/test_search_real_layers_gpu.py)."""

from __future__ import annotations

import mirage as mi


def rms_weight_linear(m: int, k: int, n: int, dtype: mi.DType) -> mi.KNGraph:
    """RMSNorm with its weight, then a projection: ``rms_norm(X, w) @ W``."""
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(m, k), dtype=dtype)
    Wn = g.new_input(dims=(k,), dtype=dtype)
    W = g.new_input(dims=(k, n), dtype=dtype)
    g.mark_output(g.matmul(g.rms_norm(X, normalized_shape=(k,), weight=Wn), W))
    return g


def matmul_scale() -> mi.KNGraph:
    """A projection times a per-column scale: ``(X @ W) * s``."""
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(7, 400), dtype=mi.float16)
    W = g.new_input(dims=(400, 300), dtype=mi.float16)
    S = g.new_input(dims=(1, 300), dtype=mi.float16)
    g.mark_output(g.mul(g.matmul(X, W), S))
    return g


def lora_chain() -> mi.KNGraph:
    """A LoRA adapter's chain of matmuls: ``(X @ A) @ B``."""
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(7, 400), dtype=mi.float16)
    A = g.new_input(dims=(400, 16), dtype=mi.float16)
    B = g.new_input(dims=(16, 300), dtype=mi.float16)
    g.mark_output(g.matmul(g.matmul(X, A), B))
    return g


def gated_mlp_down() -> mi.KNGraph:
    """The gated MLP with its down projection: ``(silu(X Wg) * (X Wu)) Wd``."""
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 256), dtype=mi.float16)
    Wg = g.new_input(dims=(256, 344), dtype=mi.float16)
    Wu = g.new_input(dims=(256, 344), dtype=mi.float16)
    Wd = g.new_input(dims=(344, 256), dtype=mi.float16)
    g.mark_output(g.matmul(g.mul(g.silu(g.matmul(X, Wg)), g.matmul(X, Wu)), Wd))
    return g


def projected_attention() -> mi.KNGraph:
    """Attention over a projected query: ``softmax((X Wq) Kt) V``."""
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 256), dtype=mi.float16)
    Wq = g.new_input(dims=(256, 64), dtype=mi.float16)
    Kt = g.new_input(dims=(64, 128), dtype=mi.float16)
    V = g.new_input(dims=(128, 64), dtype=mi.float16)
    g.mark_output(g.matmul(g.softmax(g.matmul(g.matmul(X, Wq), Kt)), V))
    return g


def unfusable() -> mi.KNGraph:
    """Three kernel ops no block graph holds together: ``pow(X @ W - Y, E)`` (float32)."""
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 64), dtype=mi.float32)
    W = g.new_input(dims=(64, 32), dtype=mi.float32)
    Y = g.new_input(dims=(8, 32), dtype=mi.float32)
    E = g.new_input(dims=(8, 32), dtype=mi.float32)
    g.mark_output(g.pow(g.sub(g.matmul(X, W), Y), E))
    return g
