"""``KNGraph.superoptimize``: search equivalent µGraphs, pick the fastest, cache the result.

The search itself is Rust (``mirage._core.search``, run with the GIL released: Ctrl-C cancels
it and raises ``KeyboardInterrupt``). This module validates the reference API's keyword
arguments, maps ``config`` presets to search settings, caches ranked candidates on disk, and
chooses the winner:

* on a machine without a usable CUDA device, or with ``backend="cpu"``: the cheapest candidate
  by the static cost model among those that passed verification (numerically unstable ones
  only when nothing else passed, with a warning); it runs on the CPU interpreter;
* with ``backend="cuda"`` and a CUDA device: the top candidates are compiled (in parallel),
  timed with CUDA events on random inputs (``warmup_iters`` launches, then ``profile_iters``
  timed launches replayed in a CUDA graph when capture works, median), and the fastest wins.

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

import hashlib
import json
import math
import operator
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Union

from . import _core, _cuda, _env
from ._args import MAX_EXTENT, as_dim3, as_int, as_map3, short_repr
from .kernel import KNGraph

__all__ = [
    "CONFIG_KEYS",
    "PRESETS",
    "SearchError",
    "default_cache_dir",
    "search_candidates",
    "superoptimize",
]

PathLike = Union[str, "os.PathLike[str]"]

#: Search settings of the ``config`` presets (``None`` keeps the search's defaults: at most
#: 2 kernel ops, 2 customized kernels, 11 ops per block graph).
PRESETS: dict[str | None, dict[str, Any]] = {
    None: {},
    # Attention needs two kernels (e.g. flash decoding: partial results, then a reduction).
    # Its split-KV online-softmax block graph has 10 ops; QK-norm attention adds a norm of Q
    # and one of V, and writes the running max for the reduction: 13. Loop range 32 adds
    # 128-key tiles (at 4096 keys) between the default 64 and 256 (a user's ``franges`` wins).
    "attention": {
        "max_kernel_ops": 2,
        "max_customized_ops": 2,
        "max_block_ops": 13,
        "franges": [1, 4, 16, 32, 64],
    },
    # Gated MLP and LoRA fuse into one customized kernel (the paper's µGraphs). Loop range 32
    # (128-row weight tiles at 4096) measured 3-9% faster than 16 for RMSNorm+Linear at 6144
    # columns on an H100.
    "mlp": {"max_kernel_ops": 2, "max_customized_ops": 1, "franges": [1, 4, 16, 32, 64]},
    "lora": {"max_kernel_ops": 2, "max_customized_ops": 1},
}

#: Keys a ``config`` mapping may set (advanced; ``"preset"`` names a base preset).
CONFIG_KEYS: dict[str, type] = {
    "preset": str,
    "max_block_ops": int,
    "max_kernel_ops": int,
    "max_customized_ops": int,
    "shared_memory_limit": int,
    "expression_pruning": bool,
    "verify_top_n": int,
    "verify_spread": bool,
    "verify_co_resident": bool,
}

#: Allowed range of each integer ``config`` key (the search's defaults sit well inside).
CONFIG_RANGES: dict[str, tuple[int, int]] = {
    "max_block_ops": (2, 64),
    "max_kernel_ops": (1, 16),
    "max_customized_ops": (1, 16),
    "shared_memory_limit": (0, 2**32),
    "verify_top_n": (1, 4096),
}
#: Allowed ranges of the integer keyword arguments.
_ARG_RANGES: dict[str, tuple[int, int]] = {
    "warmup_iters": (0, 10**6),
    "profile_iters": (1, 10**7),
    "num_threads": (1, 2**20),
}
#: ``num_threads`` above this multiple of the cores is lowered to it (with a warning).
_THREADS_PER_CORE = 4

_BACKENDS = ("cuda", "cpu")
#: Candidates verified as stable when a GPU profiles them (in the search's check order).
#: RMSNorm+Linear 4096x6144 at b=1 once needed more than 48: its fastest form then (128 blocks,
#: 128-wide K tiles) was 49th-56th in that order, the cost model charging its 32 loop steps as
#: a chain (its fastest now, 96 blocks of 64 columns, ranks in the first few).
_GPU_TOP_N = 64
_CACHE_FORMAT = "mirage-rs/search-result"
#: Version of the cache file's layout (what produced its contents is in the key and the
#: header: `_producer`).
_CACHE_SCHEMA = 1
#: Candidates compiled and timed on a GPU: every one verified there, with the twins the
#: search adds beside the first (co-resident and warpgroup forms), the first 128 in all. The cost
#: model ranks attention forms roughly (measured attention winners sat up to 26th of 28-38
#: candidates), so the timings decide among all of them.
PROFILE_TOP_N = 2 * _GPU_TOP_N


class SearchError(RuntimeError):
    """The search ran but produced no usable µGraph (the message says why)."""


# ------------------------------------------------------------------ arguments
_OP = "superoptimize"


def _list_of(name: str, value: Any, item: Callable[[str, Any], Any], what: str) -> list[Any] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"superoptimize: {name} must be a list of {what}, got {value!r}")
    items = list(value)
    if not items:
        raise ValueError(f"superoptimize: {name} must not be empty (pass None for the defaults)")
    if what.startswith("(") and all(isinstance(v, int) for v in items):
        raise TypeError(
            f"superoptimize: {name} must be a list of {what}, got {value!r}; "
            f"did you mean [{tuple(items)!r}]?"
        )
    return [item(name, v) for v in items]


def _dim3(name: str, v: Any) -> list[int]:
    if isinstance(v, (int, str, bytes)) or not hasattr(v, "__iter__"):
        raise TypeError(
            f"superoptimize: each entry of {name} must be an (x, y, z) tuple, got {v!r}"
        )
    return list(as_dim3(_OP, name, v))


def _map3(name: str, v: Any) -> list[int]:
    m = as_map3(_OP, name, v)
    if any(x < -1 for x in m):
        raise ValueError(f"superoptimize: {name} entry {m} may only hold data dims >= 0 or -1")
    return list(m)


def _fmap(name: str, v: Any) -> int:
    x = as_int(_OP, name, v)
    if x < -1:
        raise ValueError(f"superoptimize: {name} entry {x} must be a data dim >= 0 or -1")
    return x


def _frange(name: str, v: Any) -> int:
    x = as_int(_OP, name, v)
    if not 1 <= x <= MAX_EXTENT:
        raise ValueError(
            f"superoptimize: {name} entry {x} must be a positive loop range of at most {MAX_EXTENT}"
        )
    return x


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"superoptimize: {name} must be True or False, got {v!r}")
    return v


def _count(name: str, v: Any, least: int, most: int) -> int:
    """An integer argument in ``[least, most]``; the message names it, its value and the range."""
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        as_int(_OP, name, v)  # raises the TypeError
    x = operator.index(v)
    if not least <= x <= most:
        raise ValueError(
            f"superoptimize: {name} is {short_repr(x)}; the allowed range is {least} to {most}"
        )
    return x


def _threads(v: Any) -> int:
    """``num_threads``, lowered to `_THREADS_PER_CORE` times the cores with a warning."""
    n = _count("num_threads", v, *_ARG_RANGES["num_threads"])
    cap = _THREADS_PER_CORE * (os.cpu_count() or 1)
    if n > cap:
        warnings.warn(
            f"superoptimize: num_threads={n} is more than {_THREADS_PER_CORE}x the "
            f"{os.cpu_count()} cores; using {cap} threads",
            RuntimeWarning,
            stacklevel=4,
        )
        n = cap
    return n


def _seconds(v: Any) -> float | None:
    """``time_budget``: None or positive seconds (at most 1e9)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"superoptimize: time_budget must be seconds (a number), got {v!r}")
    try:
        seconds = float(v)
    except OverflowError:
        seconds = math.inf
    if not (math.isfinite(seconds) and 0 < seconds <= 10**9):
        raise ValueError(
            f"superoptimize: time_budget must be positive seconds (at most 1e9), got {short_repr(v)}"
        )
    return seconds


