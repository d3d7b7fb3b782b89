"""``torch.compile(..., backend="mirage")`` on the CPU: lowered regions run on the interpreter
and match eager; unsupported ops fall back (logged); searches are cached; dynamic shapes are
bucketed; the backend is found by name through the package's entry point."""

import logging
import os
import subprocess
import sys
import textwrap

import mirage as mi
import pytest
import torch
import torch.nn.functional as F
from mirage import _dynamo
from torch import nn


@pytest.fixture
def opts(tmp_path):
    """Fast options: eager fallback, a short search with one loop range, a private cache."""
    return {
        "fallback": "eager",
        "time_budget": 5.0,
        "cache_dir": str(tmp_path / "search"),
        "search_kwargs": {"franges": [1, 4]},
    }


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    _dynamo.clear_caches()
    yield
    torch._dynamo.reset()


class LlamaRMSNorm(nn.Module):
    """The Hugging Face LLaMA form: casts to float32 and back, ``x * rsqrt(mean(x^2) + eps)``."""

    def __init__(self, h: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(h) * 0.5 + 1.0)
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class NormLinear(nn.Module):
    def __init__(self, k: int = 64, n: int = 32, eps: float = 1e-5, hf: bool = False) -> None:
        super().__init__()
        self.norm = LlamaRMSNorm(k, eps) if hf else nn.RMSNorm(k, eps=eps)
        self.proj = nn.Linear(k, n, bias=False)

    def forward(self, x):
        return self.proj(self.norm(x))


class SwiGLU(nn.Module):
    def __init__(self, k: int = 64, n: int = 32) -> None:
        super().__init__()
        self.gate = nn.Linear(k, n, bias=False)
        self.up = nn.Linear(k, n, bias=False)

    def forward(self, x):
        return F.silu(self.gate(x)) * self.up(x)


class Block(nn.Module):
    """A small LLaMA-like block: RMSNorm + QKV projection, attention, RMSNorm + SwiGLU MLP."""

    def __init__(self, d: int = 256, h: int = 4, f: int = 512) -> None:
        super().__init__()
        self.h = h
        self.n1 = LlamaRMSNorm(d, 1e-5)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.n2 = nn.RMSNorm(d, eps=1e-6)
        self.mlp = SwiGLU(d, f)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.n1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.o(a)
        return x + self.down(self.mlp(self.n2(x)))


def assert_matches(out, ref, rtol=1e-4, atol=1e-5):
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert o.shape == r.shape and o.dtype == r.dtype
        torch.testing.assert_close(o, r, rtol=rtol, atol=atol)


