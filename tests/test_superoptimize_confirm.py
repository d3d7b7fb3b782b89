"""superoptimize confirms the candidate it returns with the every-element equivalence check:
a cache or checkpoint whose winning graph was edited into a different valid graph is detected,
warned about, and a correct graph is returned (the next best, or a fresh search)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mirage as mi
import pytest
from mirage.kernel import KNGraph


def rmsnorm_linear(m: int = 8, k: int = 64, n: int = 64) -> KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(m, k), dtype=mi.float16)
    W = g.new_input(dims=(k, n), dtype=mi.float16)
    g.mark_output(g.matmul(g.rms_norm(X, normalized_shape=(k,)), W))
    return g


def poison(candidate: dict[str, Any]) -> None:
    """Turns the candidate's block-level ``mm / rms`` into ``mm * rms``: still a valid graph."""
    for op in candidate["graph"]["graph"]["ops"]:
        kind = op["kind"]
        if kind["kind"] != "customized":
            continue
        for bop in kind["graph"]["ops"]:
            if bop["kind"] == {"kind": "binary", "op": "div"}:
                bop["kind"]["op"] = "mul"
                return
    raise AssertionError("the candidate has no block-level division to edit")


def poison_file(path: Path, how_many: int) -> list[str]:
    data = json.loads(path.read_text())
    passed = [c for c in data["candidates"] if c["verification"] == "passed"]
    assert len(passed) >= 2
    for c in passed[:how_many]:
        poison(c)
        # The edited graph is valid (the binding parses it), and the entry stays consistent:
        # its hash is the edited graph's, as a generator with a bug would have written it, so
        # only the equivalence check can tell.
        c["hash"] = mi.kernel.KNGraph(mi._core.KernelGraph.from_json(json.dumps(c["graph"]))).hash()
    path.write_text(json.dumps(data))
    return [c["hash"] for c in passed[:how_many]]


def assert_correct(g: KNGraph, best: KNGraph) -> None:
    v = mi.verify(g, best, float_check=False)
    assert v.equivalent and v.coverage == "every", str(v)


def test_a_clean_run_confirms_its_winner(tmp_path: Path) -> None:
    g = rmsnorm_linear()
    best = g.superoptimize(backend="cpu", cache_dir=tmp_path)
    assert best.search_stats["confirm_rejected"] == []
    assert best.search_stats["confirm_seconds"] >= 0.0
    assert_correct(g, best)


def test_an_edited_cache_winner_is_dropped_for_the_next_best(tmp_path: Path) -> None:
    g = rmsnorm_linear()
    g.superoptimize(backend="cpu", cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.json")
    (bad,) = poison_file(path, 1)
    with pytest.warns(RuntimeWarning, match="not equivalent .* dropped"):
        best = g.superoptimize(backend="cpu", cache_dir=tmp_path)
    stats = best.search_stats
    assert stats["source"] == "cache"
    assert stats["confirm_rejected"] == [bad]
    assert stats["winner"]["hash"] != bad
    assert_correct(g, best)


def test_a_checkpoint_whose_candidates_are_all_edited_is_searched_again(tmp_path: Path) -> None:
    g = rmsnorm_linear()
    ckpt = tmp_path / "ckpt.json"
    g.superoptimize(backend="cpu", previous_checkpoint=str(ckpt))
    n = len(
        [c for c in json.loads(ckpt.read_text())["candidates"] if c["verification"] == "passed"]
    )
    poison_file(ckpt, n)
    with pytest.warns(RuntimeWarning, match="searching again"):
        best = g.superoptimize(backend="cpu", previous_checkpoint=str(ckpt))
    assert best.search_stats["source"] == "search"
    assert_correct(g, best)
    # The fresh search replaced the edited checkpoint: loading it again needs no drop.
    again = g.superoptimize(backend="cpu", previous_checkpoint=str(ckpt))
    assert again.search_stats["source"] == "checkpoint"
    assert again.search_stats["confirm_rejected"] == []
