"""The source-dump tool that guards code-generator refactors: a dump of the same graphs is
identical, and a changed source is reported (so a refactor that changes a kernel can't pass)."""

from __future__ import annotations

import os
from types import ModuleType

import mirage as mi
import pytest
from conftest import GPU_SCRIPTS


def _bench_script(name: str) -> ModuleType:
    """``benches/<name>.py`` loaded as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, GPU_SCRIPTS.parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    return _bench_script("dump_sources")


def _graphs(folder) -> None:
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(16, 256), dtype=mi.float16)
    w = g.new_input(dims=(256, 128), dtype=mi.float16)
    g.mark_output(g.matmul(g.rms_norm(x, normalized_shape=(256,)), w))
    (folder / "a.json").write_text(g.to_json())
    h = mi.new_kernel_graph()
    y = h.new_input(dims=(8, 64), dtype=mi.float32)
    h.mark_output(h.exp(y))
    (folder / "b.json").write_text(h.to_json())


def test_dump_is_stable_and_diff_finds_a_changed_kernel(tool, tmp_path, capsys):
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    _graphs(graphs)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert tool.dump(a, [str(graphs)], [80, 90]) == 2
    assert tool.dump(b, [str(graphs)], [80, 90]) == 2
    assert len(os.listdir(a)) == 4
    assert tool.diff(a, b) == []
    name = min(os.listdir(b))
    with open(os.path.join(b, name), "a", encoding="utf-8") as f:
        f.write("// changed\n")
    os.remove(os.path.join(b, max(os.listdir(b))))
    bad = tool.diff(a, b)
    assert name in bad and len(bad) == 2
    assert "+// changed" in capsys.readouterr().out
    # A change inside the runtime header alone is not a kernel's change.
    c = str(tmp_path / "c")
    tool.dump(c, [str(graphs)], [90])
    name = min(os.listdir(c))
    with open(os.path.join(c, name), encoding="utf-8") as f:
        text = f.read()
    assert tool.KERNELS_MARK in text
    with open(os.path.join(c, name), "w", encoding="utf-8") as f:
        f.write(text.replace("namespace mi {", "namespace mi {\n// header", 1))
    ref = str(tmp_path / "ref")
    tool.dump(ref, [str(graphs)], [90])
    assert tool.diff(ref, c) == [name]
    assert tool.diff(ref, c, kernels=True) == []


@pytest.fixture(scope="module")
def sass_tool() -> ModuleType:
    return _bench_script("sass_diff")


def test_saved_sources_disassemble_as_their_graphs_and_a_changed_kernel_is_found(
    tool, sass_tool, tmp_path, monkeypatch
):
    monkeypatch.setenv("MIRAGE_CUBLAS", "0")
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    _graphs(graphs)
    src, from_graphs, from_src = (str(tmp_path / n) for n in ("src", "g", "s"))
    tool.dump(src, [str(graphs)], [90])
    n, kernels = sass_tool.dump(from_graphs, [str(graphs)], [90], jobs=2)
    assert n == 2 and kernels >= 2
    assert sass_tool.dump(from_src, [], [90], jobs=2, sources=[src]) == (2, kernels)
    assert sorted(os.listdir(from_src)) == sorted(os.listdir(from_graphs))
    assert sass_tool.diff(from_graphs, from_src)[0] == []
    # The exp graph's kernel computes 2 * exp(x) instead: its machine code differs.
    texts = {}
    for n in os.listdir(src):
        with open(os.path.join(src, n), encoding="utf-8") as f:
            texts[os.path.join(src, n)] = f.read()
    exp_src, text = next((p, t) for p, t in texts.items() if "mi::op_exp(" in t)
    with open(exp_src, "w", encoding="utf-8") as f:
        f.write(text.replace("mi::op_exp(", "2.0f * mi::op_exp(", 1))
    changed = str(tmp_path / "changed")
    sass_tool.dump(changed, [], [90], jobs=2, sources=[src])
    bad, total = sass_tool.diff(from_graphs, changed)
    assert total >= 2 and len(bad) == 1 and bad[0].startswith(os.path.basename(exp_src)[:16])
