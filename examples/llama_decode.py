"""Greedy decoding of a Hugging Face LLaMA model (LLaMA-3-8B's config, a few layers, random
weights, a static KV cache) with ``torch.compile(backend="mirage")``, checked against eager and
timed against Inductor.

Each mode decodes the same prompt with its own static cache; the tokens of every mode must equal
eager's. The mode then decodes again fed eager's tokens (teacher forcing) and every step's logits
must agree with eager's within tolerance; the row reports how many next-token choices agree,
how many of the others rounding does not explain (eager's top-two gap beyond the tolerance)
and the first disagreement with its gap, so one flipped near tie need not mean a wrong kernel.
One decode step is then timed in
a CUDA graph (captured around the compiled step, replayed, CUDA events, median), for eager,
Inductor (``max-autotune-no-cudagraphs`` and ``default``, the faster counts) and mirage::

    python examples/llama_decode.py                         # batch 1 and 8, fp16 and bf16
    python examples/llama_decode.py --batch 1 --dtype bf16 --layers 2 --json out.json
    python examples/llama_decode.py --tiny --device cpu     # a small model on the CPU

``--loop-steps 256`` decodes that many further steps with the mirage-compiled step and reports
how many searches they started (the backend's counters; the goal is none after the first step).
After the mirage mode the backend's summary is printed (``mirage.dynamo_summary()``): regions
lowered and left to the fallback, each region's search seconds, and seconds per phase.
``--second-process`` then starts this script again in a new process for each case (mirage mode
only, the same cache folder) and reports its compile-to-first-token seconds and how many of its
regions the on-disk search cache served. Needs ``transformers`` (>= 4.46, for ``StaticCache``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

# LLaMA-3-8B (meta-llama/Meta-Llama-3-8B config.json), the layer count set by --layers.
LLAMA3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 8192,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}
# A small model of the same shape family, for the CPU.
TINY = dict(
    LLAMA3_8B,
    hidden_size=64,
    intermediate_size=176,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=256,
    max_position_embeddings=512,
)

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def build_model(layers: int, dtype: torch.dtype, device: str, tiny: bool) -> Any:
    """A LlamaForCausalLM with random weights (seeded), in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**(TINY if tiny else LLAMA3_8B), num_hidden_layers=layers)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    # Keep activations in range over many layers of random weights.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
    return model.eval()


