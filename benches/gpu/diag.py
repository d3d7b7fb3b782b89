"""Diagnosis on the GPU machine: for each `workload:b`, superoptimize (verbose: every profiled
candidate's time), print the chosen µGraph and the per-kernel GPU times (torch.profiler), with
inputs rotated as bench.py does. GPU machine only.

    PYTHONPATH=/tmp/mi python benches/gpu/diag.py gqa:8 rmsnorm_linear:1
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench


def show(best) -> None:
    for op in json.loads(best.to_json())["graph"]["ops"]:
        k = op["kind"]
        if k["kind"] == "customized":
            bg = k["graph"]
            ops = [
                o["kind"]["kind"] for o in bg["ops"] if o["kind"]["kind"] not in ("input", "output")
            ]
            dims = [o["kind"]["dims"] for o in bg["ops"] if o["kind"]["kind"] == "input"]
            print(
                f"  grid {bg['grid_dim']} block {bg['block_dim']} frange {bg['forloop_range']} in {dims}"
            )
            print("     ", " ".join(ops))
        elif k["kind"] != "input":
            print("  ", k["kind"])


def main() -> None:
    for arg in sys.argv[1:]:
        name, b = arg.split(":")
        w = next(x for x in bench.WORKLOADS if x.name == name)
        dims = w.dims(int(b))
        g = bench.build_program(w.kind, dims)
        print(f"== {arg}", flush=True)
        best = g.superoptimize(backend="cuda", config=w.config, verbose=True)
        show(best)
        gen = torch.Generator(device="cuda").manual_seed(0)
        sets = [bench.inputs_for(w.kind, dims, gen) for _ in range(8)]
        for xs in sets:
            best(inputs=xs)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                for xs in sets:
                    best(inputs=xs)
            torch.cuda.synchronize()
        tot = defaultdict(lambda: [0.0, 0])
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                tot[e.name][0] += e.device_time
                tot[e.name][1] += 1
        for k, (t, n) in sorted(tot.items(), key=lambda kv: -kv[1][0]):
            print(f"   {t / n:9.2f} us  x{n:3d}  {k[:90]}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
