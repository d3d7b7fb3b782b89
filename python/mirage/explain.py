"""What a µGraph does, kernel op by kernel op: :func:`explain` (also ``KNGraph.explain``), and
the one-line summary of a ``superoptimize`` choice (:func:`summary`).

For each kernel op :func:`explain_data` gives its kind (a predefined op with its shapes, or a
customized op with its block graph: grid, block, for-loop range and the block ops), the
search's cost model of it (``_core.KernelGraph.op_costs``), and, from code generation (no
NVRTC, no GPU), its launches: grid, block, cluster and dynamic shared memory, or the cuBLAS
GEMM a predefined matmul becomes where cuBLAS can be loaded (``cuBLAS gemm m x n x k``); with
``compile=True`` also ptxas's registers and spills (NVRTC needed, not a GPU). The whole
graph's measured time is shown when ``superoptimize`` profiled it (per-kernel times are not
measured). :func:`explain` renders that as text and can write the graph's DOT (and SVG/PNG
when Graphviz is installed).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO, Union

if TYPE_CHECKING:
    from .kernel import KNGraph

__all__ = ["explain", "explain_data", "summary"]

PathLike = Union[str, "os.PathLike[str]"]


# ------------------------------------------------------------------ the graph's own data
def _op_name(kind: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """An op's name and parameters from its JSON ``kind``."""
    k = str(kind["kind"])
    if k in ("unary", "binary"):
        op = kind["op"]
        if isinstance(op, Mapping):
            return str(op["op"]), {x: v for x, v in op.items() if x != "op"}
        return str(op), {}
    return k, {x: v for x, v in kind.items() if x not in ("kind", "graph")}


def _dims(d: Sequence[int]) -> str:
    return "[" + ", ".join(str(x) for x in d) + "]"


def _dim3(d: Sequence[int]) -> str:
    return "(" + ", ".join(str(x) for x in d) + ")"


def _params(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_dim3(v) if isinstance(v, list) else v}" for k, v in params.items())


def _block_lines(bg: Mapping[str, Any]) -> list[str]:
    """The block graph's ops, one line each (tensors are ``b<index>``)."""
    tensors = bg["tensors"]

    def t(i: int) -> str:
        return f"b{i}"

    def shape(i: int) -> str:
        return f"{_dims(tensors[i]['dims'])} {tensors[i]['dtype']}"

    lines = []
    for op in bg["ops"]:
        name, params = _op_name(op["kind"])
        if name == "input":
            (o,) = op["outputs"]
            lines.append(
                f"{t(o)} = input {shape(o)} (imap {_dim3(params['imap'])}, "
                f"forloop_dim {params['forloop_dim']})"
            )
        elif name == "output":
            (i,) = op["inputs"]
            lines.append(
                f"output {t(i)} (omap {_dim3(params['omap'])}, forloop_dim {params['forloop_dim']})"
            )
        else:
            args = ", ".join(t(i) for i in op["inputs"])
            if params:
                args += f"; {_params(params)}"
            outs = ", ".join(t(o) for o in op["outputs"])
            shapes = ", ".join(shape(o) for o in op["outputs"])
            lines.append(f"{outs} = {name}({args}) {shapes}")
    return lines


def _launch_plan(graph: KNGraph, compile: bool, arch: int) -> tuple[dict[str, Any] | None, str]:
    """The code generator's launch plan (with ptxas's report when ``compile``), or None and
    why not."""
    from . import _cuda

    try:
        if compile:
            return _cuda.resources(graph, arch), ""
        return _cuda.cuda_source(graph, arch)[1], ""
    except (RuntimeError, ValueError) as e:
        return None, str(e).splitlines()[0] if str(e) else type(e).__name__


