"""Progress of long work, on stderr, so that `--json` on stdout stays clean.

On a terminal a rich progress bar (transient: it disappears when the work is done).
Otherwise (a pipe, a file, a Slurm log) one plain line every `interval_s` seconds, and a
last line with the total time if any line was printed, so short commands print nothing:

    commdsl simulate: simulating: 41,216 of 97,280 ops (42%), 5 s

Every long command uses one `Progress`: it names phases (`phase`), each with an optional
total that `advance` and `update` move towards. The interval comes from the environment
(`PROGRESS_INTERVAL_ENV`; `0` turns progress off), so that tests and logs can pick it.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from types import TracebackType
from typing import TextIO

from commdsl.errors import UsageError

PROGRESS_INTERVAL_ENV = "COMMDSL_PROGRESS_INTERVAL_S"
"""Environment variable: seconds between two progress lines when stderr is not a
terminal (default `DEFAULT_INTERVAL_S`); 0 turns progress off, on a terminal too."""
DEFAULT_INTERVAL_S = 5.0


def interval_from_environ() -> float:
    """`PROGRESS_INTERVAL_ENV` as seconds (0: off), or the default where it is not set."""
    text = os.environ.get(PROGRESS_INTERVAL_ENV, "").strip()
    if not text:
        return DEFAULT_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise UsageError(f"{PROGRESS_INTERVAL_ENV}={text!r}: give the seconds between progress lines, a number >= 0 "
                         "(0 turns progress off)")  # fmt: skip
    return value


class Progress:
    """One command's progress (a context manager; see the module doc)."""

    def __init__(self, command: str, *, enabled: bool = True, stream: TextIO | None = None, interval_s: float | None = None):
        """`command` starts every plain line; `enabled` False (e.g. on ranks other than
        0) makes every call a no-op; `interval_s` None reads the environment."""
        self.command = command
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_from_environ() if interval_s is None else interval_s
        self.enabled = enabled and self.interval_s > 0
        self.description = ""
        self.total: float | None = None
        self.completed = 0.0
        self.unit = ""
        self._start = time.monotonic()
        self._lines = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rich = None
        self._task = None

    # ---- the work's side ----------------------------------------------------------------

    def phase(self, description: str, total: float | None = None, unit: str = "") -> None:
        """Start a phase of the work: `total` units to do (None: unknown, a spinner)."""
        with self._lock:
            self.description, self.total, self.completed, self.unit = description, total, 0.0, unit
        if self._rich is not None:
            self._rich.remove_task(self._task)  # a fresh task: a total of None (unknown) cannot be set by update
            self._task = self._rich.add_task(description, total=total)

    def update(self, completed: float, total: float | None = None) -> None:
        """Set the phase's units done (and its total, where it was not known or changed):
        the signature of `commdsl.sim.simulate`'s progress callback."""
        with self._lock:
            self.completed = completed
            if total is not None:
                self.total = total
        if self._rich is not None:
            self._rich.update(self._task, completed=completed, total=total)

    def advance(self, amount: float = 1.0, description: str | None = None) -> None:
        """Add `amount` units done to the phase, and say what is being done now."""
        with self._lock:
            self.completed += amount
            if description is not None:
                self.description = description
            completed = self.completed
        if self._rich is not None:
            self._rich.update(self._task, completed=completed, description=description)

    # ---- display ------------------------------------------------------------------------

    def __enter__(self) -> Progress:
        if not self.enabled:
            return self
        self._start = time.monotonic()
        if _is_terminal(self.stream):
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._rich = RichProgress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), console=Console(file=self.stream), transient=True,
                                      redirect_stdout=False, redirect_stderr=False)  # fmt: skip
            self._task = self._rich.add_task(self.description, total=self.total, completed=self.completed)
            self._rich.start()
        else:
            self._thread = threading.Thread(target=self._report, name="commdsl-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            if self._lines and exc_type is None:
                self._print(f"{self.command}: done, {_seconds(time.monotonic() - self._start)}")

    def line(self) -> str:
        """The plain progress line for the state right now."""
        with self._lock:
            description, total, completed, unit = self.description, self.total, self.completed, self.unit
        where = f"{self.command}: {description}" if description else self.command
        if total:
            what = f" {unit}" if unit else ""
            where += f": {completed:,.0f} of {total:,.0f}{what} ({100 * completed / total:.0f}%)"
        return f"{where}, {_seconds(time.monotonic() - self._start)}"

    def _report(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._print(self.line())

    def _print(self, text: str) -> None:
        try:
            print(text, file=self.stream, flush=True)
        except (OSError, ValueError):  # stderr closed (a pipe's reader left): progress is best effort
            self._stop.set()
            return
        self._lines += 1


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
