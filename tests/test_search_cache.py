"""The search cache and checkpoints: a damaged, foreign or stale entry is a warned miss that
searches again and rewrites the file, never an error; the key follows the graph, the settings,
the build and the result switches (``mirage._env``)."""

from __future__ import annotations

import json
import pathlib
import re
import warnings
from collections.abc import Callable
from typing import Any

import mirage as mi
import numpy as np
import pytest
from mirage import _core, _env, search
from mirage.kernel import KNGraph

#: Restrictions under which the search of `_graph` takes a few tens of milliseconds.
FAST = {"backend": "cpu", "griddims": [(4, 1, 1)], "franges": [4]}


def _graph(k: int = 64) -> KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, k), dtype=mi.float16)
    W = g.new_input(dims=(k, 64), dtype=mi.float16)
    g.mark_output(g.matmul(g.rms_norm(X, normalized_shape=(k,)), W))
    return g


@pytest.fixture
def cached(tmp_path) -> tuple[KNGraph, pathlib.Path, KNGraph]:
    """A graph, its cache entry's file and the result the search returned."""
    g = _graph()
    best = g.superoptimize(cache_dir=tmp_path, **FAST)
    assert best.search_stats["source"] == "search"
    (path,) = tmp_path.glob("*.json")
    assert best.search_stats["cache_file"] == str(path)
    return g, path, best


def _edit(path: pathlib.Path, change: Callable[[dict[str, Any]], None]) -> str:
    data = json.loads(path.read_text())
    change(data)
    return json.dumps(data)


def _swap_graphs(d: dict[str, Any]) -> None:
    c = d["candidates"]
    c[0]["graph"], c[1]["graph"] = c[1]["graph"], c[0]["graph"]


