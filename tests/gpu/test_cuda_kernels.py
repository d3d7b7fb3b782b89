"""Generated CUDA kernels against the CPU interpreter (same graph, same inputs), and the input
checks of the CUDA path. Needs a CUDA GPU (marked ``gpu``; skipped elsewhere).
"""

from __future__ import annotations

import json
import math

import mirage as mi
import pytest
import torch
from conftest import gpu_script
from mirage import _core, _cuda

pytestmark = pytest.mark.gpu

TOL = {mi.float32: 1e-4, mi.float16: 1e-2, mi.bfloat16: 2e-2}


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


def _inputs(g: mi.KNGraph, seed: int, scale: float = 1.0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in g.inputs:
        x = torch.randn(*t.dims, generator=gen) * scale
        out.append(x.to(t.dtype.to_torch()))
    return out


def check(g: mi.KNGraph, dtype: mi.DType, seed: int = 0, scale: float = 1.0, inputs=None):
    """Runs ``g`` on CUDA (outputs poisoned first) and on the interpreter; compares."""
    cpu = inputs if inputs is not None else _inputs(g, seed, scale)
    gpu = [x.cuda() for x in cpu]
    outs = _cuda.run(g, gpu, poison=True)
    torch.cuda.synchronize()
    refs = g(inputs=cpu)
    assert len(outs) == len(refs)
    for k, (o, r) in enumerate(zip(outs, refs)):
        assert o.shape == r.shape and o.dtype == r.dtype, k
        assert all(a == b for n, a, b in zip(o.shape, o.stride(), r.stride()) if n != 1), k
        assert torch.isfinite(o).all(), f"output {k} has unwritten/NaN elements"
        err = _rel(o, r)
        assert err < TOL[dtype], f"output {k}: relative error {err:.3g}"
    # The public path gives the same values.
    again = g(inputs=gpu)
    for o, a in zip(outs, again):
        assert torch.equal(o, a)
    return outs


@pytest.mark.parametrize("dtype", [mi.float16, mi.bfloat16, mi.float32])
def test_kernel_ops(dtype):
    g = mi.new_kernel_graph()
    x = g.new_input((3, 5, 70), dtype=dtype)
    y = g.new_input((3, 1, 70), strides=(1, 1, 3), dtype=dtype)
    w = g.new_input((70,), dtype=dtype)
    m = g.new_input((3, 70, 90), dtype=dtype)
    a = g.add(x, y)
    e = g.clamp(g.gelu(a), -1.5, 2.0)
    r = g.reduction(g.relu(g.silu(e)), 2)
    n = g.rms_norm(a, (70,), weight=w)
    s = g.softmax(n, dim=1)
    p = g.matmul(g.exp(s), m)
    q = g.div(g.sqrt(g.square(p)), g.add(g.exp(g.clamp(p, -4.0, 4.0)), g.square(p)))
    g.mark_output(r)
    g.mark_output(q, strides=(1, 270, 3))
    g.mark_output(x)
    cpu = _inputs(g, 1)
    # Input 1 has an explicit column-major layout: build it with those strides.
    cpu[1] = torch.randn(70, 1, 3).to(dtype.to_torch()).permute(2, 1, 0)
    assert cpu[1].stride()[::2] == (1, 3)
    # The matmul's inputs are rounded to the dtype on the GPU (its operands) and not by the
    # interpreter: with M centred on zero some of p = exp(s) M sit near 0, where q's relative
    # error grows without bound (2e-2 in bfloat16). Positive-leaning M keeps p in about
    # [0.2, 5], which spans clamp's bound and leaves the check to the ops.
    cpu[3] = (cpu[3].float() / 16 + 0.03).to(dtype.to_torch())
    check(g, dtype, inputs=cpu)


@pytest.mark.parametrize("dtype", [mi.float16, mi.float32])
def test_big_softmax_and_reduction(dtype):
    g = mi.new_kernel_graph()
    x = g.new_input((4, 3000, 5), dtype=dtype)
    g.mark_output(g.softmax(x, dim=1))
    g.mark_output(g.reduction(x, 1))
    g.mark_output(g.rms_norm(x, (3000, 5)))
    check(g, dtype, scale=3.0)


#: The default rms_norm kernel's forms (``default_kernels::norm_form``): dense rows cached in
#: registers (a decode step's row of 4096; rows of 70 with masked lanes; two normalised dims),
#: dense rows streamed twice (15000 a row), rows through the strides (column-major input).
NORM_CASES = [
    ((1, 4096), None, 1, True),
    ((15, 70), None, 1, True),
    ((3, 5, 70), None, 2, True),
    ((4, 15000), None, 1, False),
    ((8, 64), (1, 8), 1, True),
]


@pytest.mark.parametrize("dtype", [mi.float16, mi.bfloat16, mi.float32])
@pytest.mark.parametrize("dims,strides,nd,weighted", NORM_CASES)
def test_rms_norm_forms(dims, strides, nd, weighted, dtype):
    g = mi.new_kernel_graph()
    x = g.new_input(dims, strides=strides, dtype=dtype)
    w = g.new_input(dims[len(dims) - nd :], dtype=dtype) if weighted else None
    g.mark_output(g.rms_norm(x, dims[len(dims) - nd :], weight=w))
    cpu = _inputs(g, 3)
    if strides is not None:
        cpu[0] = torch.randn(*dims[::-1]).to(dtype.to_torch()).t()
        assert cpu[0].stride() == strides
    check(g, dtype, inputs=cpu)


#: The zoo's workloads (``benches/gpu/zoo.py``).
ZOO_SCRIPT = gpu_script("zoo")


def _zoo(name: str, dtype: str, params: list[int]) -> tuple[mi.KNGraph, mi.KNGraph]:
    return ZOO_SCRIPT.pair(name, dtype, params)


ZOO_CASES = [
    ("rmsnorm_linear", [4, 256, 512, 8, 4]),
    ("gated_mlp", [3, 256, 512, 8, 4]),
    # 16 and 32 rows of 128-element X tiles: X swizzled, read through the swizzle by the
    # register matmul and the register row sums; [32, 64] outputs computed in registers.
    ("rmsnorm_linear", [32, 512, 512, 8, 4]),
    ("gated_mlp", [16, 512, 512, 8, 4]),
    ("lora", [5, 256, 512, 16, 8, 4]),
    ("attention", [2, 32, 64, 512, 4, 2]),
    ("qknorm_attention", [2, 32, 64, 512, 4, 2]),
    ("attention_online", [2, 32, 64, 512, 4, 2]),
    # V's tiles normalised in place in the loop (the mma.sync form's padded rows).
    ("qknorm_attention_online", [2, 32, 64, 512, 4, 2]),
    ("ntrans", [4, 512]),
]


@pytest.mark.parametrize("dtype", [mi.float16, mi.bfloat16, mi.float32])
@pytest.mark.parametrize("name,params", ZOO_CASES)
def test_zoo_against_interpreter(name, params, dtype):
    ref, ug = _zoo(name, dtype.name, params)
    cpu = _inputs(ug, 7, scale=0.5)
    check(ug, dtype, inputs=cpu)
    check(ref, dtype, inputs=cpu)


#: Online attention with 64 query rows per warpgroup: on sm_90 the warpgroup (wgmma) form,
#: with 64 keys per iteration over 2 stages (no lookahead across iterations), 128 keys (K in
#: swizzled column blocks) over 4 stages, and 128 rows (two groups per warpgroup) by 256 keys.
#: 16-bit only (the form's types; fp32 tiles of 256 keys do not fit in shared memory).
#: With Q row-normalised before the loop, the norm writes Q swizzled for the tensor cores'
#: descriptors.
WGMMA_ATTENTION = [[2, 64, 64, 512, 4, 2], [2, 64, 64, 2048, 4, 4], [1, 128, 64, 4096, 4, 4]]


@pytest.mark.parametrize("dtype", [mi.float16, mi.bfloat16])
@pytest.mark.parametrize("params", WGMMA_ATTENTION)
@pytest.mark.parametrize(
    "name", ["attention_online", "qnorm_attention_online", "qknorm_attention_online"]
)
def test_warpgroup_attention_against_interpreter(name, params, dtype):
    _, ug = _zoo(name, dtype.name, params)
    check(ug, dtype, inputs=_inputs(ug, 7, scale=0.5))


#: Online attention with one block per head (no key splits across the grid): on sm_90 each
#: block's loop is split across a thread-block cluster (of 4, 4 and 2 blocks: 64 rows by 256
#: keys, 128 rows, 64 rows by 256 keys over 2 iterations each) and merged through distributed
#: shared memory into the cluster's first block.
CLUSTER_ATTENTION = [[2, 64, 64, 2048, 1, 8], [1, 128, 64, 4096, 1, 16], [3, 64, 64, 1024, 1, 4]]


@pytest.mark.parametrize("dtype", [mi.float16, mi.bfloat16])
@pytest.mark.parametrize("params", CLUSTER_ATTENTION)
@pytest.mark.parametrize("name", ["attention_online", "qknorm_attention_online"])
def test_cluster_split_attention_against_interpreter(name, params, dtype):
    _, ug = _zoo(name, dtype.name, params)
    if _cuda.default_arch() >= 90:
        _, summary = _cuda.cuda_source(ug, _cuda.default_arch())
        assert any(k["cluster"] != [1, 1, 1] for k in summary["kernels"]), summary
    check(ug, dtype, inputs=_inputs(ug, 7, scale=0.5))


#: Summing loops on small grids (8 blocks of 16 iterations): on sm_90 split across clusters of
#: 8 blocks, their matmul and norm sums added into each cluster's first block.
CLUSTER_SUMS = [
    ("rmsnorm_linear", [4, 1024, 512, 8, 16]),
    ("gated_mlp", [3, 1024, 512, 8, 16]),
    ("lora", [5, 1024, 512, 16, 8, 16]),
    ("attention", [2, 64, 64, 1024, 1, 8]),
]


@pytest.mark.parametrize("dtype", [mi.float16, mi.bfloat16, mi.float32])
@pytest.mark.parametrize("name,params", CLUSTER_SUMS)
def test_cluster_split_sums_against_interpreter(name, params, dtype):
    _, ug = _zoo(name, dtype.name, params)
    if _cuda.default_arch() >= 90:
        _, summary = _cuda.cuda_source(ug, _cuda.default_arch())
        assert any(k["cluster"] != [1, 1, 1] for k in summary["kernels"]), summary
    cpu = _inputs(ug, 7, scale=0.5)
    check(ug, dtype, inputs=cpu)


#: Loop matmuls of 64 columns a block, 16 or 32 rows, one and two warpgroups, with and
#: without a cluster split (8 blocks on sm_90), K tiles of 64 to 256: `mi::MmaAccWG`, asked
#: for by the block graph (`warpgroup_acc`, the search's warpgroup twin) or by
#: MIRAGE_WGMMA_ACC=1.
WARPGROUP_MATMULS = [
    ("rmsnorm_linear", [32, 1024, 512, 8, 4], 128, "flag"),
    ("rmsnorm_linear", [32, 1024, 512, 8, 4], 256, "env"),
    ("gated_mlp", [16, 1024, 512, 8, 4], 128, "flag"),
    ("gated_mlp", [16, 1024, 512, 8, 16], 256, "env"),
    ("rmsnorm_linear", [32, 2048, 768, 12, 8], 256, "flag"),
]


@pytest.mark.parametrize("dtype", [mi.float16, mi.bfloat16])
@pytest.mark.parametrize("name,params,threads,how", WARPGROUP_MATMULS)
def test_warpgroup_loop_matmuls_against_interpreter(name, params, threads, how, dtype, monkeypatch):
    if how == "env":
        monkeypatch.setenv("MIRAGE_WGMMA_ACC", "1")
    else:
        monkeypatch.delenv("MIRAGE_WGMMA_ACC", raising=False)
    _, ug = _zoo(name, dtype.name, params)
    data = json.loads(ug.to_json())
    for op in data["graph"]["ops"]:
        if op["kind"]["kind"] == "customized":
            op["kind"]["graph"]["block_dim"] = [threads, 1, 1]
            op["kind"]["graph"]["warpgroup_acc"] = how == "flag"
    ug = mi.from_json(json.dumps(data))
    src, _ = _core.cuda_generate(ug._core, _cuda.default_arch())
    assert "mi::MmaAccWG<NT, 1, " in src, src
    check(ug, dtype, inputs=_inputs(ug, 5, scale=0.5))


def _block_graph(dtype: mi.DType, threads: int):
    g = mi.new_kernel_graph()
    X = g.new_input((8, 64), dtype=dtype)
    Y = g.new_input((8, 64), dtype=dtype)
    tb = mi.new_threadblock_graph((2, 2, 1), (threads, 1, 1), 4, 4)
    tx = tb.new_input(X, (0, -1, -1), 1)
    ty = tb.new_input(Y, (-1, 0, -1), -1)
    c = tb.concat(tx, tb.exp(tx), 1)
    r = tb.reduction(c, 0)
    mx, diff = tb.reduction_max(tx, 1)
    rn = tb.rms_norm(tb.sqrt(tb.square(ty)))
    a1 = tb.forloop_accum(r, "sum_todimx")
    a2 = tb.forloop_accum_rescale(tx, tb.exp(diff), "sum")
    a3 = tb.forloop_accum_max(mx)
    a4 = tb.forloop_accum(tb.mul_scalar(tx, 0.5), "rms")
    a5 = tb.forloop_accum(tx, "mean")
    a6 = tb.forloop_accum(tb.sub(tx, mx), None)
    for t in (a1, a2, a3, a4, a5, a6, rn):
        tb.new_output(t, (0, 1, -1), -1)
    tb.new_output(c, (0, 1, -1), 1)
    for o in g.customized([X, Y], tb):
        g.mark_output(o)
    return g


@pytest.mark.parametrize("threads", [128, 100])
@pytest.mark.parametrize("dtype", [mi.float16, mi.float32])
def test_block_ops(dtype, threads):
    check(_block_graph(dtype, threads), dtype)


@pytest.mark.parametrize("length", [8, 64, 128, 256, 512])
@pytest.mark.parametrize("dtype", [mi.float16, mi.bfloat16])
def test_register_row_norms(dtype, length):
    # Loop-free norms kept in registers: short rows summed by lane shuffles, long ones by warps.
    g = mi.new_kernel_graph()
    rows = 4096 // length
    X = g.new_input((4, rows, length), dtype=dtype)
    tb = mi.new_threadblock_graph((4, 2, 1), (128, 1, 1), 1, 4)
    tx = tb.new_input(X, (0, 1, -1), -1)
    tb.new_output(tb.mul(tb.rms_norm(tx), tx), (0, 1, -1), -1)
    for o in g.customized([X], tb):
        g.mark_output(o)
    check(g, dtype, scale=3.0)


@pytest.mark.parametrize("dtype", [mi.float16, mi.bfloat16])
def test_row_kernel_feeding_a_later_kernel(dtype):
    # A register row norm whose output only a second kernel reads (stored with the L2 policy
    # evict_last, its input loaded with evict_first), then that kernel's own norm.
    g = mi.new_kernel_graph()
    X = g.new_input((4, 8, 1024), dtype=dtype)
    Y = g.new_input((4, 8, 1024), dtype=dtype)
    t1 = mi.new_threadblock_graph((4, 8, 1), (128, 1, 1), 1, 4)
    t1.new_output(t1.rms_norm(t1.new_input(X, (0, 1, -1), -1)), (0, 1, -1), -1)
    (xn,) = g.customized([X], t1)
    t2 = mi.new_threadblock_graph((4, 8, 1), (128, 1, 1), 1, 4)
    a, b = t2.new_input(xn, (0, 1, -1), -1), t2.new_input(Y, (0, 1, -1), -1)
    t2.new_output(t2.rms_norm(t2.add(a, b)), (0, 1, -1), -1)
    for o in g.customized([xn, Y], t2):
        g.mark_output(o)
    assert "mi::store8_pol(" in _cuda.cuda_source(g, 90)[0]
    check(g, dtype, scale=3.0)


@pytest.mark.parametrize(("splits", "threads"), [(8, 256), (8, 128), (16, 96), (64, 128)])
@pytest.mark.parametrize("dtype", [mi.float16, mi.float32])
def test_register_loop_combine(dtype, splits, threads):
    # Split-KV attention's combine step, kept in registers across its loop over the slices.
    g = mi.new_kernel_graph()
    O = g.new_input((2, 256, 64 * splits), dtype=dtype)
    L = g.new_input((2, 256, splits), dtype=dtype)
    M = g.new_input((2, 256, splits), dtype=dtype)
    tb = mi.new_threadblock_graph((2, 64, 1), (threads, 1, 1), splits, 4)
    to, tl, tm = (tb.new_input(x, (0, 1, -1), 2) for x in (O, L, M))
    mx, diff = tb.reduction_max(tm, 2)
    e1, e2 = tb.exp(tb.sub(tm, mx)), tb.exp(diff)
    ao = tb.forloop_accum_rescale(tb.mul(to, e1), e2, None)
    al = tb.forloop_accum_rescale(tb.mul(tl, e1), e2, None)
    tb.new_output(tb.div(ao, al), (0, 1, -1), -1)
    tb.new_output(al, (0, 1, -1), -1)  # a per-row tile: stored once per row
    for o in g.customized([O, L, M], tb):
        g.mark_output(o)
    gen = torch.Generator().manual_seed(splits)
    o = torch.randn(2, 256, 64 * splits, generator=gen)
    lse = torch.rand(2, 256, splits, generator=gen) + 0.5
    m = torch.randn(2, 256, splits, generator=gen) * 8
    check(g, dtype, inputs=[x.to(dtype.to_torch()) for x in (o, lse, m)])


@pytest.mark.parametrize("dtype", [mi.float16, mi.bfloat16, mi.float32])
def test_block_matmul_shapes(dtype):
    # Odd tile sizes (tensor-core padding) and batched tiles with a 3-axis grid.
    g = mi.new_kernel_graph()
    A = g.new_input((6, 20, 48), dtype=dtype)
    B = g.new_input((6, 48, 12), dtype=dtype)
    tb = mi.new_threadblock_graph((3, 2, 2), (64, 1, 1), 3, 4)
    ta = tb.new_input(A, (0, 1, -1), 2)
    tbb = tb.new_input(B, (0, -1, 2), 1)
    acc = tb.forloop_accum(tb.matmul(ta, tbb), None)
    tb.new_output(tb.silu(acc), (0, 1, 2), -1)
    tb.new_output(tb.matmul(ta, tbb), (0, 1, 2), 2)
    for o in g.customized([A, B], tb):
        g.mark_output(o)
    check(g, dtype)


def test_online_attention_large_logits():
    # Logits up to about +-30 in fp16: exp overflows fp16 but our internals are fp32.
    ref, ug = _zoo("attention", "float16", [2, 32, 64, 512, 4, 2])
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 32, 64, generator=gen)
    k = torch.randn(2, 64, 512, generator=gen)
    v = torch.randn(2, 512, 64, generator=gen)
    q = q * (30.0 / (q @ k).abs().max())
    cpu = [t.half() for t in (q, k, v)]
    logits = cpu[0].float() @ cpu[1].float()
    expect = torch.softmax(logits.double(), -1) @ cpu[2].double()
    for g in (ug, ref, _zoo("attention_online", "float16", [2, 32, 64, 512, 4, 2])[1]):
        (out,) = _cuda.run(g, [t.cuda() for t in cpu], poison=True)
        assert _rel(out, expect) < 1e-2


