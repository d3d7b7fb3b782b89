"""mirage: a Rust rebuild of the Mirage multi-level tensor-program superoptimizer.

Build a kernel graph, optionally with hand-written threadblock graphs, and run it::

    import mirage as mi
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(16, 4096), dtype=mi.float16)
    W = g.new_input(dims=(4096, 4096), dtype=mi.float16)
    g.mark_output(g.matmul(g.rms_norm(X, normalized_shape=(4096,)), W))
    (out,) = g(inputs=[x, w])          # torch CPU tensors or numpy arrays

The graphs, their checks and the interpreter live in Rust (``mirage._core``); this package is
the user API. torch is optional; numpy is required. Scripts written for the reference Mirage
run unchanged where its names have a meaning here (docs/reference-compat.md).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from typing import Any

from . import _core, visualizer
from ._compat import convert_dtype_to_torch_type, convert_torch_type_to_dtype, generate_cuda_program
from ._dtypes import DType, bfloat16, float16, float32
from .explain import explain
from .kernel import KNGraph
from .search import SearchError
from .tensor import DTensor, STensor
from .threadblock import TBGraph
from .verify import Verdict, verify

__version__: str = _core.__version__

__all__ = [
    "DTensor",
    "DType",
    "KNGraph",
    "STensor",
    "SearchError",
    "TBGraph",
    "Verdict",
    "__version__",
    "bfloat16",
    "convert_dtype_to_torch_type",
    "convert_torch_type_to_dtype",
    "dynamo_stats",
    "dynamo_summary",
    "explain",
    "float16",
    "float32",
    "from_json",
    "generate_cuda_program",
    "get_gpu_device_id",
    "load_json",
    "new_kernel_graph",
    "new_threadblock_graph",
    "set_gpu_device_id",
    "verify",
    "visualizer",
]

_gpu_device_id = 0


def new_kernel_graph() -> KNGraph:
    """An empty kernel graph."""
    return KNGraph()


def new_threadblock_graph(
    grid_dim: Any, block_dim: Any, forloop_range: int, reduction_dimx: int
) -> TBGraph:
    """An empty threadblock graph: ``grid_dim`` blocks (x, y, z) of ``block_dim`` threads, a
    for-loop of ``forloop_range`` iterations, ``reduction_dimx`` for ``sum_todimx``."""
    return TBGraph(grid_dim, block_dim, forloop_range, reduction_dimx)


def from_json(text: str) -> KNGraph:
    """Reads a kernel graph from JSON text written by :meth:`KNGraph.to_json` (revalidated);
    for a file use :func:`load_json` or ``KNGraph.from_json(filename)``."""
    if not isinstance(text, str):
        raise TypeError(f"from_json: expected a str, got {type(text).__name__}")
    return KNGraph(_core.KernelGraph.from_json(text))


def load_json(path: str | os.PathLike[str]) -> KNGraph:
    """Reads a kernel graph from a JSON file written by :meth:`KNGraph.save_json`."""
    with open(os.fspath(path), encoding="utf-8") as f:
        return from_json(f.read())


def set_gpu_device_id(device_id: int) -> None:
    """Selects the CUDA device used by code generation (stored; the CPU interpreter ignores it)."""
    global _gpu_device_id
    if isinstance(device_id, bool) or not isinstance(device_id, int):
        raise TypeError(f"set_gpu_device_id: expected an int, got {device_id!r}")
    if device_id < 0:
        raise ValueError(f"set_gpu_device_id: device id must be >= 0, got {device_id}")
    _gpu_device_id = device_id


def get_gpu_device_id() -> int:
    """The CUDA device id set by :func:`set_gpu_device_id` (0 by default)."""
    return _gpu_device_id


def dynamo_stats() -> dict[str, int]:
    """Counters of the ``torch.compile(..., backend="mirage")`` backend (regions found and
    lowered, searches run, cache hits; docs/dynamo.md). Imports torch."""
    from ._dynamo import dynamo_stats as stats

    return stats()


def dynamo_summary() -> dict[str, Any]:
    """The backend's counters, seconds per phase (rewrite, Inductor, lowering, search), each
    lowered region's kind, ops and search records, and the regions left to the fallback with
    their reasons (docs/dynamo.md). Imports torch."""
    from ._dynamo import dynamo_summary as summary

    return summary()


def _mirage_dynamo_backend(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """The ``"mirage"`` torch.compile backend (imports ``mirage._dynamo`` on first use)."""
    from ._dynamo import mirage_backend

    return mirage_backend(gm, example_inputs, **kwargs)


def _register_with(registry: Any) -> None:
    """Registers the backend under ``"mirage"`` unless it already is, or torch found the
    installed entry point (torch then registers it itself, and a second name is an error)."""
    if "mirage" in getattr(registry, "_COMPILER_FNS", {"mirage": None}):
        return
    if getattr(registry, "_BACKENDS", {}).get("mirage") is not None:
        return
    registry.register_backend(compiler_fn=_mirage_dynamo_backend, name="mirage")


class _DynamoRegistryHook(importlib.abc.MetaPathFinder):
    """Registers the backend right after ``torch._dynamo.backends.registry`` is imported, for
    an uninstalled checkout whose entry point torch cannot see (importing mirage imports
    neither torch nor dynamo)."""

    _NAME = "torch._dynamo.backends.registry"

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self._NAME:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            try:
                _register_with(module)
            except Exception as e:  # noqa: BLE001 - registration must never break importing torch
                import logging

                logging.getLogger("mirage.dynamo").warning("backend not registered: %s", e)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install_dynamo_hook() -> None:
    registry = sys.modules.get(_DynamoRegistryHook._NAME)
    if registry is not None:
        _register_with(registry)
    elif not any(isinstance(f, _DynamoRegistryHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _DynamoRegistryHook())


_install_dynamo_hook()