def small(*shape, scale=1.0, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("hf", [False, True])
def test_rmsnorm_linear_matches_eager(opts, hf):
    torch.manual_seed(0)
    m = NormLinear(hf=hf).eval()
    x = small(8, 64, scale=0.05)  # small values: eps changes the result
    with torch.no_grad():
        ref = m(x)
        out = torch.compile(m, backend="mirage", options=opts)(x)
    assert_matches(out, ref)
    st = mi.dynamo_stats()
    assert st["regions_lowered"] == 1 and st["region_calls"] == 1, st
    # The norm's eps matters at these values: dropping it would not match.
    assert (F.rms_norm(x, (64,), m.norm.weight, eps=0.0) @ m.proj.weight.T - ref).abs().max() > 1e-3


def test_swiglu_mlp_matches_eager(opts):
    torch.manual_seed(1)
    m = SwiGLU().eval()
    x = small(8, 64, seed=1)
    with torch.no_grad():
        assert_matches(torch.compile(m, backend="mirage", options=opts)(x), m(x))
    assert mi.dynamo_stats()["regions_lowered"] == 1


def test_attention_matches_eager(opts):
    q, k, v = small(1, 2, 8, 16, seed=2), small(1, 2, 8, 16, seed=3), small(1, 2, 8, 16, seed=4)

    def attn(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    for f in (attn, sdpa):
        torch._dynamo.reset()
        # The lowered graph as it is (an attention search takes seconds on the CPU).
        out = torch.compile(f, backend="mirage", options=dict(opts, search=False))(q, k, v)
        assert_matches(out, f(q, k, v))
    assert mi.dynamo_stats()["regions_lowered"] == 2


def test_unsupported_op_falls_back_and_is_logged(opts, caplog):
    m = NormLinear().eval()

    def f(x):
        y = m(x)
        return torch.cumsum(y, 0) + torch.sort(y, dim=-1).values

    x = small(8, 64, seed=5)
    with caplog.at_level(logging.INFO, logger="mirage.dynamo"), torch.no_grad():
        out = torch.compile(f, backend="mirage", options=opts)(x)
        ref = f(x)
    assert_matches(out, ref)
    st = mi.dynamo_stats()
    assert st["regions_lowered"] >= 1, st
    # cumsum and sort stay torch code: the lowered region feeds them.
    assert any("lowered" in r.getMessage() for r in caplog.records)


def test_region_that_cannot_lower_is_logged_with_its_reason(opts, caplog):
    w = small(64, 32, seed=6)

    def f(x):
        # x @ w then a transpose of the computed product: a view of a computed value splits
        # the region; mean without keepdim does not lower: logged, run by the fallback.
        return (x @ w).mean(-1)

    x = small(8, 64, seed=7)
    with caplog.at_level(logging.INFO, logger="mirage.dynamo"):
        out = torch.compile(f, backend="mirage", options=opts)(x)
    assert_matches(out, f(x))
    msgs = [r.getMessage() for r in caplog.records if r.name == "mirage.dynamo"]
    assert any("runs through eager" in m and "keepdim" in m for m in msgs), msgs
    assert mi.dynamo_stats()["regions_fallback"] == 1


def test_second_compile_of_the_same_shapes_searches_nothing(opts):
    m = SwiGLU().eval()
    x = small(8, 64, seed=8)
    with torch.no_grad():
        a = torch.compile(m, backend="mirage", options=opts)(x)
        searched = mi.dynamo_stats()["searches"] + mi.dynamo_stats()["search_failures"]
        assert searched == 1
        torch._dynamo.reset()
        b = torch.compile(m, backend="mirage", options=opts)(x)
    st = mi.dynamo_stats()
    assert st["compiles"] == 2 and st["searches"] + st["search_failures"] == 1, st
    assert st["graph_cache_hits"] == 1, st
    assert torch.equal(a, b)
    # A new process (the in-process cache cleared) is served by the on-disk cache.
    if st["searches"] == 1:
        torch._dynamo.reset()
        _dynamo.clear_caches()
        with torch.no_grad():
            torch.compile(m, backend="mirage", options=opts)(x)
        st = mi.dynamo_stats()
        assert st["searches"] == 0 and st["search_disk_hits"] == 1, st


def test_fixed_batch_decode_loop_searches_once(opts):
    m = NormLinear().eval()
    f = torch.compile(m, backend="mirage", options=opts)
    with torch.no_grad():
        for step in range(5):
            x = small(4, 64, seed=10 + step)
            assert_matches(f(x), m(x))
    st = mi.dynamo_stats()
    assert st["compiles"] == 1 and st["lowerings"] == 1, st
    assert st["searches"] + st["search_failures"] == 1 and st["region_calls"] == 5, st


def test_dynamic_rows_are_bucketed_to_powers_of_two(opts):
    m = NormLinear().eval()
    f = torch.compile(m, backend="mirage", options=opts, dynamic=True)
    with torch.no_grad():
        for rows in (3, 4, 5, 7, 8, 6):
            x = small(rows, 64, seed=rows)
            assert_matches(f(x), m(x))
    st = mi.dynamo_stats()
    # Buckets 4 and 8: one lowering and one search each.
    assert st["lowerings"] == 2, st
    assert st["searches"] + st["search_failures"] + st["graph_cache_hits"] == 2, st
    assert st["compiles"] == 1, st


def test_dynamic_batch_and_sequence_share_rows(opts):
    m = NormLinear(hf=True).eval()
    f = torch.compile(m, backend="mirage", options=dict(opts, search=False), dynamic=True)
    with torch.no_grad():
        # (Dims of size 1 are specialised by dynamo: all sizes here are >= 2.)
        for b, s in ((2, 3), (3, 2), (2, 4), (3, 5)):
            x = small(b, s, 64, seed=b * 10 + s, scale=0.1)
            assert_matches(f(x), m(x))
    st = mi.dynamo_stats()
    assert st["compiles"] == 1, st
    assert st["lowerings"] == 2, st  # rows 6, 6 and 8 share bucket 8; 15 is bucket 16


def test_float16_and_bfloat16(opts):
    m = SwiGLU().eval()
    for dt in (torch.float16, torch.bfloat16):
        torch._dynamo.reset()
        md = m.to(dt)
        x = small(8, 64, seed=20).to(dt)
        with torch.no_grad():
            out = torch.compile(md, backend="mirage", options=opts)(x)
            ref = md.float()(x.float()).to(dt)
            md.to(dt)
        assert out.dtype == dt
        torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_non_contiguous_input(opts):
    w = small(64, 32, seed=21)

    def f(x):
        return torch.softmax(x @ w, dim=-1)

    x = small(64, 8, seed=22).t()  # a transposed view
    assert not x.is_contiguous()
    assert_matches(torch.compile(f, backend="mirage", options=opts)(x), f(x))


def test_through_inductor(tmp_path):
    opts = {"time_budget": 5.0, "cache_dir": str(tmp_path), "search_kwargs": {"franges": [1, 4]}}
    m = SwiGLU().eval()

    def f(x):
        return torch.cumsum(m(x), 0)

    x = small(8, 64, seed=23)
    with torch.no_grad():
        assert_matches(torch.compile(f, backend="mirage", options=opts)(x), f(x))
    st = mi.dynamo_stats()
    assert st["regions_lowered"] == 1 and st["region_calls"] == 1, st


def test_bad_options_are_refused():
    with pytest.raises(Exception, match="unknown option"):
        torch.compile(lambda x: x + 1, backend="mirage", options={"nope": 1})(torch.ones(2))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="fallback"):
        torch.compile(lambda x: x + 1, backend="mirage", options={"fallback": "tvm"})(torch.ones(2))
    for bad in ({"total_time_budget": -1}, {"time_budget": 0}, {"total_time_budget": True}):
        with pytest.raises(ValueError, match="budget must be a positive number"):
            _dynamo.BackendOptions.parse(bad)
    assert _dynamo.BackendOptions.parse({"time_budget": None}).time_budget is None
    with pytest.raises(ValueError, match="choose must be one of"):
        _dynamo.BackendOptions.parse({"choose": "fastest"})


def test_backend_is_found_by_name_without_importing_mirage():
    """In a fresh interpreter that never imports mirage, torch finds the backend through the
    ``torch_dynamo_backends`` entry point of the installed package (run with the built wheel
    on the path: ``PYTHONPATH=.site``), else through nothing: then this test is skipped."""
    from importlib.metadata import entry_points

    if "mirage" not in entry_points(group="torch_dynamo_backends").names:
        pytest.skip("mirage-rs is not installed with its entry points (build the wheel)")
    code = textwrap.dedent(
        """
        import sys, torch
        f = torch.compile(lambda x: torch.nn.functional.silu(x) * x, backend="mirage",
                          options={"fallback": "eager", "search": False,
                                   "elementwise": True})
        x = torch.randn(4, 8)
        torch.testing.assert_close(f(x), torch.nn.functional.silu(x) * x)
        assert "mirage" in sys.modules
        import mirage
        print(mirage.dynamo_stats()["regions_lowered"])
        """
    )
    env = dict(os.environ)
    r = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "1"


def test_llama_like_block_with_dynamic_shapes(opts):
    """Views of computed values split the block into norm + QKV, attention and the rest; the
    rest is cut into stages (output projection + residual, norm + gated MLP, down projection +
    residual); the head split's views stay torch code."""
    torch.manual_seed(0)
    m = Block(d=64, h=4, f=128).eval()
    f = torch.compile(m, backend="mirage", options=dict(opts, search=False), dynamic=True)
    with torch.no_grad():
        for b, s in ((2, 8), (3, 5)):
            x = small(b, s, 64, seed=b + s)
            assert_matches(f(x), m(x))
    st = mi.dynamo_stats()
    assert st["compiles"] == 1 and st["regions"] == 5 and st["regions_lowered"] == 5, st
    kinds = sorted(r["kind"] for r in mi.dynamo_summary()["regions"])
    assert kinds == ["attention", "matmul", "matmul", "norm_matmul", "norm_matmul"], kinds


class MLPLayer(nn.Module):
    """``x + down(silu(gate(n(x))) * up(n(x)))``: a LLaMA layer without attention."""

    def __init__(self, d: int = 32, f: int = 64) -> None:
        super().__init__()
        self.n = LlamaRMSNorm(d, 1e-5)
        self.mlp = SwiGLU(d, f)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return x + self.down(self.mlp(self.n(x)))


def region_ops(summary):
    return sorted("+".join(r["ops"]) for r in summary["regions"])


def test_two_layers_search_each_distinct_region_once(opts):
    """Two layers of the same shapes: four regions (norm + gated MLP, down projection +
    residual, per layer), two distinct graphs, each searched once (the second layer's are
    in-process cache hits); every search got the per-region budget."""
    torch.manual_seed(0)
    m = nn.Sequential(MLPLayer(), MLPLayer()).eval()
    x = small(4, 32, seed=30, scale=0.5)
    with torch.no_grad():
        assert_matches(torch.compile(m, backend="mirage", options=opts)(x), m(x))
    summ = mi.dynamo_summary()
    st = summ["counters"]
    assert st["regions_lowered"] == 4, st
    assert region_ops(summ) == ["matmul+add"] * 2 + ["rms_norm+matmul+silu+matmul+mul"] * 2
    assert st["searches"] + st["search_failures"] == 2 and st["graph_cache_hits"] == 2, st
    records = [s for r in summ["regions"] for s in r["searches"]]
    assert sorted(s["source"] for s in records).count("in-process cache") == 2, records
    assert all(s["time_budget"] == opts["time_budget"] for s in records), records
    # Both kinds (norm_matmul, matmul) search with the "mlp" preset's settings.
    assert {s["config"] for s in records} == {"mlp"}, records


def test_norm_feeding_projections_splits_per_projection(opts):
    """A norm feeding three projections (Q, K, V) becomes three norm + projection regions (the
    norm copied into each); with ``split=False`` it is one region of three outputs."""
    torch.manual_seed(0)
    n = LlamaRMSNorm(32, 1e-5)
    q, k, v = (nn.Linear(32, o, bias=False) for o in (32, 16, 16))

    def f(x):
        h = n(x)
        return q(h), k(h), v(h)

    x = small(4, 32, seed=31)
    with torch.no_grad():
        for split, regions in ((True, 3), (False, 1)):
            torch._dynamo.reset()
            _dynamo.clear_caches()
            o = dict(opts, search=False, split=split)
            assert_matches(torch.compile(f, backend="mirage", options=o)(x), f(x))
            summ = mi.dynamo_summary()
            assert summ["counters"]["regions_lowered"] == regions, summ["counters"]
    # The last summary is split=False's: one region, all three projections.
    ops = [r["ops"] for r in mi.dynamo_summary()["regions"]]
    assert ["rms_norm", "matmul", "matmul", "matmul"] in ops, ops


@pytest.mark.parametrize("horizontal", [False, True])
def test_independent_consumers_of_torch_code_are_separate_regions(opts, monkeypatch, horizontal):
    """Two projections of a sorted tensor (sort stays torch code) are two regions, also with a
    partitioner that joins independent consumers (torch before ``skip_horizontal_fusion``)."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    class Joining(CapabilityBasedPartitioner):
        def __init__(self, gm, support, allows_single_node_partition=False):
            super().__init__(
                gm, support, allows_single_node_partition, skip_horizontal_fusion=False
            )

    if horizontal:
        monkeypatch.setattr(_dynamo, "CapabilityBasedPartitioner", Joining)
    w1, w2 = small(32, 16, seed=40), small(32, 8, seed=41)

    def f(x):
        y = torch.sort(x, dim=-1).values
        return y @ w1, torch.relu(y) @ w2

    x = small(4, 32, seed=42)
    with torch.no_grad():
        o = dict(opts, search=False, split=False)
        assert_matches(torch.compile(f, backend="mirage", options=o)(x), f(x))
    ops = sorted(r["ops"] for r in mi.dynamo_summary()["regions"])
    assert ops == [["matmul"], ["relu", "matmul"]], ops


@pytest.mark.parametrize("mirage_us,torch_us,path", [(5.0, 9.0, "mirage"), (9.0, 5.0, "torch")])
def test_each_region_keeps_the_faster_of_its_graph_and_its_torch_code(
    opts, monkeypatch, mirage_us, torch_us, path
):
    """The choice made on CUDA at a shape's first call, here made on the CPU with the two
    sides' times given: the faster runs from then on, and gives the eager results."""
    from mirage._dynamo import region as _reg

    times = iter([mirage_us, torch_us])

    def timed(fn, cuda):
        fn()
        return next(times)

    monkeypatch.setattr(_reg, "PROFILED_DEVICES", {"cpu"})
    monkeypatch.setattr(_reg, "_time_us", timed)
    m = NormLinear().eval()
    x = small(8, 64, seed=50)
    with torch.no_grad():
        ref = m(x)
        f = torch.compile(m, backend="mirage", options=dict(opts, search=False))
        assert_matches(f(x), ref)
        assert_matches(f(x), ref)
    (r,) = mi.dynamo_summary()["regions"]
    (rec,) = r["searches"]
    assert rec["path"] == path and (rec["mirage_us"], rec["torch_us"]) == (mirage_us, torch_us)
    st = mi.dynamo_stats()
    assert st[f"regions_{path}_path"] == 1 and st["region_calls"] == 2, st
    # choose="mirage" times nothing and runs the graph.
    torch._dynamo.reset()
    _dynamo.clear_caches()
    f = torch.compile(m, backend="mirage", options=dict(opts, search=False, choose="mirage"))
    with torch.no_grad():
        assert_matches(f(x), ref)
    (r,) = mi.dynamo_summary()["regions"]
    assert "path" not in r["searches"][0], r


def test_with_inductor_the_torch_side_is_the_region_compiled_for_its_shapes(opts, monkeypatch):
    """With the Inductor fallback the region's torch code is compiled for the key's shapes (the
    code the graph competes with); inputs of other strides run it eagerly."""
    from mirage._dynamo import region as _reg

    monkeypatch.setattr(_reg, "PROFILED_DEVICES", {"cpu"})
    monkeypatch.setattr(_reg, "_time_us", lambda fn, cuda: (fn(), 9.0)[1])
    w = small(64, 32, seed=52)

    def f(x):
        return torch.relu(x) @ w

    x = small(8, 64, seed=53)
    with torch.no_grad():
        g = torch.compile(
            f, backend="mirage", options=dict(opts, search=False, fallback="inductor")
        )
        assert_matches(g(x), f(x))
    (r,) = mi.dynamo_summary()["regions"]
    (rec,) = r["searches"]
    assert rec["torch_compiled"], rec
    (region,) = [rg for k, rg in _reg._REGIONS.items() if k >= _reg._SINCE]
    (entry,) = region.entries.values()
    assert entry.torch_fn is not None and entry.torch_strides[0] == (64, 1)
    # Called directly (dynamo would recompile for new strides): the same shape, column-major,
    # runs the torch code eagerly; the compiled form would read it as row-major.
    entry.torch_path = True
    xt = small(64, 8, seed=54).t()
    with torch.no_grad():
        assert_matches(region._run_torch([xt, w], entry)[0], f(xt))
        assert_matches(region._run_torch([x, w], entry)[0], f(x))


def test_a_region_whose_graph_fails_runs_its_torch_code(opts, monkeypatch, caplog):
    from mirage._dynamo import region as _reg

    def broken(self, entry, inputs, rows):
        raise RuntimeError("no kernel image")

    monkeypatch.setattr(_reg, "PROFILED_DEVICES", {"cpu"})
    monkeypatch.setattr(_reg.Region, "_run_mirage", broken)
    m = NormLinear().eval()
    x = small(8, 64, seed=51)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="mirage.dynamo"):
        f = torch.compile(m, backend="mirage", options=dict(opts, search=False))
        assert_matches(f(x), m(x))
    (r,) = mi.dynamo_summary()["regions"]
    (rec,) = r["searches"]
    assert rec["path"] == "torch" and "no kernel image" in rec["path_error"], rec
    assert any("failed" in m.getMessage() for m in caplog.records)


