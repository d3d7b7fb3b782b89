"""The progress display of ``superoptimize`` (plain line and tqdm), the search's counters read
while it runs, the one-line summary of the choice, and ``mirage.explain``."""

from __future__ import annotations

import io
import json
import re
import sys

import mirage as mi
import pytest
from conftest import nvrtc_or_skip
from mirage import _autotune, _cuda, _progress, search
from mirage.explain import explain, explain_data, summary
from mirage.kernel import KNGraph

COUNTERS = ("states", "block_graphs", "candidates", "checked", "verified", "verification_failed")
PHASES = ("saturate", "search", "verify", "done")


def rmsnorm_linear(m: int = 8, k: int = 512, n: int = 512) -> KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(m, k), dtype=mi.float16)
    W = g.new_input(dims=(k, n), dtype=mi.float16)
    g.mark_output(g.matmul(g.rms_norm(X, normalized_shape=(k,)), W))
    return g


def weighted_rmsnorm_linear(m: int = 8, k: int = 512, n: int = 512) -> KNGraph:
    """RMSNorm with its weight before a projection: a search of about a second on two cores,
    several progress intervals long."""
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(m, k), dtype=mi.float16)
    w = g.new_input(dims=(1, k), dtype=mi.float16)
    W = g.new_input(dims=(k, n), dtype=mi.float16)
    g.mark_output(g.matmul(g.mul(g.rms_norm(X, normalized_shape=(k,)), w), W))
    return g


def kernel_ops(graph: KNGraph) -> list[tuple[int, dict]]:
    """The graph's kernel ops but the inputs, from its own JSON: (op index, kind)."""
    ops = json.loads(graph.to_json())["graph"]["ops"]
    return [(i, op["kind"]) for i, op in enumerate(ops) if op["kind"]["kind"] != "input"]


@pytest.fixture
def no_tqdm(monkeypatch):
    """``import tqdm`` fails, as where it is not installed."""
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.delenv("MIRAGE_PROGRESS", raising=False)


@pytest.fixture(scope="module")
def winner(tmp_path_factory) -> KNGraph:
    cache = tmp_path_factory.mktemp("cache")
    return rmsnorm_linear().superoptimize(backend="cpu", cache_dir=cache, progress=False)


# ------------------------------------------------------------------ counters from Rust
def test_search_counters_grow_and_end_at_the_reported_totals():
    ticks: list[dict] = []
    raw = search.search_candidates(weighted_rmsnorm_linear(), {}, on_progress=ticks.append)
    assert len(ticks) >= 2
    for a, b in zip(ticks, ticks[1:]):
        for k in COUNTERS:
            assert a[k] <= b[k], (k, a, b)
        assert a["elapsed"] <= b["elapsed"]
        assert PHASES.index(a["phase"]) <= PHASES.index(b["phase"])
    last, stats = ticks[-1], raw["stats"]
    assert last["phase"] == "done"
    assert last["candidates"] == stats["candidates"]
    assert last["verified"] == stats["verified"]
    assert last["verification_failed"] == stats["verification_failed"]
    assert last["states"] == stats["states_visited"]
    assert last["block_graphs"] == stats["block_graphs"]
    assert last["checked"] >= last["verified"] + last["verification_failed"]
    assert last["verified"] >= 1 and last["verify_goal"] >= 1


# ------------------------------------------------------------------ the display
def test_plain_line_shows_each_stage_when_forced(no_tqdm, capsys, tmp_path):
    best = rmsnorm_linear().superoptimize(backend="cpu", cache_dir=tmp_path, progress=True)
    err = capsys.readouterr().err
    stats = best.search_stats
    lines = err.splitlines()
    for stage in ("search", "verify", "confirm"):
        assert any(line.startswith(f"[mirage] {stage}: ") for line in lines), (stage, err)
    # The verify line ends on the search's totals.
    (verify,) = [line for line in lines if line.startswith("[mirage] verify: ")]
    assert f"{stats['candidates']:,} candidates" in verify
    assert f"failed {stats['verification_failed']}" in verify
    assert lines[-1] == f"[mirage] superoptimize: {stats['summary']}"
    # From the cache: no search, and the summary says so.
    again = rmsnorm_linear().superoptimize(backend="cpu", cache_dir=tmp_path, progress=True)
    err = capsys.readouterr().err
    assert "[mirage] search: " not in err and "[mirage] confirm: " in err
    assert again.search_stats["summary"].endswith("from the cache")


