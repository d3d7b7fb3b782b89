"""Model-shaped GPU benchmark: the programs of one decoder layer of published models
(``model_suite.py``: LLaMA-3 8B/70B, Qwen2.5 7B/32B, Mistral 7B, Gemma-2 9B, Phi-3 mini,
LLaMA-3.2 1B) superoptimized, side by side with PyTorch, by the paper suite's method
(``bench.py``, whose timing, floor and table helpers this script imports).

Per cell, in one run:

1. Ours: the program built with the public API, then ``g.superoptimize(backend="cuda",
   config=<the program's preset>)``, fresh unless ``--cached``; the wall time of that call is
   the cell's search time (target: 30 s), split into the search and the GPU profiling of its
   candidates in the JSON. ``profile_iters`` is lowered for large cells so that one
   candidate's timing takes about ``--profile-ms``. A ``SearchError`` or any other failure is
   recorded in the cell; the run goes on.
2. Correctness first: fresh random inputs in the cell's dtype (outputs O(1)), every
   contender's output compared with a float64 torch reference on two input sets,
   ``||out - ref|| / ||ref||`` below 1e-2 (fp16) or 2e-2 (bf16). Ours is checked through
   ``mirage._cuda.run(poison=True)`` (outputs and workspace NaN first); before every check
   call, blocks of torch's caching allocator are filled with NaN and freed, so that the
   contenders' outputs come from poisoned memory too. A failing contender never counts.
3. Contenders: PyTorch eager (the torch function of the program), ``torch.compile`` of it
   (mode ``max-autotune-no-cudagraphs``), and for attention SDPA (its own backend choice) and
   SDPA with each of the flash, memory-efficient and cuDNN backends forced (n/a where the
   backend refuses the shape). The fastest passing one counts.
4. Timing as ``bench.time_in_graph``: rotated input sets (together over 3x the L2 cache), one
   CUDA graph of at least 16 calls, replayed and timed with CUDA events, median per call.
5. Floor = max(bytes / copy rate, flops / matmul rate of the cell's dtype), rates measured at
   the start of the run; a cell is memory-bound when the copy term is the larger.

Results are saved after every cell (``--json``, ``--md``, ``--save-graphs``), so a run cut
off by a time limit keeps what it finished; ``--time-budget`` stops starting cells in time.

    python benches/gpu/models.py --list                                   # the cells, no GPU
    python benches/gpu/models.py --json $OUT/m.json --md $OUT/m.md --save-graphs $OUT/g.json
    python benches/gpu/models.py --shard 1/2 --time-budget 540 --json $OUT/m1.json
    python benches/gpu/models.py --merge m1.json m2.json --write-md BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import statistics
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench
import model_suite as ms
import torch
import torch.nn.functional as F

#: Relative-error bound of the float64 check, by dtype.
TOL = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-4}
#: The search-time target per program (seconds of the whole ``superoptimize`` call).
SEARCH_TARGET_S = 30.0
#: Contender columns, in order.
CONTENDERS = ("eager", "compile", "sdpa", *bench.SDPA_BACKENDS)
MD_BEGIN, MD_END = "<!-- models:begin -->", "<!-- models:end -->"
MD_HEADING = "## 7. Model-shaped suite"
#: Time a cell is assumed to take before any has finished (seconds; search + compile).
FIRST_CELL_ESTIMATE_S = 35.0
#: Float64 attention references are computed in chunks of this many score bytes at most.
REF_CHUNK_BYTES = 1 << 30


# --------------------------------------------------------------- contenders
def sdpa_fn(cell: ms.Cell) -> ms.TensorFn:
    """The program through SDPA on (B, 1, L, d) tensors (keys as a KV cache stores them);
    QK-norm's weighted norms of Q and V before it."""
    eps = ms.graph_eps(cell.config)
    if cell.program == "qknorm":

        def sdpa_qknorm(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, wq: torch.Tensor, wv: torch.Tensor
        ) -> torch.Tensor:
            d = q.shape[-1]
            q = F.rms_norm(q, (d,), weight=wq.reshape(d), eps=eps)
            v = F.rms_norm(v, (d,), weight=wv.reshape(d), eps=eps)
            return F.scaled_dot_product_attention(q, k, v, scale=1.0)

        return sdpa_qknorm

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, scale=1.0)

    return sdpa


