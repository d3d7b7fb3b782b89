"""The element-wise op registry (docs/ops.md): every unary and binary entry is known to every
layer — the Python methods, the bindings' parser, JSON, the interpreter, the verifier, the CUDA
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
BINARY_NAMES = [name for name, _ in _core.BINARY_OPS]
# The meaning each binary op must have (numpy, float32): an op the registry gains needs one here.
BINARY_MEANINGS = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "pow": np.power,
}


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


def _binary_chain(name: str, shape: tuple[int, int] = (4, 64)) -> mi.KNGraph:
    """``A op B`` on the kernel level and on the tiles of a block graph, with ``B`` broadcast
    along the last dim on both levels (a second pair of outputs)."""
    g = mi.new_kernel_graph()
    A = g.new_input(dims=shape, dtype=mi.float32)
    B = g.new_input(dims=shape, dtype=mi.float32)
    C = g.new_input(dims=(shape[0], 1), dtype=mi.float32)
    g.mark_output(getattr(g, name)(A, B))
    g.mark_output(getattr(g, name)(A, C))
    tb = mi.new_threadblock_graph((2, 1, 1), (128, 1, 1), 1, 64)
    ta, tb_, tc = (tb.new_input(t, (0, -1, -1), -1) for t in (A, B, C))
    tb.new_output(getattr(tb, name)(ta, tb_), (0, -1, -1), -1)
    tb.new_output(getattr(tb, name)(ta, tc), (0, -1, -1), -1)
    for o in g.customized([A, B, C], tb):
        g.mark_output(o)
    return g


def test_the_binary_registry_has_unique_names_and_the_arithmetic_ops():
    assert len(BINARY_NAMES) == len(set(BINARY_NAMES))
    assert not set(BINARY_NAMES) & set(NAMES)
    assert {"add", "sub", "mul", "div", "pow"} <= set(BINARY_NAMES)


@pytest.mark.parametrize("name", BINARY_NAMES)
def test_every_layer_knows_every_binary_registry_op(name, rng, tmp_path):
    # Python methods on both graph levels.
    for cls in (mi.KNGraph, mi.TBGraph):
        method = getattr(cls, name, None)
        assert callable(method), f"{cls.__name__} lacks {name}"
        assert method.__doc__, (cls, name)
    # The bindings' parser, by name, with broadcasting.
    k = _core.KernelGraph()
    a = k.new_input([2, 8], "float32")
    b = k.new_input([2, 1], "float32")
    assert k.tensor_dims(k.binary(name, a, b)) == [2, 8]
    # JSON names the op by its registry name and reads it back.
    g = _binary_chain(name)
    path = tmp_path / "g.json"
    g.to_json(str(path))
    text = path.read_text().replace(" ", "")
    assert f'"kind":"binary","op":"{name}"' in text, text[:400]
    assert mi.KNGraph.from_json(str(path)).to_json() == g.to_json()
    # The interpreter (kernel and block level) computes the registry's meaning.
    x = rng.uniform(0.5, 2.0, (4, 64)).astype(np.float32)
    y = rng.uniform(0.5, 2.0, (4, 64)).astype(np.float32)
    c = rng.uniform(0.5, 2.0, (4, 1)).astype(np.float32)
    want = BINARY_MEANINGS[name]
    outs = run(g, x, y, c)
    assert len(outs) == 4
    for out, other in zip(outs, (y, c, y, c)):
        np.testing.assert_allclose(out, want(x, other), rtol=2e-6, atol=1e-7)
    # The docs table has a row for it.
    assert f"| `{name}` |" in (ROOT / "docs" / "ops.md").read_text()
    # The CUDA emitter writes it, and NVRTC compiles the graph for both architectures.
    nvrtc_or_skip()
    for arch in (80, 90):
        cubin = g.compile_cuda(arch)
        assert cubin[:4] == b"\x7fELF", f"{name}: sm_{arch}"


def test_an_unknown_binary_op_lists_the_registry():
    k = _core.KernelGraph()
    a = k.new_input([2, 8], "float32")
    with pytest.raises(ValueError, match="unknown binary op") as e:
        k.binary("max", a, a)
    for name in BINARY_NAMES:
        assert name in str(e.value)
