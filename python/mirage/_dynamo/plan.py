"""What the backend searches and how: region splitting, region kinds, per-kind search settings
and the search time budgets (docs/dynamo.md).

* **Splitting.** The partitioner groups every connected supported node, which in a transformer
  joins a layer's output projection, residual add, norm, gated MLP, down projection and the
  next layer's norm and QKV projections into one region of 15 ops and 4 outputs: a search
  that does not finish in minutes. A partition is cut into *stages*: a projection (``linear``,
  or a matmul by a 2-D operand) or the start of an RMS norm whose input depends on a
  projection of the current stage starts the next stage. Each stage is then one of the forms
  the search handles well (norm + projections, gated MLP, projection + residual add).
* **Kinds.** A lowered region is ``elementwise`` (no matmul, norm, softmax or reduction),
  ``matmul`` (matmuls and element-wise ops only), ``norm`` (norms or reductions and
  element-wise ops), ``norm_matmul`` (a norm or reduction with matmuls), ``attention``
  (softmax with matmuls) or ``other``; the kind picks the search settings when the
  ``config`` option is not given (``KIND_SETTINGS``).
* **Budgets.** Each search gets ``time_budget`` seconds (default ``DEFAULT_REGION_BUDGET``)
  and all searches of the process together ``total_time_budget`` seconds (default
  ``DEFAULT_TOTAL_BUDGET``; a search gets at most what is left); a region whose search would
  start after that runs its graph unsearched. ``None`` lifts either limit.
"""

from __future__ import annotations

import json
import operator
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import fx

from ..kernel import KNGraph
from .lower import _LINEAR, _MATMUL, _POW, _RMS_NORM

#: Seconds a region's search may run when the ``time_budget`` option is not given.
DEFAULT_REGION_BUDGET = 30.0
#: Seconds all searches of the process may take together when ``total_time_budget`` is not
#: given (a search gets at most what is left of it).
DEFAULT_TOTAL_BUDGET = 300.0

#: ``superoptimize`` settings per region kind (used when the ``config`` option is None).
#: Element-wise regions are not lowered unless the ``elementwise`` option is on; then one
#: customized kernel suffices, as for a norm alone. Projections with a norm prologue or an element-wise epilogue
#: (norm + linear, gated MLP, linear + residual) are the ``"mlp"`` preset's µGraphs (one
#: customized kernel): on the CPU its search took 0.5 s for RMSNorm + Linear(64, 64) and
#: 2.3 s for RMSNorm + gated MLP(64, 176), against 5.5 s and 19.6 s with the defaults (two
#: customized kernels), for the same cost-model winner (docs/dynamo.md).
KIND_SETTINGS: dict[str, dict[str, Any]] = {
    "elementwise": {"config": {"max_kernel_ops": 1, "max_customized_ops": 1}},
    "matmul": {"config": "mlp"},
    "norm_matmul": {"config": "mlp"},
    "norm": {"config": {"max_kernel_ops": 1, "max_customized_ops": 1}},
    "attention": {"config": "attention"},
    "other": {"config": None},
}

_ELEMENTWISE_OPS = {
    "add",
    "sub",
    "mul",
    "div",
    "exp",
    "sqrt",
    "silu",
    "gelu",
    "relu",
    "tanh",
    "square",
    "pow",
}
_NORM_OPS = {"rms_norm", "reduction", "sum", "mean"}


# ---------------------------------------------------------------------------- splitting
def _is_projection(node: fx.Node) -> bool:
    """A ``linear``, or a matmul by a 2-D operand (a weight)."""
    if node.op == "call_function" and node.target in _LINEAR:
        return True
    is_mm = (node.op == "call_function" and node.target in _MATMUL) or (
        node.op == "call_method" and node.target == "matmul"
    )
    if not is_mm or len(node.args) < 2 or not isinstance(node.args[1], fx.Node):
        return False
    rhs = node.args[1].meta.get("example_value")
    return isinstance(rhs, torch.Tensor) and rhs.dim() == 2


def _is_norm_start(node: fx.Node) -> bool:
    """``F.rms_norm``, or ``x.pow(2)`` (the first step of the spelled-out RMS norm)."""
    if node.op == "call_function" and node.target in _RMS_NORM:
        return True
    is_pow = (node.op == "call_method" and node.target == "pow") or (
        node.op == "call_function" and node.target in _POW
    )
    return is_pow and len(node.args) > 1 and node.args[1] in (2, 2.0)


