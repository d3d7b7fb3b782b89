"""Repeated runs of the saved attention winners (BENCHMARKS.md section 5's, the forms racecheck
reports on in section 3): a kernel with a shared-memory race gives outputs that change from run
to run on the same inputs, so each winner runs many times on one input set and every output
must equal the first bit for bit; on fresh input sets it must stay within the tolerance of the
float64 reference. Needs a CUDA GPU (marked ``gpu``)."""

from __future__ import annotations

import glob
import os

import mirage as mi
import pytest
import torch
from conftest import GPU_SCRIPTS, gpu_script
from mirage import _cuda

pytestmark = pytest.mark.gpu

WINNERS = os.path.join(GPU_SCRIPTS, "results", "h200-2026-11-29-s50", "all-graphs")
ATTENTION = ("gqa", "qknorm_gqa", "mha", "mqa")
#: Runs on one input set (each compared bit for bit with the first), and fresh input sets.
REPEATS, FRESH = 300, 4


def _cases() -> list[str]:
    files = sorted(glob.glob(os.path.join(WINNERS, "*.json")))
    return [f for f in files if os.path.basename(f).rsplit("_", 2)[0] in ATTENTION]


@pytest.mark.parametrize("path", _cases(), ids=lambda p: os.path.basename(p)[:-5])
def test_a_winner_gives_the_same_bits_on_every_run(path):
    bench = gpu_script("bench")
    name = os.path.basename(path).rsplit("_", 2)[0]
    kind = next(w.kind for w in bench.WORKLOADS if w.name == name)
    with open(path, encoding="utf-8") as f:
        graph = mi.from_json(f.read())
    dims = [tuple(t.dims) for t in graph.inputs]
    gen = torch.Generator(device="cuda").manual_seed(7)
    xs = bench.inputs_for(kind, dims, gen)
    (first,) = _cuda.run(graph, xs, poison=True)
    for i in range(REPEATS):
        (out,) = _cuda.run(graph, xs, poison=True)
        assert torch.equal(out, first), f"run {i + 1} differs from the first"
    torch.cuda.synchronize()
    for seed in range(FRESH):
        xs = bench.inputs_for(kind, dims, torch.Generator(device="cuda").manual_seed(100 + seed))
        (out,) = _cuda.run(graph, xs, poison=True)
        err = bench.rel_err(out, bench.reference(kind, xs))
        assert err < bench.TOL, (seed, err)
