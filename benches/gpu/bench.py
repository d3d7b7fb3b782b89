"""Side-by-side GPU benchmark: the µGraph ``superoptimize`` returns vs PyTorch eager,
torch.compile, SDPA (its own choice of backend, and each of flash, memory-efficient and cuDNN
forced) and compiled SDPA, on the paper's fp16 workloads (docs/reference.md: workloads,
baselines).

Per workload and batch, in one run:

1. Our program is built with the public API (``mi.new_kernel_graph()``, ``matmul``,
   ``softmax``, ``rms_norm``, ...) and ``best = g.superoptimize(backend="cuda", ...)`` is
   called (wall time recorded; results come from the on-disk cache when an identical search ran
   before: reported as ``cached``). The graph it returns is the one that is checked and timed.
2. Correctness first: fresh random fp16 inputs scaled so that outputs are O(1); every
   contender's output (ours included) is compared with a float64 torch reference on two input
   sets, ``||out - ref|| / ||ref|| < 1e-2``. A contender that fails is reported and never counts
   as the best; a cell where ours fails is left out of the geometric mean.
3. Timing, identical for every contender: R input sets (R such that the inputs of all sets
   exceed 3x the L2 cache, 2 <= R <= 64; SDPA's keys are stored (B, h, seq, d), transposed once
   outside the timed region), a warm-up call on every set, then ONE CUDA graph that calls the
   contender on each set in sequence, in whole passes over the sets, C >= 16 calls in all (the
   replay's own launch cost is not charged to a few calls); the graph is replayed (warm-up
   replays, then each replay timed with CUDA events); per-call latency = replay time / C; the
   median is reported (µs).
   Ours is called as ``best(inputs=[...])`` (outputs allocated by torch, launched on torch's
   current stream), so the same capture applies to it.
4. Floor = max(bytes / copy bandwidth, flops / matmul rate): bytes = all inputs + outputs once,
   flops = 2*M*N*K per matmul; both rates are measured in the same run (device-to-device copy of
   a 1 GiB fp16 tensor counting read + write bytes; an 8192^3 fp16 matmul), CUDA-graph timed.

The table comes last (speedup = best contender / ours; > 1 means ours is faster)::

    PYTHONPATH=/tmp/mi python benches/gpu/bench.py --write-md BENCHMARKS.md
    python benches/gpu/bench.py --quick --only gqa,gated_mlp         # b=1, fewer replays
    python benches/gpu/bench.py --json /tmp/bench.json --resume      # continue a cut-off run

A full run (9 workloads x 3 batches, torch.compile with max-autotune) takes over 10 minutes on
an H100; to stay under a per-command limit, run ``--batches 1 --json F``, then ``--batches 8
--json F --resume`` and ``--batches 16 --json F --resume --write-md BENCHMARKS.md`` (the
table covers every cell in F; the copy and matmul rates are re-measured in each run). Or run
the parts with ``benches/gpu/table.sh`` (JSON, log and the saved winners a part) and merge
their JSON files with ``benches/gpu/merge_tables.py``, which keeps each part's rates.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mirage as mi
import torch
import torch.nn.functional as F

TOL = 1e-2
MD_BEGIN = "<!-- bench:begin -->"
MD_END = "<!-- bench:end -->"
COMMAND = "PYTHONPATH=/tmp/mi python benches/gpu/bench.py --write-md BENCHMARKS.md"
#: SDPA contenders with one backend forced (``torch.nn.attention.sdpa_kernel``), by the name
#: of their ``SDPBackend``; a backend that refuses the shape is reported as n/a.
SDPA_BACKENDS = {
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
}
#: Contender columns of the table, in order (ours is separate).
CONTENDERS = ("eager", "compile", "sdpa", "compile_sdpa", *SDPA_BACKENDS)
SHORT = {
    "eager": "eager",
    "compile": "compile",
    "sdpa": "sdpa",
    "compile_sdpa": "c.sdpa",
    "sdpa_flash": "flash",
    "sdpa_efficient": "effic.",
    "sdpa_cudnn": "cudnn",
}
COMPILE_MODE = "max-autotune-no-cudagraphs"
MIN_SETS, MAX_SETS = 2, 64
MIN_CALLS = 16  # calls per timed CUDA graph: whole passes over the input sets
DEFAULT_L2 = 50 * 1024 * 1024

Dims = tuple[int, ...]
TensorFn = Callable[..., torch.Tensor]


# ------------------------------------------------------------------ workloads
@dataclass(frozen=True)
class Workload:
    """One benchmark row family: ``dims(b)`` gives the input shapes at batch ``b``."""

    name: str
    kind: str  # attention | qknorm_attention | rmsnorm_linear | lora | gated_mlp | ntrans
    config: str | None  # superoptimize preset
    dims: Callable[[int], list[Dims]]


def _attn(bh: int, lq: int, d: int, s: int) -> list[Dims]:
    return [(bh, lq, d), (bh, d, s), (bh, s, d)]


WORKLOADS: list[Workload] = [
    Workload("gqa", "attention", "attention", lambda b: _attn(2 * b, 256, 64, 4096)),
    Workload("qknorm_gqa", "qknorm_attention", "attention", lambda b: _attn(2 * b, 256, 64, 4096)),
    Workload("mha", "attention", "attention", lambda b: _attn(32 * b, 16, 64, 4096)),
    Workload("mqa", "attention", "attention", lambda b: _attn(b, 1024, 64, 4096)),
    Workload("rmsnorm_linear", "rmsnorm_linear", "mlp", lambda b: [(2 * b, 4096), (4096, 4096)]),
    Workload(
        "rmsnorm_linear_6144", "rmsnorm_linear", "mlp", lambda b: [(2 * b, 4096), (4096, 6144)]
    ),
    Workload("lora", "lora", "lora", lambda b: [(b, 256), (256, 4096), (256, 16), (16, 4096)]),
    Workload("gated_mlp", "gated_mlp", "mlp", lambda b: [(b, 4096), (4096, 4096), (4096, 4096)]),
    Workload("ntrans", "ntrans", None, lambda b: [(b, 4096)] * 3),
]
ATTENTION_KINDS = ("attention", "qknorm_attention")


def build_program(kind: str, dims: Sequence[Dims]) -> mi.KNGraph:
    """The user program, built op by op with the public kernel-graph API."""
    g = mi.new_kernel_graph()
    xs = [g.new_input(dims=d, dtype=mi.float16) for d in dims]
    if kind in ATTENTION_KINDS:
        q, k, v = xs
        if kind == "qknorm_attention":
            q = g.rms_norm(q, normalized_shape=(dims[0][-1],))
            v = g.rms_norm(v, normalized_shape=(dims[2][-1],))
        out = g.matmul(g.softmax(g.matmul(q, k), dim=-1), v)
    elif kind == "rmsnorm_linear":
        x, w = xs
        out = g.matmul(g.rms_norm(x, normalized_shape=(dims[0][-1],)), w)
    elif kind == "lora":
        x, w, a, b_ = xs
        out = g.add(g.matmul(x, w), g.matmul(g.matmul(x, a), b_))
    elif kind == "gated_mlp":
        x, w1, w2 = xs
        out = g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w2))
    elif kind == "ntrans":
        h, x, alpha = xs
        n = (dims[0][-1],)
        out = g.rms_norm(g.add(x, g.mul(alpha, g.add(g.rms_norm(h, n), x))), n)
    else:
        raise ValueError(f"unknown workload kind {kind!r}")
    g.mark_output(out)
    return g


def matmul_flops(kind: str, dims: Sequence[Dims]) -> int:
    """2*M*N*K summed over the program's matmuls (element-wise work is not counted)."""
    if kind in ATTENTION_KINDS:
        (bh, lq, d), (_, _, s) = dims[0], dims[1]
        return 2 * bh * lq * d * s * 2  # Q @ K and P @ V
    if kind == "rmsnorm_linear":
        (m, k), (_, n) = dims
        return 2 * m * k * n
    if kind == "lora":
        (m, k), (_, n), (_, r), _ = dims
        return 2 * m * k * n + 2 * m * k * r + 2 * m * r * n
    if kind == "gated_mlp":
        (m, k), (_, n), _ = dims
        return 2 * (2 * m * k * n)
    return 0


