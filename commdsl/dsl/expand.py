"""Per-rank expansion state: what the compiled program calls to emit ops.

The compiled program (commdsl/dsl/compile.py and its rule sets) runs once per rank against a
`RankExpander`, which owns that rank's op list, handles, events, the current stream
and the shared op budget. Every check that needs only one rank's view happens here
(peers and roots in range, group membership, streams, handles, events); checks that
compare ranks live in commdsl/validate.py.

The fast path. An op statement runs once per rank and loop iteration, mostly with the
same values: the same size, peer, stream and options. So each op method takes the
statement's cache of specs (a dict the compiled statement owns; for compute, send/recv
and collectives it sits in the `*Site` record of the statement's constants) and looks up a key of every value its checks and its `OpSpec`
depend on (the rank where they do). On a hit, the spec is the one made the first time,
and the checks that are functions of the key alone are skipped: they passed then and
would pass now. What depends on the rank's state (the batch being expanded, handles,
events, live buffers) is checked every time. On a miss the method runs every check in
the order of the messages in tests/test_bad_inputs.py, makes the spec, interns it
(`InternTables`), and caches it. The op itself is then a few slots (`make_op`): rank,
index and name shared with the other ranks, kind, the spec, and the handle and per-op
numbers where it has them.
The op budget is counted per rank (`len(ops)` against what the budget had left when
the rank started) and added to the shared budget when the rank finishes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from commdsl.errors import LimitError, ScheduleError, SourceLoc, did_you_mean
from commdsl.ir import (
    HOST_STREAM,
    ROOTED_KINDS,
    SPLIT_KINDS,
    Algo,
    CopyDir,
    Dtype,
    Group,
    HostMemory,
    Op,
    OpKind,
    OpSpec,
    PipelineAction,
    Protocol,
    ReduceOp,
    Transport,
    make_op,
)
from commdsl.dsl.values import Unit, format_bytes, format_flops, format_us, format_value
from commdsl.limits import MAX_DURATION_US, MAX_FLOPS, MAX_SIZE_BYTES

_LIMITS_HINT = "the limits keep simulated times finite; see docs/limits.md"


_NO_PIPELINE = (None, None, None)

# The enum members the op methods use on every op, as module globals: on Python 3.11 an
# enum class has a metaclass `__getattr__`, which makes `OpKind.COMPUTE` several times
# dearer than reading a global.
_COMPUTE, _ALLOC, _FREE = OpKind.COMPUTE, OpKind.ALLOC, OpKind.FREE
_WAIT, _WAIT_EVENT, _RECORD = OpKind.WAIT, OpKind.WAIT_EVENT, OpKind.RECORD

_AMOUNT_LIMITS = {
    Unit.DURATION: (MAX_DURATION_US, format_us),
    Unit.WORK: (MAX_FLOPS, format_flops),
    Unit.SIZE: (MAX_SIZE_BYTES, format_bytes),
}
"""`RankExpander.check_amount`: per unit, the limit of one op and how to show it."""


@dataclass(frozen=True)
class WorldLayout:
    """The world as the program sees it: mesh, groups and streams."""

    world_size: int
    mesh: tuple[tuple[str, int], ...]
    streams: tuple[str, ...]
    families: dict[str, tuple[Group, ...]]
    """Group family name ("world", a mesh axis, a custom name) -> its groups."""
    default_transport: Transport
    default_dtype: Dtype

    def coords(self, rank: int, loc: SourceLoc | None = None) -> dict[str, int]:
        """`rank`'s coordinate on each mesh axis (none in a flat world); a rank outside the
        world is an error (at `loc`, the caller's line)."""
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise ScheduleError(f"rank must be an integer rank, got {rank!r} (the world has ranks 0..{self.world_size - 1})", loc)
        if not 0 <= rank < self.world_size:
            raise ScheduleError(f"rank {rank} is out of range: the world has ranks 0..{self.world_size - 1}", loc)
        out = {}
        rest = rank
        for axis, size in reversed(self.mesh):
            out[axis] = rest % size
            rest //= size
        return out

    def rank_at(self, coords: dict[str, int], loc: SourceLoc | None = None) -> int:
        """The rank at `coords`: a coordinate for every mesh axis, each in range; anything
        else is an error (at `loc`, the caller's line). The language's `rank_at()` fills
        in the axes its call leaves out and checks the rest first, with its own messages."""
        axes = self.axes
        for axis in coords:
            if axis not in axes:
                raise ScheduleError(f"rank_at(): '{axis}' is not a mesh axis (axes: {', '.join(axes) or 'none'})", loc,
                                    hint=None if axes else "a flat world (world_size=) has no mesh: a rank is its own number")  # fmt: skip
        if not axes:
            raise ScheduleError("rank_at(): a flat world (world_size=) has no mesh coordinates", loc,
                                hint="a rank is its own number; give the Builder mesh= for axes")  # fmt: skip
        rank = 0
        for axis, size in self.mesh:
            if axis not in coords:
                raise ScheduleError(f"rank_at(): no coordinate for mesh axis '{axis}' (give every axis: "
                                    + ", ".join(f"{a}=0..{n - 1}" for a, n in self.mesh) + ")", loc)  # fmt: skip
            v = coords[axis]
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < size:
                raise ScheduleError(f"rank_at(): {axis}={v!r} is outside the mesh ({axis} is 0..{size - 1})", loc)
            rank = rank * size + v
        return rank

    @functools.cached_property
    def axes(self) -> dict[str, int]:
        """Mesh axis -> its size (empty in a flat world)."""
        return dict(self.mesh)

    @functools.cached_property
    def membership(self) -> dict[str, dict[int, tuple[Group, int]]]:
        """Per group family, rank -> (its group, its rank in the group); built once for
        all ranks (a rank belongs to at most one group of a family)."""
        return {family: {r: (g, i) for g in groups for i, r in enumerate(g.ranks)} for family, groups in self.families.items()}


@dataclass
class ExpansionBudget:
    """Limits shared by all ranks' expansion, so absurd schedules fail fast."""

    max_ops: int
    max_steps: int
    ops: int = 0
    """Ops made by the ranks already expanded; the rank being expanded counts its own
    (`RankExpander.ops_made`) and adds them when it finishes."""
    steps: int = 0

    def charge_steps(self, n: int, loc: SourceLoc, rank: int | None = None) -> None:
        """Count `n` loop iterations or block calls about to run; fail before running them."""
        self.steps += n
        if self.steps > self.max_steps:
            raise self.too_many_steps(f"this loop would run {n:,} iterations" if n > 1 else "", loc, rank)

    def too_many_ops(self, detail: str, loc: SourceLoc, rank: int | None) -> LimitError:
        """The error of a schedule past `max_ops`; `detail` says how (may be empty)."""
        return LimitError(f"the schedule expands to more than {self.max_ops:,} ops" + (f": {detail}" if detail else ""),
                          loc, rank=rank, hint="use smaller params, or raise the limit with --max-ops")  # fmt: skip

    def too_many_steps(self, detail: str, loc: SourceLoc, rank: int | None) -> LimitError:
        """The error of a schedule past `max_steps`; `detail` says how (may be empty)."""
        return LimitError(f"expansion is limited to {self.max_steps:,} loop iterations and block calls over all ranks"
                          + (f": {detail}" if detail else ""), loc, rank=rank,
                          hint="reduce the loop bounds or params, or raise the limit with --max-ops (it scales with it)")  # fmt: skip


@dataclass(frozen=True)
class StageTransfers:
    """A rank's `stage_send` / `stage_recv` ops, for the pipeline lowering."""

    sends: tuple[int, ...]
    """Indices of the isends (each issued where it is written)."""
    recvs: tuple[int, ...]
    """Indices of the irecvs the lowering moves to where their sender sends."""


@dataclass
class InternTables:
    """Values every rank's ops share, stored once: op names (`F[3]` is the same string
    on every rank) and op specs (see `OpSpec`)."""

    names: dict[str, str] = field(default_factory=dict)
    """Each op name once: the compiler's table (`RuleSet.names`: the refs intern their texts
    there as they make them), and the names the expansion makes itself."""
    specs: dict[OpSpec, OpSpec] = field(default_factory=dict)
    annotated: dict[tuple[int, PipelineAction, int], OpSpec] = field(default_factory=dict)
    """(id of a stage_recv's spec, action, stage) -> that spec with the action and stage
    of the compute op the recv feeds (`RankExpander._annotated`)."""
    indices: list[int] = field(default_factory=list)
    """0, 1, 2, ...: op indices past 256 are objects of their own in Python, so every rank's
    op i takes its index from here rather than holding an int of its own."""
    body_writes: dict[int, frozenset[str]] = field(default_factory=dict)
    """id of a block's body (one tuple for every rank, alive as long as the compiled
    program) -> the names it assigns, with a marker if it holds a `def`
    (`commdsl.dsl.estimate.body_writes`: asked at every loop and block call of every rank)."""

    def index(self, n: int) -> int:
        """The shared int `n` (n >= 0)."""
        indices = self.indices
        if n >= len(indices):
            indices.extend(range(len(indices), 2 * n + 1024))
        return indices[n]


@dataclass(frozen=True, eq=False, slots=True)
class _Site:
    """A compiled op statement's constants, and the cache of the specs it has made (keyed
    by the values they depend on; see the module's docstring)."""

    placement: str | None
    """`on STREAM` of the statement; None: the current stream."""
    loc: SourceLoc
    cache: dict = field(default_factory=dict, kw_only=True)


@dataclass(frozen=True, eq=False, slots=True)
class ComputeSite(_Site):
    """A `compute` statement."""

    dtype: Dtype | None
    duration_loc: SourceLoc
    """Where the duration (or work) is written."""
    bytes_loc: SourceLoc


@dataclass(frozen=True, eq=False, slots=True)
class _CommSite(_Site):
    """A communication statement: its kind, group family and the options all have."""

    kind: OpKind
    family: str
    transport: Transport | None
    proto: Protocol | None
    size_loc: SourceLoc


@dataclass(frozen=True, eq=False, slots=True)
class P2PSite(_CommSite):
    """A send/recv statement (blocking, async or a pipeline stage transfer)."""

    is_async: bool
    peer_loc: SourceLoc


@dataclass(frozen=True, eq=False, slots=True)
class CollectiveSite(_CommSite):
    """A collective statement (or a barrier)."""

    reduce_op: ReduceOp | None
    algo: Algo | None
    root_loc: SourceLoc


class _Handle:
    """A bound handle: the ops it stands for, where it was bound, whether it was waited."""

    __slots__ = ("indices", "loc", "waited")

    def __init__(self, indices: tuple[int, ...], loc: SourceLoc):
        self.indices = indices
        self.loc = loc
        self.waited = False


@dataclass(slots=True)
class RankExpander:
    """Emits one rank's ops. Methods raise `ScheduleError` naming the rank and line."""

    rank: int
    layout: WorldLayout
    budget: ExpansionBudget
    tables: InternTables = field(default_factory=InternTables)
    ops: list[Op] = field(default_factory=list)
    stream_stack: list[str] = field(default_factory=list)
    current_stream: str = ""
    """The stream an op without `on STREAM` goes to: the innermost `on` block's, else the
    first declared stream."""
    batch_start: int | None = None
    """Index of the first op of the batch being expanded, if any."""
    batch_handle: str | None = None
    handles: dict[str, _Handle] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    pending_waits: list[tuple[str, SourceLoc]] = field(default_factory=list)
    """Waits on names that were neither handles nor events when issued."""
    warnings: list[str] = field(default_factory=list)
    call_depth: int = 0
    functions: dict = field(default_factory=dict)
    """Blocks defined with `def` so far: name -> (parameter names, statements)."""
    globals: dict = field(default_factory=dict)
    """Top-level variables: params, rank, world_size, and top-level assignments."""
    live: dict[str, OpSpec] = field(default_factory=dict)
    """Buffers allocated (`alloc`) and not yet freed, by name: the spec of their alloc."""
    stage_sends: list[int] = field(default_factory=list)
    stage_recvs: list[int] = field(default_factory=list)
    last_action: tuple[PipelineAction, int, int] | None = None
    """(action, stage, microbatch) of the last pipeline compute op: what a stage_send sends."""
    unannotated_recvs: list[int] = field(default_factory=list)
    """stage_recvs waiting for the pipeline compute op after them (what they feed)."""
    group_of: dict[str, tuple[Group, int]] = field(default_factory=dict)
    """Per group family this rank is in: its group and its rank in it."""
    rank_at_uses: list[SourceLoc] | None = None
    """Where the rank expands to stand for other replicas (`commdsl.dsl.fold`): the
    `rank_at()` calls whose values were used other than as a peer or a root
    (`commdsl.dsl.replica_rank`); None: `rank_at()` gives plain ints."""
    _indices: list[int] = field(init=False)
    """`tables.indices`."""
    _op_limit: int = field(init=False)
    """Most ops this rank may make: what the budget has left when it starts."""
    _fast_limit: int = field(init=False)
    """`_op_limit`, or fewer while `tables.indices` is shorter."""

    def __post_init__(self) -> None:
        self._op_limit = self.budget.max_ops - self.budget.ops
        self._fast_limit = min(self._op_limit, len(self.tables.indices))
        self._indices = self.tables.indices
        rank = self.rank
        self.group_of = {family: members[rank] for family, members in self.layout.membership.items() if rank in members}
        self.current_stream = self.layout.streams[0]

    # ---- helpers --------------------------------------------------------------

    @property
    def ops_made(self) -> int:
        """Ops made so far over all ranks, this one's included."""
        return self.budget.ops + len(self.ops)

    def fail(self, message: str, loc: SourceLoc, hint: str | None = None) -> ScheduleError:
        return ScheduleError(message, loc, hint=hint, rank=self.rank)

    def group(self, family: str, loc: SourceLoc) -> Group:
        return self._membership(family, loc)[0]

    def group_rank(self, family: str, loc: SourceLoc) -> int:
        """This rank's rank in its group of `family` (`pp.rank`)."""
        found = self.group_of.get(family)
        return found[1] if found is not None else self._membership(family, loc)[1]

    def _membership(self, family: str, loc: SourceLoc) -> tuple[Group, int]:
        found = self.group_of.get(family)
        if found is None:
            if family not in self.layout.families:
                families = self.layout.families
                raise self.fail(f"unknown group '{family}' (groups: {', '.join(families)})", loc,
                                hint=did_you_mean(str(family), families))  # fmt: skip
            members = ", ".join(str(list(x.ranks)) for x in self.layout.families[family])
            raise self.fail(f"rank {self.rank} is not a member of group '{family}' ({members})", loc)
        return found

    def _in_group(self, rank: int, family: str, group: Group) -> bool:
        """Whether `rank` is a member of `group` (of `family`): a look-up in the layout's
        membership, not a scan of the group's ranks, which is as long as the world."""
        found = self.layout.membership[family].get(rank)
        return found is not None and found[0] is group

    def push_stream(self, name: str) -> None:
        """Enter an `on STREAM:` block."""
        self.stream_stack.append(name)
        self.current_stream = name

    def pop_stream(self) -> None:
        """Leave the innermost `on STREAM:` block."""
        self.stream_stack.pop()
        self.current_stream = self.stream_stack[-1] if self.stream_stack else self.layout.streams[0]

    def stream(self, placement: str | None, loc: SourceLoc, *, allow_host: bool = False) -> str:
        name = placement if placement is not None else self.current_stream
        if name == HOST_STREAM:
            if not allow_host:
                raise self.fail(
                    "this op runs on a device stream, not on the host",
                    loc,
                    hint="only `wait ... on host` blocks the host; CPU work is `host NAME DURATION`",
                )
            return name
        if name not in self.layout.streams:
            raise self.fail(
                f"unknown stream '{name}' (declared streams: {', '.join(self.layout.streams)})",
                loc,
                hint="declare it under `streams:` in the schedule",
            )
        return name

    def _check_rank(self, what: str, value: object, loc: SourceLoc) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(f"{what} must be an integer rank, got {format_value(value)}", loc)
        if not 0 <= value < self.layout.world_size:
            raise self.fail(f"{what} {value} is out of range: the world has ranks 0..{self.layout.world_size - 1}", loc)
        return value

    def _spec(self, stream: str, loc: SourceLoc, **fields) -> OpSpec:
        """The interned spec with these fields (made on a cache miss only)."""
        spec = OpSpec(stream, loc, **fields)
        return self.tables.specs.setdefault(spec, spec)

    def _emit(self, kind: OpKind, name: str, spec: OpSpec, microbatch: int | None = None, batch: int | None = None,
              waits_for: tuple[int, ...] = (), handle: str | None = None) -> Op:  # fmt: skip
        """Append the op, counting it against the shared budget. `name` and `handle` are
        strings interned where they are made (a ref's text: `ref_text`; the expander's
        own: `InternTables.names`; or string constants)."""
        ops = self.ops
        n = len(ops)
        if n >= self._fast_limit:  # past the budget, or past the shared indices made so far
            if n >= self._op_limit:
                raise self.budget.too_many_ops("", spec.loc, self.rank)
            self.tables.index(n)  # makes more
            self._fast_limit = min(self._op_limit, len(self._indices))
        op = make_op(self.rank, self._indices[n], kind, name, handle, spec, microbatch, batch, waits_for)
        ops.append(op)
        return op

    def _size(self, name: str, size: int | float, dtype: Dtype, loc: SourceLoc, kind: OpKind) -> int:
        if size < 0:
            raise self.fail(f"{kind.value} {name}: size must not be negative, got {format_bytes(size)}", loc)
        if size > MAX_SIZE_BYTES:
            raise self.fail(f"{kind.value} {name}: size {format_bytes(size)} is more than the limit of {format_bytes(MAX_SIZE_BYTES)} "
                            "per op", loc, hint=_LIMITS_HINT)  # fmt: skip
        if not float(size).is_integer():
            raise self.fail(f"size {size:.12g}B is not a whole number of bytes", loc)  # 10000000.5B, not 1e+07B
        size = int(size)
        if size % dtype.itemsize:
            raise self.fail(
                f"size {format_bytes(size)} is not a multiple of the {dtype.value} element size ({dtype.itemsize}B)", loc
            )
        return size

    # ---- handles and batches ----------------------------------------------------

    def _bind(self, handle: str | None, indices: tuple[int, ...], loc: SourceLoc) -> None:
        if handle is None:
            return
        if handle in self.events:
            raise self.fail(f"'{handle}' is already an event; a handle needs another name", loc)
        old = self.handles.get(handle)
        if old is not None and not old.waited:
            self.warnings.append(f"{loc}: rank {self.rank}: handle '{handle}' rebound before it was waited (bound at line {old.loc.line})")
        self.handles[handle] = _Handle(indices, loc)

    def begin_batch(self, handle: str | None, loc: SourceLoc) -> None:
        if self.batch_start is not None:
            raise self.fail("batch blocks cannot be nested", loc)
        n = len(self.ops)
        self.batch_start = self._indices[n] if n < len(self._indices) else self.tables.index(n)
        self.batch_handle = handle

    def end_batch(self, loc: SourceLoc) -> None:
        start, handle = self.batch_start, self.batch_handle
        self.batch_start = self.batch_handle = None
        if start == len(self.ops):
            raise self.fail("this batch issued no isend/irecv on this rank", loc)
        if handle is not None:
            self._bind(handle, tuple(range(start, len(self.ops))), loc)

    # ---- ops ----------------------------------------------------------------------

    def check_amount(self, op_text: str, what: str, value: float, unit: Unit, loc: SourceLoc) -> None:
        """A compute or host op's duration (us), work (FLOP) or bytes: not negative, and
        within its limit (docs/limits.md). `op_text` names the op ("compute F[3]")."""
        limit, shown = _AMOUNT_LIMITS[unit]
        if value < 0:
            raise self.fail(f"{op_text}: {what} must not be negative, got {shown(value)}", loc)
        if value > limit:
            raise self.fail(f"{op_text}: {what} {shown(value)} is more than the limit of {shown(limit)} per op", loc,
                            hint=_LIMITS_HINT)  # fmt: skip

    def compute(self, site: ComputeSite, name: str, duration_us, flops, size_bytes,
                pipeline: tuple[PipelineAction, int, int] | None, flops_loc: SourceLoc) -> None:  # fmt: skip
        """A compute op; its duration, work and bytes (those given) are checked against their
        limits, each pointing at where it is written."""
        placement = site.placement
        stream = placement if placement is not None else self.current_stream
        key = (stream, duration_us, flops, size_bytes, pipeline[0] if pipeline else None, pipeline[1] if pipeline else None)
        spec = site.cache.get(key)
        if spec is None:
            loc = site.loc
            for what, x, unit, where in (("duration", duration_us, Unit.DURATION, site.duration_loc), ("flops", flops, Unit.WORK, flops_loc),
                                         ("bytes", size_bytes, Unit.SIZE, site.bytes_loc)):  # fmt: skip
                if x is not None:
                    self.check_amount(f"compute {name}", what, x, unit, where)
            stream = self.stream(placement, loc)
            self._no_batch("compute", loc)
            # `+ 0.0`: a -0.0 (`1GFLOP * -0.0`) passes the sign check and is kept as 0
            spec = self._spec(stream, loc, duration_us=None if duration_us is None else duration_us + 0.0,
                              flops=None if flops is None else flops + 0.0, size_bytes=int(size_bytes or 0),
                              dtype=site.dtype or self.layout.default_dtype, action=key[4], stage=key[5])  # fmt: skip
            site.cache[key] = spec
        elif self.batch_start is not None:
            self._no_batch("compute", site.loc)
        if pipeline is None:
            self._emit(_COMPUTE, name, spec)
            return
        self._emit(_COMPUTE, name, spec, pipeline[2])
        self.last_action = pipeline
        if self.unannotated_recvs:  # the stage_recvs just before this op receive its inputs
            action, stage, microbatch = pipeline
            for i in self.unannotated_recvs:
                recv = self.ops[i]  # as recv.replace(action=..., stage=..., microbatch=...), its spec interned
                self.ops[i] = make_op(recv.rank, recv.index, recv.kind, recv.name, recv.handle, self._annotated(recv.spec, action, stage),
                                      microbatch, recv.batch, recv.waits_for)  # fmt: skip
            self.unannotated_recvs.clear()

    def _annotated(self, spec: OpSpec, action: PipelineAction, stage: int) -> OpSpec:
        """The interned `spec` of a stage_recv with the action and stage of the compute op it feeds."""
        key = (id(spec), action, stage)  # `spec` is interned: alive, and one object per value
        out = self.tables.annotated.get(key)
        if out is None:
            out = replace(spec, action=action, stage=stage)
            out = self.tables.annotated[key] = self.tables.specs.setdefault(out, out)
        return out

    def stage_p2p(self, site: P2PSite, name: str, size, dtype: Dtype | None, peer,
                  pipeline: tuple[PipelineAction, int, int] | None) -> None:  # fmt: skip
        """`stage_send`: an isend of the last pipeline compute op's result, waited at the end
        of the program. `stage_recv`: an irecv (moved by the lowering to where its sender
        sends) and, here, the current stream's wait for it. Unless the statement names its
        action, a send belongs to the pipeline compute op before it, a recv to the one
        after it."""
        kind, loc = site.kind, site.loc
        word = "stage_send" if kind is OpKind.SEND else "stage_recv"
        if self.batch_start is not None:
            raise self.fail(f"a batch holds isend/irecv only, not {word}", loc)
        if pipeline is None and kind is OpKind.SEND:
            pipeline = self.last_action
        handle = f"{word} {name}"
        handle = self.tables.names.setdefault(handle, handle)  # the name of the wait below
        self.p2p(site, name, size, dtype, peer, handle, pipeline)
        index = len(self.ops) - 1
        del self.handles[handle]  # not a user handle: the program cannot wait on it
        if kind is OpKind.SEND:
            self.stage_sends.append(index)
            return
        self.stage_recvs.append(index)
        if pipeline is None:
            self.unannotated_recvs.append(index)
        spec = self.ops[index].spec
        self._emit(OpKind.WAIT, handle, self._spec(spec.stream, loc), waits_for=(index,))

    def stage_transfers(self) -> StageTransfers:
        return StageTransfers(tuple(self.stage_sends), tuple(self.stage_recvs))

    def alloc(self, cache: dict, name: str, size, placement, loc, size_loc) -> None:
        stream = placement if placement is not None else self.current_stream
        key = (stream, size)
        spec = cache.get(key)
        if spec is None or self.batch_start is not None or name in self.live:
            self._no_batch("alloc", loc)
            stream = self.stream(placement, loc)
            old = self.live.get(name)
            if old is not None:
                raise self.fail(f"buffer '{name}' is already allocated (line {old.loc.line}); free it before allocating it again", loc)
            size = self._size(name, size, Dtype.UINT8, size_loc or loc, OpKind.ALLOC)
            spec = cache[key] = self._spec(stream, loc, size_bytes=size, dtype=Dtype.UINT8)
        self._emit(_ALLOC, name, spec)
        self.live[name] = spec

    def free(self, cache: dict, name: str, placement, loc) -> None:
        stream = placement if placement is not None else self.current_stream
        buf = self.live.get(name)
        if buf is None or buf.stream != stream or self.batch_start is not None:
            self._no_batch("free", loc)
            stream = self.stream(placement, loc)
            if buf is None:
                live = sorted(self.live)
                hint = did_you_mean(name, live) or (f"live buffers: {', '.join(live[:8])}" if live else "`alloc` it first")
                raise self.fail(f"free {name}: no live buffer of that name on rank {self.rank}", loc, hint=hint)
            raise self.fail(f"free {name} on stream {stream}, but it was allocated on stream {buf.stream} (line {buf.loc.line})",
                            loc, hint=f"memory is ordered by stream: free it `on {buf.stream}`")  # fmt: skip
        key = (stream, buf.size_bytes)
        spec = cache.get(key)
        if spec is None:
            spec = cache[key] = self._spec(self.stream(placement, loc), loc, size_bytes=buf.size_bytes, dtype=Dtype.UINT8)
        del self.live[name]
        self._emit(_FREE, name, spec)

    def host_work(self, name: str, duration_us: float, loc, *, amount_loc=None) -> None:
        self._no_batch("host", loc)
        self.check_amount(f"host {name}", "duration", duration_us, Unit.DURATION, amount_loc or loc)
        self._emit(OpKind.HOST, name, self._spec(HOST_STREAM, loc, duration_us=duration_us))

    def copy(self, name: str, size, dtype: Dtype | None, copy_dir: CopyDir, placement, loc, *, size_loc=None,
             host_memory: HostMemory | None = None, memory_loc=None) -> None:  # fmt: skip
        """`copy NAME SIZE [from|to host] [memory=...]`: a copy within the rank's device
        memory, or between it and host memory (pinned unless `host_memory` says pageable)."""
        self._no_batch("copy", loc)
        stream = self.stream(placement, loc)
        dtype = dtype or self.layout.default_dtype
        size = self._size(name, size, dtype, size_loc or loc, OpKind.COPY)
        if copy_dir is CopyDir.D2D:
            self._device_only(host_memory, memory_loc or loc)
        elif host_memory is None:
            host_memory = HostMemory.PINNED
        self._emit(OpKind.COPY, name, self._spec(stream, loc, size_bytes=size, dtype=dtype, copy_dir=copy_dir,
                                                 host_memory=host_memory, transport=Transport.MEMCPY))  # fmt: skip

    def _device_only(self, host_memory: HostMemory | None, loc) -> None:
        """A copy that moves device memory only takes no `memory=`."""
        if host_memory is not None:
            raise self.fail("memory= says how the host buffer of a copy from or to host is allocated; this copy moves "
                            "device memory only", loc, hint="drop memory=, or copy `from host` / `to host`")  # fmt: skip

    def peer_copy(self, name: str, size, dtype: Dtype | None, peer, dest: str, placement, loc, *, peer_loc=None,
                  size_loc=None, host_memory: HostMemory | None = None, memory_loc=None) -> None:  # fmt: skip
        """`copy NAME SIZE to PEER [into DEST]`: a one-sided copy into `peer`'s buffer DEST."""
        self._no_batch("copy", loc)
        self._device_only(host_memory, memory_loc or loc)
        peer_loc = peer_loc or loc
        peer = self._check_rank("the copy's destination", peer, peer_loc)
        if peer == self.rank:
            raise self.fail(f"rank {self.rank} cannot copy to itself with `to {peer}`", peer_loc,
                            hint="a copy within the rank's own device memory has no peer: `copy x SIZE`")  # fmt: skip
        stream = self.stream(placement, loc)
        dtype = dtype or self.layout.default_dtype
        size = self._size(name, size, dtype, size_loc or loc, OpKind.COPY)
        self._emit(OpKind.COPY, name, self._spec(stream, loc, size_bytes=size, dtype=dtype, copy_dir=CopyDir.PEER, peer=peer,
                                                 dest=self.tables.names.setdefault(dest, dest), transport=Transport.MEMCPY))  # fmt: skip

    def p2p(self, site: P2PSite, name: str, size, dtype: Dtype | None, peer, handle: str | None,
            pipeline: tuple[PipelineAction, int, int] | None) -> None:  # fmt: skip
        in_batch = self.batch_start is not None
        placement = site.placement
        stream = placement if placement is not None else self.current_stream
        op_handle = self.batch_handle if in_batch else handle
        action, stage, microbatch = pipeline if pipeline is not None else _NO_PIPELINE
        key = (self.rank, size, peer, dtype, stream, in_batch, handle is None, action, stage)
        spec = site.cache.get(key)
        if spec is None or peer.__class__ is not int:  # a bool peer equals an int key, and is refused
            spec = site.cache[key] = self._p2p_spec(site, in_batch, name, size, peer, dtype, handle, action, stage)
        op = self._emit(site.kind, name, spec, microbatch, self.batch_start, (), op_handle)
        if handle is not None and not in_batch:
            self._bind(handle, (op.index,), site.loc)

    def _p2p_spec(self, site: P2PSite, in_batch: bool, name: str, size, peer, dtype, handle, action, stage) -> OpSpec:
        kind, is_async, loc = site.kind, site.is_async, site.loc
        word = ("i" if is_async else "") + kind.value
        if in_batch and not is_async:
            raise self.fail(f"a batch holds isend/irecv only, not {word}", loc, hint=f"write i{kind.value}")
        if in_batch and handle is not None:
            raise self.fail("ops inside a batch cannot bind handles; bind the batch: `h = batch:`", loc)
        if is_async and not in_batch and handle is None:
            raise self.fail(f"{word} returns a handle; bind it, e.g. `h = {word} ...`, and wait on it", loc)
        if not is_async and handle is not None:
            raise self.fail(f"{word} is synchronous and returns no handle; use i{kind.value} for a handle", loc)
        peer_loc = site.peer_loc
        peer = self._check_rank("peer", peer, peer_loc)
        if peer == self.rank:
            raise self.fail(f"rank {self.rank} cannot {kind.value} {'to' if kind is OpKind.SEND else 'from'} itself", peer_loc)
        group = self.group(site.family, loc)
        if not self._in_group(peer, site.family, group):
            raise self.fail(f"peer {peer} is not in group {group.id} (ranks {list(group.ranks)})", peer_loc)
        stream = self.stream(site.placement, loc)
        dtype = dtype or self.layout.default_dtype
        size = self._size(name, size, dtype, site.size_loc, kind)
        transport = site.transport or self.layout.default_transport
        if in_batch and transport is Transport.MEMCPY:
            raise self.fail(f"{word} {name} uses transport memcpy, which a batch cannot hold: a batch is one NCCL or gloo "
                            "launch (batch_isend_irecv), and a memcpy runs on its stream",
                            loc, hint="put memcpy transfers on streams of their own to overlap them")  # fmt: skip
        return self._spec(stream, loc, size_bytes=size, dtype=dtype, peer=peer, group=group.id, transport=transport,
                          proto=site.proto, action=action, stage=stage)  # fmt: skip

    def collective(self, site: CollectiveSite, name: str, size, dtype: Dtype | None, root, handle: str | None) -> None:
        placement = site.placement
        stream = placement if placement is not None else self.current_stream
        key = (self.rank, size, dtype, root, stream)
        spec = site.cache.get(key)
        if spec is None or self.batch_start is not None or (root is not None and root.__class__ is not int):
            spec = site.cache[key] = self._collective_spec(site, name, size, dtype, root)
        op = self._emit(site.kind, name, spec, None, None, (), handle)
        if handle is not None:
            self._bind(handle, (op.index,), site.loc)

    def _collective_spec(self, site: CollectiveSite, name: str, size, dtype, root) -> OpSpec:
        kind, loc, root_loc, size_loc = site.kind, site.loc, site.root_loc, site.size_loc
        self._no_batch(kind.value, loc)
        group = self.group(site.family, loc)
        if kind in ROOTED_KINDS:
            root = self._check_rank("root", root, root_loc)
            if not self._in_group(root, site.family, group):
                raise self.fail(f"root {root} is not in group {group.id} (ranks {list(group.ranks)})", root_loc,
                                hint="roots are global ranks, as in torch.distributed")  # fmt: skip
        stream = self.stream(site.placement, loc)
        dtype = dtype or self.layout.default_dtype
        size = self._size(name, size, dtype, size_loc, kind)
        n = len(group.ranks)
        if kind in SPLIT_KINDS and size % (n * dtype.itemsize):
            raise self.fail(
                f"{kind.value} size {format_bytes(size)} does not split into {n} equal chunks of whole "
                f"{dtype.value} elements (group {group.id} has {n} ranks)",
                size_loc,
                hint="the size of a collective is its largest buffer (nccl-tests convention)",
            )
        return self._spec(stream, loc, size_bytes=size, dtype=dtype, group=group.id, root=root, reduce_op=site.reduce_op,
                          algo=site.algo, proto=site.proto, transport=site.transport or self.layout.default_transport)  # fmt: skip

    def wait(self, cache: dict, name: str, placement, loc) -> None:
        if self.batch_start is not None:
            self._no_batch("wait", loc)
        h = self.handles.get(name)
        if h is not None:
            if h.waited:
                raise self.fail(f"handle '{name}' is waited twice (bound at line {h.loc.line})", loc)
            h.waited = True
            self._emit(_WAIT, name, self._cached_spec(cache, placement, loc, allow_host=True), None, None, h.indices)
            return
        record = self.events.get(name)
        if record is not None:
            spec = cache.get((placement if placement is not None else self.current_stream, False))  # `_cached_spec`'s hit, inline
            if spec is None:
                spec = self._cached_spec(cache, placement, loc)
            self._emit(_WAIT_EVENT, name, spec, None, None, (record,))
            return
        # Decide at the end of the rank whether it is a handle/event defined later or a typo.
        self.pending_waits.append((name, loc))

    def _cached_spec(self, cache: dict, placement, loc, *, allow_host: bool = False) -> OpSpec:
        """The spec of an op that has only a stream (wait, record)."""
        key = (placement if placement is not None else self.current_stream, allow_host)
        spec = cache.get(key)
        if spec is None:
            spec = cache[key] = self._spec(self.stream(placement, loc, allow_host=allow_host), loc)
        return spec

    def record(self, cache: dict, name: str, placement, loc) -> None:
        if self.batch_start is not None:
            self._no_batch("record", loc)
        if name in self.handles:
            raise self.fail(f"'{name}' is already a handle; an event needs another name", loc)
        spec = cache.get((placement if placement is not None else self.current_stream, False))  # `_cached_spec`'s hit, inline
        if spec is None:
            spec = self._cached_spec(cache, placement, loc)
        self.events[name] = self._emit(_RECORD, name, spec).index

    def synchronize(self, stream: str | None, loc) -> None:
        self._no_batch("synchronize", loc)
        if stream is not None:
            self.stream(stream, loc)
        self._emit(OpKind.SYNCHRONIZE, stream or "device", self._spec(stream or HOST_STREAM, loc))

    def _no_batch(self, what: str, loc) -> None:
        if self.batch_start is not None:
            raise self.fail(f"a batch holds isend/irecv only, not {what}", loc)

    def finish(self) -> None:
        """End-of-rank checks: waits on names that never became a handle or event. Then
        the stage_sends are waited, one wait per stream, at the end of the program (as
        torch.distributed.pipelining waits its sends at the end of a step)."""
        for name, loc in self.pending_waits:
            if name in self.events:
                raise self.fail(
                    f"event '{name}' is waited before it is recorded (recorded at line {self.ops[self.events[name]].loc.line})",
                    loc,
                    hint="CUDA ignores a wait on an event not yet recorded; record first",
                )
            if name in self.handles:
                raise self.fail(
                    f"handle '{name}' is waited before the op that binds it (line {self.handles[name].loc.line})", loc
                )
            known = sorted(self.handles) + sorted(self.events)
            raise self.fail(
                f"wait on '{name}': no handle or event of that name on rank {self.rank}",
                loc,
                hint=("known: " + ", ".join(known[:10])) if known else "bind a handle (`h = isend ...`) or `record` an event",
            )
        for name, h in self.handles.items():
            if not h.waited:
                self.warnings.append(f"{h.loc}: rank {self.rank}: handle '{name}' is never waited")
        by_stream: dict[str, list[int]] = {}
        for i in self.stage_sends:
            by_stream.setdefault(self.ops[i].stream, []).append(i)
        for stream, indices in by_stream.items():
            self._emit(OpKind.WAIT, "stage_send", self._spec(stream, self.ops[indices[-1]].loc), waits_for=tuple(indices))
        self.budget.ops += len(self.ops)
