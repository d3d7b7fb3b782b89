"""``KNGraph.superoptimize`` on the CPU: fused µGraphs found and correct, caching, checkpoints,
argument checks, bad graphs, time budget and cancellation (Ctrl-C)."""

from __future__ import annotations

import json
import signal
import threading
import time
import warnings

import mirage as mi
import numpy as np
import pytest
import torch
from conftest import assert_error, rel_err
from mirage import _autotune, search
from mirage.kernel import KNGraph


def rmsnorm_linear(m: int = 8, k: int = 512, n: int = 512, dtype=mi.float16) -> KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(m, k), dtype=dtype)
    W = g.new_input(dims=(k, n), dtype=dtype)
    g.mark_output(g.matmul(g.rms_norm(X, normalized_shape=(k,)), W))
    return g


def gated_mlp(m: int = 8, k: int = 256, n: int = 256, dtype=mi.float16) -> KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(m, k), dtype=dtype)
    W1 = g.new_input(dims=(k, n), dtype=dtype)
    W2 = g.new_input(dims=(k, n), dtype=dtype)
    g.mark_output(g.mul(g.silu(g.matmul(X, W1)), g.matmul(X, W2)))
    return g


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


def test_rmsnorm_linear_one_kernel_matches_torch(cache):
    g = rmsnorm_linear()
    t0 = time.perf_counter()
    best = g.superoptimize(backend="cpu", cache_dir=cache)
    elapsed = time.perf_counter() - t0
    assert isinstance(best, KNGraph)
    assert best is not g
    st = best.search_stats
    assert isinstance(st, dict) and st["source"] == "search"
    assert st["winner"]["customized_kernels"] == 1
    assert st["winner"]["verification"] == "passed"
    assert st["winner"]["cost"]["launches"] == 1
    assert st["selection"]["method"] == "cost_model"
    assert best.candidates_considered >= 1
    assert best.num_ops == 3  # two inputs and one customized op
    assert elapsed < 10
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 512, generator=gen).half()
    w = (torch.randn(512, 512, generator=gen) / 16).half()
    (out,) = best(inputs=[x, w])
    assert out.dtype == torch.float16 and tuple(out.shape) == (8, 512)
    xd = x.double()
    ref = (xd / xd.square().mean(-1, keepdim=True).sqrt()) @ w.double()
    assert rel_err(out, ref) < 1e-2
    # A normal graph: serializes and reloads.
    again = mi.from_json(best.to_json())
    assert again.hash() == best.hash() == st["winner"]["hash"]


def test_gated_mlp_one_kernel(cache):
    g = gated_mlp()
    best = g.superoptimize(config="mlp", backend="cpu", cache_dir=cache)
    assert best.search_stats["winner"]["customized_kernels"] == 1
    assert best.search_stats["winner"]["cost"]["launches"] == 1
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 256)).astype(np.float16)
    w1 = (rng.standard_normal((256, 256)) / 16).astype(np.float16)
    w2 = (rng.standard_normal((256, 256)) / 16).astype(np.float16)
    (out,) = best(inputs=[x, w1, w2])
    a = x.astype(np.float64) @ w1.astype(np.float64)
    ref = a / (1 + np.exp(-a)) * (x.astype(np.float64) @ w2.astype(np.float64))
    assert rel_err(out, ref) < 1e-2


