"""What the compiler's rule methods share: the closure types, refs and options, and
the helpers that check names at compile time.

The compiler (commdsl/dsl/compile.py) is one Lark Transformer assembled from three rule
sets, one module each: statements (compile_statements.py), op statements
(compile_ops.py) and expressions (compile_expressions.py). Each is a `RuleSet`, this
module's base class, which holds the program's origin, world layout and param names, and
the checks every rule set uses (`_options`, `_enum`, `_family`, `_stream_name`, ...).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from lark import Token, Transformer

from commdsl.dsl.estimate import OpShape, expression_names
from commdsl.dsl.expand import RankExpander, WorldLayout
from commdsl.dsl.parser import TextOrigin
from commdsl.dsl.values import ValueFault, format_value
from commdsl.errors import ScheduleError, SourceLoc, did_you_mean
from commdsl.ir import HOST_STREAM, Dtype

Env = dict
Expr = Callable[[Env], object]
Stmt = Callable[[RankExpander, Env], None]

BUILTIN_NAMES = frozenset({"rank", "world_size"})
"""Names every rank has set for it; a program cannot bind them."""


def expression(method):
    """Mark a rule method as producing an `Expr`; the closure gets `.loc`, the position
    of the expression, so errors about a value point at it rather than at its statement."""

    @functools.wraps(method)
    def located(self, meta, children):
        fn = method(self, meta, children)
        if not hasattr(fn, "loc"):
            fn.loc = self._loc(meta)
        if not hasattr(fn, "names"):
            fn.names = expression_names(children)  # what it reads: see commdsl/dsl/estimate.py
        return fn

    return located


NOT_CONSTANT = object()
"""`constant_of` an expression whose value is known only when it runs."""


def constant(value: object) -> Expr:
    """The expression of a value known at compile time (a literal, a param); the op
    statements read its `.constant` once rather than call it for every op."""
    fn = lambda env: value  # noqa: E731
    fn.constant = value
    return fn


def constant_of(expr: object) -> object:
    """The value of a `constant` expression, else `NOT_CONSTANT`."""
    return getattr(expr, "constant", NOT_CONSTANT)


def loc_of(expr: object, default: SourceLoc) -> SourceLoc:
    return getattr(expr, "loc", default)


def fault(err: ValueFault, loc: SourceLoc, env: Env) -> ScheduleError:
    """A value fault raised while evaluating at `loc`, with the rank when there is one."""
    ctx = env.get("__ctx__")
    return ScheduleError(str(err), loc, rank=ctx.rank if ctx is not None else None)


def fmt_index(v: object) -> str:
    return str(v) if type(v) is int else format_value(v)


class Ref:
    """A possibly indexed name: `act[mb]`. `text(env)` gives "act[3]", interned in `names`
    (see `ref_text`)."""

    __slots__ = ("base", "indices", "loc", "text")

    def __init__(self, base: str, indices: tuple[Expr, ...], loc: SourceLoc, names: dict[str, str]):
        self.base = base
        self.indices = indices
        self.loc = loc
        self.text: Callable[[Env], str] = ref_text(base, indices, names.setdefault)


def ref_text(base: str, indices: tuple[Expr, ...], intern: Callable[[str, str], str]) -> Callable[[Env], str]:
    """The function giving a ref's text, made for its shape (it runs for every op). Every
    text it gives is `intern(text, text)`: the one string of that text (an op's name is
    the same string on every rank and in every statement that makes it). A ref with one
    index keeps the texts of the integers it has seen, so most ops take their name from
    there without formatting or interning it."""
    if not indices:
        text0 = intern(base, base)
        return lambda env: text0
    if len(indices) == 2:  # F[step, l]
        first, second = indices

        def text2(env):
            a, b = first(env), second(env)
            text = f"{base}[{a if a.__class__ is int else format_value(a)},{b if b.__class__ is int else format_value(b)}]"
            return intern(text, text)

        return text2
    if len(indices) > 2:

        def text_n(env):
            text = f"{base}[{','.join([fmt_index(i(env)) for i in indices])}]"
            return intern(text, text)

        return text_n
    (index,) = indices
    name = getattr(index, "var_name", None)
    texts: dict[int, str] = {}
    """The texts made so far, by integer index (shared by the ranks)."""

    def text_of(v: object) -> str:  # a text not in `texts`
        if v.__class__ is not int:
            text = f"{base}[{format_value(v)}]"
            return intern(text, text)
        text = f"{base}[{v}]"
        text = texts[v] = intern(text, text)
        return text

    if name is None:

        def text1(env):
            v = index(env)
            return (texts.get(v) or text_of(v)) if v.__class__ is int else text_of(v)

        return text1

    def text_of_var(env):  # F[mb]: read mb without calling its closure
        try:
            v = env[name]
        except KeyError:
            v = index(env)  # raises the unknown-name error
        return (texts.get(v) or text_of(v)) if v.__class__ is int else text_of(v)

    return text_of_var


@dataclass(frozen=True)
class Option:
    name: str
    value: Expr
    loc: SourceLoc
    bare_name: str | None
    """The option's value when it is written as a bare name (`op=sum`, `group=dp`)."""


OP_SHAPE = OpShape()


