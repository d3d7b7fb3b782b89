"""compute-sanitizer over the winners of the benchmark suite (run on a GPU machine).

For each workload and batch of ``bench.py``'s suite the winner comes from ``--graphs DIR``
(files ``<workload>_<batch>_*.json`` as ``bench.py --save-graphs`` writes them) or, when there is
none, from ``superoptimize`` run here, outside the sanitizer (its on-disk cache makes a second
run quick); it is saved under ``--workdir``. Then each winner runs once per tool in a child
process under ``compute-sanitizer --tool T`` (memcheck, racecheck, synccheck), restricted to
our kernels (names ``mi_k*``), on fresh random inputs with its outputs poisoned; the child
checks the output against a float64 torch reference too. Under racecheck the winner's
predefined matmuls run on our default kernel (``MIRAGE_CUBLAS=0``; ``--racecheck-cublas`` keeps
them on cuBLAS, some of whose kernels stop racecheck with an internal error). The summary table comes last::

    PYTHONPATH=/tmp/mi python benches/gpu/sanitize.py --batches 1,8 --json $OUT/san.json
    python benches/gpu/sanitize.py --graphs benches/gpu/results/<run>/all-graphs --only gqa
    python benches/gpu/sanitize.py --child FILE --kind attention     # what each tool runs

``--models FILE`` (repeatable) takes the model-shaped suite's winners instead, as ``models.py
--save-graphs`` writes them (cell name -> graph); each child then draws the cell's inputs and
float64 reference as ``models.py`` does (``--cells`` picks some by name)::

    python benches/gpu/sanitize.py --models benches/gpu/results/<run>/m1-graphs.json

``--jobs N`` runs N sanitizer processes at once on the one GPU. ``--default-matmul`` adds the
default matmul kernel's own cells (``DEFAULT_MATMUL_CELLS``, tails on every dim): under
racecheck with the predefined matmuls off cuBLAS the winners' big matmuls run on that kernel,
which is then left uninstrumented (racecheck does not finish 8192 x 8192 on it); its cells
check its one form at shapes racecheck does finish.

A tool's line reads ``errors`` (memcheck/synccheck errors, racecheck hazards reported as
errors) and ``warnings`` (racecheck's), from compute-sanitizer's summary lines; ``rel_err`` is
the child's ``||out - ref|| / ||ref||`` (it must be below 1e-2).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TOOLS = ("memcheck", "racecheck", "synccheck")
_SUMMARY = re.compile(r"(ERROR|RACECHECK) SUMMARY: (\d+) (?:errors|hazards displayed)")
_RACE_COUNTS = re.compile(r"\((\d+) errors?, (\d+) warnings?\)")
_FUNC_START = re.compile(r"(?:at|in) (?:void )?(?=mi::|mi_k)")
_KIND = re.compile(r"(?:Potential )?([A-Z]{3}) hazard|Race reported between (\w+) access")


def _functions(text: str) -> list[str]:
    """Names of our device functions in a report (``mi::...`` or a kernel ``mi_k...``), each up
    to its argument list: the first ``(`` outside template brackets."""
    out = []
    for m in _FUNC_START.finditer(text):
        depth, i = 0, m.end()
        while i < len(text) and text[i] != "\n":
            c = text[i]
            depth += (c == "<") - (c == ">")
            if c == "(" and depth == 0:
                out.append(text[m.end() : i].strip())
                break
            i += 1
    return out


def parse_report(text: str) -> dict[str, Any]:
    """Counts of a compute-sanitizer run's output: errors, warnings and the device functions
    its reports name (at most 8, most frequent first); ``errors`` is None without a summary."""
    errors: int | None = None
    warnings = 0
    for line in text.splitlines():
        m = _SUMMARY.search(line)
        if not m:
            continue
        if m.group(1) == "RACECHECK":
            c = _RACE_COUNTS.search(line)
            errors = int(c.group(1)) if c else int(m.group(2))
            warnings = int(c.group(2)) if c else 0
        else:
            errors = int(m.group(2))
    funcs: dict[str, int] = {}
    for f in _functions(text):
        funcs[f] = funcs.get(f, 0) + 1
    top = sorted(funcs, key=lambda k: -funcs[k])[:8]
    kinds: dict[str, int] = {}
    for a, b in _KIND.findall(text):
        kinds[a or b] = kinds.get(a or b, 0) + 1
    return {"errors": errors, "warnings": warnings, "functions": top, "kinds": kinds}


#: A child's ``--kind`` for a model-suite cell: this prefix, then the cell's name.
MODEL_KIND = "model:"

#: A child's ``--kind`` for one predefined matmul on the default kernel (``MIRAGE_CUBLAS=0``).
DEFAULT_MATMUL = "default_matmul"

#: The default matmul's cells: ``(name, a dims, b dims, dtype)``, tails on m, n and k (the
#: kernel has one form for every shape: 64x64 output tiles, k in steps of 32, partial tiles
#: zero-padded), batched and not, fp16 and bf16.
DEFAULT_MATMUL_CELLS = (
    ("default_matmul_f16", (3, 100, 70), (3, 70, 130), "f16"),
    ("default_matmul_bf16", (129, 200), (200, 67), "bf16"),
)

#: Kernel names of the default matmul (``mi_k<i>_matmul``): under racecheck, where the
#: winners' predefined matmuls stand in for cuBLAS on this kernel, it is not instrumented
#: (its own cells above check it, at shapes racecheck finishes).
DEFAULT_MATMUL_KERNELS = "kns=_matmul"


def run_child(path: str, kind: str, seed: int) -> dict[str, Any]:
    """Loads a winner, runs it once on fresh inputs (outputs poisoned), compares with float64:
    a paper-suite workload's inputs and reference (``bench``), or a model-suite cell's
    (``models``) where ``kind`` is ``model:<cell name>``."""
    import bench
    import mirage as mi
    import torch
    from mirage import _cuda

    with open(path, encoding="utf-8") as f:
        graph = mi.from_json(f.read())
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if kind == DEFAULT_MATMUL:
        a_dims, b_dims = (tuple(t.dims) for t in graph.inputs)
        dt = graph.inputs[0].dtype.to_torch()
        xs = [
            (torch.randn(*d, generator=gen, device="cuda") * s).to(dt)
            for d, s in ((a_dims, 1.0), (b_dims, a_dims[-1] ** -0.5))
        ]
        ref, tol = (lambda: xs[0].double() @ xs[1].double()), 2e-2
    elif kind.startswith(MODEL_KIND):
        import models

        cell = models.ms.parse_cell(kind[len(MODEL_KIND) :])
        xs = models.ms.make_inputs(cell, gen, "cuda", weights=weight_layout(graph))
        ref, tol = (lambda: models.reference64(cell, xs)), models.TOL[cell.dtype]
    else:
        dims = [tuple(t.dims) for t in graph.inputs]
        xs = bench.inputs_for(kind, dims, gen)
        ref, tol = (lambda: bench.reference(kind, xs)), bench.TOL
    (out,) = _cuda.run(graph, xs, poison=True)
    torch.cuda.synchronize()
    err = bench.rel_err(out, ref())
    return {"rel_err": err, "ok": err < tol}


def weight_layout(graph: Any) -> str:
    """The model suite's weight layout a loaded winner was searched with: "linear" where a
    graph input is a transposed view (a loaded graph keeps the layouts other than row-major),
    else "rowmajor"."""
    return "linear" if graph._explicit_strides else "rowmajor"


def model_winners(files: Sequence[str], cells: str | None, workdir: str) -> list[tuple[str, str]]:
    """(cell name, graph file) of every winner in the model suite's saved-graph files (cell
    name -> graph JSON), each written to ``workdir`` as a file of its own; ``cells`` (comma-
    separated names) keeps those only, in the files' order. A cell in more than one file takes
    the last file's winner (a later run of some cells, as ``models.py --merge`` reads them)."""
    wanted = set(cells.split(",")) if cells else None
    texts: dict[str, Any] = {}
    for path in files:
        with open(path, encoding="utf-8") as f:
            graphs = json.load(f)
        for name, text in graphs.items():
            if wanted is None or name in wanted:
                texts[name] = text
    out: list[tuple[str, str]] = []
    for name, text in texts.items():
        file = os.path.join(workdir, "model_" + re.sub(r"[^A-Za-z0-9.]+", "_", name) + ".json")
        with open(file, "w", encoding="utf-8") as f:
            f.write(text if isinstance(text, str) else json.dumps(text))
        out.append((name, file))
    return out


