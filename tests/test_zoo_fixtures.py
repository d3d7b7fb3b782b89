"""The Python zoo (``benches/gpu/zoo.py``, the fixtures of the GPU checks and of these tests)
builds the graphs of the Rust zoo: every case of ``tests/fixtures/zoo.json`` (written by the
Rust zoo, which ``cargo test -p mirage-ugraph --test zoo_fixtures`` checks it against) gets the
same reference program and µGraph, by graph hash and by JSON."""

from __future__ import annotations

import json
import pathlib

import mirage as mi
import pytest
from conftest import gpu_script

ZOO = gpu_script("zoo")
CASES = json.loads((pathlib.Path(__file__).parent / "fixtures" / "zoo.json").read_text())


def _canonical(g: mi.KNGraph) -> object:
    return json.loads(g.to_json())


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['name']}-{c['dtype']}")
def test_the_python_zoo_builds_the_rust_zoos_graphs(case: dict) -> None:
    ref, ug = ZOO.pair(case["name"], case["dtype"], case["params"])
    for built, want in ((ref, case["reference"]), (ug, case["ugraph"])):
        expected = mi.from_json(json.dumps(want))
        assert built.hash() == expected.hash()
        assert _canonical(built) == _canonical(expected)


def test_every_workload_has_a_case() -> None:
    assert {c["name"] for c in CASES} == set(ZOO.BUILDERS)


def test_bad_names_and_parameter_counts_raise() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        ZOO.pair("nope", "float16", [1])
    with pytest.raises(ValueError, match="parameter count"):
        ZOO.pair("rmsnorm_linear", "float16", [1, 2])
    with pytest.raises(ValueError, match="splits 2 must be 1"):
        ZOO.pair("attention_one_kernel", "float16", [2, 128, 64, 1024, 2, 8])
    with pytest.raises(ValueError, match="dtype"):
        ZOO.pair("ntrans", "float8", [2, 256])
