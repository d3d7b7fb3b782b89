"""The ``torch.compile(model, backend="mirage")`` backend (docs/dynamo.md).

Dynamo hands the backend an FX graph of torch-level ops. Regions of supported ops (matmuls,
linear, RMS norms, softmax, attention without a mask, element-wise arithmetic and activations,
views of their inputs) are found with torch's ``CapabilityBasedPartitioner`` and cut into
stages and per projection (``plan``); each one that lowers to a mirage kernel graph runs
through the ``mirage::region`` custom op (searched per input shape with settings by region
kind under time budgets, cached), and the rewritten graph goes to the fallback compiler
(Inductor by default, or eager). A region that does not lower stays torch code, with the reason logged on
the ``mirage.dynamo`` logger.
"""

from __future__ import annotations

import inspect
import logging
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition
from torch.fx.passes.operator_support import OperatorSupportBase

from . import plan as _plan
from . import region as _region
from .lower import Unsupported, is_supported_node, lower_region

__all__ = ["BackendOptions", "clear_caches", "dynamo_stats", "dynamo_summary", "mirage_backend"]

log = logging.getLogger("mirage.dynamo")

_FALLBACKS = ("inductor", "eager")
_CHOICES = ("profile", "mirage")


@dataclass(frozen=True)
class BackendOptions:
    """``torch.compile(..., backend="mirage", options={...})``: the search's ``config`` (None:
    chosen per region kind), ``time_budget`` (seconds per search; None: unlimited),
    ``total_time_budget`` (seconds of all searches of the process; None: unlimited) and
    ``cache_dir``; ``verbose``; ``fallback`` (``"inductor"`` or ``"eager"``: what compiles the
    rest of the graph); ``search`` (False: run the lowered graphs unsearched); ``bucket`` (pad
    dynamic rows to powers of two); ``split`` (cut regions into stages and projections);
    ``elementwise`` (lower regions of element-wise ops only); ``search_kwargs`` (other
    ``superoptimize`` keywords, e.g. ``{"franges": [4]}``); ``choose`` (``"profile"``: on
    CUDA each region's searched graph is timed against its own torch code at the first call of
    each input shape and the faster runs; ``"mirage"``: always the searched graph)."""

    config: Any = None
    time_budget: float | None = _plan.DEFAULT_REGION_BUDGET
    total_time_budget: float | None = _plan.DEFAULT_TOTAL_BUDGET
    cache_dir: str | None = None
    verbose: bool = False
    fallback: str = "inductor"
    search: bool = True
    bucket: bool = True
    split: bool = True
    elementwise: bool = False
    search_kwargs: Mapping[str, Any] = field(default_factory=dict)
    choose: str = "profile"

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None) -> BackendOptions:
        """Checks and reads the ``options`` mapping (unknown keys raise ``ValueError``)."""
        if options is None:
            return cls()
        if not isinstance(options, Mapping):
            raise TypeError(f"mirage backend: options must be a dict, got {type(options).__name__}")
        known = set(cls.__dataclass_fields__)
        bad = sorted(set(options) - known)
        if bad:
            raise ValueError(f"mirage backend: unknown option(s) {bad}; known: {sorted(known)}")
        o = cls(**dict(options))
        if o.fallback not in _FALLBACKS:
            raise ValueError(
                f"mirage backend: fallback must be one of {_FALLBACKS}, got {o.fallback!r}"
            )
        for name in ("time_budget", "total_time_budget"):
            v = getattr(o, name)
            if v is not None and not (
                isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
            ):
                raise ValueError(
                    f"mirage backend: {name} must be a positive number or None, got {v!r}"
                )
        if o.choose not in _CHOICES:
            raise ValueError(f"mirage backend: choose must be one of {_CHOICES}, got {o.choose!r}")
        if not isinstance(o.search_kwargs, Mapping):
            raise TypeError("mirage backend: search_kwargs must be a dict")
        return o


class _Support(OperatorSupportBase):
    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: fx.Node) -> bool:
        return is_supported_node(node)


