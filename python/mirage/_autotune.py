"""GPU autotuning of the search's candidates: compile them in parallel, time them with CUDA
graphs on rotated random inputs, time the close ones again in turns, and pick the fastest."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from . import _cuda, _progress

if TYPE_CHECKING:
    from .kernel import KNGraph


#: Candidates verified as stable when a GPU profiles them (in the search's check order).
#: RMSNorm+Linear 4096x6144 at b=1 once needed more than 48: its fastest form then (128 blocks,
#: 128-wide K tiles) was 49th-56th in that order, the cost model charging its 32 loop steps as
#: a chain (its fastest now, 96 blocks of 64 columns, ranks in the first few).
_GPU_TOP_N = 64
#: Candidates compiled and timed on a GPU: every one verified there, with the twins the
#: search adds beside the first (co-resident and warpgroup forms), the first 128 in all. The cost
#: model ranks attention forms roughly (measured attention winners sat up to 26th of 28-38
#: candidates), so the timings decide among all of them.
PROFILE_TOP_N = 2 * _GPU_TOP_N


def _cuda_device(backend: str) -> tuple[int | None, str]:
    """The CUDA device to profile on, or None with the reason."""
    if backend != "cuda":
        return None, f"backend={backend!r}"
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    why = _cuda.unavailable_reason()
    if why is not None:
        return None, why
    from . import get_gpu_device_id

    return get_gpu_device_id(), ""


def _device_smem_limit(backend: str) -> int | None:
    """The search's tile budget for the CUDA device candidates will run on, if any (the
    search's default limit applies otherwise): three quarters of the device's opt-in shared
    memory per block, because the search counts tiles in their dtype while the generated kernels keep
    computed tiles in fp32 and pad input rows (a candidate over the real limit would fail to
    compile and be skipped)."""
    device, _ = _cuda_device(backend)
    if device is None:
        return None
    import torch

    props = torch.cuda.get_device_properties(device)
    optin = int(getattr(props, "shared_memory_per_block_optin", 0))
    return optin * 3 // 4 or None


def _random_inputs(graph: KNGraph, device: int, seed: int = 0) -> list[Any]:
    import torch

    gen = torch.Generator(device=f"cuda:{device}").manual_seed(seed)
    out = []
    for t in graph.inputs:
        x = torch.randn(*t.dims, generator=gen, device=f"cuda:{device}", dtype=torch.float32)
        out.append((x * 0.5).to(t.dtype.to_torch()))
    return out


def _input_sets(graph: KNGraph, device: int) -> list[list[Any]]:
    """Input sets that the timing rotates through: together more than three times the L2
    cache (2 to 64 sets), so that every launch reads its operands from device memory, as a
    model's weights are read, rather than from a cache warmed by the previous launch."""
    import torch

    first = _random_inputs(graph, device)
    nbytes = sum(x.numel() * x.element_size() for x in first)
    l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20))
    n = min(64, max(2, math.ceil(3 * l2 / max(nbytes, 1)) + 1))
    return [first] + [_random_inputs(graph, device, seed) for seed in range(1, n)]


#: A candidate whose first timed replay is this many times slower than the fastest so far
#: is not timed further (`_time_one`'s ``bound``).
_EARLY_STOP = 2.0
#: Candidates timed within this fraction of the fastest (at most `_FINALISTS` of them) are
#: timed `_FINAL_ROUNDS` more times, in turns, and the fastest median wins: one pass over 64
#: candidates one after another let MHA b=16 on the H200 pick a form 3 us slower than another
#: it had timed (128.4 against 125.3 us in bench timing; docs/tuning.md).
_FINALIST_SPREAD = 0.05
_FINALISTS = 4
_FINAL_ROUNDS = 3
#: Most seconds of timed replays one timing of a candidate takes beyond its first replay,
#: whatever ``profile_iters`` asks (at least three replays): 1000 launches of a 600 µs
#: candidate took 0.6 s, and a region of 128 such candidates 80 s.
_TIMED_SECONDS = 0.025
_MIN_REPLAYS = 3


def _replays_within(reps: int, first_s: float) -> int:
    """How many of ``reps`` timed replays to run when the first took ``first_s`` seconds:
    those that fit `_TIMED_SECONDS`, at least `_MIN_REPLAYS` (never more than ``reps``)."""
    fit = math.ceil(_TIMED_SECONDS / first_s) if first_s > 0 else reps
    return min(reps, max(_MIN_REPLAYS, fit))


def _finalists(timings: Mapping[str, float]) -> list[str]:
    """The hashes timed within `_FINALIST_SPREAD` of the fastest, fastest first, at most
    `_FINALISTS`; none where only one is that close."""
    if not timings:
        return []
    fastest = min(timings.values())
    close = sorted((t, h) for h, t in timings.items() if t <= fastest * (1 + _FINALIST_SPREAD))
    return [h for _, h in close[:_FINALISTS]] if len(close) > 1 else []


class _NonFinite(RuntimeError):
    """A profiled candidate's outputs were not all finite."""


