"""Block-graph ops inside small customized kernels, against a numpy model of the semantics.

The model (``Blocks``) follows the documented block semantics: for each grid axis of size > 1
the input map splits one data dim evenly over the axis (-1 replicates); ``forloop_dim`` splits
the block's part into ``forloop_range`` tiles, one per iteration (-1: the same tile every
iteration); an output places each block's tile at ``coord * tile`` along the mapped dim, and an
output ``forloop_dim >= 0`` stores the iterations' tiles side by side along that dim.
"""

import itertools
import math

import mirage as mi
import numpy as np
import pytest
from conftest import as_f64, assert_close, randn, run, uniform

F32 = mi.float32
erf = np.vectorize(math.erf)


class Blocks:
    """Numpy model of a grid of thread blocks running a for-loop."""

    def __init__(self, grid_dim, forloop_range, reduction_dimx=64):
        self.grid_dim = grid_dim
        self.range = forloop_range
        self.dimx = reduction_dimx

    def coords(self):
        return list(itertools.product(*(range(n) for n in self.grid_dim)))

    def part(self, x, coord, imap):
        """The block's part of device tensor ``x``."""
        idx = [slice(None)] * x.ndim
        for axis, n in enumerate(self.grid_dim):
            if n > 1 and imap[axis] >= 0:
                d = imap[axis]
                size = x.shape[d] // n
                idx[d] = slice(coord[axis] * size, (coord[axis] + 1) * size)
        return as_f64(x[tuple(idx)])

    def tiles(self, x, coord, imap, forloop_dim):
        """The block's tile at every iteration, in order."""
        part = self.part(x, coord, imap)
        if forloop_dim < 0:
            return [part] * self.range
        size = part.shape[forloop_dim] // self.range
        out = []
        for it in range(self.range):
            idx = [slice(None)] * part.ndim
            idx[forloop_dim] = slice(it * size, (it + 1) * size)
            out.append(part[tuple(idx)])
        return out

    def gather(self, tiles, omap):
        """The device tensor made of every block's tile (``tiles``: coord -> array)."""
        first = next(iter(tiles.values()))
        shape = list(first.shape)
        for axis, n in enumerate(self.grid_dim):
            if n > 1:
                shape[omap[axis]] *= n
        out = np.full(shape, np.nan)
        for coord, t in tiles.items():
            idx = [slice(0, s) for s in t.shape]
            for axis, n in enumerate(self.grid_dim):
                if n > 1:
                    d = omap[axis]
                    idx[d] = slice(coord[axis] * t.shape[d], (coord[axis] + 1) * t.shape[d])
            out[tuple(idx)] = t
        assert not np.isnan(out).any(), "the output map leaves holes"
        return out

    def fold(self, t):
        """``sum_todimx`` of one tile: out[..., j] = sum_k t[..., j + k * dimx]."""
        return t.reshape(t.shape[:-1] + (t.shape[-1] // self.dimx, self.dimx)).sum(axis=-2)


def sum_last(t):
    return t.sum(axis=-1, keepdims=True)


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, dim):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def rms_norm_last(x):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))


# ---------------------------------------------------------------------------------------------
# Element-wise ops on tiles: grid (2, 3, 1) splits rows over x and columns over y; the loop
# splits each block's columns again; ragged 3x5 tiles.

UNARY = {
    "exp": (lambda tb, t: tb.exp(t), np.exp),
    "silu": (lambda tb, t: tb.silu(t), silu),
    "gelu": (lambda tb, t: tb.gelu(t), lambda x: 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))),
    "relu": (lambda tb, t: tb.relu(t), lambda x: np.maximum(x, 0.0)),
    "clamp": (
        lambda tb, t: tb.clamp(t, min_val=-0.3, max_val=0.6),
        lambda x: np.clip(x, -0.3, 0.6),
    ),
    "square": (lambda tb, t: tb.square(t), np.square),
    "sqrt": (lambda tb, t: tb.sqrt(t), np.sqrt),
    "mul_scalar": (lambda tb, t: tb.mul_scalar(t, 0.37), lambda x: x * 0.37),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_on_tiles(rng, name):
    op, ref_op = UNARY[name]
    x = uniform(rng, 0.1, 3.0, 6, 30) if name == "sqrt" else randn(rng, 6, 30)
    grid, imap, omap = (2, 3, 1), (0, 1, -1), (0, 1, -1)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(6, 30), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(128, 1, 1), forloop_range=2, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=imap, forloop_dim=1)
    assert tuple(tx.dims) == (3, 5)
    ty = op(tb, tx)
    assert tuple(ty.dims) == (3, 5)
    tb.new_output(tb.forloop_accum(ty), output_map=omap)
    (Y,) = g.customized([X], tb)
    assert tuple(Y.dims) == (6, 15)
    g.mark_output(Y)
    (out,) = run(g, x)

    m = Blocks(grid, 2)
    ref = m.gather({c: sum(ref_op(t) for t in m.tiles(x, c, imap, 1)) for c in m.coords()}, omap)
    assert_close(out, ref)


def first_operand(rng, dims):
    """Positive values: valid bases of pow."""
    return uniform(rng, 0.5, 2.0, *dims)


def second_operand(rng, name, dims):
    """Exponents for pow, divisors away from 0 for div, normal values otherwise."""
    if name == "pow":
        return uniform(rng, -2.0, 2.0, *dims)
    if name == "div":
        return uniform(rng, 0.5, 2.0, *dims) * rng.choice([-1.0, 1.0], dims).astype(np.float32)
    return randn(rng, *dims)


