"""`Builder`: a `Program` from Python, without a schedule file.

    b = commdsl.Builder("two-stage", mesh={"pp": 2}, streams=("compute", "comm"))
    for mb in range(4):
        b.rank(0).compute(f"F[{mb}]", duration_us=2000)
        b.rank(0).send(f"act[{mb}]", 8 << 20, peer=1, group="pp")
        b.rank(1).recv(f"act[{mb}]", 8 << 20, peer=0, group="pp")
        b.rank(1).compute(f"F[{mb}]", duration_us=2000)
    program = b.build()

A planner that scores thousands of candidates builds each as a `Program` directly. Each
op call goes through the language's own per-rank expander (`commdsl.dsl.expand.RankExpander`):
the same checks and messages (peers and roots in range, group membership, streams,
handles, events, sizes, limits), and `build()` runs the same end-of-rank checks and
cross-rank validation (`commdsl.validate`) as `commdsl.load`; a deadlock is found where
the language finds it, when the program is simulated (or by `commdsl.sim.check_deadlock`).
An error points at the caller's Python file and line, as it would at a schedule's line.

Units are in the argument names: `duration_us`, `size_bytes`, `flops`.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from commdsl.dsl.expand import (
    CollectiveSite,
    ComputeSite,
    ExpansionBudget,
    InternTables,
    P2PSite,
    RankExpander,
    WorldLayout,
)
from commdsl.dsl.loader import _mesh_groups
from commdsl.errors import LimitError, ScheduleError, SourceLoc, UsageError, did_you_mean
from commdsl.ir import (
    ROOTED_KINDS,
    Algo,
    CopyDir,
    Dtype,
    Group,
    HostMemory,
    OpKind,
    PipelineAction,
    Program,
    Protocol,
    ReduceOp,
    Transport,
)
from commdsl.limits import DEFAULT_MAX_OPS, MAX_WORLD_SIZE

_INNER_FILES = (__file__, contextlib.__file__)
"""Frames of these files are the Builder's own: an error names the first frame past them."""


def caller_loc() -> SourceLoc:
    """Where the user's code called into the Builder: the innermost frame outside this
    module (and contextlib, for `with r.batch():`): file, line, the line's first
    non-blank column and its text."""
    frame = sys._getframe(1)
    while frame.f_code.co_filename in _INNER_FILES and frame.f_back is not None:
        frame = frame.f_back
    return _source_loc(frame.f_code.co_filename, frame.f_lineno)


@functools.lru_cache(maxsize=4096)
def _source_loc(file: str, line: int) -> SourceLoc:
    """One `SourceLoc` per caller line (a loop's calls share it, and the specs they key)."""
    text = linecache.getline(file, line).rstrip("\n")
    return SourceLoc(file, line, len(text) - len(text.lstrip()) + 1, text)


def _enum(enum_type, value, what: str, loc: SourceLoc):
    """`value` (a member or its name) as a member of `enum_type`; an unknown name is an
    error listing the choices."""
    if value is None or isinstance(value, enum_type):
        return value
    try:
        return enum_type(value)
    except ValueError:
        choices = [e.value for e in enum_type]
        raise ScheduleError(f"unknown {what} {value!r}; expected one of {', '.join(choices)}", loc,
                            hint=did_you_mean(str(value), choices)) from None  # fmt: skip


