"""Names of the reference Mirage's Python API that this package maps onto its own.

Owns ``mi.generate_cuda_program``, the dtype converters ``mi.convert_dtype_to_torch_type`` /
``mi.convert_torch_type_to_dtype``, and the helpers behind ``KNGraph.compile``,
``KNGraph.from_json(filename)`` and the newer ``superoptimize`` keywords. Where the reference's
meaning differs from ours, the argument is mapped or refused with a message naming what to use;
docs/reference-compat.md lists every name.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import _core, _cuda
from ._args import as_int, short_repr
from ._dtypes import DType, bfloat16, float16, float32

if TYPE_CHECKING:
    from .kernel import KNGraph

__all__ = [
    "Done",
    "compile_graph",
    "convert_dtype_to_torch_type",
    "convert_torch_type_to_dtype",
    "generate_cuda_program",
    "load_graph_file",
    "search_keywords",
    "target_arch",
]

_DTYPES: dict[str, DType] = {"float16": float16, "bfloat16": bfloat16, "float32": float32}
#: The reference's names of its dtypes, for the messages about the ones we lack.
_REFERENCE_ONLY = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


# ------------------------------------------------------------------ dtypes
def convert_dtype_to_torch_type(dtype: Any) -> Any:
    """The torch dtype of a mirage dtype (``mi.float16`` -> ``torch.float16``; also accepts
    the names ``"float16"``, ``"fp16"``, ...). ``ValueError`` names anything else."""
    op = "convert_dtype_to_torch_type"
    if isinstance(dtype, str):
        from ._dtypes import _BY_NAME

        found = _BY_NAME.get(dtype.lower().removeprefix("mi."))
        if found is not None:
            return found.to_torch()
    if isinstance(dtype, DType):
        return dtype.to_torch()
    raise ValueError(
        f"{op}: unsupported dtype {short_repr(dtype)}; mirage has mi.float16, mi.bfloat16 and "
        "mi.float32 (the reference's integer and float64 types are not supported)"
    )


def convert_torch_type_to_dtype(torch_dtype: Any) -> DType:
    """The mirage dtype of a torch dtype (``torch.bfloat16`` -> ``mi.bfloat16``).
    ``ValueError`` names any torch dtype other than float16, bfloat16 and float32."""
    name = str(torch_dtype)
    if type(torch_dtype).__module__.startswith("torch") and name.startswith("torch."):
        found = _DTYPES.get(name[len("torch.") :])
        if found is not None:
            return found
    raise ValueError(
        f"convert_torch_type_to_dtype: unsupported dtype {short_repr(torch_dtype)}; "
        "expected torch.float16, torch.bfloat16 or torch.float32"
    )


# ------------------------------------------------------------------ graphs
def _as_graph(op: str, graph: Any) -> KNGraph:
    from .kernel import KNGraph

    if isinstance(graph, KNGraph):
        return graph
    if isinstance(graph, _core.KernelGraph):
        return KNGraph(graph)
    raise TypeError(f"{op}: expected a KNGraph (e.g. graph or graph.cygraph), got {graph!r}")


def load_graph_file(op: str, filename: Any) -> _core.KernelGraph:
    """The graph in the JSON file ``filename`` (written by ``KNGraph.to_json(filename)``)."""
    if not isinstance(filename, (str, os.PathLike)):
        raise TypeError(f"{op}: filename must be a path (str or os.PathLike), got {filename!r}")
    path = os.fspath(filename)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise FileNotFoundError(f"{op}: cannot read {path!r}: {e.strerror}") from None
    if text.lstrip()[:1] not in ("{", "["):
        raise ValueError(f"{op}: {path!r} does not hold a graph's JSON (written by to_json)")
    return _core.KernelGraph.from_json(text)


def target_arch(op: str, target_cc: Any) -> int:
    """``target_cc`` checked, or the current device's arch (90 without one) when None."""
    if target_cc is None:
        return _cuda.default_arch()
    cc = as_int(op, "target_cc", target_cc)
    if not 50 <= cc <= 200:
        raise ValueError(f"{op}: target_cc must be a compute capability such as 80 or 90, got {cc}")
    return cc


def _check_input_strides(op: str, graph: KNGraph, input_strides: Any) -> None:
    """The reference passes each input's strides to its code generator; ours reads them from
    the graph (``new_input(strides=...)``): other strides are refused."""
    if input_strides is None:
        return
    core = graph._core
    ids = core.input_ids()
    items = list(input_strides)
    if len(items) != len(ids):
        raise ValueError(
            f"{op}: input_strides has {len(items)} entries but the graph has {len(ids)} inputs"
        )
    for i, (tid, given) in enumerate(zip(ids, items)):
        dims = tuple(core.tensor_dims(tid))
        want = tuple(core.input_strides(tid))
        have = tuple(int(s) for s in given)
        if len(have) != len(dims) or any(h != w for d, h, w in zip(dims, have, want) if d != 1):
            raise ValueError(
                f"{op}: input {i} (dims {dims}) has strides {have} in input_strides but the "
                f"graph declares {want}; declare the layout in the graph with "
                f"new_input(dims={dims}, strides={have})"
            )


