"""The warpgroup timeline tool's source edits, checked without a GPU: the stamped forms of saved
warp-specialised attention winners still compile with a stamp at each of a step's phases, and
a kernel without that loop is refused with a reason."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import mirage as mi
import pytest
from conftest import gpu_script, nvrtc_or_skip
from mirage import _core, _cuda

SAVED = Path(__file__).parent.parent / "benches/gpu/results/h200-2026-11-29-s50/all-graphs"


@pytest.fixture(scope="module")
def wg_timeline() -> ModuleType:
    return gpu_script("wg_timeline")


def _source(name: str) -> tuple[str, int]:
    """The sm_90 source of the saved winner `name` and its blocks a cluster."""
    (path,) = SAVED.glob(f"{name}_*.json")
    src, info = _cuda.cuda_source(mi.load_json(str(path)), 90)
    (kern,) = info["kernels"]
    cluster = 1
    for c in kern.get("cluster") or [1]:
        cluster *= c
    return src, cluster


@pytest.mark.parametrize(
    ("name", "fine"),
    [
        ("qknorm_gqa_8", False),
        ("gqa_8", False),
        ("mqa_16", False),
        ("qknorm_gqa_8", True),
        ("gqa_8", True),
    ],
)
def test_stamped_attention_kernels_compile(wg_timeline, name, fine):
    nvrtc_or_skip()
    src, cluster = _source(name)
    stamped, (a, b, words) = wg_timeline.stamp(src, cluster, fine)
    # A stamp a phase in the runtime's step lambda (eight, eleven split finely), in the order
    # they run, and the block-wide four in the kernel.
    n = len(wg_timeline.phase_names(fine))
    assert n == (11 if fine else 8)
    lam = stamped[stamped.index("auto stage = [&](const int k") :]
    at = [lam.find(f"stamp_step<NWG>(wg, k, {p});") for p in range(n)]
    assert -1 not in at and at == sorted(at), (name, at)
    assert stamped.count("stamp_step<NWG>(wg, k, ") == n, name
    kern = stamped.split(wg_timeline.streaming.MARK)[1]
    assert kern.count("mi::stamp_clock()") == 4 and "mi::store_n<8>(out0" not in kern, name
    # Each block's words lie in its own output rows (16-bit outputs, split over the cluster).
    assert words * cluster * 4 == b and a % b == 0, (a, b, words, cluster)
    assert len(_core.nvrtc_compile(stamped, 90)) > 0


def test_kernels_without_the_warp_specialised_loop_are_refused(wg_timeline):
    src, cluster = _source("mha_8")
    with pytest.raises(ValueError, match="warp-specialised loop"):
        wg_timeline.stamp(src, cluster)


def test_phases_of_one_blocks_words(wg_timeline):
    import numpy as np

    words = np.zeros(64, dtype=np.int64)
    words[:4] = [1000, 1100, 5100, 5600]
    words[4:7] = [1, 3, 8]  # one warpgroup, three steps of room, eight stamps a step
    words[8:16] = 1200 + np.arange(8) * 10  # step 0
    words[16:24] = 1300 + np.arange(8) * 20  # step 1 (step 2 not stamped)
    spans, steps = wg_timeline.phases(words)
    assert spans == {"set-up": 100, "loop": 4000, "rest": 500}
    assert steps[(0, 0)] == [10] * 7 + [30] and steps[(0, 1)] == [20] * 7 + [0]
    assert (0, 2) not in steps