def test_cache_hit_is_fast_and_identical(cache):
    g = rmsnorm_linear()
    t0 = time.perf_counter()
    first = g.superoptimize(backend="cpu", cache_dir=cache)
    t1 = time.perf_counter()
    second = g.superoptimize(backend="cpu", cache_dir=cache)
    t2 = time.perf_counter()
    assert first.search_stats["source"] == "search"
    assert second.search_stats["source"] == "cache"
    assert second.to_json() == first.to_json()
    # A cache hit still confirms its winner on every output element: that part is not cached.
    hit = t2 - t1 - second.search_stats["confirm_seconds"]
    assert hit < 0.1 * (t1 - t0), (
        f"cache hit {hit:.3f}s (besides confirming) vs search {t1 - t0:.3f}s"
    )
    files = list(cache.glob("*.json"))
    assert len(files) == 1
    # Other settings are another entry; use_cached_graphs=False searches again.
    third = g.superoptimize(backend="cpu", cache_dir=cache, franges=[4, 16])
    assert third.search_stats["source"] == "search"
    assert len(list(cache.glob("*.json"))) == 2
    fourth = g.superoptimize(backend="cpu", cache_dir=cache, use_cached_graphs=False)
    assert fourth.search_stats["source"] == "search"


def test_default_cache_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path))
    assert search.default_cache_dir() == str(tmp_path / "search")
    best = rmsnorm_linear(8, 256, 256).superoptimize(backend="cpu")
    assert best.search_stats["cache_file"].startswith(str(tmp_path / "search"))


def test_previous_checkpoint_round_trip(tmp_path):
    ckpt = tmp_path / "ckpt.json"
    g = rmsnorm_linear(8, 256, 256)
    first = g.superoptimize(backend="cpu", previous_checkpoint=str(ckpt))
    assert ckpt.exists() and first.search_stats["source"] == "search"
    data = json.loads(ckpt.read_text())
    assert data["graph_hash"] == g.hash() and data["candidates"]
    second = g.superoptimize(backend="cpu", previous_checkpoint=ckpt)
    assert second.search_stats["source"] == "checkpoint"
    assert second.to_json() == first.to_json()
    # A checkpoint of another graph is refused.
    other = gated_mlp()
    with pytest.raises(ValueError) as e:
        other.superoptimize(backend="cpu", previous_checkpoint=ckpt)
    assert_error(e, "previous_checkpoint", "another graph")
    # A damaged one is searched again and rewritten (tests/test_search_cache.py has more).
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.warns(RuntimeWarning, match="bad.json"):
        third = g.superoptimize(backend="cpu", previous_checkpoint=bad)
    assert third.search_stats["source"] == "search"
    assert json.loads(bad.read_text())["graph_hash"] == g.hash()


def test_unsatisfiable_griddims_is_a_clear_error(cache):
    g = rmsnorm_linear()
    t0 = time.perf_counter()
    with pytest.raises((ValueError, mi.SearchError)) as e:
        g.superoptimize(backend="cpu", cache_dir=cache, griddims=[(7, 1, 1)])
    assert_error(e, "griddims")
    assert time.perf_counter() - t0 < 5


def test_graphs_without_ops_or_outputs():
    with pytest.raises(ValueError) as e:
        mi.new_kernel_graph().superoptimize(backend="cpu")
    assert_error(e, "empty")
    g = mi.new_kernel_graph()
    g.new_input(dims=(8, 64), dtype=mi.float16)
    with pytest.raises(ValueError) as e:
        g.superoptimize(backend="cpu")
    assert_error(e, "only inputs")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"griddims": (64, 1, 1)}, "griddims"),
        ({"griddims": "64"}, "griddims"),
        ({"imaps": [(0, "x", -1)]}, "imaps"),
        ({"fmaps": [1.5]}, "fmaps"),
        ({"franges": 16}, "franges"),
        ({"verbose": "yes"}, "verbose"),
        ({"config": 3}, "config"),
        ({"backend": None}, "backend"),
        ({"warmup_iters": 2.0}, "warmup_iters"),
        ({"time_budget": "1s"}, "time_budget"),
        ({"time_budget": True}, "time_budget"),
        ({"num_threads": 1.5}, "num_threads"),
        ({"previous_checkpoint": 3}, "previous_checkpoint"),
        ({"cache_dir": 3}, "cache_dir"),
        ({"use_cached_graphs": 1}, "use_cached_graphs"),
        ({"is_formal_verified": None}, "is_formal_verified"),
        ({"config": {"max_block_ops": "9"}}, "max_block_ops"),
    ],
)
def test_bad_argument_types(kwargs, name):
    with pytest.raises(TypeError) as e:
        rmsnorm_linear(8, 64, 64).superoptimize(**kwargs)
    assert_error(e, name)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"config": "transformer"}, "config"),
        ({"config": {"max_ops": 3}}, "max_ops"),
        ({"backend": "triton"}, "backend"),
        ({"franges": [0]}, "franges"),
        ({"franges": []}, "franges"),
        ({"griddims": [(0, 1, 1)]}, "griddims"),
        ({"imaps": [(0, -2, -1)]}, "imaps"),
        ({"profile_iters": 0}, "profile_iters"),
        ({"time_budget": -1.0}, "time_budget"),
        ({"num_threads": 0}, "num_threads"),
        ({"blockdims": [(2048, 1, 1)]}, "blockdims"),
    ],
)
def test_bad_argument_values(kwargs, name, cache):
    with pytest.raises(ValueError) as e:
        rmsnorm_linear(8, 64, 64).superoptimize(**{"backend": "cpu", "cache_dir": cache, **kwargs})
    assert_error(e, name)