def explain_data(
    graph: KNGraph,
    *,
    launches: bool = True,
    compile: bool = False,
    arch: int | None = None,
) -> dict[str, Any]:
    """The data :func:`explain` prints, as a dict: ``hash``, ``inputs`` and ``outputs``
    (``{"tensor", "dims", "dtype"}``), ``ops`` (one per kernel op but the inputs, in graph
    order: ``op`` index, ``kind`` ("predefined" or "customized"), ``name``, ``params``,
    ``inputs``/``outputs``, the cost model's ``est_us`` and ``cost``; customized ones add
    ``grid``, ``block``, ``forloop_range``, ``reduction_dimx`` and ``block_ops``; with
    ``launches`` each op's ``launches`` from code generation for ``sm_{arch}``), the sums
    ``modelled_us`` and ``num_launches``, ``measured_us`` when ``superoptimize`` profiled
    this graph, ``arch`` and ``launch_error`` (why there is no launch plan, or None)."""
    from . import _cuda
    from .kernel import KNGraph

    if not isinstance(graph, KNGraph):
        raise TypeError(f"explain: graph must be a KNGraph, got {type(graph).__name__}")
    core = graph._core
    doc = json.loads(core.to_json())["graph"]
    tensors = doc["tensors"]

    def tensor(t: int) -> dict[str, Any]:
        return {"tensor": t, "dims": list(tensors[t]["dims"]), "dtype": tensors[t]["dtype"]}

    costs = {c["op"]: c for c in core.op_costs()}
    if arch is None:
        arch = _cuda.default_arch()
    plan, why = _launch_plan(graph, compile, arch) if launches else (None, "not asked for")
    by_op: dict[int, list[dict[str, Any]]] = {}
    for k in [*(plan or {}).get("kernels", []), *(plan or {}).get("gemms", [])]:
        by_op.setdefault(int(k["op"]), []).append(k)
    ops = []
    for i, op in enumerate(doc["ops"]):
        name, params = _op_name(op["kind"])
        if name == "input":
            continue
        cost = costs.get(i, {})
        entry: dict[str, Any] = {
            "op": i,
            "kind": "customized" if name == "customized" else "predefined",
            "name": name,
            "params": params,
            "inputs": [tensor(t) for t in op["inputs"]],
            "outputs": [tensor(t) for t in op["outputs"]],
            "est_us": cost.get("est_us"),
            "cost": cost,
        }
        if name == "customized":
            bg = op["kind"]["graph"]
            entry.update(
                {
                    "grid": list(bg["grid_dim"]),
                    "block": list(bg["block_dim"]),
                    "forloop_range": bg["forloop_range"],
                    "reduction_dimx": bg["reduction_dimx"],
                    "block_ops": _block_lines(bg),
                }
            )
        if plan is not None:
            entry["launches"] = by_op.get(i, [])
        ops.append(entry)
    measured = None
    stats = graph.search_stats or {}
    sel = stats.get("selection") or {}
    # The profiled winner: a candidate, or the program as given timed beside them.
    winner = sel.get("winner") or (stats.get("winner") or {}).get("hash")
    if str(sel.get("method", "")).startswith("profiled") and winner:
        measured = (sel.get("timings_us") or {}).get(winner)
    return {
        "hash": core.hash(),
        "inputs": [tensor(t) for t in core.input_ids()],
        "outputs": [tensor(t) for t in core.output_ids()],
        "ops": ops,
        "modelled_us": sum(o["est_us"] or 0.0 for o in ops),
        "num_launches": sum(int(o["cost"].get("launches", 1)) for o in ops),
        "measured_us": measured,
        "profiled": len(sel.get("timings_us") or {}) if measured is not None else 0,
        "arch": arch,
        "launch_error": None if plan is not None else why,
    }


# ------------------------------------------------------------------ text
def _launch_line(k: Mapping[str, Any]) -> str:
    if k.get("kind") == "cublas_gemm":
        batch = int(k.get("batch", 1))
        return (
            f"{k['name']}: cuBLAS gemm {k['m']} x {k['n']} x {k['k']}"
            + (f", batch {batch}" if batch > 1 else "")
            + f", {k['input_dtype']} -> {k['output_dtype']}, fp32 accumulation"
        )
    line = (
        f"launch {k['name']}: grid {_dim3(k['grid'])}, block {_dim3(k['block'])}, "
        f"cluster {_dim3(k['cluster'])}, smem {int(k['smem_bytes']):,} B"
    )
    if "registers" in k:
        spills = int(k.get("spill_store_bytes", 0)) + int(k.get("spill_load_bytes", 0))
        line += f", {k['registers']} registers, {spills} spill bytes"
    return line


def _tensors(ts: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"t{t['tensor']} {_dims(t['dims'])} {t['dtype']}" for t in ts)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}{'es' if word.endswith('ch') else 's'}"


