"""Scripts in the reference Mirage's style run unchanged (CPU tensors for the device), and each
reference name of docs/reference-compat.md is checked on its own: JSON files, the generated
program's dict, dtype converters, the visualizer, the owner-independent hash, compile and
valid_kernels, and the newer superoptimize keywords."""

from __future__ import annotations

import os
import runpy
import shutil
import textwrap

import mirage as mi
import pytest
import torch
from conftest import nvrtc_or_skip, rel_err

# ---------------------------------------------------------------- demo scripts
# Each script builds a graph as the reference's demos do, saves and reloads it, prints the
# generated program, draws it, superoptimizes on the CPU and checks the result against torch.

GATED_MLP = """
import mirage as mi
import torch
from mirage import visualizer

silu = torch.nn.SiLU()

def torch_gated_mlp(X, W1, W2):
    return silu(X @ W1) * (X @ W2)

if __name__ == "__main__":
    graph = mi.new_kernel_graph()
    X = graph.new_input(dims=(8, 128), dtype=mi.float16)
    W1 = graph.new_input(dims=(128, 128), dtype=mi.float16)
    W2 = graph.new_input(dims=(128, 128), dtype=mi.float16)
    O = graph.mul(graph.silu(graph.matmul(X, W1)), graph.matmul(X, W2))
    graph.mark_output(O)

    graph.to_json("gated_mlp.json")
    loaded = mi.new_kernel_graph()
    loaded.from_json("gated_mlp.json")
    assert loaded.get_owner_independent_hash() == graph.get_owner_independent_hash()

    input_tensors = [
        torch.randn(8, 128, dtype=torch.float16, device=DEVICE),
        torch.randn(128, 128, dtype=torch.float16, device=DEVICE) / 8,
        torch.randn(128, 128, dtype=torch.float16, device=DEVICE) / 8,
    ]
    input_strides = [tensor.stride() for tensor in input_tensors]
    p = mi.generate_cuda_program(graph.cygraph, target_cc=90, input_strides=input_strides)
    print(p["code"][:200])
    RESULT["code"] = p["code"]

    visualizer("gated_mlp").draw_graphs(graph)
    optimized = graph.superoptimize(
        config="mlp", backend="cpu", search_time_limit_sec=30, use_symbolic_search=False
    )
    RESULT["valid"] = optimized.valid_kernels()
    (out,) = optimized(inputs=input_tensors)
    RESULT["out"] = out
    RESULT["ref"] = torch_gated_mlp(*[t.double() for t in input_tensors])
    RESULT["kernels"] = optimized.search_stats["winner"]["customized_kernels"]
"""

RMSNORM_LINEAR = """
import mirage as mi
import torch

if __name__ == "__main__":
    mirage_dtype = mi.bfloat16
    torch_dtype = mi.convert_dtype_to_torch_type(mirage_dtype)
    graph = mi.new_kernel_graph()
    X = graph.new_input(dims=(8, 256), dtype=mirage_dtype)
    W = graph.new_input(dims=(256, 256), dtype=mirage_dtype)
    D = graph.rms_norm(X, normalized_shape=(256,))
    O = graph.matmul(D, W)
    graph.mark_output(O)

    graph.to_json("rms_norm_linear.json")
    again = mi.KNGraph.from_json("rms_norm_linear.json")
    RESULT["hashes"] = (graph.get_owner_independent_hash(), again.get_owner_independent_hash())

    optimized_graph = graph.superoptimize(
        config="mlp", backend="cpu", search_time_limit_sec=30.0, use_symbolic_search=False
    )
    input_tensors = [
        torch.randn(8, 256, dtype=torch_dtype, device=DEVICE),
        torch.randn(256, 256, dtype=torch_dtype, device=DEVICE) / 16,
    ]
    outputs = optimized_graph(inputs=input_tensors)
    RESULT["out"] = outputs[0]
    x, w = (t.double() for t in input_tensors)
    RESULT["ref"] = (x / x.square().mean(-1, keepdim=True).sqrt()) @ w
    RESULT["dtype"] = outputs[0].dtype == torch_dtype
    p = mi.generate_cuda_program(optimized_graph.cygraph, target_cc=90, input_strides=[
        t.stride() for t in input_tensors])
    RESULT["code"] = p["code"]
    RESULT["smem"] = p["max_smem_size"]
    RESULT["valid"] = optimized_graph.valid_kernels()
"""

