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
    # A later file's winner of a cell replaces an earlier one's (a re-run of some cells).
    g2 = mi.new_kernel_graph()
    x = g2.new_input(dims=(4, 64), dtype=mi.float16)
    w = g2.new_input(dims=(64, 32), dtype=mi.float16)
    g2.mark_output(g2.exp(g2.matmul(x, w)))
    rerun = tmp_path / "m3-graphs.json"
    rerun.write_text(json.dumps({names[0]: g2.to_json()}))
    out = sanitize.model_winners([str(saved), str(rerun)], None, str(tmp_path))
    assert [n for n, _ in out] == names
    assert mi.from_json(pathlib.Path(out[0][1]).read_text()).hash() == g2.hash()


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


def test_racecheck_leaves_the_default_matmul_to_its_own_cells(sanitize, monkeypatch):
    # Under racecheck without cuBLAS the winners' predefined matmuls run on the default
    # kernel, a stand-in for cuBLAS whose big shapes racecheck does not finish: it is not
    # instrumented there, but it is in its own cells, which run on it under every tool.
    monkeypatch.delenv("MIRAGE_CUBLAS", raising=False)
    exclude = ["--kernel-name-exclude", sanitize.DEFAULT_MATMUL_KERNELS]

    def excludes(cmd: list[str]) -> bool:
        return any(cmd[i : i + 2] == exclude for i in range(len(cmd)))

    assert excludes(sanitize.sanitizer_command("racecheck", False, "model:x"))
    assert not excludes(sanitize.sanitizer_command("racecheck", True, "model:x"))
    assert not excludes(sanitize.sanitizer_command("racecheck", False, sanitize.DEFAULT_MATMUL))
    for tool in ("memcheck", "synccheck"):
        assert not excludes(sanitize.sanitizer_command(tool, False, "attention"))
        env = sanitize.child_env(tool, kind=sanitize.DEFAULT_MATMUL)
        assert env["MIRAGE_CUBLAS"] == "0"


def test_default_matmul_cells_have_tails_and_run_on_the_cpu(sanitize, tmp_path):
    # Each cell is one predefined matmul whose m, n and k are not multiples of the kernel's
    # tiles (64, 64, 32), so racecheck sees its partial tiles; the graph computes the product.
    import pathlib

    import mirage as mi
    import torch

    files = sanitize.default_matmul_files(str(tmp_path))
    assert len(files) == len(sanitize.DEFAULT_MATMUL_CELLS)
    gen = torch.Generator().manual_seed(0)
    for (_, a_dims, b_dims, dt), (_, path) in zip(sanitize.DEFAULT_MATMUL_CELLS, files):
        m, k, n = a_dims[-2], a_dims[-1], b_dims[-1]
        assert m % 64 and n % 64 and k % 32
        g = mi.from_json(pathlib.Path(path).read_text())
        dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dt]
        a, b = (torch.randn(*d, generator=gen).to(dtype) for d in (a_dims, b_dims))
        (out,) = g.run([a, b])
        ref = a.double() @ b.double()
        assert float((out.double() - ref).norm() / ref.norm()) < 2e-2