def test_outputs_agree_within_their_dtype_tolerance():
    from mirage._dynamo.region import _close

    ref = torch.tensor([1.0, -2.0, 4.0])
    assert _close(ref + 1e-3, ref) and not _close(ref + 1e-2, ref)
    h = ref.half()
    assert _close(h + 0.03, h) and not _close(h + 0.06, h)
    nan = torch.tensor([1.0, float("nan")])
    assert _close(nan, nan) and not _close(torch.tensor([1.0, 2.0]), nan)
    assert not _close(ref[:2], ref)


def test_elementwise_regions_are_left_to_the_fallback(opts, caplog):
    def f(x):
        return F.silu(x) * x + 1.0

    x = small(4, 32, seed=32)
    with caplog.at_level(logging.INFO, logger="mirage.dynamo"):
        assert_matches(torch.compile(f, backend="mirage", options=opts)(x), f(x))
    summ = mi.dynamo_summary()
    assert summ["counters"]["regions_lowered"] == 0
    assert ["element-wise" in r["reason"] for r in summ["fallbacks"]] == [True]
    torch._dynamo.reset()
    with torch.no_grad():
        o = dict(opts, elementwise=True, search=False)
        assert_matches(torch.compile(f, backend="mirage", options=o)(x), f(x))
    assert mi.dynamo_stats()["regions_lowered"] == 1


