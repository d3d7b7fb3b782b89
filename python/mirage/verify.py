"""Equivalence verification of two kernel graphs (finite-field random testing).

``mi.verify(reference, candidate)`` returns a :class:`Verdict`: whether the candidate computes
the same function as the reference, how sure the test is (trials and the false-accept bound of
the paper's theorem for this pair), and, separately, whether the candidate is numerically
stable in its dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import _core
from .kernel import KNGraph

__all__ = ["Verdict", "verify"]


@dataclass(frozen=True)
class Verdict:
    """Outcome of :func:`verify`; truthy when the candidate is equivalent and numerically stable."""

    equivalent: bool
    trials: int = 0
    samples: int = 0
    false_accept_bound: float = 1.0
    fragment: str = ""
    fragment_reason: str = ""
    degree: int = 0
    exp_ops: int = 0
    assignment: tuple[int, ...] = ()
    numerics: str = "not checked"
    numerics_reason: str = ""
    max_rel_err: float | None = None
    counterexample: dict[str, Any] = field(default_factory=dict)

    @property
    def accepted(self) -> bool:
        """Equivalent and not flagged numerically unstable."""
        return self.equivalent and self.numerics != "unstable"

    def __bool__(self) -> bool:
        return self.accepted

    def __str__(self) -> str:
        if not self.equivalent:
            c = self.counterexample
            return (
                f"not equivalent: output {c['output']} index {tuple(c['index'])} differs in trial "
                f"{c['trial']} ({c['reference_value']} vs {c['candidate_value']} mod p)"
            )
        return (
            f"equivalent ({self.fragment}) after {self.trials} trials, {self.samples} elements; "
            f"false-accept bound {self.false_accept_bound:.1e} per element; numerics {self.numerics}"
        )


def verify(
    reference: KNGraph,
    candidate: KNGraph,
    *,
    seed: int | None = None,
    trials: int | None = None,
    float_check: bool = True,
    allow_non_lax: bool = False,
) -> Verdict:
    """Checks whether ``candidate`` computes what ``reference`` computes.

    Raises ``ValueError`` when the two graphs cannot be compared (different inputs, outputs
    that do not pair up by shape) or a path holds two exponentials (unless ``allow_non_lax``).
    """
    for name, g in (("reference", reference), ("candidate", candidate)):
        if not isinstance(g, KNGraph):
            raise TypeError(f"verify: {name} must be a kernel graph, got {type(g).__name__}")
    d = _core.verify(reference._core, candidate._core, seed, trials, float_check, allow_non_lax)
    if not d["equivalent"]:
        keys = (
            "output",
            "candidate_output",
            "index",
            "reference_value",
            "candidate_value",
            "trial",
        )
        return Verdict(equivalent=False, counterexample={k: d[k] for k in keys})
    return Verdict(
        equivalent=True,
        trials=d["trials"],
        samples=d["samples"],
        false_accept_bound=d["false_accept_bound"],
        fragment=d["fragment"],
        fragment_reason=d["fragment_reason"],
        degree=d["degree"],
        exp_ops=d["exp_ops"],
        assignment=tuple(d["assignment"]),
        numerics=d["numerics"],
        numerics_reason=d.get("numerics_reason", ""),
        max_rel_err=d.get("max_rel_err"),
    )
