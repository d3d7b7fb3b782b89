"""mi.verify: equivalent µGraphs are accepted with their numbers; wrong ones are rejected."""

from __future__ import annotations

import mirage as mi
import pytest


def rmsnorm_linear_plain(m: int = 8, k: int = 256, n: int = 128) -> mi.KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(m, k), dtype=mi.float16)
    W = g.new_input(dims=(k, n), dtype=mi.float16)
    g.mark_output(g.matmul(g.rms_norm(X, normalized_shape=(k,)), W))
    return g


def rmsnorm_linear_fused(
    m: int = 8, k: int = 256, n: int = 128, acc: str = "rms", omap: tuple = (1, -1, -1)
) -> mi.KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(m, k), dtype=mi.float16)
    W = g.new_input(dims=(k, n), dtype=mi.float16)
    tb = mi.new_threadblock_graph(
        grid_dim=(4, 1, 1), block_dim=(128, 1, 1), forloop_range=8, reduction_dimx=64
    )
    tx = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=1)
    tw = tb.new_input(W, input_map=(1, -1, -1), forloop_dim=0)
    mm = tb.forloop_accum(tb.matmul(tx, tw))
    rms = tb.forloop_accum(tx, acc)
    tb.new_output(tb.div(mm, rms), output_map=omap)
    (Z,) = g.customized([X, W], tb)
    g.mark_output(Z)
    return g


def test_the_one_kernel_rmsnorm_linear_is_equivalent() -> None:
    v = mi.verify(rmsnorm_linear_plain(), rmsnorm_linear_fused())
    assert v.equivalent and v.accepted and bool(v)
    assert v.trials >= 1 and v.false_accept_bound < 1e-9
    assert v.fragment == "lax"
    assert "equivalent" in str(v)


@pytest.mark.parametrize("acc", ["mean", "sum"])
def test_a_wrong_accumulator_is_rejected_with_a_counterexample(acc: str) -> None:
    v = mi.verify(rmsnorm_linear_plain(), rmsnorm_linear_fused(acc=acc))
    assert not v.equivalent and not v
    assert v.counterexample["reference_value"] != v.counterexample["candidate_value"]
    assert "not equivalent" in str(v)


def test_graphs_with_other_inputs_cannot_be_compared() -> None:
    with pytest.raises(ValueError, match="input"):
        mi.verify(rmsnorm_linear_plain(k=256), rmsnorm_linear_fused(k=512))


def test_verify_needs_kernel_graphs() -> None:
    with pytest.raises(TypeError, match="kernel graph"):
        mi.verify(rmsnorm_linear_plain(), "not a graph")  # type: ignore[arg-type]


def concat_graph(scale_x: bool) -> mi.KNGraph:
    """``[A (16, 511), X (16, 1), B (16, 512)]`` concatenated along dim 1, ``X`` doubled or not."""
    g = mi.new_kernel_graph()
    ins = [g.new_input(dims=(16, c), dtype=mi.float16) for c in (511, 1, 512)]
    tb = mi.new_threadblock_graph(
        grid_dim=(1, 1, 1), block_dim=(128, 1, 1), forloop_range=1, reduction_dimx=64
    )
    a, x, b = (tb.new_input(t, input_map=(-1, -1, -1), forloop_dim=-1) for t in ins)
    if scale_x:
        x = tb.mul_scalar(x, 2.0)
    tb.new_output(tb.concat(tb.concat(a, x, 1), b, 1), output_map=(-1, -1, -1))
    (out,) = g.customized(ins, tb)
    g.mark_output(out)
    return g


def test_one_interior_column_is_caught_by_every_element_coverage() -> None:
    reference, candidate = concat_graph(False), concat_graph(True)
    for seed in range(5):
        v = mi.verify(reference, candidate, seed=seed)
        assert not v.equivalent, str(v)
        assert v.counterexample["index"][1] == 511
    # The sampled check compares a few elements only: it misses the column, and says its
    # bound is per compared element.
    v = mi.verify(reference, candidate, coverage="sampled", float_check=False)
    assert v.equivalent and v.coverage == "sampled"
    assert v.bound_scope == "compared element"
    assert "per compared element only" in str(v) and "not a bound for the candidate" in str(v)


def test_every_element_verdict_bounds_the_candidate() -> None:
    v = mi.verify(rmsnorm_linear_plain(), rmsnorm_linear_fused())
    assert v.equivalent and v.coverage == "every" and v.bound_scope == "candidate"
    assert v.samples == v.trials * 8 * 128
    assert "for the candidate" in str(v)


def test_an_unknown_coverage_is_refused() -> None:
    with pytest.raises(ValueError, match="coverage"):
        mi.verify(rmsnorm_linear_plain(), rmsnorm_linear_fused(), coverage="most")  # type: ignore[arg-type]