class Builder:
    """Builds a `Program` op by op, rank by rank (`rank(r)`), as a schedule's program
    does; `build()` finishes and validates it."""

    def __init__(self, name: str = "program", *, world_size: int | None = None, mesh: Mapping[str, int] | None = None,
                 streams: Sequence[str] = ("compute",), groups: Mapping[str, Sequence] | None = None,
                 transport: Transport | str = Transport.NCCL, dtype: Dtype | str = Dtype.FP32, doc: str = "",
                 params: Mapping[str, object] | None = None, max_ops: int = DEFAULT_MAX_OPS) -> None:  # fmt: skip
        """`mesh` (axes and sizes, outermost first, as a schedule's `world: {pp: 4, dp: 2}`)
        or `world_size` (a flat world) gives the ranks; each mesh axis is a group family
        (`group="pp"`), and so is `world`. `groups` adds custom families: a list of ranks
        (one group) or a list of lists (one group each). `streams`: the device streams,
        the first each rank's default. `transport` and `dtype`: the defaults of every op.
        `params`: recorded in the program (reports show them). `max_ops`: the op limit."""
        loc = caller_loc()
        self.loc = loc
        """Where the builder was made: the program's source."""
        if (world_size is None) == (mesh is None):
            raise ScheduleError("give the Builder either world_size= (a rank count) or mesh= (axes and sizes)", loc)
        mesh_axes: tuple[tuple[str, int], ...] = ()
        if mesh is not None:
            if not isinstance(mesh, Mapping):
                raise ScheduleError(f"mesh= must be a mapping of axis name to size, e.g. {{'pp': 4, 'dp': 2}}; got {_short(mesh)}", loc)
            mesh_axes = tuple((str(axis), _count(size, f"mesh axis '{axis}'", loc)) for axis, size in mesh.items())
            if not mesh_axes:
                raise ScheduleError("mesh= needs at least one axis, e.g. {'pp': 4}", loc)
            for axis, _ in mesh_axes:
                if not axis.isidentifier() or axis in ("world", "host"):
                    raise ScheduleError(f"'{axis}' cannot be a mesh axis (a plain name other than world and host)", loc)
            size = 1
            for _, n in mesh_axes:
                size *= n
        else:
            size = _count(world_size, "world_size", loc)
        if size > MAX_WORLD_SIZE:
            raise LimitError(f"world of {size:,} ranks exceeds the limit of {MAX_WORLD_SIZE:,}", loc)
        stream_names = _streams(streams, loc)
        families: dict[str, tuple[Group, ...]] = {"world": (Group("world", "world", tuple(range(size))),)}
        families.update(_mesh_groups(mesh_axes))
        if groups is not None and not isinstance(groups, Mapping):
            raise ScheduleError(f"groups= must be a mapping of group name to ranks, e.g. {{'pairs': [[0, 1], [2, 3]]}}; got {_short(groups)}", loc)
        for family, members in (groups or {}).items():
            if family in families:
                raise ScheduleError(f"group '{family}' is already defined (world or a mesh axis)", loc)
            families[family] = _custom_groups(str(family), members, size, loc)
        self.layout = WorldLayout(size, mesh_axes, stream_names, families, _enum(Transport, transport, "transport", loc),
                                  _enum(Dtype, dtype, "dtype", loc))  # fmt: skip
        self.name = name
        self.doc = doc
        if params is not None and not isinstance(params, Mapping):
            raise ScheduleError(f"params= must be a mapping of name to value, e.g. {{'stages': 4}}; got {_short(params)}", loc)
        self.params = tuple((str(k), str(v)) for k, v in (params or {}).items())
        max_ops = _count(max_ops, "max_ops", loc)
        self.budget = ExpansionBudget(max_ops=max_ops, max_steps=max(4 * max_ops, 1_000_000))
        self._tables = InternTables()
        self._ranks: list[RankBuilder | None] = [None] * size
        self._sites: dict[tuple, object] = {}
        """Per call site and constants: the `*Site` whose cache of specs the calls share."""
        self._built = False

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def coords(self, rank: int) -> dict[str, int]:
        """`rank`'s coordinate on each mesh axis (`{"pp": 1, "dp": 0}`; `{}` in a flat world)."""
        return self.layout.coords(rank, caller_loc())

    def rank_at(self, **coords: int) -> int:
        """The rank at these mesh coordinates (`rank_at(pp=1, dp=0)`): every axis, each in range."""
        return self.layout.rank_at(coords, caller_loc())

    def group_ranks(self, family: str, rank: int) -> tuple[int, ...]:
        """The ranks of `rank`'s group of `family` (`"pp"`, `"world"`, a custom name)."""
        loc = caller_loc()
        return self.rank(rank)._expander.group(self.family(family, loc), loc).ranks

    def family(self, group: str, loc: SourceLoc) -> str:
        """`group` if it names a group family (world, a mesh axis, a custom family)."""
        families = self.layout.families
        if not isinstance(group, str):
            raise ScheduleError(f"group must be a group family's name, got {_short(group)} (groups: {', '.join(families)})", loc)
        if group not in families:
            raise ScheduleError(f"unknown group '{group}' (groups: {', '.join(families)})", loc,
                                hint=did_you_mean(str(group), families))  # fmt: skip
        return group

    def rank(self, rank: int) -> RankBuilder:
        """The builder of `rank`'s ops, in issue order."""
        self.check_open()
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.world_size:
            raise ScheduleError(f"rank {rank!r} is out of range: the world has ranks 0..{self.world_size - 1}", caller_loc())
        rb = self._ranks[rank]
        if rb is None:
            rb = self._ranks[rank] = RankBuilder(self, RankExpander(rank, self.layout, self.budget, self._tables))
        return rb

    @property
    def ranks(self) -> Iterator[RankBuilder]:
        """Every rank's builder, rank 0 first."""
        return (self.rank(r) for r in range(self.world_size))

    def check_open(self, loc: SourceLoc | None = None) -> None:
        """After `build()`, a further op (or a second build) is an error at the caller's
        line (`loc`, found here where not given)."""
        if self._built:
            raise UsageError("this Builder has already built its program; make a new Builder for another", loc or caller_loc())

    def site(self, key: tuple, make):
        site = self._sites.get(key)
        if site is None:
            site = self._sites[key] = make()
        return site

    def build(self, *, validate: bool = True) -> Program:
        """The program: each rank's end-of-program checks (waits on names never bound),
        the op limit over all ranks, then (`validate`) the cross-rank checks `commdsl.load`
        runs (send/recv matching, collective order, peer copies)."""
        self.check_open()
        per_rank = []
        warnings: list[str] = []
        for r in range(self.world_size):
            rb = self._ranks[r]
            if rb is None:
                rb = self._ranks[r] = RankBuilder(self, RankExpander(r, self.layout, self.budget, self._tables))
            expander = rb._expander
            expander.finish()
            per_rank.append(tuple(expander.ops))
            warnings.extend(expander.warnings)
        self._built = True
        total = sum(len(ops) for ops in per_rank)
        if total > self.budget.max_ops:
            raise self.budget.too_many_ops(f"{total:,} ops", self.loc, None)
        program = Program(
            name=self.name,
            doc=self.doc,
            source=self.loc.file,
            params=self.params,
            world_size=self.world_size,
            mesh=self.layout.mesh,
            streams=self.layout.streams,
            groups=tuple(g for groups in self.layout.families.values() for g in groups),
            ops=tuple(per_rank),
            warnings=tuple(warnings),
        )
        if validate:
            from commdsl.validate import validate_program

            validate_program(program)
        return program