LORA = """
import mirage as mi
import torch
from mirage import visualizer

def torch_lora(X, W, A, B):
    return X @ W + (X @ A) @ B

def optimize_lora(checkpoint):
    graph = mi.new_kernel_graph()
    X = graph.new_input(dims=(8, 64), dtype=mi.float16)
    W = graph.new_input(dims=(64, 128), dtype=mi.float16)
    A = graph.new_input(dims=(64, 16), dtype=mi.float16)
    B = graph.new_input(dims=(16, 128), dtype=mi.float16)
    D = graph.matmul(X, A)
    E = graph.matmul(D, B)
    C = graph.matmul(X, W)
    O = graph.add(C, E)
    graph.mark_output(O)
    graph.visualize("lora")
    return graph.superoptimize(
        config="lora",
        backend="cpu",
        previous_checkpoint=checkpoint,
        search_time_limit_sec=30,
        use_symbolic_search=False,
    )

if __name__ == "__main__":
    best = optimize_lora("mirage_lora_checkpoint.json")
    best.to_json("lora_best.json")
    reloaded = mi.KNGraph.from_json("lora_best.json")
    RESULT["same"] = reloaded.get_owner_independent_hash() == best.get_owner_independent_hash()
    input_tensors = [
        torch.randn(8, 64, dtype=torch.float16, device=DEVICE),
        torch.randn(64, 128, dtype=torch.float16, device=DEVICE) / 8,
        torch.randn(64, 16, dtype=torch.float16, device=DEVICE) / 8,
        torch.randn(16, 128, dtype=torch.float16, device=DEVICE) / 4,
    ]
    (out,) = reloaded(inputs=input_tensors)
    RESULT["out"] = out
    RESULT["ref"] = torch_lora(*[t.double() for t in input_tensors])
    RESULT["valid"] = best.valid_kernels()
    RESULT["code"] = mi.generate_cuda_program(best.cygraph, target_cc=90)["code"]
"""


def run_script(source: str, folder, monkeypatch) -> dict:
    """Runs ``source`` as ``__main__`` in ``folder`` (search cache there too) on CPU tensors;
    returns what it stored in ``RESULT``."""
    monkeypatch.chdir(folder)
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(folder / "cache"))
    path = folder / "demo.py"
    path.write_text(textwrap.dedent(source))
    result: dict = {}
    runpy.run_path(str(path), {"RESULT": result, "DEVICE": "cpu"}, run_name="__main__")
    return result


def check_script(res: dict, folder) -> None:
    assert rel_err(res["out"], res["ref"]) < 2e-2
    assert 'extern "C" __global__' in res["code"]
    assert res["valid"] is True


def test_gated_mlp_script(tmp_path, monkeypatch):
    nvrtc_or_skip()
    res = run_script(GATED_MLP, tmp_path, monkeypatch)
    check_script(res, tmp_path)
    assert res["kernels"] == 1
    assert (tmp_path / "gated_mlp.dot").read_text().startswith("digraph")
    assert (tmp_path / "gated_mlp.json").stat().st_size > 0


def test_rmsnorm_linear_script(tmp_path, monkeypatch):
    nvrtc_or_skip()
    res = run_script(RMSNORM_LINEAR, tmp_path, monkeypatch)
    check_script(res, tmp_path)
    a, b = res["hashes"]
    assert a == b and isinstance(a, int)
    assert res["dtype"]
    assert res["smem"] > 0


def test_lora_script(tmp_path, monkeypatch):
    nvrtc_or_skip()
    res = run_script(LORA, tmp_path, monkeypatch)
    check_script(res, tmp_path)
    assert res["same"]
    assert (tmp_path / "mirage_lora_checkpoint.json").exists()
    assert (tmp_path / "lora.dot").exists()


# ---------------------------------------------------------------- focused tests
def small_graph(n: int = 32) -> mi.KNGraph:
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, n), dtype=mi.float16)
    W = g.new_input(dims=(n, 16), dtype=mi.float16)
    g.mark_output(g.matmul(g.rms_norm(X, normalized_shape=(n,)), W))
    return g


def test_to_json_file_round_trips(tmp_path):
    g = small_graph()
    path = tmp_path / "g.json"
    assert g.to_json(str(path)) is None
    assert path.read_text() == g.to_json()  # no filename: the text, as before
    loaded = mi.KNGraph.from_json(path)
    assert loaded is not g and loaded.hash() == g.hash()
    assert mi.load_json(path).hash() == g.hash()
    assert mi.from_json(g.to_json()).hash() == g.hash()


def test_from_json_on_a_graph_loads_into_it(tmp_path):
    g = small_graph()
    path = tmp_path / "g.json"
    g.to_json(path)
    other = mi.new_kernel_graph()
    assert other.from_json(str(path)) is other
    assert other.hash() == g.hash() and other.num_ops == g.num_ops
    (out,) = other(inputs=[torch.ones(4, 32).half(), torch.ones(32, 16).half()])
    assert torch.allclose(out.float(), torch.full((4, 16), 32.0), rtol=1e-2)


