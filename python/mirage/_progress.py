"""The progress display of long ``superoptimize`` work: one stage after another (the Rust
search, its verification of the cheapest candidates, the every-element confirmation of the
winner, and on a GPU the NVRTC compilation and the timing of the candidates).

A :class:`Reporter` is made active for the duration of one ``superoptimize`` call
(:func:`session`); the code of each stage reaches it through :func:`current` and tells it
where it is (:meth:`Reporter.stage`, :meth:`Reporter.update`). It draws with ``tqdm`` when
that is importable (an optional dependency), else as one line on ``sys.stderr`` redrawn in
place on a terminal (elsewhere, one line at most every second and one at each stage's end).
The inactive reporter draws nothing and costs a function call per update.

Whether to draw: the ``progress`` argument (``True``/``False``); ``None`` reads
``MIRAGE_PROGRESS`` (``1``, ``0``, or ``plain``: on without tqdm) and otherwise draws when
``sys.stderr`` is a terminal. The switch does not change results (``mirage._env``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

__all__ = ["STAGES", "Reporter", "current", "enabled", "say", "session"]

#: The stages in the order they run (those that do not run are skipped).
STAGES: tuple[str, ...] = ("search", "verify", "compile", "profile", "confirm")

#: What a stage counts.
_UNITS: dict[str, str] = {
    "search": "block graphs",
    "verify": "equivalent",
    "compile": "candidates",
    "profile": "candidates",
    "confirm": "candidates",
}

_DESCRIPTIONS: dict[str, str] = {
    "search": "searching µGraphs",
    "verify": "verifying candidates",
    "compile": "compiling (NVRTC)",
    "profile": "profiling on the GPU",
    "confirm": "confirming the winner",
}

#: Least seconds between two redraws of the plain line on a terminal; off a terminal.
_TTY_INTERVAL = 0.1
_LOG_INTERVAL = 1.0


def _env_choice() -> str | None:
    """``MIRAGE_PROGRESS``: "on", "off", "plain" or None (unset or unrecognised)."""
    v = os.environ.get("MIRAGE_PROGRESS", "").strip().lower()
    if v in ("1", "on", "true", "yes"):
        return "on"
    if v in ("0", "off", "false", "no"):
        return "off"
    if v == "plain":
        return "plain"
    return None


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def enabled(progress: bool | None) -> tuple[bool, bool]:
    """Whether to draw for the ``progress`` argument, and whether tqdm may be used."""
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"superoptimize: progress must be True, False or None, got {progress!r}")
    choice = _env_choice()
    if progress is not None:
        return progress, choice != "plain"
    if choice == "plain":
        return True, False
    if choice is not None:
        return choice == "on", True
    return _isatty(sys.stderr), True


def _tqdm_class() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def _fmt_count(n: int) -> str:
    return f"{n:,}"


class Reporter:
    """Where the work of one ``superoptimize`` call is; draws nothing (see :func:`session`
    for the ones that do)."""

    enabled = False

    def __init__(self) -> None:
        #: The stages entered so far, in order.
        self.stages: list[str] = []
        self._stage: str | None = None
        self._t0 = time.perf_counter()
        self._start = self._t0
        self._n = 0
        self._total: int | None = None
        self._info = ""

    # -------------------------------------------------------------- the API
    @property
    def total(self) -> int | None:
        """The current stage's number of steps (None: unknown or no stage)."""
        return self._total if self._stage is not None else None

    def stage(self, name: str, total: int | None = None, info: str | None = None) -> None:
        """Ends the current stage and starts ``name`` with ``total`` steps (None: unknown);
        when ``name`` is the current stage, updates what is given instead."""
        if self._stage == name:
            if total is not None or info is not None:
                self.update(total=total, info=info)
            return
        self.end()
        self._stage, self._n, self._total, self._info = name, 0, total, info or ""
        self._start = time.perf_counter()
        self.stages.append(name)
        self._begin()

    def update(
        self, n: int | None = None, total: int | None = None, info: str | None = None
    ) -> None:
        """Sets the current stage's position ``n``, its ``total`` and its text ``info``."""
        if self._stage is None:
            return
        if n is not None:
            self._n = n
        if total is not None:
            self._total = total
        if info is not None:
            self._info = info
        self._draw(False)

    def advance(self, k: int = 1, info: str | None = None) -> None:
        """Moves the current stage ``k`` steps on."""
        self.update(self._n + k, None, info)

    def end(self) -> None:
        """Ends the current stage (drawn in its final state)."""
        if self._stage is not None:
            self._draw(True)
            self._finish()
            self._stage = None

    def write(self, line: str) -> None:
        """Writes ``line`` to ``sys.stderr`` without breaking the display."""
        print(line, file=sys.stderr)

    def search_tick(self, p: Mapping[str, Any]) -> None:
        """Follows the Rust search (its progress dict: ``mirage._core.search``'s ``tick``)."""
        phase = p.get("phase", "search")
        if phase == "saturate":
            self.stage("search", info="saturating the e-graph")
            return
        if phase == "search" or self._stage == "search" or "search" not in self.stages:
            # The search stage ends with the counters of the first report after it (a search
            # over before the first poll shows its stage from the final report alone).
            self.stage("search")
            info = f"kernel ops {p['kernel_ops']}, states {_fmt_count(p['states'])}"
            self.update(n=int(p["block_graphs"]), info=info)
            if phase == "search":
                return
        if phase == "done" and self._stage != "verify" and "verify" in self.stages:
            return  # the final tick repeats the "done" report a poll already showed
        goal = int(p.get("verify_goal", 0))
        self.stage("verify", total=goal or None)
        self.update(
            n=min(int(p["verified"]), goal) if goal else int(p["verified"]),
            total=goal or None,
            info=f"{_fmt_count(p['candidates'])} candidates, checked {p['checked']}, "
            f"failed {p['verification_failed']}",
        )
        if phase == "done":
            self.end()

    def close(self) -> None:
        """Ends the display."""
        self.end()

    # ----------------------------------------------------- the renderers' hooks
    def _begin(self) -> None:
        pass

    def _draw(self, final: bool) -> None:
        pass

    def _finish(self) -> None:
        pass


