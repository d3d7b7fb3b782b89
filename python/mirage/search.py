"""``KNGraph.superoptimize``: search equivalent µGraphs, pick the fastest, cache the result.

The search itself is Rust (``mirage._core.search``, run with the GIL released: Ctrl-C cancels
it and raises ``KeyboardInterrupt``). This module runs it and chooses the winner; the keyword
arguments and ``config`` presets are checked in ``_search_args``, ranked candidates are cached
on disk by ``_search_cache`` and timed on a GPU by ``_autotune``:

* on a machine without a usable CUDA device, or with ``backend="cpu"``: the cheapest candidate
  by the static cost model among those that passed verification (numerically unstable ones
  only when nothing else passed, with a warning); it runs on the CPU interpreter;
* with ``backend="cuda"`` and a CUDA device: the top candidates are compiled (in parallel),
  timed with CUDA events on random inputs (``warmup_iters`` launches, then ``profile_iters``
  timed launches replayed in a CUDA graph when capture works, median), and the fastest wins;
* when nothing usable is found: the program as given, with a warning (docs/search.md).

Cache: one JSON file per key in ``cache_dir`` (default ``$MIRAGE_CACHE_DIR/search`` or
``~/.cache/mirage-rs/search``), holding the verified candidates (cheapest first), the
statistics, and per-device profiling winners. The key hashes the graph, the search settings,
the crate version, the extension's build hash (``mirage._core.__build_hash__``) and the
result switches of ``mirage._env``. An entry that cannot be served (unreadable, another
format or build, a candidate whose graph does not parse or match its hash...) is a miss, with
a ``RuntimeWarning`` naming the file and the reason: the graph is searched again and the file
overwritten. See docs/caches.md.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

from . import _core, _cuda, _progress
from ._autotune import (
    _GPU_TOP_N,
    PROFILE_TOP_N,
    _cuda_device,
    _device_smem_limit,
    _profile,
)
from ._search_args import (
    _ARG_RANGES,
    _BACKENDS,
    CONFIG_KEYS,
    CONFIG_RANGES,
    PRESETS,
    _bool,
    _count,
    _dim3,
    _fmap,
    _frange,
    _list_of,
    _map3,
    _path,
    _resolve_config,
    _save_codes,
    _seconds,
    _threads,
)
from ._search_cache import (
    _CACHE_FORMAT,
    _CACHE_SCHEMA,
    _cache_key,
    _load,
    _producer,
    _save,
    _switches_tag,
    default_cache_dir,
)
from .explain import cached_tag, summary
from .kernel import KNGraph

__all__ = [
    "CONFIG_KEYS",
    "CONFIG_RANGES",
    "PRESETS",
    "SearchError",
    "default_cache_dir",
    "search_candidates",
    "superoptimize",
]

PathLike = Union[str, "os.PathLike[str]"]


class SearchError(RuntimeError):
    """The search ran but produced no usable µGraph (the message says why)."""


# ---------------------------------------------------------------- searching
def search_candidates(
    graph: KNGraph,
    settings: Mapping[str, Any],
    *,
    time_budget: float | None = None,
    num_threads: int | None = None,
    verbose: bool = False,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Runs the Rust search on ``graph`` with ``settings`` (keyword arguments of
    ``mirage._core.search``: griddims, blockdims, imaps, omaps, fmaps, franges and the
    CONFIG_KEYS except ``preset``).

    Returns ``{"candidates", "stats", "stopped", "empty_reason"}`` with only the candidates that
    passed verification (``"passed"`` or ``"unstable"``), cheapest first, each holding its graph
    as JSON. ``on_progress`` is called about every 0.2 s with a dict of counters; an exception it
    raises cancels the search and propagates, like ``KeyboardInterrupt`` from Ctrl-C.
    """
    raw = _core.search(
        graph._core,
        time_budget=time_budget,
        num_threads=num_threads,
        verbose=verbose,
        tick=on_progress,
        **dict(settings),
    )
    raw["candidates"] = [
        c for c in raw["candidates"] if c["verification"] in ("passed", "unstable")
    ]
    return raw


