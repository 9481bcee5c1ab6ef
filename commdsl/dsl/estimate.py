"""Lower bounds on what a loop will expand to, so the expansion limits trip before the work.

Expanding an op costs microseconds, so counting ops as they are made would let a schedule
that expands to 10^15 ops run for a minute before it reaches the op limit. Instead, each
loop, as it starts, works out a lower bound on the ops and steps (loop iterations and
block calls) it will make, from the shapes of its statements: an op makes one op; a loop
makes its trip count times its body; an `if` makes at least the least of its branches
(nothing without an `else`); a block call makes its block. If the bound already passes
what is left of the budget, the loop fails at once, before its first iteration.

The bound is certain (never more than the expansion will really make), so no schedule
within the limits is refused: a trip count the loop body may change (it depends on the
loop variable or on a name the body assigns) counts as unknown (zero), and so does a
block call while the loop, or any block, may redefine blocks. Estimating is itself bounded (`MAX_VISITS` statements
per loop start); what it has not visited counts as zero.

The compiler (commdsl/dsl/compile_statements.py) sets a `shape` on each statement closure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from commdsl.errors import CommdslError, SourceLoc
from commdsl.dsl.values import ValueFault

MAX_VISITS = 10_000
"""Most statements one loop start looks at to bound its expansion."""
_DEFINES = "def"
"""Marker in a set of unknown names: the body defines blocks, so calls are unknown."""


@dataclass(frozen=True)
class OpShape:
    """A statement that makes one op (or fails)."""


@dataclass(frozen=True)
class AssignShape:
    """`name = expr`: makes nothing, changes `name`."""

    name: str


@dataclass(frozen=True)
class DefShape:
    """`def name(...)`: makes nothing, (re)defines a block."""

    name: str


@dataclass(frozen=True)
class BodyShape:
    """`on STREAM:` or `batch:`: makes what its body makes."""

    body: tuple[Callable, ...]


@dataclass(frozen=True)
class IfShape:
    """`if`/`elif`/`else`: makes at least the least of its branches."""

    branches: tuple[tuple[Callable, ...], ...]
    exhaustive: bool
    """Whether one branch always runs (there is an `else`)."""
    conditions: tuple[Callable, ...] = ()
    """The `if` / `elif` conditions, one per branch before the `else`."""
    condition_names: frozenset[str] = field(init=False)
    """The names the conditions read (worked out once, as `ForShape.body_assigned`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "condition_names", expression_names(self.conditions))


@dataclass(frozen=True)
class CallShape:
    """A block call `name(args)`."""

    name: str
    positional: tuple[Callable, ...]
    keywords: tuple[tuple[str, Callable], ...]


@dataclass(frozen=True)
class ForShape:
    """`for var in range(args): body`."""

    var: str
    args: tuple[Callable, ...]
    """The range's argument expressions."""
    names: frozenset[str]
    """Names the range's arguments read."""
    body: tuple[Callable, ...]
    body_assigned: frozenset[str] = field(init=False)
    """Names the loop changes from one iteration to the next (its variable, the body's
    assignments): a trip count inside that reads one of them is unknown."""

    def __post_init__(self) -> None:
        changed = assigned_names(self.body) | {self.var}
        if defines_blocks(self.body):
            changed = changed | {_DEFINES}
        object.__setattr__(self, "body_assigned", frozenset(changed))


Shape = OpShape | AssignShape | DefShape | BodyShape | IfShape | CallShape | ForShape


def expression_names(items: Sequence) -> frozenset[str]:
    """Names read by the expressions among `items` (nested lists and tuples too)."""
    out: set[str] = set()
    stack = list(items)
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        else:
            out.update(getattr(item, "names", ()))
    return frozenset(out)


def assigned_names(stmts: Sequence[Callable]) -> frozenset[str]:
    """Names that `stmts` (and the blocks nested in them, not block calls) assign."""
    out: set[str] = set()
    for shape in _shapes(stmts):
        if isinstance(shape, AssignShape):
            out.add(shape.name)
        elif isinstance(shape, ForShape):
            out |= shape.body_assigned - {_DEFINES}
        elif isinstance(shape, BodyShape):
            out |= assigned_names(shape.body)
        elif isinstance(shape, IfShape):
            for branch in shape.branches:
                out |= assigned_names(branch)
    return frozenset(out)


def defines_blocks(stmts: Sequence[Callable]) -> bool:
    """Whether `stmts` (or the blocks nested in them) hold a `def`."""
    for shape in _shapes(stmts):
        if isinstance(shape, DefShape):
            return True
        if isinstance(shape, ForShape) and _DEFINES in shape.body_assigned:
            return True
        if isinstance(shape, BodyShape) and defines_blocks(shape.body):
            return True
        if isinstance(shape, IfShape) and any(defines_blocks(b) for b in shape.branches):
            return True
    return False


def _shapes(stmts: Sequence[Callable]):
    for stmt in stmts:
        shape = getattr(stmt, "shape", None)
        if shape is not None:
            yield shape


def body_writes(ctx, body: tuple[Callable, ...]) -> frozenset[str]:
    """The names a block's `body` assigns, with `_DEFINES` if it holds a `def`: fixed by
    the compiled program, so worked out once per body (`ctx.tables.body_writes`)."""
    memo = ctx.tables.body_writes
    out = memo.get(id(body))
    if out is None:
        out = memo[id(body)] = assigned_names(body) | ({_DEFINES} if defines_blocks(body) else frozenset())
    return out


