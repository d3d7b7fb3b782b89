"""Kernel-graph ops on the CPU interpreter against numpy float64 references."""

import math

import mirage as mi
import numpy as np
import pytest
import torch
from conftest import as_f64, assert_close, randn, run, uniform

erf = np.vectorize(math.erf)


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def rms_norm(x, ndims, w=None):
    axes = tuple(range(x.ndim - ndims, x.ndim))
    y = x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True))
    return y if w is None else y * w


def softmax(x, dim):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def normal(rng, shape):
    return randn(rng, *shape)


def positive(rng, shape):
    return uniform(rng, 0.25, 4.0, *shape)


# name -> (graph op, numpy reference, input generator)
UNARY = {
    "exp": (lambda g, x: g.exp(x), np.exp, normal),
    "silu": (lambda g, x: g.silu(x), silu, normal),
    "gelu": (lambda g, x: g.gelu(x), gelu, normal),
    "relu": (lambda g, x: g.relu(x), lambda x: np.maximum(x, 0.0), normal),
    "sqrt": (lambda g, x: g.sqrt(x), np.sqrt, positive),
    "square": (lambda g, x: g.square(x), np.square, normal),
    "clamp": (
        lambda g, x: g.clamp(x, min_val=-0.5, max_val=0.75),
        lambda x: np.clip(x, -0.5, 0.75),
        normal,
    ),
}

UNARY_SHAPES = [(7,), (5, 7), (3, 5, 7), (2, 3, 4, 5)]


@pytest.mark.parametrize("shape", UNARY_SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(rng, name, shape):
    op, ref, gen = UNARY[name]
    x = gen(rng, shape)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=shape, dtype=mi.float32)
    Y = op(g, X)
    assert tuple(Y.dims) == shape
    assert Y.dtype == mi.float32
    g.mark_output(Y)
    (out,) = run(g, x)
    assert_close(out, ref(as_f64(x)))


def pow_base(rng, shape):
    return uniform(rng, 0.5, 2.0, *shape)


def pow_exponent(rng, shape):
    return uniform(rng, -2.0, 2.0, *shape)


def divisor(rng, shape):
    return uniform(rng, 0.5, 2.0, *shape) * rng.choice([-1.0, 1.0], shape).astype(np.float32)


# name -> (graph op, numpy reference, generator of A, generator of B)
BINARY = {
    "add": (lambda g, a, b: g.add(a, b), np.add, normal, normal),
    "sub": (lambda g, a, b: g.sub(a, b), np.subtract, normal, normal),
    "mul": (lambda g, a, b: g.mul(a, b), np.multiply, normal, normal),
    "div": (lambda g, a, b: g.div(a, b), np.divide, normal, divisor),
    "pow": (lambda g, a, b: g.pow(a, b), np.power, pow_base, pow_exponent),
}

BROADCAST_SHAPES = [
    ((3, 5, 7), (3, 5, 7)),
    ((3, 1, 7), (3, 5, 1)),
    ((1, 5, 7), (3, 5, 7)),
    ((3, 5, 7), (1, 1, 1)),
    ((7,), (7,)),
    ((7,), (1,)),
    ((1,), (7,)),
    ((5, 1), (1, 7)),
    ((2, 1, 4, 5), (1, 3, 4, 1)),
    ((2, 3, 4, 5), (2, 3, 4, 5)),
]


@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(rng, name, shapes):
    op, ref, gen_a, gen_b = BINARY[name]
    sa, sb = shapes
    a, b = gen_a(rng, sa), gen_b(rng, sb)
    g = mi.new_kernel_graph()
    A = g.new_input(dims=sa, dtype=mi.float32)
    B = g.new_input(dims=sb, dtype=mi.float32)
    C = op(g, A, B)
    expect = np.broadcast_shapes(sa, sb)
    assert tuple(C.dims) == expect
    g.mark_output(C)
    (out,) = run(g, a, b)
    assert_close(out, ref(as_f64(a), as_f64(b)))


@pytest.mark.parametrize(
    "sa, sb",
    [
        ((5, 7), (7, 3)),
        ((1, 9), (9, 1)),
        ((64, 128), (128, 32)),
        ((2, 5, 7), (2, 7, 3)),
        ((3, 1, 4), (3, 4, 6)),
        ((2, 3, 4, 5), (2, 3, 5, 6)),
    ],
    ids=str,
)
def test_matmul(rng, sa, sb):
    a, b = randn(rng, *sa), randn(rng, *sb)
    g = mi.new_kernel_graph()
    A = g.new_input(dims=sa, dtype=mi.float32)
    B = g.new_input(dims=sb, dtype=mi.float32)
    C = g.matmul(A, B)
    assert tuple(C.dims) == sa[:-1] + sb[-1:]
    g.mark_output(C)
    (out,) = run(g, a, b)
    assert_close(out, as_f64(a) @ as_f64(b))


