"""The ``MIRAGE_*`` environment variables the package and its Rust core read, in one place.

`RESULT_SWITCHES` change the generated code or how kernels are launched, and so what the
search's profiling measures: their values are part of the search cache's key and of the key of
cached profiling winners (``mirage.search``). `OTHER_VARIABLES` only say where things are
found or written.
"""

from __future__ import annotations

import os

__all__ = ["OTHER_VARIABLES", "RESULT_SWITCHES", "result_switch_values"]

#: Switches that change generated code or launches: ``(name, what it does)``.
RESULT_SWITCHES: tuple[tuple[str, str], ...] = (
    ("MIRAGE_WS_WARPGROUPS", "2 or 3: the warp-specialised attention's consumer warpgroups"),
    ("MIRAGE_LAZY_MERGE", "0: a cluster split gathers its sums in a pass of their own"),
    ("MIRAGE_ASYNC_PUSH", "0: a cluster split's sums are stored, released on the barrier"),
    ("MIRAGE_WGMMA_ACC", "1: every loop matmul that fits sums on the warpgroup tensor cores"),
    ("MIRAGE_EVICT_FIRST", "0: tiles read once are copied without the evict_first policy"),
    ("MIRAGE_PDL", "0: kernels launch plainly, not as programmatic dependents (sm_90+)"),
    ("MIRAGE_CUBLAS", "0: predefined matmuls run on the default kernel, not on cuBLAS"),
    ("MIRAGE_LOAD_CODES", "a folder of edited sources compiled in place of generated ones"),
)

#: Variables that do not change results: ``(name, what it does)``.
OTHER_VARIABLES: tuple[tuple[str, str], ...] = (
    (
        "MIRAGE_CACHE_DIR",
        "root of the on-disk caches (search results, CUBINs); off or 0: no CUBINs",
    ),
    ("MIRAGE_SAVE_CODES", "a folder the generated CUDA sources are written to"),
    ("MIRAGE_NVRTC_PATH", "NVRTC library files or folders searched first"),
    ("MIRAGE_CUDA_INCLUDE", "CUDA include folders searched first"),
    ("MIRAGE_NVDISASM", "the nvdisasm executable used for SASS"),
    ("MIRAGE_BLESS", "1: the op registry's test rewrites docs/ops.md instead of comparing it"),
    (
        "MIRAGE_PROGRESS",
        "superoptimize's progress display where progress=None: 1 on, 0 off, plain (no tqdm)",
    ),
)


def result_switch_values() -> dict[str, str | None]:
    """The current value of each of `RESULT_SWITCHES` (``None`` where unset)."""
    return {name: os.environ.get(name) for name, _ in RESULT_SWITCHES}