def test_trailing_slice_stays_torch_code(opts):
    """``lm_head(h)[:, -1, :]``: the partitioner puts the slice in the projection's region;
    it is taken out (torch code after the region), so the projection still lowers."""
    proj = nn.Linear(32, 48, bias=False)

    def f(x):
        return proj(x)[:, -1, :]

    x = small(2, 3, 32, seed=35)
    with torch.no_grad():
        assert_matches(torch.compile(f, backend="mirage", options=opts)(x), f(x))
    summ = mi.dynamo_summary()
    assert summ["counters"]["regions_lowered"] == 1, summ
    assert [r["ops"] for r in summ["regions"]] == [["matmul"]]


def test_search_stops_at_the_region_budget(opts):
    """Unsplit, two layers are one region of 12 ops and 2 outputs: its search would run for
    minutes; with ``time_budget=1`` it stops near 1 s and the region still matches eager."""
    torch.manual_seed(0)
    m = nn.Sequential(MLPLayer(), MLPLayer()).eval()
    x = small(4, 32, seed=33, scale=0.5)
    o = dict(opts, split=False, time_budget=1.0, search_kwargs={})
    with torch.no_grad():
        assert_matches(torch.compile(m, backend="mirage", options=o)(x), m(x))
    (record,) = [s for r in mi.dynamo_summary()["regions"] for s in r["searches"]]
    assert record["time_budget"] == 1.0, record
    # Stopped by the budget: with nothing found (the lowered graph runs as it is) or with the
    # best found so far.
    stopped = record["stopped"] == "time_budget" or "time budget ran out" in (record["error"] or "")
    assert stopped, record
    assert record["seconds"] < 20, record