def _save_codes(v: Any) -> bool | str:
    """``save_codes``: a bool, or a folder that is not an existing file."""
    if isinstance(v, bool):
        return v
    if not isinstance(v, (str, os.PathLike)):
        raise TypeError(f"superoptimize: save_codes must be a bool or a folder, got {v!r}")
    folder = os.fspath(v)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"superoptimize: save_codes {folder!r} is an existing file, not a folder")
    return folder


def _path(name: str, v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, (str, os.PathLike)):
        raise TypeError(f"superoptimize: {name} must be a path (str or os.PathLike), got {v!r}")
    return os.fspath(v)


def _resolve_config(config: Any) -> dict[str, Any]:
    """The search settings of ``config``: a preset name, None, or a mapping of CONFIG_KEYS."""
    if config is None or isinstance(config, str):
        if config not in PRESETS:
            names = ", ".join(repr(k) for k in PRESETS)
            raise ValueError(f"superoptimize: unknown config {config!r}; expected one of {names}")
        return dict(PRESETS[config])
    if not isinstance(config, Mapping):
        raise TypeError(
            "superoptimize: config must be None, a preset name ('attention', 'lora', 'mlp') or "
            f"a dict of search settings, got {type(config).__name__}"
        )
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"superoptimize: unknown config keys {unknown}; expected some of {sorted(CONFIG_KEYS)}"
        )
    out = _resolve_config(config.get("preset"))
    for key, value in config.items():
        if key == "preset":
            continue
        if CONFIG_KEYS[key] is bool:
            out[key] = _bool(f"config[{key!r}]", value)
        else:
            out[key] = _count(f"config[{key!r}]", value, *CONFIG_RANGES[key])
    return out


