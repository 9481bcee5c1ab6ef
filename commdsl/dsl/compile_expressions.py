"""Expression rules: arithmetic with units, comparisons, logic, literals, names, group
attributes (`pp.rank`), builtin calls, `rank_at`, typed sizes (`bf16[n]`).

Each rule method returns an `Expr`, a closure `(env) -> value`, marked by `expression`
with its location and the names it reads. Values that need no rank are checked here
(literals too large, unknown functions); faults at run time name the expression's place.
Integer arithmetic and comparisons, which dominate loop and index expressions, are
specialised to skip the unit machinery (`_INT_OPS`).
"""

from __future__ import annotations

import operator

from lark import v_args

from commdsl.dsl.compile_base import Env, Expr, RuleSet, constant, constant_of, expression, fault, loc_of
from commdsl.dsl.replica_rank import ReplicaRank
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
    parse_quantity,
    truth,
)
from commdsl.errors import ScheduleError, SourceLoc, did_you_mean
from commdsl.ir import Dtype


@v_args(meta=True)
class ExpressionRules(RuleSet):
    """The expression rules."""

    def _fold(self, meta, children, apply) -> Expr:
        """Left-fold `a OP b OP c` with `apply(op, a, b)`; faults get this node's location."""
        loc = self._loc(meta)
        first, rest = children[0], children[1:]
        pairs = tuple((str(rest[i]), rest[i + 1]) for i in range(0, len(rest), 2))
        if len(pairs) == 1 and apply is _fast_binary and pairs[0][0] in _INT_OPS:
            (op, second), = pairs
            int_op = _INT_OPS[op]
            divides = op in ("//", "%")  # by zero: the general path says so
            a, b = constant_of(first), constant_of(second)
            if a.__class__ is int and b.__class__ is int and (b or not divides) and -INT_LIMIT < int_op(a, b) < INT_LIMIT:
                return constant(int_op(a, b))  # `stages - 1`: known before any rank runs, as fold_int would give it

            def fold_int(env):  # i + 1: integers skip the unit machinery
                try:
                    a, b = first(env), second(env)
                    if a.__class__ is int and b.__class__ is int and (b or not divides):
                        r = int_op(a, b)
                        if -INT_LIMIT < r < INT_LIMIT:
                            return r
                    return apply(op, a, b)
                except ValueFault as e:
                    raise fault(e, loc, env) from None

            return fold_int
        if len(pairs) == 1:
            (op, second), = pairs
            return self._guarded(meta, lambda env: apply(op, first(env), second(env)))

        steps = tuple((op, operand, _INT_OPS.get(op) if apply is _fast_binary else None, op in ("//", "%")) for op, operand in pairs)

        def fold(env):
            try:
                value = first(env)
                for op, operand, int_op, divides in steps:
                    b = operand(env)
                    if int_op is not None and value.__class__ is int and b.__class__ is int and (b or not divides):
                        r = int_op(value, b)
                        if -INT_LIMIT < r < INT_LIMIT:
                            value = r
                            continue
                    value = apply(op, value, b)
                return value
            except ValueFault as e:
                raise fault(e, loc, env) from None

        return fold

    @expression
    def arith(self, meta, children) -> Expr:
        return self._fold(meta, children, _fast_binary)

    @expression
    def term(self, meta, children) -> Expr:
        return self._fold(meta, children, _fast_binary)

    @expression
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
                    raise fault(e, loc, env) from None

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
                raise fault(e, loc, env) from None

        return cmp

    @expression
    def or_test(self, meta, children) -> Expr:
        return self._logic(meta, children, stop_on=True)

    @expression
    def and_test(self, meta, children) -> Expr:
        return self._logic(meta, children, stop_on=False)

    def _logic(self, meta, children, stop_on: bool) -> Expr:
        loc = self._loc(meta)
        word = "or" if stop_on else "and"

        def logic(env):
            try:
                for operand in children:
                    v = operand(env)
                    if v.__class__ is not bool:
                        truth(v, f"an operand of '{word}'")  # raises: v is no boolean
                    if v is stop_on:
                        return stop_on
                return not stop_on
            except ValueFault as e:
                raise fault(e, loc, env) from None

        return logic

    @expression
    def not_(self, meta, children) -> Expr:
        (operand,) = children
        loc = self._loc(meta)
        name = getattr(operand, "var_name", None)

        def not_(env):
            v = env[name] if name in env else operand(env)  # `not last`: no call for the name
            if v.__class__ is bool:
                return not v
            try:
                truth(v, "the operand of 'not'")  # raises: v is no boolean
            except ValueFault as e:
                raise fault(e, loc, env) from None

        return not_

    @expression
    def neg(self, meta, children) -> Expr:
        (operand,) = children
        return self._guarded(meta, lambda env: negate(operand(env)))

    def _guarded(self, meta, compute: Expr) -> Expr:
        """`compute`, with a value fault it raises reported at this expression."""
        loc = self._loc(meta)

        def guarded(env):
            try:
                return compute(env)
            except ValueFault as e:
                raise fault(e, loc, env) from None

        return guarded

    def pos(self, meta, children) -> Expr:
        return children[0]

    @expression
    def power(self, meta, children) -> Expr:
        base, _, exponent = children
        return self._guarded(meta, lambda env: binary("**", base(env), exponent(env)))

    @expression
    def int_lit(self, meta, children) -> Expr:
        text = str(children[0])
        if len(text.lstrip("0")) > 19:
            raise ScheduleError(f"integer {text[:20]}... is too large (the limit is 2**63)", self._loc(meta))
        try:
            value = checked_int(int(text))
        except ValueFault as e:
            raise ScheduleError(str(e), self._loc(meta)) from None
        return constant(value)

    @expression
    def float_lit(self, meta, children) -> Expr:
        try:
            value = checked_float(float(children[0]))
        except ValueFault:
            raise ScheduleError(f"number {children[0]} is too large", self._loc(meta)) from None
        return constant(value)

    @expression
    def quantity_lit(self, meta, children) -> Expr:
        try:
            value = parse_quantity(str(children[0]))
        except ValueFault as e:
            raise ScheduleError(str(e), self._loc(meta)) from None
        return constant(value)

    @expression
    def true_lit(self, meta, children) -> Expr:
        return constant(True)

    @expression
    def false_lit(self, meta, children) -> Expr:
        return constant(False)

    @expression
    def var(self, meta, children) -> Expr:
        name = str(children[0])
        loc = self._loc(meta)
        if name.startswith("__"):
            raise ScheduleError(f"unknown name '{name}'", loc, hint="names starting with __ are internal")
        if name == "rank":
            self.reads_rank = True
            self.rank_reads.add(("rank",))
        if name in self.constants:
            var = constant(self.constants[name])
        else:

            def var(env):
                try:
                    return env[name]
                except KeyError:
                    raise _unknown_name(name, env, loc) from None

        var.var_name = name  # lets options read `op=sum` as a bare name
        var.names = frozenset((name,))
        return var

    @expression
    def attr(self, meta, children) -> Expr:
        family, field_name = str(children[0]), str(children[1])
        loc = self._loc(meta)
        if family not in self.layout.families:
            raise ScheduleError(f"unknown group '{family}' in '{family}.{field_name}'; groups: {', '.join(self.layout.families)}",
                                loc, hint=did_you_mean(family, self.layout.families))  # fmt: skip
        if field_name not in ("rank", "size"):
            raise ScheduleError(f"a group has .rank and .size, not .{field_name}", loc)
        self.reads_rank = True  # a group's size too: groups of one family may differ in size
        self.rank_reads.add(("group", family, field_name))
        # Groups are known per rank only at run time; env["__ctx__"] is the rank's expander.
        if field_name == "size":
            return lambda env: len(env["__ctx__"].group(family, loc).ranks)

        def group_rank(env):
            ctx = env["__ctx__"]
            found = ctx.group_of.get(family)  # (group, rank in it); None: ctx says why not
            return found[1] if found is not None else ctx.group_rank(family, loc)

        return group_rank

    @expression
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
                or ("blocks defined with `def` are statements: call them on a line of their own" if name in self.block_names else None),
            )
        if keywords:
            raise ScheduleError(f"{name}() takes no keyword arguments", loc)

        def call(env):
            try:
                return fn(*(a(env) for a in positional))
            except ValueFault as e:
                raise fault(e, loc, env) from None

        return call

    def _rank_at(self, positional, keywords, loc) -> Expr:
        self.reads_rank = True
        axes = dict(self.layout.mesh)
        if positional:
            raise ScheduleError("rank_at() takes mesh coordinates by axis name, e.g. rank_at(pp=0)", loc)
        for axis, _ in keywords:
            if axis not in axes:
                raise ScheduleError(f"rank_at(): '{axis}' is not a mesh axis (axes: {', '.join(axes) or 'none'})", loc)
        layout = self.layout
        self.rank_reads.update(("rank_at", axis) for axis, _ in keywords)
        if not keywords:
            self.rank_reads.add(("rank",))
            return lambda env: env["rank"]

        def rank_at(env):
            coords = layout.coords(env["rank"])
            for axis, value in keywords:
                v = value(env)
                if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < axes[axis]:
                    raise ScheduleError(f"rank_at(): {axis}={format_value(v)} is outside the mesh ({axis} is 0..{axes[axis] - 1})", loc)
                coords[axis] = v
            uses = env["__ctx__"].rank_at_uses
            return layout.rank_at(coords) if uses is None else ReplicaRank(layout.rank_at(coords), uses, loc)

        return rank_at

    @expression
    def typed_size(self, meta, children) -> Expr:
        dtype = Dtype(str(children[0]))
        count = children[1]
        loc = self._loc(meta)

        def typed(env):
            n = count(env)
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise fault(ValueFault(f"{dtype.value}[...] takes a non-negative element count, got {format_value(n)}"), loc_of(count, loc), env)
            if n * dtype.itemsize >= INT_LIMIT:
                raise fault(ValueFault(f"{dtype.value}[{n}] is too large"), loc, env)
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


def _unknown_name(name: str, env: Env, loc: SourceLoc) -> ScheduleError:
    visible = [k for k in env if not k.startswith("__")]
    hint = did_you_mean(name, visible)
    if hint is None:
        hint = ("known names: " + ", ".join(sorted(visible)[:12]) if visible
                else "only numbers, quantities and params declared above are known here")  # fmt: skip
    ctx = env.get("__ctx__")
    return ScheduleError(f"unknown name '{name}'", loc, hint=hint, rank=ctx.rank if ctx else None)