def output_dims(kind: str, dims: Sequence[Dims]) -> Dims:
    if kind in ATTENTION_KINDS:
        return dims[0]
    if kind in ("rmsnorm_linear", "lora", "gated_mlp"):
        return (dims[0][0], dims[1][1])
    return dims[0]


def numel(d: Dims) -> int:
    return math.prod(d)


def num_sets(set_bytes: int, l2_bytes: int) -> int:
    """Input sets to rotate through: all sets together exceed 3x the L2 cache, within limits."""
    want = 3 * l2_bytes // max(set_bytes, 1) + 1
    return max(MIN_SETS, min(MAX_SETS, want))


def floor_us(nbytes: int, flops: int, copy_bytes_per_s: float, matmul_flops_per_s: float) -> float:
    return max(nbytes / copy_bytes_per_s, flops / matmul_flops_per_s) * 1e6


# ------------------------------------------------------------------- inputs
def inputs_for(
    kind: str, dims: Sequence[Dims], gen: torch.Generator, device: str = "cuda"
) -> list[torch.Tensor]:
    """Fresh random fp16 inputs, scaled so that every output is O(1) (as check_correctness.py;
    for QKNorm the 1/sqrt(d) logit scale our graph lacks is folded into K, because rms(Q)
    undoes any scaling of Q)."""

    def rnd(shape: Dims, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * scale

    if kind in ATTENTION_KINDS:
        d = dims[0][-1]
        if kind == "qknorm_attention":
            xs = [rnd(dims[0]), rnd(dims[1], d**-0.5), rnd(dims[2])]
        else:
            xs = [rnd(dims[0], d**-0.5), rnd(dims[1]), rnd(dims[2])]
    elif kind in ("rmsnorm_linear", "gated_mlp"):
        k = dims[0][-1]
        xs = [rnd(dims[0])] + [rnd(d_, k**-0.5) for d_ in dims[1:]]
    elif kind == "lora":
        k, r = dims[0][-1], dims[2][-1]
        xs = [rnd(dims[0]), rnd(dims[1], k**-0.5), rnd(dims[2], k**-0.5), rnd(dims[3], r**-0.5)]
    else:
        xs = [rnd(d_) for d_ in dims]
    return [x.to(torch.float16) for x in xs]


# --------------------------------------------------------------- references
def rms64(x: torch.Tensor) -> torch.Tensor:
    return x / x.pow(2).mean(-1, keepdim=True).sqrt()


def reference(kind: str, xs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The workload in float64 (our semantics: no softmax scale, rms without weight or eps)."""
    x64 = [x.double() for x in xs]
    if kind in ATTENTION_KINDS:
        q, k, v = x64
        if kind == "qknorm_attention":
            q, v = rms64(q), rms64(v)
        return torch.softmax(q @ k, dim=-1) @ v
    if kind == "rmsnorm_linear":
        return rms64(x64[0]) @ x64[1]
    if kind == "lora":
        x, w, a, b = x64
        return x @ w + (x @ a) @ b
    if kind == "gated_mlp":
        x, w1, w2 = x64
        return F.silu(x @ w1) * (x @ w2)
    h, x, alpha = x64
    return rms64(x + alpha * (rms64(h) + x))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o = out.double()
    if not bool(torch.isfinite(o).all()):
        return math.inf
    return float((o - ref).norm() / ref.norm())


# --------------------------------------------------------------- contenders
def eager_fn(kind: str) -> TensorFn:
    """The workload in plain PyTorch (fp16), taking the inputs in our layout."""
    if kind == "attention":

        def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.softmax(q @ k, dim=-1) @ v

        return attention
    if kind == "qknorm_attention":

        def qknorm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            d = q.shape[-1]
            q, v = F.rms_norm(q, (d,)), F.rms_norm(v, (d,))
            return torch.softmax(q @ k, dim=-1) @ v

        return qknorm_attention
    if kind == "rmsnorm_linear":

        def rmsnorm_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return F.rms_norm(x, (x.shape[-1],)) @ w

        return rmsnorm_linear
    if kind == "lora":

        def lora(
            x: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor
        ) -> torch.Tensor:
            return x @ w + (x @ a) @ b

        return lora
    if kind == "gated_mlp":

        def gated_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
            return F.silu(x @ w1) * (x @ w2)

        return gated_mlp

    def ntrans(h: torch.Tensor, x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        n = (x.shape[-1],)
        return F.rms_norm(x + alpha * (F.rms_norm(h, n) + x), n)

    return ntrans


def sdpa_fn(kind: str) -> TensorFn:
    """Attention through SDPA on (B, 1, L, d) tensors (keys as a KV cache stores them)."""
    if kind == "qknorm_attention":

        def sdpa_qknorm(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            d = q.shape[-1]
            q, v = F.rms_norm(q, (d,)), F.rms_norm(v, (d,))
            return F.scaled_dot_product_attention(q, k, v, scale=1.0)

        return sdpa_qknorm

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, scale=1.0)

    return sdpa


def sdpa_prep(xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Our (Q (B,Lq,d), K (B,d,S), V (B,S,d)) as SDPA's (B,1,Lq,d), (B,1,S,d), (B,1,S,d)."""
    q, k, v = xs
    return [q.unsqueeze(1), k.transpose(1, 2).contiguous().unsqueeze(1), v.unsqueeze(1)]


def sdpa_post(out: torch.Tensor) -> torch.Tensor:
    return out.squeeze(1)


class NotApplicable(RuntimeError):
    """A contender that refuses the cell's shape or dtype (e.g. an SDPA backend forced on a
    head dim it does not support): reported as n/a, not as an error."""


def forced_sdpa(fn: TensorFn, backend: str) -> TensorFn:
    """``fn`` (an SDPA call) run with only ``SDPBackend.<backend>`` allowed. Any error of the
    call is raised as :class:`NotApplicable` with the backend's reasons (its warnings);
    ``measure`` reports it as n/a when it happens on the first call, an error later."""
    import warnings

    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = getattr(SDPBackend, backend)

    def run(*xs: torch.Tensor) -> torch.Tensor:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([chosen]):
                    return fn(*xs)
            except RuntimeError as e:
                why = "; ".join(" ".join(str(w.message).split()) for w in caught)
                raise NotApplicable(f"{backend}: {' '.join(str(e).split())} {why}") from e

    run.__name__ = f"{getattr(fn, '__name__', 'sdpa')}_{backend.lower()}"
    return run


@dataclass
class Contender:
    name: str
    fn: TensorFn  # called as fn(*inputs) -> one output tensor
    prep: Callable[[Sequence[torch.Tensor]], list[torch.Tensor]] | None = None
    post: Callable[[torch.Tensor], torch.Tensor] | None = None


def compiled(fn: TensorFn) -> TensorFn:
    return torch.compile(fn, mode=COMPILE_MODE, dynamic=False)


def contenders_for(kind: str, wanted: Sequence[str]) -> list[Contender]:
    out: list[Contender] = []
    eager = eager_fn(kind)
    if "eager" in wanted:
        out.append(Contender("eager", eager))
    if "compile" in wanted:
        out.append(Contender("compile", compiled(eager)))
    if kind in ATTENTION_KINDS:
        sdpa = sdpa_fn(kind)
        if "sdpa" in wanted:
            out.append(Contender("sdpa", sdpa, sdpa_prep, sdpa_post))
        if "compile_sdpa" in wanted:
            out.append(Contender("compile_sdpa", compiled(sdpa), sdpa_prep, sdpa_post))
        for name, backend in SDPA_BACKENDS.items():
            if name in wanted:
                out.append(Contender(name, forced_sdpa(sdpa, backend), sdpa_prep, sdpa_post))
    return out


# ------------------------------------------------------------------- timing
def time_in_graph(
    fn: Callable[[Sequence[torch.Tensor]], Any],
    sets: Sequence[Sequence[torch.Tensor]],
    warmup_replays: int,
    replays: int,
    min_calls: int = MIN_CALLS,
) -> float:
    """Median µs per call: one CUDA graph calls ``fn`` on each set in sequence, for as many
    whole passes over the sets as make at least ``min_calls`` calls (so that the replay's own
    launch cost, a few µs, is not charged to a few calls); each replay is timed with CUDA
    events and divided by its number of calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch recommends for capture
        for xs in sets:
            fn(xs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    keep: list[Any] = []  # each call's output stays alive: no buffer reuse across calls
    passes = -(-min_calls // len(sets))
    with torch.cuda.graph(graph):
        for _ in range(passes):
            for xs in sets:
                keep.append(fn(xs))
    for _ in range(warmup_replays):
        graph.replay()
    torch.cuda.synchronize()
    times: list[float] = []
    for _ in range(replays):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (passes * len(sets)))
    del graph, keep
    return statistics.median(times)


def calibrate(warmup_replays: int, replays: int) -> dict[str, float]:
    """Copy bandwidth (1 GiB fp16 device-to-device, read + write bytes, the faster of
    ``copy_`` and an element-wise kernel), fp16 matmul rate (8192^3) and the cost of one tiny
    kernel, all timed like the contenders but one call per replay for the rates: each call is
    long enough that the replay's launch cost does not count, and bursts of 16 large matmuls
    ran at lower clocks (674 TFLOP/s in one run; 689-769 one call per replay in five others): a
    looser floor."""
    n = 1 << 29  # 1 GiB of fp16
    src = torch.empty(n, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    # cudaMemcpy (copy_) and an element-wise kernel (neg): the faster one sets the rate
    memcpy_us = time_in_graph(
        lambda xs: xs[1].copy_(xs[0]), [[src, dst]], warmup_replays, replays, min_calls=1
    )
    kernel_us = time_in_graph(
        lambda xs: torch.neg(xs[0], out=xs[1]), [[src, dst]], warmup_replays, replays, min_calls=1
    )
    copy_us = min(memcpy_us, kernel_us)
    del src, dst
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.float16)
    b = torch.randn(m, m, device="cuda", dtype=torch.float16)
    c = torch.empty(m, m, device="cuda", dtype=torch.float16)
    mm_us = time_in_graph(
        lambda xs: torch.matmul(xs[0], xs[1], out=xs[2]),
        [[a, b, c]],
        warmup_replays,
        replays,
        min_calls=1,
    )
    del a, b, c
    tiny = [[torch.zeros(1, device="cuda")] for _ in range(MAX_SETS)]
    launch_us = time_in_graph(lambda xs: xs[0].add_(1.0), tiny, warmup_replays, replays)
    torch.cuda.empty_cache()
    return {
        "copy_memcpy_us": memcpy_us,
        "copy_kernel_us": kernel_us,
        "copy_us": copy_us,
        "copy_GBps": 2 * n * 2 / (copy_us * 1e-6) / 1e9,
        "matmul_us": mm_us,
        "matmul_TFLOPs": 2 * m**3 / (mm_us * 1e-6) / 1e12,
        "tiny_kernel_us": launch_us,
    }


# --------------------------------------------------------------------- cells
def _short_error(e: BaseException, phase: str) -> str:
    text = " ".join(str(e).split())
    return f"{phase}: {type(e).__name__}: {text}"[:400]


def measure(
    name: str,
    fn: TensorFn,
    sets: list[list[torch.Tensor]],
    refs: list[torch.Tensor],
    args: argparse.Namespace,
    prep: Callable[[Sequence[torch.Tensor]], list[torch.Tensor]] | None = None,
    post: Callable[[torch.Tensor], torch.Tensor] | None = None,
    tol: float = TOL,
    check_fn: TensorFn | None = None,
    before_check: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Checks one contender on the first input sets, then times it (see time_in_graph).

    ``check_fn`` (default ``fn``) is what the check calls, ``before_check`` runs before each
    check call (e.g. to poison memory the outputs will come from), and the check passes below
    ``tol``. A :class:`NotApplicable` on the first call is recorded as ``na`` (the reason)."""
    entry: dict[str, Any] = {"name": name}
    phase = "prepare inputs"
    csets: list[list[torch.Tensor]] = []
    try:
        csets = [prep(xs) for xs in sets] if prep is not None else sets
        phase = "first call"
        t0 = time.perf_counter()
        try:
            fn(*csets[0])
        except NotApplicable as e:
            entry["na"] = str(e)[:400]
            entry["ok"] = False
            return entry
        torch.cuda.synchronize()
        entry["first_call_s"] = time.perf_counter() - t0
        phase = "check"
        errs = []
        for xs, ref in zip(csets, refs):
            if before_check is not None:
                before_check()
            out = (check_fn or fn)(*xs)
            errs.append(rel_err(post(out) if post is not None else out, ref))
        entry["err"] = max(errs)
        entry["ok"] = math.isfinite(entry["err"]) and entry["err"] < tol
        phase = "cuda graph capture/replay"
        entry["us"] = time_in_graph(lambda xs: fn(*xs), csets, args.warmup_replays, args.replays)
    except Exception as e:  # noqa: BLE001  (one failing contender must not stop the run)
        entry["error"] = _short_error(e, phase)
        entry.setdefault("ok", False)
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
    finally:
        del csets
    return entry


def cell_contenders(kind: str, b: int, args: argparse.Namespace) -> list[str]:
    """The contenders a cell times: ``--contenders``, or for attention at b > 1
    ``--large-attention-contenders`` where given."""
    if kind in ATTENTION_KINDS and b > 1 and args.large_attention_contenders is not None:
        return list(args.large_attention_contenders)
    return list(args.contenders)


def run_cell(w: Workload, b: int, seed: int, args: argparse.Namespace, l2: int) -> dict[str, Any]:
    dims = w.dims(b)
    odims = output_dims(w.kind, dims)
    set_bytes = sum(2 * numel(d) for d in dims)
    cell: dict[str, Any] = {
        "workload": w.name,
        "batch": b,
        "kind": w.kind,
        "dims": [list(d) for d in dims],
        "out_dims": list(odims),
        "bytes": set_bytes + 2 * numel(odims),
        "flops": matmul_flops(w.kind, dims),
        "sets": num_sets(set_bytes, l2),
        "contenders": {},
    }
    import torch._dynamo

    torch._dynamo.reset()  # fresh compile caches: no dynamic-shape recompiles across cells
    config = w.config if args.config == "auto" else (None if args.config == "none" else args.config)

    # 1. our program, superoptimized
    best: mi.KNGraph | None = None
    t0 = time.perf_counter()
    try:
        g = build_program(w.kind, dims)
        best = g.superoptimize(
            backend="cuda",
            config=config,
            verbose=args.verbose,
            use_cached_graphs=not args.no_cache,
            cache_dir=args.cache_dir,
            time_budget=args.time_budget,
        )
    except Exception as e:  # noqa: BLE001
        cell["search"] = {"error": _short_error(e, "superoptimize")}
    wall = time.perf_counter() - t0
    if best is not None:
        st = best.search_stats or {}
        sel = st.get("selection") or {}
        winner = st.get("winner") or {}
        cell["search"] = {
            "wall_s": wall,
            "source": st.get("source"),
            "cached": st.get("source") != "search",
            "search_elapsed_s": st.get("elapsed"),
            "config": config,
            "selection": sel.get("method"),
            "profiled_us": (sel.get("timings_us") or {}).get(winner.get("hash")),
            "candidates_considered": best.candidates_considered,
            "profile_phase_s": sel.get("phase_seconds"),
            "customized_kernels": winner.get("customized_kernels"),
            "winner_hash": winner.get("hash"),
            "stopped": st.get("stopped"),
        }
        if args.resources:
            cell["resources"] = winner_resources(best)
        if args.save_graphs:
            os.makedirs(args.save_graphs, exist_ok=True)
            name = f"{w.name}_{b}_{(winner.get('hash') or best.hash())[:8]}.json"
            with open(os.path.join(args.save_graphs, name), "w", encoding="utf-8") as f:
                f.write(best.to_json())
    else:
        cell["search"]["wall_s"] = wall

    # 2. inputs and references
    gen = torch.Generator(device="cuda").manual_seed(seed)
    sets = [inputs_for(w.kind, dims, gen) for _ in range(cell["sets"])]
    refs = [reference(w.kind, xs) for xs in sets[: min(2, len(sets))]]

    # 3. ours, then every contender
    if best is not None:
        graph = best

        def ours(*xs: torch.Tensor) -> torch.Tensor:
            return graph(inputs=list(xs))[0]

        cell["ours"] = measure("ours", ours, sets, refs, args)
    else:
        cell["ours"] = {"name": "ours", "ok": False, "error": cell["search"]["error"]}
    report("ours", cell["ours"])
    for c in contenders_for(w.kind, cell_contenders(w.kind, b, args)):
        entry = measure(c.name, c.fn, sets, refs, args, c.prep, c.post)
        cell["contenders"][c.name] = entry
        report(c.name, entry)
    del sets, refs
    torch.cuda.empty_cache()
    return cell


RESOURCE_KEYS = ("name", "block", "registers", "spill_store_bytes", "spill_load_bytes")


def winner_resources(best: mi.KNGraph) -> list[dict[str, Any]] | str:
    """ptxas's report of each of the winner's kernels (registers, spills; ``--resources``),
    printed as one line a kernel; an error's text where the report failed."""
    try:
        res = best.cuda_resources()
    except Exception as e:  # noqa: BLE001
        return _short_error(e, "cuda_resources")
    out = [{k: kern.get(k) for k in RESOURCE_KEYS} for kern in res["kernels"]]
    if "ptxas_log" in res:  # a kernel ptxas's report does not name: keep the log to see why
        out[0]["ptxas_log"] = res["ptxas_log"]
        print(
            "    ptxas's report lacks a kernel; its log:\n" + res["ptxas_log"][-2000:], flush=True
        )
    for r in out:
        print(
            f"    kernel {r['name']}: {r['block'][0]} threads, {r['registers']} registers, "
            f"spills {r['spill_store_bytes']} B stored / {r['spill_load_bytes']} B loaded",
            flush=True,
        )
    return out


def report(name: str, entry: dict[str, Any]) -> None:
    if "na" in entry:
        print(f"    {name:<13} n/a: {entry['na'][:200]}", flush=True)
    elif "us" in entry:
        first = entry.get("first_call_s")
        extra = f", first call {first:.1f} s" if first is not None and first > 1 else ""
        print(
            f"    {name:<13} {entry['us']:9.2f} us  err {entry['err']:.2e} "
            f"{'ok' if entry['ok'] else 'WRONG'}{extra}",
            flush=True,
        )
    else:
        print(f"    {name:<13} ERROR {entry.get('error', '?')}", flush=True)


# -------------------------------------------------------------------- table
def best_contender(cell: dict[str, Any]) -> tuple[str, float] | None:
    """The fastest contender whose output passed the check."""
    timed = [
        (e["us"], n)
        for n, e in cell["contenders"].items()
        if e.get("ok") and e.get("us") is not None
    ]
    if not timed:
        return None
    us, name = min(timed)
    return name, us


def speedup(cell: dict[str, Any]) -> float | None:
    """best contender / ours, when ours passed the check and both were timed."""
    ours = cell.get("ours") or {}
    best = best_contender(cell)
    if best is None or not ours.get("ok") or ours.get("us") is None:
        return None
    return best[1] / ours["us"]


def geomean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def _us(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _fmt_entry(e: dict[str, Any] | None) -> str:
    if e is None:
        return "-"
    if "na" in e:
        return "n/a"
    if e.get("us") is None:
        return "err"
    return _us(e["us"]) if e.get("ok") else f"{_us(e['us'])} (wrong)"


def _fmt_search(s: dict[str, Any]) -> str:
    if "error" in s:
        return "err"
    text = f"{s['wall_s']:.1f}"
    if s.get("cached"):
        prior = s.get("search_elapsed_s")
        text += " cached" + (f" ({prior:.1f})" if isinstance(prior, (int, float)) else "")
    return text


def _fmt_check(e: dict[str, Any]) -> str:
    if e.get("err") is None:
        return "ERROR"
    return f"{'PASS' if e.get('ok') else 'FAIL'} {e['err']:.1e}"


HEADER = [
    "workload",
    "b",
    "ours µs",
    *[SHORT[c] for c in CONTENDERS],
    "best contender µs",
    "speedup",
    "floor µs",
    "floor/ours",
    "search s",
    "correct",
]


def table_rows(cells: Sequence[dict[str, Any]], calib: dict[str, float]) -> list[list[str]]:
    rows = []
    for c in cells:
        ours = c.get("ours") or {}
        best = best_contender(c)
        sp = speedup(c)
        fl = floor_us(
            c["bytes"], c["flops"], calib["copy_GBps"] * 1e9, calib["matmul_TFLOPs"] * 1e12
        )
        ours_us = ours.get("us")
        rows.append(
            [
                c["workload"],
                str(c["batch"]),
                _fmt_entry(ours),
                *[_fmt_entry(c["contenders"].get(n)) for n in CONTENDERS],
                f"{SHORT[best[0]]} {_us(best[1])}" if best else "-",
                f"{sp:.2f}x" if sp is not None else ("FAIL" if ours_us is not None else "-"),
                _us(fl),
                f"{fl / ours_us:.2f}" if ours_us else "-",
                _fmt_search(c.get("search") or {"error": "?"}),
                _fmt_check(ours),
            ]
        )
    return rows


def render_text(rows: Sequence[Sequence[str]], header: Sequence[str] = HEADER) -> str:
    """The rows under ``header`` as aligned plain text."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cols = [r[0].ljust(widths[0])] + [x.rjust(w) for x, w in zip(r[1:], widths[1:])]
        lines.append("  ".join(cols))
    return "\n".join(lines)


def render_markdown_table(rows: Sequence[Sequence[str]], header: Sequence[str] = HEADER) -> str:
    """The rows under ``header`` as a markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def mean_line(cells: Sequence[dict[str, Any]]) -> str:
    """The geometric-mean speedup over ``cells``, and how many cells it leaves out."""
    sps = [s for s in (speedup(c) for c in cells) if s is not None]
    gm = geomean(sps)
    n_fail = sum(1 for c in cells if not (c.get("ours") or {}).get("ok"))
    if gm is None:
        mean = "Geometric-mean speedup: no cell with a passing, timed µGraph and contender"
    else:
        mean = f"Geometric-mean speedup (best contender / ours) over {len(sps)} cells: {gm:.2f}x"
    return mean + (
        f"; {n_fail} cell(s) where ours failed or did not run are left out." if n_fail else "."
    )


def summary_lines(cells: Sequence[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    calib = meta["calibration"]
    device = (
        f"GPU {meta['gpu']}, torch {meta['torch']}, mirage {meta['mirage']}; measured copy "
        f"{calib['copy_GBps']:.0f} GB/s, fp16 matmul {calib['matmul_TFLOPs']:.0f} TFLOP/s, "
        f"one tiny kernel in a CUDA graph {calib['tiny_kernel_us']:.2f} µs."
    )
    return [device, mean_line(cells)]


METHOD = (
    "Method: per cell, our program is built with the public API and superoptimized "
    '(`backend="cuda"`; `search s` is the wall time of that call, `cached` when it came from the '
    "on-disk cache, with the original search time in parentheses); the graph it returns is what "
    "is checked and timed. Correctness first: fresh random fp16 inputs (outputs O(1)), every "
    "output compared with a float64 torch reference on two input sets, "
    "||out - ref|| / ||ref|| < 1e-2 (a failing contender is marked `wrong` and never counts as "
    "best; a cell where ours fails is left out of the mean). Contenders: PyTorch eager "
    f'(`F.rms_norm`, cuBLAS matmul, softmax), `torch.compile(mode="{COMPILE_MODE}")` of it, '
    "and for attention SDPA with keys stored (B, h, seq, d) as a KV cache keeps them (transposed "
    "outside the timed region), its compiled form and SDPA with each of its flash, "
    "memory-efficient and cuDNN backends forced (`n/a` where the backend refuses the shape). "
    "Timing is identical for all, ours "
    "included: R input sets (together more than 3x the L2 cache, 2 <= R <= 64), one CUDA graph "
    "calling the contender on each set in turn, in whole passes over the sets, C >= 16 calls in "
    "all, replayed and timed with CUDA events; per-call latency = replay time / C, median. "
    "Floor = max(bytes / copy rate, flops / matmul rate), bytes = inputs + output once, flops = "
    "2MNK per matmul, rates measured in the same run (1 GiB fp16 device-to-device copy counting "
    "read + write; 8192^3 fp16 matmul). speedup = best contender / ours (> 1: ours faster). Launches: ours go out as programmatic dependents of the "
    "previous kernel in the stream (sm_90; each kernel waits for it before touching memory, so "
    "only the launch and L2 prefetches of its first input tiles overlap the previous call's "
    "drain; a kernel streaming a pipelined loop lets the next one be scheduled once its last "
    "copies are issued); PyTorch launches the contenders' kernels as it always does."
)


def render_markdown(cells: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    rows = table_rows(cells, meta["calibration"])
    parts = [
        (
            f"Measured {meta['date']} on {meta['gpu']} (torch {meta['torch']}, mirage "
            f"{meta['mirage']}), command `{meta['command']}`."
        ),
        "",
        render_markdown_table(rows),
        "",
        "\n\n".join(summary_lines(cells, meta)),
        "",
        METHOD,
    ]
    return "\n".join(parts)


MD_HEADING = "## GPU: superoptimized µGraphs side by side with PyTorch"


def replace_section(
    text: str, body: str, begin: str = MD_BEGIN, end: str = MD_END, heading: str = MD_HEADING
) -> str:
    """``text`` with the part between the markers ``begin`` and ``end`` replaced by ``body``
    (markers and ``heading`` appended when missing)."""
    block = f"{begin}\n{body.rstrip()}\n{end}"
    i = text.find(begin)
    j = text.find(end, i + len(begin)) if i >= 0 else -1
    if i >= 0 and j >= 0:
        return text[:i] + block + text[j + len(end) :]
    if text and not text.endswith("\n"):
        text += "\n"
    if text and not text.endswith("\n\n"):
        text += "\n"
    return text + heading + "\n\n" + block + "\n"


def write_markdown(path: str, body: str, **markers: str) -> None:
    """Replaces the marked section of the file at ``path`` by ``body`` (``markers``: the
    ``begin``, ``end`` and ``heading`` of :func:`replace_section`)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    with open(path, "w", encoding="utf-8") as f:
        f.write(replace_section(text, body, **markers))


# --------------------------------------------------------------------- main
def _names(text: str) -> list[str]:
    """The non-empty names of a comma-separated option value, stripped."""
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Side-by-side GPU benchmark: superoptimized µGraphs vs PyTorch (see the "
        "module docstring for the method)."
    )
    ap.add_argument("--batches", default="1,8,16", help="comma-separated batch sizes")
    ap.add_argument(
        "--only",
        default=None,
        help="comma-separated workloads: " + ",".join(w.name for w in WORKLOADS),
    )
    ap.add_argument("--quick", action="store_true", help="b=1 only, fewer replays")
    ap.add_argument(
        "--replays", type=int, default=None, help="timed replays (default 50, quick 20)"
    )
    ap.add_argument(
        "--warmup-replays", type=int, default=None, help="untimed replays (default 5, quick 3)"
    )
    ap.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help="comma-separated subset of " + ",".join(CONTENDERS),
    )
    ap.add_argument(
        "--large-attention-contenders",
        default=None,
        help="the contenders of attention cells at b > 1 (default: --contenders), e.g. "
        "eager,sdpa,compile_sdpa to leave out torch.compile of the unfused attention there",
    )
    ap.add_argument(
        "--config",
        default="auto",
        choices=["auto", "none", "attention", "mlp", "lora"],
        help="superoptimize config: auto = per workload (attention/mlp/lora/None)",
    )
    ap.add_argument("--time-budget", type=float, default=None, help="search seconds per cell")
    ap.add_argument("--cache-dir", default=None, help="superoptimize cache_dir")
    ap.add_argument("--no-cache", action="store_true", help="use_cached_graphs=False")
    ap.add_argument("--verbose", action="store_true", help="superoptimize(verbose=True)")
    ap.add_argument("--json", default=None, help="write raw results here (after every cell)")
    ap.add_argument(
        "--resume", action="store_true", help="keep the cells already in --json, run the rest"
    )
    ap.add_argument("--write-md", default=None, help="replace the bench section of this file")
    ap.add_argument(
        "--save-graphs", default=None, help="write each cell's chosen µGraph here as JSON"
    )
    ap.add_argument(
        "--resources",
        action="store_true",
        help="record ptxas's registers and spills of each cell's kernels (a compile each)",
    )
    args = ap.parse_args(argv)
    known = {w.name for w in WORKLOADS}
    if args.only:
        args.only = _names(args.only)
        bad = sorted(set(args.only) - known)
        if bad:
            ap.error(f"unknown workloads {bad}; expected some of {sorted(known)}")
    args.contenders = _names(args.contenders)
    if args.large_attention_contenders is not None:
        args.large_attention_contenders = _names(args.large_attention_contenders)
    for given in (args.contenders, args.large_attention_contenders or []):
        bad = sorted(set(given) - set(CONTENDERS))
        if bad:
            ap.error(f"unknown contenders {bad}; expected some of {list(CONTENDERS)}")
    args.batches = [1] if args.quick else [int(x) for x in args.batches.split(",") if x.strip()]
    if args.replays is None:
        args.replays = 20 if args.quick else 50
    if args.warmup_replays is None:
        args.warmup_replays = 3 if args.quick else 5
    if args.resume and not args.json:
        ap.error("--resume needs --json PATH")
    return args


def save_json(path: str, meta: dict[str, Any], cells: Sequence[dict[str, Any]]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "cells": list(cells)}, f, indent=1, default=str)
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.py: no CUDA device", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = int(getattr(props, "L2_cache_size", 0)) or DEFAULT_L2
    argv_text = " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    meta: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "mirage": mi.__version__,
        "date": datetime.date.today().isoformat(),
        "command": f"python benches/gpu/bench.py {argv_text}".strip(),
        "l2_bytes": l2,
        "replays": args.replays,
        "warmup_replays": args.warmup_replays,
        "compile_mode": COMPILE_MODE,
    }
    print(f"device: {meta['gpu']}  torch {meta['torch']}  mirage {meta['mirage']}", flush=True)
    meta["calibration"] = calibrate(args.warmup_replays, max(args.replays, 10))
    cal = meta["calibration"]
    print(
        f"copy {cal['copy_GBps']:.0f} GB/s, matmul {cal['matmul_TFLOPs']:.0f} TFLOP/s, "
        f"tiny kernel {cal['tiny_kernel_us']:.2f} us",
        flush=True,
    )

    cells: list[dict[str, Any]] = []
    if args.resume and os.path.exists(args.json):
        with open(args.json, encoding="utf-8") as f:
            cells = list(json.load(f).get("cells", []))
        print(f"resuming: {len(cells)} cells from {args.json}", flush=True)
    done = {(c["workload"], c["batch"]) for c in cells}
    order = [w.name for w in WORKLOADS]
    for b in args.batches:
        for i, w in enumerate(WORKLOADS):
            if args.only and w.name not in args.only:
                continue
            if (w.name, b) in done:
                continue
            print(f"== {w.name} b={b}", flush=True)
            cell = run_cell(w, b, seed=1000 * (i + 1) + b, args=args, l2=l2)
            s = cell["search"]
            print(f"    search {_fmt_search(s)} s, {cell['sets']} input sets", flush=True)
            cells.append(cell)
            if args.json:
                save_json(args.json, meta, cells)
    cells.sort(
        key=lambda c: (order.index(c["workload"]) if c["workload"] in order else 99, c["batch"])
    )
    if args.json:
        save_json(args.json, meta, cells)

    print()
    print(render_text(table_rows(cells, cal)))
    for line in summary_lines(cells, meta):
        print(line)
    if args.write_md:
        write_markdown(args.write_md, render_markdown(cells, meta))
        print(f"wrote the bench section of {args.write_md}")
    return 0 if all((c.get("ours") or {}).get("ok") for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
