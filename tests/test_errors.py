"""Bad programs and bad calls raise clear Python exceptions (never crash the interpreter).

Messages must name the op and the offending values; the tests check key substrings.
"""

import contextlib
import json

import mirage as mi
import numpy as np
import pytest
import torch
from conftest import assert_close, randn

F32 = mi.float32
ERRORS = (ValueError, TypeError)


@contextlib.contextmanager
def raises(*parts, exc=ERRORS):
    """Expects ``exc`` whose message contains every one of ``parts``."""
    with pytest.raises(exc) as info:
        yield info
    msg = str(info.value)
    for p in parts:
        assert str(p) in msg, f"{p!r} not in error message {msg!r}"


def new_graph(*shapes, dtype=F32):
    g = mi.new_kernel_graph()
    return (g, *[g.new_input(dims=s, dtype=dtype) for s in shapes])


def new_tb(grid_dim=(2, 1, 1), forloop_range=2, reduction_dimx=64):
    return mi.new_threadblock_graph(
        grid_dim=grid_dim,
        block_dim=(128, 1, 1),
        forloop_range=forloop_range,
        reduction_dimx=reduction_dimx,
    )


# ---------------------------------------------------------------------------------------------
# Kernel-graph shape errors


def test_matmul_of_2d_with_3d():
    g, A, B = new_graph((5, 13), (2, 13, 3))
    with raises("matmul", "rank", "13"):
        g.matmul(A, B)


def test_matmul_of_1d():
    g, A, B = new_graph((7,), (7,))
    with raises("matmul", "7"):
        g.matmul(A, B)


def test_matmul_inner_dims_differ():
    g, A, B = new_graph((5, 11), (13, 3))
    with raises("matmul", "11", "13"):
        g.matmul(A, B)


def test_matmul_batch_dims_differ():
    g, A, B = new_graph((2, 5, 7), (3, 7, 4))
    with raises("matmul", "batch"):
        g.matmul(A, B)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow"])
def test_binary_not_broadcastable(op):
    g, A, B = new_graph((3, 17, 7), (3, 19, 7))
    with raises(op, "17", "19"):
        getattr(g, op)(A, B)


def test_binary_ranks_differ():
    g, A, B = new_graph((3, 17), (17,))
    with raises("add", "rank", "17"):
        g.add(A, B)


def test_binary_dtypes_differ():
    g = mi.new_kernel_graph()
    A = g.new_input(dims=(3, 5), dtype=F32)
    B = g.new_input(dims=(3, 5), dtype=mi.float16)
    with raises("mul", "float16", "float32"):
        g.mul(A, B)


@pytest.mark.parametrize("dim", [3, -4])
def test_reduction_dim_out_of_range(dim):
    g, X = new_graph((3, 5, 7))
    with raises("reduction", str(dim)):
        g.reduction(X, dim)


def test_softmax_dim_out_of_range():
    g, X = new_graph((3, 5))
    with raises("softmax", "-3"):
        g.softmax(X, dim=-3)


def test_rms_norm_shape_not_a_suffix():
    g, X = new_graph((3, 17))
    with raises("rms_norm", "16", "17"):
        g.rms_norm(X, normalized_shape=(16,))


def test_rms_norm_weight_shape():
    g, X, W = new_graph((3, 17), (5,))
    with raises("rms_norm", "weight", "5", "17"):
        g.rms_norm(X, normalized_shape=(17,), weight=W)


def test_clamp_bounds_out_of_order():
    g, X = new_graph((3, 5))
    with raises("clamp", "2", "1"):
        g.clamp(X, 2.0, 1.0)


@pytest.mark.parametrize("dims", [(2, 2, 2, 2, 2), (), (3, 0)], ids=["rank5", "rank0", "zero_dim"])
def test_new_input_bad_dims(dims):
    g = mi.new_kernel_graph()
    with raises("new_input"):
        g.new_input(dims=dims, dtype=F32)


def test_new_input_bad_strides():
    g = mi.new_kernel_graph()
    with raises("new_input", "strides"):
        g.new_input(dims=(3, 5), dtype=F32, strides=(1, 1))


