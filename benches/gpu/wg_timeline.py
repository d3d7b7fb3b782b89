"""Where a warp-specialised attention kernel's steps go, warpgroup by warpgroup (GPU machine): a
saved winner whose loop is ``FlashWG::run_ws`` runs from a copy of its generated source with
``%clock64`` stamps (SM cycles) at each step's phases, the first thread of each consumer
warpgroup stamping.

    PYTHONPATH=/tmp/mi python benches/gpu/wg_timeline.py DIR/qknorm_gqa_8_b9e9833c.json ...

A step of a warpgroup: its softmax (and, with 128-key factors, the V factors beside it); the
wait for its previous P V and the deferred O rescale; the stage's release and the wait for the
next one to be full; the wait for its turn (the ping-pong barrier); the issue of the next S and
this P V (with QK-norm the factor reads and P's scaling); the 64-key V factors of the next stage
after it (otherwise just the turn's hand-over); the wait for the next S; and the gap to the next
step. With ``--fine`` the issue phase is split at the issue of S, at P's scaling (QK-norm) or
the wait for V (a split V) and at the issue of P V. Each stamp (a clock read and a global store by one thread) adds roughly a hundred cycles
to its phase: compare phases and variants, not absolute step times. The stamps go over the
block's own output rows (the output is wrong, the timing is not), a cluster's blocks each
taking an equal part of those rows. Printed per graph: the medians over blocks of the set-up
(entry to the loop), the loop and the rest; the median of each phase per warpgroup and step;
and their mean over the steady steps (all but the first two and the last).
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Sequence

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mirage as mi
import timeline as streaming
import variants
from mirage import _cuda

#: The block-wide stamps at the start of a cluster rank's words: kernel entry, loop start,
#: loop end, kernel end (the first block of a cluster), then the warpgroups, the step capacity
#: and the stamps a step the kernel wrote.
GLOBAL = ("entry", "loop", "looped", "end", "warpgroups", "steps", "stride")
_HEAD = 8

# The stamps of a step in the order they run: each an anchor in `run_ws`'s step lambda, whether
# the stamp goes before it (else after), the phase from it to the next stamp, and whether only
# `--fine` adds it (the issue phase split: factor reads, S issued, P scaled or V waited for, P V
# issued).
_STEPS = (
    (
        "      if constexpr (!FAHEAD) VARIANT::value_factors(*this, Vst + cur * vel, rw + (k & 1) * NK);\n",
        True,
        "softmax",
        False,
    ),
    (
        "      st.template softmax<NF, T, true, VARIANT::q_factors>(sc, p);\n",
        False,
        "wait_pv",
        False,
    ),
    ("      st.rescale_deferred();\n", False, "release_full", False),
    ("      if (PP) bar_sync_id<256>(PP_BAR + wg);\n", True, "turn", False),
    ("      if (PP) bar_sync_id<256>(PP_BAR + wg);\n", False, "issue", False),
    (
        "      if (more) {\n#pragma unroll\n        for (int j = 0; j < NB; ++j) qk(",
        True,
        "issue_s",
        True,
    ),
    ("      VARIANT::template scale_p<T>(p[0], w);\n", True, "scale_wait_v", True),
    ("#pragma unroll\n      for (int j = 0; j < NB; ++j) pv(", True, "issue_pv", True),
    (
        "      if (PP && turn + 1 < turns) bar_arrive_id<256>(PP_BAR + (wg + 1) % NWG);\n",
        True,
        "after_turn",
        False,
    ),
    ("      if (more) {\n        wg_wait<NB>();\n", True, "wait_s", False),
    (
        "      } else {\n        wg_wait<0>();\n        wg_pin(st.o[0]);\n      }\n",
        False,
        "gap",
        False,
    ),
)


def phase_names(fine: bool = False) -> list[str]:
    """A step's phases, each the time from one stamp to the next (the last: to the next step)."""
    return [name for _, _, name, only_fine in _STEPS if fine or not only_fine]