def _alloc_size(dims: Sequence[int], strides: Sequence[int]) -> int:
    """Elements spanned by a tensor of ``dims`` laid out with ``strides``."""
    if any(d == 0 for d in dims):
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(dims, strides))


def generate_cuda_program(
    graph: Any,
    *,
    target_cc: int | None = None,
    input_strides: Sequence[Sequence[int]] | None = None,
    num_warp_groups: int = -1,
    pipeline_stages: int = -1,
    profiling: bool = False,
    enable_online_softmax: bool = False,
) -> dict[str, Any]:
    """The CUDA program of ``graph`` for ``sm_{target_cc}`` (default: the current device's
    arch, else 90), as the reference's ``generate_cuda_program`` returns it: ``{"code",
    "buf_size", "max_smem_size", "profiler_buf_size", "output_directives"}`` plus ``"arch"``
    and ``"kernels"`` (the launch plan). ``code`` is the self-contained source
    (:meth:`KNGraph.cuda_source`); ``buf_size`` the workspace in bytes; ``max_smem_size`` the
    largest dynamic shared memory of a kernel; ``output_directives`` per output its
    ``shape``, ``strides`` and ``alloc_size`` (elements).

    ``input_strides`` must match the graph's input layouts (declare others at ``new_input``).
    ``num_warp_groups`` and ``pipeline_stages`` are accepted and ignored: the generator picks
    warpgroups and stages per kernel (``MIRAGE_WS_WARPGROUPS`` forces the attention form).
    ``profiling=True`` and ``enable_online_softmax=True`` are refused (see the messages).
    """
    op = "generate_cuda_program"
    g = _as_graph(op, graph)
    arch = target_arch(op, target_cc)
    for name, v in (("num_warp_groups", num_warp_groups), ("pipeline_stages", pipeline_stages)):
        as_int(op, name, v)
    if profiling:
        raise ValueError(
            f"{op}: profiling=True (the reference's in-kernel profiler) is not supported; use "
            "KNGraph.cuda_resources() for registers and shared memory per kernel, or time the "
            "graph with torch.cuda events"
        )
    if enable_online_softmax:
        raise ValueError(
            f"{op}: enable_online_softmax=True is not supported: the code follows the graph; "
            "express the max subtraction in it (g.softmax, or reduction_max with "
            "forloop_accum_rescale in a block graph), or let superoptimize(config='attention') "
            "find such a µGraph"
        )
    _check_input_strides(op, g, input_strides)
    source, plan = _cuda.cuda_source(g, arch)
    core = g._core
    outs = core.output_ids()
    directives = []
    for tid, strides in zip(outs, core.output_strides()):
        dims = list(core.tensor_dims(tid))
        directives.append(
            {"alloc_size": _alloc_size(dims, strides), "shape": dims, "strides": list(strides)}
        )
    kernels = plan.get("kernels", [])
    return {
        "code": source,
        "buf_size": int(plan.get("workspace_bytes", 0)),
        "max_smem_size": max((int(k.get("smem_bytes", 0)) for k in kernels), default=0),
        "profiler_buf_size": 0,
        "output_directives": directives,
        "arch": arch,
        "kernels": kernels,
    }


def _check_compile_inputs(graph: KNGraph, inputs: Any) -> None:
    """The reference's ``compile(inputs=...)`` checks: count, shapes and strides."""
    op = "compile"
    core = graph._core
    ids = core.input_ids()
    items = list(inputs)
    if len(items) != len(ids):
        raise ValueError(f"{op}: the graph has {len(ids)} inputs but {len(items)} were given")
    for i, (tid, x) in enumerate(zip(ids, items)):
        dims = tuple(core.tensor_dims(tid))
        shape = tuple(int(d) for d in getattr(x, "shape", ()))
        if shape != dims:
            raise ValueError(f"{op}: input {i}: expected shape {dims}, got {shape}")
        stride = getattr(x, "stride", None)
        if callable(stride):
            want = tuple(core.input_strides(tid))
            have = tuple(stride())
            if any(h != w for d, h, w in zip(dims, have, want) if d != 1):
                raise ValueError(
                    f"{op}: input {i} has strides {have} but the graph declares {want}; pass "
                    f"x.contiguous() or declare new_input(dims={dims}, strides={have})"
                )