def test_ignored_reference_arguments_are_accepted(cache):
    best = rmsnorm_linear(8, 256, 256).superoptimize(
        backend="cpu",
        cache_dir=cache,
        use_graph_dataset=False,
        is_formal_verified=True,
        warmup_iters=0,
        profile_iters=5,
        num_threads=1,
    )
    assert best.search_stats["winner"]["customized_kernels"] == 1


def test_restrictions_are_honoured(cache):
    best = rmsnorm_linear().superoptimize(
        backend="cpu", cache_dir=cache, griddims=[(16, 1, 1)], franges=[16]
    )
    ops = json.loads(best.to_json())["graph"]["ops"]
    kernels = [o["kind"]["graph"] for o in ops if o["kind"]["kind"] == "customized"]
    assert kernels, best.to_json()
    for k in kernels:
        assert k["grid_dim"] == [16, 1, 1] and k["forloop_range"] == 16


def test_preset_loop_ranges_yield_to_the_users(cache):
    g = rmsnorm_linear()

    def searched_franges() -> list[int]:
        (path,) = cache.glob("*.json")
        franges = json.loads(path.read_text())["settings"]["franges"]
        path.unlink()
        return franges

    for preset in ("attention", "mlp"):
        g.superoptimize(backend="cpu", cache_dir=cache, config=preset)
        assert searched_franges() == [1, 4, 16, 32, 64], preset
    best = g.superoptimize(backend="cpu", cache_dir=cache, config="attention", franges=[16])
    assert searched_franges() == [16]
    ops = json.loads(best.to_json())["graph"]["ops"]
    loops = {o["kind"]["graph"]["forloop_range"] for o in ops if o["kind"]["kind"] == "customized"}
    assert loops == {16}, best.to_json()


def test_time_budget_is_respected(cache):
    # Without abstract-expression pruning the search would run for minutes.
    g = rmsnorm_linear()
    t0 = time.perf_counter()
    try:
        best = g.superoptimize(
            backend="cpu",
            cache_dir=cache,
            time_budget=0.5,
            config={"expression_pruning": False},
        )
    except mi.SearchError as e:
        assert "time budget" in str(e)
    else:
        assert best.search_stats["stopped"] == "time_budget"
    assert time.perf_counter() - t0 < 3.0
    assert not list(cache.glob("*.json")), "a stopped search must not be cached"