def _render(d: Mapping[str, Any]) -> list[str]:
    ops = d["ops"]
    custom = sum(1 for o in ops if o["kind"] == "customized")
    head = (
        f"µGraph {d['hash'][:12]}: {_plural(len(ops), 'kernel op')} ({custom} customized), "
        f"{_plural(d['num_launches'], 'launch')}; modelled {d['modelled_us']:.2f} us "
        "(cost model, sm_90 target)"
    )
    if d["measured_us"] is not None:
        head += f"; measured {d['measured_us']:.2f} us (whole graph, {d['profiled']} profiled)"
    lines = [head, f"inputs: {_tensors(d['inputs'])} -> outputs: {_tensors(d['outputs'])}"]
    if d["launch_error"] is not None:
        lines.append(f"launches for sm_{d['arch']}: none ({d['launch_error']})")
    for o in ops:
        what = "customized" if o["kind"] == "customized" else f"predefined {o['name']}"
        if o["kind"] == "predefined" and o["params"]:
            what += f" ({_params(o['params'])})"
        est = "" if o["est_us"] is None else f"; modelled {o['est_us']:.2f} us"
        lines.append(
            f"[op {o['op']}] {what}: {_tensors(o['inputs'])} -> {_tensors(o['outputs'])}{est}"
        )
        if o["kind"] == "customized":
            tiles = int(o["cost"].get("shared_memory", 0))
            lines.append(
                f"    grid {_dim3(o['grid'])}, block {_dim3(o['block'])}, for-loop range "
                f"{o['forloop_range']}, reduction_dimx {o['reduction_dimx']}, "
                f"tiles {tiles:,} B (cost model)"
            )
        for k in o.get("launches", []):
            lines.append("    " + _launch_line(k))
        for b in o.get("block_ops", []):
            lines.append("      " + b)
    return lines


def explain(
    graph: KNGraph,
    *,
    launches: bool = True,
    compile: bool = False,
    arch: int | None = None,
    dot: PathLike | None = None,
    file: TextIO | None = None,
    quiet: bool = False,
) -> str:
    """Prints (to ``file``, default ``sys.stdout``; nothing when ``quiet``) and returns what
    ``graph`` runs, kernel op by kernel op: kind, shapes, grid, block, for-loop range, block
    ops, the cost model's time, and the launches code generation makes for ``sm_{arch}``
    (default: the current GPU's, else 90; ``launches=False`` skips code generation). With
    ``compile=True`` the launches carry ptxas's registers and spills (needs NVRTC, not a
    GPU). ``dot``: also writes the graph's DOT there (and SVG/PNG when Graphviz's ``dot`` is
    installed; see :meth:`KNGraph.visualize`). See :func:`explain_data` for the same as data."""
    d = explain_data(graph, launches=launches, compile=compile, arch=arch)
    lines = _render(d)
    if dot is not None:
        written = graph.visualize(dot)
        lines.append("wrote " + ", ".join(written))
    text = "\n".join(lines) + "\n"
    if not quiet:
        (file or sys.stdout).write(text)
    return text


# ------------------------------------------------------------------ superoptimize's summary
def cached_tag(selection: Mapping[str, Any]) -> str:
    """``", cached timings"`` where a selection's GPU timings came from the search cache."""
    return ", cached timings" if selection.get("method") == "profiled (cached)" else ""


def summary(result: KNGraph, stats: Mapping[str, Any], index: int, considered: int) -> str:
    """One line saying which candidate ``superoptimize`` chose (``index`` of ``considered``)
    and why: its kernel ops and launches, the cost model's time, the measured time when
    profiled, and where the candidates came from."""
    doc = json.loads(result._core.to_json())["graph"]
    kinds = [op["kind"]["kind"] for op in doc["ops"] if op["kind"]["kind"] != "input"]
    custom = kinds.count("customized")
    win = stats["winner"]
    sel = stats["selection"]
    line = (
        f"chose candidate {index} of {considered}: {_plural(len(kinds), 'kernel op')} "
        f"({custom} customized, {_plural(int(win['cost']['launches']), 'launch')}), "
        f"cost model {win['cost']['est_us']:.2f} us"
    )
    timings = sel.get("timings_us") or {}
    if str(sel.get("method", "")).startswith("profiled") and win["hash"] in timings:
        us = timings[win["hash"]]
        rank = "fastest of" if us <= min(timings.values()) else "among"
        line += f", measured {us:.2f} us ({rank} {len(timings)} profiled{cached_tag(sel)})"
    else:
        why = sel.get("reason")
        line += " (cheapest verified" + (f"; {why}" if why else "") + ")"
    source = stats.get("source")
    if source == "search":
        line += f"; searched in {float(stats.get('total_seconds', 0.0)):.2f} s"
    else:
        line += f"; from the {source}"
    return line
