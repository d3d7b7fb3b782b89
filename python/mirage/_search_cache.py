"""The search results cache: its key (graph, settings, the producing build and the result
switches), the checks an entry must pass before it is served, and atomic writes (see
docs/caches.md)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from typing import Any

from . import _core, _env

_CACHE_FORMAT = "mirage-rs/search-result"
#: Version of the cache file's layout (what produced its contents is in the key and the
#: header: `_producer`).
_CACHE_SCHEMA = 1


def default_cache_dir() -> str:
    """``$MIRAGE_CACHE_DIR/search`` when that is set, else ``~/.cache/mirage-rs/search``."""
    env = os.environ.get("MIRAGE_CACHE_DIR")
    if env:
        return os.path.join(env, "search")
    return os.path.join(os.path.expanduser("~"), ".cache", "mirage-rs", "search")


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