def test_total_budget_skips_later_searches(opts):
    """Once the searches of the process have spent ``total_time_budget``, further regions run
    their lowered graphs unsearched (and still match eager)."""
    torch.manual_seed(0)
    m = nn.Sequential(MLPLayer(), nn.Linear(32, 16, bias=False), MLPLayer(16, 48)).eval()
    x = small(4, 32, seed=34, scale=0.5)
    with torch.no_grad():
        o = dict(opts, total_time_budget=1e-3, config={"max_kernel_ops": 1})
        assert_matches(torch.compile(m, backend="mirage", options=o)(x), m(x))
    st = mi.dynamo_stats()
    assert st["searches"] + st["search_failures"] == 1, st
    assert st["searches_skipped"] >= 2, st
    records = [s for r in mi.dynamo_summary()["regions"] for s in r["searches"]]
    searched = [s for s in records if s["source"] not in ("budget spent", "in-process cache")]
    # The first search got what was left of the total, with the config option's settings.
    assert len(searched) == 1 and searched[0]["time_budget"] <= 1e-3, records
    assert searched[0]["config"] == {"max_kernel_ops": 1}, records


@pytest.mark.parametrize(
    "ops, kind",
    [
        (["silu", "mul"], "elementwise"),
        (["matmul"], "matmul"),
        (["matmul", "add"], "matmul"),
        (["rms_norm", "mul"], "norm"),
        (["rms_norm", "mul", "matmul", "silu", "matmul", "mul"], "norm_matmul"),
        (["matmul", "mul", "softmax", "matmul"], "attention"),
        (["softmax"], "other"),
    ],
)
def test_region_kinds(ops, kind):
    assert _dynamo.plan.region_kind(ops) == kind