def default_cache_dir() -> str:
    """``$MIRAGE_CACHE_DIR/search`` when that is set, else ``~/.cache/mirage-rs/search``."""
    env = os.environ.get("MIRAGE_CACHE_DIR")
    if env:
        return os.path.join(env, "search")
    return os.path.join(os.path.expanduser("~"), ".cache", "mirage-rs", "search")


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


def _producer() -> dict[str, Any]:
    """What a search result depends on besides the graph and the settings: the crate version,
    the build hash of the Rust sources and the result switches' values."""
    return {
        "mirage_version": _core.__version__,
        "build_hash": _core.__build_hash__,
        "switches": _env.result_switch_values(),
    }


def _switches_tag() -> str:
    """The result switches' values as one string (part of the profiling winners' key)."""
    return json.dumps(_env.result_switch_values(), sort_keys=True)


def _cache_key(graph_hash: str, settings: Mapping[str, Any]) -> str:
    """The name of the cache entry of ``graph_hash`` searched with ``settings`` by this build."""
    blob = json.dumps(
        {"graph": graph_hash, "settings": settings, "schema": _CACHE_SCHEMA, **_producer()},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _candidate_problem(c: Any) -> str | None:
    """Why a stored candidate cannot be served, or None: its fields' types, and its graph must
    parse and hash to the candidate's hash (so an edited or damaged graph is never served)."""
    if not isinstance(c, dict):
        return f"is a {type(c).__name__}, not an object"
    if not isinstance(c.get("hash"), str):
        return "has no hash"
    if c.get("verification") not in ("passed", "unstable"):
        return f"has verification {c.get('verification')!r}"
    if not isinstance(c.get("verification_reason", None), (str, type(None))):
        return "has a verification_reason that is not a string"
    kernels = c.get("customized_kernels")
    if not isinstance(kernels, int) or isinstance(kernels, bool) or kernels < 0:
        return f"has customized_kernels {kernels!r}"
    cost = c.get("cost")
    if not isinstance(cost, dict) or not _is_number(cost.get("est_us")):
        return "has no cost with est_us"
    if not isinstance(c.get("graph"), dict):
        return "has no graph"
    try:
        parsed = _core.KernelGraph.from_json(json.dumps(c["graph"]))
    except (ValueError, TypeError) as e:
        return f"has a graph that does not parse ({e})"
    if parsed.hash() != c["hash"]:
        return "has a graph whose hash is not the candidate's"
    return None


#: The types of an entry's top-level fields (beside the header checked by `_entry_problem`).
_ENTRY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "graph_hash": str,
    "settings": dict,
    "candidates": list,
    "stats": dict,
    "stopped": (str, type(None)),
    "empty_reason": (str, type(None)),
    "profiled": dict,
}


