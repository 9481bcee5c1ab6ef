"""The grammar's parse tables, kept between processes in a file that cannot run code.

Building lark's LALR tables is most of a small command's start-up, so they are kept in
the user's cache folder. lark's own cache (`Lark(cache=...)`) unpickles part of its file
before it compares the grammar's digest, so a file planted there would run code on a
plain `commdsl check`. This cache reads its file only when all of these hold, and else
rebuilds the tables (a missing, damaged, foreign or stale file never changes a result):

- the folder and the file belong to the user and nobody else may write them (the folder
  is made 0700, the file 0600, written beside and renamed into place);
- the file starts with this format's header and the digest of the grammar, the parser
  options, lark's and Python's versions;
- its body unpickles with *no* globals at all (`_TablesUnpickler`): lark's tables are
  plain dicts, lists, strings and numbers, and without a global no callable can be
  named, so nothing in the file can be called while it loads.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import stat
import sys
import tempfile
from contextlib import suppress
from pathlib import Path

import lark
from lark import Lark
from lark.grammar import Rule
from lark.lark import _LOAD_ALLOWED_OPTIONS
from lark.lexer import TerminalDef

_MAGIC = b"commdsl-parse-tables 1 "
"""First bytes of a cache file, before the digest and a newline."""
MAX_CACHE_BYTES = 16 << 20
"""Largest cache file read (the tables are about 80 kB); a larger one is rebuilt."""


class _TablesUnpickler(pickle.Unpickler):
    """Unpickles plain data only: every global (class, function) is refused, so no
    object of a file's choosing can be made or called."""

    def find_class(self, module: str, name: str):  # type: ignore[override]
        raise pickle.UnpicklingError(f"the parse-table cache names {module}.{name}; it holds plain data only")


def cache_folder() -> Path | None:
    """The user's private cache folder for commdsl (`XDG_CACHE_HOME`/commdsl, else
    ~/.cache/commdsl), made 0700; None where it cannot be made or is not private (owned
    by another user, or writable by others)."""
    try:
        folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "commdsl"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(folder, follow_symlinks=False)
    except (OSError, RuntimeError, ValueError):  # no home folder, not writable, a NUL in the variable
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return folder


def lark_parser(grammar: str, start: str, **options) -> Lark:
    """`Lark(grammar, parser="lalr", start=start, **options)`, its tables read from the
    cache when a trusted file for exactly this grammar and these options is there, else
    built and written there."""
    digest = tables_digest(grammar, start, options)
    folder = cache_folder()
    path = folder / f"grammar-{start}-py{sys.version_info[0]}{sys.version_info[1]}-lark{lark.__version__}.tables" if folder else None
    if path is not None:
        data = read_tables(path, digest)
        if data is not None:
            try:
                return Lark.__new__(Lark)._load(data, **{k: v for k, v in options.items() if k in _LOAD_ALLOWED_OPTIONS})
            except Exception:  # noqa: BLE001 -- tables another lark wrote, or damaged: built afresh below
                pass
    parser = Lark(grammar, parser="lalr", start=start, **options)
    if path is not None:
        write_tables(path, digest, parser)
    return parser


def tables_digest(grammar: str, start: str, options: dict) -> str:
    """SHA-256 of what the tables depend on: the grammar, the start rule, the options
    (an object's by its class), lark's and Python's versions."""
    described = sorted((k, v if isinstance(v, (str, int, bool, type(None))) else type(v).__qualname__) for k, v in options.items())
    text = f"{grammar}\0{start}\0{described}\0{lark.__version__}\0{sys.version_info[:2]}"
    return hashlib.sha256(text.encode()).hexdigest()


def read_tables(path: Path, digest: str) -> dict | None:
    """The tables in `path` if it is the user's own regular file, nobody else may write,
    with this format's header and `digest`, holding plain data; else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with open(fd, "rb") as f:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022 or st.st_size > MAX_CACHE_BYTES:
                return None
            data = f.read(MAX_CACHE_BYTES + 1)
        except OSError:
            return None
    header, _, body = data.partition(b"\n")
    if header != _MAGIC + digest.encode():
        return None
    try:
        tables = _TablesUnpickler(io.BytesIO(body)).load()
    except Exception:  # noqa: BLE001 -- any damage (or a global named) means: rebuild
        return None
    return tables if isinstance(tables, dict) else None


def write_tables(path: Path, digest: str, parser: Lark) -> None:
    """Write `parser`'s tables to `path` (0600, through a temporary file renamed into
    place, so a reader never sees half a file); a failure only means no cache."""
    data, memo = parser.memo_serialize([TerminalDef, Rule])
    data["options"] = {k: v for k, v in data["options"].items() if k not in _LOAD_ALLOWED_OPTIONS}
    body = pickle.dumps({"data": data, "memo": memo}, protocol=pickle.HIGHEST_PROTOCOL)
    temp = None
    try:
        fd, temp = tempfile.mkstemp(prefix=".tables-", dir=path.parent)  # mode 0600
        with open(fd, "wb") as f:
            f.write(_MAGIC + digest.encode() + b"\n" + body)
        os.replace(temp, path)
        temp = None
    except OSError:
        pass
    finally:
        if temp is not None:
            with suppress(OSError):
                os.unlink(temp)