def _is_view(node: fx.Node) -> bool:
    """A node that computes nothing (a view, a cast, ``item``)."""
    from .lower import _CAST_METHODS, _VIEW_FUNCS, _VIEW_METHODS

    if node.op == "call_method":
        return node.target in _VIEW_METHODS or node.target in _CAST_METHODS or node.target == "item"
    return node.op == "call_function" and node.target in _VIEW_FUNCS


def connected_pieces(nodes: Sequence[fx.Node]) -> list[list[fx.Node]]:
    """The nodes of one partition grouped by the data edges between them, each group in the
    given order. Torch's partitioner before ``skip_horizontal_fusion`` existed joins
    independent consumers of an unsupported node into one partition; each such group is a
    separate region. A group of a valid partition is itself valid: a path leaving a group and
    coming back would leave the partition or join the groups."""
    inside = {n: i for i, n in enumerate(nodes)}
    parent = list(range(len(nodes)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, n in enumerate(nodes):
        for arg in n.all_input_nodes:
            j = inside.get(arg)
            if j is not None:
                parent[root(i)] = root(j)
    groups: dict[int, list[fx.Node]] = {}
    for i, n in enumerate(nodes):
        groups.setdefault(root(i), []).append(n)
    return list(groups.values())


def drop_slices(nodes: Sequence[fx.Node]) -> list[fx.Node]:
    """The partition's nodes without the ``getitem`` slices of tensors it ends with (the
    partitioner adds a getitem to its source's partition; mirage has no slicing, so such a
    region would not lower): they stay torch code between regions."""
    inside = set(nodes)

    def is_slice(n: fx.Node) -> bool:
        if n.op != "call_function" or n.target is not operator.getitem or not n.args:
            return False
        src = n.args[0]
        return (
            isinstance(src, fx.Node)
            and isinstance(src.meta.get("example_value"), torch.Tensor)
            and all(u not in inside for u in n.users)
        )

    return [n for n in nodes if not is_slice(n)]


def split_stages(nodes: Sequence[fx.Node]) -> list[list[fx.Node]]:
    """The stages of one partition's nodes (see the module docs), in graph order. Views and
    casts of values from outside the partition go to the stage of their consumers; one read by
    several stages is left out of every stage (it then runs as torch code)."""
    order = {n: i for i, n in enumerate(nodes[0].graph.nodes)} if nodes else {}
    ns = sorted(nodes, key=order.__getitem__)
    inside = set(ns)
    level: dict[fx.Node, int] = {}
    after_mm: dict[fx.Node, bool] = {}
    outer_view: set[fx.Node] = set()
    for n in ns:
        ins = [a for a in n.all_input_nodes if a in inside]
        if _is_view(n) and all(a in outer_view for a in ins):
            outer_view.add(n)
            level[n], after_mm[n] = 0, False
            continue
        ins = [a for a in ins if a not in outer_view]
        lv = max((level[a] for a in ins), default=0)
        mm = any(after_mm[a] for a in ins if level[a] == lv)
        if mm and (_is_projection(n) or _is_norm_start(n)):
            lv, mm = lv + 1, False
        level[n] = lv
        after_mm[n] = mm or _is_projection(n)
    if max(level.values(), default=0) == 0:
        return [ns]
    # A cast of a computed value read by one later stage only goes to that stage (else both
    # stages would output the same value).
    for n in reversed(ns):
        if n in outer_view or not _is_view(n) or any(u not in inside for u in n.users):
            continue
        users = {level[u] for u in n.users}
        if len(users) == 1:
            level[n] = users.pop()
    dropped: set[fx.Node] = set()
    for n in reversed(ns):
        if n not in outer_view:
            continue
        users = {level[u] for u in n.users if u in inside and u not in dropped}
        if len(users) == 1:
            level[n] = users.pop()
        else:
            dropped.add(n)
    stages: dict[int, list[fx.Node]] = {}
    for n in ns:
        if n not in dropped:
            stages.setdefault(level[n], []).append(n)
    return [stages[k] for k in sorted(stages)]


def split_projections(gm: fx.GraphModule, stage: list[fx.Node]) -> list[list[fx.Node]]:
    """A stage with several outputs, each computed by its own projection from a shared
    prologue (a norm feeding Q, K and V), as one piece per output: the prologue's nodes are
    copied into every piece after the first. Other stages are returned whole."""
    inside = set(stage)
    outs = [n for n in stage if any(u not in inside for u in n.users)]
    if len(outs) < 2:
        return [stage]
    pieces = []
    for o in outs:
        anc: set[fx.Node] = set()
        todo = [o]
        while todo:
            n = todo.pop()
            if n in anc:
                continue
            anc.add(n)
            todo.extend(a for a in n.all_input_nodes if a in inside)
        pieces.append(anc)
    projs = [[n for n in p if _is_projection(n)] for p in pieces]
    if any(len(p) != 1 for p in projs) or len({p[0] for p in projs}) != len(projs):
        return [stage]
    if set().union(*pieces) != inside:
        return [stage]
    shared = set.intersection(*pieces)
    if any(_is_projection(n) for n in shared):
        return [stage]
    # Every node is in one piece only, or in all of them (the prologue that gets copied).
    if sum(len(p) for p in pieces) != len(inside) + (len(pieces) - 1) * len(shared):
        return [stage]
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    result = [sorted(pieces[0], key=order.__getitem__)]
    for piece in pieces[1:]:
        nodes = _with_copied_prologue(gm, shared, piece - shared, order)
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        result.append(sorted(nodes, key=order.__getitem__))
    return result


def _with_copied_prologue(
    gm: fx.GraphModule, shared: set[fx.Node], own: set[fx.Node], order: dict[fx.Node, int]
) -> list[fx.Node]:
    """Copies the ``shared`` nodes (each right after its original) and points the ``own``
    nodes at the copies; returns the copies and ``own``."""
    copies: dict[fx.Node, fx.Node] = {}

    def swap(a: fx.Node) -> fx.Node:
        return copies.get(a, a)

    for n in sorted(shared, key=order.__getitem__):
        with gm.graph.inserting_after(n):
            copies[n] = gm.graph.node_copy(n, swap)
    for n in own:
        n.args = fx.node.map_arg(n.args, swap)
        n.kwargs = fx.node.map_arg(n.kwargs, swap)
    return [*copies.values(), *own]


# ---------------------------------------------------------------------------- kinds
def graph_ops(g: KNGraph) -> list[str]:
    """The names of a kernel graph's ops (inputs left out), in order."""
    doc = json.loads(g.to_json())
    out = []
    for o in doc["graph"]["ops"]:
        kind = o["kind"]
        if kind["kind"] == "input":
            continue
        op = kind.get("op")
        if isinstance(op, Mapping):
            op = op.get("op")
        out.append(str(op) if isinstance(op, str) else str(kind["kind"]))
    return out


def region_kind(ops: Sequence[str]) -> str:
    """The kind of a region from its kernel ops (see the module docs)."""
    names = set(ops)
    has_mm = "matmul" in names
    if "softmax" in names:
        return "attention" if has_mm else "other"
    if names & _NORM_OPS:
        if has_mm:
            return "norm_matmul"
        return "norm" if names <= _ELEMENTWISE_OPS | _NORM_OPS else "other"
    if has_mm:
        return "matmul" if names <= _ELEMENTWISE_OPS | {"matmul"} else "other"
    return "elementwise" if names <= _ELEMENTWISE_OPS else "other"


def kind_settings(kind: str, options: Any) -> dict[str, Any]:
    """``superoptimize`` keywords for a region of ``kind`` under the backend ``options``: the
    ``config`` option when given, else the kind's; the per-search budget."""
    kw: dict[str, Any] = {}
    config = options.config if options.config is not None else KIND_SETTINGS[kind]["config"]
    if config is not None:
        kw["config"] = config
    if options.time_budget is not None:
        kw["time_budget"] = float(options.time_budget)
    return kw


# ---------------------------------------------------------------------------- budgets
class Budget:
    """Search seconds spent in this process (``total_time_budget``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spent = 0.0

    def left(self, options: Any) -> float:
        """Seconds left of the total budget under ``options`` (``inf`` when unlimited)."""
        total = options.total_time_budget
        if total is None:
            return float("inf")
        with self._lock:
            return float(total) - self.spent

    def charge(self, seconds: float) -> None:
        """Adds ``seconds`` of search."""
        with self._lock:
            self.spent += seconds

    def reset(self) -> None:
        """Forgets the seconds spent."""
        with self._lock:
            self.spent = 0.0


BUDGET = Budget()
