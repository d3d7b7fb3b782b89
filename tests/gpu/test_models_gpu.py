"""The model-shaped benchmark (``benches/gpu/models.py``) end to end on two small cells, and
its allocator poisoning. Marked ``gpu`` (skipped elsewhere)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import gpu_script

pytestmark = pytest.mark.gpu

CELLS = ["llama3.2-1b/attn_prefill/b1/tokens512/fp16", "mistral-7b/lora/b1/rank64/bf16"]


def test_poisoned_allocations_read_as_nan():
    models = gpu_script("models")
    models.poison_allocator(3 << 20)
    small = torch.empty(1000, dtype=torch.float16, device="cuda")
    large = torch.empty(3 << 19, dtype=torch.bfloat16, device="cuda")  # 3 MiB
    assert bool(torch.isnan(small).all()) and bool(torch.isnan(large).all())


def test_two_cells_run_checked_and_timed(tmp_path):
    models = gpu_script("models")
    out = tmp_path / "m.json"
    argv = [f"--cell={c}" for c in CELLS]
    argv += ["--quick", "--contenders", "eager,sdpa,sdpa_flash,sdpa_efficient,sdpa_cudnn"]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--json", str(out)]
    argv += ["--md", str(tmp_path / "m.md"), "--save-graphs", str(tmp_path / "g.json")]
    status = models.main(argv)
    run = json.loads(out.read_text())
    cells = {c["cell"]: c for c in run["cells"]}
    assert list(cells) == CELLS
    for name, c in cells.items():
        assert c["ours"]["ok"], (name, c["ours"], c.get("search"))
        assert c["ours"]["err"] < models.TOL[c["dtype"]] and c["ours"]["us"] > 0
        assert c["contenders"]["eager"]["ok"]
        assert c["search"]["wall_s"] > 0 and not c["search"]["cached"]
    att = cells[CELLS[0]]["contenders"]
    for backend in ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn"):
        e = att[backend]
        assert "na" in e or (e["ok"] and e["us"] > 0), (backend, e)
    assert "sdpa" not in cells[CELLS[1]]["contenders"]
    assert set(json.loads((tmp_path / "g.json").read_text())) == set(CELLS)
    assert status == 0
    assert run["meta"]["calibration"]["matmul_bf16_TFLOPs"] > 50
