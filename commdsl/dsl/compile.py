"""Compile the Lark tree of a program into closures, once; run them once per rank.

`ProgramCompiler` is a Lark Transformer with one method per grammar rule. Expressions
become `Expr` callables `(env) -> value`; statements become `Stmt` callables
`(rank_expander, env) -> None`. Running closures is several times faster than walking
the tree for every rank, and it keeps the tree out of everything past this module.

Everything that can be checked without a rank is checked here, at compile time:
unknown options, enum values, group and stream names.
"""

from __future__ import annotations

import enum
import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass

from lark import Token, Transformer, Tree, v_args
from lark.exceptions import VisitError

from commdsl.dsl.estimate import AssignShape, BodyShape, CallShape, DefShape, ForShape, IfShape, OpShape, check_loop, expression_names
from commdsl.dsl.expand import CollectiveSite, ComputeSite, P2PSite, RankExpander, WorldLayout
from commdsl.dsl.parser import TextOrigin
from commdsl.dsl.values import (
    BUILTINS,
    INT_LIMIT,
    Quantity,
    Unit,
    ValueFault,
    binary,
    checked_float,
    checked_int,
    compare,
    format_value,
    negate,
    truth,
    type_name,
    parse_quantity,
)
from commdsl.errors import CommdslError, LimitError, ScheduleError, SourceLoc, did_you_mean
from commdsl.ir import HOST_STREAM, REDUCING_KINDS, Algo, CopyDir, Dtype, OpKind, PipelineAction, Protocol, ReduceOp, Transport

Env = dict
Expr = Callable[[Env], object]
Stmt = Callable[[RankExpander, Env], None]

MAX_CALL_DEPTH = 64
_BUILTIN_NAMES = frozenset({"rank", "world_size"})

_ROOT_OPTION = {OpKind.BROADCAST: "src", OpKind.SCATTER: "src", OpKind.REDUCE: "dst", OpKind.GATHER: "dst"}

_ENUM_OPTIONS: dict[str, type] = {"op": ReduceOp, "transport": Transport, "algo": Algo, "proto": Protocol, "dtype": Dtype}

_OPTIONS_BY_OP: dict[str, frozenset[str]] = {
    "compute": frozenset({"flops", "bytes", "dtype", "action", "stage", "microbatch"}),
    "copy": frozenset({"dtype"}),
    "p2p": frozenset({"group", "transport", "dtype", "proto", "action", "stage", "microbatch"}),
    "barrier": frozenset({"group"}),
}


class P2PMode(enum.Enum):
    """How a point-to-point statement is issued."""

    BLOCKING = "blocking"
    """send / recv: synchronous."""
    ASYNC = "async"
    """isend / irecv: returns a handle."""
    STAGE = "stage"
    """stage_send / stage_recv: placed by the pipeline lowering (commdsl/dsl/lower.py)."""


_P2P_WORDS: dict[str, tuple[OpKind, P2PMode]] = {
    "send": (OpKind.SEND, P2PMode.BLOCKING), "recv": (OpKind.RECV, P2PMode.BLOCKING),
    "isend": (OpKind.SEND, P2PMode.ASYNC), "irecv": (OpKind.RECV, P2PMode.ASYNC),
    "stage_send": (OpKind.SEND, P2PMode.STAGE), "stage_recv": (OpKind.RECV, P2PMode.STAGE),
}  # fmt: skip


def _collective_options(kind: OpKind) -> frozenset[str]:
    names = {"group", "algo", "proto", "transport", "dtype"}
    if kind in REDUCING_KINDS:
        names.add("op")
    if kind in _ROOT_OPTION:
        names.add(_ROOT_OPTION[kind])
    return frozenset(names)


def _expression(method):
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


def _loc_of(expr: object, default: SourceLoc) -> SourceLoc:
    return getattr(expr, "loc", default)


def _fault(err: ValueFault, loc: SourceLoc, env: Env) -> ScheduleError:
    """A value fault raised while evaluating at `loc`, with the rank when there is one."""
    ctx = env.get("__ctx__")
    return ScheduleError(str(err), loc, rank=ctx.rank if ctx is not None else None)


def _fmt_index(v: object) -> str:
    return str(v) if type(v) is int else format_value(v)


class _Ref:
    """A possibly indexed name: `act[mb]`. `text(env)` gives "act[3]"."""

    __slots__ = ("base", "indices", "loc", "text")

    def __init__(self, base: str, indices: tuple[Expr, ...], loc: SourceLoc):
        self.base = base
        self.indices = indices
        self.loc = loc
        self.text: Callable[[Env], str] = _ref_text(base, indices)


