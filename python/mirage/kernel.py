"""Kernel graphs (:class:`KNGraph`): the top level of a µGraph, built op by op.

Ops take and return :class:`~mirage.DTensor` handles; shapes and dtypes are checked by the Rust
core as each op is added (``ValueError`` for shapes and structure, ``TypeError`` for dtypes).
A graph is callable: ``outputs = graph(inputs=[...])`` runs it on the CPU interpreter.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union, overload

from . import _compat, _core, _cuda
from ._args import MAX_NUMEL, as_dims, as_eps, as_float, as_int
from ._dtypes import DType, as_dtype, float16
from ._ops import install_unary_methods
from ._runtime import InputSpec, as_input_list, build_outputs, prepare_inputs, row_major
from .tensor import DTensor
from .threadblock import TBGraph

__all__ = ["KNGraph"]

PathLike = Union[str, "os.PathLike[str]"]


class _FromJson:
    """``KNGraph.from_json(filename)`` returns a new graph; ``g.from_json(filename)`` loads
    the file into ``g`` (the reference's form) and returns ``g``."""

    def __get__(self, obj: KNGraph | None, owner: type[KNGraph]) -> Callable[[PathLike], KNGraph]:
        def load(filename: PathLike) -> KNGraph:
            core = _compat.load_graph_file("from_json", filename)
            if obj is None:
                return owner(core)
            obj._reset(core)
            return obj

        load.__doc__ = "Reads a graph from a JSON file written by ``to_json(filename)``."
        return load


class KNGraph:
    """A kernel graph: device tensors, predefined ops and customized (threadblock-graph) ops."""

    def __init__(self, core: _core.KernelGraph | None = None) -> None:
        self._reset(core if core is not None else _core.KernelGraph())

    def _reset(self, core: _core.KernelGraph) -> None:
        """Makes this graph ``core`` (handles of an earlier graph no longer apply)."""
        self._core = core
        # Inputs whose layout must match exactly at call time (strides given at new_input).
        self._explicit_strides: dict[int, tuple[int, ...]] = {}
        # compile(): ((num_ops, outputs, arch) compiled, kernels valid, error message, dict).
        self._compiled: tuple[tuple[Any, ...], bool, str, dict[str, Any] | None] | None = None
        #: Statistics of the search that produced this graph (set by :meth:`superoptimize`).
        self.search_stats: dict[str, Any] | None = None
        #: How many candidates :meth:`superoptimize` chose among (timed on a GPU, or ranked
        #: by the cost model); ``None`` for graphs not produced by it.
        self.candidates_considered: int | None = None
        # A loaded graph: a non-row-major input layout was necessarily given explicitly.
        for tid in core.input_ids():
            strides = tuple(core.input_strides(tid))
            if strides != row_major(core.tensor_dims(tid)):
                self._explicit_strides[tid] = strides

    # ----------------------------------------------------------------- helpers
    def _tid(self, op: str, t: Any, what: str = "A") -> int:
        if not isinstance(t, DTensor):
            raise TypeError(f"{op}: {what} must be a DTensor of this kernel graph, got {t!r}")
        if t.graph is not self:
            raise ValueError(f"{op}: {what} ({t!r}) belongs to another kernel graph")
        return t.id

    def _wrap(self, tid: int) -> DTensor:
        return DTensor(self, tid)

    if TYPE_CHECKING:
        # The registry's unary ops (``exp``, ``silu``, ``tanh`` ...) are installed below.
        def __getattr__(self, name: str) -> Callable[[DTensor], DTensor]: ...

    def _unary(self, name: str, A: DTensor, **params: float) -> DTensor:
        return self._wrap(self._core.unary(name, self._tid(name, A), **params))

    def _binary(self, name: str, A: DTensor, B: DTensor) -> DTensor:
        return self._wrap(self._core.binary(name, self._tid(name, A), self._tid(name, B, "B")))

    # ------------------------------------------------------------------ inputs
    def new_input(
        self,
        dims: Sequence[int],
        strides: Sequence[int] | None = None,
        dtype: Any = float16,
    ) -> DTensor:
        """Adds a graph input of ``dims``; ``strides`` (in elements) default to row-major.

        When ``strides`` are given, every call checks that the tensor passed has that layout;
        otherwise any layout is accepted. ``dtype``: a mirage dtype, a name or a torch dtype.
        """
        op = "new_input"
        d = as_dims(op, "dims", dims)
        if isinstance(strides, (DType, str)) or type(strides).__module__.startswith("torch"):
            raise TypeError(
                f"{op}: strides must be a tuple of integers, got {strides!r}; "
                f"pass the dtype by keyword: new_input({d}, dtype={strides!r})"
            )
        s = None if strides is None else as_dims(op, "strides", strides, most=MAX_NUMEL)
        dt = as_dtype(dtype, op)
        tid = self._core.new_input(list(d), dt.name, None if s is None else list(s))
        if s is not None:
            self._explicit_strides[tid] = s
        return self._wrap(tid)

    # --------------------------------------------------------------------- ops
    def matmul(self, A: DTensor, B: DTensor) -> DTensor:
        """Batched matmul ``[.., m, k] x [.., k, n] -> [.., m, n]``."""
        return self._wrap(self._core.matmul(self._tid("matmul", A), self._tid("matmul", B, "B")))

    def clamp(self, A: DTensor, min_val: float, max_val: float) -> DTensor:
        """Element-wise ``min(max(A, min_val), max_val)``."""
        lo, hi = as_float("clamp", "min_val", min_val), as_float("clamp", "max_val", max_val)
        return self._unary("clamp", A, min=lo, max=hi)

    def add(self, A: DTensor, B: DTensor) -> DTensor:
        """``A + B`` (a dim broadcasts when it is 1)."""
        return self._binary("add", A, B)

    def mul(self, A: DTensor, B: DTensor) -> DTensor:
        """``A * B`` (a dim broadcasts when it is 1)."""
        return self._binary("mul", A, B)

    def div(self, A: DTensor, B: DTensor) -> DTensor:
        """``A / B`` (a dim broadcasts when it is 1)."""
        return self._binary("div", A, B)

    def sub(self, A: DTensor, B: DTensor) -> DTensor:
        """``A - B`` (a dim broadcasts when it is 1)."""
        return self._binary("sub", A, B)

    def pow(self, A: DTensor, B: DTensor) -> DTensor:
        """``A ** B`` (a dim broadcasts when it is 1)."""
        return self._binary("pow", A, B)

    def reduction(self, A: DTensor, dim: int) -> DTensor:
        """Sum over ``dim``, kept with size 1."""
        op = "reduction"
        return self._wrap(self._core.reduction(self._tid(op, A), as_int(op, "dim", dim)))

    def rms_norm(
        self,
        A: DTensor,
        normalized_shape: Sequence[int],
        weight: DTensor | None = None,
        eps: float = 0.0,
    ) -> DTensor:
        """``A / sqrt(mean(A^2) + eps)`` over the trailing ``normalized_shape`` dims, times
        ``weight`` (``eps``: finite, ``>= 0``)."""
        op = "rms_norm"
        shape = as_dims(op, "normalized_shape", normalized_shape, allow_int=True)
        w = None if weight is None else self._tid(op, weight, "weight")
        e = as_eps(op, eps)
        return self._wrap(self._core.rms_norm(self._tid(op, A), list(shape), w, e))

    def softmax(self, A: DTensor, dim: int = -1) -> DTensor:
        """Softmax over ``dim``."""
        op = "softmax"
        return self._wrap(self._core.softmax(self._tid(op, A), as_int(op, "dim", dim)))

    def customized(self, inputs: Sequence[DTensor], bgraph: TBGraph) -> list[DTensor]:
        """Adds a graph-defined op: ``bgraph`` run by its grid of thread blocks on ``inputs``.

        ``inputs[i]`` must have the dims and dtype of the tensor passed to the ``i``-th
        ``bgraph.new_input``. Returns the op's outputs, one per ``bgraph.new_output``.
        """
        op = "customized"
        if not isinstance(bgraph, TBGraph):
            raise TypeError(f"{op}: bgraph must be a TBGraph, got {type(bgraph).__name__}")
        items = list(inputs)
        declared = bgraph.inputs
        if len(items) != len(declared):
            raise ValueError(
                f"{op}: the threadblock graph has {len(declared)} inputs (tb.new_input calls) "
                f"but {len(items)} tensors were given"
            )
        ids = []
        for i, (t, want) in enumerate(zip(items, declared)):
            ids.append(self._tid(op, t, f"input {i}"))
            # The block input may read the tensor with leading 1s (a rank-lifting view).
            lift = len(want.dims) - len(t.dims)
            if lift < 0 or tuple(want.dims) != (1,) * lift + tuple(t.dims):
                raise ValueError(
                    f"{op}: input {i} has dims {t.dims} but the threadblock graph's input {i} "
                    f"was declared with dims {want.dims} (the same dims, or them with leading 1s)"
                )
            if t.dtype != want.dtype:
                raise TypeError(
                    f"{op}: input {i} has dtype {t.dtype!r} but the threadblock graph's input {i} "
                    f"was declared with dtype {want.dtype!r}"
                )
        return [self._wrap(t) for t in self._core.customized(ids, bgraph._core)]

    def mark_output(self, A: DTensor, strides: Sequence[int] | None = None) -> None:
        """Marks ``A`` as a graph output; ``strides`` (in elements) default to row-major."""
        op = "mark_output"
        s = None if strides is None else list(as_dims(op, "strides", strides, most=MAX_NUMEL))
        self._core.mark_output(self._tid(op, A), s)

    # ---------------------------------------------------------------- queries
    @property
    def inputs(self) -> list[DTensor]:
        """The graph inputs, in call order."""
        return [self._wrap(t) for t in self._core.input_ids()]

    @property
    def outputs(self) -> list[DTensor]:
        """The marked outputs, or every tensor no op consumes when none is marked."""
        return [self._wrap(t) for t in self._core.output_ids()]

    @property
    def num_ops(self) -> int:
        """Number of ops, inputs included."""
        return self._core.num_ops

    @overload
    def to_json(self, filename: None = None) -> str: ...
    @overload
    def to_json(self, filename: PathLike) -> None: ...
    def to_json(self, filename: PathLike | None = None) -> str | None:
        """The graph as versioned JSON (``mi.from_json`` reads it back); with ``filename``
        (the reference's form), writes it to that file instead and returns None."""
        text = self._core.to_json()
        if filename is None:
            return text
        if not isinstance(filename, (str, os.PathLike)):
            raise TypeError(
                f"to_json: filename must be a path (str or os.PathLike), got {filename!r}"
            )
        with open(os.fspath(filename), "w", encoding="utf-8") as f:
            f.write(text)
        return None

    from_json = _FromJson()

    def save_json(self, path: PathLike) -> None:
        """Writes :meth:`to_json` to ``path``."""
        self.to_json(path)

    def hash(self) -> str:
        """A stable hex digest (SHA-256) of the graph's structure: independent of tensor ids
        and of the order in which independent ops were built."""
        return self._core.hash()

    def get_owner_independent_hash(self) -> int:
        """The reference's graph hash, an integer: the first 64 bits of :meth:`hash`, which
        already ignores tensor ids and owners (equal graphs built apart hash equal)."""
        return int(self._core.hash()[:16], 16)

    @property
    def cygraph(self) -> KNGraph:
        """This graph (reference scripts pass ``graph.cygraph`` to
        ``mi.generate_cuda_program``)."""
        return self

    def to_dot(self) -> str:
        """The graph in Graphviz DOT."""
        return self._core.to_dot()

    def visualize(self, filename: PathLike) -> list[str]:
        """Writes ``<filename>.dot`` (or ``filename`` if it ends with ``.dot``) and, when the
        Graphviz ``dot`` executable is found, ``.svg`` and ``.png`` next to it.

        Returns the paths written (see also :mod:`mirage.visualizer`).
        """
        from .visualizer import render

        return render(self.to_dot(), filename, ("svg", "png"))

    # ------------------------------------------------------------------- run
    def _input_specs(self) -> list[InputSpec]:
        core = self._core
        return [
            InputSpec(
                tuple(core.tensor_dims(t)),
                as_dtype(core.tensor_dtype(t)),
                self._explicit_strides.get(t),
            )
            for t in core.input_ids()
        ]

    def run(self, inputs: Sequence[Any] | None = None) -> list[Any]:
        """Runs the graph on the CPU interpreter (computing in float32).

        ``inputs``: one torch CPU tensor or numpy array per graph input, in order, checked on
        every call. Returns the outputs as torch tensors when any input was a torch tensor,
        else as numpy arrays, each in its tensor's dtype and declared layout. Ctrl-C stops a
        long run and raises ``KeyboardInterrupt``.
        """
        inputs = as_input_list(inputs)
        if _cuda.wants_cuda(inputs):
            return _cuda.run(self, inputs)
        data, as_torch = prepare_inputs(self._input_specs(), inputs)
        core = self._core
        raw = core.run(data)
        outs = core.output_ids()
        return build_outputs(
            raw,
            [core.tensor_dims(t) for t in outs],
            [as_dtype(core.tensor_dtype(t)) for t in outs],
            core.output_strides(),
            as_torch,
        )

    def __call__(
        self, inputs: Sequence[Any] | None = None, stream: Any = None, **ignored: Any
    ) -> list[Any]:
        """``graph(inputs=[...])``: same as :meth:`run`. On CUDA tensors the generated kernels
        run on ``stream`` (default: torch's current stream; ``save_codes=True`` or a folder
        writes the generated source); on the CPU ``stream`` and other keyword arguments (e.g.
        ``outputs=``) are accepted and ignored."""
        inputs = as_input_list(inputs)
        if _cuda.wants_cuda(inputs):
            return _cuda.run(self, inputs, stream, ignored.get("save_codes"))
        return self.run(inputs)

    def _state(self) -> tuple[int, tuple[int, ...]]:
        """What changes when the graph does (graphs only grow): ops and outputs."""
        return (self._core.num_ops, tuple(self._core.output_ids()))

    def _compiled_now(self) -> bool:
        return self._compiled is not None and self._compiled[0][:2] == self._state()

    def compile(self, async_: bool = False, **kwargs: Any) -> Any:
        """The reference's compile: generates the CUDA program and compiles it with NVRTC
        (loaded on the selected CUDA device when ``target_cc`` is its arch or not given,
        else to a CUBIN only; ``graph(inputs=...)`` on CUDA tensors reuses it). Keywords:
        ``inputs`` (checked against the graph's shapes and strides), ``target_cc``, and those
        of :func:`mirage.generate_cuda_program`; ``file_id``, ``outputs`` and ``stream`` are
        ignored. Returns the program's dict, or None when the kernels are invalid (see
        :meth:`valid_kernels`, :meth:`get_error_message`); with ``async_=True`` an object
        whose ``wait()`` returns that. Cached per target until the graph changes."""
        arch = _compat.target_arch("compile", kwargs.get("target_cc"))
        done = self._compiled
        if done is None or done[0] != (*self._state(), arch):
            _compat.compile_graph(self, kwargs)
            done = self._compiled
        assert done is not None
        result = done[3]
        if async_:
            return _compat.Done(result)
        return result

    def valid_kernels(self) -> bool:
        """Whether this graph's generated kernels compiled (compiles first, with the default
        target, when :meth:`compile` has not run). NVRTC missing raises ``RuntimeError``."""
        if not self._compiled_now():
            self.compile()
        assert self._compiled is not None
        return self._compiled[1]

    def get_error_message(self) -> str:
        """Why :meth:`valid_kernels` is False (``"No error"`` when it is True)."""
        if not self._compiled_now() or self._compiled is None:
            raise RuntimeError("get_error_message: call compile() or valid_kernels() first")
        return self._compiled[2]

    def cuda_source(self, arch: int | None = None) -> str:
        """The CUDA C++ this graph compiles to for ``sm_{arch}`` (default: the current torch
        device's architecture, else 90). Self-contained apart from CUDA's own headers."""
        if arch is None:
            arch = _cuda.default_arch()
        return _cuda.cuda_source(self, arch)[0]

    def compile_cuda(self, arch: int | None = None) -> bytes:
        """Generates and compiles this graph with NVRTC for ``sm_{arch}``; returns the CUBIN.
        A compile error raises ``RuntimeError`` with NVRTC's log."""
        if arch is None:
            arch = _cuda.default_arch()
        return _cuda.compile_cubin(self, arch)

    def cuda_resources(self, arch: int | None = None) -> dict[str, Any]:
        """What each generated kernel takes on ``sm_{arch}`` (default as :meth:`cuda_source`),
        compiled with NVRTC and ptxas's verbose report; needs NVRTC, not a GPU.

        Returns ``{"arch", "workspace_bytes", "kernels", "warnings"}``: per kernel, in launch
        order, its launch (``name``, ``kind``, ``grid``, ``block``, ``cluster``, dynamic
        ``smem_bytes``, ``args``) and ptxas's ``registers`` (a thread at entry),
        ``spill_store_bytes``, ``spill_load_bytes``, ``stack_frame_bytes``, ``barriers`` and
        ``static_smem_bytes``; ``warnings`` are ptxas's, one line each (e.g. an ignored
        ``setmaxnreg``). Where ptxas's report names no kernel of a launch (that kernel then
        lacks ``registers`` and the rest), ``ptxas_log`` holds NVRTC's whole log. A compile
        error raises ``RuntimeError`` with NVRTC's log."""
        if arch is None:
            arch = _cuda.default_arch()
        return _cuda.resources(self, arch)

    def cuda_sass(self, arch: int | None = None) -> dict[str, dict[str, Any]]:
        """The machine code (SASS) of each generated kernel on ``sm_{arch}`` (default as
        :meth:`cuda_source`), by kernel name: ``{"instructions": [...], "opcodes": {...}}``,
        each instruction as ``nvdisasm`` prints it (predicate included, address and ``;``
        left out), and how many instructions have each opcode (``HGMMA``, ``MUFU``, ``LDL``,
        ...: modifiers and predicate left out). Needs NVRTC and ``nvdisasm`` (the
        ``nvidia-cuda-nvdisasm`` pip package, a CUDA toolkit, or ``MIRAGE_NVDISASM``), not a
        GPU; ``RuntimeError`` says which is missing."""
        if arch is None:
            arch = _cuda.default_arch()
        return _cuda.sass(self, arch)

    # -------------------------------------------------------------- search
    def superoptimize(
        self,
        imaps: Sequence[Sequence[int]] | None = None,
        omaps: Sequence[Sequence[int]] | None = None,
        griddims: Sequence[Sequence[int]] | None = None,
        blockdims: Sequence[Sequence[int]] | None = None,
        fmaps: Sequence[int] | None = None,
        franges: Sequence[int] | None = None,
        verbose: bool = False,
        config: str | Mapping[str, Any] | None = None,
        backend: str = "cuda",
        warmup_iters: int = 16,
        profile_iters: int = 1000,
        use_graph_dataset: bool = True,
        use_cached_graphs: bool = True,
        save_codes: bool | PathLike = False,
        is_formal_verified: bool = False,
        previous_checkpoint: PathLike | None = None,
        time_budget: float | None = None,
        num_threads: int | None = None,
        cache_dir: PathLike | None = None,
        use_symbolic_search: bool = False,
        symbolic_checkpoint: PathLike | None = None,
        search_time_limit_sec: float | None = None,
        progress: bool | None = None,
    ) -> KNGraph:
        """Searches µGraphs equivalent to this graph and returns the best one as a new graph.

        Same keyword arguments and meaning as the reference Mirage, plus ``time_budget``,
        ``num_threads`` and ``cache_dir``:

        * ``griddims`` / ``blockdims``: lists of ``(x, y, z)`` launch shapes to try instead of
          the generated ones (``blockdims`` is supported, unlike the reference);
          ``imaps`` / ``omaps``: lists of allowed ``(x, y, z)`` input / output maps;
          ``fmaps``: allowed for-loop dims (-1: not iterated); ``franges``: loop ranges to try.
        * ``config``: ``"attention"`` (up to 2 customized kernels, loop ranges 1, 4, 16, 32
          and 64 unless ``franges`` is given), ``"mlp"`` (one customized kernel, the same loop
          ranges), ``"lora"`` (one customized kernel), ``None`` (the search's defaults), or a
          dict of advanced settings (``mirage.search.CONFIG_KEYS``, e.g.
          ``{"preset": "mlp", "max_block_ops": 9}``).
        * ``backend="cuda"``: with a CUDA device, up to 64 candidates verified as numerically
          stable (spread over structures and launch shapes), each of the first 32 that
          streams its loop over one wave of blocks followed by a co-resident twin (stages
          capped so that two blocks share an SM) and each with a loop matmul of 16 or 32 rows
          by 64 columns by a warpgroup twin (summed on the warpgroup tensor cores), are
          compiled and timed (``warmup_iters``
          warm-up launches, ``profile_iters`` timed ones, median) and the fastest is returned
          (a candidate whose first timed replay is over twice the fastest so far is not timed
          further; those within 5% of the fastest, up to four, are timed three more times in
          turns and the best median wins); without one (or
          ``backend="cpu"``), the cheapest by the cost model among verified candidates.
        * ``use_cached_graphs``: reuse the result of an identical earlier search, stored as JSON
          in ``cache_dir`` (default ``$MIRAGE_CACHE_DIR/search`` or
          ``~/.cache/mirage-rs/search``), keyed by graph hash, search settings, the build
          (crate version and ``mirage._core.__build_hash__``) and the ``MIRAGE_*`` switches
          that change generated code; a damaged or foreign entry is searched again and
          overwritten, with a ``RuntimeWarning`` (docs/caches.md).
          ``previous_checkpoint="file.json"``: load the candidates from that file if it exists,
          else search and save them there.
        * ``save_codes``: ``True`` (folder ``$MIRAGE_SAVE_CODES`` or ``mirage_generated``) or a
          folder: write the winner's generated CUDA source.
        * ``time_budget``: seconds; the search stops then and uses the best found so far.
          ``num_threads``: search threads (default: all cores). ``verbose``: what each step
          found, on stderr.
        * ``progress``: a progress display on stderr over the stages (search, verification,
          compilation, profiling, confirmation), drawn with ``tqdm`` when it is installed,
          else as one line; ``None`` (default): ``MIRAGE_PROGRESS`` (``1``, ``0``, ``plain``)
          if set, else on when stderr is a terminal (docs/ux.md).
        * Accepted and ignored: ``use_graph_dataset`` (no bundled dataset of pre-searched
          graphs) and ``is_formal_verified`` (candidates are always checked by the
          finite-field verifier plus a float test).
        * The newer reference's keywords: ``search_time_limit_sec`` is ``time_budget``
          (``<= 0``: no limit); ``use_symbolic_search=True`` runs this search (the one search
          here; the reference's symbolic one is an alternative algorithm), and then
          ``symbolic_checkpoint`` is ``previous_checkpoint`` (docs/reference-compat.md).

        Ctrl-C cancels the search promptly and raises ``KeyboardInterrupt``. Bad argument types
        raise ``TypeError``, bad values ``ValueError``. A search that finds nothing usable
        returns the program as given (its ops run by the default kernels) with a
        ``RuntimeWarning`` naming the ops and the reason (``search_stats["source"]`` is
        ``"as_given"``); only launch restrictions (``griddims``, ``imaps``, ...) that exclude
        every µGraph raise :class:`mirage.search.SearchError`. The returned graph carries
        ``search_stats`` (a dict; its ``summary`` says in one line what was chosen and why,
        printed with ``verbose`` or ``progress``) and ``candidates_considered``;
        :meth:`explain` shows its kernels.
        """
        from .search import superoptimize

        time_budget, previous_checkpoint = _compat.search_keywords(
            use_symbolic_search,
            symbolic_checkpoint,
            search_time_limit_sec,
            time_budget,
            previous_checkpoint,
        )
        return superoptimize(
            self,
            imaps=imaps,
            omaps=omaps,
            griddims=griddims,
            blockdims=blockdims,
            fmaps=fmaps,
            franges=franges,
            verbose=verbose,
            config=config,
            backend=backend,
            warmup_iters=warmup_iters,
            profile_iters=profile_iters,
            use_graph_dataset=use_graph_dataset,
            use_cached_graphs=use_cached_graphs,
            save_codes=save_codes,
            is_formal_verified=is_formal_verified,
            previous_checkpoint=previous_checkpoint,
            time_budget=time_budget,
            num_threads=num_threads,
            cache_dir=cache_dir,
            progress=progress,
        )

    def explain(self, **kwargs: Any) -> str:
        """Prints and returns what this graph runs, kernel op by kernel op (see
        :func:`mirage.explain.explain` for the keywords: ``compile``, ``dot``, ...)."""
        from .explain import explain

        return explain(self, **kwargs)

    def __repr__(self) -> str:
        ins = ", ".join(f"{d.dims}:{d.dtype.name}" for d in self.inputs)
        n_out = len(self._core.output_ids())
        return f"KNGraph({self.num_ops} ops, inputs [{ins}], {n_out} outputs)"


install_unary_methods(KNGraph)