@pytest.mark.parametrize(
    "shape, dim",
    [((7,), 0), ((7,), -1)]
    + [((3, 5, 7), d) for d in (0, 1, 2, -1, -3)]
    + [((2, 3, 4, 5), d) for d in (0, 1, 2, 3)]
    + [((6, 1), 1), ((6, 1), 0)],
    ids=str,
)
def test_reduction(rng, shape, dim):
    x = randn(rng, *shape)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=shape, dtype=mi.float32)
    Y = g.reduction(X, dim)
    kept = list(shape)
    kept[dim] = 1
    assert tuple(Y.dims) == tuple(kept)
    g.mark_output(Y)
    (out,) = run(g, x)
    assert_close(out, as_f64(x).sum(axis=dim, keepdims=True))


@pytest.mark.parametrize(
    "shape, ndims",
    [
        ((16, 64), 1),
        ((3, 5, 7), 1),
        ((3, 5, 7), 2),
        ((2, 3, 4, 5), 2),
        ((2, 3, 4, 5), 3),
        ((9,), 1),
    ],
    ids=str,
)
@pytest.mark.parametrize("with_weight", [False, True], ids=["no_weight", "weight"])
def test_rms_norm(rng, shape, ndims, with_weight):
    norm_shape = shape[len(shape) - ndims :]
    x = randn(rng, *shape)
    w = uniform(rng, 0.5, 1.5, *norm_shape)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=shape, dtype=mi.float32)
    inputs = [x]
    if with_weight:
        W = g.new_input(dims=norm_shape, dtype=mi.float32)
        Y = g.rms_norm(X, normalized_shape=norm_shape, weight=W)
        inputs.append(w)
    else:
        Y = g.rms_norm(X, normalized_shape=norm_shape)
    assert tuple(Y.dims) == shape
    g.mark_output(Y)
    (out,) = run(g, *inputs)
    assert_close(out, rms_norm(as_f64(x), ndims, as_f64(w) if with_weight else None))


def test_rms_norm_has_no_eps(rng):
    """x / sqrt(mean(x^2)) exactly: a tiny-valued row is scaled up to unit RMS, not damped."""
    x = randn(rng, 4, 32, scale=1e-4)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 32), dtype=mi.float32)
    g.mark_output(g.rms_norm(X, normalized_shape=(32,)))
    (out,) = run(g, x)
    assert_close(out, rms_norm(as_f64(x), 1))
    np.testing.assert_allclose(np.sqrt(np.mean(out * out, axis=1)), 1.0, rtol=1e-5)


@pytest.mark.parametrize(
    "shape, dim",
    [((9,), 0), ((4, 6), 0), ((4, 6), -1)]
    + [((3, 5, 7), d) for d in (0, 1, 2, -1)]
    + [((2, 3, 4, 5), 1)],
    ids=str,
)
def test_softmax(rng, shape, dim):
    x = randn(rng, *shape, scale=3.0)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=shape, dtype=mi.float32)
    Y = g.softmax(X, dim=dim)
    assert tuple(Y.dims) == shape
    g.mark_output(Y)
    (out,) = run(g, x)
    assert_close(out, softmax(as_f64(x), dim))


def test_softmax_default_dim_is_last(rng):
    x = randn(rng, 3, 5, 7)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(3, 5, 7), dtype=mi.float32)
    g.mark_output(g.softmax(X))
    (out,) = run(g, x)
    assert_close(out, softmax(as_f64(x), -1))


def test_softmax_large_logits_is_stable(rng):
    """Logits far beyond exp's float32 range still give finite probabilities."""
    x = randn(rng, 4, 16, scale=200.0)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 16), dtype=mi.float32)
    g.mark_output(g.softmax(X, dim=1))
    (out,) = run(g, x)
    assert np.all(np.isfinite(out))
    assert_close(out, softmax(as_f64(x), 1))


