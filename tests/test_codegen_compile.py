"""CUDA code generation compiles with NVRTC (no GPU needed): every zoo µGraph and its reference
program, a set of kernel-op and block-op graphs, and every graph the CPU suite shares, for sm_80
and sm_90 (CUBIN). A compile error fails the test with NVRTC's log.
"""

from __future__ import annotations

import hashlib
import shutil

import mirage as mi
import numpy as np
import pytest
from conftest import gpu_script, nvrtc_or_skip
from mirage import _core, _cuda
from test_serialization import GRAPHS as SUITE_GRAPHS

ARCHS = (80, 90)


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path / "cache"))
    nvrtc_or_skip()


def _compile(g: mi.KNGraph, name: str) -> None:
    for arch in ARCHS:
        try:
            cubin = g.compile_cuda(arch)
        except RuntimeError as e:
            pytest.fail(f"{name}: sm_{arch}: {e}")
        assert cubin[:4] == b"\x7fELF", f"{name}: sm_{arch}: not a CUBIN"


ZOO = gpu_script("zoo")
PAPER = [name for name, _, _ in ZOO.paper_workloads(1)]


@pytest.mark.parametrize("name", PAPER)
def test_paper_workloads_compile(name):
    for n, ref, ug in ZOO.paper_workloads(1):
        if n == name:
            _compile(ug, f"{n}/ugraph")
            _compile(ref, f"{n}/reference")