@pytest.mark.gpu
def test_llama_block_fp16_on_the_gpu(tmp_path):
    """A small LLaMA-like block (RMSNorm + QKV projection, attention, RMSNorm + SwiGLU MLP)
    at float16 on CUDA: the searched regions run as generated kernels and match eager."""

    torch.manual_seed(0)
    m = Block().half().cuda().eval()
    for p in m.parameters():
        p.data *= 0.5
    x = torch.randn(2, 16, 256, device="cuda", dtype=torch.float16)
    opts = {"cache_dir": str(tmp_path), "time_budget": 60.0, "total_time_budget": None}
    with torch.no_grad():
        ref = m(x)
        out = torch.compile(m, backend="mirage", options=opts)(x)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    summ = mi.dynamo_summary()
    assert summ["counters"]["regions_lowered"] >= 2
    # Every lowered region was searched (profiled on the GPU) under the per-region budget.
    records = [s for r in summ["regions"] for s in r["searches"]]
    assert records and all(s["time_budget"] == 60.0 for s in records), records
    assert summ["counters"]["searches_skipped"] == 0


@pytest.mark.gpu
def test_tiny_llama_decode_on_the_gpu(tmp_path, monkeypatch):
    """The decode example's tiny LLaMA at float16 on CUDA: the same tokens as eager, each
    distinct region graph searched (and profiled) once, nothing searched in the loop."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "examples"))
    import llama_decode

    argv = ["--tiny", "--device", "cuda", "--batch", "2", "--dtype", "fp16", "--steps", "4"]
    argv += ["--modes", "eager", "mirage", "--loop-steps", "4", "--no-timing"]
    assert llama_decode.main(argv) == 0
    summ = mi.dynamo_summary()
    records = [s for r in summ["regions"] for s in r["searches"]]
    searched = [s["graph"] for s in records if s["source"] in ("search", "as_given", "failed")]
    assert searched and len(searched) == len(set(searched)), records
    assert summ["counters"]["searches_skipped"] == 0, summ["counters"]


class NormSwiGLU(nn.Module):
    """LLaMA's post-attention RMSNorm (the Hugging Face form) and SwiGLU gate/up projections."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.norm = LlamaRMSNorm(k, 1e-5)
        self.mlp = SwiGLU(k, n)

    def forward(self, x):
        return self.mlp(self.norm(x))