def test_softmax_from_primitives(rng):
    """exp(X) / reduction(exp(X)) with the exp tensor used twice, against plain softmax."""
    x = randn(rng, 6, 10)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(6, 10), dtype=mi.float32)
    E = g.exp(X)
    S = g.reduction(E, 1)
    assert tuple(S.dims) == (6, 1)
    g.mark_output(g.div(E, S))
    (out,) = run(g, x)
    assert_close(out, softmax(as_f64(x), 1))


def test_chain_of_ops(rng):
    """An MLP-like chain: gelu(rms_norm(X) @ W1 + b) * sigmoid-ish gate, clamped."""
    x, w1, w2 = randn(rng, 8, 32), randn(rng, 32, 24, scale=0.2), randn(rng, 32, 24, scale=0.2)
    b = randn(rng, 1, 24)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 32), dtype=mi.float32)
    W1 = g.new_input(dims=(32, 24), dtype=mi.float32)
    W2 = g.new_input(dims=(32, 24), dtype=mi.float32)
    B = g.new_input(dims=(1, 24), dtype=mi.float32)
    N = g.rms_norm(X, normalized_shape=(32,))
    H = g.gelu(g.add(g.matmul(N, W1), B))
    G = g.silu(g.matmul(N, W2))
    Y = g.clamp(g.mul(H, G), -1.0, 1.0)
    g.mark_output(Y)
    (out,) = run(g, x, w1, w2, b)
    n = rms_norm(as_f64(x), 1)
    ref = np.clip(gelu(n @ as_f64(w1) + as_f64(b)) * silu(n @ as_f64(w2)), -1.0, 1.0)
    assert_close(out, ref)


def _exp_matmul_graph(dtype=mi.float32):
    g = mi.new_kernel_graph()
    A = g.new_input(dims=(4, 8), dtype=dtype)
    B = g.new_input(dims=(8, 3), dtype=dtype)
    g.mark_output(g.matmul(g.exp(A), B))
    return g


def test_torch_inputs_give_torch_outputs(rng):
    a, b = randn(rng, 4, 8), randn(rng, 8, 3)
    g = _exp_matmul_graph()
    outs = g(inputs=[torch.from_numpy(a), torch.from_numpy(b)])
    assert isinstance(outs, list) and len(outs) == 1
    (out,) = outs
    assert isinstance(out, torch.Tensor)
    assert out.dtype == torch.float32
    assert tuple(out.shape) == (4, 3)
    assert out.device.type == "cpu"
    assert_close(out, np.exp(as_f64(a)) @ as_f64(b))


def test_numpy_inputs_give_numpy_outputs(rng):
    a, b = randn(rng, 4, 8), randn(rng, 8, 3)
    g = _exp_matmul_graph()
    outs = g(inputs=[a, b])
    assert isinstance(outs, list) and len(outs) == 1
    (out,) = outs
    assert isinstance(out, np.ndarray)
    assert out.dtype == np.float32
    assert out.shape == (4, 3)
    assert_close(out, np.exp(as_f64(a)) @ as_f64(b))
    # Both paths compute the same float32 values.
    (tout,) = g(inputs=[torch.from_numpy(a), torch.from_numpy(b)])
    np.testing.assert_array_equal(out, tout.numpy())


def test_extra_call_kwargs_are_ignored(rng):
    a, b = randn(rng, 4, 8), randn(rng, 8, 3)
    g = _exp_matmul_graph()
    (ref,) = g(inputs=[a, b])
    (out,) = g(inputs=[a, b], outputs=None, stream=None)
    np.testing.assert_array_equal(out, ref)


def test_non_contiguous_torch_input(rng):
    """A transposed (non-contiguous) view is read by its logical values."""
    a, b = randn(rng, 8, 4), randn(rng, 8, 3)
    g = _exp_matmul_graph()
    at = torch.from_numpy(a).t()
    assert not at.is_contiguous()
    (out,) = g(inputs=[at, torch.from_numpy(b)])
    assert_close(out, np.exp(as_f64(a).T) @ as_f64(b))


def test_repeated_calls_with_new_inputs(rng):
    g = _exp_matmul_graph()
    for _ in range(3):
        a, b = randn(rng, 4, 8), randn(rng, 8, 3)
        (out,) = run(g, a, b)
        assert_close(out, np.exp(as_f64(a)) @ as_f64(b))


