"""Parse the op language with the Lark grammar in grammars/commdsl.lark.

Positions Lark reports are relative to the `program:` text; `TextOrigin` maps them back
to the YAML file's real lines and columns so every message points into the file the
user edits.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from dataclasses import dataclass

from lark import Lark, Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.indenter import DedentError, Indenter

from commdsl.dsl.parse_cache import lark_parser
from commdsl.dsl.values import UNIT_SUFFIXES
from commdsl.errors import ScheduleError, SourceLoc, did_you_mean
from commdsl.resources import grammar_path


@dataclass(frozen=True)
class TextOrigin:
    """Where a piece of text (the program block, a param value) sits in its file."""

    file: str
    """The file as the user named it."""
    file_lines: tuple[str, ...]
    """All lines of the file, for the caret display."""
    first_line: int
    """File line (1-based) holding the text's first line."""
    column_offset: int
    """Columns to add to a column on the text's first line (and, for block scalars,
    on every line: the block's indentation)."""
    block: bool = True
    """True for a YAML block scalar, where every line is shifted by the indentation."""
    exact: bool = True
    """False when positions inside the text cannot be mapped (a quoted scalar with
    escapes, or one folded over several lines): every position maps to its start."""

    def loc(self, line: int, column: int) -> SourceLoc:
        """Map a 1-based (line, column) in the text to the file."""
        if not self.exact:
            line, column = 1, 1
        file_line = self.first_line + line - 1
        col = column + (self.column_offset if (self.block or line == 1) else 0)
        text = self.file_lines[file_line - 1] if 0 < file_line <= len(self.file_lines) else ""
        return SourceLoc(self.file, file_line, col, text)


_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_name(text: str) -> bool:
    """Whether `text` is a name of the op language (the grammar's NAME: ASCII letters,
    digits and _, not starting with a digit), so a program can refer to it."""
    return _NAME_RE.fullmatch(text) is not None


class _ProgramIndenter(Indenter):
    NL_type = "_NL"
    OPEN_PAREN_types = ["LPAR", "LSQB"]
    CLOSE_PAREN_types = ["RPAR", "RSQB"]
    INDENT_type = "_INDENT"
    DEDENT_type = "_DEDENT"
    tab_len = 8


@functools.cache
def _lark() -> Lark:
    # Built once per process (its tables kept between processes: parse_cache); the Lark
    # object is not mutated after construction.
    return lark_parser(grammar_path().read_text(), "start", postlex=_ProgramIndenter(), propagate_positions=True, maybe_placeholders=True)


@functools.cache
def _expression_lark() -> Lark:
    return lark_parser(grammar_path().read_text(), "expr", propagate_positions=True, maybe_placeholders=True)


# Human names for the grammar's terminals, used in "expected ..." messages.
_TERMINAL_NAMES = {
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "QUANTITY": "a quantity such as 32MiB or 2ms",
    "DTYPE": "a dtype such as bf16[n]",
    "COMP_OP": "a comparison",
    "ADD_OP": "'+' or '-'",
    "MUL_OP": "'*', '/', '//' or '%'",
    "P2P_KIND": "send/recv/isend/irecv",
    "COLLECTIVE_KIND": "a collective",
    "PEER_DIR": "'to' or 'from'",
    "_NL": "end of line",
    "_INDENT": "an indented block",
    "_DEDENT": "end of block",
    "$END": "end of program",
    "HOST": "'host'",
}


_OP_STARTS = frozenset({
    "COMPUTE", "HOST", "COPY", "SEND", "RECV", "ISEND", "IRECV", "ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER",
    "ALL_TO_ALL", "BROADCAST", "REDUCE", "GATHER", "SCATTER", "BARRIER", "WAIT", "RECORD", "SYNCHRONIZE",
})  # fmt: skip
_STATEMENT_STARTS = frozenset({"IF", "FOR", "DEF", "BATCH", "ON", "PASS", "ASSERT"})
_EXPRESSION_STARTS = frozenset({"INT", "FLOAT", "QUANTITY", "DTYPE", "LPAR", "MINUS", "PLUS", "NOT", "TRUE", "FALSE"})