def test_mark_output_twice():
    g, X = new_graph((3, 5))
    Y = g.exp(X)
    g.mark_output(Y)
    with raises("mark_output"):
        g.mark_output(Y)


def test_failed_op_leaves_the_graph_usable(rng):
    g, A, B = new_graph((4, 6), (5, 3))
    with raises("matmul"):
        g.matmul(A, B)
    g.mark_output(g.exp(A))
    g.mark_output(g.relu(B))
    a, b = randn(rng, 4, 6), randn(rng, 5, 3)
    ea, rb = g(inputs=[a, b])
    assert_close(ea, np.exp(a.astype(np.float64)))
    assert_close(rb, np.maximum(b.astype(np.float64), 0.0))


# ---------------------------------------------------------------------------------------------
# Wrong argument types, tensors of another graph


def test_non_tensor_operands():
    g, X = new_graph((3, 5))
    with pytest.raises(TypeError):
        g.exp("X")
    with pytest.raises(TypeError):
        g.matmul(X, 3)
    with pytest.raises(TypeError):
        g.add(None, X)


def test_bad_dtype_argument():
    g = mi.new_kernel_graph()
    with pytest.raises(ERRORS):
        g.new_input(dims=(3, 5), dtype="float64")


def test_bad_dims_argument():
    g = mi.new_kernel_graph()
    with pytest.raises(ERRORS):
        g.new_input(dims="abc", dtype=F32)
    with pytest.raises(ERRORS):
        g.new_input(dims=(3, -5), dtype=F32)


def test_tensor_of_another_graph():
    _g1, X1 = new_graph((3, 5))
    g2, X2 = new_graph((3, 5))
    with raises("exp", "graph"):
        g2.exp(X1)
    with raises("add", "graph"):
        g2.add(X2, X1)
    with raises("mark_output", "graph"):
        g2.mark_output(X1)


def test_customized_with_tensor_of_another_graph():
    _g1, X1 = new_graph((8, 4))
    g2 = mi.new_kernel_graph()
    g2.new_input(dims=(8, 4), dtype=F32)
    tb = new_tb(forloop_range=1)
    tx = tb.new_input(X1, input_map=(0, -1, -1), forloop_dim=-1)
    tb.new_output(tb.exp(tx), output_map=(0, -1, -1))
    with raises("customized", "graph"):
        g2.customized([X1], tb)


def test_stensor_of_another_threadblock_graph():
    _g, X = new_graph((8, 4))
    tb1, tb2 = new_tb(), new_tb()
    t1 = tb1.new_input(X, input_map=(0, -1, -1), forloop_dim=-1)
    t2 = tb2.new_input(X, input_map=(0, -1, -1), forloop_dim=-1)
    with raises("exp", "graph"):
        tb2.exp(t1)
    with raises("add", "graph"):
        tb2.add(t2, t1)


def test_kernel_tensor_passed_to_block_op():
    _g, X = new_graph((8, 4))
    tb = new_tb()
    with pytest.raises(TypeError):
        tb.exp(X)


# ---------------------------------------------------------------------------------------------
# Block-graph errors


def test_imap_does_not_divide():
    _g, X = new_graph((10, 64))
    tb = new_tb(grid_dim=(3, 1, 1))
    with raises("new_input", "10", "3"):
        tb.new_input(X, input_map=(0, -1, -1), forloop_dim=-1)


def test_forloop_dim_does_not_divide():
    _g, X = new_graph((8, 30))
    tb = new_tb(grid_dim=(2, 1, 1), forloop_range=4)
    with raises("new_input", "30", "forloop_range"):
        tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)


def test_forloop_split_after_grid_split_does_not_divide():
    """The loop splits the block's part: 24 / grid 4 = 6 is not divisible by 4."""
    _g, X = new_graph((8, 24))
    tb = new_tb(grid_dim=(4, 1, 1), forloop_range=4)
    with raises("new_input", "6", "4"):
        tb.new_input(X, input_map=(1, -1, -1), forloop_dim=1)


@pytest.mark.parametrize("imap", [(2, -1, -1), (-2, -1, -1)], ids=str)
def test_imap_dim_out_of_range(imap):
    _g, X = new_graph((8, 8))
    tb = new_tb(grid_dim=(2, 1, 1))
    with raises("new_input", "input_map", str(imap[0])):
        tb.new_input(X, input_map=imap, forloop_dim=-1)