def _time_one(
    exe: Any, sets: list[list[Any]], warmup: int, iters: int, bound: float | None = None
) -> tuple[float, str]:
    """Median microseconds of one launch of ``exe``, rotating through the input ``sets``
    (see `_input_sets`), and how it was timed. Where ``bound`` (microseconds) is given and the
    first timed replay is slower than it, that replay's time is returned at once: a candidate
    far behind the fastest so far is not worth ``iters`` more launches."""
    import torch

    inputs = sets[0] if sets else []
    device = inputs[0].device if inputs else torch.device("cuda", exe.device)
    # Outputs start as NaN (floating point): an element a kernel leaves unwritten stays so.
    outs = [
        torch.empty_strided(tuple(d), tuple(s), dtype=getattr(torch, dt), device=device)
        for d, s, dt in exe.output_specs
    ]
    for o in outs:
        if o.is_floating_point():
            o.fill_(float("nan"))
    nbytes = exe.workspace_bytes
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes > 0 else None
    ins = [[x.data_ptr() for x in xs] for xs in sets] or [[]]
    ptrs = [o.data_ptr() for o in outs]
    wptr = ws.data_ptr() if ws is not None else 0

    def launch(i: int = 0) -> None:
        exe.launch(ins[i % len(ins)], ptrs, wptr, torch.cuda.current_stream(device).cuda_stream)

    with torch.cuda.device(device):
        for i in range(max(warmup, len(ins))):
            launch(i)
        torch.cuda.synchronize(device)
        # A candidate verified equivalent must still give finite outputs on these O(1)
        # inputs: one that does not (an overflow, a race, an unwritten element) is not timed.
        for k, o in enumerate(outs):
            if o.is_floating_point() and not bool(torch.isfinite(o).all()):
                raise _NonFinite(f"output {k} has inf or NaN on random inputs")
        inner = max(1, min(iters, 20), len(ins))
        reps = max(1, math.ceil(iters / inner))
        graph = None
        try:
            cg = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cg):
                for i in range(inner):
                    launch(i)
            graph = cg
            graph.replay()
            torch.cuda.synchronize(device)
        except RuntimeError:  # capture unsupported here: time plain launches
            torch.cuda.synchronize(device)
            graph = None
        times: list[float] = []
        rep = 0
        while rep < reps:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            if graph is not None:
                graph.replay()
            else:
                for i in range(inner):
                    launch(i)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / inner)
            if rep == 0:
                if bound is not None and times[0] > bound:
                    return times[0], "stopped early"
                reps = _replays_within(reps, times[0] * inner * 1e-6)
            rep += 1
    return statistics.median(times), "cuda graph" if graph is not None else "launches"


def _profile(
    graphs: list[KNGraph],
    hashes: list[str],
    device: int,
    warmup: int,
    iters: int,
    verbose: bool,
) -> tuple[int | None, dict[str, float], dict[str, str], dict[str, float], list[str]]:
    """Compiles ``graphs`` in parallel and times them; returns (index of the fastest, median
    microseconds per hash, skip reason per hash, wall seconds per phase, the finalists timed
    again)."""

    def build(g: KNGraph) -> Any:
        return _cuda.executable(g, device)

    t0 = time.perf_counter()
    exes: list[Any] = []
    skipped: dict[str, str] = {}
    rep = _progress.current()
    rep.stage("compile", total=len(graphs))
    with ThreadPoolExecutor(max_workers=max(1, min(len(graphs), os.cpu_count() or 1))) as pool:
        futures = [pool.submit(build, g) for g in graphs]
        for h, fut in zip(hashes, futures):
            try:
                exes.append(fut.result())
            except (RuntimeError, ValueError) as e:  # NVRTC error, shared memory, unsupported
                exes.append(None)
                skipped[h] = str(e).splitlines()[0] if str(e) else type(e).__name__
            rep.advance(info=f"{len(skipped)} failed" if skipped else "")
    t1 = time.perf_counter()
    rep.stage("profile", total=sum(e is not None for e in exes))
    sets = _input_sets(graphs[0], device) if graphs else []
    t2 = time.perf_counter()
    timings: dict[str, float] = {}
    best: int | None = None
    for i, (h, exe) in enumerate(zip(hashes, exes)):
        if exe is None:
            if verbose:
                _progress.say(f"[mirage] candidate {i} ({h[:12]}): skipped: {skipped[h]}")
            continue
        bound = None if best is None else _EARLY_STOP * timings[hashes[best]]
        try:
            us, how = _time_one(exe, sets, warmup, iters, bound)
        except RuntimeError as e:
            why = "wrong output" if isinstance(e, _NonFinite) else "launch failed"
            skipped[h] = f"{why}: {e}"
            rep.advance()
            if verbose:
                _progress.say(f"[mirage] candidate {i} ({h[:12]}): skipped: {skipped[h]}")
            continue
        timings[h] = us
        if verbose:
            _progress.say(f"[mirage] candidate {i} ({h[:12]}): {us:.2f} us ({how})")
        if best is None or us < timings[hashes[best]]:
            best = i
        rep.advance(info=f"fastest {timings[hashes[best]]:.2f} us")
    # The close ones again, in turns (each round starting one further), so that a drift of
    # the GPU's clocks over the pass does not pick among them.
    finals = _finalists(timings)
    samples = {h: [timings[h]] for h in finals}
    if finals:
        rep.update(total=(rep.total or 0) + len(finals) * _FINAL_ROUNDS, info="the finalists")
    for r in range(_FINAL_ROUNDS if finals else 0):
        for h in finals[r % len(finals) :] + finals[: r % len(finals)]:
            try:
                samples[h].append(_time_one(exes[hashes.index(h)], sets, warmup, iters, None)[0])
            except RuntimeError:
                pass  # timed once already; its first timing stands
            rep.advance()
    for h, xs in samples.items():
        timings[h] = statistics.median(xs)
    if finals:
        best = hashes.index(min(finals, key=timings.__getitem__))
        if verbose:
            _progress.say(
                "[mirage] finalists (median of "
                + ", ".join(f"{h[:12]} {timings[h]:.2f} us" for h in finals)
                + f"): candidate {best}"
            )
    rep.end()
    phases = {"compile": t1 - t0, "inputs": t2 - t1, "timing": time.perf_counter() - t2}
    return best, timings, skipped, phases, finals