class Decoder:
    """Greedy decoding with one static cache; ``step`` runs the (possibly compiled) forward of
    one token per sequence at ``cache_position``."""

    def __init__(self, model: Any, batch: int, max_len: int, compile_fn: Callable[[Any], Any]):
        from transformers import StaticCache

        self.model = model
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        dev = next(model.parameters()).device
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)

        def step(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            out = model(ids, past_key_values=self.cache, cache_position=pos, use_cache=True)
            return out.logits[:, -1, :]

        self.step = compile_fn(step)

    @torch.no_grad()
    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        """Runs the prompt through the model eagerly (the same for every mode); last logits."""
        n = prompt.shape[1]
        pos = torch.arange(n, device=prompt.device)
        out = self.model(prompt, past_key_values=self.cache, cache_position=pos, use_cache=True)
        return out.logits[:, -1, :]

    @torch.no_grad()
    def decode(
        self, prompt: torch.Tensor, steps: int, forced: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Greedy tokens (batch, steps), every step's logits (steps, batch, vocab; float32) and
        the seconds until the first decoded token (compilation included). With ``forced``
        (batch, steps) those tokens are fed instead of the greedy ones (teacher forcing), on a
        cache emptied first (``reset`` zeroes it and its write counters in place)."""
        if forced is not None:
            self.cache.reset()
        t0 = time.perf_counter()
        logits = self.prefill(prompt)
        toks, seen = [], []
        first = 0.0
        for i in range(steps):
            tok = logits.argmax(-1, keepdim=True) if forced is None else forced[:, i : i + 1]
            toks.append(tok)
            self.ids.copy_(tok)
            self.pos.fill_(prompt.shape[1] + i)
            logits = self.step(self.ids, self.pos)
            seen.append(logits.float())
            if i == 0:
                if logits.is_cuda:
                    torch.cuda.synchronize()
                first = time.perf_counter() - t0
        return torch.cat(toks, dim=1), torch.stack(seen), first


def compare_logits(logits: torch.Tensor, ref: torch.Tensor, tol: float) -> dict[str, Any]:
    """A mode's teacher-forced logits (steps, batch, vocab) against eager's: the largest
    step's error relative to that step's largest eager logit, how many next-token choices
    agree, how many of those that do not had an eager top-two gap beyond the tolerance (a gap
    within it is a near tie that rounding may flip), and the first that does not, with its
    gap."""
    scale = ref.abs().amax(dim=(1, 2)).clamp_min(1e-30)
    err = ((logits - ref).abs().amax(dim=(1, 2)) / scale).max().item()
    ours, theirs = logits.argmax(-1), ref.argmax(-1)
    agree = ours == theirs
    out: dict[str, Any] = {
        "logits_rel_err": err,
        "logits_ok": err <= tol,
        "next_token_agree": f"{int(agree.sum())}/{agree.numel()}",
    }
    # Eager's top-two gap (relative as the error) at every disagreement: one above the
    # tolerance is a choice that rounding alone does not explain.
    bad = (~agree).nonzero().tolist()
    gaps = []
    for step, seq in bad:
        top2 = ref[step, seq].topk(2).values
        gaps.append(float((top2[0] - top2[1]) / scale[step]))
    out["disagreements_beyond_tolerance"] = sum(g > tol for g in gaps)
    if bad:
        step, seq = bad[0]
        out["first_disagreement"] = {"step": step, "sequence": seq, "eager_top2_gap": gaps[0]}
    return out


def cache_rewinder(cache: Any) -> Callable[[], None]:
    """A function that puts the static cache's write positions back where they are now.
    Recent ``transformers`` static layers count their writes in a device tensor
    (``cumulative_length``) instead of reading ``cache_position``; a replayed step would
    otherwise write past the cache's end."""
    counters = [
        t
        for layer in getattr(cache, "layers", [])
        for t in [getattr(layer, "cumulative_length", None)]
        if isinstance(t, torch.Tensor)
    ]
    saved = [t.clone() for t in counters]

    def rewind() -> None:
        for t, s in zip(counters, saved):
            t.copy_(s)

    return rewind


def time_step(
    dec: Decoder, warmup: int, replays: int, calls: int, kernels: int = 0
) -> tuple[float, list[dict[str, Any]]]:
    """Median µs of one decode step replayed in a CUDA graph of ``calls`` steps (the cache's
    write positions rewound before each replay), and with ``kernels`` > 0 the step's
    ``kernels`` costliest GPU kernels (µs per step and launches per step, from
    torch.profiler over three more replays)."""
    rewind = cache_rewinder(dec.cache)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            dec.step(dec.ids, dec.pos)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    rewind()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        for _ in range(calls):
            dec.step(dec.ids, dec.pos)
    for _ in range(warmup):
        rewind()
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        rewind()
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    top: list[dict[str, Any]] = []
    if kernels > 0:
        try:
            top = kernel_table(graph, rewind, calls, kernels)
        except Exception as e:  # noqa: BLE001 - a listing is optional; the timing stands
            top = [{"kernel": f"(profiler failed: {e})", "us": 0.0, "launches": 0}]
    del graph
    return statistics.median(times), top


def kernel_table(
    graph: torch.cuda.CUDAGraph, rewind: Callable[[], None], calls: int, n: int
) -> list[dict[str, Any]]:
    """The ``n`` kernels of the replayed graph with the most GPU time, per decode step."""
    from torch.profiler import ProfilerActivity, profile

    reps = 3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            rewind()
            graph.replay()
        torch.cuda.synchronize()
    per = reps * calls
    rows = []
    for e in prof.key_averages():
        us = float(
            getattr(e, "self_device_time_total", 0.0) or getattr(e, "self_cuda_time_total", 0.0)
        )
        if us > 0 and e.count >= per:
            rows.append(
                {
                    "kernel": e.key[:90],
                    "us": round(us / per, 2),
                    "launches": round(e.count / per, 2),
                }
            )
    rows.sort(key=lambda r: -r["us"])
    total = round(sum(r["us"] for r in rows), 1)
    return [
        {"kernel": "(all kernels)", "us": total, "launches": sum(r["launches"] for r in rows)}
    ] + rows[:n]


def mirage_searches() -> int:
    """Searches the mirage backend has started in this process."""
    return mirage_counter("searches")


def mirage_counter(name: str) -> int:
    """One of the mirage backend's counters (``mirage.dynamo_stats()``)."""
    import mirage

    return int(mirage.dynamo_stats()[name])


def second_process(args: argparse.Namespace, batch: int, dtype_name: str) -> dict[str, Any]:
    """Decodes the case again in a new process, mirage mode only (no timing): its seconds to
    the first token and its counters, read from its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "row.json")
        argv = [sys.executable, os.path.abspath(__file__), "--batch", str(batch)]
        argv += ["--dtype", dtype_name, "--layers", str(args.layers), "--prompt", str(args.prompt)]
        argv += ["--steps", "1", "--device", args.device, "--modes", "mirage", "--no-timing"]
        argv += ["--json", out] + (["--tiny"] if args.tiny else [])
        for flag, v in (("--time-budget", args.time_budget), ("--total-budget", args.total_budget)):
            if v is not None:
                argv += [flag, str(v)]
        t0 = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            return {"error": done.stderr[-2000:], "wall_s": round(wall, 1)}
        with open(out) as f:
            (row,) = json.load(f)
    m = row["modes"]["mirage"]
    keep = ("first_token_s", "searches_first_steps", "search_disk_hits", "search_seconds")
    return {"wall_s": round(wall, 1), **{k: m[k] for k in keep if k in m}}


def print_mirage_summary() -> dict[str, Any]:
    """Prints the backend's summary (regions lowered and left to the fallback, each region's
    search seconds, seconds per phase) and returns it."""
    import mirage

    summ = mirage.dynamo_summary()
    c, sec = summ["counters"], summ["seconds"]
    print(
        f"  mirage: {c['regions_lowered']} regions lowered, {c['regions_fallback']} left to the "
        f"fallback; {c['searches']} searches, {c['graph_cache_hits']} in-process and "
        f"{c['search_disk_hits']} on-disk cache hits, {c['searches_skipped']} skipped (budget); "
        f"{c['regions_mirage_path']} run their mirage graph, {c['regions_torch_path']} their "
        "torch code (faster)"
    )
    print(
        "  mirage seconds: "
        + ", ".join(f"{k} {v:.2f}" for k, v in sec.items())
        + " (search: superoptimize calls, confirmation included)"
    )
    for r in summ["regions"]:
        for s in r["searches"]:
            parts = []
            if s.get("source") == "search":
                for key, label in (("search_seconds", "search"), ("confirm_seconds", "confirm")):
                    if s.get(key) is not None:
                        parts.append(f"{label} {s[key]:.3f} s")
                prof = s.get("profile_seconds") or {}
                if prof:
                    parts.append(f"profile {sum(prof.values()):.2f} s")
            if "mirage_us" in s:
                parts.append(
                    f"runs {s['path']}: mirage {s['mirage_us']:.1f} us, torch {s['torch_us']:.1f} us"
                )
            elif s.get("path"):
                parts.append(f"runs {s['path']}")
            for key in ("preset_error", "error", "path_error"):
                if s.get(key):
                    parts.append(f"{key.replace('_', ' ')}: {str(s[key])[:200]}")
            print(
                f"    {r['name']:<18} {r['kind']:<12} {'+'.join(r['ops']):<44} "
                f"{s.get('source')!s:<17} {s.get('seconds', 0.0):7.2f} s"
                + (f" ({', '.join(parts)})" if parts else "")
            )
    reasons: dict[str, int] = {}
    for f in summ["fallbacks"]:
        reasons[f["reason"][:90]] = reasons.get(f["reason"][:90], 0) + 1
    for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"    fallback x{n}: {why}")
    return summ


def modes(args: argparse.Namespace) -> dict[str, Callable[[Any], Any]]:
    """Each mode's way to compile the step function."""
    out: dict[str, Callable[[Any], Any]] = {"eager": lambda f: f}
    for m in args.inductor_modes:
        out[f"inductor:{m}"] = lambda f, m=m: torch.compile(f, mode=m, dynamic=False)
    opts: dict[str, Any] = {"verbose": args.verbose}
    if args.time_budget is not None:
        opts["time_budget"] = args.time_budget
    if args.total_budget is not None:
        opts["total_time_budget"] = args.total_budget
    out["mirage"] = lambda f: torch.compile(f, backend="mirage", dynamic=False, options=opts)
    return {k: v for k, v in out.items() if k.split(":")[0] in args.modes}


def run_case(args: argparse.Namespace, batch: int, dtype_name: str) -> dict[str, Any]:
    """Decodes and times one (batch, dtype) case in every mode."""
    dtype = DTYPES[dtype_name]
    model = build_model(args.layers, dtype, args.device, args.tiny)
    torch.manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (batch, args.prompt), device=args.device)
    max_len = args.prompt + args.steps + max(args.loop_steps, 0) + max(args.calls, 3) + 8
    row: dict[str, Any] = {"batch": batch, "dtype": dtype_name, "layers": args.layers, "modes": {}}
    ref_toks: torch.Tensor | None = None
    ref_logits: torch.Tensor | None = None
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-2
    for name, fn in modes(args).items():
        torch._dynamo.reset()
        if name == "mirage":
            # Counters and summary per case (searched graphs stay in the on-disk cache).
            from mirage._dynamo import clear_caches

            clear_caches()
        searches0 = mirage_searches() if name == "mirage" else 0
        dec = Decoder(model, batch, max_len, fn)
        toks, logits, first = dec.decode(prompt, args.steps)
        entry: dict[str, Any] = {"first_token_s": round(first, 3)}
        if ref_toks is None:
            ref_toks, ref_logits = toks, logits
        else:
            assert ref_logits is not None
            entry["same_tokens"] = bool(torch.equal(toks, ref_toks))
            # Logits compared on eager's tokens (a flipped near tie would otherwise make every
            # later step differ).
            _, forced, _ = dec.decode(prompt, args.steps, forced=ref_toks)
            entry.update(compare_logits(forced, ref_logits, tol))
        if name == "mirage":
            entry["searches_first_steps"] = mirage_searches() - searches0
            entry["search_disk_hits"] = mirage_counter("search_disk_hits")
            if args.loop_steps > 0:
                before = mirage_searches()
                with torch.no_grad():
                    for i in range(args.loop_steps):
                        dec.pos.fill_(args.prompt + args.steps + i)
                        dec.step(dec.ids, dec.pos)
                entry["loop_steps"] = args.loop_steps
                entry["searches_in_loop"] = mirage_searches() - before
        if name == "mirage":
            summ = print_mirage_summary()
            entry["search_seconds"] = summ["seconds"]["search"]
            keep = ("source", "path", "preset_error", "error", "path_error")
            keep += ("mirage_us", "torch_us", "seconds")
            entry["regions"] = [
                {"name": r["name"], "kind": r["kind"], "ops": r["ops"]}
                | {k: s[k] for k in keep if s.get(k) is not None}
                for r in summ["regions"]
                for s in r["searches"]
            ]
        if args.device == "cuda" and not args.no_timing:
            us, top = time_step(dec, args.warmup, args.replays, args.calls, args.kernels)
            entry["step_us"] = round(us, 2)
            if top:
                entry["kernels"] = top
        row["modes"][name] = entry
        shown = {k: v for k, v in entry.items() if k not in ("regions", "kernels")}
        print(f"  b={batch} {dtype_name} {name:<34} {shown}", flush=True)
        for k in entry.get("kernels", []):
            print(f"      {k['us']:9.2f} us  x{k['launches']:<6} {k['kernel']}", flush=True)
        del dec
    timed = {k: v["step_us"] for k, v in row["modes"].items() if "step_us" in v}
    inductor = [v for k, v in timed.items() if k.startswith("inductor")]
    if "mirage" in timed and inductor:
        row["best_inductor_us"] = min(inductor)
        row["speedup_vs_inductor"] = round(min(inductor) / timed["mirage"], 3)
        row["speedup_vs_eager"] = round(timed["eager"] / timed["mirage"], 3)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--dtype", nargs="+", default=["fp16", "bf16"], choices=sorted(DTYPES))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--prompt", type=int, default=16, help="prompt length")
    p.add_argument("--steps", type=int, default=32, help="greedy steps compared with eager")
    p.add_argument("--loop-steps", type=int, default=0, help="further steps counted for searches")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="a small model of the same family")
    p.add_argument("--modes", nargs="+", default=["eager", "inductor", "mirage"])
    p.add_argument("--inductor-modes", nargs="*", default=["max-autotune-no-cudagraphs", "default"])
    p.add_argument("--time-budget", type=float, default=None, help="mirage seconds per search")
    p.add_argument("--total-budget", type=float, default=None, help="mirage seconds, all searches")
    p.add_argument("--no-timing", action="store_true")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--calls", type=int, default=10, help="decode steps per CUDA graph")
    p.add_argument("--kernels", type=int, default=0, help="list the N costliest kernels per step")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument(
        "--second-process", action="store_true", help="decode again in a new process (cache reuse)"
    )
    args = p.parse_args(argv)
    rows = []
    ok = True
    for dtype_name in args.dtype:
        for batch in args.batch:
            row = run_case(args, batch, dtype_name)
            if args.second_process and "mirage" in row["modes"]:
                row["second_process"] = second_process(args, batch, dtype_name)
                print(f"  b={batch} {dtype_name} second process: {row['second_process']}")
            rows.append(row)
            for name, e in row["modes"].items():
                if e.get("same_tokens") is False or e.get("logits_ok") is False:
                    print(f"MISMATCH: b={batch} {dtype_name} {name}: {e}", file=sys.stderr)
                    ok = False
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