def _helpers(a: int, b: int, words: int, stride: int) -> str:
    """Device helpers: the block's stamp words (`a`, `b`: its output's element offsets per
    blockIdx.x and .y; `words`: 64-bit words a cluster rank owns; `stride`: stamps a step) and
    the two stamps."""
    return f"""
__device__ unsigned long long* stamp_out;
__device__ __forceinline__ unsigned long long* stamp_words() {{
  return stamp_out + ((long long)blockIdx.x * {a}LL + (long long)blockIdx.y * {b}LL) / 4 + cluster_rank() * {words};
}}
__device__ __forceinline__ unsigned long long stamp_clock() {{
  unsigned long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}}
template <int NWG>
__device__ __forceinline__ void stamp_step(int wg, int k, int p) {{
  constexpr int STEPS = ({words} - {_HEAD}) / (NWG * {stride});
  if ((threadIdx.x & 127) == 0 && k < STEPS) {{
    unsigned long long* const w = stamp_words();
    w[{_HEAD} + (wg * STEPS + k) * {stride} + p] = stamp_clock();
    if (wg == 0 && k == 0 && p == 0) {{
      w[4] = NWG;
      w[5] = STEPS;
      w[6] = {stride};
    }}
  }}
}}
"""


def _block_stamp(slot: int) -> str:
    """A block-wide stamp into word `slot` (see `GLOBAL`)."""
    return f"mi::stamp_words()[{slot}] = mi::stamp_clock();"


def _insert(text: str, anchor: str, add: str, before: bool, start: int = 0) -> str:
    """`text` with `add` inserted before or after the first `anchor` from `start`."""
    at = text.find(anchor, start)
    if at < 0:
        raise ValueError(
            f"stamp: `{anchor.strip()}` not found: not a warp-specialised attention kernel"
        )
    at = at if before else at + len(anchor)
    return text[:at] + add + text[at:]


def stamp(source: str, cluster: int, fine: bool = False) -> tuple[str, tuple[int, int, int]]:
    """The source with the step stamps (`cluster`: the blocks of a cluster, along z; `fine`: the
    issue phase split too), and where they are: the output elements a blockIdx.x and a
    blockIdx.y step, the words a block owns."""
    head, sep, kern = source.partition(streaming.MARK)
    if not sep or kern.count("__global__") != 1 or "fa.run_ws<" not in kern:
        raise ValueError("stamp: one generated kernel with a warp-specialised loop expected")
    base = re.search(
        r"-> output 0\n    const long long base = \(long long\)blockIdx\.x \* (\d+)LL \+ "
        r"\(long long\)blockIdx\.y \* (\d+)LL;",
        kern,
    )
    if base is None:
        raise ValueError("stamp: the output's rows are not blockIdx.x's and .y's")
    if kern.count("out0") != kern.count("mi::store_n<8>(out0") + 2:  # the parameter, the check
        raise ValueError("stamp: output 0 is written other than by its vector stores")
    words = int(base.group(2)) * 2 // 8 // cluster  # 16-bit outputs
    steps = [x for x in _STEPS if fine or not x[3]]
    if words < _HEAD + 2 * len(steps) * 4:
        raise ValueError(f"stamp: {words} words of output a block, too few for the stamps")
    wg = head.find("\nstruct FlashWG {")
    if wg < 0:
        raise ValueError("stamp: no FlashWG in the runtime")
    tmpl = head.rfind("\ntemplate <", 0, wg)
    head = (
        head[: tmpl + 1]
        + _helpers(int(base.group(1)), int(base.group(2)), words, len(steps))
        + head[tmpl + 1 :]
    )
    lam = head.find("    auto stage = [&](const int k, const bool more, const bool first")
    if lam < 0:
        raise ValueError("stamp: no step lambda in FlashWG::run_ws")
    for p, (anchor, before, _, _) in enumerate(steps):
        head = _insert(head, anchor, f"      stamp_step<NWG>(wg, k, {p});\n", before, lam)
    kern = _insert(
        kern,
        "  mi::dep_enter();\n",
        f"  if (threadIdx.x == 0) {{ mi::stamp_out = reinterpret_cast<unsigned long long*>(out0); {_block_stamp(0)} }}\n",
        False,
    )
    kern = _insert(
        kern, "  fa.run_ws<", f"  if ((threadIdx.x & 127) == 0) {_block_stamp(1)}\n", True
    )
    kern = _insert(
        kern,
        ";\n",
        f"  if ((threadIdx.x & 127) == 0) {_block_stamp(2)}\n",
        False,
        kern.find("  fa.run_ws<"),
    )
    kern = re.sub(r"\n\s*mi::store_n<8>\(out0[^\n]*", "", kern)
    end = kern.rstrip().rfind("}")
    kern = kern[:end] + f"  if (threadIdx.x == 0) {_block_stamp(3)}\n" + kern[end:]
    return head + sep + kern, (int(base.group(1)), int(base.group(2)), words)