def _results(
    graph: KNGraph,
    settings: dict[str, Any],
    checkpoint: str | None,
    folder: str | None,
    use_cached_graphs: bool,
    time_budget: float | None,
    num_threads: int | None,
    verbose: bool,
    reuse: bool = True,
) -> tuple[dict[str, Any], str, str | None]:
    """The search results of ``graph`` with ``settings``: from ``checkpoint`` when given, else
    from the cache (when ``use_cached_graphs``), else searched (and saved there); with
    ``reuse`` False always searched (and saved the same way). Returns the entry, its file and
    where it was loaded from (``"checkpoint"``, ``"cache"`` or None)."""
    graph_hash = graph.hash()
    key = _cache_key(graph_hash, settings)
    if checkpoint is not None:
        path, source = checkpoint, "checkpoint"
        data = _load(path, graph_hash, None) if reuse else None
    else:
        path = os.path.join(folder or default_cache_dir(), f"{key}.json")
        source = "cache"
        data = _load(path, graph_hash, key) if use_cached_graphs and reuse else None
    if data is not None:
        if verbose:
            _progress.say(
                f"[mirage] superoptimize: loaded {len(data['candidates'])} candidates from {path}"
            )
        return data, path, source
    data = _fresh_data(graph, graph_hash, key, settings, time_budget, num_threads, verbose)
    # An interrupted search is not the answer to these settings: only a checkpoint, which
    # the caller named explicitly, keeps it.
    if checkpoint is not None or (use_cached_graphs and data["stopped"] is None):
        _save(path, data)
    return data, path, None