def op_node(run: Callable[[RankExpander, Env, str | None], None], kind_word: str) -> Stmt:
    """A compiled op statement: `run(ctx, env, handle=None)` emits the op, bound to
    `handle` when the statement assigns it (`h = isend ...`); as a statement of its own
    it is called as any `Stmt`, `run(ctx, env)`. `op_word` marks it as an op."""
    run.op_word = kind_word
    run.shape = OP_SHAPE
    return run


class RuleSet(Transformer):
    """Base of the rule sets: what a rule method needs besides its children."""

    def __init__(self, origin: TextOrigin, layout: WorldLayout, param_names: tuple[str, ...]):
        super().__init__(visit_tokens=False)
        self.origin = origin
        self.layout = layout
        self.param_names = param_names
        self.constants: dict[str, object] = {}
        """Names whose value is known before any rank runs, with it: the params that no
        block parameter shadows (`ProgramCompiler.compile` fills it). A read of one is a
        `constant` expression."""
        self.reads_rank = False
        """Whether the program reads its rank: `rank`, a group's `.rank` or `.size`, or
        `rank_at()` (commdsl/dsl/spmd.py copies the ops of a program that does not)."""
        self.rank_reads: set[tuple[str, ...]] = set()
        """What of its rank the program reads, one entry each: ("rank",) (the name, or
        `rank_at()` with no coordinate), ("group", FAMILY, "rank" or "size") (a group's
        `.rank` or `.size`), and ("rank_at", AXIS) for each axis a `rank_at` call sets
        (`commdsl.dsl.fold` decides from these which mesh axis may be folded)."""
        self.block_names: frozenset[str] = frozenset()
        """The names of the program's `def` blocks (`ProgramCompiler.compile` fills it): a
        call of one inside an expression is told so."""
        self.names: dict[str, str] = {}
        """Op names, each text once: the refs intern their texts here (`ref_text`), and
        the expansion goes on with this table (`InternTables.names`)."""

    def _loc(self, meta) -> SourceLoc:
        return self.origin.loc(meta.line, meta.column)

    def _tok_loc(self, tok: Token) -> SourceLoc:
        return self.origin.loc(tok.line, tok.column)

    def _enum(self, opt: Option, enum_type: type):
        if opt.bare_name is None:
            raise ScheduleError(f"{opt.name}= takes a name, e.g. {opt.name}={next(iter(enum_type)).value}", opt.loc)
        try:
            return enum_type(opt.bare_name)
        except ValueError:
            choices = [e.value for e in enum_type]
            raise ScheduleError(f"unknown {opt.name} '{opt.bare_name}'; expected one of {', '.join(choices)}", opt.loc,
                                hint=did_you_mean(opt.bare_name, choices)) from None  # fmt: skip

    def _family(self, opt: Option | None) -> str:
        if opt is None:
            return "world"
        if opt.bare_name is None or opt.bare_name not in self.layout.families:
            known = ", ".join(self.layout.families)
            given = opt.bare_name or "an expression"
            hint = did_you_mean(given, self.layout.families) or "groups are `world`, the mesh axes, and those under `groups:`"
            raise ScheduleError(f"unknown group '{given}'; groups: {known}", opt.loc, hint=hint)
        return opt.bare_name

    def _stream_name(self, tok: Token | None, loc: SourceLoc, *, allow_host: bool) -> str | None:
        if tok is None:
            return None
        name = str(tok)
        if name == HOST_STREAM:
            if allow_host:
                return name
            raise ScheduleError("this op runs on a device stream, not on the host", self._tok_loc(tok),
                                hint="only `wait ... on host` blocks the host; CPU work is `host NAME DURATION`")  # fmt: skip
        if name not in self.layout.streams:
            hint = did_you_mean(name, self.layout.streams) or "declare it under `streams:` in the schedule"
            raise ScheduleError(f"unknown stream '{name}' (declared streams: {', '.join(self.layout.streams)})",
                                self._tok_loc(tok), hint=hint)  # fmt: skip
        return name

    def _options(self, what: str, allowed: frozenset[str], options: list[Option]) -> dict[str, Option]:
        out: dict[str, Option] = {}
        for opt in options:
            if opt.name not in allowed:
                choices = ", ".join(sorted(allowed)) or "none"
                raise ScheduleError(f"{what} has no option '{opt.name}' (options: {choices})", opt.loc,
                                    hint=did_you_mean(opt.name, allowed))  # fmt: skip
            if opt.name in out:
                raise ScheduleError(f"option '{opt.name}' given twice", opt.loc)
            out[opt.name] = opt
        return out

    def _check_bindable(self, name: str, loc: SourceLoc, *, params_too: bool) -> None:
        """Refuse to bind `rank`, `world_size`, names starting with `__` (internal), and,
        for assignments and loop variables, params."""
        if name in BUILTIN_NAMES or name.startswith("__"):
            raise ScheduleError(f"cannot bind '{name}': it is reserved", loc,
                                hint="`rank` and `world_size` are set per rank; names starting with __ are internal")  # fmt: skip
        if params_too and name in self.param_names:
            raise ScheduleError(f"cannot assign to '{name}': it is a param", loc,
                                hint="params change only from the command line: -p NAME=VALUE")  # fmt: skip

    def _dtype(self, opts: dict[str, Option]) -> Dtype | None:
        opt = opts.get("dtype")
        return self._enum(opt, Dtype) if opt else None
