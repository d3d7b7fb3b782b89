"""Dumps the SASS (machine code) of every kernel of a set of µGraphs, and compares two dumps: the
check that a change of the code generator or of its runtime header leaves the machine code of
every generated kernel as it was, even where the CUDA source changed (a template's spelling, a
hook in place of a flag).

Graphs come from folders of graph JSON files (``--graphs``, repeatable), as for
``benches/dump_sources.py``. Each graph is generated and NVRTC-compiled for every ``--arch``
(default 80 and 90) and its CUBIN read by ``nvdisasm`` (``mirage._cuda.sass``); the dump holds one
``<graph hash>_sm<arch>.sass`` file per graph and arch, each kernel as a ``.kernel <name>`` line
followed by its instructions (opcode with modifiers, operands, predicate; no addresses), or a
``.err`` file with the message of a graph that does not generate or compile. No GPU is needed::

    .venv/bin/python benches/sass_diff.py dump /tmp/sass-before --graphs benches/gpu/graphs
    # ... change the code generator, rebuild, dump again to /tmp/sass-after ...
    .venv/bin/python benches/sass_diff.py diff /tmp/sass-before /tmp/sass-after

``diff`` counts the kernels whose instructions differ (or that exist on one side only), prints the
first differences and exits 1 if any kernel differs. A source that did not change compiles to
the same machine code, so ``--only`` (repeatable graph hash prefixes) may restrict both dumps to
the graphs whose source ``benches/dump_sources.py diff`` reports as changed.
"""

from __future__ import annotations

import argparse
import difflib
import glob
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor


def graph_files(folders: Sequence[str]) -> list[str]:
    """Every ``*.json`` file of the folders, sorted."""
    out: list[str] = []
    for folder in folders:
        out += glob.glob(os.path.join(folder, "*.json"))
    return sorted(set(out))


def dump_one(
    path: str, out: str, archs: Sequence[int], only: Sequence[str] = ()
) -> tuple[str, int]:
    """Writes one graph's SASS for every arch (with ``only``, if its hash starts with one of
    those prefixes); returns (graph hash, kernels written)."""
    import mirage as mi
    from mirage import _cuda

    with open(path, encoding="utf-8") as f:
        g = mi.from_json(f.read())
    h, kernels = g.hash()[:16], 0
    if only and not any(h.startswith(p) for p in only):
        return h, 0
    for arch in archs:
        try:
            lines = []
            for name, k in _cuda.sass(g, arch).items():
                lines.append(f".kernel {name}\n")
                lines += [f"{ins}\n" for ins in k["instructions"]]
                kernels += 1
            text, name = "".join(lines), f"{h}_sm{arch}.sass"
        except (RuntimeError, ValueError) as e:
            text, name = f"{type(e).__name__}: {e}\n", f"{h}_sm{arch}.err"
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.write(text)
    return h, kernels


def dump(
    out: str, folders: Sequence[str], archs: Sequence[int], jobs: int, only: Sequence[str] = ()
) -> tuple[int, int]:
    """Dumps every graph of ``folders`` (with ``only``, those whose hash starts with one of its
    prefixes) into ``out``; returns (graphs dumped, kernels)."""
    os.makedirs(out, exist_ok=True)
    files = graph_files(folders)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        done = list(pool.map(lambda p: dump_one(p, out, archs, only), files))
    return len({h for h, k in done if k}), sum(k for _, k in done)


def kernels_of(path: str) -> dict[str, list[str]]:
    """A dump file's kernels by name (an ``.err`` file is one pseudo-kernel holding its text)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".err"):
        return {"<error>": text.splitlines()}
    out: dict[str, list[str]] = {}
    cur: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(".kernel "):
            cur = out.setdefault(line[len(".kernel ") :], [])
        elif cur is not None:
            cur.append(line)
    return out


def diff(a: str, b: str, show: int = 3) -> tuple[list[str], int]:
    """The kernels (``file:kernel``) whose instructions differ between two dumps or that exist in
    one only, and the number of kernels compared in all; prints the first ``show`` differences."""
    names = sorted(set(os.listdir(a)) | set(os.listdir(b)))
    bad: list[str] = []
    total = shown = 0
    for name in names:
        ka = kernels_of(os.path.join(a, name)) if os.path.exists(os.path.join(a, name)) else {}
        kb = kernels_of(os.path.join(b, name)) if os.path.exists(os.path.join(b, name)) else {}
        for kernel in sorted(set(ka) | set(kb)):
            total += 1
            ia, ib = ka.get(kernel), kb.get(kernel)
            if ia == ib:
                continue
            bad.append(f"{name}:{kernel}")
            if shown < show:
                shown += 1
                sys.stdout.writelines(
                    f"{line}\n"
                    for line in difflib.unified_diff(
                        ia or [], ib or [], f"a/{name}:{kernel}", f"b/{name}:{kernel}", lineterm=""
                    )
                )
    return bad, total


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="write the SASS of every graph's kernels")
    d.add_argument("out")
    d.add_argument("--graphs", action="append", default=[], help="folder of graph JSON files")
    d.add_argument("--arch", action="append", type=int, default=None, help="sm arch (80, 90)")
    d.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel compiles")
    d.add_argument(
        "--only",
        action="append",
        default=[],
        help="graph hash prefix to keep (repeatable; e.g. those whose source differs)",
    )
    c = sub.add_parser("diff", help="compare two dumps")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        n, k = dump(args.out, args.graphs, args.arch or [80, 90], args.jobs, args.only)
        print(f"dumped {k} kernels of {n} graphs into {args.out}")
        return 0
    bad, total = diff(args.a, args.b)
    print(f"{len(bad)} of {total} kernels differ" + (": " + ", ".join(bad[:20]) if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