BINARY = {
    "add": (lambda tb, a, b: tb.add(a, b), np.add),
    "sub": (lambda tb, a, b: tb.sub(a, b), np.subtract),
    "mul": (lambda tb, a, b: tb.mul(a, b), np.multiply),
    "div": (lambda tb, a, b: tb.div(a, b), np.divide),
    "pow": (lambda tb, a, b: tb.pow(a, b), np.power),
}

# B's device dims, input map and forloop_dim; whether B is the first operand.
B_LAYOUTS = {
    "same_tiles": ((6, 30), (0, 1, -1), 1, False),
    "invariant_column": ((6, 1), (0, -1, -1), -1, False),
    "invariant_column_first": ((6, 1), (0, -1, -1), -1, True),
    "looped_row": ((1, 30), (-1, 1, -1), 1, False),
    "invariant_scalar_first": ((1, 1), (-1, -1, -1), -1, True),
}


@pytest.mark.parametrize("layout", sorted(B_LAYOUTS))
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_on_tiles(rng, name, layout):
    """A (6, 30) in 3x5 tiles combined with B, broadcasting where B's tile has 1s."""
    op, ref_op = BINARY[name]
    b_dims, b_imap, b_fdim, b_first = B_LAYOUTS[layout]
    if b_first:
        a, b = second_operand(rng, name, (6, 30)), first_operand(rng, b_dims)
    else:
        a, b = first_operand(rng, (6, 30)), second_operand(rng, name, b_dims)
    grid, a_imap, omap = (2, 3, 1), (0, 1, -1), (0, 1, -1)
    g = mi.new_kernel_graph()
    A = g.new_input(dims=(6, 30), dtype=F32)
    B = g.new_input(dims=b_dims, dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(128, 1, 1), forloop_range=2, reduction_dimx=64
    )
    ta = tb.new_input(A, input_map=a_imap, forloop_dim=1)
    tbb = tb.new_input(B, input_map=b_imap, forloop_dim=b_fdim)
    tc = op(tb, tbb, ta) if b_first else op(tb, ta, tbb)
    assert tuple(tc.dims) == (3, 5)
    tb.new_output(tb.forloop_accum(tc), output_map=omap)
    (C,) = g.customized([A, B], tb)
    g.mark_output(C)
    (out,) = run(g, a, b)

    m = Blocks(grid, 2)
    tiles = {}
    for c in m.coords():
        pairs = zip(m.tiles(a, c, a_imap, 1), m.tiles(b, c, b_imap, b_fdim))
        tiles[c] = sum(ref_op(tb_, ta_) if b_first else ref_op(ta_, tb_) for ta_, tb_ in pairs)
    assert_close(out, m.gather(tiles, omap))


# ---------------------------------------------------------------------------------------------
# Matmul


def test_matmul_two_axis_grid(rng):
    """X's rows over grid x, W's columns over grid y, the shared dim over the loop."""
    x, w = randn(rng, 8, 48), randn(rng, 48, 20)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 48), dtype=F32)
    W = g.new_input(dims=(48, 20), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(2, 2, 1), block_dim=(128, 1, 1), forloop_range=4, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)
    tw = tb.new_input(W, input_map=(-1, 1, -1), forloop_dim=0)
    assert (tuple(tx.dims), tuple(tw.dims)) == ((4, 12), (12, 10))
    tm = tb.matmul(tx, tw)
    assert tuple(tm.dims) == (4, 10)
    tb.new_output(tb.forloop_accum(tm), output_map=(0, 1, -1))
    (Y,) = g.customized([X, W], tb)
    assert tuple(Y.dims) == (8, 20)
    g.mark_output(Y)
    (out,) = run(g, x, w)
    assert_close(out, as_f64(x) @ as_f64(w))


def test_matmul_grid_axes_swapped(rng):
    """Grid x on W's columns, grid y on X's rows: the output map follows the same axes."""
    x, w = randn(rng, 9, 16), randn(rng, 16, 12)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(9, 16), dtype=F32)
    W = g.new_input(dims=(16, 12), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(4, 3, 1), block_dim=(128, 1, 1), forloop_range=2, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(-1, 0, -1), forloop_dim=1)
    tw = tb.new_input(W, input_map=(1, -1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(tx, tw)), output_map=(1, 0, -1))
    (Y,) = g.customized([X, W], tb)
    g.mark_output(Y)
    (out,) = run(g, x, w)
    assert_close(out, as_f64(x) @ as_f64(w))


def test_batched_matmul_tiles(rng):
    q, k = randn(rng, 4, 6, 16), randn(rng, 4, 16, 10)
    g = mi.new_kernel_graph()
    Q = g.new_input(dims=(4, 6, 16), dtype=F32)
    K = g.new_input(dims=(4, 16, 10), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(4, 1, 1), block_dim=(128, 1, 1), forloop_range=2, reduction_dimx=64
    )
    tq = tb.new_input(Q, input_map=(0, -1, -1), forloop_dim=2)
    tk = tb.new_input(K, input_map=(0, -1, -1), forloop_dim=1)
    assert (tuple(tq.dims), tuple(tk.dims)) == ((1, 6, 8), (1, 8, 10))
    tb.new_output(tb.forloop_accum(tb.matmul(tq, tk)), output_map=(0, -1, -1))
    (S,) = g.customized([Q, K], tb)
    assert tuple(S.dims) == (4, 6, 10)
    g.mark_output(S)
    (out,) = run(g, q, k)
    assert_close(out, as_f64(q) @ as_f64(k))


