"""``superoptimize``'s keyword arguments: their checks, the ``config`` presets and the
ranges of the integer settings (``mirage.search`` re-exports the public names)."""

from __future__ import annotations

import math
import operator
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from ._args import MAX_EXTENT, as_dim3, as_int, as_map3, short_repr

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
