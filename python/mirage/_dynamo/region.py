"""A mirage region at run time: lowering per input shape, search, caches and the
``mirage::region`` custom op through which the rewritten graph calls it.

Each region keeps the lowered and searched graph of every input-shape key it has seen; the
searched graphs themselves are shared process-wide by (graph hash, search options, device), and
``superoptimize``'s on-disk cache (docs/caches.md) keeps them across processes. Row-wise regions
(their activations flattened to ``[rows, k]``) with dynamic shapes bucket the rows to the next
power of two: the inputs' rows are padded with zeros and the outputs sliced (docs/dynamo.md).
"""

from __future__ import annotations

import copy
import logging
import math
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from ..kernel import KNGraph
from . import plan
from .lower import Lowered, Unsupported, lower_region, materialize, output_fixups

log = logging.getLogger("mirage.dynamo")

#: Devices whose regions choose between their graph and their torch code by timing (on the
#: CPU the interpreter, a reference and not a fast path, always loses).
PROFILED_DEVICES = {"cuda"}
#: Counters of the backend (``mirage.dynamo_stats()``).
STATS: dict[str, int] = {
    "compiles": 0,
    "regions": 0,
    "regions_lowered": 0,
    "regions_fallback": 0,
    "lowerings": 0,
    "searches": 0,
    "search_disk_hits": 0,
    "search_failures": 0,
    "searches_skipped": 0,
    "graph_cache_hits": 0,
    "region_calls": 0,
    "regions_mirage_path": 0,
    "regions_torch_path": 0,
}
#: Seconds spent by phase (``mirage.dynamo_summary()``).
SECONDS: dict[str, float] = {"rewrite": 0.0, "fallback_compile": 0.0, "lower": 0.0, "search": 0.0}
#: Regions left to the fallback compiler: name and reason.
FALLBACKS: list[dict[str, str]] = []
_LOCK = threading.Lock()
#: Searched graphs and their records by (graph hash, search settings, device type).
_GRAPHS: dict[tuple[Any, ...], tuple[KNGraph, dict[str, Any]]] = {}
#: Live regions by the key the custom op carries.
_REGIONS: dict[int, Region] = {}
#: The first region key the summary reports (regions made before ``clear_caches`` are not).
_SINCE = 0


def bump(name: str, n: int = 1) -> None:
    """Adds ``n`` to counter ``name``."""
    with _LOCK:
        STATS[name] = STATS.get(name, 0) + n


def add_seconds(phase: str, seconds: float) -> None:
    """Adds ``seconds`` to phase ``phase`` of ``SECONDS``."""
    with _LOCK:
        SECONDS[phase] = SECONDS.get(phase, 0.0) + seconds