def _describe_expected(parser: Lark, names: set[str]) -> str:
    described = set()
    names = set(names)
    if len(names & _OP_STARTS) >= 5:
        statement = "IF" in names
        names -= _OP_STARTS | _STATEMENT_STARTS if statement else _OP_STARTS
        if statement:
            names.discard("NAME")
        described.add("a statement" if statement else "an op")
    if {"INT", "QUANTITY"} <= names:
        names -= _EXPRESSION_STARTS | {"NAME"}
        described.add("an expression")
    for name in names:
        if name in _TERMINAL_NAMES:
            described.add(_TERMINAL_NAMES[name])
            continue
        try:
            pattern = parser.get_terminal(name).pattern
        except KeyError:
            described.add(name)
            continue
        described.add(f"'{pattern.value}'" if pattern.type == "str" else name)
    items = sorted(described)
    if len(items) > 8:
        items = items[:8] + ["..."]
    return ", ".join(items)


def _char_text(char: str) -> str:
    """A character for a message: itself in quotes if printable, else its code point."""
    return f"'{char}'" if char.isprintable() and char else f"U+{ord(char):04X}" if char else "end of text"


def _token_text(token: Token) -> str:
    if token.type == "_NL":
        return "end of line"
    if token.type == "_INDENT":
        return "indentation"
    if token.type == "_DEDENT":
        return "end of block"
    if token.type == "$END":
        return "end of program"
    text = str(token)
    return f"'{text}'" if len(text) <= 40 else f"'{text[:37]}...'"


def _hint_for(token: Token | None, text_line: str) -> str | None:
    if token is None:
        return None
    if token.type == "NAME" and str(token) in ("KiB", "MiB", "GiB", "KB", "MB", "GB", "B", "us", "ms", "s", "GFLOP", "TFLOP", "FLOP"):
        return f"write the unit attached to its number, e.g. 32{token}"
    if token.type == "_INDENT":
        return "indentation only follows a line that ends with ':'"
    if token.type == "_NL" and text_line.rstrip().endswith(("(", ",", "+", "-", "*", "/")):
        return "the line ends in the middle of an expression"
    return None


_GLUED_RE = re.compile(r"(?<![\w.])(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)([A-Za-z_]\w*)", re.ASCII)
_SPACED_RE = re.compile(r"(?<![\w.])\d+(?:\.\d*)?(?:[eE][+-]?\d+)?([ \t]+)([A-Za-z]+)\b", re.ASCII)
_FLOAT_RE = re.compile(r"(\d+\.\d*|\.\d+)([eE][+-]?\d+)?|\d+[eE][+-]?\d+", re.ASCII)


def _unit_problem(line_text: str) -> tuple[int, str, str] | None:
    """A quantity written wrongly on a line that failed to parse: (column, message, hint)."""
    code = line_text.split("#", 1)[0]
    for m in _GLUED_RE.finditer(code):
        number, suffix = m.group(1), m.group(2)
        if suffix in UNIT_SUFFIXES or _FLOAT_RE.fullmatch(number + suffix):
            continue
        units = " ".join(UNIT_SUFFIXES)
        return m.start(2) + 1, f"unknown unit '{suffix}' in '{m.group(0)}'", f"units are: {units}"
    for m in _SPACED_RE.finditer(code):
        if m.group(2) in UNIT_SUFFIXES:
            number = m.group(0)[: m.start(1) - m.start(0)]
            return (m.start(2) + 1, f"a space separates {number} from its unit {m.group(2)}",
                    f"write the unit attached to its number: {number}{m.group(2)}")  # fmt: skip
    return None


_PYTHON_ONLY = {
    "while": "loop with `for NAME in range(N):`",
    "break": "a loop runs every iteration: put the rest of its body under an `if`",
    "continue": "a loop runs every iteration: put the rest of its body under an `if`",
    "return": "a `def` block is a list of statements and returns nothing: compute values with expressions",
    "import": "every op and function is built in (docs/language.md)",
    "from": "every op and function is built in (docs/language.md)",
    "try": None, "with": None, "class": None, "lambda": None, "global": None, "nonlocal": None, "del": None,
    "raise": "check a condition with `assert CONDITION, \"message\"`", "yield": None, "async": None, "await": None,
}  # fmt: skip
"""Python statements a program may be written with, not part of the language: what to write instead."""