def test_matmul_loop_invariant_operand(rng):
    """The invariant W tile multiplies every loop tile of X (rows over the loop)."""
    x, w = randn(rng, 12, 8), randn(rng, 8, 5)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(12, 8), dtype=F32)
    W = g.new_input(dims=(8, 5), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(2, 1, 1), block_dim=(128, 1, 1), forloop_range=3, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=0)
    tw = tb.new_input(W, input_map=(-1, -1, -1), forloop_dim=-1)
    tb.new_output(tb.matmul(tx, tw), output_map=(0, -1, -1), forloop_dim=0)
    (Y,) = g.customized([X, W], tb)
    assert tuple(Y.dims) == (12, 5)
    g.mark_output(Y)
    (out,) = run(g, x, w)
    assert_close(out, as_f64(x) @ as_f64(w))


# ---------------------------------------------------------------------------------------------
# Reductions, rms_norm, concat


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_reduction_in_loop(rng, dim):
    x = randn(rng, 4, 6, 24)
    grid, imap = (2, 1, 1), (1, -1, -1)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 6, 24), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(128, 1, 1), forloop_range=3, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=imap, forloop_dim=2)
    assert tuple(tx.dims) == (4, 3, 8)
    tr = tb.reduction(tx, dim)
    kept = [4, 3, 8]
    kept[dim] = 1
    assert tuple(tr.dims) == tuple(kept)
    tb.new_output(tb.forloop_accum(tr), output_map=imap)
    (Y,) = g.customized([X], tb)
    g.mark_output(Y)
    (out,) = run(g, x)

    m = Blocks(grid, 3)
    tiles = {
        c: sum(t.sum(axis=dim, keepdims=True) for t in m.tiles(x, c, imap, 2)) for c in m.coords()
    }
    assert_close(out, m.gather(tiles, imap))


@pytest.mark.parametrize("dim", [0, 1])
def test_reduction_after_loop(rng, dim):
    x = randn(rng, 6, 20)
    grid, imap = (2, 1, 1), (0, -1, -1)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(6, 20), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(128, 1, 1), forloop_range=4, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=imap, forloop_dim=1)
    tb.new_output(tb.reduction(tb.forloop_accum(tx), dim), output_map=imap)
    (Y,) = g.customized([X], tb)
    g.mark_output(Y)
    (out,) = run(g, x)

    m = Blocks(grid, 4)
    tiles = {c: sum(m.tiles(x, c, imap, 1)).sum(axis=dim, keepdims=True) for c in m.coords()}
    assert_close(out, m.gather(tiles, imap))


def test_rms_norm_in_loop_and_after(rng):
    x = randn(rng, 4, 3, 30)
    grid, imap = (2, 1, 1), (0, -1, -1)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 3, 30), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(128, 1, 1), forloop_range=3, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=imap, forloop_dim=2)
    tn = tb.rms_norm(tx)
    assert tuple(tn.dims) == (2, 3, 10)
    acc = tb.forloop_accum(tn)
    tb.new_output(acc, output_map=imap)
    tb.new_output(tb.rms_norm(acc), output_map=imap)
    Y, Z = g.customized([X], tb)
    g.mark_output(Y)
    g.mark_output(Z)
    out_y, out_z = run(g, x)

    m = Blocks(grid, 3)
    acc_ref = {c: sum(rms_norm_last(t) for t in m.tiles(x, c, imap, 2)) for c in m.coords()}
    assert_close(out_y, m.gather(acc_ref, imap))
    assert_close(out_z, m.gather({c: rms_norm_last(t) for c, t in acc_ref.items()}, imap))


@pytest.mark.parametrize(
    "a_dims, b_dims, imap, cat_dim, fdim, frange",
    [
        ((4, 12), (4, 15), (0, -1, -1), 1, 1, 3),  # tiles (2, 4) | (2, 5) -> (2, 9)
        ((6, 8), (4, 8), (1, -1, -1), 0, 0, 2),  # tiles (3, 4) over (2, 4) -> (5, 4)
        ((2, 6, 9), (2, 3, 9), (0, -1, -1), 1, 2, 3),  # 3-D tiles (1, 6, 3) | (1, 3, 3)
    ],
    ids=["dim1", "dim0", "3d_dim1"],
)
def test_concat_in_loop(rng, a_dims, b_dims, imap, cat_dim, fdim, frange):
    a, b = randn(rng, *a_dims), randn(rng, *b_dims)
    grid = (2, 1, 1)
    g = mi.new_kernel_graph()
    A = g.new_input(dims=a_dims, dtype=F32)
    B = g.new_input(dims=b_dims, dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(128, 1, 1), forloop_range=frange, reduction_dimx=64
    )
    ta = tb.new_input(A, input_map=imap, forloop_dim=fdim)
    tbb = tb.new_input(B, input_map=imap, forloop_dim=fdim)
    tc = tb.concat(ta, tbb, cat_dim)
    assert tc.dims[cat_dim] == ta.dims[cat_dim] + tbb.dims[cat_dim]
    tb.new_output(tb.forloop_accum(tc), output_map=imap)
    (C,) = g.customized([A, B], tb)
    g.mark_output(C)
    (out,) = run(g, a, b)

    m = Blocks(grid, frange)
    tiles = {
        c: sum(
            np.concatenate([ta_, tb_], axis=cat_dim)
            for ta_, tb_ in zip(m.tiles(a, c, imap, fdim), m.tiles(b, c, imap, fdim))
        )
        for c in m.coords()
    }
    assert_close(out, m.gather(tiles, imap))


