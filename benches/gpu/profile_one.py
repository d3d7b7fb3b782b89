"""Runs one workload's superoptimized graph a few times (for ncu / compute-sanitizer) and
prints the chosen µGraph and ptxas's registers and spills of its kernels. GPU machine only.

    PYTHONPATH=/tmp/mi ncu -k regex:mi_ python benches/gpu/profile_one.py rmsnorm_linear 1
"""

from __future__ import annotations

import json
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench


def main() -> None:
    name, b = sys.argv[1], int(sys.argv[2])
    w = next(x for x in bench.WORKLOADS if x.name == name)
    dims = w.dims(b)
    g = bench.build_program(w.kind, dims)
    best = g.superoptimize(backend="cuda", config=w.config)
    for op in json.loads(best.to_json())["graph"]["ops"]:
        k = op["kind"]
        if k["kind"] == "customized":
            bg = k["graph"]
            print("grid", bg["grid_dim"], "block", bg["block_dim"], "frange", bg["forloop_range"])
            for t in bg["tensors"]:
                print("   ", t["dims"], t["phase"])
        elif k["kind"] != "input":
            print(k["kind"])
    bench.winner_resources(best)
    xs = bench.inputs_for(w.kind, dims, torch.Generator(device="cuda").manual_seed(0))
    for _ in range(3):
        best(inputs=xs)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
