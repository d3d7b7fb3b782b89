"""The reference's hand-written µGraphs (docs/reference.md: µGraph semantics) against plain torch.

Each builder returns ``(graph, inputs, references)``: numpy float32 inputs and float64 torch
references of the unfused program. ``GRAPHS`` is reused by the serialization tests.
"""

import math

import mirage as mi
import numpy as np
import pytest
import torch
from conftest import assert_close, randn, run

F32 = mi.float32


def t64(x):
    return torch.from_numpy(x).to(torch.float64)


def new_tb(grid_dim, forloop_range, reduction_dimx=64):
    return mi.new_threadblock_graph(
        grid_dim=grid_dim,
        block_dim=(128, 1, 1),
        forloop_range=forloop_range,
        reduction_dimx=reduction_dimx,
    )


# ---------------------------------------------------------------------------------------------
# RMSNorm + Linear in one kernel: the normalisation moves after the matmul.


def rmsnorm_linear(rng, n=16, k=1024, m=1024, grid=16, frange=16):
    x, w = randn(rng, n, k), randn(rng, k, m, scale=1.0 / math.sqrt(k))
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(n, k), dtype=F32)
    W = g.new_input(dims=(k, m), dtype=F32)
    tb = new_tb((grid, 1, 1), frange)
    tx = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=1)
    tw = tb.new_input(W, input_map=(1, -1, -1), forloop_dim=0)
    acc = tb.forloop_accum(tb.matmul(tx, tw))
    rms = tb.forloop_accum(tx, "rms")
    tb.new_output(tb.div(acc, rms), output_map=(1, -1, -1))
    (O,) = g.customized([X, W], tb)
    assert tuple(O.dims) == (n, m)
    g.mark_output(O)
    xt = t64(x)
    ref = (xt / xt.pow(2).mean(-1, keepdim=True).sqrt()) @ t64(w)
    return g, [x, w], [ref]


def test_rmsnorm_linear(rng):
    g, inputs, refs = rmsnorm_linear(rng)
    (out,) = run(g, *inputs)
    assert_close(out, refs[0])


def test_rmsnorm_linear_full_size(rng):
    """The reference's shapes: X 16x4096, W 4096x4096, 64 blocks, a loop of 64."""
    g, inputs, refs = rmsnorm_linear(rng, n=16, k=4096, m=4096, grid=64, frange=64)
    (out,) = run(g, *inputs)
    assert_close(out, refs[0])


def test_rmsnorm_linear_matches_kernel_level_program(rng):
    g, (x, w), _ = rmsnorm_linear(rng, n=8, k=256, m=128, grid=4, frange=8)
    plain = mi.new_kernel_graph()
    X = plain.new_input(dims=(8, 256), dtype=F32)
    W = plain.new_input(dims=(256, 128), dtype=F32)
    plain.mark_output(plain.matmul(plain.rms_norm(X, normalized_shape=(256,)), W))
    (fused,) = run(g, x, w)
    (unfused,) = run(plain, x, w)
    assert_close(fused, unfused)


# ---------------------------------------------------------------------------------------------
# Gated MLP in one kernel: silu(X W1) * (X W2), both matmuls accumulated in the same loop.


def gated_mlp(rng, n=16, k=1024, m=1024, grid=16, frange=32):
    x = randn(rng, n, k)
    w1, w2 = randn(rng, k, m, scale=1.0 / math.sqrt(k)), randn(rng, k, m, scale=1.0 / math.sqrt(k))
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(n, k), dtype=F32)
    W1 = g.new_input(dims=(k, m), dtype=F32)
    W2 = g.new_input(dims=(k, m), dtype=F32)
    tb = new_tb((grid, 1, 1), frange)
    tx = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=1)
    tw1 = tb.new_input(W1, input_map=(1, -1, -1), forloop_dim=0)
    tw2 = tb.new_input(W2, input_map=(1, -1, -1), forloop_dim=0)
    acc1 = tb.forloop_accum(tb.matmul(tx, tw1))
    acc2 = tb.forloop_accum(tb.matmul(tx, tw2))
    tb.new_output(tb.mul(tb.silu(acc1), acc2), output_map=(1, -1, -1))
    (O,) = g.customized([X, W1, W2], tb)
    g.mark_output(O)
    xt = t64(x)
    ref = torch.nn.functional.silu(xt @ t64(w1)) * (xt @ t64(w2))
    return g, [x, w1, w2], [ref]


def test_gated_mlp(rng):
    g, inputs, refs = gated_mlp(rng)
    (out,) = run(g, *inputs)
    assert_close(out, refs[0])


# ---------------------------------------------------------------------------------------------
# LoRA: X W + (X A) B = [X | X A] @ [W ; B]. A kernel matmul computes X A; one customized op
# concatenates the tiles and multiplies. With a loop of R the shared dim of both halves is split
# R ways at once: concat([X_i, XA_i]) @ concat([W_i ; B_i]) = X_i W_i + XA_i B_i, summed over i.


