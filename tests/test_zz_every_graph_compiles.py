"""Every graph the CPU suite ran (recorded by conftest.py while the earlier modules ran) generates
CUDA that NVRTC compiles for sm_80 and sm_90. Runs last (file order); alone it compiles nothing
and says so."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import mirage as mi
import pytest
from conftest import RAN_GRAPHS, nvrtc_or_skip


def _compile(item: tuple[str, str]) -> str | None:
    h, text = item
    g = mi.from_json(text)
    for arch in (80, 90):
        try:
            if g.compile_cuda(arch)[:4] != b"\x7fELF":
                return f"{h[:12]} sm_{arch}: not a CUBIN"
        except (RuntimeError, ValueError) as e:
            return f"{h[:12]} sm_{arch}: {e}\n{text[:2000]}"
    return None


def test_every_graph_the_suite_ran_compiles(monkeypatch, tmp_path):
    nvrtc_or_skip()
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path / "cache"))
    graphs = sorted(RAN_GRAPHS.items())
    if not graphs:
        pytest.skip("no graph ran before this module (run the whole suite)")
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        errors = [e for e in pool.map(_compile, graphs) if e]
    print(f"compiled {len(graphs)} graphs for sm_80 and sm_90")
    assert not errors, f"{len(errors)} of {len(graphs)} graphs failed:\n" + "\n\n".join(errors[:5])
