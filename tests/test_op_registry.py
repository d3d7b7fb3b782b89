"""The element-wise unary op registry (docs/ops.md): every entry is known to every layer —
the Python methods, the bindings' parser, JSON, the interpreter, the verifier, the CUDA
emitter and runtime header (NVRTC) and the docs table — and ``tanh`` behaves as torch's."""

from __future__ import annotations

import pathlib

import mirage as mi
import numpy as np
import pytest
import torch
from conftest import nvrtc_or_skip, run
from mirage import _core

ROOT = pathlib.Path(__file__).resolve().parents[1]
NAMES = [name for name, _ in _core.UNARY_OPS]


def _kernel_chain(names: list[str], shape: tuple[int, ...] = (4, 64)) -> mi.KNGraph:
    """One kernel graph applying each named op to the same float32 input (kernel level) and to
    its tile (block level), with every result an output."""
    g = mi.new_kernel_graph()
    X = g.new_input(dims=shape, dtype=mi.float32)
    for name in names:
        g.mark_output(getattr(g, name)(X))
    tb = mi.new_threadblock_graph((2, 1, 1), (128, 1, 1), 1, 64)
    tx = tb.new_input(X, (0, -1, -1), -1)
    for name in names:
        tb.new_output(getattr(tb, name)(tx), (0, -1, -1), -1)
    for o in g.customized([X], tb):
        g.mark_output(o)
    return g


def test_the_registry_has_unique_names_and_tanh():
    assert len(NAMES) == len(set(NAMES))
    assert {"exp", "silu", "gelu", "relu", "sqrt", "square", "tanh"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_layer_knows_every_registry_op(name, tmp_path):
    # Python methods with the registry's doc, on both graph levels.
    for cls in (mi.KNGraph, mi.TBGraph):
        method = getattr(cls, name, None)
        assert callable(method), f"{cls.__name__} lacks {name}"
        assert method.__doc__ and method.__doc__.startswith("Element-wise"), (cls, name)
    # The bindings' parser, by name (the block level goes through it in _kernel_chain).
    k = _core.KernelGraph()
    a = k.new_input([2, 8], "float32")
    assert k.tensor_dims(k.unary(name, a)) == [2, 8]
    # JSON names the op by its registry name and reads it back.
    g = _kernel_chain([name], (2, 8))
    path = tmp_path / "g.json"
    g.to_json(str(path))
    text = path.read_text()
    assert f'"op":"{name}"' in text.replace(" ", ""), text[:400]
    assert mi.KNGraph.from_json(str(path)).to_json() == g.to_json()
    # The docs table has a row for it.
    assert f"| `{name}` |" in (ROOT / "docs" / "ops.md").read_text()
    # The CUDA emitter calls the registry's device function, which the runtime header defines
    # (NVRTC compiles the graph for both architectures).
    nvrtc_or_skip()
    for arch in (80, 90):
        cubin = g.compile_cuda(arch)
        assert cubin[:4] == b"\x7fELF", f"{name}: sm_{arch}"


def test_an_unknown_unary_op_lists_the_registry():
    k = _core.KernelGraph()
    a = k.new_input([2, 8], "float32")
    with pytest.raises(ValueError, match="tanh") as e:
        k.unary("tan", a)
    for name in NAMES:
        assert name in str(e.value)


@pytest.mark.parametrize("shape", [(7,), (3, 5, 7)], ids=str)
def test_tanh_on_the_interpreter_matches_torch(rng, shape):
    x = (rng.standard_normal(shape) * 4.0).astype(np.float32)
    x.flat[0] = 30.0  # saturates, never NaN
    x.flat[-1] = -1e-4
    g = mi.new_kernel_graph()
    X = g.new_input(dims=shape, dtype=mi.float32)
    g.mark_output(g.tanh(X))
    (out,) = run(g, x)
    want = torch.tanh(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-7)


def test_block_tanh_on_the_interpreter_matches_torch(rng):
    x = rng.standard_normal((4, 64)).astype(np.float32)
    outs = run(_kernel_chain(["tanh"]), x)
    want = torch.tanh(torch.from_numpy(x)).numpy()
    assert len(outs) == 2
    for out in outs:
        np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-7)


def _one_op(name: str) -> mi.KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 64), dtype=mi.float16)
    W = g.new_input(dims=(64, 32), dtype=mi.float16)
    g.mark_output(getattr(g, name)(g.matmul(X, W)))
    return g


def _one_op_fused(name: str) -> mi.KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 64), dtype=mi.float16)
    W = g.new_input(dims=(64, 32), dtype=mi.float16)
    tb = mi.new_threadblock_graph((2, 1, 1), (128, 1, 1), 4, 16)
    tx = tb.new_input(X, (-1, -1, -1), 1)
    tw = tb.new_input(W, (1, -1, -1), 0)
    acc = tb.forloop_accum(tb.matmul(tx, tw))
    tb.new_output(getattr(tb, name)(acc), (1, -1, -1), -1)
    (Z,) = g.customized([X, W], tb)
    g.mark_output(Z)
    return g


def test_verify_accepts_tanh_graphs_and_rejects_tanh_against_silu():
    v = mi.verify(_one_op("tanh"), _one_op_fused("tanh"))
    assert v.equivalent and v.accepted, str(v)
    assert v.fragment == "lax"  # one exponential, an algebraic form in the field
    wrong = mi.verify(_one_op("tanh"), _one_op_fused("silu"))
    assert not wrong.equivalent and not wrong
