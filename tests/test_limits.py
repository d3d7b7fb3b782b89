"""Inputs past the supported sizes, long CPU runs and odd arguments: every one is a clear
``ValueError``/``TypeError`` (or ``KeyboardInterrupt`` on Ctrl-C), never a crash or a hang.

The size limits are the core's (``mirage._core.MAX_EXTENT`` and friends), shared by the
builders, the JSON loader and the interpreter.
"""

from __future__ import annotations

import _thread
import signal
import threading
import time
import warnings

import mirage as mi
import numpy as np
import pytest
import torch
from mirage import _core

F32 = mi.float32
ERRORS = (ValueError, TypeError)


def expect(exc, *parts):
    """A context expecting ``exc`` whose message holds every one of ``parts``."""
    return pytest.raises(exc, match=".*".join(map(str, parts)))


def tb(grid=(1, 1, 1), block=(128, 1, 1), forloop_range=1, dimx=1):
    return mi.new_threadblock_graph(grid, block, forloop_range, dimx)


# ------------------------------------------------------------------ builder limits
@pytest.mark.parametrize(
    ("dims", "part"),
    [
        ((2**63, 2), "out of range"),
        ((2**64, 2), "out of range"),
        ((2**40, 2**40), "largest supported"),
        ((2**31 + 1, 2), "largest supported"),
        ((2**30, 2**30, 2**30), "elements exceed"),
    ],
)
def test_new_input_past_the_limits(dims, part):
    g = mi.new_kernel_graph()
    with expect(ValueError, "new_input", part):
        g.new_input(dims, dtype=F32)
    assert g.num_ops == 0


def test_matmul_result_past_the_element_limit():
    g = mi.new_kernel_graph()
    a = g.new_input((2**24, 2**24, 1), dtype=F32)
    b = g.new_input((2**24, 1, 2**24), dtype=F32)
    with expect(ValueError, "matmul", "the result"):
        g.matmul(a, b)


@pytest.mark.parametrize(
    ("kwargs", "part"),
    [
        ({"grid": (2**40, 1, 1)}, "grid_dim"),
        ({"grid": (2**16, 2**16, 1)}, "grid_dim"),
        ({"block": (2**40, 2**40, 1)}, "block_dim"),
        ({"forloop_range": 2**40}, "forloop_range"),
        ({"forloop_range": 2**70}, "forloop_range"),
        ({"dimx": 2**40}, "reduction_dimx"),
    ],
)
def test_launch_parameters_past_the_limits(kwargs, part):
    with expect(ValueError, "new_threadblock_graph", part):
        tb(**kwargs)


def test_concat_chain_stops_at_the_dim_limit():
    g = mi.new_kernel_graph()
    x = g.new_input((1, 2**20), dtype=F32)
    b = tb()
    t = b.new_input(x, (-1, -1, -1), -1)
    with expect(ValueError, "tb.concat", "concat dim 1"):
        for _ in range(61):
            t = b.concat(t, t, 1)
    assert 0 < t.dims[1] <= _core.MAX_EXTENT
    b.new_output(t, (-1, -1, -1))
    (y,) = g.customized([x], b)
    assert y.dims == (1, 2**31)


def test_output_past_the_dim_limit():
    g = mi.new_kernel_graph()
    x = g.new_input((2**31,), dtype=F32)
    b = tb(grid=(2**8, 1, 1), forloop_range=2)
    t = b.new_input(x, (-1, -1, -1), 0)
    with expect(ValueError, "tb.new_output"):
        b.new_output(t, (0, -1, -1), 0)


def test_clamp_bounds_that_are_not_floats():
    g = mi.new_kernel_graph()
    x = g.new_input((4,), dtype=F32)
    with expect(ValueError, "clamp", "float range"):
        g.clamp(x, -(10**400), 1)
    with expect(TypeError, "clamp", "min_val"):
        g.clamp(x, "low", 1)


# --------------------------------------------------------------- interpreter limits
def test_run_refuses_an_absurd_intermediate_before_allocating():
    g = mi.new_kernel_graph()
    a = g.new_input((2**16, 1), dtype=F32)
    b = g.new_input((1, 2**16), dtype=F32)
    g.mark_output(g.matmul(a, b))
    ins = [np.zeros((2**16, 1), np.float32), np.zeros((1, 2**16), np.float32)]
    with expect(ValueError, "run", "2\\^31"):
        g(inputs=ins)


def huge_grid_graph(blocks: int) -> mi.KNGraph:
    g = mi.new_kernel_graph()
    x = g.new_input((blocks,), dtype=F32)
    b = tb(grid=(blocks, 1, 1))
    b.new_output(b.exp(b.new_input(x, (0, -1, -1), -1)), (0, -1, -1))
    g.mark_output(g.customized([x], b)[0])
    return g


def test_run_and_verify_refuse_a_grid_past_the_interpreter_limit():
    n = 2 * _core.MAX_RUN_BLOCKS
    g = huge_grid_graph(n)
    with expect(ValueError, "run", "customized", "2\\^20"):
        g(inputs=[np.zeros(n, np.float32)])
    with expect(ValueError, "customized", "2\\^20"):
        mi.verify(g, g)


# ------------------------------------------------------------------------ Ctrl-C
def interrupt_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, _thread.interrupt_main)
    timer.start()
    return timer