def lora(rng, frange=4, n=16, k=256, m=1024, r=16, grid=8):
    x = randn(rng, n, k)
    w, a = randn(rng, k, m, scale=1.0 / math.sqrt(k)), randn(rng, k, r, scale=1.0 / math.sqrt(k))
    b = randn(rng, r, m, scale=1.0 / math.sqrt(r))
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(n, k), dtype=F32)
    W = g.new_input(dims=(k, m), dtype=F32)
    A = g.new_input(dims=(k, r), dtype=F32)
    B = g.new_input(dims=(r, m), dtype=F32)
    XA = g.matmul(X, A)
    tb = new_tb((grid, 1, 1), frange)
    tx = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=1)
    txa = tb.new_input(XA, input_map=(-1, -1, -1), forloop_dim=1)
    tw = tb.new_input(W, input_map=(1, -1, -1), forloop_dim=0)
    tbb = tb.new_input(B, input_map=(1, -1, -1), forloop_dim=0)
    lhs = tb.concat(tx, txa, 1)
    rhs = tb.concat(tw, tbb, 0)
    assert tuple(lhs.dims) == (n, (k + r) // frange)
    assert tuple(rhs.dims) == ((k + r) // frange, m // grid)
    tb.new_output(tb.forloop_accum(tb.matmul(lhs, rhs)), output_map=(1, -1, -1))
    (O,) = g.customized([X, XA, W, B], tb)
    g.mark_output(O)
    xt = t64(x)
    ref = xt @ t64(w) + (xt @ t64(a)) @ t64(b)
    return g, [x, w, a, b], [ref]


def lora_single_kernel(rng, n=16, k=256, m=1024, r=16, grid=8):
    """All of LoRA in one customized op: X A is computed by every block on loop-invariant tiles."""
    x = randn(rng, n, k)
    w, a = randn(rng, k, m, scale=1.0 / math.sqrt(k)), randn(rng, k, r, scale=1.0 / math.sqrt(k))
    b = randn(rng, r, m, scale=1.0 / math.sqrt(r))
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(n, k), dtype=F32)
    W = g.new_input(dims=(k, m), dtype=F32)
    A = g.new_input(dims=(k, r), dtype=F32)
    B = g.new_input(dims=(r, m), dtype=F32)
    tb = new_tb((grid, 1, 1), 1)
    tx = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=-1)
    tw = tb.new_input(W, input_map=(1, -1, -1), forloop_dim=-1)
    ta = tb.new_input(A, input_map=(-1, -1, -1), forloop_dim=-1)
    tbb = tb.new_input(B, input_map=(1, -1, -1), forloop_dim=-1)
    lhs = tb.concat(tx, tb.matmul(tx, ta), 1)
    rhs = tb.concat(tw, tbb, 0)
    tb.new_output(tb.matmul(lhs, rhs), output_map=(1, -1, -1))
    (O,) = g.customized([X, W, A, B], tb)
    g.mark_output(O)
    xt = t64(x)
    ref = xt @ t64(w) + (xt @ t64(a)) @ t64(b)
    return g, [x, w, a, b], [ref]


@pytest.mark.parametrize("frange", [1, 4, 16])
def test_lora_concat(rng, frange):
    g, inputs, refs = lora(rng, frange=frange)
    (out,) = run(g, *inputs)
    assert_close(out, refs[0])


def test_lora_single_kernel(rng):
    g, inputs, refs = lora_single_kernel(rng)
    (out,) = run(g, *inputs)
    assert_close(out, refs[0])


# ---------------------------------------------------------------------------------------------
# GQA flash decoding in two kernels. Kernel 1: grid x over the batch, grid y splits the keys;
# each block loops over its keys with E = exp(Q K), accumulating E V and sum(E); the partial
# results of the splits land side by side. Kernel 2 reduces the partials and divides.


def gqa_inputs(rng, b, m, d, n, logits):
    if logits == "normal":
        q, k, scale = randn(rng, b, m, d), randn(rng, b, d, n), 1.0 / math.sqrt(d)
    else:  # exact integer logits far beyond exp's float32 range
        q = rng.integers(-2, 3, (b, m, d)).astype(np.float32)
        k = rng.integers(-2, 3, (b, d, n)).astype(np.float32)
        scale = 8.0
        assert (t64(q) @ t64(k) * scale).max() > 100.0
    return q, k, randn(rng, b, n, d), scale


