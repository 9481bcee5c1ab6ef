"""Reading and writing the files a user names: every failure is a `CommdslError`.

A path the operating system refuses (too long, a folder, no permission, a full disk)
is a usage error naming the path; a file that is not UTF-8 text is an error of the
file's kind (schedule, machine) with the line and column of the first bad byte.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from commdsl.errors import CommdslError, SourceLoc, UsageError


def source_lines(text: str) -> tuple[str, ...]:
    """The lines of a text as commdsl numbers them (and editors do): separated by "\n",
    a "\r" before it dropped. Unlike `str.splitlines`, no other character ends a line."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return tuple(line[:-1] if line.endswith("\r") else line for line in lines)


def is_file(path: str | Path) -> bool:
    """Whether `path` names a regular file; False where the system cannot even look
    (a name too long, a component that is not a folder)."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        return False


def read_text(path: str | Path, display: str, error: type[CommdslError], what: str = "file") -> str:
    """The UTF-8 text of `path`. `display` names the file in messages; a decoding failure
    raises `error` at the line and column of the first byte that is not UTF-8."""
    try:
        data = Path(path).read_bytes()
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read {what} {display}: {_reason(e)}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"the {what} is not UTF-8 text: byte {data[e.start]:#04x} cannot be decoded", decode_error_loc(data, e.start, display),
                    hint="save the file as UTF-8") from None  # fmt: skip


def decode_error_loc(data: bytes, offset: int, display: str) -> SourceLoc:
    """Line and column (in characters) of byte `offset` of `data`, with that line's text
    (undecodable bytes shown as U+FFFD)."""
    start = data.rfind(b"\n", 0, offset) + 1
    end = data.find(b"\n", offset)
    line_bytes = data[start : end if end >= 0 else len(data)]
    column = len(data[start:offset].decode("utf-8", errors="replace")) + 1
    text = line_bytes.decode("utf-8", errors="replace").rstrip("\r")
    return SourceLoc(display, data.count(b"\n", 0, offset) + 1, column, text)


def write_text(path: str | Path, text: str, flag: str) -> None:
    """Write an output file a command's `flag` named; failures are usage errors."""
    with output_file(path, flag) as out:
        out.write(text)


@contextmanager
def output_file(path: str | Path, flag: str) -> Iterator[TextIO]:
    """An output file a command's `flag` named, open for writing piece by piece; failing
    to open, write or close it is a usage error."""
    try:
        out = open(path, "w")  # noqa: SIM115 -- closed below, its errors reported
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot write {flag} {path}: {_reason(e)}") from None
    try:
        with out:
            yield out
    except OSError as e:
        raise UsageError(f"cannot write {flag} {path}: {_reason(e)}") from None


def _reason(e: Exception) -> str:
    """The system's reason without repeating the (maybe very long) file name."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)
