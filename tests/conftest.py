"""Shared fixtures and helpers of the pytest suite.

Helpers are imported by the test modules with ``from conftest import ...`` (pytest puts this
folder on ``sys.path``: the folder has no ``__init__.py``).
"""

import importlib.util
import os
import pathlib
import sys
import zlib
from types import ModuleType

import mirage as mi
import numpy as np
import pytest
import torch

#: JSON of every graph the suite ran on the CPU interpreter, by graph hash: the last test module
#: (test_zz_every_graph_compiles.py) compiles each with NVRTC for sm_80 and sm_90.
RAN_GRAPHS: dict[str, str] = {}
_cpu_run = mi.KNGraph.run


def _recording_run(self, inputs=None):
    out = _cpu_run(self, inputs)
    RAN_GRAPHS.setdefault(self.hash(), self.to_json())
    return out


mi.KNGraph.run = _recording_run


#: The GPU benchmark's scripts (``benches/gpu``), some of whose parts run without a GPU.
GPU_SCRIPTS = pathlib.Path(__file__).parents[1] / "benches" / "gpu"


def gpu_script(name: str) -> ModuleType:
    """``benches/gpu/<name>.py`` loaded as a module (its imports of bench.py and the like
    resolve beside it; torch is in the test venv)."""
    spec = importlib.util.spec_from_file_location(name, GPU_SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    # Dataclasses resolve their string annotations through ``sys.modules``.
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def pytest_sessionfinish(session, exitstatus):
    """With ``MIRAGE_DUMP_GRAPHS`` set, writes every graph the suite ran there, one
    ``<hash>.json`` each (the input of ``benches/dump_sources.py``)."""
    folder = os.environ.get("MIRAGE_DUMP_GRAPHS")
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    for h, text in RAN_GRAPHS.items():
        with open(os.path.join(folder, f"{h}.json"), "w", encoding="utf-8") as f:
            f.write(text)


def nvrtc_or_skip() -> None:
    """Skips the calling test when NVRTC cannot be loaded (never in CI, which has it via the
    venv: there it fails)."""
    from mirage import _cuda

    try:
        _cuda.nvrtc_info()
    except RuntimeError as e:  # pragma: no cover - CI has NVRTC via the venv
        if os.environ.get("CI"):
            raise
        pytest.skip(f"NVRTC not available: {e}")


def pytest_collection_modifyitems(config, items):
    """Skips tests marked ``gpu`` on machines without a CUDA GPU."""
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def rng(request):
    """A generator with a fixed seed per test (derived from the test's id, so stable)."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def as_f64(x):
    """A torch tensor or numpy array as a float64 numpy array."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def rel_err(out, ref):
    """``||out - ref|| / ||ref||`` in float64 (Frobenius norms)."""
    out, ref = as_f64(out), as_f64(ref)
    assert out.shape == ref.shape, f"shape {out.shape} != reference shape {ref.shape}"
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def assert_close(out, ref, tol=1e-5):
    """Asserts the relative error of ``out`` against ``ref`` is below ``tol``."""
    err = rel_err(out, ref)
    assert np.isfinite(err) and err < tol, f"relative error {err:.3g} >= {tol:g}"


def randn(rng, *shape, scale=1.0):
    """Standard normal float32 values (a numpy array) times ``scale``."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def uniform(rng, lo, hi, *shape):
    """Uniform float32 values in ``[lo, hi)``."""
    return rng.uniform(lo, hi, shape).astype(np.float32)


def run(graph, *inputs):
    """Runs ``graph`` on numpy float32 inputs through the torch path; returns float64 arrays."""
    outs = graph(inputs=[torch.from_numpy(np.ascontiguousarray(x)) for x in inputs])
    assert isinstance(outs, list)
    return [as_f64(o) for o in outs]


def assert_error(excinfo, *parts):
    """Asserts the raised exception's message contains every one of ``parts``."""
    msg = str(excinfo.value)
    for p in parts:
        assert str(p) in msg, f"{p!r} not in error message {msg!r}"