def _entry_problem(data: Any, graph_hash: str, key: str | None) -> str | None:
    """Why a loaded cache entry or checkpoint cannot be served, or None when it can: its
    format and layout, the build that wrote it (crate version, build hash), its key (``key``:
    a cache entry; None: a checkpoint, whose settings may differ), its graph, the types of its
    fields, each candidate (`_candidate_problem`) and each profiling winner."""
    if not isinstance(data, dict):
        return f"it holds a JSON {type(data).__name__}, not an object"
    if data.get("format") != _CACHE_FORMAT:
        return f"its format is {data.get('format')!r}, not {_CACHE_FORMAT!r}"
    if data.get("schema") != _CACHE_SCHEMA:
        return f"its layout is {data.get('schema')!r}, this version reads {_CACHE_SCHEMA}"
    for name, value in _producer().items():
        if name != "switches" and data.get(name) != value:
            return f"another build wrote it ({name} {data.get(name)!r}, this one {value!r})"
    if key is not None and data.get("key") != key:
        return f"its key {data.get('key')!r} is not {key!r}"
    for name, kind in _ENTRY_FIELDS.items():
        if not isinstance(data.get(name), kind):
            return f"its {name!r} is missing or a {type(data.get(name)).__name__}"
    if data["graph_hash"] != graph_hash:
        return "it holds results for another graph"
    for i, c in enumerate(data["candidates"]):
        why = _candidate_problem(c)
        if why is not None:
            return f"candidate {i} {why}"
    for dev_key, prof in data["profiled"].items():
        if not isinstance(prof, dict) or not isinstance(prof.get("winner"), str):
            return f"the profiling entry {dev_key!r} names no winner"
    return None


def _load(path: str, graph_hash: str, key: str | None) -> dict[str, Any] | None:
    """The entry at ``path`` when it can be served; None when there is none, or when it cannot
    be served (`_entry_problem`; a ``RuntimeWarning`` names the file and the reason; the
    caller searches again and overwrites it). ``key`` None: a checkpoint, which holding
    results for another graph raises ``ValueError`` (a mistaken path, not a damaged file)."""
    what = "the cache entry" if key is not None else "previous_checkpoint"
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        why: str | None = f"it cannot be read ({type(e).__name__}: {e})"
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested too deep
        why = f"it is not valid JSON ({type(e).__name__}: {str(e)[:200]})"
    else:
        if (
            key is None
            and isinstance(data, dict)
            and data.get("format") == _CACHE_FORMAT
            and isinstance(data.get("graph_hash"), str)
            and data["graph_hash"] != graph_hash
        ):
            raise ValueError(
                f"superoptimize: previous_checkpoint {path} holds results for another graph "
                f"(hash {data['graph_hash'][:12]}..., this graph {graph_hash[:12]}...)"
            )
        why = _entry_problem(data, graph_hash, key)
    if why is None:
        return data
    warnings.warn(
        f"superoptimize: ignoring {what} {path}: {why}; searching again (a complete search overwrites it)",
        RuntimeWarning,
        stacklevel=5,
    )
    return None


def _save(path: str, data: Mapping[str, Any]) -> None:
    """Writes ``data`` atomically (a concurrent reader sees the old file or the new one); a
    file that cannot be written is a ``RuntimeWarning``, not an error."""
    try:
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".search-", suffix=".json")
    except OSError as e:
        warnings.warn(f"superoptimize: cannot write {path}: {e}", RuntimeWarning, stacklevel=3)
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if not isinstance(e, OSError):
            raise
        warnings.warn(f"superoptimize: cannot write {path}: {e}", RuntimeWarning, stacklevel=3)