def winner_file(
    name: str, b: int, graphs: str | None, workdir: str, args: argparse.Namespace
) -> str:
    """The saved winner of a cell, searching (outside any sanitizer) when none is saved."""
    for folder in filter(None, (graphs, workdir)):
        found = sorted(glob.glob(os.path.join(folder, f"{name}_{b}_*.json")))
        if found:
            return found[0]
    import bench

    w = next(x for x in bench.WORKLOADS if x.name == name)
    g = bench.build_program(w.kind, w.dims(b))
    best = g.superoptimize(backend="cuda", config=w.config, time_budget=args.time_budget)
    winner = (best.search_stats or {}).get("winner") or {}
    path = os.path.join(workdir, f"{name}_{b}_{(winner.get('hash') or best.hash())[:8]}.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(best.to_json())
    return path


def default_matmul_files(workdir: str) -> list[tuple[str, str]]:
    """(name, graph file) of each default-matmul cell: one predefined matmul, written to
    ``workdir``."""
    import mirage as mi

    out = []
    for name, a_dims, b_dims, dt in DEFAULT_MATMUL_CELLS:
        dtype = {"f16": mi.float16, "bf16": mi.bfloat16}[dt]
        g = mi.new_kernel_graph()
        a = g.new_input(a_dims, dtype=dtype)
        b = g.new_input(b_dims, dtype=dtype)
        g.mark_output(g.matmul(a, b))
        path = os.path.join(workdir, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(g.to_json())
        out.append((name, path))
    return out


def child_env(tool: str, racecheck_cublas: bool = False, kind: str = "") -> dict[str, str]:
    """The environment of a sanitizer run of ``tool``: this process's, with the predefined
    matmuls on our default kernel under racecheck unless ``racecheck_cublas``, and always
    for the default-matmul cells."""
    env = dict(os.environ)
    if (tool == "racecheck" and not racecheck_cublas) or kind == DEFAULT_MATMUL:
        env["MIRAGE_CUBLAS"] = "0"
    return env


def sanitizer_command(tool: str, cublas: bool, kind: str) -> list[str]:
    """compute-sanitizer's arguments for ``tool``: our kernels only (``mi_k*``), and under
    racecheck without cuBLAS not the default matmul either, except in its own cells."""
    cmd = ["compute-sanitizer", "--tool", tool, "--kernel-name", "kns=mi_k", "--print-limit", "64"]
    if tool == "racecheck":
        cmd += ["--racecheck-report", "all"]
        if not cublas and kind != DEFAULT_MATMUL:
            cmd += ["--kernel-name-exclude", DEFAULT_MATMUL_KERNELS]
    return cmd


def sanitize(
    path: str,
    kind: str,
    tool: str,
    timeout: float,
    log: str | None = None,
    racecheck_cublas: bool = False,
) -> dict[str, Any]:
    """One compute-sanitizer run of the child on a winner. Under racecheck the winner's
    predefined matmuls run on our default kernel (``MIRAGE_CUBLAS=0``) unless
    ``racecheck_cublas``: on some of cuBLASLt's kernels racecheck stops with an internal
    sanitizer error even when it is told to check only ours."""
    env = child_env(tool, racecheck_cublas, kind)
    cublas = env.get("MIRAGE_CUBLAS") != "0"
    cmd = sanitizer_command(tool, cublas, kind)
    cmd += [sys.executable, os.path.abspath(__file__), "--child", path, "--kind", kind]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
        text = p.stdout + p.stderr
        code: int | str = p.returncode
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        code = "timeout"
    if log:
        os.makedirs(log, exist_ok=True)
        name = f"{os.path.splitext(os.path.basename(path))[0]}_{tool}.log"
        with open(os.path.join(log, name), "w", encoding="utf-8") as f:
            f.write(text[:2_000_000])
    res = parse_report(text)
    res.update(
        {
            "tool": tool,
            "exit": code,
            "seconds": round(time.perf_counter() - t0, 1),
            "cublas": cublas,
        }
    )
    m = re.search(r"CHILD (\{.*\})", text)
    res["child"] = json.loads(m.group(1)) if m else None
    if res["errors"] is None or res["child"] is None:
        res["tail"] = text[-2000:]
    return res


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--kind", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    ap.add_argument("--only", default=None, help="comma-separated workload names")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--graphs", default=None, help="folder of saved winners (bench --save-graphs)")
    ap.add_argument(
        "--models",
        action="append",
        default=[],
        help="the model suite's winners (models.py --save-graphs)",
    )
    ap.add_argument("--cells", default=None, help="with --models: comma-separated cell names")
    ap.add_argument("--workdir", default="/tmp/mirage-sanitize")
    ap.add_argument("--time-budget", type=float, default=None, help="search seconds per cell")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per sanitizer run")
    ap.add_argument("--json", default=None)
    ap.add_argument("--jobs", type=int, default=1, help="sanitizer runs at once (one GPU)")
    ap.add_argument(
        "--default-matmul",
        action="store_true",
        help="add the default matmul kernel's own cells (run on it, racecheck included)",
    )
    ap.add_argument("--log", default=None, help="folder for each run's whole output")
    ap.add_argument(
        "--racecheck-cublas",
        action="store_true",
        help="keep the predefined matmuls on cuBLAS under racecheck too",
    )
    args = ap.parse_args(argv)
    if args.child:
        res = run_child(args.child, args.kind, args.seed)
        print("CHILD " + json.dumps(res), flush=True)
        return 0 if res["ok"] else 1
    if shutil.which("compute-sanitizer") is None:
        print("compute-sanitizer is not on PATH", file=sys.stderr)
        return 2
    import bench

    os.makedirs(args.workdir, exist_ok=True)
    # (workload, batch, child kind, winner file) of every run: the model suite's cells, or
    # the paper suite's workloads at each batch.
    todo: list[tuple[str, int, str, str]] = []
    for name, path in model_winners(args.models, args.cells, args.workdir):
        todo.append((name, 0, MODEL_KIND + name, path))
    if args.graphs or args.only or not (args.models or args.default_matmul):
        names = [w.name for w in bench.WORKLOADS]
        if args.only:
            names = [n for n in names if n in args.only.split(",")]
        kinds = {w.name: w.kind for w in bench.WORKLOADS}
        for b in [int(x) for x in args.batches.split(",")]:
            for name in names:
                todo.append(
                    (name, b, kinds[name], winner_file(name, b, args.graphs, args.workdir, args))
                )
    if args.default_matmul:
        todo += [(n, 0, DEFAULT_MATMUL, p) for n, p in default_matmul_files(args.workdir)]
    runs = [(cell, tool) for cell in todo for tool in args.tools.split(",")]
    runs.sort(key=lambda r: r[1] != "racecheck")  # the slowest first, for a short tail
    rows: list[dict[str, Any] | None] = [None] * len(runs)
    lock = threading.Lock()

    def one(i: int) -> None:
        (name, b, kind, path), tool = runs[i]
        r = sanitize(path, kind, tool, args.timeout, args.log, args.racecheck_cublas)
        r.update({"workload": name, "batch": b, "graph": os.path.basename(path)})
        with lock:
            rows[i] = r
            print(json.dumps(r)[:400], flush=True)
            if args.json:
                with open(args.json, "w", encoding="utf-8") as f:
                    json.dump([x for x in rows if x is not None], f, indent=1)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(one, range(len(runs))))
    return summarize([r for r in rows if r is not None])


def summarize(rows: Sequence[dict[str, Any]]) -> int:
    """Prints the table of the runs; 1 when any has errors, hazards or a failed check."""
    w = max([22] + [len(r["workload"]) + 2 for r in rows])
    print(f"\n{'workload':<{w}}{'b':>3}  {'tool':<10}{'errors':>8}{'warn':>6}  rel_err  functions")
    bad = 0
    for r in rows:
        child = r.get("child") or {}
        err = child.get("rel_err")
        e = r["errors"]
        bad += e is None or e > 0 or r["warnings"] > 0 or not child.get("ok")
        print(
            f"{r['workload']:<{w}}{r['batch'] or '-':>3}  {r['tool']:<10}{e!s:>8}{r['warnings']:>6}  "
            f"{'-' if err is None else f'{err:.1e}':>7}  {', '.join(r['functions'][:3])}"
        )
    print(f"{len(rows)} runs, {bad} with errors, hazards or a failed check")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
