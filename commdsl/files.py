"""Reading and writing the files a user names: every failure is a `CommdslError`.

A path the operating system refuses (too long, a folder, no permission, a full disk)
is a usage error naming the path; a file that is not UTF-8 text is an error of the
file's kind (schedule, machine) with the line and column of the first bad byte.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, TextIO

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


def exists(path: str | Path) -> bool:
    """Whether anything (a file, a folder, a pipe, a device) is at `path`; False where
    the system cannot even look."""
    try:
        return os.path.exists(path)
    except (OSError, ValueError):
        return False


def read_text(path: str | Path, display: str, error: type[CommdslError], what: str = "file") -> str:
    """The UTF-8 text of `path` (or UTF-16 after its byte-order mark, as Windows
    PowerShell's `>` saves a command's output, where the whole file decodes so). `display`
    names the file in messages; a decoding failure raises `error` at the line and column of
    the first byte that is not UTF-8."""
    data = read_bytes(path, display, what)
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        with suppress(UnicodeDecodeError):  # not UTF-16 after all: told as bytes that are not UTF-8, below
            return data.decode("utf-16")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"the {what} is not UTF-8 text: byte {data[e.start]:#04x} cannot be decoded", decode_error_loc(data, e.start, display),
                    hint="save the file as UTF-8") from None  # fmt: skip


def read_bytes(path: str | Path, display: str, what: str = "file") -> bytes:
    """The bytes of the regular file `path`: a folder, a pipe (FIFO), a socket or a
    device is refused without reading it (reading a FIFO would wait for a writer, a
    device might never end); failures are usage errors naming `display`."""
    with open_input(path, display, what, "rb") as f:
        try:
            return f.read()
        except OSError as e:
            raise UsageError(f"cannot read {what} {display}: {_reason(e)}") from None


def open_input(path: str | Path, display: str, what: str = "file", mode: str = "r") -> IO:
    """The regular file `path` open for reading in `mode` ("r": UTF-8 text, lines as
    they are; "rb": bytes), refused as `read_bytes` refuses; failing to open it is a
    usage error naming `display`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, unread
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read {what} {display}: {_reason(e)}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"cannot read {what} {display}: not a regular file (a folder, a pipe or a device)")
        os.set_blocking(fd, True)
        return open(fd, mode) if "b" in mode else open(fd, mode, encoding="utf-8", newline="")  # noqa: SIM115
    except BaseException:
        os.close(fd)
        raise


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


def output_problem(path: str) -> str | None:
    """Why `path` cannot be written as an output file, as a short reason ("Is a
    directory", "the folder x does not exist"), or None where it can: checked before a
    command's work starts, so that minutes of work are not lost to a bad path. A path
    that exists must be a regular file (or a device, a pipe: /dev/null, /dev/stdout)
    that may be written; a new one needs a folder where a file can be made (tried)."""
    if path == "" or "\0" in path:
        return "not a file name"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:  # a symlink loop, a name too long, a component that is not a folder
        return _reason(e)
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            return os.strerror(errno.EISDIR)
        if not os.access(path, os.W_OK):
            return os.strerror(errno.EACCES)
        if stat.S_ISFIFO(st.st_mode):
            # A named pipe opens for writing only once something reads it: with no reader,
            # opening it would block forever.
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError as e:
                return "a pipe that nothing reads" if e.errno == errno.ENXIO else _reason(e)
            return None
        if not stat.S_ISREG(st.st_mode):
            return None  # a device: written in place, as it is
    target = Path(os.path.realpath(path))  # a (dangling) symlink: the file it names
    folder = Path(path).parent  # as the user wrote it, for the message
    if not target.parent.is_dir():
        return f"the folder {folder} does not exist"
    # The writer makes a temporary file beside the target: try that now (permissions,
    # a read-only file system, a name too long for a temporary one's prefix).
    try:
        fd, probe = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=target.parent)
    except OSError as e:
        return _reason(e) if st is None else None  # an existing file is written in place
    os.close(fd)
    os.unlink(probe)
    return None


def check_output_path(flag: str, path: str | None) -> None:
    """Raise a usage error naming `flag` and `path` if `path` cannot be written (see
    `output_problem`); None (the option not given) passes."""
    if path is None:
        return
    if path == "-":  # the Unix "standard output": these outputs are files beside what stdout prints
        raise UsageError(f"{flag} -: give the path of a file to write", hint=f"e.g. {flag} out.json")
    problem = output_problem(path)
    if problem is not None:
        raise UsageError(f"cannot write {flag} {path}: {problem}")


