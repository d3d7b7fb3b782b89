"""``rms_norm``'s ``eps``: interpreter values against numpy, validation, serialization, the
search's fused form with the reference's epsilon, and (GPU) the generated kernels."""

import json

import mirage as mi
import numpy as np
import pytest
import torch
from conftest import as_f64, assert_close, randn


def rms_norm_eps(x, eps, w=None):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def norm_graph(m, k, eps, weight=True, dtype=mi.float32):
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(m, k), dtype=dtype)
    w = g.new_input(dims=(k,), dtype=dtype) if weight else None
    g.mark_output(g.rms_norm(x, normalized_shape=(k,), weight=w, eps=eps))
    return g


@pytest.mark.parametrize("eps", [0.0, 1e-6, 1e-5, 0.3])
def test_kernel_rms_norm_eps_matches_numpy(rng, eps):
    # Small inputs (mean of squares ~0.01) so that eps 0.3 dominates and 1e-5 is visible.
    x, w = randn(rng, 4, 64, scale=0.1), randn(rng, 64)
    (out,) = norm_graph(4, 64, eps)(inputs=[torch.from_numpy(x), torch.from_numpy(w)])
    ref = rms_norm_eps(as_f64(x), eps, as_f64(w))
    assert_close(out, ref, 1e-5)
    if eps >= 1e-5:
        # Without eps the result is measurably different: the test can fail.
        assert np.abs(as_f64(out) - rms_norm_eps(as_f64(x), 0.0, as_f64(w))).max() > 1e-5


@pytest.mark.parametrize("eps", [-1e-5, float("nan"), float("inf"), 1e39])
def test_bad_eps_names_the_op(eps):
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(2, 8), dtype=mi.float32)
    with pytest.raises(ValueError, match="rms_norm.*eps"):
        g.rms_norm(x, normalized_shape=(8,), eps=eps)
    with pytest.raises(TypeError, match="rms_norm.*eps"):
        g.rms_norm(x, normalized_shape=(8,), eps="1e-5")


def test_block_norm_and_rms_accumulator_take_eps(rng):
    m, k, n = 4, 64, 32
    eps = 0.25
    x, w = randn(rng, m, k, scale=0.2), randn(rng, k, n)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(m, k), dtype=mi.float32)
    W = g.new_input(dims=(k, n), dtype=mi.float32)
    tb = mi.new_threadblock_graph(
        grid_dim=(4, 1, 1), block_dim=(128, 1, 1), forloop_range=4, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=1)
    tw = tb.new_input(W, input_map=(1, -1, -1), forloop_dim=0)
    acc = tb.forloop_accum(tb.matmul(tx, tw))
    rms = tb.forloop_accum(tx, "rms", eps=eps)
    tb.new_output(tb.div(acc, rms), output_map=(1, -1, -1))
    (O,) = g.customized([X, W], tb)
    g.mark_output(O)
    (out,) = g(inputs=[torch.from_numpy(x), torch.from_numpy(w)])
    assert_close(out, rms_norm_eps(as_f64(x), eps) @ as_f64(w), 1e-5)
    ref = mi.new_kernel_graph()
    RX = ref.new_input(dims=(m, k), dtype=mi.float32)
    RW = ref.new_input(dims=(k, n), dtype=mi.float32)
    ref.mark_output(ref.matmul(ref.rms_norm(RX, (k,), eps=eps), RW))
    assert mi.verify(ref, g).equivalent
    ref2 = mi.new_kernel_graph()
    RX = ref2.new_input(dims=(m, k), dtype=mi.float32)
    RW = ref2.new_input(dims=(k, n), dtype=mi.float32)
    ref2.mark_output(ref2.matmul(ref2.rms_norm(RX, (k,), eps=eps / 2), RW))
    assert not mi.verify(ref2, g).equivalent
    tb2 = mi.new_threadblock_graph(
        grid_dim=(1, 1, 1), block_dim=(128, 1, 1), forloop_range=4, reduction_dimx=64
    )
    t = tb2.new_input(X, input_map=(-1, -1, -1), forloop_dim=1)
    with pytest.raises(ValueError, match="tb.forloop_accum.*rms"):
        tb2.forloop_accum(t, "sum", eps=1e-5)
    with pytest.raises(ValueError, match="tb.rms_norm.*eps"):
        tb2.rms_norm(t, eps=-1.0)


