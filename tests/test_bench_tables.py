"""The GPU benchmark's table tools on saved runs (no GPU): merging the parts of section 5's
table that the device's per-command limit splits over calls."""

from __future__ import annotations

import copy
import json
from types import ModuleType

import pytest
from conftest import GPU_SCRIPTS, gpu_script

RUNS = GPU_SCRIPTS / "results" / "h200-2026-11-28"
PARTS = ["att1.json", "att816.json", "mlp.json", "mlp2.json"]


@pytest.fixture(scope="module")
def merge_tables() -> ModuleType:
    return gpu_script("merge_tables")  # bench.py's helpers (torch is in the test venv)


def _runs() -> list[dict]:
    return [json.loads((RUNS / p).read_text()) for p in PARTS]


def test_the_h200_parts_merge_into_the_27_cells_a_later_run_replacing(merge_tables):
    runs = _runs()
    cells = merge_tables.merge(runs)
    keys = [(c["workload"], c["batch"]) for c in cells]
    assert len(keys) == 27 == len(set(keys))
    assert [c["batch"] for c in cells] == sorted(c["batch"] for c in cells)
    by = {(c["workload"], c["batch"]): c for c in cells}
    # RMSNorm+Linear and gated MLP come from the last run (after the cluster-merge change),
    # LoRA and nTrans from the one before it.
    for b in (1, 8, 16):
        assert by[("rmsnorm_linear", b)]["run"] == 3 and by[("gated_mlp", b)]["run"] == 3
        assert by[("lora", b)]["run"] == 2 and by[("ntrans", b)]["run"] == 2
    assert by[("gqa", 1)]["run"] == 0 and by[("qknorm_gqa", 8)]["run"] == 1


def test_each_cell_keeps_its_own_runs_rates_for_its_floor(merge_tables):
    runs = _runs()
    bench = merge_tables.bench
    for c in merge_tables.merge(runs):
        cal = runs[c["run"]]["meta"]["calibration"]
        floor = bench.floor_us(
            c["bytes"], c["flops"], cal["copy_GBps"] * 1e9, cal["matmul_TFLOPs"] * 1e12
        )
        row = bench.table_rows([c], c["calibration"])[0]
        assert row[bench.HEADER.index("floor µs")] == bench._us(floor)
    # The same cell under another run's rates would show another floor: the rates differ.
    assert len({r["meta"]["calibration"]["copy_GBps"] for r in runs}) == 4


def test_the_rendered_table_and_its_mean(merge_tables, capsys):
    assert merge_tables.main([str(RUNS / p) for p in PARTS]) == 0
    out = capsys.readouterr().out
    rows = [r for r in out.splitlines() if r.startswith("| ") and not r.startswith("| workload")]
    assert len(rows) == 27
    assert "| qknorm_gqa | 8 | 18.6 |" in out
    sps = [merge_tables.bench.speedup(c) for c in merge_tables.merge(_runs())]
    assert f"over 27 cells: {merge_tables.bench.geomean(sps):.2f}x." in out
    assert out.count("cell(s) in the table") == 4


def test_a_cell_run_again_replaces_the_first(merge_tables):
    first = _runs()[0]
    again = copy.deepcopy(first)
    again["meta"]["calibration"]["copy_GBps"] *= 2
    again["cells"] = [c for c in again["cells"] if c["workload"] == "gqa"]
    again["cells"][0]["ours"]["us"] = 1.0
    cells = merge_tables.merge([first, again])
    gqa = next(c for c in cells if c["workload"] == "gqa")
    assert gqa["ours"]["us"] == 1.0 and gqa["run"] == 1
    assert gqa["calibration"]["copy_GBps"] == again["meta"]["calibration"]["copy_GBps"]
    assert len(cells) == len(first["cells"])


SAVED = GPU_SCRIPTS / "results" / "h200-2026-11-29-s43" / "mlp-graphs"


def test_the_saved_winners_load_and_generate_their_forms(monkeypatch):
    # Fifteen saved MLP-side winners (kept for `variants.py` A/B runs): they
    # load; the three co-resident twins (`smem_cap`) keep their stages within two blocks an
    # SM; the four warpgroup twins (`warpgroup_acc`: RMSNorm+Linear b=8 and 16 at both widths
    # but 4096x6144 b=8, gated MLP b=16) sum their matmuls with `mi::MmaAccWG` and the rest
    # with `mi::MmaAcc`, unless MIRAGE_WGMMA_ACC=1 asks every kernel where the form fits.
    import mirage as mi

    monkeypatch.delenv("MIRAGE_WGMMA_ACC", raising=False)
    files = sorted(SAVED.glob("*.json"))
    assert len(files) == 15, files
    twins, asked = 0, []
    for f in files:
        kernels = [
            op["kind"]["graph"]
            for op in json.loads(f.read_text())["graph"]["ops"]
            if op["kind"]["kind"] == "customized"
        ]
        src = mi.load_json(str(f)).cuda_source(arch=90)
        if any(k.get("smem_cap") for k in kernels):
            twins += 1
            header = src[src.index("// block graph:") :].splitlines()[0]
            smem = int(header.split(" bytes of shared memory")[0].rsplit(", ", 1)[1])
            assert smem <= 113 * 1024, (f.name, header)
        if any(k.get("warpgroup_acc") for k in kernels):
            asked.append(f.name.rsplit("_", 1)[0])
            assert "mi::MmaAccWG<" in src and "mi::MmaAcc<" not in src, f.name
        else:
            assert "mi::MmaAccWG<" not in src, f.name
    assert twins == 3
    assert sorted(asked) == [
        "gated_mlp_16",
        "rmsnorm_linear_16",
        "rmsnorm_linear_6144_16",
        "rmsnorm_linear_8",
    ]
    monkeypatch.setenv("MIRAGE_WGMMA_ACC", "1")
    forced = mi.load_json(str(SAVED / "rmsnorm_linear_6144_8_4cf6cd35.json")).cuda_source(arch=90)
    assert "mi::MmaAccWG<NT, 1, 16, 64," in forced


def test_one_run_can_leave_torch_compile_out_of_large_attention_cells():
    bench = gpu_script("bench")
    args = bench.parse_args(["--large-attention-contenders", "eager,sdpa,compile_sdpa"])
    assert bench.cell_contenders("attention", 8, args) == ["eager", "sdpa", "compile_sdpa"]
    assert bench.cell_contenders("qknorm_attention", 16, args) == ["eager", "sdpa", "compile_sdpa"]
    assert bench.cell_contenders("attention", 1, args) == list(bench.CONTENDERS)
    assert bench.cell_contenders("gated_mlp", 16, args) == list(bench.CONTENDERS)
    assert bench.cell_contenders("attention", 8, bench.parse_args([])) == list(bench.CONTENDERS)
    with pytest.raises(SystemExit):
        bench.parse_args(["--large-attention-contenders", "eager,flash"])