def _ref_text(base: str, indices: tuple[Expr, ...]) -> Callable[[Env], str]:
    """The function giving a ref's text, made for its shape (it runs for every op)."""
    if not indices:
        return lambda env: base
    if len(indices) == 2:  # F[step, l]
        first, second = indices

        def text2(env):
            a, b = first(env), second(env)
            return f"{base}[{a if a.__class__ is int else format_value(a)},{b if b.__class__ is int else format_value(b)}]"

        return text2
    if len(indices) > 2:
        return lambda env: f"{base}[{','.join([_fmt_index(i(env)) for i in indices])}]"
    (index,) = indices
    name = getattr(index, "var_name", None)
    if name is None:

        def text(env):
            v = index(env)
            return f"{base}[{v if v.__class__ is int else format_value(v)}]"

        return text

    texts: dict[int, str] = {}
    """The texts made so far, by integer index: most are made once per rank."""

    def text_of_var(env):  # F[mb]: read mb without calling its closure
        v = env[name] if name in env else index(env)  # index(env) raises the unknown-name error
        if v.__class__ is not int:
            return f"{base}[{format_value(v)}]"
        text = texts.get(v)
        if text is None:
            text = texts[v] = f"{base}[{v}]"
        return text

    return text_of_var


@dataclass(frozen=True)
class _Option:
    name: str
    value: Expr
    loc: SourceLoc
    bare_name: str | None
    """The option's value when it is written as a bare name (`op=sum`, `group=dp`)."""


_OP_SHAPE = OpShape()


def _op_node(run: Callable[[RankExpander, Env, str | None], None], kind_word: str) -> Stmt:
    """A compiled op statement: `run(ctx, env, handle=None)` emits the op, bound to
    `handle` when the statement assigns it (`h = isend ...`); as a statement of its own
    it is called as any `Stmt`, `run(ctx, env)`. `op_word` marks it as an op."""
    run.op_word = kind_word
    run.shape = _OP_SHAPE
    return run