ZOO_SMALL = [
    ("rmsnorm_linear", [4, 256, 512, 8, 4]),
    ("gated_mlp", [4, 256, 512, 8, 4]),
    ("lora", [4, 256, 512, 16, 8, 4]),
    ("attention", [2, 32, 64, 512, 4, 2]),
    ("qknorm_attention", [2, 32, 64, 512, 4, 2]),
    ("attention_online", [2, 32, 64, 512, 4, 2]),
    ("ntrans", [4, 512]),
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("name,params", ZOO_SMALL)
def test_zoo_dtypes_compile(name, params, dtype):
    ref, ug = ZOO.pair(name, dtype, params)
    _compile(ug, f"{name}/{dtype}/ugraph")
    _compile(ref, f"{name}/{dtype}/reference")


@pytest.mark.parametrize("dtype", [mi.float16, mi.bfloat16, mi.float32])
def test_kernel_ops_compile(dtype):
    g = mi.new_kernel_graph()
    x = g.new_input((3, 5, 7), dtype=dtype)
    y = g.new_input((3, 1, 7), strides=(1, 1, 3), dtype=dtype)
    w = g.new_input((7,), dtype=dtype)
    m = g.new_input((3, 7, 9), dtype=dtype)
    a = g.add(x, y)
    e = g.clamp(g.gelu(a), -1.5, 2.0)
    r = g.reduction(g.relu(g.silu(e)), 1)
    n = g.rms_norm(a, (7,), weight=w)
    s = g.softmax(n, dim=1)
    p = g.matmul(g.exp(s), m)
    q = g.div(g.pow(g.sqrt(g.square(p)), p), g.sub(p, p))
    g.mark_output(r)
    g.mark_output(q, strides=(1, 27, 3))
    g.mark_output(x)
    _compile(g, f"kernel ops {dtype}")


def test_block_ops_compile():
    g = mi.new_kernel_graph()
    X = g.new_input((8, 64), dtype=mi.float16)
    Y = g.new_input((8, 64), dtype=mi.float16)
    tb = mi.new_threadblock_graph((2, 2, 1), (100, 1, 1), 4, 4)
    tx = tb.new_input(X, (0, -1, -1), 1)
    ty = tb.new_input(Y, (-1, 0, -1), -1)
    c = tb.concat(tx, tx, 1)
    r = tb.reduction(c, 0)
    mx, diff = tb.reduction_max(tx, 1)
    rn = tb.rms_norm(tb.sqrt(ty))
    a1 = tb.forloop_accum(r, "sum_todimx")
    a2 = tb.forloop_accum_rescale(tx, tb.exp(diff), "sum")
    a3 = tb.forloop_accum_max(mx)
    a4 = tb.forloop_accum(tb.mul_scalar(tx, 0.5), "rms")
    for t in (a1, a2, a3, a4, rn):
        tb.new_output(t, (0, 1, -1), -1)
    tb.new_output(c, (0, 1, -1), 1)
    for o in g.customized([X, Y], tb):
        g.mark_output(o)
    _compile(g, "block ops")


def _rmsnorm_matmul() -> mi.KNGraph:
    """rms_norm then matmul as two predefined kernels (X 16x256, W 256x128; the matmul on the
    default kernel where MIRAGE_CUBLAS=0, else a cuBLAS step)."""
    g = mi.new_kernel_graph()
    x = g.new_input((16, 256), dtype=mi.float16)
    w = g.new_input((256, 128), dtype=mi.float16)
    g.mark_output(g.matmul(g.rms_norm(x, (256,)), w))
    return g


def test_generated_source_is_inspectable(monkeypatch):
    monkeypatch.setenv("MIRAGE_CUBLAS", "0")
    g = _rmsnorm_matmul()
    src = g.cuda_source(90)
    assert "namespace mi" in src and src.count('extern "C" __global__') == 2
    _, plan = _cuda.cuda_source(g, 80)
    assert [k["kind"] for k in plan["kernels"]] == ["rms_norm", "matmul"]
    # The normalized rows between the kernels, stored in their dtype (a plain value).
    assert plan["workspace_bytes"] == 16 * 256 * 2


def test_cuda_resources_report_every_kernel(monkeypatch):
    monkeypatch.setenv("MIRAGE_CUBLAS", "0")
    g = _rmsnorm_matmul()
    _, plan = _cuda.cuda_source(g, 90)
    res = g.cuda_resources(90)
    assert res["arch"] == 90 and isinstance(res["warnings"], list)
    assert [k["name"] for k in res["kernels"]] == [k["name"] for k in plan["kernels"]]
    for k, launch in zip(res["kernels"], plan["kernels"]):
        assert k["block"] == launch["block"] and k["smem_bytes"] == launch["smem_bytes"]
        assert 0 < k["registers"] <= 255, k
        assert k["spill_store_bytes"] == 0 and k["spill_load_bytes"] == 0, k
        assert k["stack_frame_bytes"] >= 0 and k["barriers"] >= 0 and k["static_smem_bytes"] >= 0
    assert "ptxas_log" not in res  # only where the report misses a kernel


def test_cuda_sass_lists_each_kernels_instructions(monkeypatch):
    monkeypatch.setenv("MIRAGE_CUBLAS", "0")
    g = _rmsnorm_matmul()
    _, plan = _cuda.cuda_source(g, 90)
    code = g.cuda_sass(90)
    assert sorted(code) == sorted(k["name"] for k in plan["kernels"])
    for name, k in code.items():
        ops = k["opcodes"]
        assert sum(ops.values()) == len(k["instructions"]) > 0, name
        assert ops.get("EXIT", 0) > 0 and ops.get("STG", 0) > 0, (name, ops)
        assert not any("." in o or o.startswith("@") for o in ops), (name, ops)
    # MIRAGE_NVDISASM comes first: a program that fails is a RuntimeError saying so.
    monkeypatch.setenv("MIRAGE_NVDISASM", shutil.which("false") or "/bin/false")
    with pytest.raises(RuntimeError, match="SASS disassembly failed: .* exited with"):
        g.cuda_sass(90)


@pytest.mark.parametrize(
    "var, good, bad, message",
    [
        ("MIRAGE_WS_WARPGROUPS", ("2", "3", " 3 ", ""), "4", 'must be 2 or 3, got "4"'),
        ("MIRAGE_LAZY_MERGE", ("0", "1", " 1 ", ""), "yes", 'must be 0 or 1, got "yes"'),
        ("MIRAGE_ASYNC_PUSH", ("0", "1", " 0 ", ""), "on", 'must be 0 or 1, got "on"'),
        ("MIRAGE_WGMMA_ACC", ("0", "1", ""), "2", 'must be 0 or 1, got "2"'),
        ("MIRAGE_EVICT_FIRST", ("0", "1", ""), "off", 'must be 0 or 1, got "off"'),
        ("MIRAGE_CUBLAS", ("0", "1", ""), "no", 'must be 0 or 1, got "no"'),
    ],
)
def test_codegen_settings_from_the_environment_are_checked(monkeypatch, var, good, bad, message):
    g = mi.new_kernel_graph()
    x = g.new_input((16, 256), dtype=mi.float16)
    g.mark_output(g.rms_norm(x, (256,)))
    for ok in good:
        monkeypatch.setenv(var, ok)
        assert "namespace mi" in g.cuda_source(90)
    monkeypatch.setenv(var, bad)
    with pytest.raises(ValueError, match=f"{var} {message}"):
        g.cuda_source(90)


def test_weight_tiles_read_once_carry_the_l2_policy_unless_turned_off(monkeypatch):
    # The zoo's fused RMSNorm + Linear (grid over W's columns, a loop over K): W's tiles are
    # each block's own (evict_first), X's are shared by all blocks (plain copies).
    _, best = ZOO.pair("rmsnorm_linear", "float16", [32, 512, 512, 8, 4])
    src = best.cuda_source(90)
    assert "mi::cp_async16_pol(" in src and "mi::l2_policy<false>()" in src
    assert "mi::cp_async16(" in src.split("generated kernels")[1]
    monkeypatch.setenv("MIRAGE_EVICT_FIRST", "0")
    plain = best.cuda_source(90).split("generated kernels")[1]
    assert "_pol(" not in plain and "l2_policy" not in plain
    # On by default from sm_80 (cp.async's L2 hints); sm_75 has no cp.async to carry it.
    monkeypatch.delenv("MIRAGE_EVICT_FIRST")
    assert "mi::cp_async16_pol(" in best.cuda_source(80).split("generated kernels")[1]
    assert "_pol(" not in best.cuda_source(75).split("generated kernels")[1]


@pytest.mark.parametrize("dtype", [mi.float16, mi.bfloat16, mi.float32])
def test_a_predefined_matmul_is_recorded_as_a_cublas_step(dtype, monkeypatch):
    # rms_norm (a default kernel) feeding a transposed-weight matmul (a cuBLAS step), then an
    # element-wise op: the steps keep the graph's order, the source compiles and shows the step.
    g = mi.new_kernel_graph()
    x = g.new_input((16, 256), dtype=dtype)
    w = g.new_input((256, 128), dtype=dtype, strides=(1, 256))
    g.mark_output(g.exp(g.matmul(g.rms_norm(x, (256,)), w)))
    src, plan = _cuda.cuda_source(g, 90)
    assert [k["kind"] for k in plan["kernels"]] == ["rms_norm", "exp"]
    (gemm,) = plan["gemms"]
    assert plan["steps"] == [plan["kernels"][0]["name"], gemm["name"], plan["kernels"][1]["name"]]
    assert (gemm["m"], gemm["n"], gemm["k"], gemm["batch"]) == (16, 128, 256, 1)
    # Row-major C: C^T = B^T A^T, the weight stored [n, k] read transposed, fp32 result.
    assert gemm["swapped"] and gemm["trans_first"] and not gemm["trans_second"], gemm
    assert (gemm["input_dtype"], gemm["output_dtype"]) == (dtype.name, "float32")
    assert gemm["args"][:2] == ["input1", "workspace+0"], gemm
    assert plan["workspace_bytes"] >= 32 << 20
    assert f"// {gemm['name']}: cuBLAS gemm 16 x 128 x 256" in src
    assert f"{gemm['name']}(" not in src  # no kernel for it
    _compile(g, f"cuBLAS step {dtype.name}")
    # explain (with ptxas's report of the kernels) shows the step under its op.
    text = mi.explain(g, arch=90, compile=True, quiet=True)
    assert f"{gemm['name']}: cuBLAS gemm 16 x 128 x 256, {dtype.name} -> float32" in text, text
    # Forced off: the default kernel, with the intermediate back in fp32.
    monkeypatch.setenv("MIRAGE_CUBLAS", "0")
    _, off = _cuda.cuda_source(g, 90)
    assert off["gemms"] == [] and [k["kind"] for k in off["kernels"]] == [
        "rms_norm",
        "matmul",
        "exp",
    ]
    assert off["workspace_bytes"] < 32 << 20
    _compile(g, f"default matmul {dtype.name}")


def test_compile_error_reports_the_nvrtc_log():
    with pytest.raises(RuntimeError, match="NVRTC failed to compile.*error"):
        _core.nvrtc_compile("__global__ void k() { not_declared(); }", 90)


def test_resources_script_reads_saved_graphs(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MIRAGE_CUBLAS", "0")  # the default matmul kernel's resources
    import importlib.util
    import pathlib

    script = pathlib.Path(__file__).parents[1] / "benches" / "gpu" / "resources.py"
    spec = importlib.util.spec_from_file_location("resources_script", script)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    g = _rmsnorm_matmul()
    g.save_json(tmp_path / "g.json")
    assert mod.main([str(tmp_path / "g.json"), "--sass"]) == 0
    rows = [r.split(" | ") for r in capsys.readouterr().out.splitlines() if r.startswith("g.json")]
    names = [k["name"] for k in g.cuda_resources(90)["kernels"]]
    res = [r for r in rows if not r[2].startswith("sass:")]
    sass = [r for r in rows if r[2].startswith("sass:")]
    assert [r[1] for r in res] == names and all(int(r[5]) > 0 for r in res)
    assert [r[1] for r in sass] == names and all("HGMMA 0, HMMA" in r[2] for r in sass)
    assert mod.main([str(tmp_path / "missing.json")]) == 1


def test_unknown_architecture_names_the_option():
    g = mi.new_kernel_graph()
    x = g.new_input((16, 256), dtype=mi.float16)
    g.mark_output(g.rms_norm(x, (256,)))
    for call in (g.compile_cuda, g.cuda_resources):
        with pytest.raises(RuntimeError, match=r"sm_1: .*--gpu-architecture"):
            call(1)


def _cubin_entry(data: bytes) -> bytes:
    """The CUBIN of an on-disk cache entry: a 16-byte magic, the CUBIN's length and SHA-256."""
    assert data[:16] == b"mirage-cubin\0v1\0"
    length = int.from_bytes(data[16:24], "little")
    cubin = data[56:]
    assert len(cubin) == length and hashlib.sha256(cubin).digest() == data[24:56]
    return cubin


def test_cubin_cache_hits_disk(tmp_path, monkeypatch):
    cache = tmp_path / "c2"
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(cache))
    src = "__global__ void mirage_cache_probe_kernel(float* p) { p[threadIdx.x] = 1.0f; }\n"
    first = _core.nvrtc_compile(src + "// probe " + str(tmp_path), 90)
    files = list((cache / "cubin").glob("*.cubin"))
    assert len(files) == 1 and _cubin_entry(files[0].read_bytes()) == first
    # Read back from the disk (not from memory) in a fresh state.
    _core.nvrtc_clear_memory_cache()
    assert _core.nvrtc_compile(src + "// probe " + str(tmp_path), 90) == first


def _flip(data: bytes) -> bytes:
    i = len(data) - 100
    return data[:i] + bytes([data[i] ^ 0x40]) + data[i + 1 :]


@pytest.mark.parametrize(
    "damage",
    [
        lambda e: e[: len(e) // 2],  # truncated
        lambda e: e[:40],  # inside the header
        lambda e: b"",
        _flip,  # a flipped bit in the CUBIN: the digest differs
        lambda e: e + b"\0",  # extended
        lambda e: e[56:],  # a bare CUBIN (an older layout)
    ],
    ids=["truncated", "header cut", "empty", "flipped bit", "extended", "bare cubin"],
)
def test_a_damaged_cubin_entry_is_compiled_again_never_loaded(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path / "c3"))
    src = "__global__ void mirage_damage_probe(float* p) { p[threadIdx.x] = 2.0f; }\n"
    src += "// probe " + str(tmp_path)
    first = _core.nvrtc_compile(src, 90)
    (path,) = (tmp_path / "c3" / "cubin").glob("*.cubin")
    path.write_bytes(damage(path.read_bytes()))
    _core.nvrtc_clear_memory_cache()
    again = _core.nvrtc_compile(src, 90)
    assert again[:4] == b"\x7fELF" and len(again) == len(first)
    assert again == first, "the damaged entry was served"
    assert _cubin_entry(path.read_bytes()) == again, "the entry is rewritten whole"


@pytest.mark.parametrize("name", sorted(SUITE_GRAPHS))
def test_every_suite_graph_compiles(name):
    """The µGraphs the CPU suite checks (test_ugraphs, every kernel op, every block op)."""
    g = SUITE_GRAPHS[name](np.random.default_rng(0))[0]
    _compile(g, name)


@pytest.mark.parametrize("dtype", [mi.float16, mi.bfloat16])
def test_a_fused_projection_of_a_transposed_weight_compiles(dtype):
    # RMSNorm + `x @ W.T` with W stored as nn.Linear stores it (the graph input a transposed
    # view): the search's fused kernel copies the weight tiles down their columns.
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(8, 1024), dtype=dtype)
    w = g.new_input(dims=(1, 1024), dtype=dtype)
    wt = g.new_input(dims=(1024, 512), strides=(1, 1024), dtype=dtype)
    g.mark_output(g.matmul(g.mul(g.rms_norm(x, normalized_shape=(1024,), eps=1e-5), w), wt))
    best = g.superoptimize(backend="cpu", config="mlp", use_cached_graphs=False, time_budget=30)
    assert '"customized"' in best.to_json()
    _compile(best, f"norm + transposed projection {dtype}")