class RankBuilder:
    """One rank's ops, in issue order. Every method checks what the language checks of
    the same statement and raises a `ScheduleError` naming the caller's line and the rank."""

    def __init__(self, builder: Builder, expander: RankExpander) -> None:
        self._builder = builder
        self._expander = expander
        self._handles = 0

    @property
    def rank(self) -> int:
        return self._expander.rank

    @property
    def coords(self) -> dict[str, int]:
        """This rank's coordinate on each mesh axis."""
        return self._builder.layout.coords(self.rank)

    def group_rank(self, family: str) -> int:
        """This rank's rank in its group of `family` (`pp.rank` in the language)."""
        loc = caller_loc()
        return self._expander.group_rank(self._family(family, loc), loc)

    def _loc(self) -> SourceLoc:
        """The caller's location, for an op: an error once the program is built (the op
        would not be in it)."""
        loc = caller_loc()
        self._builder.check_open(loc)
        return loc

    def _name(self, name: str, loc: SourceLoc, what: str = "op name") -> str:
        if not isinstance(name, str) or not name:
            raise ScheduleError(f"{what} must be a non-empty str, got {_short(name)}", loc)
        return self._expander.tables.names.setdefault(name, name)

    def _new_handle(self, handle: str | None, word: str, loc: SourceLoc) -> str:
        """`handle` (the caller's), or the next `WORD#N` that names no handle or event yet."""
        if handle is not None:
            return self._name(handle, loc, "handle")
        expander = self._expander
        while True:
            self._handles += 1
            handle = f"{word}#{self._handles}"
            if handle not in expander.handles and handle not in expander.events and \
                    not any(n == handle for n, _ in expander.pending_waits):  # fmt: skip
                return handle

    # ---- compute and memory ---------------------------------------------------------

    def compute(self, name: str, duration_us: float | None = None, *, flops: float | None = None,
                size_bytes: int | None = None, stream: str | None = None, dtype: Dtype | str | None = None,
                action: PipelineAction | str | None = None, stage: int | None = None,
                microbatch: int | None = None) -> None:  # fmt: skip
        """A compute op: its time (`duration_us`), or its work (`flops`, timed by the
        machine's rates), and/or the bytes it moves (`size_bytes`). A pipeline's compute
        op names its `action` (forward, backward, backward_input, backward_weight),
        `stage` and `microbatch`, all three."""
        loc = self._loc()
        stream = _stream(stream, loc)
        if duration_us is None and flops is None and size_bytes is None:
            raise ScheduleError("compute needs duration_us=, flops= or size_bytes=", loc)
        if duration_us is not None and flops is not None:
            raise ScheduleError("compute takes duration_us= or flops=, not both", loc)
        pipeline = None
        given = [x is not None for x in (action, stage, microbatch)]
        if any(given):
            if not all(given):
                raise ScheduleError("a pipeline op names action=, stage= and microbatch= together", loc)
            pipeline = (_enum(PipelineAction, action, "action", loc), _int(stage, "stage", loc), _int(microbatch, "microbatch", loc))
        dtype = _enum(Dtype, dtype, "dtype", loc)
        site = self._builder.site(("compute", loc, stream, dtype), lambda: ComputeSite(stream, loc, dtype, loc, loc))
        self._expander.compute(site, self._name(name, loc), _number(duration_us, "duration_us", loc), _number(flops, "flops", loc),
                               _number(size_bytes, "size_bytes", loc, whole=True), pipeline, loc)  # fmt: skip

    def host(self, name: str, duration_us: float) -> None:
        """CPU work on the rank's host thread: it delays every op issued after it."""
        loc = self._loc()
        if duration_us is None:
            raise ScheduleError("host needs duration_us=", loc)
        self._expander.host_work(self._name(name, loc), _number(duration_us, "duration_us", loc), loc)

    def alloc(self, name: str, size_bytes: int, *, stream: str | None = None) -> None:
        """A device buffer of `size_bytes` becomes live when `stream` reaches the op."""
        loc = self._loc()
        stream = _stream(stream, loc)
        self._expander.alloc(self._builder.site(("alloc", loc), dict), self._name(name, loc), _size(size_bytes, loc), stream, loc, loc)

    def free(self, name: str, *, stream: str | None = None) -> None:
        """The buffer `name` is released when `stream` (the one it was allocated on) reaches the op."""
        loc = self._loc()
        self._expander.free(self._builder.site(("free", loc), dict), self._name(name, loc), _stream(stream, loc), loc)

    def copy(self, name: str, size_bytes: int, direction: CopyDir | str = CopyDir.D2D, *, peer: int | None = None,
             dest: str | None = None, stream: str | None = None, dtype: Dtype | str | None = None,
             memory: HostMemory | str | None = None) -> None:  # fmt: skip
        """A memcpy: `direction` h2d, d2h or d2d; with `peer`, a one-sided copy into that
        rank's buffer `dest` (default: `name`). `memory` (h2d, d2h): the host buffer is
        pinned (the default) or pageable."""
        loc = self._loc()
        stream = _stream(stream, loc)
        dtype = _enum(Dtype, dtype, "dtype", loc)
        host_memory = _enum(HostMemory, memory, "memory", loc)
        if peer is not None:
            dest = name if dest is None else self._name(dest, loc, "dest")
            self._expander.peer_copy(self._name(name, loc), _size(size_bytes, loc), dtype, peer, dest, stream, loc,
                                     host_memory=host_memory)  # fmt: skip
            return
        direction = _enum(CopyDir, direction, "copy direction", loc)
        if direction is CopyDir.PEER:
            raise ScheduleError("a peer copy names its destination rank: copy(..., peer=RANK)", loc)
        self._expander.copy(self._name(name, loc), _size(size_bytes, loc), dtype, direction, stream, loc, host_memory=host_memory)

    # ---- point to point -------------------------------------------------------------

    def send(self, name: str, size_bytes: int, peer: int, *, group: str = "world", **options) -> None:
        """A blocking send of `size_bytes` to global rank `peer` (in `group`'s family)."""
        self._p2p(OpKind.SEND, False, name, size_bytes, peer, group, None, self._loc(), **options)

    def recv(self, name: str, size_bytes: int, peer: int, *, group: str = "world", **options) -> None:
        """A blocking recv of `size_bytes` from global rank `peer`."""
        self._p2p(OpKind.RECV, False, name, size_bytes, peer, group, None, self._loc(), **options)

    def isend(self, name: str, size_bytes: int, peer: int, *, group: str = "world", handle: str | None = None,
              **options) -> str | None:  # fmt: skip
        """An asynchronous send: returns its handle (to `wait` on); inside `batch()` it
        binds none (the batch's handle stands for it)."""
        return self._p2p(OpKind.SEND, True, name, size_bytes, peer, group, handle, self._loc(), **options)

    def irecv(self, name: str, size_bytes: int, peer: int, *, group: str = "world", handle: str | None = None,
              **options) -> str | None:  # fmt: skip
        """An asynchronous recv: returns its handle, as `isend`."""
        return self._p2p(OpKind.RECV, True, name, size_bytes, peer, group, handle, self._loc(), **options)

    def _p2p(self, kind: OpKind, is_async: bool, name: str, size_bytes, peer, group: str, handle: str | None, loc: SourceLoc,
             *, stream: str | None = None, dtype: Dtype | str | None = None, transport: Transport | str | None = None,
             proto: Protocol | str | None = None) -> str | None:  # fmt: skip
        expander = self._expander
        stream = _stream(stream, loc)
        family = self._family(group, loc)
        transport = _enum(Transport, transport, "transport", loc)
        proto = _enum(Protocol, proto, "protocol", loc)
        site = self._builder.site(
            ("p2p", kind, is_async, loc, stream, family, transport, proto),
            lambda: P2PSite(stream, loc, kind, family, transport, proto, loc, is_async, loc),
        )
        if is_async and expander.batch_start is None:
            handle = self._new_handle(handle, "i" + kind.value, loc)
        expander.p2p(site, self._name(name, loc), _size(size_bytes, loc), _enum(Dtype, dtype, "dtype", loc), peer, handle, None)
        return handle

    @contextmanager
    def batch(self, *, async_op: bool = False, handle: str | None = None) -> Iterator[str | None]:
        """`with r.batch():` isends and irecvs issued as one batch_isend_irecv, waited
        at the end of the block; with `async_op=True` (or `handle=`) the batch is not
        waited: `with r.batch(async_op=True) as h:` binds its handle, to `wait(h)` later."""
        loc = self._loc()
        if _flag(async_op, "async_op", loc) or handle is not None:
            handle = self._new_handle(handle, "batch", loc)
        self._expander.begin_batch(handle, loc)
        yield handle
        self._expander.end_batch(loc)

    # ---- collectives ----------------------------------------------------------------

    def all_reduce(self, name: str, size_bytes: int, *, group: str = "world", **options) -> str | None:
        """An all_reduce of `size_bytes` over `group`; `async_op=True` (or `handle=`)
        returns its handle. Options: stream, dtype, op (sum, avg, max, min, prod),
        algo, proto, transport."""
        return self._collective(OpKind.ALL_REDUCE, name, size_bytes, group, None, self._loc(), **options)

    def reduce_scatter(self, name: str, size_bytes: int, *, group: str = "world", **options) -> str | None:
        """A reduce_scatter; `size_bytes` is its input (the largest buffer)."""
        return self._collective(OpKind.REDUCE_SCATTER, name, size_bytes, group, None, self._loc(), **options)

    def all_gather(self, name: str, size_bytes: int, *, group: str = "world", **options) -> str | None:
        """An all_gather; `size_bytes` is its output."""
        return self._collective(OpKind.ALL_GATHER, name, size_bytes, group, None, self._loc(), **options)

    def all_to_all(self, name: str, size_bytes: int, *, group: str = "world", **options) -> str | None:
        """An all_to_all; `size_bytes` is one rank's whole input."""
        return self._collective(OpKind.ALL_TO_ALL, name, size_bytes, group, None, self._loc(), **options)

    def broadcast(self, name: str, size_bytes: int, root: int, *, group: str = "world", **options) -> str | None:
        """A broadcast from global rank `root`."""
        return self._collective(OpKind.BROADCAST, name, size_bytes, group, root, self._loc(), **options)

    def reduce(self, name: str, size_bytes: int, root: int, *, group: str = "world", **options) -> str | None:
        """A reduce to global rank `root`."""
        return self._collective(OpKind.REDUCE, name, size_bytes, group, root, self._loc(), **options)

    def gather(self, name: str, size_bytes: int, root: int, *, group: str = "world", **options) -> str | None:
        """A gather to `root`; `size_bytes` is the root's output."""
        return self._collective(OpKind.GATHER, name, size_bytes, group, root, self._loc(), **options)

    def scatter(self, name: str, size_bytes: int, root: int, *, group: str = "world", **options) -> str | None:
        """A scatter from `root`; `size_bytes` is the root's input."""
        return self._collective(OpKind.SCATTER, name, size_bytes, group, root, self._loc(), **options)

    def barrier(self, *, group: str = "world", **options) -> str | None:
        """A barrier over `group`."""
        if "root" in options:
            raise ScheduleError("barrier takes no root=: every rank of the group waits for the others", self._loc())
        return self._collective(OpKind.BARRIER, "barrier", 0, group, None, self._loc(), **options)

    def _collective(self, kind: OpKind, name: str, size_bytes, group: str, root, loc: SourceLoc, *, stream: str | None = None,
                    dtype: Dtype | str | None = None, op: ReduceOp | str | None = None, algo: Algo | str | None = None,
                    proto: Protocol | str | None = None, transport: Transport | str | None = None,
                    async_op: bool = False, handle: str | None = None) -> str | None:  # fmt: skip
        stream = _stream(stream, loc)
        family = self._family(group, loc)
        reduce_op = _enum(ReduceOp, op, "reduce op", loc)
        if reduce_op is not None and kind not in (OpKind.ALL_REDUCE, OpKind.REDUCE, OpKind.REDUCE_SCATTER):
            raise ScheduleError(f"{kind.value} does not reduce: it takes no op=", loc)
        if reduce_op is None and kind in (OpKind.ALL_REDUCE, OpKind.REDUCE, OpKind.REDUCE_SCATTER):
            reduce_op = ReduceOp.SUM
        if kind in ROOTED_KINDS and root is None:
            raise ScheduleError(f"{kind.value} needs root=", loc)
        algo, proto = _enum(Algo, algo, "algo", loc), _enum(Protocol, proto, "protocol", loc)
        transport = _enum(Transport, transport, "transport", loc)
        site = self._builder.site(
            ("collective", kind, loc, stream, family, reduce_op, algo, proto, transport),
            lambda: CollectiveSite(stream, loc, kind, family, transport, proto, loc, reduce_op, algo, loc),
        )
        if _flag(async_op, "async_op", loc) or handle is not None:
            handle = self._new_handle(handle, kind.value, loc)
        self._expander.collective(site, self._name(name, loc), _size(size_bytes, loc), _enum(Dtype, dtype, "dtype", loc),
                                  root, handle)  # fmt: skip
        return handle

    def _family(self, group: str, loc: SourceLoc) -> str:
        return self._builder.family(group, loc)

    # ---- synchronisation --------------------------------------------------------------

    def wait(self, name: str, *, stream: str | None = None) -> None:
        """Wait on a handle (an async op or a batch) or an event: the stream (`"host"`:
        the host thread, for a handle) waits until it completes."""
        loc = self._loc()
        self._expander.wait(self._builder.site(("wait", loc), dict), self._name(name, loc, "the name waited on"), _stream(stream, loc), loc)

    def record(self, event: str, *, stream: str | None = None) -> None:
        """Record an event on `stream`; another stream's `wait(event)` waits for it."""
        loc = self._loc()
        self._expander.record(self._builder.site(("record", loc), dict), self._name(event, loc, "event name"), _stream(stream, loc), loc)

    def synchronize(self, stream: str | None = None) -> None:
        """The host waits for `stream` (None: the whole device)."""
        loc = self._loc()
        self._expander.synchronize(_stream(stream, loc), loc)

    @contextmanager
    def on(self, stream: str) -> Iterator[None]:
        """`with r.on("comm"):` ops without `stream=` go to `stream`."""
        loc = self._loc()
        stream = self._name(stream, loc, "stream")
        self._expander.stream(stream, loc)
        self._expander.push_stream(stream)
        try:
            yield
        finally:
            self._expander.pop_stream()