def test_concat_loop_tile_with_invariant_tile_and_after_loop(rng):
    a, b = randn(rng, 4, 12), randn(rng, 4, 3)
    grid, imap = (2, 1, 1), (0, -1, -1)
    g = mi.new_kernel_graph()
    A = g.new_input(dims=(4, 12), dtype=F32)
    B = g.new_input(dims=(4, 3), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(128, 1, 1), forloop_range=3, reduction_dimx=64
    )
    ta = tb.new_input(A, input_map=imap, forloop_dim=1)
    tbb = tb.new_input(B, input_map=imap, forloop_dim=-1)
    acc = tb.forloop_accum(tb.concat(ta, tbb, 1))  # (2, 4 + 3)
    tb.new_output(acc, output_map=imap)
    tb.new_output(tb.concat(tbb, acc, 1), output_map=imap)  # invariant | post-loop
    Y, Z = g.customized([A, B], tb)
    assert tuple(Y.dims) == (4, 7) and tuple(Z.dims) == (4, 10)
    g.mark_output(Y)
    g.mark_output(Z)
    out_y, out_z = run(g, a, b)

    m = Blocks(grid, 3)
    acc_ref = {
        c: sum(
            np.concatenate([ta_, tb_], axis=1)
            for ta_, tb_ in zip(m.tiles(a, c, imap, 1), m.tiles(b, c, imap, -1))
        )
        for c in m.coords()
    }
    assert_close(out_y, m.gather(acc_ref, imap))
    z_ref = {c: np.concatenate([m.part(b, c, imap), acc_ref[c]], axis=1) for c in m.coords()}
    assert_close(out_z, m.gather(z_ref, imap))


# ---------------------------------------------------------------------------------------------
# Accumulators


def accumulate(m, tiles, acc):
    """The numpy model of forloop_accum over one block's per-iteration tiles."""
    last = tiles[0].shape[-1]
    if acc is None:
        return sum(tiles)
    if acc == "sum":
        return sum(sum_last(t) for t in tiles)
    if acc == "mean":
        return sum(sum_last(t) for t in tiles) / (last * m.range)
    if acc == "rms":
        return np.sqrt(sum(sum_last(t * t) for t in tiles) / (last * m.range))
    if acc == "sum_todimx":
        return sum(m.fold(t) for t in tiles)
    raise AssertionError(acc)


ACC_CASES = {
    # name: (device dims, grid, imap, forloop_dim, forloop_range, reduction_dimx)
    "loop_on_last": ((2, 6, 24), (2, 1, 1), (0, -1, -1), 2, 3, 4),
    "loop_on_middle": ((2, 6, 36), (2, 1, 1), (0, -1, -1), 1, 3, 12),
    "ragged_2d": ((6, 45), (3, 1, 1), (0, -1, -1), 1, 3, 5),
    "grid_and_loop_same_dim": ((4, 48), (3, 1, 1), (1, -1, -1), 1, 4, 2),
    "two_axis_grid": ((4, 10, 24), (2, 1, 2), (0, -1, 1), 2, 2, 6),
}


@pytest.mark.parametrize("acc", [None, "sum", "mean", "rms", "sum_todimx"], ids=str)
@pytest.mark.parametrize("case", sorted(ACC_CASES))
def test_forloop_accum(rng, case, acc):
    dims, grid, imap, fdim, frange, dimx = ACC_CASES[case]
    x = randn(rng, *dims)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=dims, dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(128, 1, 1), forloop_range=frange, reduction_dimx=dimx
    )
    tx = tb.new_input(X, input_map=imap, forloop_dim=fdim)
    ta = tb.forloop_accum(tx, acc)
    tb.new_output(ta, output_map=imap)
    (Y,) = g.customized([X], tb)
    g.mark_output(Y)
    (out,) = run(g, x)

    m = Blocks(grid, frange, dimx)
    tiles = {c: accumulate(m, m.tiles(x, c, imap, fdim), acc) for c in m.coords()}
    assert tuple(ta.dims) == next(iter(tiles.values())).shape
    assert_close(out, m.gather(tiles, imap))


@pytest.mark.parametrize("acc", [None, "sum", "mean", "rms", "sum_todimx"], ids=str)
def test_forloop_accum_of_invariant_tile(rng, acc):
    """A loop-invariant tile is accumulated once per iteration (mean and rms of it are exact)."""
    x = randn(rng, 4, 12)
    grid, imap = (2, 1, 1), (0, -1, -1)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 12), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(128, 1, 1), forloop_range=3, reduction_dimx=4
    )
    tx = tb.new_input(X, input_map=imap, forloop_dim=-1)
    tb.new_output(tb.forloop_accum(tx, acc), output_map=imap)
    (Y,) = g.customized([X], tb)
    g.mark_output(Y)
    (out,) = run(g, x)

    m = Blocks(grid, 3, 4)
    tiles = {c: accumulate(m, m.tiles(x, c, imap, -1), acc) for c in m.coords()}
    assert_close(out, m.gather(tiles, imap))


def test_rms_accumulator_normalises_like_rms_norm(rng):
    """x / rms-accumulator of x over the whole row equals the kernel-level rms_norm."""
    x = randn(rng, 4, 64)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 64), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(2, 1, 1), block_dim=(128, 1, 1), forloop_range=1, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)
    tx2 = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=-1)
    tb.new_output(tb.div(tx2, tb.forloop_accum(tx, "rms")), output_map=(0, -1, -1))
    (Y,) = g.customized([X, X], tb)
    g.mark_output(Y)
    g.mark_output(g.rms_norm(X, normalized_shape=(64,)))
    out, ref = run(g, x)
    assert_close(out, rms_norm_last(as_f64(x)))
    assert_close(out, ref)