def test_from_json_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="from_json"):
        mi.KNGraph.from_json(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    with pytest.raises(ValueError, match="to_json"):
        mi.KNGraph.from_json(bad)
    with pytest.raises(TypeError, match="filename"):
        mi.KNGraph.from_json(3)
    with pytest.raises(TypeError, match="filename"):
        small_graph().to_json(3)


def test_owner_independent_hash_ignores_build_order_and_ids():
    a = small_graph()
    # The same graph with an unrelated input added first and the ops built from it apart.
    b = mi.new_kernel_graph()
    X = b.new_input(dims=(4, 32), dtype=mi.float16)
    W = b.new_input(dims=(32, 16), dtype=mi.float16)
    b.mark_output(b.matmul(b.rms_norm(X, normalized_shape=(32,)), W))
    h = a.get_owner_independent_hash()
    assert isinstance(h, int) and 0 <= h < 2**64
    assert h == b.get_owner_independent_hash() == int(a.hash()[:16], 16)
    assert h != small_graph(64).get_owner_independent_hash()


def test_generate_cuda_program_dict():
    g = small_graph()
    p = mi.generate_cuda_program(g.cygraph, target_cc=90, input_strides=[(32, 1), (16, 1)])
    assert 'extern "C" __global__' in p["code"]
    assert p["code"] == g.cuda_source(90)
    assert p["arch"] == 90
    kernels = p["kernels"]
    assert kernels and p["max_smem_size"] == max(k["smem_bytes"] for k in kernels)
    assert p["buf_size"] >= 0 and p["profiler_buf_size"] == 0
    assert p["output_directives"] == [{"alloc_size": 64, "shape": [4, 16], "strides": [16, 1]}]
    # Accepted and ignored: the generator picks warpgroups and stages itself.
    q = mi.generate_cuda_program(g, target_cc=90, num_warp_groups=3, pipeline_stages=4)
    assert q["code"] == p["code"]


def test_generate_cuda_program_column_major_output():
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(4, 8), dtype=mi.float32)
    g.mark_output(g.exp(X), strides=(1, 4))
    p = mi.generate_cuda_program(g, target_cc=80)
    assert p["output_directives"] == [{"alloc_size": 32, "shape": [4, 8], "strides": [1, 4]}]


def test_generate_cuda_program_refusals():
    g = small_graph()
    with pytest.raises(ValueError, match=r"input 1 .*strides \(1, 32\).*new_input"):
        mi.generate_cuda_program(g, target_cc=90, input_strides=[(32, 1), (1, 32)])
    with pytest.raises(ValueError, match="2 inputs"):
        mi.generate_cuda_program(g, target_cc=90, input_strides=[(32, 1)])
    with pytest.raises(ValueError, match="profiling"):
        mi.generate_cuda_program(g, target_cc=90, profiling=True)
    with pytest.raises(ValueError, match="enable_online_softmax"):
        mi.generate_cuda_program(g, target_cc=90, enable_online_softmax=True)
    with pytest.raises(ValueError, match="target_cc"):
        mi.generate_cuda_program(g, target_cc=7)
    with pytest.raises(TypeError, match="KNGraph"):
        mi.generate_cuda_program("graph", target_cc=90)


def test_dtype_converters():
    assert mi.convert_dtype_to_torch_type(mi.float16) is torch.float16
    assert mi.convert_dtype_to_torch_type(mi.bfloat16) is torch.bfloat16
    assert mi.convert_dtype_to_torch_type(mi.float32) is torch.float32
    assert mi.convert_dtype_to_torch_type("fp16") is torch.float16
    for t, d in ((torch.float16, mi.float16), (torch.bfloat16, mi.bfloat16)):
        assert mi.convert_torch_type_to_dtype(t) == d
        assert mi.convert_dtype_to_torch_type(mi.convert_torch_type_to_dtype(t)) is t
    with pytest.raises(ValueError, match="'int8'"):
        mi.convert_dtype_to_torch_type("int8")
    with pytest.raises(ValueError, match="torch.float16"):
        mi.convert_dtype_to_torch_type(torch.float16)
    with pytest.raises(ValueError, match="torch.int8"):
        mi.convert_torch_type_to_dtype(torch.int8)


def test_visualizer_module(tmp_path, monkeypatch):
    from mirage import visualizer

    g = small_graph()
    expected = ["matmul", "rms_norm"]
    # Without Graphviz: only the .dot file, and the caller is told.
    monkeypatch.setattr(shutil, "which", lambda name: None)
    paths = visualizer(str(tmp_path / "a")).draw_graphs(g)
    assert paths == [str(tmp_path / "a.dot")]
    text = (tmp_path / "a.dot").read_text()
    assert text == g.to_dot() and all(name in text for name in expected)
    paths = visualizer.draw(g, tmp_path / "b", formats=("svg",))
    assert paths == [str(tmp_path / "b.dot")]
    assert isinstance(visualizer.visualizer("x"), visualizer.visualizer)
    with pytest.raises(TypeError, match="KNGraph"):
        visualizer(str(tmp_path / "c")).draw_graphs([{"op_type": "matmul"}])