def compile_graph(graph: KNGraph, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """``KNGraph.compile(**kwargs)``: generates the program (:func:`generate_cuda_program`) and
    compiles it with NVRTC: loaded on the current CUDA device when ``target_cc`` is its arch
    (``graph(inputs=...)`` on CUDA tensors then reuses it), else to a CUBIN only. Returns the
    program's dict, or None when the kernels are invalid (over the target's shared memory, or
    a compile error): ``graph.valid_kernels()`` is then False and ``graph.get_error_message()``
    says why. A missing NVRTC raises ``RuntimeError``."""
    op = "compile"
    known = {
        "inputs",
        "target_cc",
        "num_warp_groups",
        "pipeline_stages",
        "profiling",
        "enable_online_softmax",
        "file_id",
        "outputs",
        "stream",
    }
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(
            f"{op}: unexpected keyword arguments {unknown}; expected some of {sorted(known)}"
        )
    if kwargs.get("inputs") is not None:
        _check_compile_inputs(graph, kwargs["inputs"])
    result = generate_cuda_program(
        graph,
        target_cc=kwargs.get("target_cc"),
        num_warp_groups=kwargs.get("num_warp_groups", -1),
        pipeline_stages=kwargs.get("pipeline_stages", -1),
        profiling=kwargs.get("profiling", False),
        enable_online_softmax=kwargs.get("enable_online_softmax", False),
    )
    arch = result["arch"]
    # The architecture's published opt-in limit (the target descriptor's table).
    cap = _core.published_smem_optin(int(arch))
    if cap is not None and result["max_smem_size"] > cap:
        why = (
            f"shared memory usage {result['max_smem_size']} bytes exceeds the {cap} bytes a "
            f"block may use on sm_{arch}"
        )
        graph._compiled = ((*graph._state(), arch), False, why, None)
        return None
    _cuda.nvrtc_info()  # a missing NVRTC is an error of the machine, not of the kernels
    try:
        device = _cuda_device_for(arch)
        if device is not None:
            _cuda.executable(graph, device)
        else:
            _cuda.compile_cubin(graph, arch)
    except (RuntimeError, ValueError) as e:
        graph._compiled = ((*graph._state(), arch), False, f"CUDA compilation error: {e}", None)
        return None
    graph._compiled = ((*graph._state(), arch), True, "No error", result)
    return result


class Done:
    """What ``compile(async_=True)`` returns: the compile has finished; ``wait()`` gives its
    result (the reference returns a handle on a running nvcc)."""

    def __init__(self, result: dict[str, Any] | None) -> None:
        self._result = result

    def wait(self) -> dict[str, Any] | None:
        """The program's dict, or None when the kernels are invalid."""
        return self._result


def _cuda_device_for(arch: int) -> int | None:
    """The selected CUDA device when its arch is ``arch``, else None (CUBIN only)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    from . import get_gpu_device_id

    device = get_gpu_device_id()
    major, minor = torch.cuda.get_device_capability(device)
    return device if int(major) * 10 + int(minor) == arch else None


# ------------------------------------------------------------------ search keywords
def search_keywords(
    use_symbolic_search: Any,
    symbolic_checkpoint: Any,
    search_time_limit_sec: Any,
    time_budget: Any,
    previous_checkpoint: Any,
) -> tuple[Any, Any]:
    """Maps the newer reference ``superoptimize`` keywords onto ours; returns
    ``(time_budget, previous_checkpoint)``.

    * ``search_time_limit_sec``: the reference's limit in seconds (``<= 0``: none) is our
      ``time_budget``; giving both with different values is an error.
    * ``use_symbolic_search``: the reference's alternative search over symbolic tile sizes;
      there is one search here, which covers the same µGraphs with concrete sizes, so True
      runs it. ``symbolic_checkpoint`` (used by the reference only with symbolic search) is
      then our ``previous_checkpoint``.
    """
    op = "superoptimize"
    if not isinstance(use_symbolic_search, bool):
        raise TypeError(f"{op}: use_symbolic_search must be a bool, got {use_symbolic_search!r}")
    if search_time_limit_sec is not None:
        v = search_time_limit_sec
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{op}: search_time_limit_sec must be seconds (a number), got {v!r}")
        if math.isnan(float(v)):
            raise ValueError(
                f"{op}: search_time_limit_sec is NaN; pass seconds, or -1 for no limit"
            )
        limit = float(v) if v > 0 else None
        if time_budget is not None and limit is not None and time_budget != limit:
            raise ValueError(
                f"{op}: time_budget={time_budget!r} and search_time_limit_sec={v!r} disagree; "
                "pass one of them"
            )
        if time_budget is None:
            time_budget = limit
    if symbolic_checkpoint is not None and use_symbolic_search:
        if previous_checkpoint is not None and os.fspath(previous_checkpoint) != os.fspath(
            symbolic_checkpoint
        ):
            raise ValueError(
                f"{op}: previous_checkpoint={previous_checkpoint!r} and symbolic_checkpoint="
                f"{symbolic_checkpoint!r} name different files; pass one of them"
            )
        previous_checkpoint = symbolic_checkpoint
    return time_budget, previous_checkpoint