@pytest.mark.parametrize("fdim", [0, 1])
def test_forloop_accum_max(rng, fdim):
    x = randn(rng, 8, 24)
    grid, imap = (2, 1, 1), (0, -1, -1)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 24), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(128, 1, 1), forloop_range=4, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=imap, forloop_dim=fdim)
    tb.new_output(tb.forloop_accum_max(tb.mul_scalar(tx, 2.0)), output_map=imap)
    (Y,) = g.customized([X], tb)
    g.mark_output(Y)
    (out,) = run(g, x)

    m = Blocks(grid, 4)
    tiles = {c: np.max(np.stack(m.tiles(x, c, imap, fdim)), axis=0) * 2.0 for c in m.coords()}
    assert_close(out, m.gather(tiles, imap))


@pytest.mark.parametrize("acc", [None, "sum"], ids=str)
def test_forloop_accum_rescale(rng, acc):
    """acc = X_0 (or its row sums); then acc = acc * S_i + X_i, with S_i a per-row scale tile."""
    x, s = randn(rng, 4, 24), uniform(rng, 0.5, 1.5, 4, 4)
    grid, imap = (2, 1, 1), (0, -1, -1)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 24), dtype=F32)
    S = g.new_input(dims=(4, 4), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(128, 1, 1), forloop_range=4, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=imap, forloop_dim=1)  # (2, 6)
    ts = tb.new_input(S, input_map=imap, forloop_dim=1)  # (2, 1)
    ta = tb.forloop_accum_rescale(tx, ts, acc)
    assert tuple(ta.dims) == ((2, 1) if acc == "sum" else (2, 6))
    tb.new_output(ta, output_map=imap)
    (Y,) = g.customized([X, S], tb)
    g.mark_output(Y)
    (out,) = run(g, x, s)

    m = Blocks(grid, 4)
    tiles = {}
    for c in m.coords():
        xs, ss = m.tiles(x, c, imap, 1), m.tiles(s, c, imap, 1)
        contrib = [sum_last(t) if acc == "sum" else t for t in xs]
        a = contrib[0]
        for i in range(1, 4):
            a = a * ss[i] + contrib[i]
        tiles[c] = a
    assert_close(out, m.gather(tiles, imap))


@pytest.mark.parametrize("dim", [0, 1])
def test_reduction_max_running_max_and_diff(rng, dim):
    """M_i = max(M_{i-1}, max over dim of X_i), D_i = M_{i-1} - M_i (0 at the first iteration);
    both saved every iteration with an output forloop_dim."""
    x = randn(rng, 8, 24)
    grid, imap = (2, 1, 1), (0, -1, -1)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 24), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(128, 1, 1), forloop_range=4, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=imap, forloop_dim=1)  # (4, 6)
    tm, td = tb.reduction_max(tx, dim)
    assert tuple(tm.dims) == tuple(td.dims) == ((1, 6) if dim == 0 else (4, 1))
    tb.new_output(tm, output_map=imap, forloop_dim=1)
    tb.new_output(td, output_map=imap, forloop_dim=1)
    tb.new_output(tb.forloop_accum_max(tm), output_map=imap)
    M, D, F = g.customized([X], tb)
    for t in (M, D, F):
        g.mark_output(t)
    out_m, out_d, out_f = run(g, x)

    m = Blocks(grid, 4)
    ms, ds, fs = {}, {}, {}
    for c in m.coords():
        run_max, prev, mm, dd = None, None, [], []
        for t in m.tiles(x, c, imap, 1):
            cur = t.max(axis=dim, keepdims=True)
            run_max = cur if prev is None else np.maximum(prev, cur)
            dd.append(np.zeros_like(cur) if prev is None else prev - run_max)
            mm.append(run_max)
            prev = run_max
        ms[c], ds[c], fs[c] = np.concatenate(mm, 1), np.concatenate(dd, 1), run_max
    assert_close(out_m, m.gather(ms, imap))
    assert_close(out_f, m.gather(fs, imap))
    d_ref = m.gather(ds, imap)
    assert np.all(out_d <= 0.0)
    assert np.abs(out_d - d_ref).max() < 1e-6 * np.abs(x).max()


@pytest.mark.parametrize("logits", ["normal", "huge"])
def test_online_softmax_attention(rng, logits):
    """Flash-style attention in one loop over key tiles vs plain softmax(Q K * scale) V.

    "huge": integer Q, K and a power-of-two scale keep the logits exact in float32 while they
    go far past exp's float32 range (> 88); the running max keeps every exp finite.
    """
    b, m_, n, d, frange = 2, 8, 48, 16, 4
    if logits == "normal":
        q, k, scale = randn(rng, b, m_, d), randn(rng, b, d, n), 0.25
    else:
        q = rng.integers(-2, 3, (b, m_, d)).astype(np.float32)
        k = rng.integers(-2, 3, (b, d, n)).astype(np.float32)
        scale = 8.0
        assert (as_f64(q) @ as_f64(k) * scale).max() > 100.0
    v = randn(rng, b, n, d)
    g = mi.new_kernel_graph()
    Q = g.new_input(dims=(b, m_, d), dtype=F32)
    K = g.new_input(dims=(b, d, n), dtype=F32)
    V = g.new_input(dims=(b, n, d), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(b, 1, 1), block_dim=(128, 1, 1), forloop_range=frange, reduction_dimx=64
    )
    tq = tb.new_input(Q, input_map=(0, -1, -1), forloop_dim=-1)
    tk = tb.new_input(K, input_map=(0, -1, -1), forloop_dim=2)
    tv = tb.new_input(V, input_map=(0, -1, -1), forloop_dim=1)
    ts = tb.mul_scalar(tb.matmul(tq, tk), scale)  # (1, 8, 12)
    tm, td = tb.reduction_max(ts, 2)  # (1, 8, 1)
    te = tb.exp(tb.sub(ts, tm))
    rescale = tb.exp(td)
    to = tb.forloop_accum_rescale(tb.matmul(te, tv), rescale)  # (1, 8, 16)
    tl = tb.forloop_accum_rescale(te, rescale, "sum")  # (1, 8, 1)
    assert (tuple(to.dims), tuple(tl.dims)) == ((1, m_, d), (1, m_, 1))
    tb.new_output(tb.div(to, tl), output_map=(0, -1, -1))
    (O,) = g.customized([Q, K, V], tb)
    assert tuple(O.dims) == (b, m_, d)
    g.mark_output(O)
    (out,) = run(g, q, k, v)
    assert np.all(np.isfinite(out))
    ref = softmax(as_f64(q) @ as_f64(k) * scale, 2) @ as_f64(v)
    assert_close(out, ref)


