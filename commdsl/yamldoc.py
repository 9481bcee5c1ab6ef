"""A YAML file as a tree of nodes with positions, read with the safe loader only.

Schedules and machine files are composed (PyYAML's node tree, nothing built from it)
so every error can name the line and column of the value at fault. Whatever PyYAML
cannot read or build becomes the caller's error class at the right place:

  * syntax errors and unacceptable characters, at their mark;
  * nesting deeper than `MAX_DEPTH` (a composer recurses once per level), at the
    first list or mapping past it;
  * a value the safe constructor cannot build (`!!int ""`, `!!bool maybe`, a
    malformed `!!timestamp`, an unknown tag, an integer of 5,000 digits), at the node.
"""

from __future__ import annotations

import re

import yaml
from yaml.constructor import SafeConstructor

from commdsl.errors import CommdslError, SourceLoc
from commdsl.files import source_lines

MAX_DEPTH = 64
"""Deepest nesting of lists and mappings a schedule or machine file may have."""

_ODD_LINE_BREAK = re.compile("\r(?!\n)|[\x85\u2028\u2029]")
"""Line breaks to YAML (a lone carriage return, NEL, the Unicode line and paragraph
separators) that are not line breaks to the op language's parser."""
_MAX_SHOWN = 60
"""Longest scalar text a message repeats."""
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_COLLECTION_TAGS = frozenset({"tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"})


class _TooDeep(Exception):
    def __init__(self, mark: yaml.Mark):
        super().__init__()
        self.mark = mark