def long_loop_graph(iterations: int = 2**24) -> mi.KNGraph:
    """One block summing the same 8x8 tile ``iterations`` times (many seconds on the CPU)."""
    g = mi.new_kernel_graph()
    x = g.new_input((8, 8), dtype=F32)
    b = tb(forloop_range=iterations)
    b.new_output(b.forloop_accum(b.new_input(x, (-1, -1, -1), -1)), (-1, -1, -1))
    g.mark_output(g.customized([x], b)[0])
    return g


def big_matmul_graph(n: int = 4096) -> mi.KNGraph:
    g = mi.new_kernel_graph()
    a = g.new_input((n, n), dtype=F32)
    b = g.new_input((n, n), dtype=F32)
    g.mark_output(g.matmul(a, b))
    return g


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(
            lambda: big_matmul_graph()(inputs=[np.ones((4096, 4096), np.float32)] * 2),
            id="run-matmul",
        ),
        pytest.param(
            lambda: long_loop_graph()(inputs=[np.ones((8, 8), np.float32)]), id="run-loop"
        ),
        pytest.param(lambda: mi.verify(long_loop_graph(), long_loop_graph()), id="verify"),
    ],
)
def test_ctrl_c_interrupts_long_cpu_work(call):
    # Python's own SIGINT handler, whatever an earlier test's library left installed
    # (``interrupt_main`` does nothing while SIGINT is ignored).
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = interrupt_after(0.2)
    t0 = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, old)
    assert time.perf_counter() - t0 < 2.5


# ------------------------------------------------------------------ odd arguments
def test_relu_and_clamp_keep_nan_like_torch():
    g = mi.new_kernel_graph()
    x = g.new_input((5,), dtype=F32)
    g.mark_output(g.relu(x))
    g.mark_output(g.clamp(x, -1.0, 1.0))
    data = torch.tensor([float("nan"), -2.0, -0.5, 0.5, 2.0])
    relu, clamp = g(inputs=[data])
    torch.testing.assert_close(relu, torch.relu(data), equal_nan=True)
    torch.testing.assert_close(clamp, torch.clamp(data, -1.0, 1.0), equal_nan=True)


def test_bad_json_echoes_a_few_hundred_characters_at_most():
    big = "x" * (10 << 20)
    for text in (
        '{"format": "' + big + '"}',
        '{"format": "mirage-ugraph", "version": 1, "graph": {"ops": "' + big + '"}}',
        big,
    ):
        with pytest.raises(ValueError) as e:
            mi.from_json(text)
        assert len(str(e.value)) < 1000


def test_generator_inputs_are_read_once():
    g = mi.new_kernel_graph()
    x = g.new_input((3,), dtype=F32)
    y = g.new_input((3,), dtype=F32)
    g.mark_output(g.add(x, y))
    ones = np.ones(3, np.float32)
    (out,) = g(inputs=(t for t in [ones, ones]))
    np.testing.assert_array_equal(out, 2 * ones)
    with expect(ValueError, "2 inputs but 1"):
        g(inputs=(t for t in [ones]))
    with expect(TypeError, "list of tensors"):
        g(inputs={"x": ones, "y": ones})


# ------------------------------------------------------------------ superoptimize
def small_graph() -> mi.KNGraph:
    g = mi.new_kernel_graph()
    x = g.new_input((8, 64), dtype=mi.float16)
    w = g.new_input((64, 64), dtype=mi.float16)
    g.mark_output(g.matmul(g.rms_norm(x, normalized_shape=(64,)), w))
    return g


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"verify_top_n": 2**62}, "verify_top_n"),
        ({"max_kernel_ops": 2**64}, "max_kernel_ops"),
        ({"max_block_ops": 10**6}, "max_block_ops"),
        ({"shared_memory_limit": -1}, "shared_memory_limit"),
        ({"max_customized_ops": 0}, "max_customized_ops"),
    ],
)
def test_integer_config_values_are_range_checked(config, key, tmp_path):
    with pytest.raises(ValueError) as e:
        small_graph().superoptimize(backend="cpu", cache_dir=tmp_path, config=config)
    msg = str(e.value)
    assert key in msg and "allowed range" in msg, msg
    assert str(config[key]) in msg or "out of range" in msg, msg
    assert not list(tmp_path.glob("*.json"))


def test_num_threads_is_capped_with_a_warning(tmp_path):
    t0 = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="num_threads"):
        best = small_graph().superoptimize(
            backend="cpu", cache_dir=tmp_path, num_threads=10000, time_budget=10.0
        )
    assert best.search_stats["winner"]["verification"] == "passed"
    assert time.perf_counter() - t0 < 15.0


def test_save_codes_naming_an_existing_file_fails_before_the_search(tmp_path):
    target = tmp_path / "not_a_folder"
    target.write_text("keep me")
    t0 = time.perf_counter()
    with expect(ValueError, "save_codes", "existing file"):
        small_graph().superoptimize(backend="cpu", cache_dir=tmp_path / "c", save_codes=target)
    assert time.perf_counter() - t0 < 1.0
    assert target.read_text() == "keep me"
    assert not (tmp_path / "c").exists()


def test_time_budget_beyond_the_float_range():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with expect(ValueError, "time_budget"):
            small_graph().superoptimize(backend="cpu", time_budget=10**400)