@v_args(meta=True)
class ProgramCompiler(Transformer):
    """Transformer from the program's Lark tree to closures."""

    def __init__(self, origin: TextOrigin, layout: WorldLayout, param_names: tuple[str, ...]):
        super().__init__(visit_tokens=False)
        self.origin = origin
        self.layout = layout
        self.param_names = param_names

    def compile(self, tree: Tree):
        """Transform `tree` into closures; errors raised by rule methods come out as
        they are (Lark wraps them in `VisitError`)."""
        try:
            return self.transform(tree)
        except VisitError as err:
            if isinstance(err.orig_exc, CommdslError):
                raise err.orig_exc from None
            if isinstance(err.orig_exc, RecursionError):
                raise _too_deep(self.origin.loc(1, 1)) from None
            raise
        except RecursionError:
            raise _too_deep(self.origin.loc(1, 1)) from None

    # ---- helpers ------------------------------------------------------------------

    def _loc(self, meta) -> SourceLoc:
        return self.origin.loc(meta.line, meta.column)

    def _tok_loc(self, tok: Token) -> SourceLoc:
        return self.origin.loc(tok.line, tok.column)

    def _enum(self, opt: _Option, enum_type: type):
        if opt.bare_name is None:
            raise ScheduleError(f"{opt.name}= takes a name, e.g. {opt.name}={next(iter(enum_type)).value}", opt.loc)
        try:
            return enum_type(opt.bare_name)
        except ValueError:
            choices = [e.value for e in enum_type]
            raise ScheduleError(f"unknown {opt.name} '{opt.bare_name}'; expected one of {', '.join(choices)}", opt.loc,
                                hint=did_you_mean(opt.bare_name, choices)) from None  # fmt: skip

    def _family(self, opt: _Option | None) -> str:
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

    def _options(self, what: str, allowed: frozenset[str], options: list[_Option]) -> dict[str, _Option]:
        out: dict[str, _Option] = {}
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
        if name in _BUILTIN_NAMES or name.startswith("__"):
            raise ScheduleError(f"cannot bind '{name}': it is reserved", loc,
                                hint="`rank` and `world_size` are set per rank; names starting with __ are internal")  # fmt: skip
        if params_too and name in self.param_names:
            raise ScheduleError(f"cannot assign to '{name}': it is a param", loc,
                                hint="params change only from the command line: -p NAME=VALUE")  # fmt: skip

    def _dtype(self, opts: dict[str, _Option]) -> Dtype | None:
        opt = opts.get("dtype")
        return self._enum(opt, Dtype) if opt else None

    # ---- program and statements ------------------------------------------------------

    def start(self, meta, children) -> Stmt:
        return _block(children)

    def suite(self, meta, children) -> list[Stmt]:
        return children

    def pass_stmt(self, meta, children) -> Stmt:
        return lambda ctx, env: None

    def assert_stmt(self, meta, children) -> Stmt:
        cond, message_tok = children
        loc = _loc_of(cond, self._loc(meta))
        message = str(message_tok)[1:-1] if message_tok is not None else None

        def check(ctx, env):
            try:
                holds = truth(cond(env), "an assert condition")
            except ValueFault as e:
                raise ctx.fail(str(e), loc) from None
            if not holds:
                text = f"assertion failed: {message}" if message else "assertion failed"
                raise ctx.fail(text, loc, hint=None if message else "add a message: assert COND, \"what went wrong\"")

        return check

    def assign(self, meta, children) -> Stmt:
        ref, rhs = children
        loc = self._loc(meta)
        if getattr(rhs, "op_word", None) is not None:
            run = rhs

            def bind(ctx, env):
                run(ctx, env, ref.text(env))

            bind.shape = _OP_SHAPE
            return bind
        if ref.indices:
            raise ScheduleError(f"only an op can be bound to an indexed name like {ref.base}[...]", loc,
                                hint="values are assigned to plain names: `x = ...`")  # fmt: skip
        name = ref.base
        self._check_bindable(name, loc, params_too=True)
        value = rhs

        def assign(ctx, env):
            env[name] = value(env)

        assign.shape = AssignShape(name)
        return assign

    def call_stmt(self, meta, children) -> Stmt:
        name_tok, args = children
        name = str(name_tok)
        loc = self._loc(meta)
        positional, keywords = args if args is not None else ((), ())
        if name in BUILTINS or name == "rank_at":
            raise ScheduleError(f"{name}() is an expression, not a statement", loc)

        nargs = len(positional) + len(keywords)

        def call(ctx, env):
            fn = ctx.functions.get(name)
            if fn is None:
                known = ", ".join(sorted(ctx.functions)) or "none defined so far"
                hint = did_you_mean(name, ctx.functions) or "`def` a block before calling it"
                raise ctx.fail(f"unknown block '{name}' (blocks: {known})", loc, hint=hint)
            params, body = fn
            if nargs != len(params):
                raise ctx.fail(f"{name}() takes {len(params)} argument(s) ({', '.join(params)}), got {nargs}", loc)
            local = ctx.globals.copy()
            for p, a in zip(params, positional):
                local[p] = a(env)
            for k, a in keywords:
                if k not in params[len(positional):]:
                    raise ctx.fail(f"{name}() got an unexpected or repeated argument '{k}'", loc)
                local[k] = a(env)
            budget = ctx.budget
            budget.steps += 1
            if budget.steps > budget.max_steps:
                budget.charge_steps(0, loc, ctx.rank)  # raises the limit's error
            ctx.call_depth += 1
            if ctx.call_depth > MAX_CALL_DEPTH:
                ctx.call_depth -= 1
                raise ctx.fail(f"blocks nest deeper than {MAX_CALL_DEPTH} calls (recursion?)", loc)
            try:
                for stmt in body:
                    stmt(ctx, local)
            finally:
                ctx.call_depth -= 1

        call.shape = CallShape(name, tuple(positional), tuple(keywords))
        return call

    def def_stmt(self, meta, children) -> Stmt:
        name_tok, params, body = children
        name = str(name_tok)
        loc = self._loc(meta)
        params = tuple(params or ())
        for p in params:
            self._check_bindable(p, loc, params_too=False)
        if len(set(params)) != len(params):
            raise ScheduleError(f"block '{name}' repeats a parameter name", loc)
        if name in BUILTINS or name == "rank_at":
            raise ScheduleError(f"'{name}' is a builtin function; choose another block name", loc)

        def define(ctx, env):
            ctx.functions[name] = (params, body)

        define.shape = DefShape(name)
        return define

    def parameters(self, meta, children) -> list[str]:
        return [str(c) for c in children]

    def if_stmt(self, meta, children) -> Stmt:
        cond, body, *rest = children
        branches = [(cond, body, _loc_of(cond, self._loc(meta)))]
        otherwise = None
        for clause in rest:
            if clause[0] == "elif":
                branches.append(clause[1:])
            else:
                otherwise = clause[1]

        def run_if(ctx, env):
            for test, stmts, loc in branches:
                taken = test(env)
                if taken.__class__ is not bool:
                    try:
                        truth(taken, "an if condition")
                    except ValueFault as e:
                        raise ctx.fail(str(e), loc) from None
                if taken:
                    for s in stmts:
                        s(ctx, env)
                    return
            if otherwise is not None:
                for s in otherwise:
                    s(ctx, env)

        run_if.shape = IfShape(tuple(tuple(b) for _, b, _ in branches) + ((tuple(otherwise),) if otherwise else ()), otherwise is not None)
        return run_if

    def elif_clause(self, meta, children):
        return ("elif", children[0], children[1], _loc_of(children[0], self._loc(meta)))

    def else_clause(self, meta, children):
        return ("else", children[0])

    def for_stmt(self, meta, children) -> Stmt:
        var_tok, args, body = children
        var = str(var_tok)
        loc = self._loc(meta)
        self._check_bindable(var, self._tok_loc(var_tok), params_too=True)
        positional, keywords = args if args is not None else ((), ())
        if keywords or not 1 <= len(positional) <= 3:
            raise ScheduleError("range() takes 1 to 3 integers: range(stop), range(start, stop[, step])", loc)

        def run_for(ctx, env):
            bounds = [a(env) for a in positional]
            for b in bounds:
                if not isinstance(b, int) or isinstance(b, bool):
                    raise ctx.fail(f"range() takes integers, got {type_name(b)}", loc)
            if len(bounds) == 3 and bounds[2] == 0:
                raise ctx.fail("range() step must not be zero", loc)
            iterations = range(*bounds)
            try:
                count = len(iterations)
            except OverflowError:  # more than sys.maxsize iterations
                count = ctx.budget.max_steps + 1
            ctx.budget.charge_steps(count, loc, ctx.rank)
            check_loop(ctx, env, shape, count, loc)
            for i in iterations:
                env[var] = i
                for s in body:
                    s(ctx, env)

        shape = run_for.shape = ForShape(var, tuple(positional), expression_names(positional), tuple(body))
        return run_for

    def batch_stmt(self, meta, children) -> Stmt:
        ref, body = children
        loc = self._loc(meta)

        def run_batch(ctx, env):
            ctx.begin_batch(ref.text(env) if ref is not None else None, loc)
            for s in body:
                s(ctx, env)
            ctx.end_batch(loc)

        run_batch.shape = BodyShape(tuple(body))
        return run_batch

    def on_stmt(self, meta, children) -> Stmt:
        stream_tok, body = children
        stream = self._stream_name(stream_tok, self._loc(meta), allow_host=False)

        def run_on(ctx, env):
            ctx.push_stream(stream)
            try:
                for s in body:
                    s(ctx, env)
            finally:
                ctx.pop_stream()

        run_on.shape = BodyShape(tuple(body))
        return run_on

    # ---- ops ------------------------------------------------------------------------------

    def compute(self, meta, children) -> Stmt:
        ref, amount, *rest = children
        placement, options = rest[-1], rest[:-1]
        loc = self._loc(meta)
        opts = self._options("compute", _OPTIONS_BY_OP["compute"], options)
        stream = self._stream_name(placement, loc, allow_host=False)
        dtype = self._dtype(opts)
        flops_opt, bytes_opt = opts.get("flops"), opts.get("bytes")
        if amount is None and flops_opt is None and bytes_opt is None:
            raise ScheduleError("compute needs a duration (2ms), work (4GFLOP), flops= or bytes=", loc)
        pipeline = self._pipeline_options(opts, loc)
        amount_loc = _loc_of(amount, loc)
        site = ComputeSite(dtype, stream, loc, amount_loc, bytes_opt.loc if bytes_opt else loc)

        def run(ctx, env, handle=None):
            if handle is not None:
                raise ctx.fail("compute returns no handle; record an event to wait on it from another stream", loc)
            duration_us = flops = size = None
            name = ref.text(env)
            if amount is not None:
                v = amount(env)
                if isinstance(v, Quantity) and v.unit is Unit.DURATION:
                    duration_us = v.value
                elif isinstance(v, Quantity) and v.unit is Unit.WORK:
                    flops = v.value
                else:
                    raise ctx.fail(f"compute takes a duration (2ms) or work (4GFLOP), got {type_name(v)}", _loc_of(amount, loc))
            flops_loc = amount_loc
            if flops_opt is not None:
                if flops is not None:
                    raise ctx.fail("work given twice (positional and flops=)", flops_opt.loc)
                flops, flops_loc = _quantity(ctx, flops_opt.value(env), Unit.WORK, "flops=", flops_opt.loc), flops_opt.loc
            if bytes_opt is not None:
                size = _quantity(ctx, bytes_opt.value(env), Unit.SIZE, "bytes=", bytes_opt.loc)
            ctx.compute(site, name, duration_us, flops, size, None if pipeline is _no_pipeline else pipeline(ctx, env), flops_loc)

        return _op_node(run, "compute")

    def _pipeline_options(self, opts: dict[str, _Option], loc: SourceLoc):
        """`action= stage= microbatch=` of a compute op (or of a transfer: the action whose
        output it sends or whose input it receives): all three or none. Returns a
        function of (ctx, env) giving (action, stage, microbatch) or None."""
        given = [name for name in ("action", "stage", "microbatch") if name in opts]
        if not given:
            return _no_pipeline
        if len(given) < 3:
            missing = [n for n in ("action", "stage", "microbatch") if n not in opts]
            raise ScheduleError(f"a pipeline op names action=, stage= and microbatch= together; missing {', '.join(missing)}",
                                opts[given[0]].loc)  # fmt: skip
        action = self._enum(opts["action"], PipelineAction)
        stage_opt, mb_opt = opts["stage"], opts["microbatch"]

        stage_value, mb_value = stage_opt.value, mb_opt.value

        def pipeline(ctx, env):
            stage = stage_value(env)
            if stage.__class__ is not int or stage < 0:
                raise ctx.fail(f"stage= takes a non-negative integer, got {format_value(stage)}", stage_opt.loc)
            microbatch = mb_value(env)
            if microbatch.__class__ is not int or microbatch < 0:
                raise ctx.fail(f"microbatch= takes a non-negative integer, got {format_value(microbatch)}", mb_opt.loc)
            return action, stage, microbatch

        return pipeline

    def alloc(self, meta, children) -> Stmt:
        ref, size_expr, placement = children
        loc = self._loc(meta)
        stream = self._stream_name(placement, loc, allow_host=False)
        size_loc = _loc_of(size_expr, loc)
        cache: dict = {}

        def run(ctx, env, handle=None):
            if handle is not None:
                raise ctx.fail("alloc returns no handle; the buffer's name is what `free` takes", loc)
            size, _ = _size(ctx, size_expr(env), size_loc)
            ctx.alloc(cache, ref.text(env), size, stream, loc, size_loc)

        return _op_node(run, "alloc")

    def free(self, meta, children) -> Stmt:
        return self._named_op(meta, children, "free", RankExpander.free, "free returns no handle")

    def host_work(self, meta, children) -> Stmt:
        ref, amount = children
        loc = self._loc(meta)

        def run(ctx, env, handle=None):
            if handle is not None:
                raise ctx.fail("host work blocks the host and returns no handle", loc)
            amount_loc = _loc_of(amount, loc)
            ctx.host_work(ref.text(env), _quantity(ctx, amount(env), Unit.DURATION, "host work", amount_loc), loc, amount_loc=amount_loc)

        return _op_node(run, "host")

    def copy(self, meta, children) -> Stmt:
        ref, size_expr, peer, into, *rest = children
        placement, options = rest[-1], rest[:-1]
        loc = self._loc(meta)
        opts = self._options("copy", _OPTIONS_BY_OP["copy"], options)
        size_loc = _loc_of(size_expr, loc)
        stream = self._stream_name(placement, loc, allow_host=False)
        dtype = self._dtype(opts)
        peer_expr = peer_loc = None
        if peer is None:
            direction = CopyDir.D2D
        else:
            word, target, peer_loc = peer
            if target == HOST_STREAM:
                direction = CopyDir.H2D if word == "from" else CopyDir.D2H
            elif word == "from":
                raise ScheduleError("a copy writes another rank's buffer (`to RANK`), it does not read one", peer_loc,
                                    hint="copy on the rank that holds the data: `copy x SIZE to RANK`")  # fmt: skip
            else:
                direction = CopyDir.PEER
                peer_expr, peer_loc = target, _loc_of(target, peer_loc)
        if into is not None and direction is not CopyDir.PEER:
            raise ScheduleError("`into NAME` names the destination buffer of a copy to another rank (`copy x SIZE to RANK into NAME`)",
                                into.loc)  # fmt: skip

        def run(ctx, env, handle=None):
            if handle is not None:
                raise ctx.fail("copy returns no handle; record an event to wait on it from another stream", loc)
            size, dt = _size(ctx, size_expr(env), size_loc)
            name = ref.text(env)
            if peer_expr is None:
                ctx.copy(name, size, dtype or dt, direction, stream, loc, size_loc=size_loc)
            else:
                dest = into.text(env) if into is not None else name
                ctx.peer_copy(name, size, dtype or dt, peer_expr(env), dest, stream, loc, peer_loc=peer_loc, size_loc=size_loc)

        return _op_node(run, "copy")

    def into(self, meta, children) -> _Ref:
        ref = children[0]
        return _Ref(ref.base, ref.indices, self._loc(meta))  # errors about it point at `into`

    def p2p(self, meta, children) -> Stmt:
        kind_word, ref, size_expr, peer, *rest = children
        placement, options = rest[-1], rest[:-1]
        loc = self._loc(meta)
        kind, mode = _P2P_WORDS[kind_word]
        opts = self._options(kind_word, _OPTIONS_BY_OP["p2p"], options)
        stream = self._stream_name(placement, loc, allow_host=False)
        dtype = self._dtype(opts)
        family = self._family(opts.get("group"))
        transport = self._enum(opts["transport"], Transport) if "transport" in opts else None
        proto = self._enum(opts["proto"], Protocol) if "proto" in opts else None
        word, target, peer_loc = peer
        expected_word = "to" if kind is OpKind.SEND else "from"
        if word != expected_word:
            raise ScheduleError(f"{kind_word} names its peer with '{expected_word}', not '{word}'", peer_loc)
        if target == HOST_STREAM:
            raise ScheduleError(f"{kind_word} goes to another rank; to copy to or from the host use `copy`", peer_loc)
        peer_expr = target
        target_loc = _loc_of(target, peer_loc)
        size_loc = _loc_of(size_expr, loc)
        pipeline = self._pipeline_options(opts, loc)
        site = P2PSite(kind, mode is not P2PMode.BLOCKING, family, transport, proto, stream, loc, target_loc, size_loc)

        text = ref.text
        if mode is P2PMode.STAGE:

            def run_stage(ctx, env, handle=None):
                size, dt = _size(ctx, size_expr(env), size_loc)
                if handle is not None:
                    raise ctx.fail(f"{kind_word} returns no handle: the pipeline lowering waits for it", loc)
                ctx.stage_p2p(site, text(env), size, dtype or dt, peer_expr(env), pipeline(ctx, env))

            return _op_node(run_stage, kind_word)

        def run(ctx, env, handle=None):
            q = size_expr(env)
            if q.__class__ is Quantity and q.unit is Unit.SIZE:  # _size, inline: this runs for every transfer
                size, dt = q.value, q.dtype
            else:
                size, dt = _size(ctx, q, size_loc)
            ctx.p2p(site, text(env), size, dtype or dt, peer_expr(env), handle, None if pipeline is _no_pipeline else pipeline(ctx, env))

        return _op_node(run, kind_word)

    def collective(self, meta, children) -> Stmt:
        kind_word, ref, size_expr, *rest = children
        placement, options = rest[-1], rest[:-1]
        loc = self._loc(meta)
        kind = OpKind(kind_word)
        opts = self._options(kind_word, _collective_options(kind), options)
        return self._collective_node(kind, ref, size_expr, opts, placement, loc)

    def barrier(self, meta, children) -> Stmt:
        *options, placement = children
        loc = self._loc(meta)
        opts = self._options("barrier", _OPTIONS_BY_OP["barrier"], options)
        return self._collective_node(OpKind.BARRIER, None, None, opts, placement, loc)

    def _collective_node(self, kind: OpKind, ref, size_expr, opts, placement, loc) -> Stmt:
        stream = self._stream_name(placement, loc, allow_host=False)
        family = self._family(opts.get("group"))
        dtype = self._dtype(opts)
        reduce_op = None
        if kind in REDUCING_KINDS:
            reduce_op = self._enum(opts["op"], ReduceOp) if "op" in opts else ReduceOp.SUM
        algo = self._enum(opts["algo"], Algo) if "algo" in opts else None
        proto = self._enum(opts["proto"], Protocol) if "proto" in opts else None
        transport = self._enum(opts["transport"], Transport) if "transport" in opts else None
        root_opt = None
        if kind in _ROOT_OPTION:
            root_name = _ROOT_OPTION[kind]
            root_opt = opts.get(root_name)
            if root_opt is None:
                raise ScheduleError(f"{kind.value} needs its root: {root_name}=RANK", loc)
        root_expr = root_opt.value if root_opt else None
        root_loc = _loc_of(root_expr, root_opt.loc) if root_opt else loc
        size_loc = _loc_of(size_expr, loc)
        site = CollectiveSite(kind, family, reduce_op, algo, transport, proto, stream, loc, root_loc, size_loc)

        def run(ctx, env, handle=None):
            if size_expr is None:
                size, dt, name = 0, None, "barrier"
            else:
                size, dt = _size(ctx, size_expr(env), size_loc)
                name = ref.text(env)
            root = root_expr(env) if root_expr is not None else None
            ctx.collective(site, name, size, dtype or dt, root, handle)

        return _op_node(run, kind.value)

    def wait(self, meta, children) -> Stmt:
        return self._named_op(meta, children, "wait", RankExpander.wait, "wait returns no handle", allow_host=True)

    def record(self, meta, children) -> Stmt:
        return self._named_op(meta, children, "record", RankExpander.record,
                              "record returns no handle; the event's name is what you wait on")  # fmt: skip

    def _named_op(self, meta, children, word: str, emit: Callable, no_handle: str, *, allow_host: bool = False) -> Stmt:
        """`WORD NAME [on STREAM]` (wait, record, free): `emit(expander, cache, name, stream, loc)`."""
        ref, placement = children
        loc = self._loc(meta)
        stream = self._stream_name(placement, loc, allow_host=allow_host)
        cache: dict = {}

        def run(ctx, env, handle=None):
            if handle is not None:
                raise ctx.fail(no_handle, loc)
            emit(ctx, cache, ref.text(env), stream, loc)

        return _op_node(run, word)

    def synchronize(self, meta, children) -> Stmt:
        (stream_tok,) = children
        loc = self._loc(meta)
        stream = self._stream_name(stream_tok, loc, allow_host=False)

        def run(ctx, env, handle=None):
            if handle is not None:
                raise ctx.fail("synchronize returns no handle", loc)
            ctx.synchronize(stream, loc)

        return _op_node(run, "synchronize")

    def p2p_kind(self, meta, children) -> str:
        return str(children[0])

    def collective_kind(self, meta, children) -> str:
        return str(children[0])

    def peer_dir(self, meta, children) -> str:
        return str(children[0])

    def peer(self, meta, children):
        word, target = children
        if isinstance(target, Token):  # `host`
            return word, HOST_STREAM, self._loc(meta)
        return word, target, self._loc(meta)

    def option(self, meta, children) -> _Option:
        name_tok, value = children
        return _Option(str(name_tok), value, self._loc(meta), getattr(value, "var_name", None))

    def placement(self, meta, children) -> Token:
        return children[0]

    def ref(self, meta, children) -> _Ref:
        name_tok, *indices = children
        indices = tuple(i for i in indices if i is not None)
        return _Ref(str(name_tok), indices, self._loc(meta))

    # ---- expressions --------------------------------------------------------------------

    def _fold(self, meta, children, apply) -> Expr:
        """Left-fold `a OP b OP c` with `apply(op, a, b)`; faults get this node's location."""
        loc = self._loc(meta)
        first, rest = children[0], children[1:]
        pairs = tuple((str(rest[i]), rest[i + 1]) for i in range(0, len(rest), 2))
        if len(pairs) == 1 and apply is _fast_binary and pairs[0][0] in _INT_OPS:
            (op, second), = pairs
            int_op = _INT_OPS[op]
            divides = op in ("//", "%")  # by zero: the general path says so

            def fold_int(env):  # i + 1: integers skip the unit machinery
                try:
                    a, b = first(env), second(env)
                    if a.__class__ is int and b.__class__ is int and (b or not divides):
                        r = int_op(a, b)
                        if -INT_LIMIT < r < INT_LIMIT:
                            return r
                    return apply(op, a, b)
                except ValueFault as e:
                    raise _fault(e, loc, env) from None

            return fold_int
        if len(pairs) == 1:
            (op, second), = pairs

            def fold1(env):
                try:
                    return apply(op, first(env), second(env))
                except ValueFault as e:
                    raise _fault(e, loc, env) from None

            return fold1

        def fold(env):
            try:
                value = first(env)
                for op, operand in pairs:
                    value = apply(op, value, operand(env))
                return value
            except ValueFault as e:
                raise _fault(e, loc, env) from None

        return fold

    @_expression
    def arith(self, meta, children) -> Expr:
        return self._fold(meta, children, _fast_binary)

    @_expression
    def term(self, meta, children) -> Expr:
        return self._fold(meta, children, _fast_binary)

    @_expression
    def comparison(self, meta, children) -> Expr:
        loc = self._loc(meta)
        first, rest = children[0], children[1:]
        pairs = tuple((str(rest[i]), rest[i + 1]) for i in range(0, len(rest), 2))
        if len(pairs) == 1:
            (op, second), = pairs
            int_cmp = _INT_COMPARISONS[op]

            def cmp1(env):  # i < n: integers compare at once
                try:
                    a, b = first(env), second(env)
                    if a.__class__ is int and b.__class__ is int:
                        return int_cmp(a, b)
                    return compare(op, a, b)
                except ValueFault as e:
                    raise _fault(e, loc, env) from None

            return cmp1

        def cmp(env):
            try:
                left = first(env)
                for op, operand in pairs:
                    right = operand(env)
                    if not compare(op, left, right):
                        return False
                    left = right
                return True
            except ValueFault as e:
                raise _fault(e, loc, env) from None

        return cmp

    @_expression
    def or_test(self, meta, children) -> Expr:
        return self._logic(meta, children, stop_on=True)

    @_expression
    def and_test(self, meta, children) -> Expr:
        return self._logic(meta, children, stop_on=False)

    def _logic(self, meta, children, stop_on: bool) -> Expr:
        loc = self._loc(meta)
        word = "or" if stop_on else "and"

        def logic(env):
            try:
                for operand in children:
                    if truth(operand(env), f"an operand of '{word}'") is stop_on:
                        return stop_on
                return not stop_on
            except ValueFault as e:
                raise _fault(e, loc, env) from None

        return logic

    @_expression
    def not_(self, meta, children) -> Expr:
        (operand,) = children
        loc = self._loc(meta)

        def not_(env):
            v = operand(env)
            if v.__class__ is bool:
                return not v
            try:
                truth(v, "the operand of 'not'")  # raises: v is no boolean
            except ValueFault as e:
                raise _fault(e, loc, env) from None

        return not_

    @_expression
    def neg(self, meta, children) -> Expr:
        (operand,) = children
        loc = self._loc(meta)

        def neg(env):
            try:
                return negate(operand(env))
            except ValueFault as e:
                raise _fault(e, loc, env) from None

        return neg

    def pos(self, meta, children) -> Expr:
        return children[0]

    @_expression
    def power(self, meta, children) -> Expr:
        base, _, exponent = children
        loc = self._loc(meta)

        def power(env):
            try:
                return binary("**", base(env), exponent(env))
            except ValueFault as e:
                raise _fault(e, loc, env) from None

        return power

    @_expression
    def int_lit(self, meta, children) -> Expr:
        text = str(children[0])
        if len(text.lstrip("0")) > 19:
            raise ScheduleError(f"integer {text[:20]}... is too large (the limit is 2**63)", self._loc(meta))
        try:
            value = checked_int(int(text))
        except ValueFault as e:
            raise ScheduleError(str(e), self._loc(meta)) from None
        return lambda env: value

    @_expression
    def float_lit(self, meta, children) -> Expr:
        try:
            value = checked_float(float(children[0]))
        except ValueFault:
            raise ScheduleError(f"number {children[0]} is too large", self._loc(meta)) from None
        return lambda env: value

    @_expression
    def quantity_lit(self, meta, children) -> Expr:
        try:
            value = parse_quantity(str(children[0]))
        except ValueFault as e:
            raise ScheduleError(str(e), self._loc(meta)) from None
        return lambda env: value

    @_expression
    def true_lit(self, meta, children) -> Expr:
        return lambda env: True

    @_expression
    def false_lit(self, meta, children) -> Expr:
        return lambda env: False

    @_expression
    def var(self, meta, children) -> Expr:
        name = str(children[0])
        loc = self._loc(meta)
        if name.startswith("__"):
            raise ScheduleError(f"unknown name '{name}'", loc, hint="names starting with __ are internal")

        def var(env):
            try:
                return env[name]
            except KeyError:
                raise _unknown_name(name, env, loc) from None

        var.var_name = name  # lets options read `op=sum` as a bare name
        var.names = frozenset((name,))
        return var

    @_expression
    def attr(self, meta, children) -> Expr:
        family, field_name = str(children[0]), str(children[1])
        loc = self._loc(meta)
        if family not in self.layout.families:
            raise ScheduleError(f"unknown group '{family}' in '{family}.{field_name}'; groups: {', '.join(self.layout.families)}",
                                loc, hint=did_you_mean(family, self.layout.families))  # fmt: skip
        if field_name not in ("rank", "size"):
            raise ScheduleError(f"a group has .rank and .size, not .{field_name}", loc)
        # Groups are known per rank only at run time; env["__ctx__"] is the rank's expander.
        if field_name == "size":
            return lambda env: len(env["__ctx__"].group(family, loc).ranks)

        def group_rank(env):
            ctx = env["__ctx__"]
            found = ctx.group_of.get(family)  # (group, rank in it); None: ctx says why not
            return found[1] if found is not None else ctx.group_rank(family, loc)

        return group_rank

    @_expression
    def func_call(self, meta, children) -> Expr:
        name = str(children[0])
        positional, keywords = children[1] if children[1] is not None else ((), ())
        loc = self._loc(meta)
        if name == "rank_at":
            return self._rank_at(positional, keywords, loc)
        fn = BUILTINS.get(name)
        if fn is None:
            raise ScheduleError(
                f"unknown function '{name}' (functions: {', '.join(sorted(BUILTINS))}, rank_at)", loc,
                hint=did_you_mean(name, [*BUILTINS, "rank_at"])
                or "blocks defined with `def` are statements: call them on a line of their own",
            )
        if keywords:
            raise ScheduleError(f"{name}() takes no keyword arguments", loc)

        def call(env):
            try:
                return fn(*(a(env) for a in positional))
            except ValueFault as e:
                raise _fault(e, loc, env) from None

        return call

    def _rank_at(self, positional, keywords, loc) -> Expr:
        axes = dict(self.layout.mesh)
        if positional:
            raise ScheduleError("rank_at() takes mesh coordinates by axis name, e.g. rank_at(pp=0)", loc)
        for axis, _ in keywords:
            if axis not in axes:
                raise ScheduleError(f"rank_at(): '{axis}' is not a mesh axis (axes: {', '.join(axes) or 'none'})", loc)
        layout = self.layout
        if not keywords:
            return lambda env: env["rank"]

        def rank_at(env):
            coords = layout.coords(env["rank"])
            for axis, value in keywords:
                v = value(env)
                if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < axes[axis]:
                    raise ScheduleError(f"rank_at(): {axis}={format_value(v)} is outside the mesh ({axis} is 0..{axes[axis] - 1})", loc)
                coords[axis] = v
            return layout.rank_at(coords)

        return rank_at

    @_expression
    def typed_size(self, meta, children) -> Expr:
        dtype = Dtype(str(children[0]))
        count = children[1]
        loc = self._loc(meta)

        def typed(env):
            n = count(env)
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise _fault(ValueFault(f"{dtype.value}[...] takes a non-negative element count, got {format_value(n)}"), _loc_of(count, loc), env)
            if n * dtype.itemsize >= INT_LIMIT:
                raise _fault(ValueFault(f"{dtype.value}[{n}] is too large"), loc, env)
            return Quantity(n * dtype.itemsize, Unit.SIZE, dtype)

        return typed

    def arguments(self, meta, children):
        positional, keywords = [], []
        for c in children:
            if isinstance(c, tuple):
                keywords.append(c)
            elif keywords:
                raise ScheduleError("positional argument after a keyword argument", self._loc(meta))
            else:
                positional.append(c)
        return tuple(positional), tuple(keywords)

    def keyword_argument(self, meta, children):
        return str(children[0]), children[1]