def _count(value: object, what: str, loc: SourceLoc) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ScheduleError(f"{what} must be an integer >= 1, got {value!r}", loc)
    return value


def _int(value: object, what: str, loc: SourceLoc) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ScheduleError(f"{what} must be an integer >= 0, got {value!r}", loc)
    return value


def _number(value: object, what: str, loc: SourceLoc, *, whole: bool = False):
    """A size, duration or work given by the caller (`what`: its argument's name): an int
    or finite float (the expander checks its range and limits), a whole number if `whole`;
    None passes. An int past any float is past every limit (docs/limits.md)."""
    if value is None:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > sys.float_info.max:
            raise LimitError(f"{what}={'-' if value < 0 else ''}1e{value.bit_length() * 0.30103:.0f} (roughly) is beyond every "
                             "limit of one op", loc, hint="see docs/limits.md for the limits of one op")  # fmt: skip
        return value
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        if whole and not value.is_integer():
            raise ScheduleError(f"{what} must be a whole number, got {value!r}", loc)
        return value
    raise ScheduleError(f"{what} must be a finite number, got {_short(value)}", loc,
                        hint="sizes are size_bytes, times duration_us, work flops: plain numbers")  # fmt: skip


def _size(value: object, loc: SourceLoc):
    """An op's `size_bytes`, which it must have (the expander checks it is whole and in range)."""
    if value is None:
        raise ScheduleError("size_bytes must be a finite number, got None", loc)
    return _number(value, "size_bytes", loc)


