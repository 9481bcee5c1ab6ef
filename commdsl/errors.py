"""One error hierarchy for everything a user can get wrong.

Every error a user can cause is a `CommdslError`. The CLI catches exactly this class,
prints `format()` and exits with the error's `exit_code`: 1 schedule (and machine, run)
errors, 2 usage errors, 3 deadlocks, 5 a rank out of device memory (`commdsl compare`
exits 4 when the makespan error exceeds --max-error). Anything else
escaping is a bug in commdsl. Errors carry source locations (file, line, column, the line's text) so
the message can show the line with a caret, the way compilers do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLoc:
    """A position in a schedule file, 1-based, with the text of that line."""

    file: str
    """Path of the file as the user named it."""
    line: int
    """1-based line number in the file (not in the `program:` block)."""
    column: int
    """1-based column."""
    text: str = ""
    """The full text of the line, for the caret display."""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


def did_you_mean(name: str, choices: Iterable[str], cutoff: float = 0.6) -> str | None:
    """A "did you mean 'x'?" hint when `name` is close to one of `choices` (difflib's
    similarity at least `cutoff`)."""
    import difflib  # only a mistake needs it, and every command imports this module

    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=cutoff)
    return f"did you mean '{close[0]}'?" if close else None


class CommdslError(Exception):
    """Base class of every error a user can cause. `exit_code` is the CLI exit status."""

    exit_code = 1
    kind = "error"

    def __init__(
        self,
        message: str,
        loc: SourceLoc | None = None,
        *,
        hint: str | None = None,
        rank: int | None = None,
        related: tuple[tuple[str, SourceLoc], ...] = (),
    ):
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.hint = hint
        self.rank = rank
        self.related = related
        """Further locations worth showing, each with a short label."""

    def __str__(self) -> str:
        where = f"{self.loc}: " if self.loc else ""
        return f"{where}{self.message}"

    def format(self) -> str:
        """The one-screen message the CLI prints: every line of it short, however long
        the user's line or names (source lines are clipped around the caret)."""
        lines = [f"{self.kind}: {_clip(self.message)}"]
        if self.loc is not None:
            lines += _snippet(self.loc, "", self.rank)
        for label, loc in self.related:
            lines += _snippet(loc, label, None)
        if self.hint:
            lines.append(f"hint: {_clip(self.hint)}")
        return "\n".join(lines)


SNIPPET_WIDTH = 100
"""Most characters of a source line an error shows; a longer line is clipped around the caret."""
MAX_LINE_CHARS = 600
"""Most characters of a line of a message or hint an error shows; the middle of a longer
line is left out (a name or value the user wrote may be that long)."""


def printable(text: str) -> str:
    """`text` (a name, a value, a path, a line a user wrote) with every character a
    terminal would act on written as an escape instead: control characters (ESC starts
    the sequences that recolour, move the cursor or retitle the window; a newline or
    carriage return would fake a line of output), C1 controls, format characters such as
    bidirectional overrides, line and paragraph separators (a tab is kept). Everything commdsl prints
    from user input goes through this (error messages, `check`, `show`, `simulate`)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == "\t" else _escaped(c) for c in text)


def _escaped(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape_markup(text: str) -> str:
    """`printable(text)` with rich's markup escaped too (a user's "[bold]" printed as
    written), for text printed through a rich console."""
    from rich.markup import escape  # only the commands that print with rich need it

    return escape(printable(text))


def _clip(text: str) -> str:
    return "\n".join(_clip_line(printable(line)) for line in text.split("\n"))


def _clip_line(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    keep = MAX_LINE_CHARS // 2
    return f"{line[:keep]} ... ({len(line) - 2 * keep:,} characters left out) ... {line[-keep:]}"


def _snippet(loc: SourceLoc, label: str, rank: int | None) -> list[str]:
    suffix = f" (rank {rank})" if rank is not None else ""
    head = f"  --> {_clip(str(loc))}{suffix}" + (f"  {label}" if label else "")
    if not loc.text:
        return [head]
    number = str(loc.line)
    pad = " " * len(number)
    caret_col = max(loc.column - 1, 0)
    # One character shown per character of the line (so the caret stays under its own),
    # none that a terminal would act on: a line separator would break the display.
    text = "".join(c if c.isprintable() or c == "\t" else "\ufffd" for c in loc.text)
    if len(text) > SNIPPET_WIDTH:
        # A window of the line around the caret, with "..." where it was cut.
        start = min(max(caret_col - SNIPPET_WIDTH // 2, 0), max(len(text) - SNIPPET_WIDTH, 0))
        end = start + SNIPPET_WIDTH
        left, right = ("..." if start > 0 else ""), ("..." if end < len(text) else "")
        caret_col = caret_col - start + len(left)
        text = left + text[start:end] + right
    # Keep tabs in the gutter so the caret lines up under the same character.
    lead = "".join(c if c == "\t" else " " for c in text[:caret_col])
    return [head, f"{pad} |", f"{number} | {text}", f"{pad} | {lead}^"]


class ScheduleError(CommdslError):
    """The schedule file is wrong: YAML, syntax, names, types, matching, limits."""

    kind = "schedule error"


class ValidationError(ScheduleError):
    """The schedule parses and expands, but ranks disagree (matching, collectives)."""


class LimitError(ScheduleError):
    """The schedule would expand past a configured limit."""


class MachineError(CommdslError):
    """The machine description is wrong."""

    kind = "machine error"


class LogError(CommdslError):
    """A measurement log (nccl-tests output) that cannot be read: truncated, another
    tool's output, or runs that do not belong together."""

    kind = "log error"


class DeadlockError(CommdslError):
    """Nothing can progress but ops remain."""

    exit_code = 3
    kind = "deadlock"


class MemoryExceededError(CommdslError):
    """A rank's live buffers (`alloc`) exceed its device's memory."""

    exit_code = 5
    kind = "out of memory"


class OutputError(CommdslError):
    """Standard output cannot be written (a full disk)."""

    kind = "output error"


class UsageError(CommdslError):
    """The command line is wrong: an unknown file, bad -p syntax, a bad option value."""

    exit_code = 2
    kind = "usage error"


def require_output_folder(flag: str, path: str | None) -> None:
    """A command's output file must be one it can write: checked at start, as outputs
    are written only after minutes of work (a run, a calibration). See
    `commdsl.files.check_output_path`, which this is."""
    from commdsl.files import check_output_path  # files imports this module

    check_output_path(flag, path)