def phases(words: np.ndarray) -> tuple[dict[str, int], dict[tuple[int, int], list[int]]]:
    """One cluster rank's stamp words: its block-wide spans (cycles) and each (warpgroup, step)'s
    phase lengths (absent where a step was not stamped)."""
    t0 = int(words[0])

    def ok(t: int) -> bool:
        return 0 < t - t0 < 1 << 32

    spans = {}
    if ok(words[1]):
        spans["set-up"] = int(words[1]) - t0
        if ok(words[2]):
            spans["loop"] = int(words[2] - words[1])
            if ok(words[3]):
                spans["rest"] = int(words[3] - words[2])
    nwg, steps, n = int(words[4]), int(words[5]), int(words[6])
    out: dict[tuple[int, int], list[int]] = {}
    if not (0 < nwg <= 4 and 0 < steps <= 1024 and 1 < n <= len(_STEPS)):
        return spans, out
    for w in range(nwg):
        for k in range(steps):
            at = _HEAD + (w * steps + k) * n
            s = words[at : at + n]
            if not all(ok(int(t)) for t in s):
                continue
            gaps = [int(s[i + 1] - s[i]) for i in range(n - 1)]
            nxt = words[at + n] if k + 1 < steps else 0
            gaps.append(int(nxt - s[-1]) if k + 1 < steps and ok(int(nxt)) and nxt > s[-1] else 0)
            out[(w, k)] = gaps
    return spans, out


def timeline(path: str, calls: int = 6, fine: bool = False) -> None:
    """Prints the phases of the last of ``calls`` calls of the saved graph at ``path`` (`fine`:
    the issue phase split too)."""
    w, b = variants.cell_of(path)
    g = mi.load_json(path)
    src, info = _cuda.cuda_source(g, 90)
    (kern,) = info["kernels"]
    cluster = int(np.prod(kern.get("cluster") or [1]))
    gx, gy, gz = kern["grid"]
    if gz != cluster:
        raise ValueError(f"{path}: grid z {gz} is not the cluster's {cluster}")
    stamped, (a, bb, words) = stamp(src, cluster, fine)
    with streaming.loaded(path, stamped) as g:
        sets = variants.input_sets(w, b)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in range(calls):
                out = g(inputs=sets[i % len(sets)])[0]
        torch.cuda.synchronize()
    flat = out.contiguous().view(torch.int64).reshape(-1).cpu().numpy()
    spans: dict[str, list[int]] = {}
    steps: dict[tuple[int, int], list[list[int]]] = {}
    for x in range(gx):
        for y in range(gy):
            for z in range(gz):
                at = (x * a + y * bb) // 4 + z * words
                sp, st = phases(flat[at : at + words])
                for key, v in sp.items():
                    spans.setdefault(key, []).append(v)
                for key, v in st.items():
                    steps.setdefault(key, []).append(v)
    print(f"== {os.path.basename(path)} (cycles; medians over blocks)")
    print("  " + ", ".join(f"{k} {int(np.median(v))}" for k, v in spans.items()))
    print("  wg step " + " ".join(f"{p:>12s}" for p in phase_names(fine)) + "       total")
    last = max((k for _, k in steps), default=-1)
    steady = []
    for key in sorted(steps):
        med = np.median(np.array(steps[key]), axis=0)
        print(
            f"  {key[0]:2d} {key[1]:4d} "
            + " ".join(f"{v:12.0f}" for v in med)
            + f" {med.sum():11.0f}"
        )
        if 2 <= key[1] < last:
            steady.append(med)
    if steady:
        m = np.mean(steady, axis=0)
        print("  steady  " + " ".join(f"{v:12.0f}" for v in m) + f" {m.sum():11.0f}")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module's header)."""
    return streaming.main(
        argv,
        timeline,
        __doc__,
        (6, "calls before the stamped one is read"),
        [("fine", "split the issue phase: factor reads, S issued, P scaled or V waited, P V")],
    )


if __name__ == "__main__":
    sys.exit(main())