_AUGMENTED_RE = re.compile(r"\s*([A-Za-z_]\w*(?:\[[^\]]*\])?)\s*(//|[-+*/%])=")
_OP_WORD_RE = re.compile(r"\s*(?:[A-Za-z_]\w*\s*=\s*)?([a-z_]+)\b")
_SIZED_OPS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter",
                        "send", "recv", "isend", "irecv", "copy"})  # fmt: skip
_PEER_WORD = {"send": "to", "isend": "to", "recv": "from", "irecv": "from"}


def _statement_problem(line_text: str) -> tuple[int, str, str | None] | None:
    """A statement written as Python would have it, or an op missing a part, on a line
    that failed to parse: (column, message, hint)."""
    code = line_text.split("#", 1)[0]
    words = code.split()
    if not words:
        return None
    column = len(code) - len(code.lstrip()) + 1
    first = words[0].rstrip(":")
    if first in _PYTHON_ONLY:
        return column, f"`{first}` is Python, not part of the schedule language", _PYTHON_ONLY[first]
    if first in ("elif", "else"):
        return column, f"`{first}` with no `if` block above it at the same indentation", "an `if` block's `elif` and `else` line up with its `if`"
    m = _AUGMENTED_RE.match(code)
    if m:
        value = code[m.end():].strip() or "..."
        return (column, f"`{m.group(1)} {m.group(2)}= {value}`: the language has no augmented assignment",
                f"write `{m.group(1)} = {m.group(1)} {m.group(2)} {value}`")  # fmt: skip
    m = _OP_WORD_RE.match(code)
    op = m.group(1) if m else None
    if op in _SIZED_OPS:
        rest = code[m.end():].split()
        if rest and rest[0].startswith("=") and not rest[0].startswith("=="):
            return m.start(1) + 1, f"`{op}` is an op of the language: it cannot name a value", "choose another name"
        if len(rest) < 2 or "=" in rest[1]:
            return (m.start(1) + 1, f"`{op}` needs a size after its name",
                    f"write `{op} NAME SIZE ...`, e.g. `{op} x 4MiB" + (f" {_PEER_WORD[op]} 1`" if op in _PEER_WORD else "`"))  # fmt: skip
        if op in _PEER_WORD and _PEER_WORD[op] not in rest:
            return (m.start(1) + 1, f"`{op}` names its peer with `{_PEER_WORD[op]}`",
                    f"write `{op} NAME SIZE {_PEER_WORD[op]} RANK`")  # fmt: skip
    return None


@functools.cache
def _statement_keywords() -> tuple[str, ...]:
    """The keywords a statement can start with (the ops, `if`, `for`, `def`, ...), as the
    grammar has them: the terminals its parser accepts first that are spelled as names."""
    parser = _lark()
    accepted = parser.parse_interactive("").accepts()
    patterns = [t.pattern for t in parser.terminals if t.name in accepted]
    return tuple(sorted(p.value for p in patterns if p.type == "str" and is_name(p.value)))


def _bound_names(text: str) -> set[str]:
    """Names the program binds (blocks and their parameters, loop variables, assigned
    values), read from its tokens: the text does not parse, so there is no tree."""
    bound: set[str] = set()
    statement: list[Token] = []
    try:
        for token in _lark().lex(text):
            if token.type in ("_NL", "_INDENT", "_DEDENT"):
                bound |= _names_bound_by(statement)
                statement = []
            else:
                statement.append(token)
    except (LarkError, AssertionError):  # past the error: a character no token starts with, a bad
        pass  # dedent, or a ')' with no '(' (lark's indenter asserts on it): the names so far
    return bound | _names_bound_by(statement)


def _names_bound_by(statement: list[Token]) -> set[str]:
    names = [str(t) for t in statement if t.type == "NAME"]
    first = statement[0].type if statement else None
    if first == "DEF":
        return set(names)
    if first == "FOR":
        return set(names[:1])
    if first == "NAME" and any(t.type == "EQUAL" for t in statement):  # `x = ...`, `h[i] = ...`
        return set(names[:1])
    return set()