class _LineReporter(Reporter):
    """One line on ``stream``: redrawn in place on a terminal, else printed now and then."""

    enabled = True

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self._stream = stream
        self._tty = _isatty(stream)
        self._last = 0.0
        self._shown = False

    def _line(self) -> str:
        assert self._stage is not None
        pos = f"{self._n:,}/{self._total:,}" if self._total else f"{self._n:,}"
        pos += f" {_UNITS.get(self._stage, '')}".rstrip()
        info = f" ({self._info})" if self._info else ""
        el = time.perf_counter() - self._start
        return (
            f"[mirage] {self._stage}: {_DESCRIPTIONS.get(self._stage, self._stage)} "
            f"{pos}{info} {el:.1f}s"
        )

    def _emit(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (ValueError, OSError):  # a closed stream: the display is only a courtesy
            pass

    def _draw(self, final: bool) -> None:
        now = time.perf_counter()
        interval = _TTY_INTERVAL if self._tty else _LOG_INTERVAL
        if not final and self._shown and now - self._last < interval:
            return
        if not final and not self._tty and now - self._start < interval:
            return  # off a terminal a short stage is printed once, at its end
        self._last = now
        if self._tty:
            self._emit(f"\r{self._line()}\x1b[K" + ("\n" if final else ""))
            self._shown = not final
        else:
            self._emit(self._line() + "\n")

    def write(self, line: str) -> None:
        if self._tty and self._shown:
            self._emit(f"\r\x1b[K{line}\n")
            self._last = 0.0
            self._draw(False)
        else:
            self._emit(line + "\n")


class _TqdmReporter(Reporter):
    """One tqdm bar per stage, on ``sys.stderr``."""

    enabled = True

    def __init__(self, tqdm: Any, stream: TextIO) -> None:
        super().__init__()
        self._tqdm = tqdm
        self._stream = stream
        self._bar: Any = None

    def _begin(self) -> None:
        assert self._stage is not None
        self._bar = self._tqdm(
            total=self._total,
            desc=f"mirage {self._stage}",
            unit=f" {_UNITS.get(self._stage, 'steps')}",
            file=self._stream,
            leave=True,
            mininterval=_TTY_INTERVAL,
            dynamic_ncols=True,
        )

    def _draw(self, final: bool) -> None:
        bar = self._bar
        if bar is None:
            return
        if self._total is not None and bar.total != self._total:
            bar.total = self._total
        if self._info:
            bar.set_postfix_str(self._info, refresh=False)
        if self._n != bar.n:
            bar.update(self._n - bar.n)
        if final:
            bar.refresh()

    def _finish(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def write(self, line: str) -> None:
        self._tqdm.write(line, file=self._stream)


_NULL = Reporter()
_current: contextvars.ContextVar[Reporter] = contextvars.ContextVar(
    "mirage_progress", default=_NULL
)


def current() -> Reporter:
    """The reporter of the ``superoptimize`` call running now (one that draws nothing
    outside such a call or when the display is off)."""
    return _current.get()


def say(line: str) -> None:
    """Writes a ``verbose`` line to ``sys.stderr`` through the current display."""
    current().write(line)


def make(progress: bool | None) -> Reporter:
    """The reporter for the ``progress`` argument (see the module's header)."""
    on, tqdm_ok = enabled(progress)
    if not on:
        return Reporter()
    tqdm = _tqdm_class() if tqdm_ok else None
    if tqdm is not None:
        return _TqdmReporter(tqdm, sys.stderr)
    return _LineReporter(sys.stderr)


@contextlib.contextmanager
def session(progress: bool | None) -> Iterator[Reporter]:
    """Makes the reporter for ``progress`` current while the block runs, then closes it."""
    rep = make(progress)
    token = _current.set(rep)
    try:
        yield rep
    finally:
        rep.close()
        _current.reset(token)