def test_nothing_is_drawn_when_off(no_tqdm, capsys, tmp_path, monkeypatch):
    rmsnorm_linear().superoptimize(backend="cpu", cache_dir=tmp_path, progress=False)
    assert capsys.readouterr().err == ""
    # Auto (None): stderr is not a terminal under capture.
    rmsnorm_linear().superoptimize(backend="cpu", cache_dir=tmp_path)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("MIRAGE_PROGRESS", "0")
    rmsnorm_linear().superoptimize(backend="cpu", cache_dir=tmp_path, use_cached_graphs=False)
    assert capsys.readouterr().err == ""


def test_the_environment_switch_turns_it_on(no_tqdm, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MIRAGE_PROGRESS", "1")
    rmsnorm_linear().superoptimize(backend="cpu", cache_dir=tmp_path)
    err = capsys.readouterr().err
    assert "[mirage] search: " in err and "[mirage] superoptimize: chose candidate" in err
    # The argument wins over the switch.
    rmsnorm_linear().superoptimize(backend="cpu", cache_dir=tmp_path, progress=False)
    assert capsys.readouterr().err == ""


def test_on_a_terminal_the_line_is_redrawn_in_place(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(_progress, "_TTY_INTERVAL", 0.0)
    term = Terminal()
    rep = _progress._LineReporter(term)
    rep.stage("search")
    for n in (10, 2000):
        rep.search_tick({"phase": "search", "kernel_ops": 1, "states": n * 7, "block_graphs": n})
    rep.write("[mirage] a verbose line")
    rep.close()
    text = term.getvalue()
    assert text.count("\n") == 2 and text.endswith("\n")
    draws = [d for d in text.split("\r") if d.startswith("[mirage] search:")]
    assert len(draws) >= 3 and all(d.endswith(("\x1b[K", "\x1b[K\n")) for d in draws)
    # Every redraw keeps the stage's text.
    assert all("(kernel ops 1, states " in d for d in draws), draws
    assert "2,000 block graphs (kernel ops 1, states 14,000)" in draws[-1]
    assert "\r\x1b[K[mirage] a verbose line\n" in text


def test_a_search_over_before_the_first_poll_still_shows_its_stage():
    out = io.StringIO()
    rep = _progress._LineReporter(out)
    done = {
        "phase": "done",
        "kernel_ops": 2,
        "states": 90,
        "block_graphs": 12,
        "verified": 3,
        "verification_failed": 0,
    }
    rep.search_tick({**done, "verify_goal": 3, "candidates": 40, "checked": 3})
    rep.search_tick({**done, "verify_goal": 3, "candidates": 40, "checked": 3})
    rep.close()
    lines = out.getvalue().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["[mirage] search", "[mirage] verify"], lines
    assert "12 block graphs (kernel ops 2, states 90)" in lines[0]
    assert "3/3 equivalent (40 candidates, checked 3" in lines[1]


def test_progress_must_be_a_bool_or_none(tmp_path):
    with pytest.raises(TypeError, match="progress"):
        rmsnorm_linear().superoptimize(backend="cpu", cache_dir=tmp_path, progress="yes")


def test_tqdm_draws_a_bar_per_stage(capsys, tmp_path, monkeypatch):
    pytest.importorskip("tqdm", reason="tqdm is optional (requirements-test.txt installs it)")
    monkeypatch.delenv("MIRAGE_PROGRESS", raising=False)
    best = rmsnorm_linear().superoptimize(backend="cpu", cache_dir=tmp_path, progress=True)
    err = capsys.readouterr().err
    for stage in ("search", "verify", "confirm"):
        assert f"mirage {stage}:" in err, (stage, err)
    goal = best.search_stats["verified"]
    # tqdm's own bar: percentage, bar and count of the verify stage.
    assert re.search(rf"mirage verify: 100%\|.*\| {goal}/{goal} \[", err), err
    assert "[mirage] search:" not in err  # not the plain line
    # MIRAGE_PROGRESS=plain keeps the plain line even with tqdm installed.
    monkeypatch.setenv("MIRAGE_PROGRESS", "plain")
    rmsnorm_linear().superoptimize(backend="cpu", cache_dir=tmp_path, use_cached_graphs=False)
    err = capsys.readouterr().err
    assert "[mirage] search: " in err and "mirage verify: 100%" not in err


def test_compile_and_profile_stages_follow_the_autotuner(no_tqdm, capsys, monkeypatch):
    """The GPU stages' wiring, with compilation and timing replaced (no GPU here): one
    candidate fails to compile, the other two are timed."""
    graphs = [rmsnorm_linear(), rmsnorm_linear(16), rmsnorm_linear(32)]
    times = {id(graphs[0]): 7.0, id(graphs[2]): 5.0}

    def executable(g, device):
        if id(g) not in times:
            raise RuntimeError("nvrtc: error in the generated code")
        return times[id(g)]

    monkeypatch.setattr(_cuda, "executable", executable)
    monkeypatch.setattr(_autotune, "_input_sets", lambda g, d: [])
    monkeypatch.setattr(_autotune, "_time_one", lambda exe, *a: (exe, "fake"))
    with _progress.session(True) as rep:
        best, timings, skipped, _, finals = _autotune._profile(
            graphs, ["a", "b", "c"], 0, 1, 1, False
        )
    assert rep.stages == ["compile", "profile"]
    assert best == 2 and timings == {"a": 7.0, "c": 5.0} and list(skipped) == ["b"]
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("[mirage] compile: compiling (NVRTC) 3/3 candidates (1 failed)")
    assert lines[1].startswith("[mirage] profile: profiling on the GPU 2/2 candidates")
    assert "fastest 5.00 us" in lines[1] and not finals


# ------------------------------------------------------------------ summary
def test_summary_names_the_chosen_candidate(winner):
    stats = winner.search_stats
    ops = kernel_ops(winner)
    custom = sum(1 for _, k in ops if k["kind"] == "customized")
    s = stats["summary"]
    n = len(ops)
    assert s.startswith(f"chose candidate 0 of {winner.candidates_considered}: ")
    assert f"{n} kernel op{'s' if n != 1 else ''} ({custom} customized" in s
    assert f"cost model {stats['winner']['cost']['est_us']:.2f} us" in s
    assert custom == stats["winner"]["customized_kernels"]
    assert "cheapest verified" in s and "measured" not in s


def test_summary_of_a_profiled_choice(winner):
    h = winner.search_stats["winner"]["hash"]
    stats = {
        **winner.search_stats,
        "source": "cache",
        "selection": {"method": "profiled", "timings_us": {h: 5.25, "x": 6.0, "y": 9.5}},
    }
    s = summary(winner, stats, 1, 3)
    assert "measured 5.25 us (fastest of 3 profiled)" in s and s.endswith("from the cache")
    stats["selection"]["timings_us"]["x"] = 4.0  # a faster one failed the confirmation
    assert "measured 5.25 us (among 3 profiled)" in summary(winner, stats, 1, 3)


# ------------------------------------------------------------------ explain
def test_explain_lists_every_kernel_op_with_its_grid(winner, tmp_path):
    text = explain(winner, quiet=True)
    lines = text.splitlines()
    ops = kernel_ops(winner)
    assert ops
    for i, kind in ops:
        (at,) = [j for j, line in enumerate(lines) if line.startswith(f"[op {i}] ")]
        if kind["kind"] == "customized":
            bg = kind["graph"]
            assert lines[at].startswith(f"[op {i}] customized: ")
            grid = f"grid {tuple(bg['grid_dim'])}, block {tuple(bg['block_dim'])}"
            assert lines[at + 1].strip().startswith(grid), lines[at + 1]
            assert f"for-loop range {bg['forloop_range']}," in lines[at + 1]
            # Every block op but the inputs and outputs is listed under it.
            body = "\n".join(lines[at + 2 :])
            for op in bg["ops"]:
                name = op["kind"].get("op", op["kind"]["kind"])
                name = name["op"] if isinstance(name, dict) else name
                assert f"{name}(" in body or name in ("input", "output"), name
    # The launches are the code generator's.
    plan = _cuda.cuda_source(winner, 90)[1]["kernels"]
    data = explain_data(winner, arch=90)
    assert [k for o in data["ops"] for k in o["launches"]] == plan
    for k in plan:
        assert f"launch {k['name']}: grid {tuple(k['grid'])}, block {tuple(k['block'])}" in text
    # The per-op model sums to the search's modelled time.
    assert data["modelled_us"] == pytest.approx(winner.search_stats["winner"]["cost"]["est_us"])
    assert data["measured_us"] is None


def test_explain_of_predefined_ops_shows_their_shapes():
    g = rmsnorm_linear(4, 256, 128)
    data = explain_data(g, launches=False)
    assert data["launch_error"] == "not asked for"
    text = explain(g, launches=False, quiet=True)
    assert "launch " not in text
    core = g._core
    ops = kernel_ops(g)
    assert [o["op"] for o in data["ops"]] == [i for i, _ in ops]
    for (i, kind), o in zip(ops, data["ops"]):
        (line,) = [x for x in text.splitlines() if x.startswith(f"[op {i}] ")]
        assert line.startswith(f"[op {i}] predefined {kind['kind']}")
        for t in o["inputs"] + o["outputs"]:
            dims = core.tensor_dims(t["tensor"])
            assert f"t{t['tensor']} {dims} {core.tensor_dtype(t['tensor'])}" in line


def test_explain_prints_returns_and_writes_dot(winner, tmp_path, capsys):
    text = winner.explain(launches=False, dot=tmp_path / "winner")
    assert capsys.readouterr().out == text
    dot = (tmp_path / "winner.dot").read_text()
    assert dot == winner.to_dot() and f"wrote {tmp_path / 'winner.dot'}" in text
    with pytest.raises(TypeError, match="explain"):
        explain("not a graph")  # type: ignore[arg-type]


def test_explain_with_compile_reports_registers(winner):
    nvrtc_or_skip()
    data = explain_data(winner, compile=True, arch=90)
    launches = [k for o in data["ops"] for k in o["launches"]]
    assert launches and all(k["registers"] > 0 for k in launches)
    text = explain(winner, compile=True, arch=90, quiet=True)
    for k in launches:
        assert f"{k['registers']} registers" in text


# ------------------------------------------------------------------ on a GPU
@pytest.mark.gpu
def test_gpu_stages_summary_and_explain(no_tqdm, capsys, tmp_path):
    best = rmsnorm_linear().superoptimize(
        cache_dir=tmp_path, warmup_iters=4, profile_iters=50, progress=True
    )
    err = capsys.readouterr().err
    sel = best.search_stats["selection"]
    assert sel["method"] == "profiled", sel
    assert not sel["skipped"], sel
    # The winner: a candidate (then confirmed), or the program as given, timed beside them.
    given = best.search_stats["source"] == "as_given"
    assert given == (sel["winner"] == search.AS_GIVEN), sel
    lines = err.splitlines()
    stages = ("search", "verify", "compile", "profile") + (() if given else ("confirm",))
    for stage in stages:
        assert any(line.startswith(f"[mirage] {stage}: ") for line in lines), (stage, err)
    # Off a terminal: a line at most every second, and one at the stage's end.
    compiled = [line for line in lines if line.startswith("[mirage] compile: ")][-1]
    timed = len(sel["timings_us"])
    assert search.AS_GIVEN in sel["timings_us"] and timed >= 2, sel
    assert f" {timed}/{timed} candidates" in compiled, compiled
    if not given:
        assert best.candidates_considered == timed - 1
        assert sel["winner"] == best.search_stats["winner"]["hash"]
    s = best.search_stats["summary"]
    us = sel["timings_us"][sel["winner"]]
    assert f"measured {us:.2f} us" in s and f"of {timed} profiled" in s, s
    data = explain_data(best, compile=True)
    assert data["measured_us"] == us
    assert f"measured {us:.2f} us (whole graph" in explain(best, quiet=True)
    # Cached timings: no compile or profile stage the second time.
    again = rmsnorm_linear().superoptimize(
        cache_dir=tmp_path, warmup_iters=4, profile_iters=50, progress=True
    )
    err = capsys.readouterr().err
    assert "[mirage] compile: " not in err and "cached timings" in again.search_stats["summary"]