def _keyword_hint(err: UnexpectedToken, text: str, defined: Collection[str]) -> str | None:
    """`allreduce g 1MiB`, `h = isendd x ...`: the parser stopped right after a statement's
    first word (or the word a handle is bound to), a name the schedule does not define
    that is close to a keyword: did you mean it?"""
    stack = err.interactive_parser.parser_state.value_stack if err.interactive_parser else []
    top = stack[-1] if stack else None
    before = stack[-2] if len(stack) > 1 else None
    if isinstance(top, Tree) and top.data == "var" and isinstance(before, Token) and before.type == "EQUAL":
        word = str(top.children[0])  # the word a handle is bound to, read as a value: `h = isendd x ...`
    elif isinstance(top, Token) and top.type == "NAME":
        if isinstance(before, Token) and before.type not in ("_NL", "_INDENT", "_DEDENT"):
            return None  # not the statement's first word
        word = str(top)
    else:
        return None  # inside an expression: `x = 2 * sendd y`
    if word in defined or word in _bound_names(text):
        return None
    # Keywords are short: at difflib's usual 0.6, 'foo' would be 'for' and 'bar' 'barrier'.
    return did_you_mean(word, _statement_keywords(), cutoff=0.7)


def _raise_parse_error(err: LarkError, parser: Lark, origin: TextOrigin, text: str,
                       defined: Collection[str] | None = None) -> None:  # fmt: skip
    """Raise the `ScheduleError` for `err`. `defined`: for a program, the names the schedule
    defines outside it (params); None for one expression, which holds no statements."""
    lines = text.splitlines()
    err_line = getattr(err, "line", None)
    if isinstance(err, UnexpectedToken) and err.token.type != "$END":
        err_line = err.token.line
    if isinstance(err_line, int) and 0 < err_line <= len(lines):
        problem = _unit_problem(lines[err_line - 1])
        if problem is None and defined is not None:
            problem = _statement_problem(lines[err_line - 1])
        if problem is not None:
            column, message, hint = problem
            raise ScheduleError(message, origin.loc(err_line, column), hint=hint) from None
    if isinstance(err, UnexpectedCharacters):
        loc = origin.loc(err.line, err.column)
        char = text[err.pos_in_stream] if err.pos_in_stream < len(text) else ""
        if char == "\t":
            raise ScheduleError("tab character in program; indent with spaces", loc) from None
        expected = _describe_expected(parser, set(err.allowed or ()))
        msg = f"unexpected character {_char_text(char)}"
        hint = None
        if char and not char.isascii():
            hint = ("write numbers with the digits 0-9" if char.isdigit() or char.isnumeric()
                    else "names and numbers are ASCII: letters, digits 0-9 and _")  # fmt: skip
        raise ScheduleError(msg + (f"; expected {expected}" if expected else ""), loc, hint=hint) from None
    if isinstance(err, UnexpectedToken):
        token = err.token
        if token.type == "$END":
            unclosed = _unclosed_bracket(text)
            if unclosed is not None:
                (line, column), char = unclosed
                raise ScheduleError(f"'{char}' is never closed", origin.loc(line, column),
                                    hint=f"add the matching '{_CLOSING[char]}'")  # fmt: skip
        line = token.line if token.line is not None else len(lines)
        column = token.column if token.column is not None else 1
        if token.type == "$END":
            line, column = max(len(lines), 1), len(lines[-1]) + 1 if lines else 1
        elif token.type in ("_INDENT", "_DEDENT"):
            # The indenter places these at the newline; point at the indented line instead.
            line = token.end_line or line
            column = len(str(token).rsplit("\n", 1)[-1]) + 1
            if line > len(lines):  # the end of the text: point just after its last code
                line = max((n for n, x in enumerate(lines, 1) if x.strip()), default=1)
                column = len(lines[line - 1].rstrip()) + 1 if lines else 1
        loc = origin.loc(line, column)
        expected = _describe_expected(parser, set(err.expected))
        text_line = lines[line - 1] if 0 < line <= len(lines) else ""
        opener = _block_opener_before(lines, line) if token.type not in ("_INDENT", "_DEDENT", "$END") else None
        if opener is not None and "_INDENT" not in err.expected and column == _indent_of(text_line) + 1:
            raise ScheduleError(f"expected an indented block after the ':' on line {origin.loc(opener, 1).line}", loc,
                                hint="indent the block's lines more than the line that ends with ':'")  # fmt: skip
        hint = _hint_for(token, text_line)
        if hint is None and defined is not None:
            hint = _keyword_hint(err, text, defined)
        raise ScheduleError(f"unexpected {_token_text(token)}; expected {expected}", loc, hint=hint) from None
    if isinstance(err, UnexpectedEOF):
        loc = origin.loc(max(len(lines), 1), len(lines[-1]) + 1 if lines else 1)
        raise ScheduleError("unexpected end of program", loc) from None
    if isinstance(err, DedentError):
        raise ScheduleError(f"inconsistent indentation: {err}", origin.loc(1, 1)) from None
    if isinstance(err, UnexpectedInput):
        raise ScheduleError(f"syntax error: {err}", origin.loc(getattr(err, "line", 1) or 1, getattr(err, "column", 1) or 1)) from None
    raise ScheduleError(f"syntax error: {err}", origin.loc(1, 1)) from None