def test_imap_same_dim_on_two_axes():
    _g, X = new_graph((8, 8))
    tb = new_tb(grid_dim=(2, 2, 1))
    with raises("new_input", "input_map"):
        tb.new_input(X, input_map=(0, 0, -1), forloop_dim=-1)


def test_forloop_dim_out_of_range():
    _g, X = new_graph((8, 8))
    tb = new_tb()
    with raises("new_input", "forloop_dim", "5"):
        tb.new_input(X, input_map=(0, -1, -1), forloop_dim=5)


def test_omap_missing_for_grid_axis():
    _g, X = new_graph((8, 8))
    tb = new_tb(grid_dim=(2, 4, 1), forloop_range=1)
    tx = tb.new_input(X, input_map=(0, 1, -1), forloop_dim=-1)
    with raises("new_output", "output_map", "y"):
        tb.new_output(tb.exp(tx), output_map=(0, -1, -1))


def test_omap_dim_out_of_range():
    _g, X = new_graph((8, 8))
    tb = new_tb(grid_dim=(2, 1, 1), forloop_range=1)
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=-1)
    with raises("new_output", "output_map", "3"):
        tb.new_output(tx, output_map=(3, -1, -1))


def test_loop_tensor_saved_without_accumulator():
    _g, X = new_graph((8, 8))
    tb = new_tb()
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)
    with raises("new_output", "accum"):
        tb.new_output(tb.exp(tx), output_map=(0, -1, -1))


def test_post_loop_tensor_saved_per_iteration():
    _g, X = new_graph((8, 8))
    tb = new_tb()
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)
    with raises("new_output", "forloop_dim"):
        tb.new_output(tb.forloop_accum(tx), output_map=(0, -1, -1), forloop_dim=1)


@pytest.mark.parametrize("op", ["add", "mul", "matmul", "concat"])
def test_mixing_loop_and_post_loop_tensors(op):
    _g, X = new_graph((8, 8))
    tb = new_tb()
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)  # (4, 4), changes every iteration
    acc = tb.forloop_accum(tx)  # (4, 4), after the loop
    with raises(op, "loop"):
        if op == "concat":
            tb.concat(acc, tx, 0)
        else:
            getattr(tb, op)(acc, tx)


def test_two_accumulators_on_one_path():
    _g, X = new_graph((8, 8))
    tb = new_tb()
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)
    with raises("forloop_accum"):
        tb.forloop_accum(tb.forloop_accum(tx))


def test_block_matmul_inner_dims_differ():
    _g, A, B = new_graph((8, 12), (10, 6))
    tb = new_tb(forloop_range=1)
    ta = tb.new_input(A, input_map=(0, -1, -1), forloop_dim=-1)  # (4, 12)
    tw = tb.new_input(B, input_map=(-1, -1, -1), forloop_dim=-1)  # (10, 6)
    with raises("matmul", "12", "10"):
        tb.matmul(ta, tw)


def test_block_binary_not_broadcastable():
    _g, A, B = new_graph((8, 12), (8, 10))
    tb = new_tb(forloop_range=1)
    ta = tb.new_input(A, input_map=(0, -1, -1), forloop_dim=-1)
    tbb = tb.new_input(B, input_map=(0, -1, -1), forloop_dim=-1)
    with raises("sub", "12", "10"):
        tb.sub(ta, tbb)


def test_block_concat_dims_differ():
    _g, A, B = new_graph((8, 12), (6, 10))
    tb = new_tb(forloop_range=1)
    ta = tb.new_input(A, input_map=(0, -1, -1), forloop_dim=-1)  # (4, 12)
    tbb = tb.new_input(B, input_map=(0, -1, -1), forloop_dim=-1)  # (3, 10)
    with raises("concat", "4", "3"):
        tb.concat(ta, tbb, 1)


def test_sum_todimx_not_a_multiple():
    _g, X = new_graph((4, 20))
    tb = new_tb(forloop_range=2, reduction_dimx=4)
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)  # (2, 10)
    with raises("forloop_accum", "sum_todimx", "10", "4"):
        tb.forloop_accum(tx, "sum_todimx")