def _results(
    graph: KNGraph,
    settings: dict[str, Any],
    checkpoint: str | None,
    folder: str | None,
    use_cached_graphs: bool,
    time_budget: float | None,
    num_threads: int | None,
    verbose: bool,
) -> tuple[dict[str, Any], str, str | None]:
    """The search results of ``graph`` with ``settings``: from ``checkpoint`` when given, else
    from the cache (when ``use_cached_graphs``), else searched (and saved there). Returns the
    entry, its file and where it was loaded from (``"checkpoint"``, ``"cache"`` or None)."""
    graph_hash = graph.hash()
    key = _cache_key(graph_hash, settings)
    if checkpoint is not None:
        path, source = checkpoint, "checkpoint"
        data = _load(path, graph_hash, None)
    else:
        path = os.path.join(folder or default_cache_dir(), f"{key}.json")
        source = "cache"
        data = _load(path, graph_hash, key) if use_cached_graphs else None
    if data is not None:
        if verbose:
            print(
                f"[mirage] superoptimize: loaded {len(data['candidates'])} candidates from {path}",
                file=sys.stderr,
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
        times = []
        for rep in range(reps):
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
            if rep == 0 and bound is not None and times[0] > bound:
                return times[0], "stopped early"
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
    with ThreadPoolExecutor(max_workers=max(1, min(len(graphs), os.cpu_count() or 1))) as pool:
        futures = [pool.submit(build, g) for g in graphs]
        for h, fut in zip(hashes, futures):
            try:
                exes.append(fut.result())
            except (RuntimeError, ValueError) as e:  # NVRTC error, shared memory, unsupported
                exes.append(None)
                skipped[h] = str(e).splitlines()[0] if str(e) else type(e).__name__
    t1 = time.perf_counter()
    sets = _input_sets(graphs[0], device) if graphs else []
    t2 = time.perf_counter()
    timings: dict[str, float] = {}
    best: int | None = None
    for i, (h, exe) in enumerate(zip(hashes, exes)):
        if exe is None:
            if verbose:
                print(f"[mirage] candidate {i} ({h[:12]}): skipped: {skipped[h]}", file=sys.stderr)
            continue
        bound = None if best is None else _EARLY_STOP * timings[hashes[best]]
        try:
            us, how = _time_one(exe, sets, warmup, iters, bound)
        except RuntimeError as e:
            why = "wrong output" if isinstance(e, _NonFinite) else "launch failed"
            skipped[h] = f"{why}: {e}"
            if verbose:
                print(f"[mirage] candidate {i} ({h[:12]}): skipped: {skipped[h]}", file=sys.stderr)
            continue
        timings[h] = us
        if verbose:
            print(f"[mirage] candidate {i} ({h[:12]}): {us:.2f} us ({how})", file=sys.stderr)
        if best is None or us < timings[hashes[best]]:
            best = i
    # The close ones again, in turns (each round starting one further), so that a drift of
    # the GPU's clocks over the pass does not pick among them.
    finals = _finalists(timings)
    samples = {h: [timings[h]] for h in finals}
    for r in range(_FINAL_ROUNDS if finals else 0):
        for h in finals[r % len(finals) :] + finals[: r % len(finals)]:
            try:
                samples[h].append(_time_one(exes[hashes.index(h)], sets, warmup, iters, None)[0])
            except RuntimeError:
                pass  # timed once already; its first timing stands
    for h, xs in samples.items():
        timings[h] = statistics.median(xs)
    if finals:
        best = hashes.index(min(finals, key=timings.__getitem__))
        if verbose:
            print(
                "[mirage] finalists (median of "
                + ", ".join(f"{h[:12]} {timings[h]:.2f} us" for h in finals)
                + f"): candidate {best}",
                file=sys.stderr,
            )
    phases = {"compile": t1 - t0, "inputs": t2 - t1, "timing": time.perf_counter() - t2}
    return best, timings, skipped, phases, finals


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
    raw = search_candidates(
        graph, settings, time_budget=time_budget, num_threads=num_threads, verbose=verbose
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
    for i in order:
        why = _confirm(reference, graphs[i])
        if why is None:
            if verbose:
                print(
                    f"[mirage] candidate {i} ({cands[i]['hash'][:12]}): every-element check "
                    f"passed in {time.perf_counter() - t0:.2f} s",
                    file=sys.stderr,
                )
            return i, {"rejected": rejected, "seconds": time.perf_counter() - t0}
        rejected.append(cands[i]["hash"])
        warnings.warn(
            f"superoptimize: candidate {i} ({cands[i]['hash'][:12]}) is not equivalent to the "
            f"input graph on every output element and is dropped: {why}",
            RuntimeWarning,
            stacklevel=5,
        )
    return None, {"rejected": rejected, "seconds": time.perf_counter() - t0}


def _profiled_order(
    cands: list[dict[str, Any]],
    graphs: list[KNGraph],
    data: dict[str, Any],
    device: int,
    profiling: tuple[int, int],
    save_to: str | None,
    verbose: bool,
) -> tuple[list[int], dict[str, Any]]:
    """Times the top candidates on the GPU (or reuses the cached timings); returns the
    candidate indices fastest first (untimed ones after, cheapest first) and the selection
    record."""
    warmup_iters, profile_iters = profiling
    pool = list(range(min(PROFILE_TOP_N, len(cands))))
    hashes = [cands[i]["hash"] for i in pool]
    import torch

    dev_key = (
        f"{torch.cuda.get_device_name(device)}|sm{_cuda.default_arch()}|"
        f"{warmup_iters}|{profile_iters}|{','.join(hashes)}|{_switches_tag()}"
    )
    prof = data.setdefault("profiled", {}).get(dev_key)
    if prof is not None and prof.get("winner") in hashes:
        selection = {"method": "profiled (cached)", **prof}
    else:
        best, timings, skipped, phases, finals = _profile(
            [graphs[i] for i in pool], hashes, device, warmup_iters, profile_iters, verbose
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
        prof = {"winner": hashes[best], "timings_us": timings, "skipped": skipped}
        prof["finalists"] = finals
        selection = {"method": "profiled", **prof, "phase_seconds": phases}
        data["profiled"][dev_key] = prof
        if save_to is not None:
            _save(save_to, data)
    timings = prof.get("timings_us", {})
    timed = sorted((i for i in pool if hashes[i] in timings), key=lambda i: timings[hashes[i]])
    first = hashes.index(prof["winner"])
    order = [first] + [i for i in timed if i != first]
    return order + [i for i in range(len(cands)) if i not in order], selection


def _choose(
    reference: KNGraph,
    data: dict[str, Any],
    settings: Mapping[str, Any],
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
    device or None), or None when no candidate passes the check."""
    cands, unstable_only = _eligible(data["candidates"])
    if not cands:
        restricted = {
            k: v
            for k, v in settings.items()
            if k in ("griddims", "blockdims", "imaps", "omaps", "fmaps", "franges")
        }
        why = data.get("empty_reason") or "no candidate passed verification"
        hint = f"; the restrictions {restricted} may exclude every µGraph" if restricted else ""
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
        order, selection = _profiled_order(cands, graphs, data, device, profiling, save_to, verbose)
        considered = min(PROFILE_TOP_N, len(cands))
    winner, confirm = _first_confirmed(reference, graphs, cands, order, verbose)
    if winner is None:
        return None
    if confirm["rejected"] and selection["method"].startswith("profiled"):
        selection = {**selection, "winner": cands[winner]["hash"]}
    return winner, cands, graphs, selection, considered, confirm, device


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
    data, path, loaded_from = _results(
        graph, settings, checkpoint, folder, use_cached_graphs, time_budget, num_threads, verbose
    )

    save = checkpoint is not None or use_cached_graphs
    profiling = (warmup_iters, profile_iters)
    choice = _choose(graph, data, settings, backend, profiling, path if save else None, verbose)
    if choice is None and loaded_from is not None:
        warnings.warn(
            f"superoptimize: no candidate from the {loaded_from} ({path}) passed the "
            "every-element equivalence check; searching again",
            RuntimeWarning,
            stacklevel=3,
        )
        loaded_from = None
        graph_hash = graph.hash()
        key = _cache_key(graph_hash, settings)
        data = _fresh_data(graph, graph_hash, key, settings, time_budget, num_threads, verbose)
        if save and data["stopped"] is None:
            _save(path, data)
        choice = _choose(graph, data, settings, backend, profiling, path if save else None, verbose)
    if choice is None:
        raise SearchError(
            "superoptimize found no usable µGraph: no candidate passed the every-element "
            "equivalence check"
        )
    winner, cands, graphs, selection, considered, confirm, device = choice

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
    result.search_stats = stats
    result.candidates_considered = considered
    if verbose:
        print(
            f"[mirage] superoptimize: chose candidate {winner} of {considered} "
            f"({selection['method'].replace('_', ' ')}; "
            f"modelled {chosen['cost']['est_us']:.2f} us, "
            f"{chosen['customized_kernels']} customized kernel(s))",
            file=sys.stderr,
        )
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