def _indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _block_opener_before(lines: list[str], line: int) -> int | None:
    """The line before `line` (1-based, skipping blanks and comments), if it ends with ':'."""
    for number in range(line - 1, 0, -1):
        code = lines[number - 1].split("#", 1)[0].rstrip()
        if code:
            return number if code.endswith(":") else None
    return None


_CLOSING = {"(": ")", "[": "]"}


def _unclosed_bracket(text: str) -> tuple[tuple[int, int], str] | None:
    """Position (line, column) and character of the first bracket left open, if any."""
    stack: list[tuple[tuple[int, int], str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        for column, char in enumerate(line, 1):
            if char == "#":
                break
            if char in _CLOSING:
                stack.append(((number, column), char))
            elif char in (")", "]") and stack and _CLOSING[stack[-1][1]] == char:
                stack.pop()
    return stack[0] if stack else None


def _check_indentation(text: str, origin: TextOrigin) -> None:
    """Refuse tabs in indentation (how wide is a tab?) and an indented first line (the
    indenter would silently take it as the top level)."""
    first = True
    for number, line in enumerate(text.splitlines(), 1):
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        if "\t" in indent:
            raise ScheduleError("tab character in indentation; indent with spaces", origin.loc(number, indent.index("\t") + 1),
                                hint="configure your editor to insert spaces for tabs")  # fmt: skip
        code = line.strip()
        if first and code and not code.startswith("#"):
            first = False
            if indent:
                raise ScheduleError("the first line of the program is indented", origin.loc(number, len(indent) + 1),
                                    hint="the program's top level starts at the block's indentation")  # fmt: skip


def _dedent_line_of(text: str) -> int:
    """Line of the first dedent that matches no enclosing indentation level."""
    levels = [0]
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip(" ")
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(stripped)
        if indent > levels[-1]:
            levels.append(indent)
            continue
        while indent < levels[-1]:
            levels.pop()
        if indent != levels[-1]:
            return number
    return 1


@functools.lru_cache(maxsize=64)
def _program_tree(source: str) -> Tree:
    # A pure function of the text (nothing downstream changes a tree): a process that
    # loads one schedule many times (calibration's probes, tests, benches) parses it once.
    return _lark().parse(source)


@functools.lru_cache(maxsize=256)
def _expression_tree(text: str) -> Tree:
    return _expression_lark().parse(text)


def parse_program(text: str, origin: TextOrigin, defined: Collection[str] = ()) -> Tree:
    """Parse a program block into a Lark tree; errors become `ScheduleError`s. `defined`:
    the names the schedule defines outside the program (params), which a hint for a
    misspelled keyword must not take for one."""
    parser = _lark()
    source = text if text.endswith("\n") else text + "\n"
    _check_indentation(source, origin)
    try:
        return _program_tree(source)
    except DedentError:
        line = _dedent_line_of(source)
        indent = _indent_of(source.splitlines()[line - 1]) if line <= len(source.splitlines()) else 0
        raise ScheduleError(
            "this line's indentation matches no enclosing block", origin.loc(line, indent + 1),
            hint="indent with the same number of spaces as a line above",
        ) from None
    except LarkError as err:
        _raise_parse_error(err, parser, origin, source, defined)
        raise  # unreachable: _raise_parse_error always raises
    except RecursionError:
        raise ScheduleError("the program nests too deeply", origin.loc(1, 1)) from None


def parse_expression(text: str, origin: TextOrigin) -> Tree:
    """Parse one expression (a param value, a world size)."""
    parser = _expression_lark()
    try:
        return _expression_tree(text)
    except LarkError as err:
        _raise_parse_error(err, parser, origin, text)
        raise
    except RecursionError:
        raise ScheduleError("the expression nests too deeply", origin.loc(1, 1)) from None