def gqa_flash_decoding(rng, b=2, m=16, d=32, n=512, splits=4, frange=4):
    q, k, v, scale = gqa_inputs(rng, b, m, d, n, "normal")
    g = mi.new_kernel_graph()
    Q = g.new_input(dims=(b, m, d), dtype=F32)
    K = g.new_input(dims=(b, d, n), dtype=F32)
    V = g.new_input(dims=(b, n, d), dtype=F32)

    tb = new_tb((b, splits, 1), frange)
    tq = tb.new_input(Q, input_map=(0, -1, -1), forloop_dim=-1)
    tk = tb.new_input(K, input_map=(0, 2, -1), forloop_dim=2)
    tv = tb.new_input(V, input_map=(0, 1, -1), forloop_dim=1)
    te = tb.exp(tb.mul_scalar(tb.matmul(tq, tk), scale))
    tb.new_output(tb.forloop_accum(tb.matmul(te, tv)), output_map=(0, 2, -1))
    tb.new_output(tb.forloop_accum(te, "sum"), output_map=(0, 2, -1))
    O_part, L_part = g.customized([Q, K, V], tb)
    assert tuple(O_part.dims) == (b, m, d * splits)
    assert tuple(L_part.dims) == (b, m, splits)

    tb2 = new_tb((b, 1, 1), 2, reduction_dimx=d)
    to = tb2.new_input(O_part, input_map=(0, -1, -1), forloop_dim=2)
    tl = tb2.new_input(L_part, input_map=(0, -1, -1), forloop_dim=2)
    o = tb2.forloop_accum(to, "sum_todimx")
    lsum = tb2.forloop_accum(tl, "sum")
    tb2.new_output(tb2.div(o, lsum), output_map=(0, -1, -1))
    (O,) = g.customized([O_part, L_part], tb2)
    assert tuple(O.dims) == (b, m, d)
    g.mark_output(O)
    ref = torch.softmax(t64(q) @ t64(k) * scale, dim=-1) @ t64(v)
    return g, [q, k, v], [ref]


def test_gqa_flash_decoding(rng):
    g, inputs, refs = gqa_flash_decoding(rng)
    (out,) = run(g, *inputs)
    assert_close(out, refs[0])


def gqa_online_softmax(rng, logits="normal", b=2, m=16, d=32, n=512, splits=4, frange=4):
    """Kernel 1 keeps a running max per split (reduction_max + rescaling accumulators) and
    saves each split's max; kernel 2 loops over the splits and rescales them to a common max."""
    q, k, v, scale = gqa_inputs(rng, b, m, d, n, logits)
    g = mi.new_kernel_graph()
    Q = g.new_input(dims=(b, m, d), dtype=F32)
    K = g.new_input(dims=(b, d, n), dtype=F32)
    V = g.new_input(dims=(b, n, d), dtype=F32)

    tb = new_tb((b, splits, 1), frange)
    tq = tb.new_input(Q, input_map=(0, -1, -1), forloop_dim=-1)
    tk = tb.new_input(K, input_map=(0, 2, -1), forloop_dim=2)
    tv = tb.new_input(V, input_map=(0, 1, -1), forloop_dim=1)
    ts = tb.mul_scalar(tb.matmul(tq, tk), scale)
    tm, td = tb.reduction_max(ts, 2)
    te = tb.exp(tb.sub(ts, tm))
    rescale = tb.exp(td)
    tb.new_output(tb.forloop_accum_rescale(tb.matmul(te, tv), rescale), output_map=(0, 2, -1))
    tb.new_output(tb.forloop_accum_rescale(te, rescale, "sum"), output_map=(0, 2, -1))
    tb.new_output(tb.forloop_accum_max(tm), output_map=(0, 2, -1))
    O_part, L_part, M_part = g.customized([Q, K, V], tb)
    assert tuple(M_part.dims) == (b, m, splits)

    tb2 = new_tb((b, 1, 1), splits)
    to = tb2.new_input(O_part, input_map=(0, -1, -1), forloop_dim=2)  # one split per iteration
    tl = tb2.new_input(L_part, input_map=(0, -1, -1), forloop_dim=2)
    tms = tb2.new_input(M_part, input_map=(0, -1, -1), forloop_dim=2)
    run_max, diff = tb2.reduction_max(tms, 2)
    weight = tb2.exp(tb2.sub(tms, run_max))
    rescale2 = tb2.exp(diff)
    o = tb2.forloop_accum_rescale(tb2.mul(to, weight), rescale2)
    lsum = tb2.forloop_accum_rescale(tb2.mul(tl, weight), rescale2)
    tb2.new_output(tb2.div(o, lsum), output_map=(0, -1, -1))
    (O,) = g.customized([O_part, L_part, M_part], tb2)
    g.mark_output(O)
    ref = torch.softmax(t64(q) @ t64(k) * scale, dim=-1) @ t64(v)
    return g, [q, k, v], [ref]


@pytest.mark.parametrize("logits", ["normal", "huge"])
def test_gqa_online_softmax(rng, logits):
    g, inputs, refs = gqa_online_softmax(rng, logits)
    (out,) = run(g, *inputs)
    assert np.all(np.isfinite(out))
    assert_close(out, refs[0])


GRAPHS = {
    "rmsnorm_linear": lambda rng: rmsnorm_linear(rng, n=8, k=256, m=256, grid=4, frange=8),
    "gated_mlp": lambda rng: gated_mlp(rng, n=8, k=256, m=256, grid=4, frange=8),
    "lora": lambda rng: lora(rng, frange=4, k=128, m=256),
    "lora_single_kernel": lambda rng: lora_single_kernel(rng, k=128, m=256),
    "gqa_flash_decoding": lambda rng: gqa_flash_decoding(rng, n=256),
    "gqa_online_softmax": lambda rng: gqa_online_softmax(rng, n=256),
}