def next_pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for 0)."""
    return 1 << max(0, (n - 1).bit_length())


@dataclass
class _Entry:
    low: Lowered
    graph: KNGraph
    #: Rows the graph was built for (bucketed), or None.
    rows: int | None
    #: How the graph was obtained (see ``searched``), and on CUDA which path runs it.
    record: dict[str, Any]
    #: Run the region's own torch code instead of the mirage graph (``choose``).
    torch_path: bool = False
    #: The torch code compiled by the fallback compiler for this key's exact shapes and the
    #: inputs' strides it was compiled for (None: the torch code runs eagerly).
    torch_fn: Any = None
    torch_strides: tuple[Any, ...] = ()


class Region:
    """One lowered region: a torch-level FX graph, run as mirage graphs (see the module docs)."""

    def __init__(
        self,
        gm: fx.GraphModule,
        flatten: bool,
        out_dtypes: Sequence[torch.dtype],
        options: Any,
        dynamic: bool,
        trial: Lowered,
        kind: str = "other",
    ) -> None:
        self.gm = gm
        #: The region's kind (``plan.region_kind``): it picks the search settings.
        self.kind = kind
        #: Its submodule's name in the rewritten graph.
        self.name = ""
        self.ops = plan.graph_ops(trial.graph)
        self.flatten = flatten
        self.out_dtypes = list(out_dtypes)
        self.options = options
        #: Region inputs that are activations (flattened to rows); bucketing pads their rows.
        self.acts = sorted({r.index for r in trial.recipes if r.flatten and r.const is None})
        # Bucketing re-lowers with the activations' rows changed: each must be a plain input
        # read only as rows (not also as a weight or through views).
        plain = all(
            not r.views and (r.flatten or r.index not in self.acts)
            for r in trial.recipes
            if r.const is None and (r.flatten or r.index in self.acts)
        )
        self.bucket = bool(options.bucket and dynamic and flatten and plain and self.acts)
        self.entries: dict[tuple[Any, ...], _Entry] = {}
        with _LOCK:
            self.key = len(_REGIONS)
            _REGIONS[self.key] = self

    # -------------------------------------------------------------- keys and shapes
    def _rows(self, inputs: Sequence[Any]) -> int | None:
        """The activation rows of this call when bucketing, else None."""
        if not self.bucket:
            return None
        return math.prod(inputs[self.acts[0]].shape[:-1])

    def _key(self, inputs: Sequence[Any], rows: int | None) -> tuple[Any, ...]:
        parts: list[Any] = []
        for x in inputs:
            if isinstance(x, torch.Tensor):
                shape: tuple[Any, ...] = tuple(x.shape)
                if rows is not None and len(parts) in self.acts:
                    shape = ("rows", shape[-1])
                # A 0-d CPU input may be read by item() when lowering: its value is part of the
                # key (a 0-d input on a device is never folded, see lower.py's item()).
                scal = float(x.item()) if x.dim() == 0 and x.device.type == "cpu" else None
                parts.append((shape, x.dtype, x.device.type, scal))
            else:
                parts.append(("value", x))
        return (tuple(parts), None if rows is None else next_pow2(rows))

    # -------------------------------------------------------------- building
    def _lower(self, inputs: Sequence[Any], rows: int | None) -> Lowered:
        bump("lowerings")
        if rows is None:
            return lower_region(self.gm, inputs, self.flatten)
        # Lower at the bucket's rows: activations as [bucket, 1.., k] meta tensors.
        b = next_pow2(rows)
        shaped = []
        for i, x in enumerate(inputs):
            if i in self.acts:
                shape = (b,) + (1,) * (x.dim() - 2) + (x.shape[-1],)
                shaped.append(torch.empty(shape, dtype=x.dtype, device="meta"))
            else:
                shaped.append(x)
        low = lower_region(self.gm, shaped, True)
        if any(r.flatten and r.views for r in low.recipes):
            raise Unsupported("bucketing: a viewed activation")
        return low

    def _build(self, inputs: Sequence[Any], rows: int | None) -> _Entry:
        t0 = time.perf_counter()
        low = self._lower(inputs, rows)
        add_seconds("lower", time.perf_counter() - t0)
        device = next(x.device for x in inputs if isinstance(x, torch.Tensor)).type
        graph, record = searched(low.graph, self.options, device, self.kind)
        entry = _Entry(low, graph, None if rows is None else next_pow2(rows), dict(record))
        if device in PROFILED_DEVICES and self.options.choose == "profile":
            self._choose(entry, inputs, rows)
        return entry

    def _choose(self, entry: _Entry, inputs: Sequence[Any], rows: int | None) -> None:
        """Times the mirage graph against the region's torch code on this call's inputs and
        keeps the faster (the torch code also when the two disagree beyond the dtype's
        tolerance, logged); nothing is timed while a CUDA graph is being captured."""
        cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
        if cuda and torch.cuda.is_current_stream_capturing():
            entry.record["path"] = "mirage (not profiled: capturing)"
            return
        t0 = time.perf_counter()
        if entry.rows is None and self.options.fallback == "inductor":
            self._compile_torch(entry, inputs)
        ours = lambda: self._run_mirage(entry, inputs, rows)
        theirs = lambda: self._run_torch(inputs, entry)
        with torch.no_grad():
            b = theirs()
            try:
                a = ours()
            except Exception as e:  # noqa: BLE001 (any failure of the graph: the torch code runs)
                entry.torch_path = True
                entry.record.update(path="torch", path_error=f"{type(e).__name__}: {e}")
                log.warning(
                    "mirage region %s: the mirage graph failed (%s); running the torch code",
                    self.name or self.key,
                    e,
                )
                bump("regions_torch_path")
                return
            agree = all(_close(x, y) for x, y in zip(a, b))
            us_mirage, us_torch = _time_us(ours, cuda), _time_us(theirs, cuda)
        entry.torch_path = not agree or us_torch < us_mirage
        entry.record.update(
            path="torch" if entry.torch_path else "mirage",
            mirage_us=round(us_mirage, 2),
            torch_us=round(us_torch, 2),
            torch_compiled=entry.torch_fn is not None,
            choose_seconds=round(time.perf_counter() - t0, 3),
        )
        if not agree:
            log.warning(
                "mirage region %s: the mirage graph's outputs differ from the torch code's; "
                "running the torch code",
                self.name or self.key,
            )
        bump("regions_torch_path" if entry.torch_path else "regions_mirage_path")

    def _entry(self, inputs: Sequence[Any]) -> tuple[_Entry, int | None]:
        rows = self._rows(inputs)
        key = self._key(inputs, rows)
        entry = self.entries.get(key)
        if entry is None:
            try:
                entry = self._build(inputs, rows)
            except Unsupported:
                if rows is None:
                    raise
                log.info("mirage region %d: bucketing refused; exact shapes", self.key)
                self.bucket = False
                rows = None
                key = self._key(inputs, None)
                entry = self.entries.get(key) or self._build(inputs, None)
            self.entries[key] = entry
        return entry, rows

    # -------------------------------------------------------------- running
    def __call__(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        bump("region_calls")
        entry, rows = self._entry(inputs)
        if entry.torch_path:
            return self._run_torch(inputs, entry)
        return self._run_mirage(entry, inputs, rows)

    def _compile_torch(self, entry: _Entry, inputs: Sequence[Any]) -> None:
        """Compiles the region's torch code with Inductor for this key's shapes (the code the
        mirage graph competes with); a failure leaves it eager (logged)."""
        from torch._inductor.compile_fx import compile_fx

        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                entry.torch_fn = compile_fx(copy.deepcopy(self.gm), list(inputs))
        except Exception as e:  # noqa: BLE001 (the eager torch code is always there)
            log.info("mirage region %s: Inductor did not compile its torch code (%s)", self.key, e)
            entry.torch_fn = None
        entry.torch_strides = _strides(inputs)
        add_seconds("fallback_compile", time.perf_counter() - t0)

    def _run_torch(self, inputs: Sequence[Any], entry: _Entry | None = None) -> list[torch.Tensor]:
        """The region's own torch code on ``inputs`` (contiguous outputs): the entry's compiled
        form where the inputs have the strides it was compiled for, else eagerly."""
        fn = entry.torch_fn if entry is not None else None
        if fn is not None and _strides(inputs) == entry.torch_strides:
            outs = fn(*inputs)
        else:
            outs = self.gm(*inputs)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        return [o.to(dt).contiguous() for o, dt in zip(outs, self.out_dtypes)]

    def _run_mirage(
        self, entry: _Entry, inputs: Sequence[Any], rows: int | None
    ) -> list[torch.Tensor]:
        """The entry's mirage graph on ``inputs`` (rows padded to its bucket and sliced back)."""
        low = entry.low
        device = next(x.device for x in inputs if isinstance(x, torch.Tensor))
        args = []
        for r in low.recipes:
            t = materialize(r, inputs, low.dtype, device)
            if (
                entry.rows is not None
                and r.flatten
                and r.const is None
                and t.shape[0] != entry.rows
            ):
                pad = torch.zeros(
                    (entry.rows - t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device
                )
                t = torch.cat([t, pad])
            args.append(t)
        outs = entry.graph(inputs=args)
        if entry.rows is not None and rows is not None:
            outs = [o[:rows] for o in outs]
        if low.flatten:
            lead = _lead_of(low, inputs)
            low = Lowered(
                low.graph, low.recipes, low.dtype, True, lead, low.out_shapes, low.scalars
            )
        return [o.contiguous() for o in output_fixups(low, outs, self.out_dtypes)]

    def fake(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        """Outputs of the region's shapes and dtypes for tracing (runs its torch code on the
        fake inputs, with ``item()`` read as a placeholder number)."""
        outs = _FakeRun(self.gm).run(*inputs)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        return [o.new_empty(o.shape, dtype=dt) for o, dt in zip(outs, self.out_dtypes)]


def _strides(inputs: Sequence[Any]) -> tuple[Any, ...]:
    """The inputs' strides (None for a non-tensor)."""
    return tuple(tuple(x.stride()) if isinstance(x, torch.Tensor) else None for x in inputs)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two outputs agree within the tolerance of ``b``'s dtype, relative to ``b``'s
    largest finite magnitude (non-finite elements must sit at the same places)."""
    if a.shape != b.shape:
        return False
    tol = _TOLERANCE.get(b.dtype, 1e-3)
    a, b = a.double(), b.double()
    fin = torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), fin):
        return False
    if not bool(fin.any()):
        return True
    scale = float(b[fin].abs().max()) or 1.0
    return float((a[fin] - b[fin]).abs().max()) <= tol * scale


#: Relative tolerance of the mirage graph against the torch code, by output dtype.
_TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-3}


def _time_us(fn: Any, cuda: bool, calls: int = 10, rounds: int = 3) -> float:
    """Median over ``rounds`` of the µs per call of ``calls`` back-to-back ``fn()`` calls. On
    CUDA the GPU's time: the stream first sleeps long enough for the host to queue every call,
    so host overhead (which a CUDA graph replay does not have) is not counted."""
    fn()
    times = []
    for _ in range(rounds):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(_SLEEP_CYCLES_PER_CALL * calls)
            a.record()
            for _ in range(calls):
                fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - t0) * 1e6 / calls)
    times.sort()
    return times[len(times) // 2]


#: GPU clock cycles the stream sleeps per timed call (about 0.5 ms at 2 GHz): more than the
#: host needs to queue one region call.
_SLEEP_CYCLES_PER_CALL = 1_000_000


def _lead_of(low: Lowered, inputs: Sequence[Any]) -> tuple[int, ...]:
    for r in low.recipes:
        if r.flatten and r.const is None:
            from .lower import replay_views

            return tuple(replay_views(inputs[r.index], r.views).shape[:-1])
    return low.lead


class _FakeRun(fx.Interpreter):
    """Runs a region's graph for shapes only: ``item()`` gives a number without reading data."""

    def call_method(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target == "item":
            return 1e-6
        return super().call_method(target, args, kwargs)


def _search_kwargs(options: Any, device: str, kind: str) -> dict[str, Any]:
    """``superoptimize``'s keywords for a region of ``kind`` (the budget left out)."""
    kwargs: dict[str, Any] = dict(options.search_kwargs)
    kwargs.setdefault("backend", "cuda" if device == "cuda" else "cpu")
    for k, v in plan.kind_settings(kind, options).items():
        kwargs.setdefault(k, v)
    if options.cache_dir is not None:
        kwargs["cache_dir"] = options.cache_dir
    kwargs["verbose"] = options.verbose
    return kwargs


def searched(
    g: KNGraph, options: Any, device: str, kind: str = "other"
) -> tuple[KNGraph, dict[str, Any]]:
    """The best graph of ``g``'s search (cached per graph hash, search settings and device),
    and a record of how it was obtained; ``g`` itself when searching is off, the total budget
    is spent or the search finds nothing."""
    if not options.search:
        return g, {"source": "not searched"}
    kwargs = _search_kwargs(options, device, kind)
    key = (g.hash(), repr(sorted(kwargs.items())), device)
    with _LOCK:
        hit = _GRAPHS.get(key)
    if hit is not None:
        bump("graph_cache_hits")
        return hit[0], {**hit[1], "source": "in-process cache", "seconds": 0.0}
    left = plan.BUDGET.left(options)
    if left <= 0:
        bump("searches_skipped")
        log.info(
            "mirage: the total search budget is spent; graph %s runs unsearched", g.hash()[:12]
        )
        return g, {"source": "budget spent"}
    budget = kwargs.pop("time_budget", None)
    if budget is not None or left != math.inf:
        kwargs["time_budget"] = min(budget if budget is not None else math.inf, left)
    from ..search import SearchError

    t0 = time.perf_counter()
    preset_error, given_budget = None, kwargs.get("time_budget")
    # The kind's preset narrows the search for speed (one customized kernel, a few loop
    # ranges); where it finds nothing at the region's shapes (a gated MLP of real width needs
    # its norm in a kernel of its own) and returns the program as given, the search's defaults
    # get the time left. A user's own config is not widened.
    preset = options.config is None and kwargs.get("config") is not None
    try:
        nothing: str | None = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                best = g.superoptimize(**kwargs)
                sel = (best.search_stats or {}).get("selection") or {}
                if sel.get("method") == "as_given":  # found nothing (not: timed fastest)
                    nothing = str(sel.get("reason"))
            except SearchError as e:
                if not preset:
                    raise
                nothing = str(e)
        if not (preset and nothing):
            for w in caught:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if preset and nothing:
            preset_error = f"{kwargs['config']!r} preset: {nothing}"
            log.info("mirage: %s; searching again with the default settings", preset_error)
            kwargs = {k: v for k, v in kwargs.items() if k != "config"}
            if "time_budget" in kwargs:
                spent = time.perf_counter() - t0
                kwargs["time_budget"] = max(kwargs["time_budget"] - spent, 1.0)
            best = g.superoptimize(**kwargs)
    except SearchError as e:
        bump("search_failures")
        log.info("mirage: search found nothing (%s); running the lowered graph as it is", e)
        best = g
        stats: dict[str, Any] = {"source": "failed", "error": str(e)}
    else:
        stats = dict(best.search_stats or {})
        source = stats.get("source", "search")
        bump("searches" if source in ("search", "as_given") else "search_disk_hits")
        log.debug("mirage: searched graph %s (%s)", g.hash()[:12], source)
    seconds = time.perf_counter() - t0
    if stats.get("source") != "cache":
        plan.BUDGET.charge(seconds)
    add_seconds("search", seconds)
    selection = stats.get("selection") or {}
    record = {
        "graph": g.hash()[:12],
        "seconds": round(seconds, 3),
        "source": stats.get("source"),
        "search_seconds": stats.get("elapsed"),
        "saturation_seconds": (stats.get("saturation") or {}).get("elapsed"),
        "confirm_seconds": stats.get("confirm_seconds"),
        # How the winner was chosen (cost model, or profiled on the GPU with its phases).
        "selection": selection.get("method"),
        "profile_seconds": selection.get("phase_seconds"),
        "stopped": stats.get("stopped"),
        "error": stats.get("error"),
        "preset_error": preset_error,
        "time_budget": given_budget,
        "config": kwargs.get("config"),
    }
    with _LOCK:
        _GRAPHS[key] = (best, record)
    return best, record


def summary() -> dict[str, Any]:
    """The backend's summary (``mirage.dynamo_summary()``)."""
    with _LOCK:
        regions = [
            {
                "name": r.name,
                "kind": r.kind,
                "ops": list(r.ops),
                "searches": [dict(e.record) for e in r.entries.values()],
            }
            for k, r in _REGIONS.items()
            if k >= _SINCE
        ]
        return {
            "counters": dict(STATS),
            "seconds": {k: round(v, 3) for k, v in SECONDS.items()},
            "regions": regions,
            "fallbacks": [dict(f) for f in FALLBACKS],
        }


def region_by_key(key: int) -> Region:
    """The live region of a custom-op key."""
    return _REGIONS[key]


def clear_caches() -> None:
    """Forgets the searched graphs, the counters and the summary (regions already compiled
    keep their graphs)."""
    global _SINCE
    with _LOCK:
        _SINCE = len(_REGIONS)
        _GRAPHS.clear()
        for k in STATS:
            STATS[k] = 0
        for k in SECONDS:
            SECONDS[k] = 0.0
        FALLBACKS.clear()
    plan.BUDGET.reset()


# ---------------------------------------------------------------------------- custom op
@torch.library.custom_op("mirage::region", mutates_args=())
def region_op(inputs: list[torch.Tensor], key: int) -> list[torch.Tensor]:
    """Runs mirage region ``key`` on ``inputs`` (the rewritten graph's call)."""
    return _REGIONS[key](inputs)


@region_op.register_fake
def _region_fake(inputs: list[torch.Tensor], key: int) -> list[torch.Tensor]:
    return _REGIONS[key].fake(inputs)