def test_eps_survives_json_and_changes_the_hash():
    a, b = norm_graph(4, 64, 1e-5), norm_graph(4, 64, 0.0)
    assert a.hash() != b.hash()
    doc = json.loads(a.to_json())
    assert doc["version"] == 2
    assert json.loads(b.to_json())["version"] == 1
    back = mi.from_json(a.to_json())
    assert back.hash() == a.hash()
    x = torch.randn(4, 64) * 0.01
    w = torch.ones(64)
    assert torch.equal(back(inputs=[x, w])[0], a(inputs=[x, w])[0])


def test_search_fuses_rmsnorm_linear_with_its_eps(tmp_path):
    eps = 0.5
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 256), dtype=mi.float32)
    W = g.new_input(dims=(256, 128), dtype=mi.float32)
    g.mark_output(g.matmul(g.rms_norm(X, (256,), eps=eps), W))
    best = g.superoptimize(backend="cpu", cache_dir=tmp_path, franges=[4])
    assert best.search_stats["winner"]["customized_kernels"] == 1
    assert mi.verify(g, best).equivalent
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(8, 256, generator=gen) * 0.3, torch.randn(256, 128, generator=gen)
    (out,) = best(inputs=[x, w])
    ref = rms_norm_eps(as_f64(x), eps) @ as_f64(w)
    assert_close(out, ref, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [mi.float16, mi.float32])
def test_generated_kernels_add_eps(dtype, tmp_path):
    tdt = torch.float16 if dtype == mi.float16 else torch.float32
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(8, 512, generator=gen) * 0.05).to(tdt).cuda()
    w = torch.randn(512, generator=gen).to(tdt).cuda()
    eps = 1e-3
    (out,) = norm_graph(8, 512, eps, dtype=dtype)(inputs=[x, w])
    ref = torch.nn.functional.rms_norm(x.float(), (512,), w.float(), eps=eps)
    assert_close(out.float(), ref, 2e-3 if tdt == torch.float16 else 1e-5)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 512), dtype=dtype)
    W = g.new_input(dims=(512, 256), dtype=dtype)
    g.mark_output(g.matmul(g.rms_norm(X, (512,), eps=eps), W))
    best = g.superoptimize(cache_dir=tmp_path)
    wm = (torch.randn(512, 256, generator=gen) / 16).to(tdt).cuda()
    (o,) = best(inputs=[x, wm])
    ref = torch.nn.functional.rms_norm(x.float(), (512,), eps=eps) @ wm.float()
    assert_close(o.float(), ref, 5e-3 if tdt == torch.float16 else 1e-4)


@pytest.mark.gpu
def test_qknorm_attention_with_eps_on_the_gpu(tmp_path):
    """QK-norm attention with an eps: whatever form the search picks (the specialised Q / V
    norms apply to eps = 0 only) computes the reference on the GPU."""
    b, s, d = 8, 256, 64
    eps = 1e-2
    g = mi.new_kernel_graph()
    Q = g.new_input(dims=(b, 64, d), dtype=mi.float16)
    K = g.new_input(dims=(b, d, s), dtype=mi.float16)
    V = g.new_input(dims=(b, s, d), dtype=mi.float16)
    qn = g.rms_norm(Q, (d,), eps=eps)
    vn = g.rms_norm(V, (d,), eps=eps)
    g.mark_output(g.matmul(g.softmax(g.matmul(qn, K), -1), vn))
    best = g.superoptimize(config="attention", cache_dir=tmp_path)
    gen = torch.Generator().manual_seed(3)
    q = (torch.randn(b, 64, d, generator=gen) * 0.05).half().cuda()
    k = (torch.randn(b, d, s, generator=gen) * 0.2).half().cuda()
    v = (torch.randn(b, s, d, generator=gen) * 0.05).half().cuda()
    (out,) = best(inputs=[q, k, v])
    f = torch.nn.functional
    qn_ref = f.rms_norm(q.float(), (d,), eps=eps)
    vn_ref = f.rms_norm(v.float(), (d,), eps=eps)
    ref = torch.softmax(qn_ref @ k.float(), -1) @ vn_ref
    assert_close(out.float(), ref, 2e-2)
