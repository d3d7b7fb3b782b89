"""Drawing kernel graphs: Graphviz DOT from the Rust core, rendered when Graphviz is installed.

The reference Mirage's entry point is the class ``visualizer(output_filename)`` with
``draw_graphs(graph, dot=True, png=True)``; ``from mirage import visualizer`` gives this module,
which can also be called like that class (``visualizer("name").draw_graphs(g)``). The function
:func:`draw` does the same in one call. Without Graphviz's ``dot`` executable only the
``.dot`` file is written (and the caller is told so); nothing fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from collections.abc import Sequence
from typing import Any

__all__ = ["draw", "render", "visualizer"]


def render(dot_text: str, filename: str | os.PathLike[str], formats: Sequence[str]) -> list[str]:
    """Writes ``dot_text`` to ``<filename>.dot`` (or ``filename`` when it ends with ``.dot``)
    and, when Graphviz's ``dot`` is on the PATH, one file per format (``"svg"``, ``"png"``)
    next to it. Returns the paths written; a failing ``dot`` raises ``RuntimeError``."""
    name = os.fspath(filename)
    if name.endswith(".dot"):
        dot_path, base = name, name[: -len(".dot")]
    else:
        dot_path, base = name + ".dot", name
    with open(dot_path, "w", encoding="utf-8") as f:
        f.write(dot_text)
    written = [dot_path]
    exe = shutil.which("dot")
    if exe is None:
        return written
    for fmt in formats:
        out = f"{base}.{fmt}"
        res = subprocess.run(
            [exe, f"-T{fmt}", dot_path, "-o", out], check=False, capture_output=True, text=True
        )
        if res.returncode != 0:
            raise RuntimeError(f"visualize: dot -T{fmt} failed: {res.stderr.strip()}")
        written.append(out)
    return written


def _graph_of(op: str, graph: Any) -> Any:
    from .kernel import KNGraph

    if isinstance(graph, KNGraph):
        return graph
    raise TypeError(
        f"{op}: expected a KNGraph, got {type(graph).__name__} (the reference's "
        "get_graph_structure() lists are not used here: pass the graph itself)"
    )


def draw(
    graph: Any, filename: str | os.PathLike[str], formats: Sequence[str] = ("svg", "png")
) -> list[str]:
    """Writes ``graph``'s DOT to ``<filename>.dot`` and, with Graphviz, ``<filename>.<fmt>``
    for each of ``formats``; prints what was written (and that Graphviz is missing, if so).
    Returns the paths written."""
    g = _graph_of("draw", graph)
    written = render(g.to_dot(), filename, formats)
    for p in written:
        print(f"Graph saved as {p}")
    if len(written) == 1 and formats:
        print("Graphviz's 'dot' was not found: only the .dot file was written (install graphviz)")
    return written


class visualizer:
    """The reference's drawing object: ``visualizer(output_filename).draw_graphs(graph)``."""

    def __init__(self, output_filename: str | os.PathLike[str]) -> None:
        if not isinstance(output_filename, (str, os.PathLike)):
            raise TypeError(f"visualizer: output_filename must be a path, got {output_filename!r}")
        self.output_filename = os.fspath(output_filename)

    def draw_graphs(self, operators: Any, dot: bool = True, png: bool = True) -> list[str]:
        """Draws the graph ``operators`` (a KNGraph): always the ``.dot`` file (``dot=False``
        is accepted: the DOT is what gets rendered), plus ``.png`` when ``png`` and Graphviz
        is installed. Returns the paths written."""
        return draw(operators, self.output_filename, ("png",) if png else ())


class _CallableModule(types.ModuleType):
    """This module, callable as its ``visualizer`` class (the reference exports the class
    under the module's name)."""

    def __call__(self, output_filename: str | os.PathLike[str]) -> visualizer:
        return visualizer(output_filename)


sys.modules[__name__].__class__ = _CallableModule