# ---------------------------------------------------------------------------------------------
# Output placement


@pytest.mark.parametrize("out_fdim", [0, 1])
def test_output_saves_every_iteration(rng, out_fdim):
    x = randn(rng, 4, 24)
    grid, imap = (2, 1, 1), (0, -1, -1)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 24), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(128, 1, 1), forloop_range=3, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=imap, forloop_dim=1)  # (2, 8)
    tb.new_output(tb.exp(tx), output_map=imap, forloop_dim=out_fdim)
    (Y,) = g.customized([X], tb)
    assert tuple(Y.dims) == ((12, 8) if out_fdim == 0 else (4, 24))
    g.mark_output(Y)
    (out,) = run(g, x)

    m = Blocks(grid, 3)
    tiles = {
        c: np.concatenate([np.exp(t) for t in m.tiles(x, c, imap, 1)], axis=out_fdim)
        for c in m.coords()
    }
    ref = m.gather(tiles, imap)
    if out_fdim == 1:
        assert_close(ref, np.exp(as_f64(x)))  # the model itself: tiles land where they came from
    assert_close(out, ref)


def test_output_saves_invariant_tile_every_iteration(rng):
    x = randn(rng, 4, 5)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 5), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(2, 1, 1), block_dim=(128, 1, 1), forloop_range=3, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=-1)
    tb.new_output(tb.relu(tx), output_map=(0, -1, -1), forloop_dim=1)
    (Y,) = g.customized([X], tb)
    assert tuple(Y.dims) == (4, 15)
    g.mark_output(Y)
    (out,) = run(g, x)
    assert_close(out, np.tile(np.maximum(as_f64(x), 0.0), (1, 3)))


def test_three_axis_grid_with_permuted_output_map(rng):
    x = randn(rng, 4, 6, 20)
    grid, imap, omap = (2, 3, 2), (0, 1, 2), (2, 0, 1)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 6, 20), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(128, 1, 1), forloop_range=2, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=imap, forloop_dim=2)
    assert tuple(tx.dims) == (2, 2, 5)
    tb.new_output(tb.forloop_accum(tb.square(tx)), output_map=omap)
    (Y,) = g.customized([X], tb)
    assert tuple(Y.dims) == (6, 4, 10)
    g.mark_output(Y)
    (out,) = run(g, x)

    m = Blocks(grid, 2)
    tiles = {c: sum(t * t for t in m.tiles(x, c, imap, 2)) for c in m.coords()}
    assert_close(out, m.gather(tiles, omap))


def test_three_axis_grid_matmul(rng):
    """Batch over z, rows over y, columns over x; the loop runs over the shared dim."""
    a, b = randn(rng, 2, 6, 32), randn(rng, 2, 32, 8)
    grid = (4, 3, 2)
    g = mi.new_kernel_graph()
    A = g.new_input(dims=(2, 6, 32), dtype=F32)
    B = g.new_input(dims=(2, 32, 8), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(64, 2, 1), forloop_range=4, reduction_dimx=64
    )
    ta = tb.new_input(A, input_map=(-1, 1, 0), forloop_dim=2)  # (1, 2, 8)
    tbb = tb.new_input(B, input_map=(2, -1, 0), forloop_dim=1)  # (1, 8, 2)
    tb.new_output(tb.forloop_accum(tb.matmul(ta, tbb)), output_map=(2, 1, 0))
    (C,) = g.customized([A, B], tb)
    assert tuple(C.dims) == (2, 6, 8)
    g.mark_output(C)
    (out,) = run(g, a, b)
    assert_close(out, as_f64(a) @ as_f64(b))


def test_replicated_input_duplicates_output(rng):
    """imap -1 gives every block the whole tensor; the output map still places each block."""
    x = randn(rng, 4, 6)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 6), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(1, 2, 1), block_dim=(128, 1, 1), forloop_range=1, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=-1)
    assert tuple(tx.dims) == (4, 6)
    tb.new_output(tb.exp(tx), output_map=(-1, 0, -1))
    (Y,) = g.customized([X], tb)
    assert tuple(Y.dims) == (8, 6)
    g.mark_output(Y)
    (out,) = run(g, x)
    e = np.exp(as_f64(x))
    assert_close(out, np.concatenate([e, e], axis=0))


def test_input_map_of_unit_grid_axes_is_ignored(rng):
    x = randn(rng, 4, 6)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 6), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(2, 1, 1), block_dim=(128, 1, 1), forloop_range=2, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(0, 5, 1), forloop_dim=1)
    assert tuple(tx.dims) == (2, 3)
    tb.new_output(tb.forloop_accum(tx), output_map=(0, 7, 1))
    (Y,) = g.customized([X], tb)
    g.mark_output(Y)
    (out,) = run(g, x)
    xd = as_f64(x)
    assert_close(out, xd[:, :3] + xd[:, 3:])


# ---------------------------------------------------------------------------------------------
# Phases: loop-invariant work, post-loop work, several outputs