def test_visualizer_renders_with_graphviz(tmp_path, monkeypatch):
    """With a ``dot`` on the PATH (a stand-in script recording its arguments), a PNG is
    rendered next to the .dot file."""
    from mirage import visualizer

    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\ntouch "$4"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    paths = visualizer(str(tmp_path / "g")).draw_graphs(small_graph())
    assert paths == [str(tmp_path / "g.dot"), str(tmp_path / "g.png")]
    calls = (fake.parent / "calls").read_text().split()
    assert calls == ["-Tpng", str(tmp_path / "g.dot"), "-o", str(tmp_path / "g.png")]


def test_compile_and_valid_kernels():
    nvrtc_or_skip()
    g = small_graph()
    x, w = torch.randn(4, 32).half(), torch.randn(32, 16).half()
    res = g.compile(inputs=[x, w], target_cc=90)
    assert res is not None and 'extern "C" __global__' in res["code"]
    assert g.valid_kernels() is True and g.get_error_message() == "No error"
    assert g.compile(async_=True, target_cc=90).wait() is res  # cached per target
    assert g.compile(target_cc=80)["arch"] == 80
    g.mark_output(g.inputs[0])  # the graph changed: compiled again
    assert len(g.compile(target_cc=80)["output_directives"]) == 2
    with pytest.raises(ValueError, match=r"input 1: expected shape \(32, 16\)"):
        small_graph().compile(inputs=[x, x], target_cc=90)
    with pytest.raises(ValueError, match=r"strides"):
        small_graph().compile(inputs=[x, w.t().contiguous().t()], target_cc=90)
    with pytest.raises(TypeError, match="unexpected keyword"):
        small_graph().compile(target=90)


def test_compile_reports_shared_memory_over_the_target():
    """A tile over sm_75's 64 KB of shared memory a block: invalid kernels, not an error."""
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(64, 4096), dtype=mi.float32)
    tb = mi.new_threadblock_graph((1, 1, 1), (128, 1, 1), 1, 64)
    t = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=-1)
    tb.new_output(tb.forloop_accum(tb.exp(t)), output_map=(-1, -1, -1))
    g.mark_output(g.customized([X], tb)[0])
    smem = mi.generate_cuda_program(g, target_cc=75)["max_smem_size"]
    assert smem > 64 * 1024
    assert g.compile(target_cc=75) is None
    assert g.valid_kernels() is False
    assert "exceeds" in g.get_error_message() and str(smem) in g.get_error_message()


def test_get_error_message_needs_compile():
    with pytest.raises(RuntimeError, match="compile"):
        small_graph().get_error_message()


def test_superoptimize_reference_keywords(tmp_path, monkeypatch):
    from mirage import search

    seen: list[dict] = []

    def fake(graph, **kw):
        seen.append(kw)
        return graph

    monkeypatch.setattr(search, "superoptimize", fake)
    g = small_graph()
    g.superoptimize(backend="cpu", search_time_limit_sec=12.5, use_symbolic_search=False)
    assert seen[-1]["time_budget"] == 12.5 and seen[-1]["previous_checkpoint"] is None
    g.superoptimize(backend="cpu", search_time_limit_sec=-1.0)  # the reference's "no limit"
    assert seen[-1]["time_budget"] is None
    g.superoptimize(use_symbolic_search=True, symbolic_checkpoint=tmp_path / "s.json")
    assert seen[-1]["previous_checkpoint"] == tmp_path / "s.json"
    g.superoptimize(symbolic_checkpoint="unused.json")  # the reference ignores it then too
    assert seen[-1]["previous_checkpoint"] is None
    with pytest.raises(ValueError, match="disagree"):
        g.superoptimize(time_budget=5, search_time_limit_sec=6)
    with pytest.raises(ValueError, match="different files"):
        g.superoptimize(
            use_symbolic_search=True, symbolic_checkpoint="a.json", previous_checkpoint="b.json"
        )
    with pytest.raises(TypeError, match="use_symbolic_search"):
        g.superoptimize(use_symbolic_search="yes")
    with pytest.raises(TypeError, match="search_time_limit_sec"):
        g.superoptimize(search_time_limit_sec="10")


def test_search_time_limit_stops_the_search(tmp_path):
    """``search_time_limit_sec`` reaches the search as its time budget."""
    g = small_graph(256)
    try:
        best = g.superoptimize(
            backend="cpu", cache_dir=tmp_path, search_time_limit_sec=1e-3, use_symbolic_search=True
        )
    except mi.search.SearchError as e:  # nothing verified within the millisecond
        assert "time budget" in str(e)
    else:  # a candidate was found, but the search did not run to its end
        assert best.search_stats["stopped"] is not None
