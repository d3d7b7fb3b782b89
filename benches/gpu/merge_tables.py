"""One side-by-side table from several ``bench.py --json`` runs (the GPU machine's per-command
limit splits the 27 cells over calls), on any machine: no GPU needed.

    python benches/gpu/merge_tables.py att1.json att816.json mlp.json [mlp2.json]

A later file's cell replaces an earlier one's of the same workload and batch (a re-run after a
change). Each cell keeps its own call's copy and matmul rates for its floor. Prints the
markdown table (batch by batch, workloads in ``bench.WORKLOADS`` order), each call's rates and
the geometric-mean speedup over the merged cells.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench


def merge(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cells of ``runs`` (``bench.py --json`` contents, in order), each carrying its run's
    calibration as ``calibration`` and its run's index as ``run``; later runs replace earlier
    cells of the same (workload, batch). Sorted by batch, then workload order."""
    cells: dict[tuple[str, int], dict[str, Any]] = {}
    for i, run in enumerate(runs):
        for c in run["cells"]:
            cells[(c["workload"], c["batch"])] = {
                **c,
                "calibration": run["meta"]["calibration"],
                "run": i,
            }
    order = {w.name: i for i, w in enumerate(bench.WORKLOADS)}
    return sorted(cells.values(), key=lambda c: (c["batch"], order.get(c["workload"], len(order))))


def render(runs: Sequence[dict[str, Any]], names: Sequence[str]) -> str:
    """The merged markdown table, then one line of rates a run, then the geometric mean."""
    cells = merge(runs)
    rows = [row for c in cells for row in bench.table_rows([c], c["calibration"])]
    lines = [bench.render_markdown_table(rows), ""]
    for i, (name, run) in enumerate(zip(names, runs)):
        cal, meta = run["meta"]["calibration"], run["meta"]
        used = sum(1 for c in cells if c["run"] == i)
        lines.append(
            f"- {name}: {meta['gpu']}, copy {cal['copy_GBps']:.0f} GB/s, fp16 matmul "
            f"{cal['matmul_TFLOPs']:.0f} TFLOP/s, tiny kernel {cal['tiny_kernel_us']:.2f} µs; "
            f"{used} cell(s) in the table; `{meta['command']}`"
        )
    lines += ["", bench.mean_line(cells)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="bench.py --json files, earliest first")
    args = ap.parse_args(argv)
    runs = []
    for path in args.runs:
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
    print(render(runs, [os.path.basename(p) for p in args.runs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
