"""Equivalence verification of two kernel graphs (finite-field random testing).

``mi.verify(reference, candidate)`` returns a :class:`Verdict`: whether the candidate computes
the same function as the reference, how sure the test is (trials and the false-accept bound of
the paper's theorem for this pair), and, separately, whether the candidate is numerically
stable in its dtype.

By default every output element is compared in every trial (``coverage="every"``), so the
bound is on accepting a candidate that differs anywhere. ``coverage="sampled"`` compares a few
elements per output and trial (the search's fast pruning check): its bound holds only per
compared element, not for the candidate. See docs/verifier.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from . import _core
from .kernel import KNGraph

__all__ = ["Coverage", "Verdict", "verify"]

Coverage = Literal["every", "sampled"]


@dataclass(frozen=True)
class Verdict:
    """Outcome of :func:`verify`; truthy when the candidate is equivalent and numerically stable."""

    equivalent: bool
    coverage: str = "every"
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
    def bound_scope(self) -> str:
        """What ``false_accept_bound`` bounds: ``"candidate"`` (every element compared) or
        ``"compared element"`` (sampled coverage: a difference elsewhere is not covered)."""
        return "candidate" if self.coverage == "every" else "compared element"

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
        if self.coverage == "every":
            scope = "for the candidate (every output element compared)"
        else:
            scope = (
                "per compared element only (sampled coverage: elements not compared are not "
                "covered; not a bound for the candidate)"
            )
        return (
            f"equivalent ({self.fragment}) after {self.trials} trials, {self.samples} elements "
            f"compared; false-accept bound {self.false_accept_bound:.1e} {scope}; "
            f"numerics {self.numerics}"
        )


def verify(
    reference: KNGraph,
    candidate: KNGraph,
    *,
    seed: int | None = None,
    trials: int | None = None,
    float_check: bool = True,
    allow_non_lax: bool = False,
    coverage: Coverage = "every",
) -> Verdict:
    """Checks whether ``candidate`` computes what ``reference`` computes.

    ``coverage="every"`` (default) compares every output element in every trial: the verdict's
    ``false_accept_bound`` bounds accepting a candidate that differs anywhere. ``"sampled"`` is
    the fast check the search prunes with: its bound is per compared element only.

    Raises ``ValueError`` when the two graphs cannot be compared (different inputs, outputs
    that do not pair up by shape), a path holds two exponentials (unless ``allow_non_lax``) or
    ``coverage`` is neither ``"every"`` nor ``"sampled"``.
    """
    for name, g in (("reference", reference), ("candidate", candidate)):
        if not isinstance(g, KNGraph):
            raise TypeError(f"verify: {name} must be a kernel graph, got {type(g).__name__}")
    if coverage not in ("every", "sampled"):
        raise ValueError(f"verify: coverage must be 'every' or 'sampled', got {coverage!r}")
    d = _core.verify(
        reference._core, candidate._core, seed, trials, float_check, allow_non_lax, coverage
    )
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
        coverage=d["coverage"],
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