def test_progress_hook_exception_cancels_the_search():
    """The cancel-flag path: an exception from the progress hook (as KeyboardInterrupt from
    Ctrl-C would be) sets the cancel flag, the search returns promptly, the error propagates."""
    g = rmsnorm_linear()
    calls = []

    def hook(progress):
        calls.append(progress)
        if len(calls) == 2:
            raise KeyboardInterrupt

    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        search.search_candidates(
            g, {"expression_pruning": False}, time_budget=30.0, on_progress=hook
        )
    assert time.perf_counter() - t0 < 3.0
    assert len(calls) == 2 and {"states", "elapsed", "pruned_by_expression"} <= set(calls[0])

    class Stop(Exception):
        pass

    def stop(progress):
        raise Stop("from the hook")

    with pytest.raises(Stop):
        search.search_candidates(
            g, {"expression_pruning": False}, time_budget=30.0, on_progress=stop
        )


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals")
def test_ctrl_c_cancels_the_search(cache):
    g = rmsnorm_linear()
    timer = threading.Timer(0.4, signal.raise_signal, args=(signal.SIGINT,))
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.perf_counter()
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            g.superoptimize(
                backend="cpu",
                cache_dir=cache,
                time_budget=30.0,
                config={"expression_pruning": False},
            )
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, old)
    assert time.perf_counter() - t0 < 3.0


def test_verbose_progress(capsys, cache):
    g = rmsnorm_linear()
    best = g.superoptimize(backend="cpu", cache_dir=cache, verbose=True)
    err = capsys.readouterr().err
    assert "superoptimize done" in err and "states" in err and "verified" in err
    assert "chose candidate" in err
    best2 = g.superoptimize(backend="cpu", cache_dir=cache, verbose=True)
    assert "loaded" in capsys.readouterr().err
    assert best2.to_json() == best.to_json()


def test_save_codes_writes_cuda_source(tmp_path, cache):
    out = tmp_path / "codes"
    best = rmsnorm_linear(8, 256, 256).superoptimize(
        backend="cpu", cache_dir=cache, save_codes=str(out)
    )
    files = list(out.glob("*.cu"))
    assert len(files) == 1 and best.hash()[:16] in files[0].name
    assert "__global__" in files[0].read_text()


def _gpu_candidate_forms(m: int, k: int, n: int) -> list[list[tuple[tuple[int, ...], int]]]:
    """The (grid, loop range) of each customized kernel of the candidates, in order, that a GPU
    would time for RMSNorm+Linear m x k @ k x n (the settings superoptimize uses with an H100
    or H200: 3/4 of their 227 KiB, spread order)."""
    settings = {
        **search._resolve_config("mlp"),
        "verify_top_n": search._GPU_TOP_N,
        "verify_spread": True,
        "verify_co_resident": True,
        "shared_memory_limit": 232448 * 3 // 4,
    }
    found = search.search_candidates(rmsnorm_linear(m, k, n), settings, num_threads=2)
    return [
        [
            (tuple(op["kind"]["graph"]["grid_dim"]), op["kind"]["graph"]["forloop_range"])
            for op in json.loads(c["graph"])["graph"]["ops"]
            if op["kind"]["kind"] == "customized"
        ]
        for c in found["candidates"]
    ]


