"""Programs from real model layers superoptimized on a GPU (``backend="cuda"``): the winner's
CUDA output matches torch, and the CPU's cost-model choice (the fused forms checked in
tests/test_search_real_layers.py) runs on the GPU too. Marked ``gpu`` (skipped elsewhere)."""

from __future__ import annotations

from collections.abc import Callable

import mirage as mi
import pytest
import torch
from conftest import rel_err
from real_layers import (
    gated_mlp_down,
    lora_chain,
    matmul_scale,
    projected_attention,
    rms_weight_linear,
)

pytestmark = pytest.mark.gpu


PROGRAMS: dict[str, Callable[[], mi.KNGraph]] = {
    "rms_weight_bf16": lambda: rms_weight_linear(8, 256, 256, mi.bfloat16),
    "rms_weight_fp16_odd": lambda: rms_weight_linear(7, 400, 300, mi.float16),
    "scale": matmul_scale,
    "lora": lora_chain,
    "mlp": gated_mlp_down,
    "attn": projected_attention,
}


def _inputs(g: mi.KNGraph) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    dt = {mi.float16: torch.float16, mi.bfloat16: torch.bfloat16}
    out = []
    for t in g.inputs:
        x = torch.randn(*t.dims, generator=gen)
        if len(t.dims) == 2:
            x = x / t.dims[0] ** 0.5
        out.append(x.to(dt[t.dtype]))
    return out


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_found_form_runs_on_the_gpu(name, backend, tmp_path):
    g = PROGRAMS[name]()
    best = g.superoptimize(backend=backend, cache_dir=tmp_path, warmup_iters=2, profile_iters=20)
    ins = _inputs(g)
    (ref,) = g(inputs=ins)
    (out,) = best(inputs=[x.cuda() for x in ins])
    assert rel_err(out, ref) < 2e-2, name