def _stream(stream: object, loc: SourceLoc) -> str | None:
    """A `stream=` argument: a name or None (the current stream)."""
    if stream is None or isinstance(stream, str):
        return stream
    raise ScheduleError(f"stream= must be a stream's name, got {_short(stream)}", loc)


def _flag(value: object, what: str, loc: SourceLoc) -> bool:
    if not isinstance(value, bool):
        raise ScheduleError(f"{what}= must be True or False, got {_short(value)}", loc)
    return value


def _short(value: object) -> str:
    """`value` for a message: its repr, clipped, and its type."""
    text = repr(value)
    return f"{text[:60] + '...' if len(text) > 60 else text} ({type(value).__name__})"


def _streams(streams: Sequence[str], loc: SourceLoc) -> tuple[str, ...]:
    if isinstance(streams, str) or not isinstance(streams, Sequence) or not streams:
        raise ScheduleError("streams= must be a non-empty list of names, e.g. ('compute', 'comm')", loc)
    names: list[str] = []
    for name in streams:
        if not isinstance(name, str) or not name.isidentifier():
            raise ScheduleError(f"stream names must be plain names, got {name!r}", loc)
        if name == "host":
            raise ScheduleError("'host' is the host thread, not a stream; choose another name", loc)
        if name in names:
            raise ScheduleError(f"stream '{name}' is declared twice", loc)
        names.append(name)
    return tuple(names)


def _custom_groups(name: str, members: Sequence, world_size: int, loc: SourceLoc) -> tuple[Group, ...]:
    """A custom group family, as a schedule's `groups:` entry: a list of ranks, or a list of lists."""
    if not name.isidentifier():
        raise ScheduleError(f"group names must be plain names, got {name!r}", loc)
    if isinstance(members, (str, bytes)) or not isinstance(members, Sequence) or not members:
        raise ScheduleError(f"group '{name}' must be a list of ranks, or a list of lists of ranks", loc)
    nested = not isinstance(members[0], int)
    lists = list(members) if nested else [members]
    groups, seen = [], set()
    for i, ranks in enumerate(lists):
        if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Sequence) or not ranks:
            raise ScheduleError(f"group '{name}': each member must be a non-empty list of ranks", loc)
        for r in ranks:
            if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < world_size:
                raise ScheduleError(f"group '{name}': rank {r!r} is out of range (world has ranks 0..{world_size - 1})", loc)
            if r in seen:
                raise ScheduleError(f"group '{name}': rank {r} appears twice (a rank may belong to one group of a family)", loc)
            seen.add(r)
        groups.append(Group(f"{name}[{i}]" if nested else name, name, tuple(ranks)))
    return tuple(groups)
