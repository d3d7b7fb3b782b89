"""Saved winners timed under source variants, alternating, with bench.py's method (GPU machine).

    PYTHONPATH=/tmp/mi python benches/gpu/variants.py DIR [--rounds 3]

DIR holds µGraph JSON files named as ``bench.py --save-graphs`` names them
(``WORKLOAD_B_HASH8.json``; ``WORKLOAD_B.json`` too) and ``DIR/variants/NAME/``, one folder a
variant holding hand-edited sources as ``MIRAGE_LOAD_CODES`` reads them (``<hash16>_sm90.cu``,
the graph's ``hash()[:16]``); a variant without a file for a graph runs the generated source,
and the ``generated`` variant (the current code generator's source) always runs beside them.
``--env NAME:VAR=VALUE[,VAR=VALUE...]`` adds a variant NAME that runs the generated source with
those variables set (codegen settings read when a graph is compiled, e.g.
``eager:MIRAGE_LAZY_MERGE=0``); where ``DIR/variants/NAME/`` exists too, its sources are loaded with
those settings (a hand edit of a form that only those settings generate).
Each round times every graph under every variant in turn (inputs rotated and replayed in a
CUDA graph as bench.py does; correctness against float64 printed beside), and the last lines
are a table: one row a graph, one column a variant, the rounds' medians in µs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench
import mirage as mi

_HASH8 = re.compile(r"_[0-9a-f]{8}$")


def cell_of(path: str) -> tuple[bench.Workload, int]:
    """The workload and batch of a saved graph's file name (``WORKLOAD_B[_HASH8].json``)."""
    stem = _HASH8.sub("", os.path.basename(path).removesuffix(".json"))
    name, _, b = stem.rpartition("_")
    w = next((x for x in bench.WORKLOADS if x.name == name), None)
    if w is None or not b.isdigit():
        known = ", ".join(x.name for x in bench.WORKLOADS)
        raise ValueError(f"{path}: expected WORKLOAD_B[_HASH8].json with WORKLOAD one of {known}")
    return w, int(b)


def input_sets(w: bench.Workload, b: int, seed: int = 0) -> list[list[torch.Tensor]]:
    """bench.py's rotated input sets of a cell (together more than 3x the L2 cache)."""
    dims = w.dims(b)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    n = bench.num_sets(sum(2 * bench.numel(d) for d in dims), l2)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [bench.inputs_for(w.kind, dims, gen) for _ in range(n)]


def graphs_in(folder: str) -> list[str]:
    """The graph files of ``folder``, sorted."""
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".json"))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="graphs and variants/NAME/<hash16>_sm90.cu")
    ap.add_argument("--rounds", type=int, default=3, help="alternations (default 3)")
    ap.add_argument(
        "--env",
        action="append",
        default=[],
        help="NAME:VAR=VALUE[,VAR=VALUE...], a variant of settings",
    )
    args = ap.parse_args(argv)
    vdir = os.path.join(args.dir, "variants")
    variants = sorted(os.listdir(vdir)) if os.path.isdir(vdir) else []
    envs: dict[str, dict[str, str]] = {}
    for spec in args.env:
        name, _, assigns = spec.partition(":")
        for assign in assigns.split(","):
            var, eq, value = assign.partition("=")
            if not name or not var or not eq:
                ap.error(f"--env {spec!r}: expected NAME:VAR=VALUE[,VAR=VALUE...]")
            envs.setdefault(name, {})[var] = value
    variants = ["generated", *variants, *(e for e in envs if e not in variants)]
    saved = {var: os.environ.get(var) for sets in envs.values() for var in sets}
    timing = argparse.Namespace(warmup_replays=5, replays=50)
    cells: list[tuple[str, list[list[torch.Tensor]], list[torch.Tensor]]] = []
    for path in graphs_in(args.dir):
        w, b = cell_of(path)
        sets = input_sets(w, b)
        cells.append((path, sets, [bench.reference(w.kind, xs) for xs in sets[:2]]))
    res: dict[str, dict[str, list[Any]]] = {}
    for r in range(args.rounds):
        for path, sets, refs in cells:
            for v in variants:
                folder = os.path.join(vdir, v)
                for var, old in saved.items():
                    if old is None:
                        os.environ.pop(var, None)
                    else:
                        os.environ[var] = old
                os.environ.update(envs.get(v, {}))
                if os.path.isdir(folder):
                    os.environ["MIRAGE_LOAD_CODES"] = folder
                else:
                    os.environ.pop("MIRAGE_LOAD_CODES", None)
                g = mi.load_json(path)  # a new graph object: compiled again, from this variant

                def ours(*xs: torch.Tensor, g: mi.KNGraph = g) -> torch.Tensor:
                    return g(inputs=list(xs))[0]

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    e = bench.measure("ours", ours, sets, refs, timing)
                cell = os.path.basename(path).removesuffix(".json")
                res.setdefault(cell, {}).setdefault(v, []).append(e.get("us"))
                err = e.get("error") or f"err {e.get('err', float('nan')):.1e}"
                print(
                    f"{cell} {v} round {r}: {e.get('us') or float('nan'):.2f} us, {err}", flush=True
                )
    print()
    width = max(12, *(len(v) for v in variants))
    print("graph".ljust(32), *(v.ljust(width) for v in variants))
    for cell, per in res.items():
        row = ["/".join(f"{x:.2f}" if x else "-" for x in per[v]).ljust(width) for v in variants]
        print(cell.ljust(32), *row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