def test_unknown_accumulator_name():
    _g, X = new_graph((4, 20))
    tb = new_tb()
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)
    with raises("forloop_accum", "bogus"):
        tb.forloop_accum(tx, "bogus")


def test_rescale_accumulator_kind():
    _g, X, S = new_graph((4, 20), (4, 2))
    tb = new_tb()
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)
    ts = tb.new_input(S, input_map=(0, -1, -1), forloop_dim=1)
    with raises("forloop_accum_rescale", "mean"):
        tb.forloop_accum_rescale(tx, ts, "mean")


@pytest.mark.parametrize(
    "kwargs, part",
    [
        ({"grid_dim": (0, 1, 1), "block_dim": (128, 1, 1), "forloop_range": 1}, "grid_dim"),
        ({"grid_dim": (1, 1, 1), "block_dim": (2048, 1, 1), "forloop_range": 1}, "block_dim"),
        ({"grid_dim": (1, 1, 1), "block_dim": (128, 1, 1), "forloop_range": 0}, "forloop_range"),
    ],
    ids=["grid_dim", "block_dim", "forloop_range"],
)
def test_bad_threadblock_graph(kwargs, part):
    with raises("new_threadblock_graph", part):
        mi.new_threadblock_graph(reduction_dimx=64, **kwargs)


def test_customized_input_count():
    g, X, W = new_graph((8, 8), (8, 8))
    tb = new_tb(forloop_range=1)
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=-1)
    tw = tb.new_input(W, input_map=(-1, -1, -1), forloop_dim=-1)
    tb.new_output(tb.matmul(tx, tw), output_map=(0, -1, -1))
    with raises("customized", "2", "1"):
        g.customized([X], tb)


def test_customized_input_dims_differ_from_declared():
    g, X, Y = new_graph((8, 8), (8, 6))
    tb = new_tb(forloop_range=1)
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=-1)
    tb.new_output(tb.exp(tx), output_map=(0, -1, -1))
    with raises("customized", "6"):
        g.customized([Y], tb)


def test_customized_without_output():
    g, X = new_graph((8, 8))
    tb = new_tb(forloop_range=1)
    tb.new_input(X, input_map=(0, -1, -1), forloop_dim=-1)
    with raises("customized", "output"):
        g.customized([X], tb)


# ---------------------------------------------------------------------------------------------
# Call-time errors


def two_input_graph():
    g, A, B = new_graph((5, 13), (13, 3))
    g.mark_output(g.matmul(A, B))
    return g


def test_call_with_wrong_input_count(rng):
    g = two_input_graph()
    with raises("2", "1"):
        g(inputs=[torch.from_numpy(randn(rng, 5, 13))])
    with raises("2", "3"):
        g(inputs=[torch.zeros(5, 13), torch.zeros(13, 3), torch.zeros(1)])


def test_call_with_wrong_shape(rng):
    g = two_input_graph()
    with raises("17", "13"):
        g(inputs=[torch.zeros(5, 17), torch.zeros(13, 3)])
    with raises("13"):
        g(inputs=[torch.zeros(5, 13, 1), torch.zeros(13, 3)])


@pytest.mark.parametrize(
    "bad",
    [torch.float16, torch.bfloat16, torch.float64, torch.int32],
    ids=["float16", "bfloat16", "float64", "int32"],
)
def test_call_with_wrong_dtype(bad):
    g = two_input_graph()
    name = str(bad).removeprefix("torch.")
    with raises("float32", name):
        g(inputs=[torch.zeros(5, 13, dtype=bad), torch.zeros(13, 3)])


def test_call_with_wrong_numpy_dtype():
    g = two_input_graph()
    with raises("float32", "float64"):
        g(inputs=[np.zeros((5, 13)), np.zeros((13, 3), dtype=np.float32)])


@pytest.mark.parametrize(
    "bad", ["abc", None, 3.0, object()], ids=["str", "None", "float", "object"]
)
def test_call_with_non_tensor_input(bad):
    g = two_input_graph()
    with pytest.raises(TypeError):
        g(inputs=[bad, torch.zeros(13, 3)])