def test_gpu_candidates_pair_one_wave_streaming_forms_with_co_resident_twins():
    # With the settings a GPU uses, each of the first verified candidates whose loop streams
    # over one wave of blocks is followed by its twin: the same graph with the stages capped
    # (smem_cap) so that two blocks share an SM, generating fewer stages within 113 KiB.
    settings = {
        **search._resolve_config("mlp"),
        "verify_top_n": 24,
        "verify_spread": True,
        "verify_co_resident": True,
        "shared_memory_limit": 232448 * 3 // 4,
    }
    found = search.search_candidates(rmsnorm_linear(2, 4096, 4096), settings, num_threads=2)
    graphs = [json.loads(c["graph"]) for c in found["candidates"]]

    def caps(g: dict) -> list[int | None]:
        return [
            op["kind"]["graph"].get("smem_cap")
            for op in g["graph"]["ops"]
            if op["kind"]["kind"] == "customized"
        ]

    def header(g: dict) -> tuple[int, int]:
        src = mi.from_json(json.dumps(g)).cuda_source(arch=90)
        line = src[src.index("// block graph:") :].splitlines()[0]
        smem = int(line.split(" bytes of shared memory")[0].rsplit(", ", 1)[1])
        return smem, int(line.split(" pipeline stage")[0].rsplit(", ", 1)[1])

    twins = [i for i, g in enumerate(graphs) if any(caps(g))]
    assert 0 < len(twins) <= 16, len(twins)
    for i in twins:
        twin, first = graphs[i], graphs[i - 1]
        assert found["candidates"][i]["verification"] == "passed"
        assert not any(caps(first)), i
        for op in twin["graph"]["ops"]:
            op["kind"].get("graph", {}).pop("smem_cap", None)
        assert twin == first, i
        graphs[i] = json.loads(found["candidates"][i]["graph"])
        (smem, stages), (smem0, stages0) = header(graphs[i]), header(first)
        assert stages < stages0 and 2 <= stages, (i, stages, stages0)
        assert smem <= 113 * 1024 < smem0, (i, smem, smem0)
    # Without the setting, none.
    found = search.search_candidates(
        rmsnorm_linear(2, 4096, 4096), {**settings, "verify_co_resident": False}, num_threads=2
    )
    assert not any(any(caps(json.loads(c["graph"]))) for c in found["candidates"])


def test_gpu_candidates_pair_small_row_matmuls_with_warpgroup_twins():
    # With the settings a GPU uses, a verified candidate whose loop matmul has 32 rows of 64
    # columns is followed by its warpgroup twin (warpgroup_acc): the same graph but for the
    # flag, whose sm_90 source sums the matmul with `mi::MmaAccWG` where the original's uses
    # `mi::MmaAcc`; 2 rows get none.
    settings = {
        **search._resolve_config("mlp"),
        "verify_top_n": 12,
        "verify_spread": True,
        "verify_co_resident": True,
        "shared_memory_limit": 232448,
    }

    def flags(g: dict) -> list[bool]:
        return [
            op["kind"]["graph"].get("warpgroup_acc", False)
            for op in g["graph"]["ops"]
            if op["kind"]["kind"] == "customized"
        ]

    found = search.search_candidates(rmsnorm_linear(32, 4096, 4096), settings, num_threads=2)
    graphs = [json.loads(c["graph"]) for c in found["candidates"]]
    twins = [i for i, g in enumerate(graphs) if any(flags(g))]
    assert twins, [flags(g) for g in graphs]
    for i in twins:
        twin, first = graphs[i], graphs[i - 1]
        assert found["candidates"][i]["verification"] == "passed"
        assert not any(flags(first)), i
        src0 = mi.from_json(json.dumps(first)).cuda_source(arch=90)
        src = mi.from_json(json.dumps(twin)).cuda_source(arch=90)
        if "mi::MmaAcc<NT, 1, 32, 64," in src0:
            assert "mi::MmaAccWG<NT, 1, 32, 64," in src and "mi::MmaAcc<" not in src, i
        for op in twin["graph"]["ops"]:
            op["kind"].get("graph", {}).pop("warpgroup_acc", None)
        assert twin == first, i
    assert any(
        "mi::MmaAccWG<" in mi.from_json(found["candidates"][i]["graph"]).cuda_source(arch=90)
        for i in twins
    )
    found = search.search_candidates(rmsnorm_linear(2, 4096, 4096), settings, num_threads=2)
    assert not any(any(flags(json.loads(c["graph"]))) for c in found["candidates"])


def test_gpu_profiling_reaches_long_streaming_loops():
    # RMSNorm+Linear 2x4096 @ 4096x6144 (the paper's b=1): on the H100 its fastest form runs
    # 128 blocks over 32 loop steps of 128-wide K tiles, which the cost model ranks behind the
    # 16-step forms (it charges each step as a chain). The candidates a GPU would time
    # include it.
    forms = {f for c in _gpu_candidate_forms(2, 4096, 6144) for f in c}
    assert ((128, 1, 1), 32) in forms, sorted(forms)


