"""The GPU timeline tool's source edits, checked without a GPU: the stamped forms of the
streaming kernels the search hands a GPU still compile, and what is not such a kernel is
refused with a reason."""

from __future__ import annotations

from types import ModuleType

import mirage as mi
import pytest
from conftest import gpu_script, nvrtc_or_skip
from mirage import _core, search


@pytest.fixture(scope="module")
def timeline() -> ModuleType:
    return gpu_script("timeline")  # variants.py and bench.py beside it (torch is in the test venv)


def _forms(timeline: ModuleType, workload: str, b: int) -> list[mi.KNGraph]:
    """The candidates a GPU would time for a bench cell (the H200's tile budget)."""
    bench = timeline.variants.bench
    w = next(x for x in bench.WORKLOADS if x.name == workload)
    settings = {
        **search._resolve_config(w.config),
        "verify_top_n": search._GPU_TOP_N,
        "verify_spread": True,
        "verify_co_resident": True,
        "shared_memory_limit": 232448 * 3 // 4,
    }
    found = search.search_candidates(bench.build_program(w.kind, w.dims(b)), settings)
    return [mi.from_json(c["graph"]) for c in found["candidates"]]


@pytest.mark.parametrize("async_push", ["1", "0"])
def test_stamped_rmsnorm_linear_kernels_compile(timeline, monkeypatch, async_push):
    nvrtc_or_skip()
    monkeypatch.setenv("MIRAGE_ASYNC_PUSH", async_push)
    # RMSNorm+Linear 4096x4096 at b=1: 64-block forms split over clusters (the other blocks
    # send their stamps with their sums) and 128-block forms that are not.
    forms = {"cluster": None, "plain": None}
    for g in _forms(timeline, "rmsnorm_linear", 1):
        src = g.cuda_source(arch=90)
        if src.count("__global__ void") != 1 or "mi::dep_wait();" not in src:
            continue
        kind = "cluster" if "mi::cluster_push" in src else "plain"
        if forms[kind] is None:
            forms[kind] = src
    assert forms["cluster"] is not None and forms["plain"] is not None, forms
    for kind, src in forms.items():
        stamped, words = timeline.stamp(src)
        assert words >= len(timeline.OWN), kind
        body = stamped.split(timeline.MARK)[1]
        # Entry, wait, first stage, loop, end; a cluster's also finish, first phase and merge,
        # and the other block's stamps: stored after its push where the cluster barrier
        # orders the merge, over its pushed [2, 64] tile beside st.async pushes.
        cluster = kind == "cluster"
        assert body.count("mi_gt()") == 5 + 4 * cluster, f"{kind}: {body}"
        assert body.count("stamps of this block for the first one") == cluster, body
        assert ("mi::cluster_map(mi_recv, 0u)" in body) == (cluster and async_push == "0")
        if cluster and async_push == "1":
            assert "reinterpret_cast<const unsigned long long*>(mi_recv + 4)[j]" in body, body
        assert len(_core.nvrtc_compile(stamped, 90)) > 0, kind


def test_a_kernel_without_a_loop_is_refused(timeline):
    # LoRA's winners are loop-free: there is no stage to time.
    g = _forms(timeline, "lora", 1)[0]
    with pytest.raises(ValueError, match="stamp: "):
        timeline.stamp(g.cuda_source(arch=90))


def test_a_saved_graph_names_its_cell(timeline, tmp_path):
    w, b = timeline.variants.cell_of(str(tmp_path / "rmsnorm_linear_6144_16_fb0a3152.json"))
    assert (w.name, b) == ("rmsnorm_linear_6144", 16)
    w, b = timeline.variants.cell_of("gated_mlp_8.json")
    assert (w.name, b) == ("gated_mlp", 8)
    with pytest.raises(ValueError, match="WORKLOAD_B"):
        timeline.variants.cell_of("winner.json")
