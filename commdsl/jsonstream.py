"""Read a large JSON object a piece at a time, with the line and column of each piece.

A timeline file is one JSON object whose "traceEvents" array holds hundreds of
thousands of events; `json.loads` of a 200 MB one builds the whole tree at once (GBs).
`ObjectStream` reads the text in chunks and decodes one value at a time with the
standard decoder (`JSONDecoder.raw_decode`): the members of the top-level object, and
the elements of the arrays the caller names one by one, so what is held at once is a
chunk of text and the element being read. Every value comes with its position, so a
value that is wrong can be reported at its line and column.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import NamedTuple, TextIO

CHUNK_CHARS = 1 << 20
"""Characters read at a time (a value longer than that is read in growing chunks)."""


class JsonStreamError(ValueError):
    """The text is not the JSON expected, at `line`, `column` (1-based)."""

    def __init__(self, message: str, line: int, column: int):
        super().__init__(message)
        self.message, self.line, self.column = message, line, column


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


_STRICT = json.JSONDecoder(parse_constant=_no_constant)
"""The standard decoder, refusing NaN, Infinity and -Infinity (Python's extension to JSON):
for the elements of streamed arrays (a trace's events)."""
_LENIENT = json.JSONDecoder()
"""The standard decoder as `json.loads` is, for the other members (a timeline's meta
holds a machine's infinite bandwidths as Infinity, as `json.dumps` writes them)."""
_WHITESPACE = " \t\n\r"


class Place(NamedTuple):
    """Where a value starts: 1-based line and column (a tuple: one is made per element
    streamed)."""

    line: int
    column: int


class ObjectStream:
    """One JSON object read from `source` member by member (`members`)."""

    def __init__(self, source: TextIO):
        self._source = source
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._line = 1
        """Line of the character at `_mark`."""
        self._line_start = 0
        """Offset in `_buf` where that line starts (negative: in text already dropped)."""
        self._mark = 0
        """Offset in `_buf` up to which lines are counted."""
        self.others: dict[str, object] = {}
        """The members read whole so far (`members`)."""

    # ---- positions and the buffer ----------------------------------------------------------

    def place(self) -> Place:
        """Where the next character is (lines counted once, from the last place asked)."""
        lines = self._buf.count("\n", self._mark, self._pos)
        if lines:
            self._line += lines
            self._line_start = self._buf.rfind("\n", self._mark, self._pos) + 1
        self._mark = self._pos
        return Place(self._line, self._pos - self._line_start + 1)

    def _fill(self, want: int = CHUNK_CHARS) -> bool:
        """Drop what has been read, add up to `want` characters; False at the end."""
        if self._eof:
            return False
        self.place()
        chunk = self._source.read(want)
        self._buf = self._buf[self._pos :] + chunk
        self._line_start -= self._pos
        self._pos = self._mark = 0
        if not chunk:
            self._eof = True
        return bool(chunk)

    def _fail(self, message: str) -> JsonStreamError:
        p = self.place()
        return JsonStreamError(message, p.line, p.column)

    def _peek(self) -> str:
        """The next character that is not whitespace ("" at the end), not consumed."""
        while True:
            while self._pos < len(self._buf) and self._buf[self._pos] in _WHITESPACE:
                self._pos += 1
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return ""

    def _expect(self, chars: str, what: str) -> str:
        c = self._peek()
        if not c or c not in chars:
            raise self._fail(f"expected {what}, found {repr(c) if c else 'the end of the file'}")
        self._pos += 1
        return c

    def value(self, strict: bool = True) -> object:
        """Decode the next value whole (reading more text while it is cut off); `strict`:
        NaN and Infinity are errors."""
        decoder = _STRICT if strict else _LENIENT
        self._peek()
        want = CHUNK_CHARS
        while True:
            try:
                value, end = decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as e:
                # Cut off by the chunk's end: read on, in growing chunks, and decode again.
                if not self._eof and (e.pos >= len(self._buf) - 64 or e.msg.startswith("Unterminated")):
                    want *= 2
                    self._fill(want)
                    continue
                self._pos = e.pos
                raise self._fail(e.msg) from None
            except RecursionError:
                raise self._fail("the JSON nests too deeply") from None
            except ValueError as e:  # NaN or Infinity, or an integer of more than 4,300 digits
                raise self._fail(str(e).split(";")[0]) from None
            if end >= len(self._buf) and not self._eof:
                # A number may go on past the chunk (12 | 34): decode it again with more.
                if self._fill(want):
                    continue
            self._pos = end
            return value

    # ---- the object ------------------------------------------------------------------------

    def members(self, streamed: frozenset[str], element: Callable[[str, object, Place], None]) -> dict[str, object]:
        """Read the object: a member named in `streamed` must be an array, each of its
        elements passed to `element(name, value, place)` as it is read; the others are
        returned, decoded whole (and are in `self.others` as soon as each is read, for
        `element` to consult). Anything after the object is an error."""
        others = self.others
        self._expect("{", "a JSON object '{'")
        if self._peek() == "}":
            self._pos += 1
        else:
            while True:
                key = self.value()
                if not isinstance(key, str):
                    raise self._fail("an object's key must be a string")
                self._expect(":", "':'")
                if key in streamed:
                    for place, value in self._elements(key):
                        element(key, value, place)
                else:
                    others[key] = self.value(strict=False)
                if self._expect(",}", "',' or '}'") == "}":
                    break
        if self._peek():
            raise self._fail("text after the JSON object")
        return others

    def _elements(self, key: str) -> Iterator[tuple[Place, object]]:
        self._expect("[", f"an array '[' for \"{key}\"")
        if self._peek() == "]":
            self._pos += 1
            return
        while True:
            self._peek()
            place = self.place()
            yield place, self.value()
            if self._expect(",]", "',' or ']'") == "]":
                return