def test_profiling_times_the_close_candidates_again():
    # Within 5% of the fastest, fastest first, at most four; a lone fastest needs no rematch.
    t = {"a": 10.0, "b": 10.4, "c": 12.0, "d": 10.2, "e": 10.49, "f": 10.3}
    assert _autotune._finalists(t) == ["a", "d", "f", "b"]
    assert _autotune._finalists({"a": 10.0, "b": 11.0}) == []
    assert _autotune._finalists({"a": 10.0}) == []
    assert _autotune._finalists({}) == []


def test_a_wave_of_96_streaming_blocks_is_among_the_first_candidates():
    # RMSNorm+Linear 2x4096 @ 4096x6144: on the H200 96 blocks of 64 columns (no cluster)
    # ran 15.6-15.9 us against 17.1-17.5 for the best 128-block forms. The cost model no
    # longer charges its wave's 36 idle SMs to DRAM, so it is among the first candidates.
    first = [grid for c in _gpu_candidate_forms(2, 4096, 6144)[:8] for grid, f in c if f > 1]
    assert (96, 1, 1) in first, first


def test_a_slow_candidate_is_timed_for_a_bounded_time():
    # 50 replays asked (profile_iters 1000, 20 launches a replay): a 10 µs kernel's replays
    # (0.2 ms) all fit the 25 ms; a 600 µs kernel's (12 ms) get the minimum of three.
    assert _autotune._replays_within(50, 20 * 10e-6) == 50
    assert _autotune._replays_within(50, 20 * 100e-6) == 13
    assert _autotune._replays_within(50, 20 * 600e-6) == 3
    assert _autotune._replays_within(2, 20 * 600e-6) == 2
    assert _autotune._replays_within(50, 0.0) == 50


@pytest.mark.parametrize("as_given_us,source", [(1.0, "as_given"), (100.0, "search")])
def test_the_gpu_times_the_program_as_given_beside_the_candidates(
    monkeypatch, tmp_path, as_given_us, source
):
    # Profiling's wiring with compilation and timing replaced (no GPU here): the program as
    # given (its matmul on cuBLAS, its norm on the default kernel) is timed with the
    # candidates, and returned where it ran fastest, so that superoptimize never returns a
    # µGraph slower than the program it was given; otherwise the fastest candidate wins.
    import mirage._cuda as cuda_mod

    g = rmsnorm_linear(m=8, k=256, n=256)
    given = g.hash()
    monkeypatch.setattr(search, "_cuda_device", lambda backend: (0, ""))
    monkeypatch.setattr(search, "_device_smem_limit", lambda backend: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "stub GPU")
    monkeypatch.setattr(cuda_mod, "executable", lambda graph, device: graph.hash())
    monkeypatch.setattr(_autotune, "_input_sets", lambda graph, device: [])
    timings = {given: as_given_us}
    monkeypatch.setattr(_autotune, "_time_one", lambda exe, *a: (timings.get(exe, 10.0), "fake"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        best = g.superoptimize(backend="cuda", use_cached_graphs=False, cache_dir=tmp_path)
    stats = best.search_stats
    assert stats["source"] == source
    assert stats["selection"]["method"] == "profiled"
    assert stats["selection"]["timings_us"][search.AS_GIVEN] == as_given_us
    as_given_warned = any("the program as given" in str(w.message) for w in caught)
    if source == "as_given":
        assert best.hash() == given and stats["selection"]["winner"] == search.AS_GIVEN
        assert as_given_warned
        profiled = len(stats["selection"]["timings_us"])
        assert "measured 1.00 us" in stats["summary"], stats["summary"]
        assert f"fastest of {profiled} profiled" in stats["summary"], stats["summary"]
    else:
        assert best.hash() != given and stats["winner"]["hash"] == stats["selection"]["winner"]
        assert not as_given_warned