def _no_pipeline(ctx: RankExpander, env: Env) -> None:
    """The pipeline options of an op that gives none."""
    return None


def _block(stmts: list[Stmt]) -> Stmt:
    stmts = tuple(stmts)

    def block(ctx, env):
        for s in stmts:
            s(ctx, env)

    return block


_INT_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod}
"""Operators whose result on two integers is Python's (within INT_LIMIT); `/` gives a float."""
_INT_COMPARISONS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def _fast_binary(op: str, a, b):
    # Integers dominate index arithmetic; skip the unit machinery for them.
    if type(a) is int and type(b) is int:
        if op == "+":
            r = a + b
        elif op == "-":
            r = a - b
        elif op == "*":
            r = a * b
        else:
            return binary(op, a, b)
        if -INT_LIMIT < r < INT_LIMIT:
            return r
        return checked_int(r)
    return binary(op, a, b)


def _quantity(ctx: RankExpander, v: object, unit: Unit, what: str, loc: SourceLoc) -> float:
    if isinstance(v, Quantity) and v.unit is unit:
        return v.value
    example = {Unit.SIZE: "32MiB", Unit.DURATION: "2ms", Unit.WORK: "4GFLOP"}[unit]
    raise ctx.fail(f"{what} takes a {unit.value} such as {example}, got {type_name(v)}", loc)


def _size(ctx: RankExpander, v: object, loc: SourceLoc) -> tuple[float, Dtype | None]:
    if isinstance(v, Quantity) and v.unit is Unit.SIZE:
        return v.value, v.dtype
    raise ctx.fail(f"expected a size such as 32MiB or bf16[1024], got {type_name(v)}", loc)


def _too_deep(loc: SourceLoc) -> LimitError:
    return LimitError("the program nests too deeply (expressions or blocks)", loc,
                      hint="split deeply nested expressions into assignments")  # fmt: skip


def _unknown_name(name: str, env: Env, loc: SourceLoc) -> ScheduleError:
    visible = [k for k in env if not k.startswith("__")]
    hint = did_you_mean(name, visible)
    if hint is None:
        hint = ("known names: " + ", ".join(sorted(visible)[:12]) if visible
                else "only numbers, quantities and params declared above are known here")  # fmt: skip
    ctx = env.get("__ctx__")
    return ScheduleError(f"unknown name '{name}'", loc, hint=hint, rank=ctx.rank if ctx else None)
