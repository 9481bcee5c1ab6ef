"""Statement rules: the program, assignments, blocks (`def` and calls), `if`, `for`,
`batch:`, `on STREAM:`, `assert`, `pass`.

Each rule method returns a `Stmt`, a closure `(rank_expander, env) -> None`, and sets its
`shape` (commdsl/dsl/estimate.py) so a loop can bound what it will expand to before it
starts. Control flow runs as plain Python loops and calls over the compiled children.
"""

from __future__ import annotations

from lark import v_args

from commdsl.dsl.compile_base import OP_SHAPE, RuleSet, Stmt, loc_of
from commdsl.dsl.estimate import AssignShape, BodyShape, CallShape, DefShape, ForShape, IfShape, check_loop, expression_names
from commdsl.dsl.values import BUILTINS, ValueFault, truth, type_name
from commdsl.errors import CommdslError, ScheduleError, did_you_mean

MAX_CALL_DEPTH = 64
"""Deepest nesting of block calls (beyond it: a recursion)."""

MAX_CALL_SITES_SHOWN = 3
"""How many of the calls that led to an error inside a block its message shows."""

_NO_BLOCK = object()
"""What a call has bound its arguments to before its first call: no block at all."""


@v_args(meta=True)
class StatementRules(RuleSet):
    """The statement rules."""

    def start(self, meta, children) -> Stmt:
        return _block(children)

    def suite(self, meta, children) -> list[Stmt]:
        return children

    def pass_stmt(self, meta, children) -> Stmt:
        return lambda ctx, env: None

    def assert_stmt(self, meta, children) -> Stmt:
        cond, message_tok = children
        loc = loc_of(cond, self._loc(meta))
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

            bind.shape = OP_SHAPE
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
        checked = [_NO_BLOCK, ()]
        """The block this call last bound its arguments to (the `(params, body)` its `def`
        made), and (parameter, argument) pairs: a call of the same block again (every rank
        and iteration, as a rule) skips the checks that depend on nothing else."""

        def call(ctx, env):
            fn = ctx.functions.get(name)
            if fn is checked[0]:
                body = fn[1]
                local = ctx.globals.copy()
                for p, a in checked[1]:
                    local[p] = a(env)
            else:
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
                checked[:] = fn, (*zip(params, positional), *keywords)
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
            except CommdslError as err:
                # An error inside a block names the calls that led to it (innermost first).
                if err.loc is not None and len(err.related) < MAX_CALL_SITES_SHOWN:
                    err.related = (*err.related, (f"in {name}(), called from here", loc))
                raise
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

        block = (params, body)  # one object for every rank: calls recognise it (`call_stmt`)

        def define(ctx, env):
            ctx.functions[name] = block

        define.shape = DefShape(name)
        return define

    def parameters(self, meta, children) -> list[str]:
        return [str(c) for c in children]

    def if_stmt(self, meta, children) -> Stmt:
        cond, body, *rest = children
        branches = [(cond, body, loc_of(cond, self._loc(meta)))]
        otherwise = None
        for clause in rest:
            if clause[0] == "elif":
                branches.append(clause[1:])
            else:
                otherwise = clause[1]

        shape = IfShape(tuple(tuple(b) for _, b, _ in branches) + ((tuple(otherwise),) if otherwise else ()), otherwise is not None,
                        tuple(c for c, _, _ in branches))
        if len(branches) == 1 and otherwise is None:  # `if COND:` alone, the usual case: no loop over branches
            test, stmts, loc = branches[0]

            def run_if(ctx, env):
                taken = test(env)
                if taken.__class__ is not bool:
                    _check_condition(ctx, taken, loc)
                if taken:
                    for s in stmts:
                        s(ctx, env)

            run_if.shape = shape
            return run_if

        def run_if(ctx, env):
            for test, stmts, loc in branches:
                taken = test(env)
                if taken.__class__ is not bool:
                    _check_condition(ctx, taken, loc)
                if taken:
                    for s in stmts:
                        s(ctx, env)
                    return
            if otherwise is not None:
                for s in otherwise:
                    s(ctx, env)

        run_if.shape = shape
        return run_if

    def elif_clause(self, meta, children):
        return ("elif", children[0], children[1], loc_of(children[0], self._loc(meta)))

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
                    shown = f" ({b!r})" if isinstance(b, float) else ""  # 2.0, not the 2 a number prints as
                    raise ctx.fail(f"range() takes integers, got {type_name(b)}{shown}", loc)
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


def _check_condition(ctx, value: object, loc) -> None:
    """An `if` condition that is not a bool: one that has a truth value passes, any other
    is the schedule's error at `loc`."""
    try:
        truth(value, "an if condition")
    except ValueFault as e:
        raise ctx.fail(str(e), loc) from None


def _block(stmts: list[Stmt]) -> Stmt:
    stmts = tuple(stmts)

    def block(ctx, env):
        for s in stmts:
            s(ctx, env)

    return block
