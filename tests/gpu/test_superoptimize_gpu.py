"""``KNGraph.superoptimize`` with ``backend="cuda"`` on a GPU: candidates compiled and timed,
the fastest returned, its CUDA output matching torch. Marked ``gpu`` (skipped elsewhere)."""

from __future__ import annotations

import mirage as mi
import pytest
import torch
from mirage import search

pytestmark = pytest.mark.gpu


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    return float((o - r).norm() / r.norm())


def _rmsnorm_linear(m: int, k: int, n: int) -> mi.KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(m, k), dtype=mi.float16)
    W = g.new_input(dims=(k, n), dtype=mi.float16)
    g.mark_output(g.matmul(g.rms_norm(X, normalized_shape=(k,)), W))
    return g


def test_rmsnorm_linear_profiled_on_the_gpu(tmp_path, capsys):
    g = _rmsnorm_linear(8, 512, 512)
    best = g.superoptimize(
        cache_dir=tmp_path / "cache",
        warmup_iters=4,
        profile_iters=50,
        verbose=True,
        save_codes=str(tmp_path / "codes"),
    )
    err = capsys.readouterr().err
    st = best.search_stats
    sel = st["selection"]
    assert sel["method"] == "profiled", (sel, err)
    # The winner: a candidate, or the program as given (timed beside them) where it ran
    # fastest.
    winner = sel["winner"]
    assert winner in sel["timings_us"] and search.AS_GIVEN in sel["timings_us"]
    if winner == search.AS_GIVEN:
        assert st["source"] == "as_given" and best.hash() == g.hash()
    else:
        assert best.candidates_considered >= 1 and st["winner"]["hash"] == winner
    assert all(t > 0 for t in sel["timings_us"].values())
    # The candidates timed close to the fastest were timed again, and the winner is one of
    # them (the fastest median).
    finals = sel["finalists"]
    assert len(finals) != 1 and set(finals) <= set(sel["timings_us"]), sel
    if finals:
        assert winner in finals
        assert sel["timings_us"][winner] == min(sel["timings_us"][h] for h in finals)
        assert "finalists (median of" in err
    # Where the profiling's wall time went (compiling, input sets, timing).
    assert set(sel["phase_seconds"]) == {"compile", "inputs", "timing"}, sel
    assert all(s >= 0 for s in sel["phase_seconds"].values())
    assert "us (" in err  # per-candidate timings printed in verbose mode
    assert list((tmp_path / "codes").glob("*.cu"))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 512, generator=gen).half()
    w = (torch.randn(512, 512, generator=gen) / 16).half()
    xd = x.double()
    ref = (xd / xd.square().mean(-1, keepdim=True).sqrt()) @ w.double()
    (out,) = best(inputs=[x.cuda(), w.cuda()])
    torch.cuda.synchronize()
    assert out.is_cuda and out.dtype == torch.float16
    assert _rel(out, ref) < 1e-2
    (cpu,) = best(inputs=[x, w])  # the same graph still runs on the interpreter
    assert _rel(cpu, ref) < 1e-2
    # Second call: the search and the profiling come from the cache.
    again = g.superoptimize(cache_dir=tmp_path / "cache", warmup_iters=4, profile_iters=50)
    assert again.search_stats["source"] == ("as_given" if winner == search.AS_GIVEN else "cache")
    assert again.search_stats["selection"]["method"] == "profiled (cached)"
    assert again.hash() == best.hash()


def test_cpu_backend_on_a_gpu_machine_uses_the_cost_model(tmp_path):
    g = _rmsnorm_linear(8, 256, 256)
    best = g.superoptimize(backend="cpu", cache_dir=tmp_path)
    assert best.search_stats["selection"]["method"] == "cost_model"
    x = torch.randn(8, 256, device="cuda").half()
    w = (torch.randn(256, 256, device="cuda") / 16).half()
    (out,) = best(inputs=[x, w])
    xd = x.double()
    ref = (xd / xd.square().mean(-1, keepdim=True).sqrt()) @ w.double()
    assert _rel(out, ref) < 1e-2


def test_profiling_stops_a_candidate_far_behind_the_fastest():
    from mirage import _cuda
    from mirage._autotune import _input_sets, _time_one

    g = _rmsnorm_linear(8, 512, 512)
    exe = _cuda.executable(g, 0)
    sets = _input_sets(g, 0)
    us, how = _time_one(exe, sets, 2, 200)
    assert how == "cuda graph" and us > 0
    # Slower than the bound at the first replay: that replay's time, no further launches.
    fast, how = _time_one(exe, sets, 2, 200, bound=us / 100)
    assert how == "stopped early" and fast > us / 100
    # Within the bound: timed in full.
    _, how = _time_one(exe, sets, 2, 200, bound=us * 100)
    assert how == "cuda graph"


def test_profiling_skips_a_candidate_whose_outputs_are_not_finite():
    from mirage import _cuda
    from mirage._autotune import _NonFinite, _time_one

    g = _rmsnorm_linear(8, 512, 512)
    exe = _cuda.executable(g, 0)
    x = torch.randn(8, 512, device="cuda").half()
    w = (torch.randn(512, 512, device="cuda") / 16).half()
    _, how = _time_one(exe, [[x, w]], 2, 20)
    assert how == "cuda graph"
    # Weights of 60000: every product overflows fp16 (the graph is fine; these inputs are not).
    with pytest.raises(_NonFinite, match="output 0"):
        _time_one(exe, [[x, torch.full_like(w, 60000.0)]], 2, 20)
