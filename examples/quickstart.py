"""Quickstart: build the seed µGraphs with the mirage Python API, run them on the CPU
interpreter and check them against PyTorch (float64 reference).

    make demo        # or: .venv/bin/python examples/quickstart.py
"""

from __future__ import annotations

import time

import mirage as mi
import torch


def check(
    name: str,
    graph: mi.KNGraph,
    inputs: list[torch.Tensor],
    want: torch.Tensor,
    tol: float = 1e-4,
) -> None:
    """Runs ``graph`` on ``inputs`` and prints the max relative error and the run time."""
    t0 = time.perf_counter()
    (out,) = graph(inputs=inputs)
    ms = (time.perf_counter() - t0) * 1e3
    err = ((out.double() - want).abs().max() / want.abs().max()).item()
    print(f"  {name:<36} max|out-ref|/max|ref| = {err:.1e}   {ms:7.1f} ms")
    assert err < tol, f"{name}: error {err:.2e} too large"


torch.manual_seed(0)
f32 = mi.float32

print("(a) attention with softmax: O = softmax(Q K) V")
g = mi.new_kernel_graph()
Q = g.new_input(dims=(4, 1, 64), dtype=f32)
K = g.new_input(dims=(4, 64, 512), dtype=f32)
V = g.new_input(dims=(4, 512, 64), dtype=f32)
g.mark_output(g.matmul(g.softmax(g.matmul(Q, K), dim=-1), V))
q, k, v = torch.randn(4, 1, 64), torch.randn(4, 64, 512) / 8, torch.randn(4, 512, 64)
check("kernel graph (3 ops)", g, [q, k, v], torch.softmax(q.double() @ k.double(), -1) @ v.double())

print("(b) RMSNorm + Linear: Y = rms_norm(X) W, X (16, 4096), W (4096, 4096)")
x, w = torch.randn(16, 4096), torch.randn(4096, 4096) / 64
xd = x.double()
want = (xd / xd.square().mean(-1, keepdim=True).sqrt()) @ w.double()
plain = mi.new_kernel_graph()
X, W = plain.new_input(dims=(16, 4096), dtype=f32), plain.new_input(dims=(4096, 4096), dtype=f32)
plain.mark_output(plain.matmul(plain.rms_norm(X, normalized_shape=(4096,)), W))
check("plain kernel graph (2 ops)", plain, [x, w], want)

fused = mi.new_kernel_graph()
X, W = fused.new_input(dims=(16, 4096), dtype=f32), fused.new_input(dims=(4096, 4096), dtype=f32)
tb = mi.new_threadblock_graph(
    grid_dim=(64, 1, 1), block_dim=(128, 1, 1), forloop_range=64, reduction_dimx=64
)
tx = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=1)
tw = tb.new_input(W, input_map=(1, -1, -1), forloop_dim=0)
acc = tb.forloop_accum(tb.matmul(tx, tw))  # sum of X_i W_i over the loop
rms = tb.forloop_accum(tx, acc="rms")  # sqrt(mean(X^2)), accumulated over the loop
tb.new_output(tb.div(acc, rms), output_map=(1, -1, -1))
(Y,) = fused.customized([X, W], tb)
fused.mark_output(Y)
check("one-kernel µGraph (grid 64, loop 64)", fused, [x, w], want)
print(f"graph hashes: plain {plain.hash()[:12]}..., fused {fused.hash()[:12]}...")

print("(c) superoptimize: find the fused µGraph of (b) by search (X 16x1024, W 1024x1024 fp16)")
g = mi.new_kernel_graph()
X = g.new_input(dims=(16, 1024), dtype=mi.float16)
W = g.new_input(dims=(1024, 1024), dtype=mi.float16)
g.mark_output(g.matmul(g.rms_norm(X, normalized_shape=(1024,)), W))
t0 = time.perf_counter()
# Cached by graph hash, settings and build in $MIRAGE_CACHE_DIR/search (docs/caches.md);
# with a CUDA GPU the top candidates are compiled and timed, else the cost model decides.
best = g.superoptimize(config="mlp")
st = best.search_stats
assert st is not None
print(
    f"  {st['source']} in {time.perf_counter() - t0:.2f} s: {st['candidates']} candidates, "
    f"{st['verified']} verified; chose by {st['selection']['method']}: "
    f"{st['winner']['customized_kernels']} customized kernel(s), "
    f"modelled {st['winner']['cost']['est_us']:.1f} us"
)
x, w = torch.randn(16, 1024).half(), (torch.randn(1024, 1024) / 32).half()
xd = x.double()
want = (xd / xd.square().mean(-1, keepdim=True).sqrt()) @ w.double()
check("superoptimized µGraph (fp16)", best, [x, w], want, tol=1e-2)