class _DepthLimitedLoader(yaml.SafeLoader):
    """The safe loader, composing lists and mappings no deeper than `MAX_DEPTH` (its
    composer recurses once per level, so deeper ones would exhaust Python's stack)."""

    def __init__(self, stream):
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if not isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            return super().compose_node(parent, index)
        if self.depth >= MAX_DEPTH:
            raise _TooDeep(event.start_mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _compose(text: str) -> yaml.Node | None:
    """The node tree of `text`: by libyaml when PyYAML has it (tens of times faster; its
    event parser does not recurse, so the depth is checked on its events first), else by
    PyYAML's own loader, which checks the depth as it composes."""
    if not yaml.__with_libyaml__:
        return yaml.compose(text, Loader=_DepthLimitedLoader)
    try:
        _check_depth(yaml.parse(text, Loader=yaml.CSafeLoader))
    except yaml.YAMLError:
        # Newer libyaml refuses deep flow collections itself (at 1000 levels, scanning
        # ahead), before its events reach MAX_DEPTH: if PyYAML's own parser reaches
        # MAX_DEPTH before any error, that is the error to report, as for any depth.
        try:
            _check_depth(yaml.parse(text, Loader=yaml.SafeLoader))
        except yaml.YAMLError:
            pass
        raise
    return yaml.compose(text, Loader=yaml.CSafeLoader)


def _check_depth(events) -> None:
    """Raise `_TooDeep` at the first list or mapping nested deeper than `MAX_DEPTH`."""
    depth = 0
    for event in events:
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise _TooDeep(event.start_mark)
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1


class YamlDocument:
    """The node tree of one YAML text; `error` is the class of every error it raises."""

    def __init__(self, text: str, file: str, error: type[CommdslError]):
        self.file = file
        self.error = error
        self.lines = source_lines(text)
        self._constructor = SafeConstructor()
        odd = _ODD_LINE_BREAK.search(text)
        if odd:
            # YAML ends lines at these too, Lark and editors do not: the lines would disagree.
            raise error(f"character {_char_text(ord(odd.group()))} is not allowed: end lines with a newline",
                        self._loc_of_offset(text, odd.start()))  # fmt: skip
        try:
            self.root: yaml.Node | None = _compose(text)
        except _TooDeep as e:
            raise error(f"the file nests lists and mappings more than {MAX_DEPTH} deep", self.loc_of_mark(e.mark)) from None
        except yaml.MarkedYAMLError as e:
            raise self._syntax_error(e) from None
        except yaml.reader.ReaderError as e:
            raise error(f"invalid YAML: unacceptable character {_char_text(e.character)}", self._loc_of_offset(text, e.position)) from None
        except yaml.YAMLError as e:
            raise error(f"invalid YAML: {e}", self.file_start()) from None
        self._check_constructible()

    def _syntax_error(self, e: yaml.MarkedYAMLError) -> CommdslError:
        """PyYAML's error where it noticed the problem, which can be lines after the cause (a
        `{` never closed), so with what it was reading and where that starts, shown too."""
        mark = e.problem_mark or e.context_mark
        message = f"invalid YAML: {e.problem or e.context or 'syntax error'}"
        related: tuple[tuple[str, SourceLoc], ...] = ()
        if e.problem and e.context and e.problem_mark and e.context_mark:
            start = self.loc_of_mark(e.context_mark)
            message += f" ({e.context} that starts at {start.line}:{start.column})"
            if start.line != self.loc_of_mark(e.problem_mark).line:
                related = (("where it starts", start),)
        at = self.lines[mark.line][mark.column] if mark and mark.line < len(self.lines) and mark.column < len(self.lines[mark.line]) else ""
        hint = "indent with spaces: YAML does not allow tabs there" if at == "\t" else _syntax_hint(e.problem or "")
        return self.error(message, self.loc_of_mark(mark) if mark else None, related=related, hint=hint)

    # ---- positions ------------------------------------------------------------------

    def file_start(self) -> SourceLoc:
        return SourceLoc(self.file, 1, 1, self.lines[0] if self.lines else "")

    def loc_of_mark(self, mark: yaml.Mark) -> SourceLoc:
        line, column = mark.line + 1, mark.column + 1
        if line > len(self.lines):  # the end of the text (libyaml counts a last line break): after its last line
            line = max(len(self.lines), 1)
            column = len(self.lines[-1]) + 1 if self.lines else 1
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return SourceLoc(self.file, line, column, text)

    def loc(self, node: yaml.Node) -> SourceLoc:
        return self.loc_of_mark(node.start_mark)

    def _loc_of_offset(self, text: str, offset: int) -> SourceLoc:
        line = text.count("\n", 0, offset) + 1
        column = offset - (text.rfind("\n", 0, offset) + 1) + 1
        return SourceLoc(self.file, line, column, self.lines[line - 1] if 0 < line <= len(self.lines) else "")

    # ---- values ---------------------------------------------------------------------

    def construct(self, node: yaml.Node) -> object:
        """The Python value of `node` as the safe loader builds it (every node of the
        document is known to build; see `_check_constructible`)."""
        return self._constructor.construct_object(node, deep=True)

    def scalar_text(self, node: yaml.Node) -> str:
        """The user's text of a node, for messages: a scalar as written (in quotes if YAML
        reads it as text, clipped if long), else its shape."""
        if isinstance(node, yaml.ScalarNode):
            text = node.value if len(node.value) <= _MAX_SHOWN else node.value[: _MAX_SHOWN - 3] + "..."
            if node.tag == "tag:yaml.org,2002:str":
                return f"'{text}'"  # text, not a number: 4e0 is text to YAML
            return f'"{text}"' if node.style in ("'", '"') else text
        return "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"

    # ---- checks ------------------------------------------------------------------------

    def _check_constructible(self) -> None:
        """Build every scalar, and every collection with an explicit tag (`!!set`,
        `!!omap`, an unknown `!tag`), once; the first that fails is an error at its node.
        Aliased nodes are visited once, so an alias bomb costs no more than its text."""
        seen: set[int] = set()
        stack = [self.root] if self.root is not None else []
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, yaml.ScalarNode) or node.tag not in _COLLECTION_TAGS:
                self._try_construct(node)
            if isinstance(node, yaml.SequenceNode):
                stack.extend(reversed(node.value))
            elif isinstance(node, yaml.MappingNode):
                stack.extend(x for pair in reversed(node.value) for x in reversed(pair))

    def _try_construct(self, node: yaml.Node) -> None:
        try:
            self._constructor.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as e:
            value = f" (the value {self.scalar_text(node)})" if isinstance(node, yaml.ScalarNode) else ""
            merge = node.tag == "tag:yaml.org,2002:merge"
            raise self.error(f"invalid YAML value: {e.problem}{value}", self.loc(node),
                             hint="merge keys (`<<: *anchor`) are not read: write the keys out" if merge else None) from None  # fmt: skip
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as e:
            # PyYAML's constructors index and convert the text without checking it first.
            # A date's own reason says which part is wrong; ints' and floats' only repeat Python.
            detail = f" ({e})" if node.tag == _TIMESTAMP_TAG and str(e) else ""
            raise self.error(f"invalid YAML value: {self.scalar_text(node) or 'an empty value'} is not a valid "
                             f"{_tag_name(node.tag)}{detail}", self.loc(node)) from None  # fmt: skip


def _tag_name(tag: str) -> str:
    return "!!" + tag.rsplit(":", 1)[1] if tag.startswith("tag:yaml.org,2002:") else tag


def _char_text(code: int) -> str:
    return f"U+{code:04X}" if isinstance(code, int) else f"'{code}'"


_SYNTAX_HINTS = (
    ("mapping values are not allowed", "a value with ': ' in it needs quotes: `doc: \"MoE layer: 8 experts\"`"),
    ("did not find expected key", "a line is indented more or less than the lines of its block (the first line sets it)"),
    ("expected <block end>", "a line is indented more or less than the lines of its block (the first line sets it)"),
)
"""What to do about PyYAML's commonest problems, by the words of its message (it has no codes)."""


def _syntax_hint(problem: str) -> str | None:
    return next((hint for words, hint in _SYNTAX_HINTS if words in problem), None)