@pytest.mark.gpu
@pytest.mark.parametrize("search", [True, False], ids=["searched", "as-lowered"])
@pytest.mark.parametrize("batch", [1, 8])
def test_llama_sized_norm_swiglu_matches_eager_on_every_call(tmp_path, batch, search):
    """LLaMA-3-8B's RMSNorm + gate/up projections at decode batch sizes, fp16 on CUDA, forced
    onto the mirage path: searched, or as lowered (the predefined ops, matmuls on cuBLAS).
    Each of several calls on fresh inputs matches eager, and no search fails."""
    torch.manual_seed(0)
    m = NormSwiGLU(4096, 14336).half().cuda().eval()
    for p in m.mlp.parameters():
        p.data *= 0.05
    opts = {
        "cache_dir": str(tmp_path),
        "choose": "mirage",
        "search": search,
        "time_budget": 60.0,
        "total_time_budget": None,
    }
    f = torch.compile(m, backend="mirage", options=opts)
    m32 = NormSwiGLU(4096, 14336).cuda().eval()
    m32.load_state_dict({k: v.float() for k, v in m.state_dict().items()})
    with torch.no_grad():
        for i in range(4):
            x = torch.randn(batch, 1, 4096, device="cuda", dtype=torch.float16)
            ref = m32(x.float())
            out = f(x)
            torch.cuda.synchronize()
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            assert err < 1e-2, (i, err)
    records = [s for r in mi.dynamo_summary()["regions"] for s in r["searches"]]
    assert records and not [s for s in records if s.get("source") == "failed"], records
    assert all(s.get("path") == "mirage" or "path" not in s for s in records), records


