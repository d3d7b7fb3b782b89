"""Dumps the generated CUDA source of a set of µGraphs, and compares two dumps: the check that a
change of the code generator leaves every generated kernel as it was (or shows which differ).

Graphs come from folders of graph JSON files (``--graphs``, repeatable): the paper suite's saved
winners (``benches/gpu/results/*/all-graphs``) and the graphs the test suite ran, which
``pytest`` writes to ``$MIRAGE_DUMP_GRAPHS`` when that is set. Each graph's source is written as
``<graph hash>_sm<arch>.cu`` for every ``--arch`` (default 80 and 90); a graph the code
generator refuses gets a ``.err`` file with the message instead. No GPU is needed::

    MIRAGE_DUMP_GRAPHS=/tmp/g .venv/bin/python -m pytest -q          # record the suite's graphs
    .venv/bin/python benches/dump_sources.py dump /tmp/before --graphs /tmp/g \\
        --graphs benches/gpu/results/h200-2026-11-29-s50/all-graphs
    # ... change the code generator, rebuild, dump again to /tmp/after ...
    .venv/bin/python benches/dump_sources.py diff /tmp/before /tmp/after

``diff`` lists the files that differ or exist on one side only and exits 1 if any does; with
``--kernels`` it compares only what follows the runtime header in each source (the generated
kernels themselves), for a change of the header that leaves every kernel's own code as it was.
"""

from __future__ import annotations

import argparse
import difflib
import glob
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor


def graph_files(folders: Sequence[str], pattern: str = "*.json") -> list[str]:
    """Every file of the folders matching ``pattern`` (graph JSON files by default), sorted."""
    out: list[str] = []
    for folder in folders:
        out += glob.glob(os.path.join(folder, pattern))
    return sorted(set(out))


def dump_one(path: str, out: str, archs: Sequence[int]) -> tuple[str, int]:
    """Writes one graph's sources; returns (graph hash, files written)."""
    import mirage as mi
    from mirage import _cuda

    with open(path, encoding="utf-8") as f:
        g = mi.from_json(f.read())
    h = g.hash()[:16]
    for arch in archs:
        try:
            text, name = _cuda.cuda_source(g, arch)[0], f"{h}_sm{arch}.cu"
        except (RuntimeError, ValueError) as e:
            text, name = f"{type(e).__name__}: {e}\n", f"{h}_sm{arch}.err"
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.write(text)
    return h, len(archs)


def dump(out: str, folders: Sequence[str], archs: Sequence[int]) -> int:
    """Dumps every graph of ``folders`` into ``out``; returns the number of distinct graphs."""
    os.makedirs(out, exist_ok=True)
    files = graph_files(folders)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        done = list(pool.map(lambda p: dump_one(p, out, archs), files))
    return len({h for h, _ in done})


#: The line that ends the runtime header in a generated source.
KERNELS_MARK = (
    "// ---------------------------------------------------------------- generated kernels"
)


def kernels_part(text: str) -> str:
    """What follows the runtime header in a generated source (all of it when unmarked)."""
    at = text.find(KERNELS_MARK)
    return text if at < 0 else text[at:]


def diff(a: str, b: str, context: int = 3, show: int = 3, kernels: bool = False) -> list[str]:
    """Names of the files that differ between two dumps or exist in one only (with
    ``kernels``, compared after the runtime header); prints the first ``show`` differences as
    unified diffs."""
    names_a, names_b = set(os.listdir(a)), set(os.listdir(b))
    bad = sorted(names_a ^ names_b)
    shown = 0
    for name in sorted(names_a & names_b):
        with open(os.path.join(a, name), encoding="utf-8") as f:
            ta = f.read()
        with open(os.path.join(b, name), encoding="utf-8") as f:
            tb = f.read()
        if kernels:
            ta, tb = kernels_part(ta), kernels_part(tb)
        if ta != tb:
            bad.append(name)
            if shown < show:
                shown += 1
                sys.stdout.writelines(
                    difflib.unified_diff(
                        ta.splitlines(True),
                        tb.splitlines(True),
                        f"a/{name}",
                        f"b/{name}",
                        n=context,
                    )
                )
    return bad


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="write the sources of every graph")
    d.add_argument("out")
    d.add_argument("--graphs", action="append", default=[], help="folder of graph JSON files")
    d.add_argument("--arch", action="append", type=int, default=None, help="sm arch (80, 90)")
    c = sub.add_parser("diff", help="compare two dumps")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--kernels", action="store_true", help="compare after the runtime header")
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        n = dump(args.out, args.graphs, args.arch or [80, 90])
        print(f"dumped {n} graphs into {args.out}")
        return 0
    bad = diff(args.a, args.b, kernels=args.kernels)
    total = len(set(os.listdir(args.a)) | set(os.listdir(args.b)))
    print(f"{len(bad)} of {total} files differ" + (": " + ", ".join(bad[:20]) if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
