"""Model-shaped programs of the GPU benchmark (``models.py``): published transformer configs,
the programs of one decoder layer at those shapes, the grid of cells and its default selection.

Each program has a mirage kernel-graph builder (the user program that ``superoptimize``
starts from) and a torch function of the same computation (the eager contender, the body of
the ``torch.compile`` contender, and, on float64 inputs, the reference of the correctness
check). Everything here runs without a GPU: ``build_program(cell, scale=s)`` divides the
sizes by ``s`` so that the CPU interpreter runs a cell in milliseconds.

Conventions (the same as the paper suite, ``bench.py``):

* Matmul weights are stored (in, out), row-major: ``y = x @ W``.
* Attention is ``softmax(Q K) V`` with keys stored transposed, (.., d, S), and no softmax scale:
  the ``1/sqrt(d)`` scale is folded into Q's values by the input generator. Grouped-query
  attention folds each KV head's group of query heads into the query rows: Q is
  (batch * kv_heads, group * tokens, d), K (batch * kv_heads, d, S), V (batch * kv_heads, S, d).
  Without a mask this is exactly GQA. Prefill-shaped attention is full (non-causal)
  attention over the prompt: the kernel graph has no mask.
* RMSNorm is ``x / sqrt(mean(x^2) + eps) * w``; ``eps`` is the model's where ``rms_norm``
  takes an ``eps`` keyword (``eps_supported()``), else 0 in the graph and in every torch
  function alike. The weight is applied as ``mul(rms_norm(x), w)`` by default, since the
  search does not fuse ``rms_norm(x, weight=w)`` yet (``NORM_WEIGHT_FORMS``).
* QK-norm follows the paper suite's program: RMSNorm (with weights over the head dim) of Q's
  and of V's rows, since keys are stored transposed and ``rms_norm`` normalises trailing
  dims. None of the configs below uses QK-norm; the cells measure its shape at each model's
  head dim and group size.
* Left out of the programs: RoPE, Qwen2.5's q/k/v biases, Gemma-2's attention logit
  soft-capping, its ``1 + w`` norm weights (a weight is a weight here) and its tanh form of
  GELU (the programs use the exact erf form, ``gelu`` in both the graph and torch).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import mirage as mi
import torch
import torch.nn.functional as F

Dims = tuple[int, ...]


# ------------------------------------------------------------------ configs
@dataclass(frozen=True)
class ModelConfig:
    """The layer shapes of one published model (its Hugging Face ``config.json``). The last
    five fields are used only by ``parameter_count`` (a check of the shapes against the
    model's published size)."""

    name: str
    source: str  # the Hugging Face repository whose config.json gives these numbers
    hidden: int  # hidden_size
    intermediate: int  # intermediate_size
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    head_dim: int  # head_dim (hidden_size / num_attention_heads where the config has none)
    eps: float  # rms_norm_eps
    act: str  # the gated MLP's activation: "silu" (SwiGLU) or "gelu" (GeGLU)
    layers: int  # num_hidden_layers
    vocab: int  # vocab_size
    tied: bool  # tie_word_embeddings
    qkv_bias: bool  # q/k/v projections with bias (Qwen2)
    norms: int  # RMSNorms a layer (2; Gemma-2 4: before and after attention and MLP)

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads // self.kv_heads

    @property
    def q_dim(self) -> int:
        """Width of the query projection's output (and the output projection's input)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (or value) projection's output."""
        return self.kv_heads * self.head_dim

    @property
    def qkv_dim(self) -> int:
        """Width of the fused QKV projection's output."""
        return self.q_dim + 2 * self.kv_dim

    def parameter_count(self) -> int:
        """Parameters of the whole model these shapes imply: per layer the QKV and output
        projections (with Qwen2's biases), the gated MLP's three matrices and the norms; the
        embedding (and an untied output head) and the final norm."""
        attn = self.hidden * self.qkv_dim + self.q_dim * self.hidden
        attn += self.qkv_dim if self.qkv_bias else 0
        layer = attn + 3 * self.hidden * self.intermediate + self.norms * self.hidden
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * layer + embed + self.hidden

    def scaled(self, scale: int) -> ModelConfig:
        """The same model with hidden, intermediate and head sizes divided by ``scale``
        (at least 1 each); head counts, and so the GQA group, are kept."""
        if scale == 1:
            return self
        return replace(
            self,
            hidden=max(1, self.hidden // scale),
            intermediate=max(1, self.intermediate // scale),
            head_dim=max(1, self.head_dim // scale),
        )


def _model(name: str, source: str, *shape: int, eps: float, **more: object) -> ModelConfig:
    hidden, intermediate, heads, kv_heads, head_dim, layers, vocab = shape
    rest = {"act": "silu", "tied": False, "qkv_bias": False, "norms": 2, **more}
    return ModelConfig(
        name, source, hidden, intermediate, heads, kv_heads, head_dim, eps,
        layers=layers, vocab=vocab, **rest,  # type: ignore[arg-type]
    )  # fmt: skip


#: The configs: hidden, intermediate, heads, KV heads, head dim, layers, vocab, then eps.
MODELS: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        # meta-llama/Meta-Llama-3-8B config.json
        _model("llama3-8b", "meta-llama/Meta-Llama-3-8B",
               4096, 14336, 32, 8, 128, 32, 128256, eps=1e-5),
        # meta-llama/Meta-Llama-3-70B config.json
        _model("llama3-70b", "meta-llama/Meta-Llama-3-70B",
               8192, 28672, 64, 8, 128, 80, 128256, eps=1e-5),
        # Qwen/Qwen2.5-7B config.json (hidden 3584 = 28 heads x 128; q/k/v biases)
        _model("qwen2.5-7b", "Qwen/Qwen2.5-7B",
               3584, 18944, 28, 4, 128, 28, 152064, eps=1e-6, qkv_bias=True),
        # Qwen/Qwen2.5-32B config.json
        _model("qwen2.5-32b", "Qwen/Qwen2.5-32B",
               5120, 27648, 40, 8, 128, 64, 152064, eps=1e-5, qkv_bias=True),
        # mistralai/Mistral-7B-v0.1 config.json
        _model("mistral-7b", "mistralai/Mistral-7B-v0.1",
               4096, 14336, 32, 8, 128, 32, 32000, eps=1e-5),
        # google/gemma-2-9b config.json: head_dim 256 (16 heads x 256 = 4096, not hidden
        # 3584), hidden_activation gelu_pytorch_tanh, tied embeddings, four norms a layer
        _model("gemma2-9b", "google/gemma-2-9b",
               3584, 14336, 16, 8, 256, 42, 256000, eps=1e-6, act="gelu", tied=True, norms=4),
        # microsoft/Phi-3-mini-4k-instruct config.json (head dim 3072 / 32 = 96; no GQA)
        _model("phi3-mini", "microsoft/Phi-3-mini-4k-instruct",
               3072, 8192, 32, 32, 96, 32, 32064, eps=1e-5),
        # meta-llama/Llama-3.2-1B config.json (head_dim 64: the only head dim 64 here)
        _model("llama3.2-1b", "meta-llama/Llama-3.2-1B",
               2048, 8192, 32, 8, 64, 16, 128256, eps=1e-5, tied=True),
    )
}  # fmt: skip


# ----------------------------------------------------------------- programs
@dataclass(frozen=True)
class Program:
    """One program kind: what its cell parameter is and which search preset it uses."""

    name: str
    doc: str
    param: str | None  # "kv" (KV length), "tokens" (prompt length), "rank" (LoRA rank)
    config: str | None  # superoptimize config preset
    attention: bool = False


PROGRAMS: dict[str, Program] = {
    p.name: p
    for p in (
        Program("qkv", "input RMSNorm (weighted) + fused QKV projection", None, "mlp"),
        Program("attn_decode", "GQA decode attention over a KV cache", "kv", "attention", True),
        Program(
            "attn_prefill", "full (non-causal) attention over a prompt", "tokens", "attention", True
        ),
        Program("oproj", "attention output projection", None, "mlp"),
        # The search finds no one-customized-kernel form of the weighted norm + gate/up (the
        # "mlp" preset ends in SearchError); its defaults find two customized kernels.
        Program("gate_up", "post-attention RMSNorm (weighted) + gate/up, gated", None, None),
        Program("down", "MLP down projection", None, "mlp"),
        # The "mlp" preset (one customized kernel, the down projection a predefined matmul)
        # searched in half the time of the defaults on the build machine.
        Program("mlp", "the whole gated MLP: (act(x Wg) * (x Wu)) Wd", None, "mlp"),
        Program(
            "qknorm",
            "QK-norm decode attention (weighted norms of Q and V)",
            "kv",
            "attention",
            True,
        ),
        Program("lora", "query projection with a LoRA adapter: x W + (x A) B", "rank", "lora"),
    )
}

BATCHES = (1, 8, 16, 64)
DTYPES = ("float16", "bfloat16")
KV_LENS = (1000, 1024, 2048, 4096, 4097, 8192, 16384, 32000, 32768)
TOKENS = (512, 1000, 1024, 2048, 4096)
RANKS = (8, 16, 32, 64, 128)
PARAM_VALUES: dict[str, tuple[int, ...]] = {"kv": KV_LENS, "tokens": TOKENS, "rank": RANKS}
DTYPE_SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


@dataclass(frozen=True)
class Cell:
    """One benchmark cell: a program of a model at a batch, dtype and (where the program has
    one) parameter value."""

    model: str
    program: str
    batch: int
    dtype: str
    param: int | None = None

    @property
    def name(self) -> str:
        """``model/program/b<batch>[/<param><value>]/<dtype>``, e.g.
        ``llama3-8b/attn_decode/b8/kv4097/fp16``."""
        parts = [self.model, self.program, f"b{self.batch}"]
        p = PROGRAMS[self.program].param
        if p is not None:
            parts.append(f"{p}{self.param}")
        parts.append(DTYPE_SHORT[self.dtype])
        return "/".join(parts)

    @property
    def config(self) -> ModelConfig:
        return MODELS[self.model]


def check_cell(cell: Cell) -> Cell:
    """``cell`` when its names and values are known, else ValueError naming what is wrong."""
    if cell.model not in MODELS:
        raise ValueError(f"cell {cell}: unknown model {cell.model!r}; known: {sorted(MODELS)}")
    if cell.program not in PROGRAMS:
        raise ValueError(
            f"cell {cell}: unknown program {cell.program!r}; known: {sorted(PROGRAMS)}"
        )
    if cell.dtype not in DTYPES and cell.dtype != "float32":
        raise ValueError(f"cell {cell}: unknown dtype {cell.dtype!r}; known: {DTYPES}")
    if cell.batch < 1:
        raise ValueError(f"cell {cell}: batch must be >= 1")
    p = PROGRAMS[cell.program].param
    if (p is None) != (cell.param is None) or (cell.param is not None and cell.param < 1):
        want = "no parameter" if p is None else f"a positive {p} value"
        raise ValueError(f"cell {cell}: program {cell.program} takes {want}")
    return cell


def parse_cell(name: str) -> Cell:
    """The cell named ``name`` (the inverse of ``Cell.name``)."""
    parts = name.strip().split("/")
    short = {v: k for k, v in DTYPE_SHORT.items()}
    if len(parts) not in (4, 5) or not parts[2].startswith("b") or parts[-1] not in short:
        raise ValueError(f"cell name {name!r} is not model/program/b<batch>[/<param>]/<dtype>")
    model, program = parts[0], parts[1]
    param = None
    if len(parts) == 5:
        kind = PROGRAMS[program].param if program in PROGRAMS else None
        if kind is None or not parts[3].startswith(kind):
            raise ValueError(f"cell name {name!r}: program {program!r} takes no {parts[3]!r}")
        param = int(parts[3][len(kind) :])
    return check_cell(Cell(model, program, int(parts[2][1:]), short[parts[-1]], param))


def full_grid() -> Iterator[Cell]:
    """Every cell: each model x program x batch x dtype x parameter value."""
    for m in MODELS:
        for p, prog in PROGRAMS.items():
            values: Sequence[int | None] = (
                PARAM_VALUES[prog.param] if prog.param is not None else (None,)
            )
            for b in BATCHES:
                for dt in DTYPES:
                    for v in values:
                        yield Cell(m, p, b, dt, v)


def _c(model: str, program: str, batch: int, dtype: str, param: int | None = None) -> Cell:
    return check_cell(
        Cell(model, program, batch, {"fp16": "float16", "bf16": "bfloat16"}[dtype], param)
    )


#: The default selection: every program kind, every model, head dims 64/96/128/256, GQA
#: groups 1/2/4/5/7/8, non-powers of two (hidden 3584/5120/3072, intermediate 18944/27648,
#: KV lengths 1000/4097/32000), both dtypes, batches 1/8/64.
DEFAULT: tuple[Cell, ...] = (
    _c("llama3-8b", "qkv", 1, "fp16"),
    _c("llama3-8b", "attn_decode", 8, "fp16", 4097),
    _c("llama3-8b", "attn_prefill", 1, "bf16", 2048),
    _c("llama3-8b", "mlp", 1, "fp16"),
    _c("llama3-70b", "gate_up", 8, "bf16"),
    _c("llama3-70b", "down", 1, "fp16"),
    _c("llama3-70b", "attn_decode", 1, "bf16", 32000),
    _c("llama3-70b", "oproj", 64, "fp16"),
    _c("qwen2.5-7b", "qkv", 64, "bf16"),
    _c("qwen2.5-7b", "attn_decode", 64, "fp16", 1000),
    _c("qwen2.5-7b", "gate_up", 1, "fp16"),
    _c("qwen2.5-7b", "lora", 8, "fp16", 16),
    _c("qwen2.5-32b", "attn_decode", 8, "bf16", 8192),
    _c("qwen2.5-32b", "down", 8, "bf16"),
    _c("qwen2.5-32b", "qknorm", 1, "fp16", 4096),
    _c("mistral-7b", "lora", 1, "bf16", 64),
    _c("mistral-7b", "attn_prefill", 1, "fp16", 4096),
    _c("mistral-7b", "oproj", 8, "fp16"),
    _c("gemma2-9b", "attn_decode", 8, "fp16", 4096),
    _c("gemma2-9b", "attn_prefill", 1, "bf16", 1024),
    _c("gemma2-9b", "qkv", 1, "bf16"),
    _c("phi3-mini", "attn_decode", 1, "fp16", 16384),
    _c("phi3-mini", "mlp", 8, "bf16"),
    _c("phi3-mini", "qknorm", 8, "bf16", 1024),
    _c("llama3.2-1b", "attn_decode", 64, "fp16", 2048),
    _c("llama3.2-1b", "attn_prefill", 1, "fp16", 512),
)


def select(
    cells: Iterable[Cell],
    models: Sequence[str] | None = None,
    programs: Sequence[str] | None = None,
    batches: Sequence[int] | None = None,
    dtypes: Sequence[str] | None = None,
    limit: int | None = None,
) -> list[Cell]:
    """The cells that pass every given filter (``None``: no filter), in order, at most
    ``limit`` of them. Unknown names raise ValueError."""
    for given, known, what in (
        (models, MODELS, "model"),
        (programs, PROGRAMS, "program"),
        (dtypes, DTYPES, "dtype"),
    ):
        bad = sorted(set(given or ()) - set(known))
        if bad:
            raise ValueError(f"unknown {what}(s) {bad}; known: {sorted(known)}")
    out = [
        c
        for c in cells
        if (models is None or c.model in models)
        and (programs is None or c.program in programs)
        and (batches is None or c.batch in batches)
        and (dtypes is None or c.dtype in dtypes)
    ]
    return out if limit is None else out[: max(0, limit)]


# ------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class InputSpec:
    """One graph input: its dims and how the generator fills it (``std * N(0,1) + mean``)."""

    name: str
    dims: Dims
    std: float = 1.0
    mean: float = 0.0
    #: A projection weight (in, out): with the "linear" weight layout it is stored as
    #: ``nn.Linear`` stores it, (out, in), and the program takes its transposed view.
    weight: bool = False


def _scaled_param(cell: Cell, scale: int) -> int:
    assert cell.param is not None
    return max(1, cell.param // scale)


#: How a program applies an RMSNorm weight: "mul" (default), ``mul(rms_norm(x), w)`` with ``w``
#: of dims (1, .., 1, n), which the search fuses; "keyword", ``rms_norm(x, weight=w)`` with ``w``
#: of dims (n,), which it does not search yet (every such search ends in ``SearchError``).
NORM_WEIGHT_FORMS = ("mul", "keyword")


#: How projection weights sit in memory: "rowmajor" (default), (in, out) as the programs read
#: them; "linear", (out, in) as ``nn.Linear`` keeps them (and PyTorch's dynamo then passes the
#: transposed view to a backend), so that each program reads W.T.
WEIGHT_LAYOUTS = ("rowmajor", "linear")


def input_strides(spec: InputSpec, weights: str = "rowmajor") -> tuple[int, ...] | None:
    """The strides of a graph input in the ``weights`` layout: None (row-major), or for a
    projection weight in the "linear" layout, those of the transposed view of an (out, in)
    row-major tensor."""
    if weights not in WEIGHT_LAYOUTS:
        raise ValueError(f"weights must be one of {WEIGHT_LAYOUTS}, got {weights!r}")
    if weights == "rowmajor" or not spec.weight:
        return None
    rows, _ = spec.dims
    return (1, rows)


def input_specs(cell: Cell, scale: int = 1, norm_weight: str = "mul") -> list[InputSpec]:
    """The program's inputs, in graph order, at ``scale`` (see ``ModelConfig.scaled``; KV
    length, prompt length and rank are divided too). Values are scaled so that outputs are
    O(1): matmul weights by 1/sqrt(fan-in), norm weights near 1, Q by 1/sqrt(d) (the softmax
    scale the graph lacks; for QK-norm, where rms(Q) undoes Q's scale, K takes it)."""
    cfg = check_cell(cell).config.scaled(scale)
    if norm_weight not in NORM_WEIGHT_FORMS:
        raise ValueError(f"norm_weight must be one of {NORM_WEIGHT_FORMS}, got {norm_weight!r}")
    b, h, i = cell.batch, cfg.hidden, cfg.intermediate

    def wdims(n: int, rank: int) -> Dims:  # a norm weight over n, for an input of that rank
        return (n,) if norm_weight == "keyword" else (1,) * (rank - 1) + (n,)

    d, g, kv = cfg.head_dim, cfg.group, cfg.kv_heads
    norm_w = 0.1  # norm weights: 1 + 0.1 N(0, 1)
    p = cell.program
    if p == "qkv":
        return [
            InputSpec("x", (b, h)),
            InputSpec("w_norm", wdims(h, 2), norm_w, 1.0),
            InputSpec("w_qkv", (h, cfg.qkv_dim), h**-0.5, weight=True),
        ]
    if p in ("attn_decode", "attn_prefill", "qknorm"):
        s = _scaled_param(cell, scale)
        rows = g if p != "attn_prefill" else g * s
        q_std, k_std = (1.0, d**-0.5) if p == "qknorm" else (d**-0.5, 1.0)
        specs = [
            InputSpec("q", (b * kv, rows, d), q_std),
            InputSpec("k", (b * kv, d, s), k_std),
            InputSpec("v", (b * kv, s, d)),
        ]
        if p == "qknorm":
            specs += [
                InputSpec("w_q", wdims(d, 3), norm_w, 1.0),
                InputSpec("w_v", wdims(d, 3), norm_w, 1.0),
            ]
        return specs
    if p == "oproj":
        return [
            InputSpec("a", (b, cfg.q_dim)),
            InputSpec("w_o", (cfg.q_dim, h), cfg.q_dim**-0.5, weight=True),
        ]
    if p == "gate_up":
        return [
            InputSpec("x", (b, h)),
            InputSpec("w_norm", wdims(h, 2), norm_w, 1.0),
            InputSpec("w_gate", (h, i), h**-0.5, weight=True),
            InputSpec("w_up", (h, i), h**-0.5, weight=True),
        ]
    if p == "down":
        return [InputSpec("h", (b, i)), InputSpec("w_down", (i, h), i**-0.5, weight=True)]
    if p == "mlp":
        return [
            InputSpec("x", (b, h)),
            InputSpec("w_gate", (h, i), h**-0.5, weight=True),
            InputSpec("w_up", (h, i), h**-0.5, weight=True),
            InputSpec("w_down", (i, h), i**-0.5, weight=True),
        ]
    # lora on the query projection
    r = _scaled_param(cell, scale)
    return [
        InputSpec("x", (b, h)),
        InputSpec("w", (h, cfg.q_dim), h**-0.5, weight=True),
        InputSpec("a", (h, r), h**-0.5, weight=True),
        InputSpec("b", (r, cfg.q_dim), r**-0.5, weight=True),
    ]


def output_dims(cell: Cell, scale: int = 1) -> Dims:
    """The program's one output."""
    dims = [s.dims for s in input_specs(cell, scale)]
    if PROGRAMS[cell.program].attention:
        return dims[0]
    # (batch, the last weight's output width): every non-attention program ends in one
    return (dims[0][0], dims[-1][-1])


def matmul_flops(cell: Cell, scale: int = 1) -> int:
    """2*M*N*K summed over the program's matmuls (element-wise work is not counted)."""
    dims = [s.dims for s in input_specs(cell, scale)]
    p = cell.program
    if PROGRAMS[p].attention:
        (bh, lq, d), (_, _, s) = dims[0], dims[1]
        return 2 * bh * lq * d * s * 2  # Q K and P V
    if p in ("qkv", "oproj", "down"):
        (m, k), n = dims[0], dims[-1][-1]
        return 2 * m * k * n
    if p == "gate_up":
        (m, k), n = dims[0], dims[2][1]
        return 2 * 2 * m * k * n
    if p == "mlp":
        (m, k), n = dims[0], dims[1][1]
        return 2 * 2 * m * k * n + 2 * m * n * k
    (m, k), n, r = dims[0], dims[1][1], dims[2][1]  # lora
    return 2 * m * k * n + 2 * m * k * r + 2 * m * r * n


def io_bytes(cell: Cell, scale: int = 1) -> int:
    """Bytes of every input and the output, once each, in the cell's dtype."""
    size = 4 if cell.dtype == "float32" else 2
    n = sum(math.prod(s.dims) for s in input_specs(cell, scale))
    return size * (n + math.prod(output_dims(cell, scale)))


# ------------------------------------------------------------------ the eps
def eps_supported() -> bool:
    """Whether ``KNGraph.rms_norm`` takes an ``eps`` keyword."""
    return "eps" in inspect.signature(mi.KNGraph.rms_norm).parameters


def graph_eps(cfg: ModelConfig) -> float:
    """The eps every form of the cell uses: the model's when the graph can take it, else 0."""
    return cfg.eps if eps_supported() else 0.0


# ------------------------------------------------------------------ builders
def _rms(g: mi.KNGraph, x: mi.DTensor, n: int, w: mi.DTensor, eps: float, form: str) -> mi.DTensor:
    """RMSNorm of ``x`` over its last ``n`` elements times ``w``, in the ``form`` given (see
    ``NORM_WEIGHT_FORMS``), with ``eps`` where ``rms_norm`` takes one."""
    kw: dict[str, object] = {"eps": eps} if eps_supported() else {}
    if form == "keyword":
        return g.rms_norm(x, normalized_shape=(n,), weight=w, **kw)  # type: ignore[arg-type]
    return g.mul(g.rms_norm(x, normalized_shape=(n,), **kw), w)  # type: ignore[arg-type]


def build_program(
    cell: Cell,
    scale: int = 1,
    dtype: str | None = None,
    norm_weight: str = "mul",
    weights: str = "rowmajor",
) -> mi.KNGraph:
    """The cell's user program, built op by op with the public kernel-graph API, at ``scale``
    and in ``dtype`` (default: the cell's), norm weights applied in the ``norm_weight`` form,
    projection weights in the ``weights`` layout."""
    specs = input_specs(cell, scale, norm_weight)
    cfg = cell.config
    eps = graph_eps(cfg)
    g = mi.new_kernel_graph()
    dt = dtype or cell.dtype
    xs = [g.new_input(dims=s.dims, strides=input_strides(s, weights), dtype=dt) for s in specs]
    act = g.silu if cfg.act == "silu" else g.gelu
    p = cell.program
    if p == "qkv":
        x, wn, w = xs
        out = g.matmul(_rms(g, x, specs[0].dims[-1], wn, eps, norm_weight), w)
    elif p in ("attn_decode", "attn_prefill"):
        q, k, v = xs
        out = g.matmul(g.softmax(g.matmul(q, k), dim=-1), v)
    elif p == "qknorm":
        q, k, v, wq, wv = xs
        d = specs[0].dims[-1]
        q, v = _rms(g, q, d, wq, eps, norm_weight), _rms(g, v, d, wv, eps, norm_weight)
        out = g.matmul(g.softmax(g.matmul(q, k), dim=-1), v)
    elif p in ("oproj", "down"):
        out = g.matmul(xs[0], xs[1])
    elif p == "gate_up":
        x, wn, wg, wu = xs
        xn = _rms(g, x, specs[0].dims[-1], wn, eps, norm_weight)
        out = g.mul(act(g.matmul(xn, wg)), g.matmul(xn, wu))
    elif p == "mlp":
        x, wg, wu, wd = xs
        out = g.matmul(g.mul(act(g.matmul(x, wg)), g.matmul(x, wu)), wd)
    else:  # lora
        x, w, a, b_ = xs
        out = g.add(g.matmul(x, w), g.matmul(g.matmul(x, a), b_))
    g.mark_output(out)
    return g


# ------------------------------------------------------------ torch versions
TensorFn = Callable[..., torch.Tensor]


def torch_fn(cell: Cell) -> TensorFn:
    """The program in PyTorch on the graph's inputs, in their dtype (the eager contender; on
    float64 inputs, the reference)."""
    cfg = cell.config
    eps = graph_eps(cfg)
    act = F.silu if cfg.act == "silu" else F.gelu

    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]  # the weight in either form (see NORM_WEIGHT_FORMS), as a view
        return F.rms_norm(x, (n,), weight=w.reshape(n), eps=eps)

    p = check_cell(cell).program
    if p == "qkv":

        def qkv(x: torch.Tensor, wn: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return rms(x, wn) @ w

        return qkv
    if p in ("attn_decode", "attn_prefill"):

        def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.softmax(q @ k, dim=-1) @ v

        return attention
    if p == "qknorm":

        def qknorm(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, wq: torch.Tensor, wv: torch.Tensor
        ) -> torch.Tensor:
            return torch.softmax(rms(q, wq) @ k, dim=-1) @ rms(v, wv)

        return qknorm
    if p in ("oproj", "down"):

        def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return x @ w

        return linear
    if p == "gate_up":

        def gate_up(
            x: torch.Tensor, wn: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor
        ) -> torch.Tensor:
            xn = rms(x, wn)
            return act(xn @ wg) * (xn @ wu)

        return gate_up
    if p == "mlp":

        def mlp(
            x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor
        ) -> torch.Tensor:
            return (act(x @ wg) * (x @ wu)) @ wd

        return mlp

    def lora(x: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return x @ w + (x @ a) @ b

    return lora


def make_inputs(
    cell: Cell,
    gen: torch.Generator,
    device: str | torch.device = "cpu",
    scale: int = 1,
    dtype: str | None = None,
    norm_weight: str = "mul",
    weights: str = "rowmajor",
) -> list[torch.Tensor]:
    """Fresh random inputs of the cell (see ``input_specs``), drawn in float32 from ``gen``
    and rounded to ``dtype`` (default: the cell's); projection weights in the ``weights``
    layout (with "linear", the transposed view of an (out, in) tensor)."""
    dt = getattr(torch, dtype or cell.dtype)
    out = []
    for s in input_specs(cell, scale, norm_weight):
        linear = input_strides(s, weights) is not None
        stored = s.dims[::-1] if linear else s.dims
        x = torch.randn(*stored, generator=gen, device=device, dtype=torch.float32)
        x = (x * s.std + s.mean).to(dt)
        out.append(x.t() if linear else x)
    return out