def _hint(x: Any) -> Any:
    """A concrete value for a possibly symbolic int (its hint)."""
    if isinstance(x, torch.SymInt):
        n = x.node
        h = getattr(n, "hint", None)
        if h is None:
            h = n.shape_env.size_hint(n.expr)
        return int(h)
    return x


def _example(v: Any) -> Any:
    """A meta tensor with the (hinted) shape, strides and dtype of an example value."""
    if isinstance(v, torch.Tensor):
        shape = [_hint(d) for d in v.shape]
        stride = [_hint(s) for s in v.stride()]
        if v.dim() == 0:
            return torch.zeros((), dtype=v.dtype)
        return torch.empty_strided(shape, stride, dtype=v.dtype, device="meta")
    return _hint(v)


def _is_dynamic(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape)


def _compute_nodes(gm: fx.GraphModule) -> int:
    """Nodes of a region that compute (not views, casts or ``item``)."""
    skip = {
        "to",
        "float",
        "half",
        "bfloat16",
        "type_as",
        "contiguous",
        "item",
        "transpose",
        "permute",
        "t",
        "view",
    }
    skip |= {"reshape", "unsqueeze"}
    return sum(
        1
        for n in gm.graph.nodes
        if n.op == "call_function" or (n.op == "call_method" and n.target not in skip)
    )


def _output_node(gm: fx.GraphModule) -> fx.Node:
    return next(n for n in gm.graph.nodes if n.op == "output")


def _try_region(sub: fx.GraphModule, node: fx.Node, opts: BackendOptions) -> _region.Region | str:
    """A Region for fused node ``node`` (submodule ``sub``), or the reason it stays torch code."""
    vals = [a.meta.get("example_value") if isinstance(a, fx.Node) else a for a in node.args]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return "an input is not a tensor"
    if _compute_nodes(sub) == 0:
        return "nothing to compute"
    examples = [_example(v) for v in vals]
    reasons = []
    for flatten in (True, False):
        try:
            trial = lower_region(sub, examples, flatten)
        except Unsupported as e:
            reasons.append(f"{'rows' if flatten else 'as is'}: {e}")
            continue
        outs = _output_node(sub).args[0]
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        dtypes = [
            o.meta["example_value"].dtype if "example_value" in o.meta else trial.dtype
            for o in outs
        ]
        kind = _plan.region_kind(_plan.graph_ops(trial.graph))
        if kind == "elementwise" and not opts.elementwise:
            return "element-wise ops only (the fallback fuses them; option elementwise=True)"
        dynamic = any(_is_dynamic(v) for v in vals)
        return _region.Region(sub, flatten, dtypes, opts, dynamic, trial, kind)
    return "; ".join(reasons)


def _rewrite(gm: fx.GraphModule, opts: BackendOptions) -> fx.GraphModule:
    """Partitions ``gm`` and replaces each lowerable region by a ``mirage::region`` call."""
    # Fusing rebuilds the graph's nodes; Inductor reads dynamo's sources off the placeholders.
    sources = {
        n.name: n._dynamo_source
        for n in gm.graph.find_nodes(op="placeholder")
        if hasattr(n, "_dynamo_source")
    }
    extra = {}
    if "skip_horizontal_fusion" in inspect.signature(CapabilityBasedPartitioner).parameters:
        extra["skip_horizontal_fusion"] = True
    part = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True, **extra)
    partitions = part.propose_partitions()
    if not partitions:
        log.info("mirage: no supported ops in the graph")
        return gm
    partitions = _split(gm, partitions, opts.split)
    fused = part.fuse_partitions(partitions, prefix="mirage_region_")
    for n in fused.graph.find_nodes(op="placeholder"):
        if n.name in sources and not hasattr(n, "_dynamo_source"):
            n._dynamo_source = sources[n.name]
    op = torch.ops.mirage.region.default
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not str(node.target).startswith("mirage_region_"):
            continue
        sub = getattr(fused, node.target)
        _region.bump("regions")
        r = _try_region(sub, node, opts)
        if isinstance(r, str):
            _region.bump("regions_fallback")
            _region.FALLBACKS.append({"name": str(node.target), "reason": r})
            log.info("mirage: region %s runs through %s: %s", node.target, opts.fallback, r)
            continue
        _region.bump("regions_lowered")
        r.name = str(node.target)
        log.info(
            "mirage: region %s lowered (%d ops%s)",
            node.target,
            _compute_nodes(sub),
            ", rows" if r.flatten else "",
        )
        multi = isinstance(_output_node(sub).args[0], (list, tuple))
        with fused.graph.inserting_after(node):
            call = fused.graph.call_function(op, (list(node.args), r.key))
        call.meta = dict(node.meta)
        if multi:
            node.replace_all_uses_with(call)
        else:
            with fused.graph.inserting_after(call):
                first = fused.graph.call_function(operator.getitem, (call, 0))
            first.meta = dict(node.meta)
            node.replace_all_uses_with(first)
            first.args = (call, 0)  # replace_all_uses_with rewrote this use too
        fused.graph.erase_node(node)
        fused.delete_submodule(node.target)
    fused.graph.lint()
    fused.recompile()
    return fused


