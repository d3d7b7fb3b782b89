"""The sanitizer script's reading of compute-sanitizer output, checked without a GPU: its
counts decide whether a winner is reported clean, so a summary it misreads would hide hazards."""

from __future__ import annotations

from types import ModuleType

import pytest
from conftest import gpu_script


@pytest.fixture(scope="module")
def sanitize() -> ModuleType:
    return gpu_script("sanitize")


RACE = """\
========= Potential WAW hazard (invalid memcpy_async synchronization) at 0x5c0 in void \
mi::FlashRows<1, 8, false>::save<128>(float *, int) const
=========     Write Thread (483,0,0) at mi::cp_async16<(bool)0>(void *, const void *)+0x16070 in x.cu:159
========= Potential WAW hazard (invalid memcpy_async synchronization) at 0x5c0 in void \
mi::FlashRows<1, 8, false>::save<128>(float *, int) const
========= RACECHECK SUMMARY: 17342 hazards displayed (17340 errors, 2 warnings)
"""


def test_racecheck_summary_counts_errors_warnings_and_functions(sanitize):
    r = sanitize.parse_report(RACE)
    assert r["errors"] == 17340 and r["warnings"] == 2
    assert r["functions"][0] == "mi::FlashRows<1, 8, false>::save<128>"
    assert "mi::cp_async16<(bool)0>" in r["functions"]
    assert r["kinds"] == {"WAW": 2}


@pytest.mark.parametrize("n", [0, 3])
def test_memcheck_summary(sanitize, n):
    r = sanitize.parse_report(f"noise\n========= ERROR SUMMARY: {n} errors\n")
    assert r == {"errors": n, "warnings": 0, "functions": [], "kinds": {}}


def test_no_summary_is_not_clean(sanitize):
    # A run that died before its summary (a crash, a timeout) must not count as 0 errors.
    assert sanitize.parse_report("Segmentation fault")["errors"] is None


def test_model_suite_winners_become_one_file_a_cell(sanitize, tmp_path):
    # `--models` reads the model suite's saved winners (cell name -> graph JSON): each cell's
    # graph goes to a file of its own that loads as the same graph; `--cells` keeps some.
    import json
    import pathlib

    import mirage as mi

    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 64), dtype=mi.float16)
    w = g.new_input(dims=(64, 32), dtype=mi.float16)
    g.mark_output(g.matmul(x, w))
    saved = tmp_path / "m-graphs.json"
    names = ["llama3-8b/qkv/b1/fp16", "qwen2.5-7b/lora/b8/rank16/fp16"]
    saved.write_text(json.dumps({n: g.to_json() for n in names}))
    out = sanitize.model_winners([str(saved)], None, str(tmp_path))
    assert [n for n, _ in out] == names
    assert len({p for _, p in out}) == 2
    for _, p in out:
        assert mi.from_json(pathlib.Path(p).read_text()).hash() == g.hash()
    assert [n for n, _ in sanitize.model_winners([str(saved)], names[1], str(tmp_path))] == names[
        1:
    ]


def test_a_saved_winner_tells_its_weight_layout(sanitize):
    # The child draws a model cell's inputs in the layout the winner was searched with: a
    # graph input with other than row-major strides (a transposed weight) means "linear".
    import mirage as mi

    for strides, layout in [(None, "rowmajor"), ((1, 64), "linear")]:
        g = mi.new_kernel_graph()
        x = g.new_input(dims=(4, 64), dtype=mi.float16)
        w = g.new_input(dims=(64, 32), strides=strides, dtype=mi.float16)
        g.mark_output(g.matmul(x, w))
        assert sanitize.weight_layout(mi.from_json(g.to_json())) == layout


def test_racecheck_runs_the_predefined_matmuls_on_our_kernel(sanitize, monkeypatch):
    # racecheck stops with an internal error on some cuBLASLt kernels: under it (only) the
    # child keeps every matmul on our default kernel, unless asked to keep cuBLAS.
    monkeypatch.delenv("MIRAGE_CUBLAS", raising=False)
    assert sanitize.child_env("racecheck")["MIRAGE_CUBLAS"] == "0"
    assert "MIRAGE_CUBLAS" not in sanitize.child_env("racecheck", racecheck_cublas=True)
    for tool in ("memcheck", "synccheck"):
        assert "MIRAGE_CUBLAS" not in sanitize.child_env(tool)