def test_decode_logits_comparison_names_the_first_flip_and_its_gap(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "examples"))
    import llama_decode

    ref = torch.tensor([[[4.0, 1.0, 0.0]], [[2.0, 1.99, 0.0]]])  # (steps 2, batch 1, vocab 3)
    same = llama_decode.compare_logits(ref.clone(), ref, 1e-2)
    assert same["logits_ok"] and same["next_token_agree"] == "2/2"
    assert "first_disagreement" not in same
    flipped = ref.clone()
    flipped[1, 0, 1] = 2.005  # step 1: within 1e-2 of the step's largest logit, argmax flips
    out = llama_decode.compare_logits(flipped, ref, 1e-2)
    assert out["logits_ok"] and out["next_token_agree"] == "1/2"
    assert out["disagreements_beyond_tolerance"] == 0
    gap = out["first_disagreement"]
    assert (gap["step"], gap["sequence"]) == (1, 0)
    assert abs(gap["eager_top2_gap"] - 0.01 / 2.0) < 1e-6
    wrong = ref.clone()
    wrong[0, 0, 2] = 5.0  # step 0: a large error
    bad = llama_decode.compare_logits(wrong, ref, 1e-2)
    assert not bad["logits_ok"] and bad["logits_rel_err"] == 5.0 / 4.0
    assert bad["disagreements_beyond_tolerance"] == 1  # eager's gap there: 3/4
    assert bad["first_disagreement"]["step"] == 0


def test_norm_and_gated_mlp_at_width_get_the_norm_kernel_and_one_fused_kernel(tmp_path):
    """RMSNorm + SwiGLU gate/up 2048 -> 4096: the norm-projection preset finds no one-kernel
    form at this width, but the norm's weight is the rms_norm op's own, so its plan of the
    weighted norm as a kernel of its own and gate/up + SwiGLU as one customized kernel stays
    within the preset's two kernel ops (with eps 1e-5: the norm kernel keeps the model's)."""
    torch.manual_seed(0)
    m = NormSwiGLU(2048, 4096).eval()
    for p in m.mlp.parameters():
        p.data *= 0.1
    m16 = NormSwiGLU(2048, 4096).half().eval()
    m16.load_state_dict({k: v.half() for k, v in m.state_dict().items()})
    x = torch.randn(2, 1, 2048, dtype=torch.float16)
    opts = {"cache_dir": str(tmp_path), "time_budget": 120.0, "total_time_budget": None}
    with torch.no_grad():
        out = torch.compile(m16, backend="mirage", options=opts)(x)
        ref = m(x.float())
    assert ((out.float() - ref).abs().max() / ref.abs().max()).item() < 1e-2
    (rec,) = [s for r in mi.dynamo_summary()["regions"] for s in r["searches"]]
    assert rec["source"] == "search" and rec["config"] == "mlp", rec
    assert rec.get("preset_error") is None, rec
    assert rec["time_budget"] == 120.0


def test_a_region_its_kinds_preset_cannot_fuse_is_searched_with_the_defaults(tmp_path, monkeypatch):
    """A norm + gated MLP whose kind's settings admit no µGraph (block graphs of at most six
    ops) is searched again with the search's defaults instead of running as lowered."""
    from mirage._dynamo import plan

    cfg = {"preset": "mlp", "max_kernel_ops": 1, "max_block_ops": 6}
    narrow = {"config": cfg}
    monkeypatch.setitem(plan.KIND_SETTINGS, "norm_matmul", narrow)
    torch.manual_seed(0)
    m = NormSwiGLU(64, 128).eval()
    x = torch.randn(2, 1, 64)
    opts = {"cache_dir": str(tmp_path), "time_budget": 60.0, "total_time_budget": None}
    with torch.no_grad():
        out = torch.compile(m, backend="mirage", options=opts)(x)
        ref = m(x)
    assert ((out - ref).abs().max() / ref.abs().max()).item() < 1e-4
    (rec,) = [s for r in mi.dynamo_summary()["regions"] for s in r["searches"]]
    assert rec["source"] == "search" and rec["config"] is None, rec
    assert "preset" in rec["preset_error"] and "no µGraph" in rec["preset_error"], rec
    assert rec["time_budget"] == 60.0
