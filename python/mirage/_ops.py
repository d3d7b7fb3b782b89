"""The per-op methods of the element-wise unary op registry (``_core.UNARY_OPS``; docs/ops.md).

``g.tanh(x)`` on a :class:`~mirage.KNGraph` and ``tb.tanh(x)`` on a :class:`~mirage.TBGraph`
are installed here from the Rust registry, so an op added there needs no Python change.
"""

from __future__ import annotations

from typing import Any

from . import _core


def unary_op_names() -> list[str]:
    """The registry's parameterless unary op names, in registry order."""
    return [name for name, _ in _core.UNARY_OPS]


def install_unary_methods(cls: type) -> None:
    """Gives ``cls`` (which has ``_unary(name, A)``) one method per registry op."""
    for name, doc in _core.UNARY_OPS:

        def method(self: Any, A: Any, _name: str = name) -> Any:
            return self._unary(_name, A)

        method.__name__ = name
        method.__qualname__ = f"{cls.__name__}.{name}"
        method.__doc__ = f"Element-wise {doc}"
        setattr(cls, name, method)