def sdpa_prep(xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Our Q (B, Lq, d), K (B, d, S), V (B, S, d) as SDPA's (B, 1, Lq, d), (B, 1, S, d) and
    (B, 1, S, d) (K transposed once, outside the timed region); norm weights unchanged."""
    q, k, v, *rest = xs
    return [q.unsqueeze(1), k.transpose(1, 2).contiguous().unsqueeze(1), v.unsqueeze(1), *rest]


def contenders_for(cell: ms.Cell, wanted: Sequence[str]) -> list[bench.Contender]:
    """The contenders of ``cell`` among ``wanted`` (SDPA ones only for attention)."""
    eager = ms.torch_fn(cell)
    out: list[bench.Contender] = []
    if "eager" in wanted:
        out.append(bench.Contender("eager", eager))
    if "compile" in wanted:
        out.append(bench.Contender("compile", bench.compiled(eager)))
    if ms.PROGRAMS[cell.program].attention:
        sdpa = sdpa_fn(cell)
        if "sdpa" in wanted:
            out.append(bench.Contender("sdpa", sdpa, sdpa_prep, bench.sdpa_post))
        for name, backend in bench.SDPA_BACKENDS.items():
            if name in wanted:
                forced = bench.forced_sdpa(sdpa, backend)
                out.append(bench.Contender(name, forced, sdpa_prep, bench.sdpa_post))
    return out


# -------------------------------------------------------------- correctness
def reference64(cell: ms.Cell, xs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The program in float64 on ``xs``; attention in chunks of its batch dim, so that the
    float64 scores stay under ``REF_CHUNK_BYTES``."""
    fn = ms.torch_fn(cell)
    x64 = [x.double() for x in xs]
    if not ms.PROGRAMS[cell.program].attention:
        return fn(*x64)
    q, k = x64[0], x64[1]
    step = max(1, REF_CHUNK_BYTES // (q.shape[1] * k.shape[2] * 8))
    parts = [fn(*(t[i : i + step] for t in x64[:3]), *x64[3:]) for i in range(0, q.shape[0], step)]
    return torch.cat(parts)


def poison_allocator(nbytes: int) -> None:
    """Empties torch's caching allocator, then fills new blocks of it with NaN (all-ones bytes)
    and frees them, so that the next allocations (one up to ``nbytes``, and small ones) come
    from poisoned memory: an output element a contender leaves unwritten fails the check.
    Best effort: a contender's temporaries may take those blocks before its output does."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    blocks = [torch.empty(max(nbytes, 1 << 21), dtype=torch.uint8, device="cuda")]
    blocks += [torch.empty(1 << 19, dtype=torch.uint8, device="cuda") for _ in range(16)]
    for b in blocks:
        b.fill_(255)
    torch.cuda.synchronize()
    del blocks


# ----------------------------------------------------------------- the cell
def profile_iters_for(nbytes: int, flops: int, cap: int, per_candidate_ms: float) -> int:
    """``superoptimize``'s ``profile_iters`` for a cell: about ``per_candidate_ms`` of timed
    launches a candidate at an H100's rates (3 TB/s, 700 TFLOP/s), between 20 and ``cap``."""
    floor_s = max(nbytes / 3.0e12, flops / 7.0e14, 1e-6)
    return max(20, min(cap, int(per_candidate_ms * 1e-3 / floor_s)))


def cell_record(cell: ms.Cell, l2: int, norm_weight: str = "mul") -> dict[str, Any]:
    """The cell's static description (no GPU needed)."""
    specs = ms.input_specs(cell, norm_weight=norm_weight)
    out = ms.output_dims(cell)
    size = 2 if cell.dtype != "float32" else 4
    in_bytes = sum(size * math.prod(s.dims) for s in specs)
    return {
        "cell": cell.name,
        "model": cell.model,
        "program": cell.program,
        "batch": cell.batch,
        "dtype": cell.dtype,
        "param": cell.param,
        "dims": [list(s.dims) for s in specs],
        "out_dims": list(out),
        "bytes": ms.io_bytes(cell),
        "flops": ms.matmul_flops(cell),
        "sets": bench.num_sets(in_bytes, l2),
        "eps": ms.graph_eps(cell.config),
        "contenders": {},
    }


def saved_winner(saved: Mapping[str, str], name: str) -> Any:
    """The graph saved for cell ``name`` in ``saved`` (a ``--save-graphs`` file's contents),
    or None."""
    import mirage as mi

    text = saved.get(name)
    return None if text is None else mi.from_json(text)


def search(cell: ms.Cell, rec: dict[str, Any], args: argparse.Namespace) -> Any:
    """Superoptimizes the cell's program (or takes its graph from ``--winners``); records the
    search in ``rec["search"]`` and returns the winner (None when the search failed)."""
    if args.winners:
        best = saved_winner(args.saved_winners, cell.name)
        if best is not None:
            rec["search"] = {
                "wall_s": None,
                "source": "saved",
                "cached": True,
                "file": args.winners,
            }
            return best
    iters = profile_iters_for(rec["bytes"], rec["flops"], args.profile_iters, args.profile_ms)
    config: Any = ms.PROGRAMS[cell.program].config
    if args.search_config:
        config = {"preset": config, **args.search_config} if config else args.search_config
    t0 = time.perf_counter()
    try:
        g = ms.build_program(cell, norm_weight=args.norm_weight, weights=args.weights)
        best = g.superoptimize(
            backend="cuda",
            config=config,
            verbose=args.verbose,
            use_cached_graphs=args.cached,
            cache_dir=args.cache_dir,
            time_budget=args.search_budget,
            profile_iters=iters,
        )
    except Exception as e:  # noqa: BLE001  (SearchError or any other: recorded, run goes on)
        rec["search"] = {
            "error": bench._short_error(e, "superoptimize"),
            "wall_s": time.perf_counter() - t0,
            "config": config,
            "profile_iters": iters,
        }
        return None
    wall = time.perf_counter() - t0
    st = best.search_stats or {}
    sel = st.get("selection") or {}
    winner = st.get("winner") or {}
    rec["search"] = {
        "wall_s": wall,
        "over_target": wall > SEARCH_TARGET_S,
        "source": st.get("source"),
        # "as_given": a fresh search whose candidates all ran slower than the program itself.
        "cached": st.get("source") not in ("search", "as_given"),
        "search_elapsed_s": st.get("elapsed"),
        # The every-element check of the returned graph (outside time_budget).
        "confirm_s": st.get("confirm_seconds"),
        "profile_phase_s": sel.get("phase_seconds"),
        "config": config,
        "profile_iters": iters,
        "selection": sel.get("method"),
        # The profiled winner's time (a candidate's, or the program as given's).
        "profiled_us": (sel.get("timings_us") or {}).get(sel.get("winner")),
        "candidates_considered": best.candidates_considered,
        "customized_kernels": winner.get("customized_kernels"),
        "winner_hash": winner.get("hash"),
        "stopped": st.get("stopped"),
    }
    return best


def run_cell(cell: ms.Cell, args: argparse.Namespace, l2: int) -> tuple[dict[str, Any], Any]:
    """Searches, checks and times one cell; returns its record and our winner (or None). A
    failure after the search (e.g. out of memory for the inputs) is recorded as the cell's
    ``error``, its search kept."""
    import torch._dynamo

    rec = cell_record(cell, l2, args.norm_weight)
    torch._dynamo.reset()  # fresh compile caches: no recompiles across cells
    best = search(cell, rec, args)
    try:
        check_and_time(cell, rec, best, args)
    except Exception as e:  # noqa: BLE001  (recorded; the run goes on)
        rec["error"] = bench._short_error(e, "cell")
        print(f"    cell failed: {rec['error']}", flush=True)
    torch.cuda.empty_cache()
    return rec, best


def check_and_time(cell: ms.Cell, rec: dict[str, Any], best: Any, args: argparse.Namespace) -> None:
    """Ours (when the search gave a winner) and every contender on the same rotated input
    sets, checked against float64 first; results into ``rec``."""
    from mirage import _cuda

    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(cell.name.encode()))
    sets = [
        ms.make_inputs(cell, gen, "cuda", norm_weight=args.norm_weight, weights=args.weights)
        for _ in range(rec["sets"])
    ]
    refs = [reference64(cell, xs) for xs in sets[: min(2, len(sets))]]
    tol = TOL[cell.dtype]
    out_bytes = 2 * math.prod(rec["out_dims"])

    def poison() -> None:
        poison_allocator(out_bytes)

    if best is not None:
        graph = best

        def ours(*xs: torch.Tensor) -> torch.Tensor:
            return graph(inputs=list(xs))[0]

        def ours_poisoned(*xs: torch.Tensor) -> torch.Tensor:
            return _cuda.run(graph, list(xs), poison=True)[0]

        rec["ours"] = bench.measure(
            "ours", ours, sets, refs, args, tol=tol, check_fn=ours_poisoned, before_check=poison
        )
    else:
        rec["ours"] = {"name": "ours", "ok": False, "error": rec["search"]["error"]}
    bench.report("ours", rec["ours"])
    for c in contenders_for(cell, cell_contenders(cell, args)):
        entry = bench.measure(
            c.name, c.fn, sets, refs, args, c.prep, c.post, tol=tol, before_check=poison
        )
        rec["contenders"][c.name] = entry
        bench.report(c.name, entry)


def cell_contenders(cell: ms.Cell, args: argparse.Namespace) -> list[str]:
    """``--attention-contenders`` for attention cells where given, else ``--contenders``."""
    if ms.PROGRAMS[cell.program].attention and args.attention_contenders is not None:
        return list(args.attention_contenders)
    return list(args.contenders)


# -------------------------------------------------------------------- table
def matmul_rate(calib: dict[str, float], dtype: str) -> float:
    """The measured matmul rate (FLOP/s) of ``dtype`` (fp16's where no other was measured)."""
    key = "matmul_bf16_TFLOPs" if dtype == "bfloat16" else "matmul_TFLOPs"
    return float(calib.get(key) or calib["matmul_TFLOPs"]) * 1e12


def floor_of(cell: dict[str, Any], calib: dict[str, float]) -> tuple[float, bool]:
    """(floor µs, memory-bound): max of bytes / copy rate and flops / matmul rate."""
    copy = calib["copy_GBps"] * 1e9
    rate = matmul_rate(calib, cell["dtype"])
    mem_s, mm_s = cell["bytes"] / copy, cell["flops"] / rate
    return bench.floor_us(cell["bytes"], cell["flops"], copy, rate), mem_s >= mm_s


HEADER = [
    "cell",
    "ours µs",
    *[bench.SHORT[c] for c in CONTENDERS],
    "best contender µs",
    "speedup",
    "floor µs",
    "bound",
    "floor/ours",
    "search s",
    "correct",
]


def _fmt_search(s: dict[str, Any] | None) -> str:
    if not s:
        return "-"
    if s.get("source") == "saved":
        return "saved"
    text = "err" if "error" in s else f"{s['wall_s']:.1f}"
    if "error" in s and s.get("wall_s") is not None:
        text += f" ({s['wall_s']:.1f})"
    if s.get("cached"):
        text += " cached"
    elif s.get("source") == "as_given":
        text += " (as given)" if s["wall_s"] <= SEARCH_TARGET_S else " (>30, as given)"
    elif s.get("wall_s") is not None and s["wall_s"] > SEARCH_TARGET_S and "error" not in s:
        text += " (>30)"
    return text


def table_rows(cells: Sequence[dict[str, Any]], calib: dict[str, float]) -> list[list[str]]:
    """One row a cell; a cell's own ``calibration`` (merged runs) wins over ``calib``."""
    rows = []
    for c in cells:
        cal = c.get("calibration") or calib
        fl, mem = floor_of(c, cal)
        blank = ["-"] * len(CONTENDERS)
        if "skipped" in c or "error" in c:
            what = "skipped" if "skipped" in c else "error"
            rows.append(
                [c["cell"], what, *blank, "-", "-", bench._us(fl), "mem" if mem else "mma", "-"]
                + [_fmt_search(c.get("search")), what.upper()]
            )
            continue
        ours = c.get("ours") or {}
        best = bench.best_contender(c)
        sp = bench.speedup(c)
        ours_us = ours.get("us")
        rows.append(
            [
                c["cell"],
                bench._fmt_entry(ours),
                *[bench._fmt_entry(c["contenders"].get(n)) for n in CONTENDERS],
                f"{bench.SHORT[best[0]]} {bench._us(best[1])}" if best else "-",
                f"{sp:.2f}x" if sp is not None else ("FAIL" if ours_us is not None else "-"),
                bench._us(fl),
                "mem" if mem else "mma",
                f"{fl / ours_us:.2f}" if ours_us and ours.get("ok") else "-",
                _fmt_search(c.get("search")),
                bench._fmt_check(ours) if "err" in ours else "ERROR",
            ]
        )
    return rows


def memory_bound_fractions(
    cells: Sequence[dict[str, Any]], calib: dict[str, float]
) -> list[tuple[str, float]]:
    """(cell, floor / ours) of every memory-bound cell whose output passed and was timed."""
    out = []
    for c in cells:
        ours = c.get("ours") or {}
        if "skipped" in c or "error" in c or not ours.get("ok") or not ours.get("us"):
            continue
        fl, mem = floor_of(c, c.get("calibration") or calib)
        if mem:
            out.append((c["cell"], fl / ours["us"]))
    return out


def summary_lines(cells: Sequence[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """The device and rates, the geometric mean, the memory-bound cells' fraction of their
    floor and the search times."""
    calib = meta["calibration"]
    eps = "the model's" if meta.get("eps_supported") else "0 (rms_norm takes no eps)"
    lines = [
        (
            f"GPU {meta['gpu']}, torch {meta['torch']}, mirage {meta['mirage']}; measured copy "
            f"{calib['copy_GBps']:.0f} GB/s, fp16 matmul {calib['matmul_TFLOPs']:.0f} TFLOP/s, "
            f"bf16 matmul {calib.get('matmul_bf16_TFLOPs', float('nan')):.0f} TFLOP/s; "
            f"RMSNorm eps {eps}."
        )
    ]
    ran = [c for c in cells if "skipped" not in c and "error" not in c]
    sps = [s for s in (bench.speedup(c) for c in ran) if s is not None]
    gm = bench.geomean(sps)
    n_fail = sum(1 for c in ran if not (c.get("ours") or {}).get("ok"))
    n_alone = sum(
        1 for c in ran if (c.get("ours") or {}).get("ok") and bench.best_contender(c) is None
    )
    n_skip = sum(1 for c in cells if "skipped" in c)
    n_err = sum(1 for c in cells if "error" in c)
    mean = (
        f"Geometric-mean speedup (best contender / ours) over {len(sps)} cells: {gm:.2f}x"
        if gm is not None
        else "Geometric-mean speedup: no cell with a passing, timed µGraph and contender"
    )
    left = [
        f"{n} {what}"
        for n, what in (
            (n_fail, "where ours failed or did not run"),
            (n_alone, "without a passing contender"),
            (n_err, "that failed as a whole"),
            (n_skip, "skipped (time budget or interrupted)"),
        )
        if n
    ]
    lines.append(mean + ("; left out: " + ", ".join(left) + "." if left else "."))
    fr = memory_bound_fractions(cells, calib)
    if fr:
        vals = [f for _, f in fr]
        worst = min(fr, key=lambda x: x[1])
        lines.append(
            f"Memory-bound cells ({len(fr)}): floor/ours {min(vals):.2f}-{max(vals):.2f}, "
            f"median {statistics.median(vals):.2f} (lowest: {worst[0]})."
        )
    walls = [
        (c["cell"], c["search"]["wall_s"])
        for c in cells
        if isinstance(c.get("search"), dict)
        and c["search"].get("wall_s") is not None
        and not c["search"].get("cached")
    ]
    if walls:
        ws = [w for _, w in walls]
        slow = max(walls, key=lambda x: x[1])
        over = sum(1 for w in ws if w > SEARCH_TARGET_S)
        lines.append(
            f"Search (whole superoptimize call, fresh): median {statistics.median(ws):.1f} s, "
            f"max {slow[1]:.1f} s ({slow[0]}); {over} of {len(ws)} over the "
            f"{SEARCH_TARGET_S:.0f} s target."
        )
    return lines


METHOD = (
    "Method: `benches/gpu/models.py` (BENCHMARKS.md section 7). Per cell, the program is built "
    'with the public API and superoptimized (`backend="cuda"`, the program\'s preset; `search s` '
    "is that call's wall time); fp16 cells pass below 1e-2 and bf16 below 2e-2 relative error "
    "against float64 on two input sets, outputs poisoned first; contenders eager, "
    '`torch.compile(mode="max-autotune-no-cudagraphs")` and for attention SDPA and SDPA with '
    "flash, memory-efficient and cuDNN forced (n/a: refused); CUDA-graph replay over rotated "
    "inputs, median; floor = max(bytes / copy rate, flops / matmul rate of the dtype), rates "
    "measured in the same run; `bound` says which term sets it (mem: copy, mma: tensor cores)."
)


def render_markdown(cells: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    rows = table_rows(cells, meta["calibration"])
    return "\n".join(
        [
            f"Measured {meta['date']} on {meta['gpu']}, command `{meta['command']}`.",
            "",
            bench.render_markdown_table(rows, HEADER),
            "",
            "\n\n".join(summary_lines(cells, meta)),
            "",
            METHOD,
        ]
    )


def merge_runs(runs: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The cells of several runs (``--json`` contents, in order), each keeping its run's
    calibration; a later run's finished cell replaces an earlier one of the same name (a
    skipped cell never replaces a finished one). Returns the cells in selection order (the
    default selection first, then by name) and the first run's meta."""
    cells: dict[str, dict[str, Any]] = {}
    for run in runs:
        for c in run["cells"]:
            old = cells.get(c["cell"])
            if old is not None and "skipped" in c and "skipped" not in old:
                continue
            cells[c["cell"]] = {**c, "calibration": run["meta"]["calibration"]}
    order = {c.name: i for i, c in enumerate(ms.DEFAULT)}
    merged = sorted(cells.values(), key=lambda c: (order.get(c["cell"], len(order)), c["cell"]))
    return merged, dict(runs[0]["meta"]) if runs else {}


# --------------------------------------------------------------- arguments
def _names(text: str | None) -> list[str] | None:
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Model-shaped GPU benchmark (see the module docstring for the method)."
    )
    sel = ap.add_argument_group("selection")
    sel.add_argument(
        "--grid",
        choices=["default", "full"],
        default="default",
        help=f"the default selection ({len(ms.DEFAULT)} cells) or the full grid",
    )
    sel.add_argument(
        "--cell",
        action="append",
        default=None,
        help="a cell by name (repeatable), e.g. llama3-8b/attn_decode/b8/kv4097/fp16",
    )
    sel.add_argument("--models", help="comma-separated: " + ",".join(ms.MODELS))
    sel.add_argument("--programs", help="comma-separated: " + ",".join(ms.PROGRAMS))
    sel.add_argument("--batches", help="comma-separated batch sizes")
    sel.add_argument("--dtypes", help="comma-separated: float16,bfloat16 (or fp16,bf16)")
    sel.add_argument("--cells", type=int, default=None, help="at most this many cells")
    sel.add_argument(
        "--shard", default=None, help="I/N: every N-th selected cell from the I-th (1-based)"
    )
    sel.add_argument("--list", action="store_true", help="print the selected cells and exit")
    run = ap.add_argument_group("run")
    run.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="seconds for the whole run: no cell starts when the mean cell time so far "
        "would pass it (the rest are recorded as skipped)",
    )
    run.add_argument(
        "--norm-weight",
        choices=ms.NORM_WEIGHT_FORMS,
        default="mul",
        help="how programs apply RMSNorm weights: mul(rms_norm(x), w) (default) or "
        "rms_norm(x, weight=w), which the search fuses into the same kernel",
    )
    run.add_argument(
        "--weights",
        choices=ms.WEIGHT_LAYOUTS,
        default="rowmajor",
        help="projection weights (in, out) row-major (default), or 'linear': (out, in) as "
        "nn.Linear keeps them, each program reading the transposed view",
    )
    run.add_argument(
        "--search-budget",
        type=float,
        default=None,
        help="superoptimize time_budget (seconds of search a cell)",
    )
    run.add_argument(
        "--search-config",
        default=None,
        help="JSON of superoptimize config keys over the program's preset, e.g. "
        "'{\"shared_memory_limit\": 232448}'",
    )
    run.add_argument(
        "--profile-iters",
        type=int,
        default=1000,
        help="the most profile_iters of superoptimize (lowered for large cells)",
    )
    run.add_argument(
        "--profile-ms",
        type=float,
        default=20.0,
        help="target milliseconds of timed launches a profiled candidate",
    )
    run.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help="comma-separated subset of " + ",".join(CONTENDERS),
    )
    run.add_argument(
        "--attention-contenders",
        default=None,
        help="the contenders of attention cells (default: --contenders)",
    )
    run.add_argument("--replays", type=int, default=None, help="timed replays (default 50)")
    run.add_argument("--warmup-replays", type=int, default=None, help="untimed (default 5)")
    run.add_argument("--quick", action="store_true", help="fewer replays (20, 3 warm-up)")
    run.add_argument("--cached", action="store_true", help="use the on-disk search cache")
    run.add_argument(
        "--winners",
        default=None,
        help="a --save-graphs file: its cells' graphs are timed as they are (no search); "
        "the other cells are searched",
    )
    run.add_argument("--cache-dir", default=None, help="superoptimize cache_dir")
    run.add_argument("--verbose", action="store_true", help="superoptimize(verbose=True)")
    out = ap.add_argument_group("output")
    out.add_argument("--json", default=None, help="raw results, rewritten after every cell")
    out.add_argument("--md", default=None, help="the markdown table, rewritten after every cell")
    out.add_argument(
        "--save-graphs",
        default=None,
        help="a JSON file {cell: winner graph JSON}, rewritten after every cell",
    )
    out.add_argument(
        "--resume-from",
        action="append",
        default=None,
        help="a --json file of an earlier run: its finished cells are kept",
    )
    out.add_argument(
        "--write-md",
        default=None,
        help="replace the model-suite section of this file (e.g. BENCHMARKS.md)",
    )
    out.add_argument(
        "--merge",
        nargs="+",
        default=None,
        help="no run: merge these --json files into one table (with --md/--write-md)",
    )
    args = ap.parse_args(argv)
    return _check_args(ap, args)


def _check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    args.contenders = _names(args.contenders) or []
    args.attention_contenders = _names(args.attention_contenders)
    for given in (args.contenders, args.attention_contenders or []):
        bad = sorted(set(given) - set(CONTENDERS))
        if bad:
            ap.error(f"unknown contenders {bad}; expected some of {list(CONTENDERS)}")
    dtypes = _names(args.dtypes)
    if dtypes is not None:
        alias = {"fp16": "float16", "bf16": "bfloat16"}
        dtypes = [alias.get(d, d) for d in dtypes]
    try:
        batches = None if args.batches is None else [int(b) for b in _names(args.batches) or []]
        if args.cell:
            pool = [ms.parse_cell(n) for n in args.cell]
        else:
            pool = list(ms.DEFAULT) if args.grid == "default" else list(ms.full_grid())
        cells = ms.select(pool, _names(args.models), _names(args.programs), batches, dtypes)
    except ValueError as e:
        ap.error(str(e))
    if args.shard:
        try:
            i, n = (int(x) for x in args.shard.split("/"))
        except ValueError:
            ap.error(f"--shard {args.shard!r} is not I/N")
        if not 1 <= i <= n:
            ap.error(f"--shard {args.shard!r}: need 1 <= I <= N")
        cells = cells[i - 1 :: n]
    if args.cells is not None:
        cells = cells[: max(0, args.cells)]
    args.selected = cells
    if args.search_config is not None:
        try:
            args.search_config = json.loads(args.search_config)
        except json.JSONDecodeError as e:
            ap.error(f"--search-config is not JSON: {e}")
        if not isinstance(args.search_config, dict):
            ap.error(f"--search-config must be a JSON object, got {args.search_config!r}")
    args.saved_winners = {}
    if args.winners is not None:
        try:
            with open(args.winners) as f:
                args.saved_winners = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            ap.error(f"--winners {args.winners}: {e}")
        if not isinstance(args.saved_winners, dict):
            ap.error(f"--winners {args.winners}: not a --save-graphs file (a JSON object)")
    if args.replays is None:
        args.replays = 20 if args.quick else 50
    if args.warmup_replays is None:
        args.warmup_replays = 3 if args.quick else 5
    return args


# --------------------------------------------------------------------- main
def calibrate(warmup: int, replays: int) -> dict[str, float]:
    """``bench.calibrate``'s rates plus the bf16 matmul rate (8192^3, timed the same way)."""
    cal = bench.calibrate(warmup, replays)
    m = 8192
    a, b, c = (torch.randn(m, m, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    us = bench.time_in_graph(
        lambda xs: torch.matmul(xs[0], xs[1], out=xs[2]), [[a, b, c]], warmup, replays, 1
    )
    del a, b, c
    torch.cuda.empty_cache()
    cal["matmul_bf16_us"] = us
    cal["matmul_bf16_TFLOPs"] = 2 * m**3 / (us * 1e-6) / 1e12
    return cal


class Saver:
    """Writes the JSON, markdown and winner graphs after every cell."""

    def __init__(self, args: argparse.Namespace, meta: dict[str, Any]) -> None:
        self.args, self.meta = args, meta
        self.graphs: dict[str, str] = {}

    def save(self, cells: Sequence[dict[str, Any]]) -> None:
        a = self.args
        if a.json:
            bench.save_json(a.json, self.meta, cells)
        if a.md:
            _write_text(a.md, render_markdown(cells, self.meta) + "\n")
        if a.save_graphs:
            _write_text(a.save_graphs, json.dumps(self.graphs, indent=1))


def _write_text(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _earlier_cells(paths: Sequence[str] | None) -> list[dict[str, Any]]:
    runs = []
    for p in paths or ():
        with open(p, encoding="utf-8") as f:
            runs.append(json.load(f))
    cells, _ = merge_runs(runs)
    return [c for c in cells if "skipped" not in c]


def should_skip(
    started: float, now: float, budget: float | None, durations: Sequence[float]
) -> bool:
    """Whether a cell starting ``now`` would likely run past ``budget`` seconds from
    ``started``: a cell is taken to last the mean of the cells so far (``FIRST_CELL_ESTIMATE_S``
    before any)."""
    if budget is None:
        return False
    est = statistics.fmean(durations) if durations else FIRST_CELL_ESTIMATE_S
    return now - started + est > budget


def run_all(args: argparse.Namespace, meta: dict[str, Any], l2: int, started: float) -> int:
    """Runs the selected cells (those not already in ``--resume-from``), saving after each;
    prints the table and summary; 0 when ours passed in every cell that ran."""
    saver = Saver(args, meta)
    cells = _earlier_cells(args.resume_from)
    done = {c["cell"] for c in cells}
    todo = [c for c in args.selected if c.name not in done]
    durations: list[float] = []
    stop: str | None = None
    for cell in todo:
        now = time.perf_counter()
        if stop is None and should_skip(started, now, args.time_budget, durations):
            stop = f"time budget: {now - started:.0f} s of {args.time_budget:.0f} used"
        if stop is not None:
            rec = cell_record(cell, l2, args.norm_weight)
            rec["skipped"] = stop
            cells.append(rec)
            saver.save(cells)
            continue
        print(f"== {cell.name}", flush=True)
        try:
            rec, best = run_cell(cell, args, l2)
            if best is not None and args.save_graphs:
                saver.graphs[cell.name] = best.to_json()
        except KeyboardInterrupt:  # e.g. `timeout -s INT`: keep what finished, report it
            stop = "interrupted"
            print("    interrupted: the remaining cells are recorded as skipped", flush=True)
            rec = cell_record(cell, l2, args.norm_weight)
            rec["skipped"] = stop
        except Exception as e:  # noqa: BLE001  (a failing cell is recorded, the run goes on)
            rec = cell_record(cell, l2, args.norm_weight)
            rec["error"] = bench._short_error(e, "cell")
            print(f"    cell failed: {rec['error']}", flush=True)
            torch.cuda.empty_cache()
        if "skipped" not in rec:
            rec["cell_s"] = time.perf_counter() - now
            durations.append(rec["cell_s"])
            search_s = _fmt_search(rec.get("search"))
            print(f"    search {search_s} s, cell {rec['cell_s']:.0f} s", flush=True)
        cells.append(rec)
        saver.save(cells)
    order = {c.name: i for i, c in enumerate(args.selected)}
    cells.sort(key=lambda c: order.get(c["cell"], len(order)))
    saver.save(cells)
    print()
    print(bench.render_text(table_rows(cells, meta["calibration"]), HEADER))
    for line in summary_lines(cells, meta):
        print(line)
    if args.write_md:
        write_section(args.write_md, render_markdown(cells, meta))
    ran = [c for c in cells if "skipped" not in c]
    return 0 if ran and all((c.get("ours") or {}).get("ok") for c in ran) else 1


def write_section(path: str, body: str) -> None:
    """Replaces the model-suite section (between its markers) of the file at ``path``."""
    bench.write_markdown(path, body, begin=MD_BEGIN, end=MD_END, heading=MD_HEADING)
    print(f"wrote the model-suite section of {path}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        runs = []
        for p in args.merge:
            with open(p, encoding="utf-8") as f:
                runs.append(json.load(f))
        cells, meta = merge_runs(runs)
        meta["command"] = " + ".join(r["meta"]["command"] for r in runs)
        body = render_markdown(cells, meta)
        print(body)
        if args.md:
            _write_text(args.md, body + "\n")
        if args.write_md:
            write_section(args.write_md, body)
        return 0
    if args.list:
        for c in args.selected:
            rec = cell_record(c, bench.DEFAULT_L2)
            print(f"{c.name:<44} {rec['bytes'] / 1e6:9.1f} MB {rec['flops'] / 1e9:10.2f} GFLOP")
        print(f"{len(args.selected)} cells")
        return 0
    started = time.perf_counter()
    if not torch.cuda.is_available():
        print("models.py: no CUDA device", file=sys.stderr)
        return 2
    import mirage as mi

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = int(getattr(props, "L2_cache_size", 0)) or bench.DEFAULT_L2
    argv_text = " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    meta: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "mirage": mi.__version__,
        "date": datetime.date.today().isoformat(),
        "command": f"python benches/gpu/models.py {argv_text}".strip(),
        "l2_bytes": l2,
        "replays": args.replays,
        "warmup_replays": args.warmup_replays,
        "compile_mode": bench.COMPILE_MODE,
        "eps_supported": ms.eps_supported(),
        "norm_weight": args.norm_weight,
        "weights": args.weights,
        "search_target_s": SEARCH_TARGET_S,
        "selected": [c.name for c in args.selected],
    }
    print(
        f"device: {meta['gpu']}  torch {meta['torch']}  mirage {meta['mirage']}; "
        f"{len(args.selected)} cells",
        flush=True,
    )
    meta["calibration"] = calibrate(args.warmup_replays, max(args.replays, 10))
    cal = meta["calibration"]
    print(
        f"copy {cal['copy_GBps']:.0f} GB/s, matmul fp16 {cal['matmul_TFLOPs']:.0f} / bf16 "
        f"{cal['matmul_bf16_TFLOPs']:.0f} TFLOP/s",
        flush=True,
    )
    return run_all(args, meta, l2, started)


if __name__ == "__main__":
    sys.exit(main())