def test_failed_call_leaves_the_graph_usable(rng):
    g = two_input_graph()
    with raises("17"):
        g(inputs=[torch.zeros(5, 17), torch.zeros(13, 3)])
    a, b = randn(rng, 5, 13), randn(rng, 13, 3)
    (out,) = g(inputs=[a, b])
    assert_close(out, a.astype(np.float64) @ b.astype(np.float64))


@pytest.mark.gpu
def test_cuda_tensors_give_a_result_or_a_clear_error(rng):
    g = two_input_graph()
    a, b = randn(rng, 5, 13), randn(rng, 13, 3)
    try:
        (out,) = g(inputs=[torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()])
    except (ValueError, TypeError, NotImplementedError) as e:
        assert "cuda" in str(e).lower() or "device" in str(e).lower()
    else:
        assert_close(out.cpu(), a.astype(np.float64) @ b.astype(np.float64))


# ---------------------------------------------------------------------------------------------
# Bad JSON


def customized_graph():
    """X (8, 5): rows over a grid of 2, rows again over a loop of 2."""
    g, X = new_graph((8, 5))
    tb = new_tb(grid_dim=(2, 1, 1), forloop_range=2)
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.exp(tx)), output_map=(0, -1, -1))
    (Y,) = g.customized([X], tb)
    g.mark_output(Y)
    return g


def find_key(node, key):
    """Every dict inside ``node`` (parsed JSON) that has ``key``."""
    if isinstance(node, dict):
        if key in node:
            yield node
        for v in node.values():
            yield from find_key(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from find_key(v, key)


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.0], ids=["half", "most", "empty"])
def test_truncated_json(keep):
    text = customized_graph().to_json()
    with pytest.raises(ValueError):
        mi.from_json(text[: int(len(text) * keep)])


def test_not_json():
    with pytest.raises(ValueError):
        mi.from_json("mirage graph, please")
    with pytest.raises(ValueError):
        mi.from_json("[1, 2, 3]")


def test_json_from_a_future_version():
    doc = json.loads(customized_graph().to_json())
    assert "version" in doc
    doc["version"] = 99
    with raises("version", "99", exc=ValueError):
        mi.from_json(json.dumps(doc))


def test_json_with_a_non_dividing_imap():
    """An input map edited to split the size-5 dim over 2 blocks is rejected on load."""
    doc = json.loads(customized_graph().to_json())
    maps = [d for k in ("imap", "input_map") for d in find_key(doc, k)]
    assert len(maps) == 1
    key = "imap" if "imap" in maps[0] else "input_map"
    assert list(maps[0][key]) == [0, -1, -1]
    maps[0][key] = [1, -1, -1]
    with raises("new_input", "5", exc=ValueError):
        mi.from_json(json.dumps(doc))


def test_json_with_inconsistent_shapes():
    """A matmul whose operand dims were edited so the inner dims no longer match."""
    g, A, B = new_graph((4, 6), (6, 3))
    g.mark_output(g.matmul(A, B))
    doc = json.loads(g.to_json())
    dims = list(find_key(doc, "dims"))
    edited = [d for d in dims if list(d["dims"]) == [6, 3]]
    assert edited
    for d in edited:
        d["dims"] = [7, 3]
    with raises("matmul", "7", exc=ValueError):
        mi.from_json(json.dumps(doc))


def test_load_json_missing_file(tmp_path):
    with pytest.raises(OSError):
        mi.load_json(str(tmp_path / "missing.json"))


def test_call_with_layout_other_than_declared(rng):
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(5, 7), dtype=F32, strides=(1, 5))
    g.mark_output(g.exp(X))
    with raises("strides", "(1, 5)"):
        g(inputs=[torch.zeros(5, 7)])  # row-major (7, 1)


def test_mark_output_bad_strides():
    g, X = new_graph((3, 5))
    with raises("mark_output", "strides"):
        g.mark_output(g.exp(X), strides=(5, 1, 1))


def test_bfloat16_graph_with_numpy_input():
    g, X = new_graph((3, 5), dtype=mi.bfloat16)
    g.mark_output(g.exp(X))
    with raises("bfloat16", exc=TypeError):
        g(inputs=[np.zeros((3, 5), dtype=np.float32)])