@pytest.mark.parametrize(
    "mi_dtype, torch_dtype",
    [(mi.float16, torch.float16), (mi.bfloat16, torch.bfloat16)],
    ids=["float16", "bfloat16"],
)
def test_half_precision_graphs_return_their_dtype(rng, mi_dtype, torch_dtype):
    a = torch.from_numpy(randn(rng, 6, 16, scale=0.5)).to(torch_dtype)
    b = torch.from_numpy(randn(rng, 16, 5, scale=0.5)).to(torch_dtype)
    c = torch.from_numpy(randn(rng, 6, 1)).to(torch_dtype)
    g = mi.new_kernel_graph()
    A = g.new_input(dims=(6, 16), dtype=mi_dtype)
    B = g.new_input(dims=(16, 5), dtype=mi_dtype)
    C = g.new_input(dims=(6, 1), dtype=mi_dtype)
    Y = g.add(g.matmul(g.silu(A), B), C)
    assert Y.dtype == mi_dtype
    g.mark_output(Y)
    g.mark_output(g.softmax(Y, dim=1))
    y, s = g(inputs=[a, b, c])
    assert y.dtype == torch_dtype and s.dtype == torch_dtype
    ref = silu(as_f64(a)) @ as_f64(b) + as_f64(c)
    assert_close(y, ref, tol=1e-2)
    assert_close(s, softmax(ref, 1), tol=1e-2)


def test_float16_numpy_path(rng):
    a = randn(rng, 4, 8).astype(np.float16)
    b = randn(rng, 8, 3).astype(np.float16)
    g = _exp_matmul_graph(mi.float16)
    (out,) = g(inputs=[a, b])
    assert isinstance(out, np.ndarray) and out.dtype == np.float16
    assert_close(out, np.exp(as_f64(a)) @ as_f64(b), tol=1e-2)


def test_unmarked_graph_returns_every_sink(rng):
    x = randn(rng, 3, 5)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(3, 5), dtype=mi.float32)
    E = g.exp(X)  # consumed below: not a sink
    g.mul(E, X)  # sink 1
    g.relu(X)  # sink 2
    outs = run(g, x)
    assert len(outs) == 2
    xd = as_f64(x)
    assert_close(outs[0], np.exp(xd) * xd)
    assert_close(outs[1], np.maximum(xd, 0.0))


def test_marked_outputs_come_in_marking_order(rng):
    x = randn(rng, 3, 5)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(3, 5), dtype=mi.float32)
    E = g.exp(X)
    S = g.square(E)
    g.mark_output(S)
    g.mark_output(E, strides=None)  # also consumed by S: still an output once marked
    s, e = run(g, x)
    assert_close(s, np.exp(2 * as_f64(x)))
    assert_close(e, np.exp(as_f64(x)))


def test_dtensor_attributes():
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(3, 5, 7), dtype=mi.float32)
    W = g.new_input(dims=(3, 7, 2), dtype=mi.float32)
    assert tuple(X.dims) == (3, 5, 7)
    assert isinstance(X.dims, tuple)
    assert X.dtype == mi.float32
    assert tuple(g.matmul(X, W).dims) == (3, 5, 2)
    assert tuple(g.reduction(X, 1).dims) == (3, 1, 7)
    assert tuple(g.add(X, g.reduction(X, 2)).dims) == (3, 5, 7)


def test_explicit_row_major_strides(rng):
    x = randn(rng, 3, 5, 7)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(3, 5, 7), dtype=mi.float32, strides=(35, 7, 1))
    g.mark_output(g.exp(X), strides=(35, 7, 1))
    (out,) = run(g, x)
    assert_close(out, np.exp(as_f64(x)))


def test_non_contiguous_numpy_input(rng):
    a, b = randn(rng, 8, 4), randn(rng, 8, 3)
    g = _exp_matmul_graph()
    (out,) = g(inputs=[a.T, b])
    assert_close(out, np.exp(as_f64(a).T) @ as_f64(b))


def test_column_major_input_and_output_strides(rng):
    """Declared strides describe the layout of the tensors passed and returned; values are
    the logical ones."""
    x = randn(rng, 5, 7)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(5, 7), dtype=mi.float32, strides=(1, 5))
    g.mark_output(g.exp(X), strides=(1, 5))
    xt = torch.from_numpy(np.ascontiguousarray(x.T)).t()  # logical (5, 7), column-major
    assert xt.stride() == (1, 5)
    (out,) = g(inputs=[xt])
    assert tuple(out.shape) == (5, 7)
    assert out.stride() == (1, 5)
    assert_close(out, np.exp(as_f64(x)))
