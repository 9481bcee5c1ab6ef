"""Op statement rules: compute, host work, alloc/free, copy, send/recv (and their async
and pipeline-stage forms), the collectives, wait, record, synchronize.

Everything an op statement fixes is checked and resolved here, once: its options, enum
values, group family and stream. What is left for each rank and iteration is a closure
that evaluates the statement's expressions (name, size, peer, ...) and hands them, with
the statement's `*Site` record (its constants and spec cache), to the rank's
`RankExpander` (commdsl/dsl/expand.py), which emits the op.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from lark import Token, v_args

from commdsl.dsl.compile_base import Env, Expr, Option, Ref, RuleSet, Stmt, constant_of, loc_of, op_node
from commdsl.dsl.replica_rank import ReplicaRank, plain
from commdsl.dsl.expand import CollectiveSite, ComputeSite, P2PSite, RankExpander
from commdsl.dsl.values import Quantity, Unit, format_value, type_name
from commdsl.errors import ScheduleError, SourceLoc
from commdsl.ir import HOST_STREAM, REDUCING_KINDS, Algo, CopyDir, Dtype, HostMemory, OpKind, PipelineAction, Protocol, ReduceOp, Transport

# The units the op closures check on every op, as module globals (on Python 3.11,
# `Unit.SIZE` goes through the enum metaclass's `__getattr__`: several times dearer).
_SIZE, _DURATION, _WORK = Unit.SIZE, Unit.DURATION, Unit.WORK

_ROOT_OPTION = {OpKind.BROADCAST: "src", OpKind.SCATTER: "src", OpKind.REDUCE: "dst", OpKind.GATHER: "dst"}

_OPTIONS_BY_OP: dict[str, frozenset[str]] = {
    "compute": frozenset({"flops", "bytes", "dtype", "action", "stage", "microbatch"}),
    "copy": frozenset({"dtype", "memory"}),
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


@v_args(meta=True)
class OpRules(RuleSet):
    """The op statement rules."""

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
        amount_loc = loc_of(amount, loc)
        site = ComputeSite(stream, loc, dtype, amount_loc, bytes_opt.loc if bytes_opt else loc)
        known = constant_of(amount)  # a param or a literal: read once here, not per op
        timed = None  # (duration, work) of such an amount
        if known.__class__ is Quantity and known.unit in (_DURATION, _WORK):
            timed = (known.value, None) if known.unit is _DURATION else (None, known.value)

        text = ref.text

        def run(ctx, env, handle=None):
            if handle is not None:
                raise ctx.fail("compute returns no handle; record an event to wait on it from another stream", loc)
            size = None
            name = text(env)
            if timed is not None:
                duration_us, flops = timed
            elif amount is not None:
                duration_us = flops = None
                v = amount(env)
                if v.__class__ is Quantity and v.unit is _DURATION:
                    duration_us = v.value
                elif v.__class__ is Quantity and v.unit is _WORK:
                    flops = v.value
                else:
                    raise ctx.fail(f"compute takes a duration (2ms) or work (4GFLOP), got {type_name(v)}", loc_of(amount, loc))
            else:
                duration_us = flops = None
            flops_loc = amount_loc
            if flops_opt is not None:
                if flops is not None:
                    raise ctx.fail("work given twice (positional and flops=)", flops_opt.loc)
                flops, flops_loc = _quantity(ctx, flops_opt.value(env), Unit.WORK, "flops=", flops_opt.loc), flops_opt.loc
            if bytes_opt is not None:
                size = _quantity(ctx, bytes_opt.value(env), Unit.SIZE, "bytes=", bytes_opt.loc)
            ctx.compute(site, name, duration_us, flops, size, None if pipeline is _no_pipeline else pipeline(ctx, env), flops_loc)

        return op_node(run, "compute")

    def _pipeline_options(self, opts: dict[str, Option], loc: SourceLoc):
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
        size_loc = loc_of(size_expr, loc)
        cache: dict = {}
        sized = _constant_size(size_expr)

        def run(ctx, env, handle=None):
            if handle is not None:
                raise ctx.fail("alloc returns no handle; the buffer's name is what `free` takes", loc)
            size, _ = sized if sized is not None else _size(ctx, size_expr(env), size_loc)
            ctx.alloc(cache, ref.text(env), size, stream, loc, size_loc)

        return op_node(run, "alloc")

    def free(self, meta, children) -> Stmt:
        return self._named_op(meta, children, "free", RankExpander.free, "free returns no handle")

    def host_work(self, meta, children) -> Stmt:
        ref, amount = children
        loc = self._loc(meta)

        def run(ctx, env, handle=None):
            if handle is not None:
                raise ctx.fail("host work blocks the host and returns no handle", loc)
            amount_loc = loc_of(amount, loc)
            ctx.host_work(ref.text(env), _quantity(ctx, amount(env), Unit.DURATION, "host work", amount_loc), loc, amount_loc=amount_loc)

        return op_node(run, "host")

    def copy(self, meta, children) -> Stmt:
        ref, size_expr, peer, into, *rest = children
        placement, options = rest[-1], rest[:-1]
        loc = self._loc(meta)
        opts = self._options("copy", _OPTIONS_BY_OP["copy"], options)
        size_loc = loc_of(size_expr, loc)
        stream = self._stream_name(placement, loc, allow_host=False)
        dtype = self._dtype(opts)
        memory_opt = opts.get("memory")
        host_memory = self._enum(memory_opt, HostMemory) if memory_opt is not None else None
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
                peer_expr, peer_loc = target, loc_of(target, peer_loc)
        if into is not None and direction is not CopyDir.PEER:
            raise ScheduleError("`into NAME` names the destination buffer of a copy to another rank (`copy x SIZE to RANK into NAME`)",
                                into.loc)  # fmt: skip

        def run(ctx, env, handle=None):
            if handle is not None:
                raise ctx.fail("copy returns no handle; record an event to wait on it from another stream", loc)
            size, dt = _size(ctx, size_expr(env), size_loc)
            name = ref.text(env)
            memory = {"host_memory": host_memory, "memory_loc": memory_opt.loc if memory_opt is not None else None}
            if peer_expr is None:
                ctx.copy(name, size, dtype or dt, direction, stream, loc, size_loc=size_loc, **memory)
            else:
                dest = into.text(env) if into is not None else name
                ctx.peer_copy(name, size, dtype or dt, plain(peer_expr(env)), dest, stream, loc, peer_loc=peer_loc, size_loc=size_loc,
                              **memory)  # fmt: skip

        return op_node(run, "copy")

    def into(self, meta, children) -> Ref:
        ref = children[0]
        return Ref(ref.base, ref.indices, self._loc(meta), self.names)  # errors about it point at `into`

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
        target_loc = loc_of(target, peer_loc)
        size_loc = loc_of(size_expr, loc)
        pipeline = self._pipeline_options(opts, loc)
        site = P2PSite(stream, loc, kind, family, transport, proto, size_loc, mode is not P2PMode.BLOCKING, target_loc)

        text = ref.text
        sized = _constant_size(size_expr)
        if mode is P2PMode.STAGE:

            def run_stage(ctx, env, handle=None):
                size, dt = sized if sized is not None else _size(ctx, size_expr(env), size_loc)
                if handle is not None:
                    raise ctx.fail(f"{kind_word} returns no handle: the pipeline lowering waits for it", loc)
                ctx.stage_p2p(site, text(env), size, dtype or dt, plain(peer_expr(env)), pipeline(ctx, env))

            return op_node(run_stage, kind_word)

        def run(ctx, env, handle=None):
            if sized is not None:
                size, dt = sized
            else:
                q = size_expr(env)
                if q.__class__ is Quantity and q.unit is _SIZE:  # _size, inline: this runs for every transfer
                    size, dt = q.value, q.dtype
                else:
                    size, dt = _size(ctx, q, size_loc)
            peer = peer_expr(env)
            if peer.__class__ is ReplicaRank:  # `plain`, inline: this runs for every transfer
                peer = int.__int__(peer)
            ctx.p2p(site, text(env), size, dtype or dt, peer, handle, None if pipeline is _no_pipeline else pipeline(ctx, env))

        return op_node(run, kind_word)

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
        root_loc = loc_of(root_expr, root_opt.loc) if root_opt else loc
        size_loc = loc_of(size_expr, loc)
        site = CollectiveSite(stream, loc, kind, family, transport, proto, size_loc, reduce_op, algo, root_loc)

        def run(ctx, env, handle=None):
            if size_expr is None:
                size, dt, name = 0, None, "barrier"
            else:
                size, dt = _size(ctx, size_expr(env), size_loc)
                name = ref.text(env)
            root = plain(root_expr(env)) if root_expr is not None else None
            ctx.collective(site, name, size, dtype or dt, root, handle)

        return op_node(run, kind.value)

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
        text = ref.text

        def run(ctx, env, handle=None):
            if handle is not None:
                raise ctx.fail(no_handle, loc)
            emit(ctx, cache, text(env), stream, loc)

        return op_node(run, word)

    def synchronize(self, meta, children) -> Stmt:
        (stream_tok,) = children
        loc = self._loc(meta)
        stream = self._stream_name(stream_tok, loc, allow_host=False)

        def run(ctx, env, handle=None):
            if handle is not None:
                raise ctx.fail("synchronize returns no handle", loc)
            ctx.synchronize(stream, loc)

        return op_node(run, "synchronize")

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

    def option(self, meta, children) -> Option:
        name_tok, value = children
        return Option(str(name_tok), value, self._loc(meta), getattr(value, "var_name", None))

    def placement(self, meta, children) -> Token:
        return children[0]

    def ref(self, meta, children) -> Ref:
        name_tok, *indices = children
        indices = tuple(i for i in indices if i is not None)
        return Ref(str(name_tok), indices, self._loc(meta), self.names)


def _no_pipeline(ctx: RankExpander, env: Env) -> None:
    """The pipeline options of an op that gives none."""
    return None


def _quantity(ctx: RankExpander, v: object, unit: Unit, what: str, loc: SourceLoc) -> float:
    if isinstance(v, Quantity) and v.unit is unit:
        return v.value
    example = {Unit.SIZE: "32MiB", Unit.DURATION: "2ms", Unit.WORK: "4GFLOP"}[unit]
    raise ctx.fail(f"{what} takes a {unit.value} such as {example}, got {type_name(v)}", loc)


def _constant_size(expr: Expr) -> tuple[float, Dtype | None] | None:
    """(size, dtype) of a size known at compile time (a param, a literal), which the
    statement then need not evaluate and check for every op; None for any other."""
    v = constant_of(expr)
    return (v.value, v.dtype) if v.__class__ is Quantity and v.unit is _SIZE else None


def _size(ctx: RankExpander, v: object, loc: SourceLoc) -> tuple[float, Dtype | None]:
    if v.__class__ is Quantity and v.unit is _SIZE:
        return v.value, v.dtype
    raise ctx.fail(f"expected a size such as 32MiB or bf16[1024], got {type_name(v)}", loc)
