"""ptxas's registers and spills of saved µGraphs' kernels, on any machine with NVRTC (no GPU):
the winners ``bench.py --save-graphs DIR`` wrote on the GPU machine, read back here.

    python benches/gpu/resources.py DIR/*.json            # sm_90 (as on the H100 / H200)
    python benches/gpu/resources.py --arch 80 g.json      # another architecture
    python benches/gpu/resources.py --sass DIR/*.json     # + SASS counts (needs nvdisasm)

One line a kernel: file, kernel, threads, cluster, dynamic shared memory, registers at entry,
spill bytes stored / loaded, stack frame; ptxas's warnings after the file's kernels. The
numbers are this machine's NVRTC's (``mi._cuda.nvrtc_info()``), which may differ from the
GPU machine's. With ``--sass``, a second line a kernel counts its SASS instructions: all of
them, then the opcodes in ``SASS_OPS`` (wgmma, mma.sync, special functions, local memory).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import mirage as mi
from mirage import _cuda

#: Opcodes ``--sass`` counts: tensor-core products (HGMMA: wgmma; HMMA: mma.sync), the special
#: function unit (exponentials), local memory (spills), 16-byte async copies.
SASS_OPS = ("HGMMA", "HMMA", "MUFU", "LDL", "STL", "LDGSTS")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("graphs", nargs="+", help="µGraph JSON files (KNGraph.save_json)")
    ap.add_argument("--arch", type=int, default=90, help="target sm_XX (default 90)")
    ap.add_argument("--sass", action="store_true", help="also count SASS opcodes (nvdisasm)")
    args = ap.parse_args(argv)
    major, minor, _, _ = _cuda.nvrtc_info()
    print(f"NVRTC {major}.{minor}, sm_{args.arch}")
    header = "file kernel threads cluster smem_B regs spill_st_B spill_ld_B stack_B"
    print(" | ".join(header.split()))
    status = 0
    for path in args.graphs:
        name = os.path.basename(path)
        try:
            g = mi.load_json(path)
            res = g.cuda_resources(args.arch)
            code = g.cuda_sass(args.arch) if args.sass else {}
        except (OSError, ValueError, RuntimeError) as e:
            print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
            status = 1
            continue
        for k in res["kernels"]:
            cluster = "x".join(str(c) for c in k["cluster"])
            print(
                f"{name} | {k['name']} | {k['block'][0]} | {cluster} | {k['smem_bytes']} | "
                f"{k.get('registers')} | {k.get('spill_store_bytes')} | "
                f"{k.get('spill_load_bytes')} | {k.get('stack_frame_bytes')}"
            )
            if k["name"] in code:
                ops = code[k["name"]]["opcodes"]
                counts = ", ".join(f"{o} {ops.get(o, 0)}" for o in SASS_OPS)
                total = len(code[k["name"]]["instructions"])
                print(f"{name} | {k['name']} | sass: {total} instructions, {counts}")
        for w in res["warnings"]:
            print(f"{name} | warning: {w}")
    return status


if __name__ == "__main__":
    sys.exit(main())