def _assert_runs_close(
    g: mi.KNGraph, cpu: list[torch.Tensor], expect: torch.Tensor, tol: float = 1e-2
) -> None:
    """Runs `g` on the GPU copies of `cpu` (outputs poisoned first): a finite result within `tol`
    of `expect`."""
    (out,) = _cuda.run(g, [t.cuda() for t in cpu], poison=True)
    assert torch.isfinite(out).all()
    assert _rel(out, expect) < tol


def _one_kernel_attention(
    dtype: str, dims: list[int], threads: int, name: str = "attention_one_kernel"
) -> mi.KNGraph:
    """softmax(Q K) V in one kernel (the zoo's, the search's MQA form: only O / l leaves the
    loop; with `name` "qknorm_attention_one_kernel" Q and V normalised), its block of
    `threads` threads."""
    _, ug = ZOO_SCRIPT.pair_json(name, dtype, dims)
    doc = json.loads(ug)
    for op in doc.get("graph", doc)["ops"]:
        if op["kind"]["kind"] == "customized":
            op["kind"]["graph"]["block_dim"] = [threads, 1, 1]
    return mi.from_json(json.dumps(doc))


@pytest.mark.parametrize(
    "rows,keys,threads",
    [(64, 128, 128), (64, 64, 128), (32, 128, 128), (128, 64, 256), (128, 128, 256)],
)
def test_online_attention_growing_logits(rows, keys, threads):
    # Logits that grow along the keys, from about 0 to about 40: later key blocks pass the
    # reference max by far more than the rescale threshold, so the loop must rescale mid-way
    # (64 rows: the warpgroup form, which without a saved running max tests for it on the
    # packed P; 32 rows: the mma.sync form; 128 rows of 256 threads: two warpgroups sharing
    # K and V stages, with 64 keys an iteration skewed half a step, with 128 in lockstep).
    # exp(40) overflows fp16: a missed rescale shows. 68 batches: too many blocks for sm_90 to
    # split the loop across clusters, so each block runs all 1024 keys.
    b, m, n = 68, 128, 1024
    g = _one_kernel_attention("float16", [b, m, 64, n, 1, n // keys, m // rows], threads)
    if threads == 256:
        src, _ = _core.cuda_generate(g._core, 90)
        assert "constexpr int NT = 256;" in src and f"mi::FlashWG<NT, 1, 128, 64, {keys}," in src
        # The skew needs the lookahead (three stages or more), which 64-key stages get here.
        assert ("fa.step<true>(" in src) == (keys == 64)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(b, m, 64, generator=gen).abs() + 0.5
    k = torch.rand(b, 64, n, generator=gen) * torch.linspace(0.0, 1.0, n)
    v = torch.randn(b, n, 64, generator=gen)
    logits = q @ k
    q = q * (40.0 / logits.amax(dim=(1, 2), keepdim=True))
    cpu = [t.half() for t in (q, k, v)]
    logits = cpu[0].double() @ cpu[1].double()
    # Every row's last key passes its first block's max by over 10, the rescale threshold
    # (8 ln 2) well over.
    assert float(logits[..., -1].min()) > 15.0 and float(logits[..., :64].max()) < 5.0
    expect = torch.softmax(logits, -1) @ cpu[2].double()
    _assert_runs_close(g, cpu, expect)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("n,growing", [(256, False), (384, False), (640, True), (1024, True)])
def test_warp_specialised_attention(dtype, n, growing):
    # The warp-specialised loop (two consumer warpgroups over 128 rows, a producer warpgroup
    # filling 128-key stages; 128 blocks, one wave) at 2, 3, 5 and 8 iterations: the first,
    # paired and odd tails of `run_ws`, and stages reused across mbarrier phases. Growing
    # logits (about 0 to 40 along the keys) make the loop rescale O while a P V is still
    # accumulating into it; exp(40) overflows fp16, so a missed rescale shows.
    b, m = 128, 128
    g = _one_kernel_attention(dtype, [b, m, 64, n, 1, n // 128, 1], 256)
    src, info = _core.cuda_generate(g._core, 90)
    assert "fa.run_ws<" in src and '"block":[384,1,1]' in info
    tdt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(n)
    q = torch.randn(b, m, 64, generator=gen) * 0.3
    k = torch.randn(b, 64, n, generator=gen)
    v = torch.randn(b, n, 64, generator=gen)
    if growing:
        q = q.abs() + 0.5
        k = torch.rand(b, 64, n, generator=gen) * torch.linspace(0.0, 1.0, n)
        q = q * (40.0 / (q @ k).amax())
    cpu = [t.to(tdt) for t in (q, k, v)]
    logits = cpu[0].double() @ cpu[1].double()
    if growing:
        assert float(logits[..., -1].min()) > 20.0 and float(logits[..., :64].max()) < 5.0
    expect = torch.softmax(logits, -1) @ cpu[2].double()
    _assert_runs_close(g, cpu, expect)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("qknorm", [False, True])
@pytest.mark.parametrize("b,n,cluster", [(64, 256, 1), (64, 640, 1), (32, 1024, 2), (32, 1536, 2)])
def test_interleaved_warp_specialised_attention(
    dtype: str, qknorm: bool, b: int, n: int, cluster: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two warpgroups over the same 64 rows taking 128-key stages in turn (each its own online
    # softmax, merged after the loop), a producer warpgroup filling them: 1 + 1, 3 + 2 stages
    # a block unsplit; 2 + 2, 3 + 3 in each block of a cluster of two (then merged across
    # it). With QK-norm each warpgroup scales P by its stage's V-row factors (V is not
    # rewritten); QK-norm takes three warpgroups by default, so two are asked for.
    monkeypatch.setenv("MIRAGE_WS_WARPGROUPS", "2")
    m = 128
    name = "qknorm_attention_one_kernel" if qknorm else "attention_one_kernel"
    g = _one_kernel_attention(dtype, [b, m, 64, n, 1, n // 128, m // 64], 256, name)
    src, info = _core.cuda_generate(g._core, 90)
    assert "fa.run_ws<" in src and '"block":[384,1,1]' in info
    assert math.prod(json.loads(info)["kernels"][0]["cluster"]) == cluster
    # Interleaved (ILV, the declaration's last flag); with QK-norm the variant scales P by V's
    # row factors (mi::VRowFactors), else V is marked full apart from K (run_ws's SPLITV).
    assert (", true, mi::VRowFactors> fa;" if qknorm else ", true> fa;") in src
    targs = src.split("fa.run_ws<")[1].split(">")[0].split(", ")
    assert targs[1:] == ([] if qknorm else ["true"]), targs
    assert ("fa.finish<2, true, true>(" in src) == (cluster == 2)
    _assert_runs_close(g, *_attention_case(dtype, qknorm, b, m, n, n + b))


def _attention_case(
    dtype: str,
    qknorm: bool,
    b: int,
    m: int,
    n: int,
    seed: int,
    span: tuple[float, float] = (-1, 1),
    qspan: tuple[float, float] | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Inputs (Q, K, V on the CPU in `dtype`) and the float64 result of softmax(Q K) V, with Q
    and V's rows normalised where `qknorm`; V's rows span 10^span[0] to 10^span[1] in scale
    (100x by default), so that a missed or misplaced normalisation shows, and Q's rows
    10^qspan[0] to 10^qspan[1] where given."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, m, 64, generator=gen) * (1.0 if qknorm else 0.3)
    if qspan is not None:
        q = q * torch.logspace(*qspan, m).view(1, m, 1)
    k = torch.randn(b, 64, n, generator=gen) * (0.125 if qknorm else 1.0)
    v = torch.randn(b, n, 64, generator=gen) * torch.logspace(*span, n).view(1, n, 1)
    cpu = [t.to(getattr(torch, dtype)) for t in (q, k, v)]
    qd, kd, vd = (t.double() for t in cpu)
    if qknorm:
        qd = qd * qd.pow(2).mean(-1, keepdim=True).rsqrt()
        vd = vd * vd.pow(2).mean(-1, keepdim=True).rsqrt()
    return cpu, torch.softmax(qd @ kd, -1) @ vd


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("qknorm", [False, True])
@pytest.mark.parametrize(
    "b,n,cluster", [(64, 128, 1), (64, 256, 1), (64, 640, 1), (32, 1024, 2), (32, 1536, 2)]
)
def test_three_warpgroup_interleaved_attention(
    dtype: str, qknorm: bool, b: int, n: int, cluster: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MIRAGE_WS_WARPGROUPS=3: three warpgroups over the same 64 rows take 64-key stages in
    # turn, the loop of 128-key tiles made twice as fine (2 stages: 1 + 1, the third
    # warpgroup idle but for its ping-pong turn-giving and the merge; 4: 2 + 1 + 1; 10:
    # 4 + 3 + 3; in a cluster of two, 8 and 12 a block), merged after the loop.
    monkeypatch.setenv("MIRAGE_WS_WARPGROUPS", "3")
    m = 128
    name = "qknorm_attention_one_kernel" if qknorm else "attention_one_kernel"
    g = _one_kernel_attention(dtype, [b, m, 64, n, 1, n // 128, m // 64], 256, name)
    src, info = _core.cuda_generate(g._core, 90)
    assert "mi::FlashWG<NC, 1, 64, 64, 64," in src and '"block":[512,1,1]' in info
    assert math.prod(json.loads(info)["kernels"][0]["cluster"]) == cluster
    # With QK-norm, Q goes to shared memory as copied and the softmax scales each row's
    # exponent by its factor (the variant's query hook, mi::QRowScales in mi::QkNormAttention).
    assert ("mi::QkNormAttention> fa;" in src) == qknorm and ("mi::rms_norm_rows" in src) is False
    # A cluster pair finishes half the rows in each of its blocks (`finish`'s HALVES).
    assert ("fa.finish<2, true, true>(" in src) == (cluster == 2)
    _assert_runs_close(g, *_attention_case(dtype, qknorm, b, m, n, n + b + 3))
    # The program that ran is the three-warpgroup one.
    assert "constexpr int NC = 384;" in _cuda.executable(g, torch.cuda.current_device()).source


@pytest.mark.parametrize("ws", ["2", "3"])
def test_qknorm_attention_extreme_rows(ws: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # V's rows from 1e-4 to 1e3 in scale through the warp-specialised forms' V factors
    # (`v_factor` in the VRowFactors hooks, P scaled by each key's 1 / rms): squares past fp16's range at the top,
    # subnormal values at the bottom; the factors must stay within fp16 rounding (a tolerance
    # ten times tighter than the other attention tests'). fp16 rows are summed in packed fp16
    # with an exact fp32 redo where a thread's sum leaves [2^-4, 30000): the rows here take
    # both paths, and the fast one's rounding must stay inside that tolerance too. Q's rows
    # span 1e-3 to 1e2: on three warpgroups their factors scale the softmax's exponents
    # (the QRowScales query hook), on two Q is normalised before the loop.
    monkeypatch.setenv("MIRAGE_WS_WARPGROUPS", ws)
    b, m, n = 64, 128, 640
    g = _one_kernel_attention(
        "float16", [b, m, 64, n, 1, n // 128, m // 64], 256, "qknorm_attention_one_kernel"
    )
    src, _ = _core.cuda_generate(g._core, 90)
    assert "fa.run_ws<" in src and ("constexpr int NC = 384;" in src) == (ws == "3")
    assert ("mi::rms_norm_rows_ld<" in src) == (ws == "2")
    cpu, expect = _attention_case("float16", True, b, m, n, 11, span=(-4, 3), qspan=(-3, 2))
    assert float(cpu[2].abs().amax()) > 1000.0 and float(cpu[2][:, 0].abs().amax()) < 1e-3
    _assert_runs_close(g, cpu, expect, tol=1e-3)


def test_input_checks():
    g = mi.new_kernel_graph()
    x = g.new_input((4, 8), dtype=mi.float16)
    y = g.new_input((4, 8), dtype=mi.float16)
    g.mark_output(g.add(x, y))
    a = torch.randn(4, 8, device="cuda").half()
    with pytest.raises(ValueError, match="same CUDA device|on cpu"):
        g(inputs=[a, a.cpu()])
    with pytest.raises(TypeError, match="dtype"):
        g(inputs=[a, a.float()])
    with pytest.raises(ValueError, match="shape"):
        g(inputs=[a, a[:2]])
    with pytest.raises(ValueError, match="strides"):
        g(inputs=[a, torch.randn(8, 4, device="cuda").half().t()])
    with pytest.raises(TypeError):
        g(inputs=[a, 3.0])
    with pytest.raises(ValueError, match="2 inputs"):
        g(inputs=[a])
    mi.set_gpu_device_id(1)
    try:
        with pytest.raises(ValueError, match="set_gpu_device_id"):
            g(inputs=[a, a])
    finally:
        mi.set_gpu_device_id(0)
    (out,) = g(inputs=[a, a])
    assert torch.equal(out, a + a)


def test_side_stream_and_cache():
    g = mi.new_kernel_graph()
    x = g.new_input((64, 64), dtype=mi.float32)
    g.mark_output(g.exp(x))
    a = torch.randn(64, 64, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        (o1,) = g(inputs=[a])
    (o2,) = g(inputs=[a], stream=s)
    s.synchronize()
    torch.testing.assert_close(o1, torch.exp(a))
    torch.testing.assert_close(o2, torch.exp(a))
    assert _cuda.executable(g, 0) is _cuda.executable(g, 0)


def test_save_codes(tmp_path):
    g = mi.new_kernel_graph()
    x = g.new_input((8, 8), dtype=mi.float32)
    g.mark_output(g.relu(x))
    g(inputs=[torch.randn(8, 8, device="cuda")], save_codes=str(tmp_path))
    files = list(tmp_path.glob("*.cu"))
    assert len(files) == 1 and "mi_k1_relu" in files[0].read_text()


def test_load_codes_runs_an_edited_source(tmp_path, monkeypatch):
    # A saved source, edited and put where MIRAGE_LOAD_CODES points, runs in place of the
    # generated one (with a warning); a broken one fails with NVRTC's log.
    x = torch.randn(8, 8, device="cuda")

    def relu_graph():
        g = mi.new_kernel_graph()
        g.mark_output(g.relu(g.new_input((8, 8), dtype=mi.float32)))
        return g

    relu_graph()(inputs=[x], save_codes=str(tmp_path / "saved"))
    (saved,) = (tmp_path / "saved").glob("*.cu")
    src = saved.read_text()
    edited = src.replace("mi::op_relu(r0)", "(mi::op_relu(r0) + 1.0f)")
    assert edited != src
    load = tmp_path / "load"
    load.mkdir()
    (load / saved.name).write_text(edited)
    monkeypatch.setenv("MIRAGE_LOAD_CODES", str(load))
    with pytest.warns(UserWarning, match="MIRAGE_LOAD_CODES"):
        (out,) = relu_graph()(inputs=[x])
    torch.testing.assert_close(out, torch.relu(x) + 1.0)
    (load / saved.name).write_text(src + "\nthis is not CUDA\n")
    with (
        pytest.warns(UserWarning, match="LOAD_CODES"),
        pytest.raises(RuntimeError, match="NVRTC failed"),
    ):
        relu_graph()(inputs=[x])


def test_shared_memory_limit_is_a_clear_error():
    _, ug = _zoo("attention", "float16", [1, 1024, 64, 1024, 4, 1])
    x = [t.cuda() for t in _inputs(ug, 0)]
    with pytest.raises(RuntimeError, match="shared memory"):
        ug(inputs=x)


@pytest.mark.parametrize("in_graph", [False, True])
def test_back_to_back_calls_read_finished_results(in_graph):
    # On sm_90 each kernel is launched as a programmatic dependent of the one before it in the
    # stream: it may be scheduled while that one drains, and must still read its finished
    # writes. A chain x <- rms_norm(x @ w) of 24 calls (two kernels each, through a
    # workspace), with every result poisoned before it is computed, against float64.
    g = mi.new_kernel_graph()
    x = g.new_input((64, 256), dtype=mi.float32)
    w = g.new_input((256, 256), dtype=mi.float32)
    g.mark_output(g.rms_norm(g.matmul(x, w), normalized_shape=(256,)))
    gen = torch.Generator().manual_seed(5)
    x0 = torch.randn(64, 256, generator=gen)
    w0 = torch.randn(256, 256, generator=gen) / 16
    ref = [x0.double()]
    for _ in range(24):
        y = ref[-1] @ w0.double()
        ref.append(y / y.pow(2).mean(-1, keepdim=True).sqrt())
    xs, wd = [x0.cuda()], w0.cuda()
    if in_graph:
        g(inputs=[xs[0], wd])  # compiles and loads outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(24):
                xs.append(g(inputs=[xs[-1], wd])[0])
        for _ in range(2):
            for t in xs[1:]:
                t.fill_(float("nan"))
            graph.replay()
    else:
        for _ in range(24):
            xs.append(g(inputs=[xs[-1], wd])[0])
    torch.cuda.synchronize()
    for i, (o, r) in enumerate(zip(xs, ref)):
        assert torch.isfinite(o).all(), f"call {i}: unwritten elements"
        assert _rel(o, r) < 1e-3, f"call {i}: relative error {_rel(o, r):.3g}"


def test_resources_after_a_run_still_report_every_kernel():
    """The GPU's own NVRTC (13.0 on the H200's image) skips ptxas, and its report, for PTX it
    compiled before in the process: a graph that has run, and a report asked twice, must still
    name every kernel with its registers."""
    _, ug = _zoo("rmsnorm_linear", "float16", [4, 1024, 512, 8, 16])
    check(ug, mi.float16)
    for _ in range(2):
        res = ug.cuda_resources()
        assert "ptxas_log" not in res, res.get("ptxas_log")
        assert all(0 < k["registers"] <= 255 for k in res["kernels"]), res["kernels"]


@pytest.mark.parametrize("dtype", [mi.float16, mi.bfloat16])
@pytest.mark.parametrize("rows", [1, 8])
def test_fused_projection_of_a_transposed_weight_against_interpreter(rows, dtype):
    # RMSNorm + `x @ W.T` with W as nn.Linear stores it: the fused kernel's weight tiles are
    # copied down their columns (16-byte runs of the device dim of stride 1); the same graph on
    # the interpreter, and the inputs passed as the transposed view the graph declares.
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(rows, 2048), dtype=dtype)
    w = g.new_input(dims=(1, 2048), dtype=dtype)
    wt = g.new_input(dims=(2048, 1024), strides=(1, 2048), dtype=dtype)
    g.mark_output(g.matmul(g.mul(g.rms_norm(x, normalized_shape=(2048,), eps=1e-5), w), wt))
    best = g.superoptimize(backend="cpu", config="mlp", use_cached_graphs=False, time_budget=30)
    assert '"customized"' in best.to_json()
    gen = torch.Generator().manual_seed(rows)
    xs = [torch.randn(rows, 2048, generator=gen), torch.randn(1, 2048, generator=gen)]
    weight = torch.randn(1024, 2048, generator=gen) * 0.05
    inputs = [t.to(dtype.to_torch()) for t in xs] + [weight.to(dtype.to_torch()).t()]
    check(best, dtype, inputs=inputs)