def _split(gm: fx.GraphModule, partitions: list[Partition], split: bool) -> list[Partition]:
    """Each partition without its trailing slices, and with ``split`` cut into stages and a
    stage of several projections into one piece per projection (see ``plan``)."""
    out: list[Partition] = []
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for p in partitions:
        kept = _plan.drop_slices(sorted(p.nodes, key=order.__getitem__))
        for nodes in _plan.connected_pieces(kept):
            if not split:
                out.append(Partition(id=len(out), nodes=nodes))
                continue
            for stage in _plan.split_stages(nodes):
                for piece in _plan.split_projections(gm, stage):
                    out.append(Partition(id=len(out), nodes=piece))
    if len(out) != len(partitions):
        log.info("mirage: %d partitions split into %d regions", len(partitions), len(out))
    return out


def mirage_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Callable[..., Any]:
    """The ``"mirage"`` dynamo backend (see the module docs); ``options`` as
    :class:`BackendOptions`. ``mode`` and other keywords dynamo passes are ignored."""
    opts = BackendOptions.parse(options)
    _region.bump("compiles")
    t0 = time.perf_counter()
    rewritten = _rewrite(gm, opts)
    _region.add_seconds("rewrite", time.perf_counter() - t0)
    if opts.fallback == "eager":
        return rewritten
    from torch._inductor.compile_fx import compile_fx

    t0 = time.perf_counter()
    compiled = compile_fx(rewritten, list(example_inputs))
    _region.add_seconds("fallback_compile", time.perf_counter() - t0)
    return compiled


def dynamo_stats() -> dict[str, int]:
    """The backend's counters: ``compiles``, ``regions`` (found), ``regions_lowered``,
    ``regions_fallback``, ``lowerings`` (per input-shape key), ``searches`` (run),
    ``search_disk_hits`` (served by the on-disk cache), ``graph_cache_hits`` (in-process),
    ``search_failures``, ``searches_skipped`` (the total budget was spent), ``region_calls``
    and ``regions_mirage_path`` / ``regions_torch_path`` (which code each profiled key runs)."""
    return dict(_region.STATS)


def dynamo_summary() -> dict[str, Any]:
    """The counters (``dynamo_stats``), ``seconds`` spent (``rewrite``: partitioning and
    compile-time lowering; ``fallback_compile``: Inductor; ``lower``: run-time lowering;
    ``search``: ``superoptimize`` calls), ``regions`` (each lowered region's name, kind, ops
    and per input-shape key its search record: seconds, source, the search's own seconds,
    ``confirm_seconds``, ``stopped``) and ``fallbacks`` (name and reason of each region left
    to the fallback compiler)."""
    return _region.summary()


def clear_caches() -> None:
    """Forgets the in-process searched graphs and zeroes the counters."""
    _region.clear_caches()