def test_invariant_and_post_loop_ops(rng):
    """exp(B) once before the loop scales every tile of A; after the loop add C and take silu."""
    a, b, c = randn(rng, 4, 30), randn(rng, 4, 1), randn(rng, 1, 10)
    grid, imap = (2, 1, 1), (0, -1, -1)
    g = mi.new_kernel_graph()
    A = g.new_input(dims=(4, 30), dtype=F32)
    B = g.new_input(dims=(4, 1), dtype=F32)
    C = g.new_input(dims=(1, 10), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=grid, block_dim=(128, 1, 1), forloop_range=3, reduction_dimx=64
    )
    ta = tb.new_input(A, input_map=imap, forloop_dim=1)  # (2, 10)
    tbb = tb.new_input(B, input_map=imap, forloop_dim=-1)  # (2, 1)
    tc = tb.new_input(C, input_map=(-1, -1, -1), forloop_dim=-1)  # (1, 10)
    acc = tb.forloop_accum(tb.mul(ta, tb.exp(tbb)))
    tb.new_output(tb.silu(tb.add(acc, tc)), output_map=imap)
    (Y,) = g.customized([A, B, C], tb)
    g.mark_output(Y)
    (out,) = run(g, a, b, c)
    ad = as_f64(a)
    ref = silu((ad[:, :10] + ad[:, 10:20] + ad[:, 20:]) * np.exp(as_f64(b)) + as_f64(c))
    assert_close(out, ref)


def test_outputs_in_declaration_order(rng):
    x = randn(rng, 4, 16)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 16), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(2, 1, 1), block_dim=(128, 1, 1), forloop_range=2, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)
    tb.new_output(tb.forloop_accum(tx, "sum"), output_map=(0, -1, -1))
    tb.new_output(tb.forloop_accum(tx), output_map=(0, -1, -1))
    tb.new_output(tb.forloop_accum_max(tx), output_map=(0, -1, -1))
    outs = g.customized([X], tb)
    assert [tuple(t.dims) for t in outs] == [(4, 1), (4, 8), (4, 8)]
    s, e, mx = run(g, x)  # nothing marked: the three outputs are the sinks, in order
    xd = as_f64(x)
    assert_close(s, xd.sum(axis=1, keepdims=True))
    assert_close(e, xd[:, :8] + xd[:, 8:])
    assert_close(mx, np.maximum(xd[:, :8], xd[:, 8:]))


def test_customized_output_feeds_kernel_ops(rng):
    x, w = randn(rng, 4, 32), randn(rng, 32, 6, scale=0.1)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 32), dtype=F32)
    W = g.new_input(dims=(32, 6), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(2, 1, 1), block_dim=(128, 1, 1), forloop_range=4, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=1)
    tw = tb.new_input(W, input_map=(1, -1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(tx, tw)), output_map=(1, -1, -1))
    (Y,) = g.customized([X, W], tb)
    g.mark_output(g.softmax(g.exp(Y), dim=1))
    (out,) = run(g, x, w)
    assert_close(out, softmax(np.exp(as_f64(x) @ as_f64(w)), 1))


@pytest.mark.parametrize("mi_dtype", [mi.float16, mi.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision_customized(rng, mi_dtype):
    import torch

    tdt = torch.float16 if mi_dtype == mi.float16 else torch.bfloat16
    x, w = randn(rng, 4, 32), randn(rng, 32, 8, scale=0.2)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 32), dtype=mi_dtype)
    W = g.new_input(dims=(32, 8), dtype=mi_dtype)
    tb = mi.new_threadblock_graph(
        grid_dim=(2, 1, 1), block_dim=(128, 1, 1), forloop_range=4, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=1)
    tw = tb.new_input(W, input_map=(1, -1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(tx, tw)), output_map=(1, -1, -1))
    (Y,) = g.customized([X, W], tb)
    assert Y.dtype == mi_dtype
    g.mark_output(Y)
    xt, wt = torch.from_numpy(x).to(tdt), torch.from_numpy(w).to(tdt)
    (out,) = g(inputs=[xt, wt])
    assert out.dtype == tdt
    assert_close(out, as_f64(xt) @ as_f64(wt), tol=1e-2)


@pytest.mark.parametrize("marked", [0, 1, 2])
def test_only_one_output_of_several_is_used(rng, marked):
    """The other outputs (and the work only they need) may be skipped, not the marked one."""
    x, w = randn(rng, 4, 16), randn(rng, 16, 6)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 16), dtype=F32)
    W = g.new_input(dims=(16, 6), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(2, 1, 1), block_dim=(128, 1, 1), forloop_range=4, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)  # (2, 4)
    tw = tb.new_input(W, input_map=(-1, -1, -1), forloop_dim=0)  # (4, 6)
    tb.new_output(tb.forloop_accum(tb.matmul(tx, tw)), output_map=(0, -1, -1))
    tb.new_output(tb.forloop_accum(tx, "rms"), output_map=(0, -1, -1))
    tb.new_output(tb.forloop_accum_max(tb.exp(tx)), output_map=(0, -1, -1))
    outs = g.customized([X, W], tb)
    g.mark_output(outs[marked])
    (out,) = run(g, x, w)
    xd = as_f64(x)
    refs = [
        xd @ as_f64(w),
        np.sqrt(np.mean(xd * xd, axis=1, keepdims=True)),
        np.exp(xd.reshape(4, 4, 4).max(axis=1)),
    ]
    assert_close(out, refs[marked])