# (case, the file's new content from the valid one, a word of the warning's reason)
DAMAGE: list[tuple[str, Callable[[pathlib.Path], str | bytes], str]] = [
    ("truncated", lambda p: p.read_bytes()[: p.stat().st_size // 2], "not valid JSON"),
    ("empty", lambda p: b"", "not valid JSON"),
    (
        "random bytes",
        lambda p: np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
        "not valid JSON",
    ),
    ("JSON list", lambda p: "[1, 2, 3]", "list"),
    ("JSON string", lambda p: '"mirage"', "str"),
    ("deep nesting", lambda p: "[" * 100_000 + "]" * 100_000, "not valid JSON"),
    (
        "old header only",
        lambda p: json.dumps({"format": search._CACHE_FORMAT, "version": 47}),
        "layout",
    ),
    (
        "header only",
        lambda p: json.dumps(
            {k: v for k, v in json.loads(p.read_text()).items() if k != "candidates"}
        ),
        "candidates",
    ),
    (
        "foreign format",
        lambda p: json.dumps({"format": "something/else", "candidates": []}),
        "format",
    ),
    ("other build", lambda p: _edit(p, lambda d: d.update(build_hash="0" * 64)), "build_hash"),
    (
        "other version",
        lambda p: _edit(p, lambda d: d.update(mirage_version="0.0.1")),
        "mirage_version",
    ),
    ("other key", lambda p: _edit(p, lambda d: d.update(key="0" * 32)), "key"),
    ("other graph", lambda p: _edit(p, lambda d: d.update(graph_hash="0" * 64)), "another graph"),
    ("stats a list", lambda p: _edit(p, lambda d: d.update(stats=[])), "stats"),
    ("candidates a dict", lambda p: _edit(p, lambda d: d.update(candidates={})), "candidates"),
    (
        "candidate a number",
        lambda p: _edit(p, lambda d: d["candidates"].__setitem__(0, 3)),
        "candidate 0",
    ),
    (
        "candidate without cost",
        lambda p: _edit(p, lambda d: d["candidates"][0].pop("cost")),
        "cost",
    ),
    (
        "candidate of unknown verification",
        lambda p: _edit(p, lambda d: d["candidates"][1].update(verification="failed")),
        "candidate 1",
    ),
    (
        "broken graph",
        lambda p: _edit(p, lambda d: d["candidates"][0].update(graph={"ops": "garbage"})),
        "does not parse",
    ),
    ("swapped graphs", lambda p: _edit(p, _swap_graphs), "hash is not the candidate's"),
    (
        "profiling entry without winner",
        lambda p: _edit(p, lambda d: d.update(profiled={"H100|sm90": {"timings_us": {}}})),
        "profiling entry",
    ),
]


def _assert_valid(path: pathlib.Path, g: KNGraph, key: str | None) -> None:
    """``path`` holds an entry this build serves (no warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert search._load(str(path), g.hash(), key) is not None


@pytest.mark.parametrize("case, damage, reason", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_a_bad_cache_entry_is_a_warned_miss_and_is_rewritten(cached, case, damage, reason):
    g, path, best = cached
    bad = damage(path)
    path.write_bytes(bad if isinstance(bad, bytes) else bad.encode())
    with pytest.warns(RuntimeWarning) as record:
        again = g.superoptimize(cache_dir=path.parent, **FAST)
    (w,) = [w for w in record if "ignoring" in str(w.message)]
    assert path.name in str(w.message) and reason in str(w.message), str(w.message)
    assert w.filename == __file__, "the warning points at the caller"
    assert again.search_stats["source"] == "search"
    assert again.to_json() == best.to_json()
    _assert_valid(path, g, path.stem)
    # ... and the next call is a hit.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        third = g.superoptimize(cache_dir=path.parent, **FAST)
    assert third.search_stats["source"] == "cache"


@pytest.mark.parametrize("case, damage, reason", DAMAGE[:9], ids=[d[0] for d in DAMAGE[:9]])
def test_a_bad_checkpoint_is_a_warned_miss_and_is_rewritten(tmp_path, case, damage, reason):
    g = _graph()
    ckpt = tmp_path / "ckpt.json"
    best = g.superoptimize(previous_checkpoint=ckpt, **FAST)
    bad = damage(ckpt)
    ckpt.write_bytes(bad if isinstance(bad, bytes) else bad.encode())
    with pytest.warns(RuntimeWarning, match=r"previous_checkpoint .*ckpt\.json") as record:
        again = g.superoptimize(previous_checkpoint=ckpt, **FAST)
    assert any(reason in str(w.message) for w in record)
    assert again.search_stats["source"] == "search"
    assert again.to_json() == best.to_json()
    _assert_valid(ckpt, g, None)
    assert g.superoptimize(previous_checkpoint=ckpt, **FAST).search_stats["source"] == "checkpoint"


def test_a_checkpoint_of_another_graph_stays_an_error(tmp_path):
    ckpt = tmp_path / "ckpt.json"
    _graph(64).superoptimize(previous_checkpoint=ckpt, **FAST)
    before = ckpt.read_bytes()
    with pytest.raises(ValueError, match="previous_checkpoint .* another graph"):
        _graph(128).superoptimize(previous_checkpoint=ckpt, **FAST)
    assert ckpt.read_bytes() == before, "the other graph's checkpoint is left alone"


def test_a_checkpoint_keeps_its_candidates_under_other_switches(tmp_path, monkeypatch):
    """Search results do not depend on the result switches (profiling winners do, by their
    own key), so a checkpoint stays served when one changes."""
    ckpt = tmp_path / "ckpt.json"
    g = _graph()
    g.superoptimize(previous_checkpoint=ckpt, **FAST)
    monkeypatch.setenv("MIRAGE_PDL", "0")
    assert g.superoptimize(previous_checkpoint=ckpt, **FAST).search_stats["source"] == "checkpoint"


def test_an_unwritable_cache_is_a_warning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.warns(RuntimeWarning, match="cannot write"):
        best = _graph().superoptimize(cache_dir=blocker / "cache", **FAST)
    assert best.search_stats["source"] == "search"


# ------------------------------------------------------------------------- keys
SETTINGS = {"griddims": [[4, 1, 1]], "franges": [4]}


def test_the_same_settings_give_the_same_key():
    assert search._cache_key("h", dict(SETTINGS)) == search._cache_key("h", dict(SETTINGS))
    assert search._cache_key("h", SETTINGS) != search._cache_key("h2", SETTINGS)
    assert search._cache_key("h", SETTINGS) != search._cache_key("h", {"franges": [4]})


@pytest.mark.parametrize("name", [n for n, _ in _env.RESULT_SWITCHES])
def test_each_result_switch_changes_the_keys(name, monkeypatch):
    monkeypatch.delenv(name, raising=False)
    key, tag = search._cache_key("h", SETTINGS), search._switches_tag()
    for value in ("0", "1", "3", "/some/folder"):
        monkeypatch.setenv(name, value)
        assert search._cache_key("h", SETTINGS) != key, value
        assert search._switches_tag() != tag, value
    monkeypatch.delenv(name)
    assert search._cache_key("h", SETTINGS) == key


def test_other_variables_leave_the_key(monkeypatch, tmp_path):
    key = search._cache_key("h", SETTINGS)
    for name, _ in _env.OTHER_VARIABLES:
        monkeypatch.setenv(name, str(tmp_path))
    assert search._cache_key("h", SETTINGS) == key


def test_the_build_hash_and_version_change_the_key(monkeypatch, tmp_path):
    assert re.fullmatch(r"[0-9a-f]{64}", _core.__build_hash__)
    key = search._cache_key("h", SETTINGS)
    g = _graph()
    g.superoptimize(cache_dir=tmp_path, **FAST)
    monkeypatch.setattr(_core, "__build_hash__", "0" * 64)
    assert search._cache_key("h", SETTINGS) != key
    # Another build neither reads nor replaces this build's entry.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert g.superoptimize(cache_dir=tmp_path, **FAST).search_stats["source"] == "search"
    assert len(list(tmp_path.glob("*.json"))) == 2
    monkeypatch.undo()
    monkeypatch.setattr(_core, "__version__", "0.0.0-other")
    assert search._cache_key("h", SETTINGS) != key


def test_an_entry_records_what_produced_it(cached):
    _, path, _ = cached
    data = json.loads(path.read_text())
    assert data["key"] == path.stem
    assert data["build_hash"] == _core.__build_hash__
    assert data["mirage_version"] == _core.__version__
    assert set(data["switches"]) == {n for n, _ in _env.RESULT_SWITCHES}


def _env_names_read(root: pathlib.Path) -> set[str]:
    names: set[str] = set()
    files = [*root.glob("crates/*/src/**/*.rs"), *root.glob("python/mirage/*.py")]
    assert files
    for f in files:
        names.update(re.findall(r"[\"'](MIRAGE_[A-Z0-9_]+)[\"']", f.read_text(encoding="utf-8")))
    # Set by the bindings' build script for the compiler, not read at run time.
    names.discard("MIRAGE_BUILD_HASH")
    return names


def test_every_environment_variable_is_classified():
    """A new ``MIRAGE_*`` variable must be listed as a result switch (in the keys) or not."""
    known = {n for n, _ in _env.RESULT_SWITCHES} | {n for n, _ in _env.OTHER_VARIABLES}
    assert len(known) == len(_env.RESULT_SWITCHES) + len(_env.OTHER_VARIABLES)
    read = _env_names_read(pathlib.Path(__file__).parents[1])
    assert read - known == set(), "classify these in mirage/_env.py"
    assert {"MIRAGE_WS_WARPGROUPS", "MIRAGE_PDL", "MIRAGE_CACHE_DIR"} <= read
