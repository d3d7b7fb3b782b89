"""Correctness of the generated CUDA kernels on the paper's workloads (run on a GPU machine).

For each workload (docs/reference.md's shapes, batch 1/8/16) the hand-written µGraph (and,
at batch 1, the reference program of predefined ops) runs on fresh random inputs with its
outputs and workspace poisoned (NaN) first; the result is compared with a float64 PyTorch
reference by ||out - ref|| / ||ref|| (pass: < 1e-2 for fp16/bf16, < 1e-4 for fp32). GQA also
runs with logits scaled up to +-30. The table comes last.

    PYTHONPATH=/tmp/mi python benches/gpu/check_correctness.py          # full run
    python benches/gpu/check_correctness.py --small                     # one small case per
                                                                        # kernel kind (sanitizers)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import mirage as mi
import torch
from mirage import _cuda

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo as zoo_fixtures

TOL = {"float16": 1e-2, "bfloat16": 1e-2, "float32": 1e-4}
Ref = Callable[[list[torch.Tensor]], torch.Tensor]


def rms(x: torch.Tensor) -> torch.Tensor:
    return x / x.pow(2).mean(-1, keepdim=True).sqrt()


def attn_ref(qknorm: bool) -> Ref:
    def f(xs: list[torch.Tensor]) -> torch.Tensor:
        q, k, v = xs
        if qknorm:
            q, v = rms(q), rms(v)
        return torch.softmax(q @ k, dim=-1) @ v

    return f


REFS: dict[str, Ref] = {
    "attention": attn_ref(False),
    "attention_online": attn_ref(False),
    "qknorm_attention": attn_ref(True),
    "rmsnorm_linear": lambda xs: rms(xs[0]) @ xs[1],
    "gated_mlp": lambda xs: torch.nn.functional.silu(xs[0] @ xs[1]) * (xs[0] @ xs[2]),
    "lora": lambda xs: xs[0] @ xs[1] + (xs[0] @ xs[2]) @ xs[3],
    "ntrans": lambda xs: rms(xs[1] + xs[2] * (rms(xs[0]) + xs[1])),
}


def zoo(name: str, dtype: str, params: list[int]) -> tuple[mi.KNGraph, mi.KNGraph]:
    """``(reference, µGraph)`` of a zoo workload (``zoo.py`` beside this script)."""
    return zoo_fixtures.pair(name, dtype, params)


def inputs_for(
    kind: str,
    dims: list[tuple[int, ...]],
    dt: torch.dtype,
    gen: torch.Generator,
    logits: float | None,
) -> list[torch.Tensor]:
    """Fresh random inputs, scaled so that every output is O(1)."""

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float32) * scale

    if kind in ("attention", "attention_online", "qknorm_attention"):
        (b, h, d), (_, _, s) = dims[0], dims[1]
        q, k, v = rnd(b, h, d, scale=d**-0.5), rnd(b, d, s), rnd(b, s, d)
        if logits is not None:
            q = q * (logits / (q @ k).abs().amax())
        xs = [q, k, v]
    elif kind in ("rmsnorm_linear", "gated_mlp"):
        k_ = dims[0][1]
        xs = [rnd(*dims[0])] + [rnd(*d_, scale=k_**-0.5) for d_ in dims[1:]]
    elif kind == "lora":
        k_, r_ = dims[0][1], dims[2][1]
        xs = [
            rnd(*dims[0]),
            rnd(*dims[1], scale=k_**-0.5),
            rnd(*dims[2], scale=k_**-0.5),
            rnd(*dims[3], scale=r_**-0.5),
        ]
    else:
        xs = [rnd(*d_) for d_ in dims]
    return [x.to(dt) for x in xs]


def run_cell(
    kind: str, g: mi.KNGraph, dtype: str, seed: int, logits: float | None, repeats: int = 2
) -> dict[str, Any]:
    dt = getattr(torch, dtype)
    dims = [tuple(t.dims) for t in g.inputs]
    t0 = time.perf_counter()
    exe = _cuda.executable(g, torch.cuda.current_device())
    compile_s = time.perf_counter() - t0
    plan = json.loads(exe.summary)
    errs = []
    finite = True
    max_logit = None
    for r in range(repeats):
        gen = torch.Generator(device="cuda").manual_seed(seed * 100 + r)
        xs = inputs_for(kind, dims, dt, gen, logits)
        (out,) = _cuda.run(g, xs, poison=True)
        torch.cuda.synchronize()
        finite = finite and bool(torch.isfinite(out).all())
        x64 = [x.double() for x in xs]
        ref = REFS[kind](x64)
        errs.append(float((out.double() - ref).norm() / ref.norm()))
        if kind in ("attention", "attention_online"):
            max_logit = float((x64[0] @ x64[1]).abs().amax())
        if r == 0:
            (again,) = g(inputs=xs)  # the public path agrees with the poisoned run
            torch.cuda.synchronize()
            if not torch.equal(again, out):
                errs.append(float("inf"))
    err = max(errs)
    ok = finite and math.isfinite(err) and err < TOL[dtype]
    return {
        "err": err,
        "ok": ok,
        "finite": finite,
        "compile_s": compile_s,
        "max_logit": max_logit,
        "kernels": len(plan["kernels"]),
        "smem_kb": max(k["smem_bytes"] for k in plan["kernels"]) / 1024,
    }


def cells(batches: list[int], small: bool) -> list[tuple[str, str, int, str, Any, float | None]]:
    """(row name, kind, batch, dtype, graph builder, logits) of every check."""
    out: list[tuple[str, str, int, str, Any, float | None]] = []
    if small:
        specs = [
            ("gqa", "attention", [2, 32, 64, 512, 4, 2]),
            ("gqa_online", "attention_online", [2, 32, 64, 512, 4, 2]),
            ("qknorm", "qknorm_attention", [2, 32, 64, 512, 4, 2]),
            ("rmsnorm_linear", "rmsnorm_linear", [4, 256, 512, 8, 4]),
            ("gated_mlp", "gated_mlp", [3, 256, 512, 8, 4]),
            ("lora", "lora", [5, 256, 512, 16, 8, 4]),
            ("ntrans", "ntrans", [4, 512]),
            # Rows of 4096: the register-resident row kernel (rowreg.rs).
            ("ntrans_4096", "ntrans", [4, 4096]),
        ]
        for name, kind, p in specs:
            for variant in (1, 0):
                out.append(
                    (
                        f"{name}/{'ugraph' if variant else 'ref'}",
                        kind,
                        0,
                        "float16",
                        (lambda k=kind, p=p, v=variant: zoo(k, "float16", p)[v]),
                        None,
                    )
                )
        return out
    for b in batches:
        paper = {
            "gqa": ("attention", [2 * b, 256, 64, 4096, 16, 4, 2]),
            "gqa_online": ("attention_online", [2 * b, 256, 64, 4096, 16, 4, 2]),
            "qknorm_gqa": ("qknorm_attention", [2 * b, 256, 64, 4096, 16, 4, 2]),
            "mha": ("attention", [32 * b, 16, 64, 4096, 16, 4, 1]),
            "mqa": ("attention", [b, 1024, 64, 4096, 16, 4, 8]),
            "rmsnorm_linear": ("rmsnorm_linear", [2 * b, 4096, 4096, 64, 64]),
            "lora": ("lora", [b, 256, 4096, 16, 64, 4]),
            "gated_mlp": ("gated_mlp", [b, 4096, 4096, 64, 32]),
            "ntrans": ("ntrans", [b, 4096]),
        }
        dtypes = ["float16", "bfloat16", "float32"] if b == 1 else ["float16"]
        for dtype in dtypes:
            for name, (kind, p) in paper.items():
                out.append(
                    (name, kind, b, dtype, (lambda k=kind, p=p, d=dtype: zoo(k, d, p)[1]), None)
                )
        for name in ("gqa", "gqa_online"):
            kind, p = paper[name]
            out.append(
                (
                    f"{name} logits30",
                    kind,
                    b,
                    "float16",
                    (lambda k=kind, p=p: zoo(k, "float16", p)[1]),
                    30.0,
                )
            )
        if b == 1:
            for name, (kind, p) in paper.items():
                if name == "gqa_online":
                    continue
                out.append(
                    (
                        f"{name}/ref",
                        kind,
                        b,
                        "float16",
                        (lambda k=kind, p=p: zoo(k, "float16", p)[0]),
                        None,
                    )
                )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,8,16")
    ap.add_argument("--small", action="store_true", help="small shapes, one run (sanitizers)")
    ap.add_argument("--json", default=None, help="write all results to this file")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    info = _cuda.nvrtc_info()
    print(
        f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
        f"NVRTC {info[0]}.{info[1]} ({info[2]})  headers {info[3][0]}",
        flush=True,
    )
    rows = []
    for i, (name, kind, b, dtype, build, logits) in enumerate(
        cells([int(x) for x in args.batches.split(",")], args.small)
    ):
        row: dict[str, Any] = {"name": name, "batch": b, "dtype": dtype}
        try:
            g = build()
            row.update(
                run_cell(kind, g, dtype, seed=i + 1, logits=logits, repeats=1 if args.small else 2)
            )
        except Exception as e:  # noqa: BLE001  (report every cell)
            row.update({"ok": False, "error": f"{type(e).__name__}: {e}"[:300]})
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    print()
    print(
        f"{'workload':<22}{'b':>3} {'dtype':<9}{'kern':>5}{'smem KB':>9}{'rel err':>11}"
        f"{'max|QK|':>9}  result"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<22}{r['batch']:>3} {r['dtype']:<9}  ERROR {r['error'][:90]}")
            continue
        ml = f"{r['max_logit']:.1f}" if r.get("max_logit") is not None else "-"
        print(
            f"{r['name']:<22}{r['batch']:>3} {r['dtype']:<9}{r['kernels']:>5}"
            f"{r['smem_kb']:>9.1f}{r['err']:>11.2e}{ml:>9}  {'PASS' if r['ok'] else 'FAIL'}"
        )
    n_ok = sum(bool(r["ok"]) for r in rows)
    print(f"{n_ok}/{len(rows)} passed")
    return 0 if n_ok == len(rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("MIRAGE_CACHE_DIR", "/tmp/mirage-cache")
    sys.exit(main())