def test_one_accumulator_saved_with_two_output_maps(rng):
    x = randn(rng, 8, 12)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 12), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(2, 1, 1), block_dim=(128, 1, 1), forloop_range=3, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)  # (4, 4)
    acc = tb.forloop_accum(tx)
    tb.new_output(acc, output_map=(0, -1, -1))
    tb.new_output(acc, output_map=(1, -1, -1))
    Y, Z = g.customized([X], tb)
    assert (tuple(Y.dims), tuple(Z.dims)) == ((8, 4), (4, 8))
    g.mark_output(Z)
    g.mark_output(Y)
    out_z, out_y = run(g, x)
    xd = as_f64(x)
    s = xd[:, :4] + xd[:, 4:8] + xd[:, 8:]
    assert_close(out_y, s)
    assert_close(out_z, np.concatenate([s[:4], s[4:]], axis=1))


def test_reduction_max_after_the_loop(rng):
    """On a post-loop tensor reduction_max is a plain max (diff 0)."""
    x = randn(rng, 4, 12)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 12), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(2, 1, 1), block_dim=(128, 1, 1), forloop_range=2, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)  # (2, 6)
    m, d = tb.reduction_max(tb.forloop_accum(tx), 1)
    tb.new_output(m, output_map=(0, -1, -1))
    tb.new_output(d, output_map=(0, -1, -1))
    M, D = g.customized([X], tb)
    g.mark_output(M)
    g.mark_output(D)
    out_m, out_d = run(g, x)
    xd = as_f64(x)
    assert_close(out_m, (xd[:, :6] + xd[:, 6:]).max(axis=1, keepdims=True))
    np.testing.assert_array_equal(out_d, np.zeros((4, 1)))


def test_invariant_op_used_in_and_after_the_loop(rng):
    a, b = randn(rng, 4, 12), randn(rng, 4, 3)
    g = mi.new_kernel_graph()
    A = g.new_input(dims=(4, 12), dtype=F32)
    B = g.new_input(dims=(4, 3), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(2, 1, 1), block_dim=(128, 1, 1), forloop_range=4, reduction_dimx=64
    )
    ta = tb.new_input(A, input_map=(0, -1, -1), forloop_dim=1)  # (2, 3)
    tbb = tb.new_input(B, input_map=(0, -1, -1), forloop_dim=-1)  # (2, 3)
    e = tb.exp(tbb)
    acc = tb.forloop_accum_max(tb.mul(ta, e))
    tb.new_output(tb.sub(acc, e), output_map=(0, -1, -1))
    (Y,) = g.customized([A, B], tb)
    g.mark_output(Y)
    (out,) = run(g, a, b)
    e_ref = np.exp(as_f64(b))
    tiles = as_f64(a).reshape(4, 4, 3)
    assert_close(out, (tiles * e_ref[:, None, :]).max(axis=1) - e_ref)


def test_rescale_with_invariant_scale(rng):
    """acc_0 = X_0, acc_i = acc_{i-1} * s + X_i: a geometric weighting of the tiles."""
    x, s = randn(rng, 4, 12), uniform(rng, 0.5, 1.5, 4, 1)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 12), dtype=F32)
    S = g.new_input(dims=(4, 1), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(1, 1, 1), block_dim=(128, 1, 1), forloop_range=3, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=1)  # (4, 4)
    ts = tb.new_input(S, input_map=(-1, -1, -1), forloop_dim=-1)  # (4, 1)
    tb.new_output(tb.forloop_accum_rescale(tx, ts), output_map=(-1, -1, -1))
    (Y,) = g.customized([X, S], tb)
    g.mark_output(Y)
    (out,) = run(g, x, s)
    xd, sd = as_f64(x), as_f64(s)
    assert_close(out, xd[:, :4] * sd**2 + xd[:, 4:8] * sd + xd[:, 8:])


def test_one_threadblock_graph_used_twice(rng):
    x1, x2 = randn(rng, 4, 8), randn(rng, 4, 8)
    tb = mi.new_threadblock_graph(
        grid_dim=(2, 1, 1), block_dim=(128, 1, 1), forloop_range=2, reduction_dimx=64
    )
    g = mi.new_kernel_graph()
    X1 = g.new_input(dims=(4, 8), dtype=F32)
    X2 = g.new_input(dims=(4, 8), dtype=F32)
    tx = tb.new_input(X1, input_map=(0, -1, -1), forloop_dim=1)
    tb.new_output(tb.forloop_accum(tb.square(tx)), output_map=(0, -1, -1))
    (Y1,) = g.customized([X1], tb)
    (Y2,) = g.customized([X2], tb)
    g.mark_output(Y1)
    g.mark_output(Y2)
    out1, out2 = run(g, x1, x2)
    for x, out in ((x1, out1), (x2, out2)):
        xd = as_f64(x) ** 2
        assert_close(out, xd[:, :4] + xd[:, 4:])


def test_unused_threadblock_input(rng):
    """A block input no output depends on is either rejected when the op is added (a clear
    ValueError) or ignored when the graph runs; it must never crash the interpreter."""
    x, w = randn(rng, 4, 8), randn(rng, 8, 8)
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 8), dtype=F32)
    W = g.new_input(dims=(8, 8), dtype=F32)
    tb = mi.new_threadblock_graph(
        grid_dim=(2, 1, 1), block_dim=(128, 1, 1), forloop_range=2, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(0, -1, -1), forloop_dim=1)
    tb.new_input(W, input_map=(-1, -1, -1), forloop_dim=-1)  # never used
    tb.new_output(tb.forloop_accum(tx), output_map=(0, -1, -1))
    try:
        (Y,) = g.customized([X, W], tb)
    except ValueError as e:
        assert "customized" in str(e) or "new_input" in str(e)
        return
    g.mark_output(Y)
    (out,) = run(g, x, w)
    xd = as_f64(x)
    assert_close(out, xd[:, :4] + xd[:, 4:])
