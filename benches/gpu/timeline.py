"""Where a streaming kernel's time goes, block by block (GPU machine): a saved winner of one
pipelined-loop kernel (RMSNorm+Linear, gated MLP) runs from a copy of its generated source
with ``%globaltimer`` stamps (32 ns steps), consecutive calls replayed in a CUDA graph as
bench.py replays them.

    PYTHONPATH=/tmp/mi python benches/gpu/timeline.py DIR/rmsnorm_linear_16_67a26b03.json ...

Each block's thread 0 stamps: entry, its dependent-launch wait ended, the loop's first stage
landed, the loop ended (every copy landed), and its end; in a cluster split also its finishes
done, the first phase of the cluster barrier seen, and the merge done (the first block: its
wait for the others' pushes ended; the others: their push done). It writes them over the first
row of its own output columns (the output is wrong, the timing is not). The other blocks'
stamps reach the first block through its receive area: after their pushes and a barrier of
their own where the cluster barrier orders the merge, or as the first floats of a pushed tile
beside st.async pushes (the default; their "pushed" is then the push's start). Either
delays their arrival a little. Printed per call, over the blocks (min / median / max, ns):
each block's entry after the previous call's last block's end (negative: before it), that
end to this call's first wait's end, the first stage's latency, the loop, the cluster merge's
wait, what follows until the end, and for a cluster each phase of the other block's and the
first block's finish.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mirage as mi
import variants

MARK = "// ---------------------------------------------------------------- generated kernels"
HELPERS = """
__device__ __forceinline__ unsigned long long mi_gt() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
"""
#: The stamps a block writes (u64 words over its output row), then its cluster partner's.
OWN = ("enter", "waited", "first", "looped", "merged", "end", "finished", "started")
PARTNER = ("enter", "waited", "first", "looped", "pushed", "finished", "started")
_PARTNER_AT = 8


def _insert_after(text: str, anchor: str, add: str, start: int = 0) -> str:
    at = text.find(anchor, start)
    if at < 0:
        raise ValueError(f"stamp: `{anchor.strip()}` not found: not a streaming-loop kernel")
    at += len(anchor)
    return text[:at] + add + text[at:]


def stamp(source: str) -> tuple[str, int]:
    """The source with the stamps, and the words each block owns in its output row."""
    head, sep, kern = source.partition(MARK)
    if not sep or kern.count("__global__") != 1:
        raise ValueError("stamp: one generated kernel expected")
    cols = re.search(
        r"-> output 0\n    const long long base = \(long long\)blockIdx\.x \* (\d+)LL;", kern
    )
    if cols is None:
        raise ValueError("stamp: the output's columns are not blockIdx.x's")
    words = int(cols.group(1)) * 2 // 8  # 16-bit outputs
    if words < len(OWN):
        raise ValueError(f"stamp: {words} words of output a block, {len(OWN)} needed")
    cluster = "mi::cluster_wait(); // every block" in kern
    # The other blocks' stamps reach the first block through its receive area: stored after
    # their pushes where the cluster barrier orders them, or, beside st.async pushes onto an
    # mbarrier (which orders only their own bytes), written over the first floats of a tile
    # of 14 or more before it is pushed (its first floats then arrive as the stamps).
    pushed_async = "mi::cluster_push_async<" in kern
    carrier = next(
        (
            m
            for m in re.finditer(
                r"  mi::cluster_push_async<NT>\(t(\d+), mi_recv \+ (\d+), \d+, (\d+), mi_merge_bar\);\n",
                kern,
            )
            if int(m.group(3)) >= 2 * len(PARTNER)
        ),
        None,
    )
    partner = (
        cluster
        and (not pushed_async or carrier is not None)
        and words >= _PARTNER_AT + len(PARTNER)
    )
    wait = re.search(r"\n  mi::dep_(?:enter|wait)\(\);[^\n]*\n", kern)
    if wait is None:
        raise ValueError("stamp: no dependent-launch wait")
    kern = (
        kern[: wait.start()]
        + f"\n  unsigned long long mi_ts[{len(OWN)}] = {{0}}, mi_pt[{len(PARTNER)}] = {{0}};"
        + "\n  (void)mi_pt;\n  mi_ts[0] = mi_gt();"
        + wait.group(0)
        + "  mi_ts[1] = mi_gt();\n"
        + kern[wait.end() :]
    )
    loop = kern.find("\n  for (int it = 0;")
    if loop < 0:
        raise ValueError("stamp: no loop")
    kern = _insert_after(
        kern, "\n    __syncthreads();\n", "    if (it == 0) mi_ts[2] = mi_gt();\n", loop
    )
    kern = _insert_after(
        kern, "\n  mi::cp_async_wait<0>();\n  __syncthreads();\n", "  mi_ts[3] = mi_gt();\n", loop
    )
    if cluster:
        sums = kern.find("  { // the cluster's sums", loop)
        if sums < 0:
            raise ValueError("stamp: no cluster merge")
        kern = kern[:sums] + "  mi_ts[6] = mi_gt();\n" + kern[sums:]
        kern = _insert_after(
            kern,
            "mi::cluster_wait(); // every block of the cluster has started\n",
            "  mi_ts[7] = mi_gt();\n",
            sums,
        )
        push = (
            "    return;\n" if pushed_async else "    mi::cluster_arrive_release();\n    return;\n"
        )
        at = kern.find(push, sums)
        if at < 0:
            raise ValueError("stamp: no pushed cluster merge")
        stamps = (
            "p[0] = mi_ts[0]; p[1] = mi_ts[1]; p[2] = mi_ts[2]; p[3] = mi_ts[3];"
            " p[4] = mi_gt(); p[5] = mi_ts[6]; p[6] = mi_ts[7];"
        )
        if partner and carrier is not None:
            # Over the carrying tile before its push (the output is wrong anyway): "pushed" is
            # then the push's start.
            first = kern.rfind("\n", 0, kern.find("mi::cluster_push_async<NT>(", sums)) + 1
            send = (
                "    __syncthreads();\n    if (tid == 0) { // stamps of this block for the first one\n"
                "      unsigned long long* const p = reinterpret_cast<unsigned long long*>("
                f"t{carrier.group(1)});\n      {stamps}\n    }}\n    __syncthreads();\n"
            )
            kern = kern[:first] + send + kern[first:]
            at = kern.find(push, sums)
        elif partner:
            # After every thread's push (a cluster-scope fence and a barrier order them before
            # these stores, which overwrite the first sums: the output is wrong anyway).
            send = (
                '    asm volatile("fence.acq_rel.cluster;" ::: "memory");\n    __syncthreads();\n'
                "    if (tid == 0) { // stamps of this block for the first one\n"
                "      unsigned long long* const p = reinterpret_cast<unsigned long long*>("
                "mi::cluster_map(mi_recv, 0u)) + 8 * (mi::cluster_rank() - 1);\n"
                f"      {stamps}\n    }}\n"
            )
            kern = kern[:at] + send + kern[at:]
        take = "  mi_ts[4] = mi_gt();\n"
        if partner:
            src = f"mi_recv + {carrier.group(2)}" if carrier is not None else "mi_recv"
            take += (
                f"  for (int j = 0; j < {len(PARTNER)}; ++j) mi_pt[j] = "
                f"reinterpret_cast<const unsigned long long*>({src})[j];\n"
            )
        waited = (
            "  mi::mbar_wait(mi_merge_bar, 0);\n"
            if pushed_async
            else "  mi::cluster_arrive_relaxed();\n  mi::cluster_wait();\n"
        )
        kern = _insert_after(kern, waited, take, at)
    else:
        kern = _insert_after(kern, "  mi_ts[3] = mi_gt();\n", "  mi_ts[4] = mi_ts[3];\n")
    end = kern.rstrip().rfind("}")
    write = (
        "  __syncthreads();\n  if (tid == 0) {\n    mi_ts[5] = mi_gt();\n"
        f"    unsigned long long* const o = reinterpret_cast<unsigned long long*>(out0 + "
        f"(long long)blockIdx.x * {cols.group(1)}LL);\n"
        f"    for (int j = 0; j < {len(OWN)}; ++j) o[j] = mi_ts[j];\n"
    )
    if partner:
        write += f"    for (int j = 0; j < {len(PARTNER)}; ++j) o[{_PARTNER_AT} + j] = mi_pt[j];\n"
    write += "  }\n"
    kern = kern[:end] + write + kern[end:]
    return head.replace(
        "}  // namespace mi", "}  // namespace mi\n" + HELPERS, 1
    ) + sep + kern, words


def _q(a: np.ndarray) -> str:
    a = np.sort(a)
    return f"{a[0]:6.0f} {a[len(a) // 2]:6.0f} {a[-1]:6.0f}"


@contextlib.contextmanager
def loaded(path: str, source: str) -> Iterator[mi.KNGraph]:
    """The saved graph at ``path`` loaded anew with ``source`` compiled in place of its generated
    one (``MIRAGE_LOAD_CODES``, set while the block runs: compile and call it there)."""
    g = mi.load_json(path)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, f"{g.hash()[:16]}_sm90.cu"), "w", encoding="utf-8") as f:
            f.write(source)
        os.environ["MIRAGE_LOAD_CODES"] = tmp
        try:
            yield mi.load_json(path)
        finally:
            os.environ.pop("MIRAGE_LOAD_CODES", None)


def timeline(path: str, calls: int = 4) -> None:
    """Prints the last ``calls`` calls' phases of the saved graph at ``path``."""
    w, b = variants.cell_of(path)
    g = mi.load_json(path)
    src, words = stamp(g.cuda_source())
    cluster, partner = "mi_ts[7] = mi_gt();" in src, "stamps of this block for the first" in src
    with loaded(path, src) as g:
        sets = variants.input_sets(w, b)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for xs in sets:
                g(inputs=list(xs))
            torch.cuda.synchronize()
            cg = torch.cuda.CUDAGraph()
            keep: list[torch.Tensor] = []
            with torch.cuda.graph(cg):
                for _ in range(2):
                    keep.extend(g(inputs=list(xs))[0] for xs in sets)
    for _ in range(3):
        cg.replay()
    torch.cuda.synchronize()
    rows = [o[0].contiguous().view(torch.int64).cpu().numpy().reshape(-1, words) for o in keep]
    print(f"== {os.path.basename(path)}: {rows[0].shape[0]} blocks writing stamps, ns")
    for k in range(max(1, len(rows) - calls), len(rows)):
        t, prev_end = rows[k].astype(np.int64), int(rows[k - 1][:, 5].max())
        t0 = int(t[:, 1].min())
        line = (
            f"call {k}: period {int(t[:, 5].max()) - prev_end:6d} | enter {_q(t[:, 0] - prev_end)}"
            f" | prev end -> wait {t0 - prev_end:5d}"
            f" | first {_q(t[:, 2] - t[:, 1])} | loop {_q(t[:, 3] - t[:, 2])}"
            f" | merge wait {_q(t[:, 4] - t[:, 3])} | to end {_q(t[:, 5] - t[:, 4])}"
        )
        if partner:
            p = t[:, _PARTNER_AT : _PARTNER_AT + len(PARTNER)]
            line += (
                f" || partner: loop {_q(p[:, 3] - p[:, 2])} | finish {_q(p[:, 5] - p[:, 3])}"
                f" | started {_q(p[:, 6] - p[:, 5])} | push {_q(p[:, 4] - p[:, 6])}"
                f" | pushed -> merged {_q(t[:, 4] - p[:, 4])}"
            )
        if cluster:
            line += (
                f" || first block: finish {_q(t[:, 6] - t[:, 3])} | started {_q(t[:, 7] - t[:, 6])}"
            )
        print(line, flush=True)
    del cg, keep


def main(
    argv: Sequence[str] | None = None,
    run: Callable[..., None] = timeline,
    doc: str | None = __doc__,
    calls: tuple[int, str] = (4, "calls printed (default 4)"),
    flags: Sequence[tuple[str, str]] = (),
) -> int:
    """The command line of a timeline tool: `run(path, calls, **flags)` for each saved graph
    given (`flags`: switches as (name, help), passed as booleans)."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("graphs", nargs="+", help="saved winners (bench.py --save-graphs)")
    ap.add_argument("--calls", type=int, default=calls[0], help=calls[1])
    for name, text in flags:
        ap.add_argument(f"--{name}", action="store_true", help=text)
    args = ap.parse_args(argv)
    for path in args.graphs:
        run(path, args.calls, **{name: getattr(args, name) for name, _ in flags})
    return 0


if __name__ == "__main__":
    sys.exit(main())