def check_output_folder(flag: str, folder: str | None) -> None:
    """Refuse, before any work, an output folder (one file per rank) that cannot be made: one that is a file, or
    whose nearest existing parent is not a folder."""
    if folder is None:
        return
    if not str(folder).strip():
        raise UsageError(f"{flag} {folder!r}: not a folder name", hint=f"e.g. {flag} traces/")
    path = Path(folder)
    try:
        if path.exists() and not path.is_dir():
            raise UsageError(f"{flag} {folder}: a file of that name exists; give a folder", hint=f"e.g. {flag} traces/")
        parent = next((p for p in path.parents if p.exists()), None)  # as the user wrote it, for the message
    except OSError as e:  # e.g. a name too long to look up
        raise UsageError(f"cannot make {flag} {folder}: {e.strerror or e}") from None
    if parent is not None and not parent.is_dir():
        raise UsageError(f"{flag} {folder}: {parent} is not a folder")
    # The folders missing are made and removed again: what the system refuses (a read-only
    # place, /proc, no permission) is found before the work, not after it. Every rank of a
    # run checks the same folder at once: one made meanwhile by another is no error, and
    # one another rank has put its own folder in (or removed) stays as it is.
    missing = [p for p in (path, *path.parents) if not p.exists()][::-1]
    made: list[Path] = []
    try:
        for p in missing:
            try:
                p.mkdir()
            except FileExistsError:
                if p.is_dir():
                    continue
                raise
            made.append(p)
    except OSError as e:
        raise UsageError(f"cannot make {flag} {folder}: {e.strerror or e}") from None
    finally:
        for p in reversed(made):
            try:
                p.rmdir()
            except OSError:
                pass


def check_output_format(flag: str, out: str | None, source: str, writes: str, wrong_suffixes: tuple[str, ...]) -> None:
    """Refuse, before any work, an output that is the command's own input `source` (it would
    be overwritten by another format) or whose suffix names another format than the one
    it `writes` (a schedule written to `.csv`)."""
    if out is None:
        return
    try:
        same = Path(source).is_file() and Path(out).exists() and os.path.samefile(source, out)
    except OSError:
        same = False
    if same:
        raise UsageError(f"{flag} {out} is the input file: writing {writes} there would replace it", hint=f"give another {flag} file")
    if Path(out).suffix.lower() in wrong_suffixes:
        raise UsageError(f"{flag} {out}: this writes {writes}, not a {Path(out).suffix} file",
                         hint=f"name the output for what it holds, e.g. {flag} {Path(out).with_suffix(_SUFFIX_OF[writes]).name}")  # fmt: skip


_SUFFIX_OF = {"a schedule (YAML)": ".yaml", "a pipelining CSV": ".csv"}
"""The suffix `check_output_format`'s hint gives an output of each kind."""


class OutputPath(argparse.Action):
    """An argparse action for an option naming an output file
    (`add_argument("--out", action=OutputPath)`): the path, checked as the command line
    is read (`check_output_path`), so that a bad one stops the command before any work
    with one message naming the option as the user wrote it."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
        check_output_path(option_string or self.dest, values)  # type: ignore[arg-type]
        setattr(namespace, self.dest, values)


_TEMP_PREFIX = ".commdsl-"
"""Start of the names of the temporary files outputs are written to before they are renamed."""


@contextmanager
def output_file(path: str | Path, flag: str) -> Iterator[TextIO]:
    """An output file a command's `flag` named, open for writing piece by piece; failing
    to open, write or close it is a usage error naming `flag` and the path. A regular
    file is written to a temporary file beside it and renamed over it once complete, so
    a failure (a full disk, Ctrl-C) leaves what was there before, never a file cut short;
    a device or a pipe is written in place."""
    target = Path(os.path.realpath(path))
    try:
        in_place = target.exists() and not target.is_file()
        if in_place:
            out = open(path, "w")  # noqa: SIM115 -- closed below, its errors reported
            temp = None
        else:
            fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=".tmp", dir=target.parent)
            os.fchmod(fd, 0o666 & ~_umask())  # as open() would make it, not mkstemp's 0600
            out = os.fdopen(fd, "w")
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot write {flag} {path}: {_reason(e)}") from None
    try:
        with out:
            yield out
        if temp is not None:
            os.replace(temp, target)
            temp = None
    except OSError as e:
        raise UsageError(f"cannot write {flag} {path}: {_reason(e)}") from None
    finally:
        if temp is not None:  # failed or interrupted: the target keeps what it had
            with suppress(OSError):
                os.unlink(temp)


def _umask() -> int:
    """The process's file-mode creation mask (read by setting it, then set back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _reason(e: Exception) -> str:
    """The system's reason without repeating the (maybe very long) file name."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)