# ------------------------------------------------------------------ choosing
def _eligible(cands: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """Candidates that passed verification, cheapest first; unstable ones only when nothing
    passed (second value True then)."""
    passed = [c for c in cands if c["verification"] == "passed"]
    if passed:
        return passed, False
    return [c for c in cands if c["verification"] == "unstable"], True


# ------------------------------------------------------------------ confirming the winner
def _fresh_data(
    graph: KNGraph,
    graph_hash: str,
    key: str,
    settings: Mapping[str, Any],
    time_budget: float | None,
    num_threads: int | None,
    verbose: bool,
) -> dict[str, Any]:
    """Runs the search and returns its results as a cache entry (see ``_entry_problem``)."""
    rep = _progress.current()
    raw = search_candidates(
        graph,
        settings,
        time_budget=time_budget,
        num_threads=num_threads,
        # The progress display, when on, replaces the search's own verbose line.
        verbose=verbose and not rep.enabled,
        on_progress=rep.search_tick if rep.enabled else None,
    )
    return {
        "format": _CACHE_FORMAT,
        "schema": _CACHE_SCHEMA,
        "key": key,
        **_producer(),
        "graph_hash": graph_hash,
        "settings": dict(settings),
        "candidates": [
            {**{k: v for k, v in c.items() if k != "graph"}, "graph": json.loads(c["graph"])}
            for c in raw["candidates"]
        ],
        "stats": raw["stats"],
        "stopped": raw["stopped"],
        "empty_reason": raw["empty_reason"],
        "profiled": {},
    }


def _confirm(reference: KNGraph, candidate: KNGraph) -> str | None:
    """The every-element finite-field check of a candidate about to be returned (the search
    prunes with sampled elements, whose bound holds only per compared element). None when it
    passes, or when the field check cannot judge the pair (two exponentials on a path: the
    search's float check stands); otherwise why it failed."""
    from .verify import verify

    try:
        v = verify(reference, candidate, float_check=False, coverage="every")
    except ValueError as e:
        return None if "not LAX" in str(e) else str(e)
    return None if v.equivalent else str(v)


def _first_confirmed(
    reference: KNGraph,
    graphs: list[KNGraph],
    cands: list[dict[str, Any]],
    order: list[int],
    verbose: bool,
) -> tuple[int | None, dict[str, Any]]:
    """The first candidate of ``order`` (indices, best first) that passes :func:`_confirm`;
    the ones dropped on the way are warned about. Returns it (None when none passes) and
    ``{"rejected": [hashes], "seconds": wall time}``."""
    t0 = time.perf_counter()
    rejected: list[str] = []
    rep = _progress.current()
    rep.stage("confirm")
    for i in order:
        rep.update(info=f"candidate {i}")
        why = _confirm(reference, graphs[i])
        rep.advance()
        if why is None:
            rep.end()
            if verbose:
                _progress.say(
                    f"[mirage] candidate {i} ({cands[i]['hash'][:12]}): every-element check "
                    f"passed in {time.perf_counter() - t0:.2f} s"
                )
            return i, {"rejected": rejected, "seconds": time.perf_counter() - t0}
        rejected.append(cands[i]["hash"])
        warnings.warn(
            f"superoptimize: candidate {i} ({cands[i]['hash'][:12]}) is not equivalent to the "
            f"input graph on every output element and is dropped: {why}",
            RuntimeWarning,
            stacklevel=5,
        )
    rep.end()
    return None, {"rejected": rejected, "seconds": time.perf_counter() - t0}


#: The timings' key of the program as given (its ops on cuBLAS and the default kernels),
#: timed beside the candidates.
AS_GIVEN = "as-given"


def _profiled_order(
    reference: KNGraph,
    cands: list[dict[str, Any]],
    graphs: list[KNGraph],
    data: dict[str, Any],
    device: int,
    profiling: tuple[int, int],
    save_to: str | None,
    verbose: bool,
) -> tuple[list[int], dict[str, Any]]:
    """Times the top candidates and the program as given on the GPU (or reuses the cached
    timings); returns the candidate indices fastest first (untimed ones after, cheapest first)
    and the selection record; where the program as given ran fastest, no order and a record
    whose ``winner`` is ``AS_GIVEN``."""
    warmup_iters, profile_iters = profiling
    pool = list(range(min(PROFILE_TOP_N, len(cands))))
    hashes = [cands[i]["hash"] for i in pool]
    keys = [*hashes, AS_GIVEN]
    import torch

    dev_key = (
        f"{torch.cuda.get_device_name(device)}|sm{_cuda.default_arch()}|"
        f"{warmup_iters}|{profile_iters}|{','.join(keys)}|{_switches_tag()}"
    )
    prof = data.setdefault("profiled", {}).get(dev_key)
    if prof is not None and prof.get("winner") in keys:
        selection = {"method": "profiled (cached)", **prof}
    else:
        timed = [*(graphs[i] for i in pool), reference]
        best, timings, skipped, phases, finals = _profile(
            timed, keys, device, warmup_iters, profile_iters, verbose
        )
        if best is None:
            warnings.warn(
                "superoptimize: no candidate compiled and ran on the GPU; returning the "
                f"cheapest by the cost model ({skipped})",
                RuntimeWarning,
                stacklevel=5,
            )
            selection = {
                "method": "cost_model",
                "reason": "profiling failed",
                "skipped": skipped,
                "phase_seconds": phases,
            }
            return list(range(len(cands))), selection
        prof = {"winner": keys[best], "timings_us": timings, "skipped": skipped}
        prof["finalists"] = finals
        selection = {"method": "profiled", **prof, "phase_seconds": phases}
        data["profiled"][dev_key] = prof
        if save_to is not None:
            _save(save_to, data)
    if prof["winner"] == AS_GIVEN:
        return [], selection
    timings = prof.get("timings_us", {})
    timed = sorted((i for i in pool if hashes[i] in timings), key=lambda i: timings[hashes[i]])
    first = hashes.index(prof["winner"])
    order = [first] + [i for i in timed if i != first]
    return order + [i for i in range(len(cands)) if i not in order], selection


def _choose(
    reference: KNGraph,
    data: dict[str, Any],
    restricted: Mapping[str, Any],
    backend: str,
    profiling: tuple[int, int],
    save_to: str | None,
    verbose: bool,
) -> (
    tuple[int, list[dict[str, Any]], list[KNGraph], dict[str, Any], int, dict[str, Any], Any] | None
):
    """Picks the winner among ``data``'s candidates (cost model, or GPU timings) and confirms
    it with the every-element check, dropping failures for the next best. Returns (winner,
    candidates, their graphs, selection record, candidates considered, confirm record, CUDA
    device or None; winner -1 where the program as given ran fastest on the GPU), or None when
    no candidate passes the check; with no candidate at all, a SearchError where the user
    ``restricted`` the launch shapes."""
    cands, unstable_only = _eligible(data["candidates"])
    if not cands:
        why = data.get("empty_reason") or "no candidate passed verification"
        if not restricted:
            return None
        hint = f"; the restrictions {restricted} may exclude every µGraph"
        raise SearchError(f"superoptimize found no usable µGraph: {why}{hint}")
    if unstable_only:
        warnings.warn(
            "superoptimize: no candidate is numerically stable in its dtype; returning one that "
            f"is equivalent but may overflow ({cands[0].get('verification_reason')})",
            RuntimeWarning,
            stacklevel=4,
        )
    device, no_gpu = _cuda_device(backend)
    graphs = [KNGraph(_core.KernelGraph.from_json(json.dumps(c["graph"]))) for c in cands]
    if device is None:
        order = list(range(len(cands)))
        selection: dict[str, Any] = {"method": "cost_model", "reason": no_gpu}
        considered = len(cands)
    else:
        order, selection = _profiled_order(
            reference, cands, graphs, data, device, profiling, save_to, verbose
        )
        considered = min(PROFILE_TOP_N, len(cands))
        if selection.get("winner") == AS_GIVEN:
            return (
                -1,
                cands,
                graphs,
                selection,
                considered,
                {"rejected": [], "seconds": 0.0},
                device,
            )
    winner, confirm = _first_confirmed(reference, graphs, cands, order, verbose)
    if winner is None:
        return None
    if confirm["rejected"] and selection["method"].startswith("profiled"):
        selection = {**selection, "winner": cands[winner]["hash"]}
    return winner, cands, graphs, selection, considered, confirm, device


def _restrictions(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The user's launch-shape restrictions among ``settings``."""
    keys = ("griddims", "blockdims", "imaps", "omaps", "fmaps", "franges")
    return {k: v for k, v in settings.items() if k in keys}


def _op_name(kind: Mapping[str, Any]) -> str:
    """An op's name from its JSON kind (``sub`` rather than ``binary``)."""
    op = kind.get("op")
    if isinstance(op, Mapping):
        op = op.get("op")
    return str(op) if isinstance(op, str) else str(kind["kind"])


def _as_given(
    graph: KNGraph, data: Mapping[str, Any], why: str, selection: Mapping[str, Any] | None = None
) -> KNGraph:
    """The program as given (its predefined ops run by the default kernels: correct, not
    fused), with a ``RuntimeWarning`` naming its ops and why no µGraph is returned: none was
    found (``selection`` None: the record says ``as_given``), or the GPU timed the program as
    given fastest (``selection``: that profiling record)."""
    doc = json.loads(graph.to_json())
    ops = [_op_name(o["kind"]) for o in doc["graph"]["ops"] if o["kind"]["kind"] != "input"]
    if selection:
        msg = f"the program as given (ops {ops}) is returned: {why}"
    else:
        msg = (
            f"no fused µGraph for the ops {ops}: {why}; returning the program as given (each "
            "op runs as its own default kernel)"
        )
    warnings.warn(f"superoptimize: {msg}", RuntimeWarning, stacklevel=4)
    result = KNGraph(_core.KernelGraph.from_json(graph.to_json()))
    result.search_stats = {
        **dict(data.get("stats") or {}),
        "source": "as_given",
        "stopped": data.get("stopped"),
        "selection": dict(selection) if selection else {"method": "as_given", "reason": why},
        "winner": None,
        "summary": f"returned the program as given ({len(ops)} ops, unfused): {why}",
    }
    result.candidates_considered = 0
    return result


# ------------------------------------------------------------------ the API
def superoptimize(
    graph: KNGraph,
    imaps: Sequence[Sequence[int]] | None = None,
    omaps: Sequence[Sequence[int]] | None = None,
    griddims: Sequence[Sequence[int]] | None = None,
    blockdims: Sequence[Sequence[int]] | None = None,
    fmaps: Sequence[int] | None = None,
    franges: Sequence[int] | None = None,
    verbose: bool = False,
    config: str | Mapping[str, Any] | None = None,
    backend: str = "cuda",
    warmup_iters: int = 16,
    profile_iters: int = 1000,
    use_graph_dataset: bool = True,
    use_cached_graphs: bool = True,
    save_codes: bool | PathLike = False,
    is_formal_verified: bool = False,
    previous_checkpoint: PathLike | None = None,
    time_budget: float | None = None,
    num_threads: int | None = None,
    cache_dir: PathLike | None = None,
    progress: bool | None = None,
) -> KNGraph:
    """The implementation of :meth:`KNGraph.superoptimize` (see there)."""
    if not isinstance(graph, KNGraph):
        raise TypeError(f"superoptimize: graph must be a KNGraph, got {type(graph).__name__}")
    settings: dict[str, Any] = {}
    for name, value, item, what in (
        ("griddims", griddims, _dim3, "(x, y, z) grid shapes"),
        ("blockdims", blockdims, _dim3, "(x, y, z) block shapes"),
        ("imaps", imaps, _map3, "(x, y, z) input maps"),
        ("omaps", omaps, _map3, "(x, y, z) output maps"),
        ("fmaps", fmaps, _fmap, "for-loop dims"),
        ("franges", franges, _frange, "for-loop ranges"),
    ):
        parsed = _list_of(name, value, item, what)
        if parsed is not None:
            settings[name] = parsed
    verbose = _bool("verbose", verbose)
    _bool("use_graph_dataset", use_graph_dataset)
    use_cached_graphs = _bool("use_cached_graphs", use_cached_graphs)
    _bool("is_formal_verified", is_formal_verified)
    save_codes = _save_codes(save_codes)
    if not isinstance(backend, str):
        raise TypeError(f"superoptimize: backend must be a str, got {backend!r}")
    if backend not in _BACKENDS:
        raise ValueError(
            f"superoptimize: backend {backend!r} is not supported; expected one of {_BACKENDS}"
        )
    warmup_iters = _count("warmup_iters", warmup_iters, *_ARG_RANGES["warmup_iters"])
    profile_iters = _count("profile_iters", profile_iters, *_ARG_RANGES["profile_iters"])
    time_budget = _seconds(time_budget)
    num_threads = None if num_threads is None else _threads(num_threads)
    checkpoint = _path("previous_checkpoint", previous_checkpoint)
    folder = _path("cache_dir", cache_dir)
    # The user's own launch-shape restrictions: with them, finding nothing is an error; a
    # preset's loop ranges only narrow the search, and finding nothing there returns the
    # program as given.
    restricted = _restrictions(settings)
    # The config's settings (a preset's loop ranges among them) are defaults: the explicit
    # arguments above (``franges``) win.
    for key, value in _resolve_config(config).items():
        settings.setdefault(key, value)
    if "shared_memory_limit" not in settings:
        limit = _device_smem_limit(backend)
        if limit is not None:
            settings["shared_memory_limit"] = limit
            # On a GPU the timings choose: verify (and so profile) more of the cost model's
            # best, since its ranking of tile shapes is rough.
            settings.setdefault("verify_top_n", _GPU_TOP_N)
            # ... and spread them over structures (kernels, loop ranges) first.
            settings.setdefault("verify_spread", True)
            # ... and time twins beside the first: co-resident (two blocks an SM) and
            # warpgroup (loop matmuls on the warpgroup tensor cores) forms.
            settings.setdefault("verify_co_resident", True)

    core = graph._core
    if core.num_ops == 0:
        raise ValueError(
            "superoptimize: the graph is empty: add inputs and ops, then mark an output"
        )
    inputs = set(core.input_ids())
    if len(inputs) == core.num_ops:
        raise ValueError("superoptimize: the graph has only inputs: add ops and mark an output")
    if not core.output_ids() or set(core.output_ids()) <= inputs:
        raise ValueError("superoptimize: the graph computes no output: mark one with mark_output")

    t0 = time.perf_counter()
    sources = (graph, settings, checkpoint, folder, use_cached_graphs, time_budget, num_threads)
    save = checkpoint is not None or use_cached_graphs
    profiling = (warmup_iters, profile_iters)
    with _progress.session(progress) as rep:
        data, path, loaded_from = _results(*sources, verbose)
        choice = _choose(
            graph, data, restricted, backend, profiling, path if save else None, verbose
        )
        if choice is None and loaded_from is not None and data["candidates"]:
            warnings.warn(
                f"superoptimize: no candidate from the {loaded_from} ({path}) passed the "
                "every-element equivalence check; searching again",
                RuntimeWarning,
                stacklevel=3,
            )
            data, path, loaded_from = _results(*sources, verbose, reuse=False)
            save_to = path if save else None
            choice = _choose(graph, data, restricted, backend, profiling, save_to, verbose)
    if choice is None:
        # Nothing usable (nothing found, or nothing passed the every-element check): the
        # program as given is still a correct plan.
        why = data.get("empty_reason") or (
            "no candidate passed the every-element equivalence check"
            if data["candidates"]
            else "no candidate passed verification"
        )
        return _as_given(graph, data, why)
    winner, cands, graphs, selection, considered, confirm, device = choice
    if winner < 0:
        timings = selection.get("timings_us") or {}
        best = min((timings[c["hash"]] for c in cands if c["hash"] in timings), default=None)
        why = (
            f"it ran fastest on the GPU, measured {timings.get(AS_GIVEN, math.nan):.2f} us"
            + (f" against {best:.2f} us for the fastest candidate" if best is not None else "")
            + f" (fastest of {len(timings)} profiled{cached_tag(selection)})"
        )
        given = _as_given(graph, data, why, selection)
        if save_codes is not False:
            _save_code(given, save_codes, device)
        return given

    result = graphs[winner]
    chosen = cands[winner]
    if save_codes is not False:
        _save_code(result, save_codes, device)
    stats = dict(data["stats"])
    stats.update(
        {
            "source": loaded_from or "search",
            "cache_file": path,
            "stopped": data.get("stopped"),
            "selection": selection,
            "winner": {
                k: chosen[k] for k in ("hash", "cost", "verification", "customized_kernels")
            },
            "confirm_rejected": confirm["rejected"],
            "confirm_seconds": confirm["seconds"],
            "total_seconds": time.perf_counter() - t0,
        }
    )
    stats["summary"] = summary(result, stats, winner, considered)
    result.search_stats = stats
    result.candidates_considered = considered
    if verbose or rep.enabled:
        print(f"[mirage] superoptimize: {stats['summary']}", file=sys.stderr)
    return result


def _save_code(graph: KNGraph, save_codes: bool | PathLike, device: int | None) -> None:
    """Writes the winner's generated CUDA source (for the GPU's arch, else sm_90)."""
    folder = (
        os.fspath(save_codes)
        if not isinstance(save_codes, bool)
        else os.environ.get("MIRAGE_SAVE_CODES") or "mirage_generated"
    )
    try:
        if device is not None:
            exe = _cuda.executable(graph, device)
            arch, source = exe.arch, exe.source
        else:
            arch = _cuda.default_arch()
            source = _cuda.cuda_source(graph, arch)[0]
    except (RuntimeError, ValueError) as e:
        warnings.warn(
            f"superoptimize: save_codes: no CUDA source: {e}", RuntimeWarning, stacklevel=3
        )
        return
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{graph.hash()[:16]}_sm{arch}.cu"), "w", encoding="utf-8") as f:
        f.write(source)