def check_loop(ctx, env: dict, shape: ForShape, trips: int, loc: SourceLoc) -> None:
    """Before a loop's first iteration: fail if the ops and steps it will certainly make
    pass what is left of the expansion budget (`ctx.budget`)."""
    if trips <= 0:
        return
    unknown = shape.body_assigned
    if any(_DEFINES in body_writes(ctx, body) for _, body in ctx.functions.values()):
        unknown = unknown | {_DEFINES}  # a call may redefine the blocks the loop calls
    ops, steps = _Bound(ctx).of(shape.body, env, unknown, 0)
    budget = ctx.budget
    made = ctx.ops_made
    if ops and made + trips * ops > budget.max_ops:
        raise budget.too_many_ops(f"this loop would add at least {trips * ops:,} ({trips:,} iterations of at least {ops:,} each) "
                                  f"to the {made:,} made so far over all ranks", loc, ctx.rank)  # fmt: skip
    if steps and budget.steps + trips * steps > budget.max_steps:
        raise budget.too_many_steps(f"this loop would add at least {trips * steps:,} nested ones to the {budget.steps:,} "
                                    "counted so far", loc, ctx.rank)  # fmt: skip


class _Bound:
    """One lower-bound computation, with its visit budget."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.visits = MAX_VISITS

    def of(self, stmts: Sequence[Callable], env: dict, unknown: frozenset[str], depth: int) -> tuple[int, int]:
        """(ops, steps) that running `stmts` in `env` certainly makes; names in `unknown`
        may hold other values by then."""
        ops = steps = 0
        for shape in _shapes(stmts):
            self.visits -= 1
            if self.visits < 0:
                break
            if isinstance(shape, OpShape):
                ops += 1
            elif isinstance(shape, ForShape):
                o, s = self._loop(shape, env, unknown, depth)
                ops, steps = ops + o, steps + s
            elif isinstance(shape, BodyShape):
                o, s = self.of(shape.body, env, unknown, depth)
                ops, steps = ops + o, steps + s
            elif isinstance(shape, IfShape) and (taken := self._taken(shape, env, unknown)) is not None:
                o, s = self.of(taken, env, unknown, depth)
                ops, steps = ops + o, steps + s
            elif isinstance(shape, IfShape) and shape.exhaustive:
                least = [self.of(b, env, unknown, depth) for b in shape.branches]
                ops, steps = ops + min(o for o, _ in least), steps + min(s for _, s in least)
            elif isinstance(shape, CallShape):
                o, s = self._call(shape, env, unknown, depth)
                ops, steps = ops + o, steps + s
        return ops, steps

    def _loop(self, shape: ForShape, env: dict, unknown: frozenset[str], depth: int) -> tuple[int, int]:
        if shape.names & unknown:
            return 0, 0
        bounds = self._values(shape.args, env)
        if bounds is None or not all(type(b) is int for b in bounds) or (len(bounds) == 3 and bounds[2] == 0):
            return 0, 0
        try:
            trips = len(range(*bounds))
        except (OverflowError, TypeError, ValueError):
            return 0, 0
        if trips <= 0:
            return 0, 0
        ops, steps = self.of(shape.body, env, unknown | shape.body_assigned, depth)
        return trips * ops, trips * (1 + steps)

    def _call(self, shape: CallShape, env: dict, unknown: frozenset[str], depth: int) -> tuple[int, int]:
        ctx = self.ctx
        fn = ctx.functions.get(shape.name)
        if fn is None or _DEFINES in unknown or depth >= _MAX_DEPTH:
            return 0, 0
        params, body = fn
        if len(shape.positional) + len(shape.keywords) != len(params):
            return 0, 0
        local = dict(ctx.globals)
        unset = set()
        for name, expr in [*zip(params, shape.positional), *shape.keywords]:
            value = None if getattr(expr, "names", frozenset()) & unknown else self._values((expr,), env)
            if value is None:
                unset.add(name)
            else:
                local[name] = value[0]
        # Globals the caller's loop may change are unknown inside the block too.
        callee_unknown = unknown | unset | body_writes(ctx, body)
        ops, steps = self.of(body, local, frozenset(callee_unknown), depth + 1)
        return ops, steps + 1

    def _taken(self, shape: IfShape, env: dict, unknown: frozenset[str]) -> tuple[Callable, ...] | None:
        """The branch an `if` takes on every pass when its conditions read nothing the
        loop changes and are booleans now (`()`: none, and no `else`); None where that
        is not known, and the bound falls back to the least over the branches."""
        if shape.condition_names & unknown:
            return None
        for cond, branch in zip(shape.conditions, shape.branches):
            value = self._values((cond,), env)
            if value is None or value[0].__class__ is not bool:
                return None
            if value[0]:
                return branch
        return shape.branches[-1] if shape.exhaustive else ()

    @staticmethod
    def _values(exprs: Sequence[Callable], env: dict) -> list | None:
        """The expressions' values, or None if any cannot be computed now (an error it
        will report when the program really runs there)."""
        try:
            return [e(env) for e in exprs]
        except (CommdslError, ValueFault, KeyError, TypeError, RecursionError):
            return None


_MAX_DEPTH = 64
"""Deepest block calls a bound follows (as deep as expansion allows)."""
