"""The model-shaped GPU benchmark's parts that need no GPU: the published configs, the
program builders at real shapes (construction only) and at scaled-down shapes on the CPU
interpreter against the torch functions, the SDPA layout of GQA, the cell selection, and the
table, floor and geometric-mean helpers on synthetic timings."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from conftest import gpu_script


@pytest.fixture(scope="module")
def models() -> ModuleType:
    return gpu_script("models")  # bench.py's helpers and model_suite.py, imported beside it


@pytest.fixture(scope="module")
def ms(models: ModuleType) -> ModuleType:
    return models.ms


# ------------------------------------------------------------------ configs
#: Published parameter counts (Hugging Face model pages, safetensors totals), in billions.
PUBLISHED_B = {
    "llama3-8b": 8.03,
    "llama3-70b": 70.6,
    "qwen2.5-7b": 7.62,
    "qwen2.5-32b": 32.8,
    "mistral-7b": 7.24,
    "gemma2-9b": 9.24,
    "phi3-mini": 3.82,
    "llama3.2-1b": 1.24,
}


def test_each_config_implies_its_models_published_parameter_count(ms):
    # Hidden, intermediate, head and KV-head sizes together give the model's size: a wrong
    # intermediate size or head count moves it by far more than the 1% allowed.
    assert set(ms.MODELS) == set(PUBLISHED_B)
    for name, cfg in ms.MODELS.items():
        got = cfg.parameter_count() / 1e9
        assert got == pytest.approx(PUBLISHED_B[name], rel=0.01), name


def test_head_counts_and_dims_relate_as_the_published_configs_do(ms):
    for name, cfg in ms.MODELS.items():
        assert cfg.heads % cfg.kv_heads == 0, name  # the GQA group divides the heads
        assert cfg.group * cfg.kv_heads == cfg.heads
        assert cfg.kv_heads <= cfg.heads and cfg.head_dim % 32 == 0
        if name == "gemma2-9b":  # the one config with an explicit head_dim unlike hidden/heads
            assert cfg.head_dim == 256 and cfg.heads * cfg.head_dim == 4096 != cfg.hidden
        else:
            assert cfg.heads * cfg.head_dim == cfg.hidden, name
        assert cfg.intermediate > cfg.hidden and cfg.intermediate % 256 == 0, name
        assert 1e-6 <= cfg.eps <= 1e-5
    groups = {n: c.group for n, c in ms.MODELS.items()}
    assert groups["qwen2.5-7b"] == 7 and groups["qwen2.5-32b"] == 5
    assert groups["phi3-mini"] == 1 and groups["llama3-70b"] == 8


def test_the_default_selection_covers_what_it_promises(ms):
    cells = ms.DEFAULT
    assert 20 <= len(cells) <= 30 and len({c.name for c in cells}) == len(cells)
    assert {c.program for c in cells} == set(ms.PROGRAMS)
    assert {c.model for c in cells} == set(ms.MODELS)
    attn = [c for c in cells if ms.PROGRAMS[c.program].attention]
    assert {c.config.head_dim for c in attn} >= {64, 96, 128, 256}
    assert {c.dtype for c in cells} == set(ms.DTYPES)
    assert {1, 8, 64} <= {c.batch for c in cells}
    params = {c.param for c in cells if c.param is not None}
    assert {1000, 4097, 32000} <= params  # KV lengths that are not powers of two
    assert any(c.config.group not in (1, 2, 4, 8) for c in attn)  # odd GQA groups (5, 7)
    assert all(c in set(ms.full_grid()) for c in cells)


def test_cell_names_round_trip_and_bad_names_are_refused(ms):
    for c in list(ms.DEFAULT) + list(ms.full_grid())[::97]:
        assert ms.parse_cell(c.name) == c
    with pytest.raises(ValueError, match="unknown model"):
        ms.parse_cell("llama9/qkv/b1/fp16")
    with pytest.raises(ValueError, match="takes"):
        ms.parse_cell("llama3-8b/qkv/b1/kv4/fp16")
    with pytest.raises(ValueError, match="takes"):
        ms.parse_cell("llama3-8b/attn_decode/b1/fp16")


# ----------------------------------------------------------------- builders
def _widths(cfg) -> dict[str, int]:
    return {"h": cfg.hidden, "i": cfg.intermediate, "q": cfg.heads * cfg.head_dim}


@pytest.mark.parametrize("i", range(26))
def test_each_default_program_builds_at_its_real_shape(ms, i):
    cell = ms.DEFAULT[i]
    cfg = cell.config
    g = ms.build_program(cell)
    dims = [tuple(t.dims) for t in g.inputs]
    assert all(t.dtype.name == cell.dtype for t in g.inputs)
    assert [tuple(s.dims) for s in ms.input_specs(cell)] == dims
    (out,) = g.outputs
    assert tuple(out.dims) == ms.output_dims(cell) and out.dtype.name == cell.dtype
    b, w = cell.batch, _widths(cfg)
    p = cell.program
    if p == "qkv":
        qkv = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim
        assert dims == [(b, w["h"]), (1, w["h"]), (w["h"], qkv)]  # the weight broadcast
        assert cell.model != "gemma2-9b" or qkv == (16 + 2 * 8) * 256
    elif p in ("attn_decode", "qknorm"):
        bkv, d = b * cfg.kv_heads, cfg.head_dim
        assert dims[:3] == [(bkv, cfg.group, d), (bkv, d, cell.param), (bkv, cell.param, d)]
        assert dims[3:] == ([(1, 1, d)] * 2 if p == "qknorm" else [])
        assert tuple(out.dims) == (bkv, cfg.heads // cfg.kv_heads, d)
    elif p == "attn_prefill":
        bkv, d, t = b * cfg.kv_heads, cfg.head_dim, cell.param
        assert dims == [(bkv, cfg.group * t, d), (bkv, d, t), (bkv, t, d)]
    elif p == "oproj":
        assert dims == [(b, w["q"]), (w["q"], w["h"])]
    elif p == "gate_up":
        assert dims == [(b, w["h"]), (1, w["h"]), (w["h"], w["i"]), (w["h"], w["i"])]
    elif p == "down":
        assert dims == [(b, w["i"]), (w["i"], w["h"])]
    elif p == "mlp":
        assert dims == [(b, w["h"]), (w["h"], w["i"]), (w["h"], w["i"]), (w["i"], w["h"])]
    else:
        assert dims == [(b, w["h"]), (w["h"], w["q"]), (w["h"], cell.param), (cell.param, w["q"])]


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def test_every_default_program_matches_its_torch_function_on_the_cpu_interpreter(ms):
    # Scaled down 16x (sizes, KV and prompt lengths, ranks); float32 graph and inputs.
    errs = {}
    for cell in ms.DEFAULT:
        g = ms.build_program(cell, scale=16, dtype="float32")
        xs = ms.make_inputs(cell, torch.Generator().manual_seed(7), scale=16, dtype="float32")
        (out,) = g(inputs=xs)
        assert tuple(out.shape) == ms.output_dims(cell, scale=16)
        ref = ms.torch_fn(cell)(*[x.double() for x in xs])
        assert float(ref.abs().max()) > 0.05  # outputs are O(1), not vanishing
        errs[cell.name] = _rel(out, ref)
    assert max(errs.values()) < 1e-4, errs


NORM_WEIGHTS = ("w_norm", "w_q", "w_v")


def test_both_norm_weight_forms_compute_the_same(ms):
    # rms_norm(x, weight=w) with w (n,) and mul(rms_norm(x), w) with w (1, .., n).
    for name in ("qwen2.5-7b/gate_up/b1/fp16", "phi3-mini/qknorm/b8/kv1024/bf16"):
        cell = ms.parse_cell(name)
        outs = []
        for form in ms.NORM_WEIGHT_FORMS:
            g = ms.build_program(cell, scale=16, dtype="float32", norm_weight=form)
            gen = torch.Generator().manual_seed(5)
            xs = ms.make_inputs(cell, gen, scale=16, dtype="float32", norm_weight=form)
            specs = ms.input_specs(cell, 16, form)
            norm_w = [tuple(x.shape) for x, sp in zip(xs, specs) if sp.name in NORM_WEIGHTS]
            rank = 1 if form == "keyword" else xs[0].dim()
            assert norm_w and all(len(d) == rank and math.prod(d) == d[-1] for d in norm_w)
            (out,) = g(inputs=xs)
            ref = ms.torch_fn(cell)(*[x.double() for x in xs])
            assert _rel(out, ref) < 1e-5, (name, form)
            outs.append(out)
        assert torch.allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="norm_weight"):
        ms.input_specs(ms.DEFAULT[0], norm_weight="fold")


def test_linear_weight_layout_reads_the_transposed_views_and_computes_the_same(ms):
    # weights="linear": every projection weight is the transposed view of an (out, in) tensor,
    # declared so in the graph; the interpreter gives the torch function's values, and the
    # same draws as the row-major layout (the transposed tensor's values) give the same output.
    for name in (
        "qwen2.5-7b/gate_up/b1/fp16",
        "mistral-7b/lora/b1/rank64/bf16",
        "llama3-8b/mlp/b1/fp16",
    ):
        cell = ms.parse_cell(name)
        specs = ms.input_specs(cell, 16)
        g = ms.build_program(cell, scale=16, dtype="float32", weights="linear")
        xs = ms.make_inputs(
            cell, torch.Generator().manual_seed(3), scale=16, dtype="float32", weights="linear"
        )
        for x, sp in zip(xs, specs):
            assert tuple(x.shape) == sp.dims
            assert x.is_contiguous() != sp.weight, (name, sp.name)
            if sp.weight:
                assert x.stride() == ms.input_strides(sp, "linear") == (1, sp.dims[0])
        (out,) = g(inputs=xs)
        ref = ms.torch_fn(cell)(*[x.double() for x in xs])
        assert _rel(out, ref) < 1e-5, name
        rowmajor = ms.build_program(cell, scale=16, dtype="float32")
        (same,) = rowmajor(inputs=[x.contiguous() for x in xs])
        assert torch.allclose(out, same, rtol=1e-5, atol=1e-6)
    assert any(sp.weight for sp in ms.input_specs(ms.parse_cell("llama3-8b/qkv/b1/fp16")))
    assert not any(
        sp.weight for sp in ms.input_specs(ms.parse_cell("llama3-8b/attn_decode/b8/kv4097/fp16"))
    )
    with pytest.raises(ValueError, match="weights"):
        ms.input_strides(ms.input_specs(ms.DEFAULT[0])[0], "colmajor")


def test_a_wrong_program_is_caught_by_the_same_comparison(ms):
    # The comparison above can fail: the graph of one program against another's function.
    cell = ms.parse_cell("llama3-8b/mlp/b1/fp16")
    other = ms.Cell("gemma2-9b", "mlp", 1, "float16")  # gelu instead of silu
    xs = ms.make_inputs(cell, torch.Generator().manual_seed(1), scale=16, dtype="float32")
    (out,) = ms.build_program(cell, scale=16, dtype="float32")(inputs=xs)
    ref = ms.torch_fn(other)(*[x.double() for x in xs])
    assert _rel(out, ref) > 1e-2


def test_the_full_grid_programs_of_one_model_run_scaled_down(ms):
    # One cell of every program at the largest batch and parameter of the grid.
    for p, prog in ms.PROGRAMS.items():
        param = max(ms.PARAM_VALUES[prog.param]) if prog.param else None
        cell = ms.Cell("qwen2.5-7b", p, 64, "bfloat16", param)
        g = ms.build_program(cell, scale=64, dtype="float32")
        xs = ms.make_inputs(cell, torch.Generator().manual_seed(3), scale=64, dtype="float32")
        (out,) = g(inputs=xs)
        assert _rel(out, ms.torch_fn(cell)(*[x.double() for x in xs])) < 1e-4, cell.name


def test_folded_gqa_is_grouped_query_attention(ms, models):
    # Our layout folds each KV head's query heads into rows; standard GQA (SDPA with
    # enable_gqa on (batch, heads, 1, d)) gives the same numbers, and so does the SDPA
    # contender on our inputs.
    cell = ms.parse_cell("qwen2.5-32b/attn_decode/b8/kv8192/bf16")
    cfg = cell.config.scaled(16)
    xs = ms.make_inputs(cell, torch.Generator().manual_seed(2), scale=16, dtype="float32")
    x64 = [x.double() for x in xs]
    q, k, v = x64
    b, kv, g, d = cell.batch, cfg.kv_heads, cfg.group, cfg.head_dim
    q_std = q.reshape(b, kv * g, 1, d)
    k_std = k.transpose(1, 2).reshape(b, kv, -1, d)
    v_std = v.reshape(b, kv, -1, d)
    std = F.scaled_dot_product_attention(q_std, k_std, v_std, scale=1.0, enable_gqa=True)
    ours = ms.torch_fn(cell)(*x64)
    assert torch.allclose(std.reshape(b * kv, g, d), ours, rtol=1e-10, atol=1e-12)
    via_sdpa = models.sdpa_fn(cell)(*models.sdpa_prep(x64)).squeeze(1)
    assert torch.allclose(via_sdpa, ours, rtol=1e-10, atol=1e-12)
    qk = ms.parse_cell("phi3-mini/qknorm/b8/kv1024/bf16")
    ys = [y.double() for y in ms.make_inputs(qk, torch.Generator(), scale=16, dtype="float32")]
    got = models.sdpa_fn(qk)(*models.sdpa_prep(ys)).squeeze(1)
    assert torch.allclose(got, ms.torch_fn(qk)(*ys), rtol=1e-10, atol=1e-12)


def test_reference_chunks_agree_with_one_piece(ms, models, monkeypatch):
    cell = ms.parse_cell("llama3.2-1b/attn_prefill/b1/tokens512/fp16")
    xs = ms.make_inputs(cell, torch.Generator().manual_seed(4), scale=4, dtype="float32")
    whole = models.reference64(cell, xs)
    monkeypatch.setattr(models, "REF_CHUNK_BYTES", 1)  # one row of the batch dim a chunk
    assert torch.equal(models.reference64(cell, xs), whole)


def test_flops_and_bytes(ms):
    c = ms.parse_cell("llama3-8b/mlp/b1/fp16")
    assert ms.matmul_flops(c) == 3 * 2 * 4096 * 14336
    assert ms.io_bytes(c) == 2 * (4096 + 3 * 4096 * 14336 + 4096)
    a = ms.parse_cell("llama3-8b/attn_decode/b8/kv4097/fp16")
    assert ms.matmul_flops(a) == 2 * 2 * (8 * 32) * 128 * 4097  # 32 query heads a sequence


# ---------------------------------------------------------------- selection
def test_selection_filters_shards_and_limits(models, ms):
    sel = models.parse_args(["--models", "gemma2-9b,phi3-mini", "--dtypes", "bf16"]).selected
    assert sel and all(c.model in ("gemma2-9b", "phi3-mini") for c in sel)
    assert all(c.dtype == "bfloat16" for c in sel)
    assert len(sel) == sum(
        1 for c in ms.DEFAULT if c.model in ("gemma2-9b", "phi3-mini") and c.dtype == "bfloat16"
    )
    a = models.parse_args(["--shard", "1/2"]).selected
    b = models.parse_args(["--shard", "2/2"]).selected
    assert sorted(c.name for c in a + b) == sorted(c.name for c in ms.DEFAULT)
    assert abs(len(a) - len(b)) <= 1
    full = models.parse_args(["--grid", "full", "--programs", "lora", "--batches", "16"])
    assert len(full.selected) == len(ms.MODELS) * len(ms.DTYPES) * len(ms.RANKS)
    assert len(models.parse_args(["--grid", "full", "--cells", "5"]).selected) == 5
    one = models.parse_args(["--cell", "mistral-7b/lora/b1/rank64/bf16"]).selected
    assert [c.name for c in one] == ["mistral-7b/lora/b1/rank64/bf16"]
    for bad in (
        ["--models", "gpt5"],
        ["--shard", "3/2"],
        ["--contenders", "tvm"],
        ["--search-config", "{shared_memory_limit: 1}"],
        ["--search-config", "[1]"],
        ["--winners", "/nonexistent/graphs.json"],
    ):
        with pytest.raises(SystemExit):
            models.parse_args(bad)
    limit = models.parse_args(["--search-config", '{"shared_memory_limit": 1024}'])
    assert limit.search_config == {"shared_memory_limit": 1024}


def test_list_needs_no_gpu(models, ms, capsys):
    assert models.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert f"{len(ms.DEFAULT)} cells" in out and "gemma2-9b/attn_decode/b8/kv4096/fp16" in out


def test_profile_iters_and_the_time_budget(models):
    assert models.profile_iters_for(10_000, 0, 1000, 20.0) == 1000  # tiny cell: the cap
    # 1.4 GB at 3 TB/s is ~470 us a launch: 20 ms is ~42 launches
    assert models.profile_iters_for(1_400_000_000, 0, 1000, 20.0) == 42
    assert models.profile_iters_for(10**12, 0, 1000, 20.0) == 20  # the least
    assert not models.should_skip(0.0, 100.0, None, [])
    assert models.should_skip(0.0, 500.0, 520.0, [])  # first estimate 35 s
    assert not models.should_skip(0.0, 500.0, 520.0, [10.0, 12.0, 20.0])  # mean 14 s
    assert models.should_skip(0.0, 500.0, 520.0, [10.0, 12.0, 50.0])  # mean 24 s


# -------------------------------------------------------------------- table
CALIB = {"copy_GBps": 3000.0, "matmul_TFLOPs": 700.0, "matmul_bf16_TFLOPs": 650.0}


def _entry(us: float | None, err: float = 1e-3, ok: bool = True, **more) -> dict:
    e = {"err": err, "ok": ok, **more}
    if us is not None:
        e["us"] = us
    return e


def _cells(models, ms) -> list[dict]:
    decode = models.cell_record(ms.parse_cell("llama3-70b/attn_decode/b1/kv32000/bf16"), 1 << 25)
    decode["ours"] = _entry(60.0)
    decode["search"] = {"wall_s": 12.0, "cached": False}
    decode["contenders"] = {
        "eager": _entry(300.0),
        "sdpa": _entry(90.0),
        "sdpa_flash": _entry(40.0, err=0.5, ok=False),  # faster but wrong: never counts
        "sdpa_cudnn": {"name": "sdpa_cudnn", "ok": False, "na": "refused"},
    }
    prefill = models.cell_record(ms.parse_cell("mistral-7b/attn_prefill/b1/tokens4096/fp16"), 0)
    prefill["ours"] = _entry(500.0)
    prefill["search"] = {"wall_s": 41.0, "cached": False}
    prefill["contenders"] = {"sdpa_flash": _entry(450.0), "eager": _entry(2000.0)}
    mlp = models.cell_record(ms.parse_cell("llama3-8b/mlp/b1/fp16"), 1 << 25)
    mlp["ours"] = _entry(150.0, err=0.2, ok=False)  # ours wrong: left out of the mean
    mlp["search"] = {"wall_s": 9.0, "cached": False}
    mlp["contenders"] = {"compile": _entry(140.0)}
    skipped = models.cell_record(ms.parse_cell("llama3-8b/qkv/b1/fp16"), 1 << 25)
    skipped["skipped"] = "time budget: 500 s of 520 used"
    failed = models.cell_record(ms.parse_cell("qwen2.5-7b/qkv/b64/bf16"), 1 << 25)
    failed["error"] = "cell: OutOfMemoryError"
    return [decode, prefill, mlp, skipped, failed]


def test_table_rows_speedup_floor_and_bound(models, ms):
    cells = _cells(models, ms)
    rows = models.table_rows(cells, CALIB)
    assert all(len(r) == len(models.HEADER) for r in rows)
    col = {h: i for i, h in enumerate(models.HEADER)}
    dec, pre, mlp, skip, fail = rows
    # decode: best passing contender is SDPA (90), not the wrong flash (40); cuDNN n/a
    assert dec[col["best contender µs"]] == "sdpa 90.0" and dec[col["speedup"]] == "1.50x"
    assert dec[col["cudnn"]] == "n/a" and dec[col["flash"]] == "40.0 (wrong)"
    d_bytes = cells[0]["bytes"]
    d_floor = d_bytes / 3000e9 * 1e6
    assert dec[col["bound"]] == "mem" and dec[col["floor µs"]] == f"{d_floor:.1f}"
    assert dec[col["floor/ours"]] == f"{d_floor / 60.0:.2f}"
    # prefill: 275 GFLOP at 700 TFLOP/s (fp16) sets its floor
    p_floor = cells[1]["flops"] / 700e12 * 1e6
    assert pre[col["bound"]] == "mma" and pre[col["floor µs"]] == f"{p_floor:.1f}"
    assert pre[col["speedup"]] == f"{450 / 500:.2f}x" and pre[col["search s"]] == "41.0 (>30)"
    assert mlp[col["speedup"]] == "FAIL" and mlp[col["correct"]].startswith("FAIL")
    assert skip[col["ours µs"]] == "skipped" and fail[col["correct"]] == "ERROR"


def test_bf16_cells_use_the_bf16_matmul_rate(models, ms):
    cell = models.cell_record(ms.parse_cell("llama3-8b/attn_prefill/b1/tokens2048/bf16"), 0)
    fl, mem = models.floor_of(cell, CALIB)
    assert not mem and fl == pytest.approx(cell["flops"] / 650e12 * 1e6)
    fl16, _ = models.floor_of({**cell, "dtype": "float16"}, CALIB)
    assert fl16 == pytest.approx(cell["flops"] / 700e12 * 1e6)


def test_summary_geomean_memory_bound_fraction_and_search_times(models, ms):
    cells = _cells(models, ms)
    meta = {"gpu": "G", "torch": "T", "mirage": "M", "calibration": CALIB}
    lines = models.summary_lines(cells, meta)
    gm = math.sqrt(1.5 * 0.9)  # decode 90/60, prefill 450/500; the failed mlp left out
    assert f"over 2 cells: {gm:.2f}x" in lines[1]
    assert "1 where ours failed" in lines[1] and "1 skipped" in lines[1]
    assert "1 that failed as a whole" in lines[1] and "without a passing" not in lines[1]
    alone = copy.deepcopy(cells[0])
    alone["contenders"] = {"eager": _entry(30.0, err=0.3, ok=False)}
    assert "1 without a passing contender" in models.summary_lines([alone], meta)[1]
    frac = cells[0]["bytes"] / 3000e9 * 1e6 / 60.0
    assert f"Memory-bound cells (1): floor/ours {frac:.2f}-{frac:.2f}" in lines[2]
    assert "median 12.0 s, max 41.0 s (mistral-7b/attn_prefill" in lines[3]
    assert "1 of 3 over the 30 s target" in lines[3]
    md = models.render_markdown(cells, {**meta, "date": "D", "command": "C"})
    assert md.count("\n| ") == len(cells) + 1  # header + one row a cell (after the rule)


def test_merge_keeps_each_runs_rates_and_finished_cells(models, ms):
    cells = _cells(models, ms)
    first = {"meta": {"calibration": CALIB, "command": "a"}, "cells": cells[:3]}
    later_cal = {**CALIB, "copy_GBps": 1500.0}
    redo = copy.deepcopy(cells[0])
    redo["ours"]["us"] = 30.0
    redo_skip = copy.deepcopy(cells[1])
    redo_skip["skipped"] = "time budget"
    second = {"meta": {"calibration": later_cal, "command": "b"}, "cells": [redo, redo_skip]}
    merged, meta = models.merge_runs(json.loads(json.dumps([first, second])))
    by = {c["cell"]: c for c in merged}
    assert by[redo["cell"]]["ours"]["us"] == 30.0  # a later finished cell replaces
    assert by[redo["cell"]]["calibration"]["copy_GBps"] == 1500.0
    assert "skipped" not in by[cells[1]["cell"]]  # a skipped one does not
    assert by[cells[1]["cell"]]["calibration"]["copy_GBps"] == 3000.0
    order = [c.name for c in ms.DEFAULT]
    idx = [order.index(c["cell"]) for c in merged]
    assert idx == sorted(idx) and meta["command"] == "a"


def test_paper_suite_reports_forced_sdpa_backends(models):
    bench = models.bench
    assert bench.CONTENDERS[-3:] == ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn")
    wanted = [n for n in bench.CONTENDERS if "compile" not in n]  # no torch.compile here
    names = [c.name for c in bench.contenders_for("attention", wanted)]
    assert names == ["eager", "sdpa", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn"]
    assert [c.name for c in bench.contenders_for("gated_mlp", wanted)] == ["eager"]
    assert len(bench.HEADER) == 3 + len(bench.CONTENDERS) + 6
    assert bench._fmt_entry({"na": "refused", "ok": False}) == "n/a"
    # On CPU tensors no cuDNN kernel exists: the forced backend refuses, as NotApplicable.
    q = torch.randn(2, 1, 4, 8)
    run = bench.forced_sdpa(bench.sdpa_fn("attention"), "CUDNN_ATTENTION")
    with pytest.raises(bench.NotApplicable, match="CUDNN_ATTENTION"):
        run(q, q, q)
    math_only = bench.forced_sdpa(bench.sdpa_fn("attention"), "MATH")
    assert torch.allclose(math_only(q, q, q), torch.softmax(q @ q.transpose(-1, -2), -1) @ q)


def test_a_refusing_contender_is_recorded_as_na(models, monkeypatch):
    bench = models.bench

    def refuse(*xs):
        raise bench.NotApplicable("FLASH_ATTENTION: head dim 300")

    entry = bench.measure("sdpa_flash", refuse, [[torch.zeros(1)]], [torch.zeros(1)], None)
    assert entry == {"name": "sdpa_flash", "na": "FLASH_ATTENTION: head dim 300", "ok": False}
    cell = {"contenders": {"sdpa_flash": entry, "eager": {"us": 5.0, "ok": True, "err": 0.0}}}
    assert bench.best_contender(cell) == ("eager", 5.0)


# ------------------------------------------------------------- the run loop
class _Graph:
    def to_json(self) -> str:
        return '{"graph": 1}'


def test_the_run_saves_after_every_cell_records_failures_and_skips_past_the_budget(
    models, ms, tmp_path, monkeypatch
):
    # A fake clock: each cell takes 100 s; the budget of 350 s leaves room for three.
    clock = {"t": 0.0}
    monkeypatch.setattr(models.time, "perf_counter", lambda: clock["t"])
    seen_on_disk: list[int] = []
    out = tmp_path / "m.json"

    def fake_run_cell(cell, args, l2):
        if out.exists():
            seen_on_disk.append(len(json.loads(out.read_text())["cells"]))
        clock["t"] += 100.0
        if cell.program == "attn_decode":
            raise RuntimeError("CUDA out of memory")
        rec = models.cell_record(cell, l2)
        rec["ours"] = _entry(10.0)
        rec["contenders"] = {"eager": _entry(20.0)}
        rec["search"] = {"wall_s": 5.0, "cached": False}
        return rec, _Graph()

    monkeypatch.setattr(models, "run_cell", fake_run_cell)
    graphs, md = tmp_path / "g.json", tmp_path / "m.md"
    args = models.parse_args(
        ["--cells", "5", "--time-budget", "350", "--json", str(out), "--md", str(md)]
        + ["--save-graphs", str(graphs)]
    )
    meta = {"gpu": "G", "torch": "T", "mirage": "M", "calibration": CALIB, "date": "D"}
    meta["command"] = "C"
    status = models.run_all(args, meta, 1 << 25, started=0.0)
    assert status == 1  # a cell failed
    assert seen_on_disk == [1, 2]  # the JSON held every finished cell before the next began
    cells = json.loads(out.read_text())["cells"]
    names = [c.name for c in ms.DEFAULT[:5]]
    assert [c["cell"] for c in cells] == names
    assert "error" in cells[1] and "out of memory" in cells[1]["error"]  # attn_decode
    assert [("skipped" in c) for c in cells] == [False, False, False, True, True]
    assert cells[3]["skipped"].startswith("time budget: 300 s")
    assert set(json.loads(graphs.read_text())) == {names[0], names[2]}
    text = md.read_text()
    assert text.count("| skipped |") == 2 and "2 skipped (time budget or interrupted)" in text

    # A second run resumes from the first: only the skipped cells run.
    ran: list[str] = []

    def second(cell, args, l2):
        ran.append(cell.name)
        return fake_run_cell(cell, args, l2)

    monkeypatch.setattr(models, "run_cell", second)
    clock["t"] = 0.0
    args2 = models.parse_args(["--cells", "5", "--resume-from", str(out)])
    assert models.run_all(args2, meta, 1 << 25, started=0.0) == 1
    assert ran == names[3:]

    # Merging the part with itself: one row a cell, in selection order, into a marked section.
    target = tmp_path / "B.md"
    target.write_text("# B\n\n<!-- models:begin -->\nNot measured yet.\n<!-- models:end -->\n")
    assert models.main(["--merge", str(out), str(out), "--write-md", str(target)]) == 0
    text = target.read_text()
    assert "Not measured yet" not in text and text.startswith("# B\n\n<!-- models:begin -->")
    rows = [r for r in text.splitlines() if r.startswith("| ") and "---" not in r]
    assert [r.split(" | ")[0][2:] for r in rows[1:]] == names


def test_a_failing_search_is_recorded_not_raised(models, ms, monkeypatch):
    from mirage.search import SearchError

    def fail(self, **kw):
        assert kw["backend"] == "cuda" and kw["config"] == "attention"
        assert 20 <= kw["profile_iters"] <= 1000
        raise SearchError("superoptimize found no usable µGraph")

    monkeypatch.setattr(models.ms.mi.KNGraph, "superoptimize", fail)
    cell = ms.parse_cell("gemma2-9b/attn_decode/b8/kv4096/fp16")
    rec = models.cell_record(cell, 1 << 25)
    assert models.search(cell, rec, models.parse_args([])) is None
    assert rec["search"]["error"].startswith("superoptimize: SearchError: superoptimize found")
    row = models.table_rows([{**rec, "ours": {"ok": False, "error": "x"}}], CALIB)[0]
    assert row[models.HEADER.index("search s")].startswith("err")
    assert row[models.HEADER.index("correct")] == "ERROR"


# ------------------------------------------------------------------ search structure
#: Program kinds whose fused form is one customized kernel (the norm, its weight, the
#: projections, the activation, the adapter or the online softmax inside one block graph).
FUSED_KINDS = ("qkv", "attn_decode", "attn_prefill", "gate_up", "mlp", "lora")


def _kernel_ops(g: object) -> list[str]:
    ops = json.loads(g.to_json())["graph"]["ops"]
    return [o["kind"]["kind"] for o in ops if o["kind"]["kind"] != "input"]


@pytest.mark.parametrize("kind", FUSED_KINDS)
def test_the_search_finds_each_program_fused_on_the_cpu(ms, kind):
    # The first default cell of each kind, scaled down 16x, in its dtype, with the suite's
    # preset: the search's pick (cost model) is one customized kernel, equivalent by `verify`.
    import mirage as mi

    cell = next(c for c in ms.DEFAULT if c.program == kind)
    g = ms.build_program(cell, scale=16)
    best = g.superoptimize(
        backend="cpu", config=ms.PROGRAMS[kind].config, use_cached_graphs=False, time_budget=60
    )
    assert best.search_stats["source"] == "search", best.search_stats.get("summary")
    assert _kernel_ops(best) == ["customized"], (cell.name, _kernel_ops(best))
    assert mi.verify(g, best).equivalent
    if kind.startswith("attn"):
        # The online softmax (a running row maximum) in every dtype, bf16 included: the form
        # the code generator's attention kernels take.
        (block,) = _block_ops(best)
        assert "reduction_max" in block, (cell.name, block)


def _block_ops(g: object) -> list[list[str]]:
    ops = json.loads(g.to_json())["graph"]["ops"]
    return [
        [b["kind"]["kind"] for b in o["kind"]["graph"]["ops"]]
        for o in ops
        if o["kind"]["kind"] == "customized"
    ]


#: Real-shape cells whose search takes about a second on the CPU: the fused norm + QKV
#: projection (head dims 128 and 256), LoRA at ranks 16 and 64, and an output projection,
#: which stays a predefined matmul.
REAL_SHAPE_CELLS = (
    "llama3-8b/qkv/b1/fp16",
    "gemma2-9b/qkv/b1/bf16",
    "mistral-7b/lora/b1/rank64/bf16",
    "qwen2.5-7b/lora/b8/rank16/fp16",
    "mistral-7b/oproj/b8/fp16",
)


@pytest.mark.parametrize("name", REAL_SHAPE_CELLS)
def test_the_winner_at_the_real_shape_compiles_for_sm80_and_sm90(ms, name, tmp_path):
    # The search's pick at the model's own shapes (cost model), generated and compiled by NVRTC
    # for both architectures: fused programs are one customized kernel, the lone projection a
    # cuBLAS step with no kernel of its own.
    from conftest import nvrtc_or_skip
    from mirage import _cuda

    nvrtc_or_skip()
    cell = ms.parse_cell(name)
    g = ms.build_program(cell)
    best = g.superoptimize(
        backend="cpu", config=ms.PROGRAMS[cell.program].config, cache_dir=tmp_path, time_budget=60
    )
    lone = cell.program == "oproj"
    assert _kernel_ops(best) == ["matmul" if lone else "customized"], _kernel_ops(best)
    for arch in (80, 90):
        _, plan = _cuda.cuda_source(best, arch)
        assert len(plan["gemms"]) == int(lone) and len(plan["kernels"]) == int(not lone), plan
        if lone:
            (gemm,) = plan["gemms"]
            assert (gemm["m"], gemm["n"], gemm["k"]) == (8, cell.config.hidden, cell.config.hidden)
        assert _cuda.compile_cubin(best, arch)[:4] == b"\x7fELF"


#: The model suite's saved winners that BENCHMARKS.md section 7 cites.
SAVED_WINNERS = sorted(
    (Path(__file__).parent.parent / "benches/gpu/results").glob("*-models/m*-graphs.json")
)


def _saved_winners() -> list[tuple[str, str]]:
    out = []
    for f in SAVED_WINNERS:
        for name, text in json.loads(f.read_text()).items():
            out.append((f"{f.parent.name}/{f.stem}:{name}", text))
    return out


SAVED = _saved_winners()


@pytest.mark.parametrize("name,text", SAVED, ids=[n for n, _ in SAVED])
def test_every_saved_winner_compiles_for_sm80_and_sm90(name, text):
    # What the GPU runs chose, re-generated by today's code generator and compiled by NVRTC for
    # both architectures (a kernel form one of them lacks must fall back, never fail).
    import mirage as mi
    from conftest import nvrtc_or_skip
    from mirage import _cuda

    nvrtc_or_skip()
    g = mi.from_json(text)
    for arch in (80, 90):
        assert _cuda.compile_cubin(g, arch)[:4] == b"\x7fELF", (name, arch)


@pytest.mark.parametrize("name", ["llama3-8b/qkv/b1/fp16", "llama3-8b/gate_up/b8/bf16"])
def test_linear_weights_fuse_and_their_tiles_are_copied_transposed(ms, name):
    # The programs with their projection weights as nn.Linear keeps them (the transposed views
    # a torch.compile region passes): the search still fuses the norm and the projections into
    # one customized kernel, whose weight tiles sit transposed in shared memory (`mi::tidx`,
    # filled by cp.async down the columns), and the kernels compile for sm_80 and sm_90.
    import mirage as mi
    from conftest import nvrtc_or_skip
    from mirage import _core, _cuda

    nvrtc_or_skip()
    g = ms.build_program(ms.parse_cell(name), norm_weight="keyword", weights="linear")
    best = g.superoptimize(backend="cpu", config="mlp", use_cached_graphs=False, time_budget=60)
    doc = json.loads(best.to_json())
    kinds = [op["kind"]["kind"] for op in doc.get("graph", doc)["ops"]]
    assert kinds.count("customized") >= 1 and "matmul" not in kinds, kinds
    src, _ = _core.cuda_generate(best._core, 90)
    body = src[src.index('extern "C" __global__') :]  # the kernels, after the runtime header
    assert "mi::tidx<" in body and "mi::cp_async16" in body
    for arch in (80, 90):
        assert _cuda.compile_cubin(best, arch)[:4] == b"\x7fELF", arch
    assert isinstance(best, mi.KNGraph)


def test_a_search_that_returned_the_program_as_given_is_a_fresh_search(models, ms):
    # Every candidate slower than the program itself: the search still ran (its time counts
    # among the fresh searches) and the row says so; a cache hit is left out of the times.
    cells = _cells(models, ms)
    cells[0]["search"] = {"wall_s": 35.0, "cached": False, "source": "as_given"}
    cells[2]["search"] = {"wall_s": 2.0, "cached": True, "source": "cache"}
    rows = models.table_rows(cells, CALIB)
    col = {h: i for i, h in enumerate(models.HEADER)}
    assert rows[0][col["search s"]] == "35.0 (>30, as given)"
    assert rows[2][col["search s"]] == "2.0 cached"
    meta = {"gpu": "G", "torch": "T", "mirage": "M", "calibration": CALIB}
    line = models.summary_lines(cells, meta)[3]
    assert "max 41.0 s" in line and "2 of 2 over the 30 s target" in line


def test_saved_winners_are_timed_without_a_search(models, ms, tmp_path):
    # `--winners FILE`: a cell whose graph the file holds takes it as it is (no search), and
    # its row says so; its time is left out of the search times.
    cell = ms.parse_cell("llama3-70b/oproj/b64/fp16")
    g = ms.build_program(cell, scale=64)
    path = tmp_path / "w.json"
    path.write_text(json.dumps({cell.name: g.to_json()}))
    args = models.parse_args(["--winners", str(path)])
    rec = models.cell_record(cell, 1 << 25)
    best = models.search(cell, rec, args)
    assert best.hash() == g.hash()
    assert rec["search"]["source"] == "saved" and rec["search"]["cached"]
    assert models.saved_winner(args.saved_winners, "llama3-8b/qkv/b1/fp16") is None
    rec["ours"] = _entry(10.0)
    rec["contenders"] = {"eager": _entry(20.0)}
    (row,) = models.table_rows([rec], CALIB)
    assert row[models.HEADER.index("search s")] == "saved"
    meta = {"gpu": "G", "torch": "T", "mirage": "M", "calibration": CALIB}
    assert not any(line.startswith("Search (") for line in models.summary_lines([rec], meta))
