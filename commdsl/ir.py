"""The IR: the one format the simulator, the executor and every report consume.

A `Program` is a static, per-rank, ordered list of `Op`s plus the world, its groups and
streams. It is produced by the front end (`commdsl.dsl`) and nothing downstream ever
sees a parse tree. Every op carries its source location so any later stage (validation,
deadlock reports, the executor's watchdog) can point at the line that caused it.

Conventions:
  * ranks are global ranks; `peer` and `root` are global ranks too, as in torch.distributed;
  * `size_bytes` of a collective is the size of its largest buffer, as nccl-tests counts
    it: the all_reduce buffer, the all_gather output, the reduce_scatter input, the
    gather output / scatter input at the root, the whole all_to_all input of one rank;
  * an op with a `handle` is asynchronous (async_op=True); without one it is synchronous,
    i.e. async followed at once by a wait on the issuing stream.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields, make_dataclass
from dataclasses import replace as _dataclass_replace
from operator import attrgetter

from commdsl.errors import SourceLoc

HOST_STREAM = "host"
"""Pseudo-stream of the rank's host thread: host work and host-blocking waits."""


class OpKind(str, enum.Enum):
    COMPUTE = "compute"
    HOST = "host"
    COPY = "copy"
    SEND = "send"
    RECV = "recv"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALL_REDUCE = "all_reduce"
    GATHER = "gather"
    ALL_GATHER = "all_gather"
    SCATTER = "scatter"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BARRIER = "barrier"
    WAIT = "wait"
    """Wait on a handle: the op's stream (or the host) waits for the async op(s)."""
    RECORD = "record"
    WAIT_EVENT = "wait_event"
    SYNCHRONIZE = "synchronize"
    ALLOC = "alloc"
    """A named device buffer of `size_bytes` becomes live when its stream reaches the op."""
    FREE = "free"
    """The buffer `name` is released when its stream reaches the op (`size_bytes`: its size)."""

    @property
    def is_p2p(self) -> bool:
        return self in P2P_KINDS

    @property
    def is_collective(self) -> bool:
        return self in COLLECTIVE_KINDS

    @property
    def is_comm(self) -> bool:
        return self in P2P_KINDS or self in COLLECTIVE_KINDS


P2P_KINDS = frozenset({OpKind.SEND, OpKind.RECV})
COLLECTIVE_KINDS = frozenset(
    {
        OpKind.BROADCAST,
        OpKind.REDUCE,
        OpKind.ALL_REDUCE,
        OpKind.GATHER,
        OpKind.ALL_GATHER,
        OpKind.SCATTER,
        OpKind.REDUCE_SCATTER,
        OpKind.ALL_TO_ALL,
        OpKind.BARRIER,
    }
)
ROOTED_KINDS = frozenset({OpKind.BROADCAST, OpKind.REDUCE, OpKind.GATHER, OpKind.SCATTER})
REDUCING_KINDS = frozenset({OpKind.REDUCE, OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER})
SPLIT_KINDS = frozenset({OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER, OpKind.GATHER, OpKind.SCATTER, OpKind.ALL_TO_ALL})
"""Collectives whose size is split into one chunk per group member."""


MEMORY_KINDS = frozenset({OpKind.ALLOC, OpKind.FREE})
"""Ops that only change a rank's live device memory: no time, no launch cost."""


class PipelineAction(str, enum.Enum):
    """What a compute op is in a pipeline schedule, as torch.distributed.pipelining names
    it (`_ComputationType`): the letter in its actions (`2F0`, `1I3`)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    """The full backward: input and weight gradients together (B)."""
    BACKWARD_INPUT = "backward_input"
    """The input (activation) gradient only (I); its weight gradient comes later."""
    BACKWARD_WEIGHT = "backward_weight"
    """The weight gradient (W), after the input gradient of the same microbatch."""

    @property
    def letter(self) -> str:
        return _ACTION_LETTER[self]

    @classmethod
    def from_letter(cls, letter: str) -> PipelineAction:
        return _LETTER_ACTION[letter]


_ACTION_LETTER = {PipelineAction.FORWARD: "F", PipelineAction.BACKWARD: "B", PipelineAction.BACKWARD_INPUT: "I",
                  PipelineAction.BACKWARD_WEIGHT: "W"}  # fmt: skip
_LETTER_ACTION = {v: k for k, v in _ACTION_LETTER.items()}


class ReduceOp(str, enum.Enum):
    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"
    PROD = "prod"


class Transport(str, enum.Enum):
    NCCL = "nccl"
    GLOO = "gloo"
    MEMCPY = "memcpy"


class Algo(str, enum.Enum):
    """Collective algorithm override; None in an op means: choose as NCCL would.
    NVLS, NVLS_TREE and the CollNet algorithms need the hardware (NVLink SHARP, an
    in-network reduction) and the machine must declare it (`nccl:` in the machine file)."""

    RING = "ring"
    TREE = "tree"
    CHAIN = "chain"
    DIRECT = "direct"
    NVLS = "nvls"
    """NVLink SHARP: the NVSwitch reduces (multimem loads) and multicasts the result."""
    NVLS_TREE = "nvls_tree"
    """NVLS inside each node, a double binary tree between the nodes."""
    COLLNET_DIRECT = "collnet_direct"
    """In-network reduction (IB SHARP): every GPU of a node talks to the switch directly."""
    COLLNET_CHAIN = "collnet_chain"
    """In-network reduction through a chain of the node's GPUs."""
    PAT = "pat"
    """Parallel Aggregated Trees (NCCL 2.23+): all_gather / reduce_scatter with one GPU per
    node, in log2(nodes) tree levels rather than a ring's nodes - 1 steps."""


class Protocol(str, enum.Enum):
    """NCCL's wire protocols: how data and the flags that signal it share the wire."""

    SIMPLE = "simple"
    """Large chunks, then a memory fence and a flag: full bandwidth, the highest latency."""
    LL = "ll"
    """Low latency: 4 bytes of data and a 4-byte flag in every 8-byte store."""
    LL128 = "ll128"
    """120 bytes of data and 8 of flag in every 128-byte line (needs NVLink-class ordering)."""


class CopyDir(str, enum.Enum):
    H2D = "h2d"
    D2H = "d2h"
    D2D = "d2d"
    PEER = "peer"
    """One-sided copy into another rank's device memory (`copy x 64MiB to 2`): no op on
    the destination; `Op.peer` is the destination, `Op.dest` the buffer it writes."""


class HostMemory(str, enum.Enum):
    """How the host buffer of a host <-> device copy is allocated (`memory=` on a copy)."""

    PINNED = "pinned"
    """Page-locked (`cudaMallocHost`, `pin_memory=True`): the copy engines read or write
    it directly, and the copy is asynchronous to the host."""
    PAGEABLE = "pageable"
    """Ordinary host memory: the driver stages the copy through pinned buffers with a
    CPU memcpy, and the call returns only when the copy is done, so it blocks the
    host for the whole copy."""


class Dtype(str, enum.Enum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP64 = "fp64"
    FP8 = "fp8"
    INT8 = "int8"
    UINT8 = "uint8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    BOOL = "bool"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]


_ITEMSIZE = {
    Dtype.BF16: 2, Dtype.FP16: 2, Dtype.FP32: 4, Dtype.FP64: 8, Dtype.FP8: 1,
    Dtype.INT8: 1, Dtype.UINT8: 1, Dtype.INT16: 2, Dtype.INT32: 4, Dtype.INT64: 8,
    Dtype.BOOL: 1,
}  # fmt: skip


@dataclass(frozen=True)
class _OpFields:
    """Every field of an `Op`: its name, type, default and meaning. `Op(...)` takes these
    arguments, and `dataclasses.fields`, `replace` and `asdict` see them on an op."""

    rank: int
    """Global rank that issues the op."""
    index: int
    """Position in the rank's program (issue order); with `rank` it is the op's identity."""
    kind: OpKind
    name: str
    """Label: the op or tensor name with its index resolved (`F[3]`, `act[3]`), the
    event name for record/wait_event, the handle name for wait."""
    stream: str
    """Stream the op is issued on; `HOST_STREAM` for host work and host-blocking waits."""
    loc: SourceLoc
    """Where the statement that produced the op is written."""
    duration_us: float | None = None
    """Explicit time (compute, host work)."""
    flops: float | None = None
    """Work of a compute op, in floating-point operations."""
    size_bytes: int = 0
    """Payload of a transfer/collective; memory traffic of a compute op."""
    dtype: Dtype = Dtype.FP32
    peer: int | None = None
    """SEND and peer COPY: destination rank; RECV: source rank (global ranks)."""
    dest: str | None = None
    """Peer COPY: the name of the buffer it writes on `peer` (`into NAME`; else the op's
    own name)."""
    group: str | None = None
    """Group id (see `Group.id`) of a communication op."""
    root: int | None = None
    """Root (global rank) of broadcast / reduce / gather / scatter."""
    reduce_op: ReduceOp | None = None
    transport: Transport | None = None
    algo: Algo | None = None
    proto: Protocol | None = None
    """NCCL protocol forced by the op (`proto=`); None: NCCL's choice."""
    copy_dir: CopyDir | None = None
    host_memory: HostMemory | None = None
    """Host COPY (h2d, d2h): how its host buffer is allocated; None on every other op."""
    handle: str | None = None
    """Handle bound by an asynchronous op; None for a synchronous op."""
    batch: int | None = None
    """For P2P ops issued as one batch_isend_irecv: index of the batch's first op."""
    waits_for: tuple[int, ...] = ()
    """WAIT: indices of the ops the handle stands for; WAIT_EVENT: index of the RECORD."""
    action: PipelineAction | None = None
    """In a pipeline schedule: what the compute op is, or (a `stage_send`/`stage_recv`
    transfer) the compute op whose output it sends or whose input it receives."""
    stage: int | None = None
    """The pipeline stage of `action` (0 = the first stage of the model)."""
    microbatch: int | None = None
    """The microbatch of `action`."""


_PER_OP_FIELDS = ("rank", "index", "kind", "name", "handle", "batch", "waits_for", "microbatch")
"""The fields of an op stored on the op itself; the others are in its `OpSpec`."""

OpSpec = make_dataclass(
    "OpSpec",
    [(f.name, f.type, field(default=f.default)) for f in fields(_OpFields) if f.name not in _PER_OP_FIELDS],
    frozen=True,
    slots=True,
)
OpSpec.__module__ = __name__
OpSpec.__doc__ = """The fields of an op that one statement gives every op it makes on one rank with
the same values: every field of `_OpFields` (in its order, with its default) but the
per-op ones (`_PER_OP_FIELDS`). Expansion interns them, so a million ops share a few
hundred specs."""


_OP_SLOTS = ("rank", "index", "kind", "name", "spec")
"""`Op`'s storage: the fields every op has its own value of, and the spec."""
_RARE_FIELDS = ("handle", "microbatch", "batch", "waits_for")
"""The per-op fields most ops leave at their default: an op that sets one is an
`_MicrobatchOp` (microbatch only) or a `_SyncOp` (any of the others), which store them."""
_SPEC_FIELDS = tuple(OpSpec.__dataclass_fields__)
_FIELD_NAMES = tuple(_OpFields.__dataclass_fields__)


class Op:
    """One statement of one rank's program after expansion: a record with the fields of
    `_OpFields`, read by attribute (`op.kind`, `op.size_bytes`).

    Storage: the fields that differ from op to op are slots of the op: rank, index, kind,
    name, and (`_RARE_FIELDS`) handle, microbatch, batch and waits_for where the op sets
    them, its class saying which it stores: most ops set none of those four (an `Op`, 72
    bytes), a pipeline's compute op only its microbatch (`_MicrobatchOp`), an asynchronous
    op, a batched P2P op or a wait the others (`_SyncOp`, 104 bytes); an `Op` reads them as
    class attributes with the defaults. The other fields live in `spec`, an `OpSpec` shared
    by the ops one statement makes with the same values, and are read through properties
    of the same names (those cannot be assigned). `Op(...)` takes every field as before
    and makes an op of the class its values need, as `make_op` does (expansion's
    constructor, with interned specs); `isinstance(x, Op)` holds for all three. Equality
    and hashing compare every field.

    An op is immutable by contract: nothing assigns to one (`replace` makes a changed
    copy). Unlike the frozen dataclass it replaces, it does not refuse an assignment to
    its own slots: making ops is most of what expansion does, and the guard (filling the
    slots past it) would make every op dearer to make."""

    __slots__ = _OP_SLOTS
    __dataclass_fields__ = _OpFields.__dataclass_fields__  # dataclasses.fields/replace/asdict see the fields
    __dataclass_params__ = _OpFields.__dataclass_params__  # type: ignore[attr-defined]
    __match_args__ = _FIELD_NAMES

    rank: int
    index: int
    kind: OpKind
    name: str
    spec: OpSpec  # type: ignore[valid-type]
    """The fields shared with other ops; read them as `op.stream`, `op.size_bytes`, ..."""
    handle: str | None = None
    microbatch: int | None = None
    batch: int | None = None
    waits_for: tuple[int, ...] = ()

    def __new__(cls, rank: int, index: int, kind: OpKind, name: str, stream: str, loc: SourceLoc,
                duration_us: float | None = None, flops: float | None = None, size_bytes: int = 0,
                dtype: Dtype = Dtype.FP32, peer: int | None = None, dest: str | None = None, group: str | None = None,
                root: int | None = None, reduce_op: ReduceOp | None = None, transport: Transport | None = None,
                algo: Algo | None = None, proto: Protocol | None = None, copy_dir: CopyDir | None = None,
                handle: str | None = None, batch: int | None = None, waits_for: tuple[int, ...] = (),
                action: PipelineAction | None = None, stage: int | None = None, microbatch: int | None = None,
                host_memory: HostMemory | None = None):  # fmt: skip
        spec = OpSpec(stream, loc, duration_us, flops, size_bytes, dtype, peer, dest, group, root, reduce_op, transport,
                      algo, proto, copy_dir, host_memory, action, stage)  # fmt: skip
        # Made here, not in __init__: the op's class follows from its values (Python would
        # not call __init__ on an op of another class than the one `cls` names).
        return make_op(rank, index, kind, name, handle, spec, microbatch, batch, waits_for)

    def _key(self) -> tuple:
        return (self.rank, self.index, self.kind, self.name, self.handle, self.microbatch, self.batch, self.waits_for, self.spec)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Op):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return "Op(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELD_NAMES) + ")"

    def __reduce__(self):
        return make_op, (self.rank, self.index, self.kind, self.name, self.handle, self.spec, self.microbatch, self.batch,
                         self.waits_for)  # fmt: skip

    def replace(self, **changes) -> Op:
        """A copy with `changes` (field names as in `Op(...)`); as `dataclasses.replace`."""
        spec_changes = {k: changes.pop(k) for k in list(changes) if k in _SPEC_FIELDS}
        spec = _dataclass_replace(self.spec, **spec_changes) if spec_changes else self.spec
        values = {name: getattr(self, name) for name in _PER_OP_FIELDS}
        for k, v in changes.items():
            if k not in values:
                raise TypeError(f"Op has no field {k!r}")
            values[k] = v
        return make_op(values["rank"], values["index"], values["kind"], values["name"], values["handle"], spec,
                       values["microbatch"], values["batch"], values["waits_for"])  # fmt: skip

    @property
    def id(self) -> str:
        """Stable identity across predicted and measured timelines: "rank:index"."""
        return f"{self.rank}:{self.index}"

    @property
    def label(self) -> str:
        """How messages name the op: its kind and name (`send act[3]`); a barrier, which
        has no name of its own, by its kind."""
        return self.kind.value if self.kind is OpKind.BARRIER else f"{self.kind.value} {self.name}"

    @property
    def is_async(self) -> bool:
        return self.handle is not None

    @property
    def is_peer_copy(self) -> bool:
        """A one-sided copy into another rank's buffer (`copy x SIZE to PEER`)."""
        return self.kind is OpKind.COPY and self.spec.copy_dir is CopyDir.PEER

    @property
    def is_memcpy_transfer(self) -> bool:
        """Bytes moved to or from another rank by memcpy: a peer copy, or a send/recv with
        transport=memcpy. It runs on its stream and the GPUs' copy engines, ordered only
        by its stream, events and waits: no communicator, no comm queue."""
        spec = self.spec
        return spec.transport is Transport.MEMCPY and (self.kind in P2P_KINDS or spec.copy_dir is CopyDir.PEER)

    def to_json(self) -> dict:
        out: dict = {"id": self.id, "rank": self.rank, "index": self.index, "kind": self.kind.value}
        for name in _JSON_FIELDS:
            value = getattr(self, name)
            if value is None or value == () or (name == "size_bytes" and value == 0):
                continue
            out[name] = value.value if isinstance(value, enum.Enum) else value
        if self.size_bytes:
            out["dtype"] = self.dtype.value
        out["loc"] = str(self.loc)
        return out


for _name in _SPEC_FIELDS:  # op.stream is op.spec.stream, and so on (attrgetter: no Python frame per read)
    setattr(Op, _name, property(attrgetter("spec." + _name), doc=f"`{_name}` of the op (stored in its `spec`)."))
del _name


class _MicrobatchOp(Op):
    """An op whose only non-default rare field is its microbatch (a pipeline's compute op)."""

    __slots__ = ("microbatch",)


class _SyncOp(Op):
    """An op with a handle, a batch or ops it waits for: it stores every rare field."""

    __slots__ = ("handle", "microbatch", "batch", "waits_for")


def make_op(rank: int, index: int, kind: OpKind, name: str, handle: str | None, spec: OpSpec, microbatch: int | None,
            batch: int | None, waits_for: tuple[int, ...]) -> Op:  # fmt: skip
    """An op from its per-op fields and a (shared) spec: the expansion's constructor. Its
    class is the smallest that stores its rare fields (`_RARE_FIELDS`)."""
    # Each class's slots are set in a branch of its own: an attribute store specialises to
    # one class (CPython 3.11's inline caches), and one store site for the three classes
    # would miss most of the time.
    if handle is None and batch is None and not waits_for:
        if microbatch is None:
            op = new_op(Op)
            op.rank = rank
            op.index = index
            op.kind = kind
            op.name = name
            op.spec = spec
            return op
        op = new_op(_MicrobatchOp)
        op.rank = rank
        op.index = index
        op.kind = kind
        op.name = name
        op.spec = spec
        op.microbatch = microbatch
        return op
    op = new_op(_SyncOp)
    op.rank = rank
    op.index = index
    op.kind = kind
    op.name = name
    op.spec = spec
    op.handle = handle
    op.microbatch = microbatch
    op.batch = batch
    op.waits_for = waits_for
    return op


def op_on_rank(op: Op, rank: int, spec: OpSpec) -> Op:  # type: ignore[valid-type]
    """`op` as `rank` makes it, with `spec`: every other field the same (an op of the same
    class, its slots copied: what copying a rank template makes per op)."""
    cls = op.__class__
    new = new_op(cls)
    if cls is not Op:
        new.microbatch = op.microbatch
        if cls is _SyncOp:
            new.handle = op.handle
            new.batch = op.batch
            new.waits_for = op.waits_for
    new.rank = rank
    new.index = op.index
    new.kind = op.kind
    new.name = op.name
    new.spec = spec
    return new


new_op = object.__new__
"""`new_op(cls)`: an op of class `cls` with no slots set yet (for `make_op`)."""


_JSON_FIELDS = (
    "name", "stream", "duration_us", "flops", "size_bytes", "peer", "dest", "group", "root",
    "reduce_op", "transport", "algo", "proto", "copy_dir", "host_memory", "handle", "batch", "waits_for", "action", "stage", "microbatch",
)  # fmt: skip


@dataclass(frozen=True)
class Group:
    """A set of ranks that communicate: one process group / communicator."""

    id: str
    """Unique name: "world", a mesh axis with the other coordinates ("pp[dp=1]"), or a
    custom group ("pairs[0]")."""
    family: str
    """The name schedules use in `group=`: "world", the mesh axis, or the custom name."""
    ranks: tuple[int, ...]
    """Member global ranks, in group-rank order."""

    def group_rank(self, rank: int) -> int:
        return self.ranks.index(rank)


@dataclass(frozen=True)
class Fold:
    """Replicas along a mesh axis folded into one (`commdsl.dsl.fold`): the ranks whose
    coordinate on `axis` is below `block` (the representative: one replica, or `block`
    consecutive ones) are expanded; every other rank runs its representative's ops up to
    renaming (its rank, peers and in-replica groups shifted by a multiple of `stride`),
    which expansion verified, and has no ops of its own in the `Program`. A group is either
    inside the representative's copy or spans every copy (a group along `axis`, or the
    world): of the latter only the representative members issue ops. Below, a "replica"
    is one copy of the representative."""

    axis: str
    """The folded mesh axis."""
    replicas: int
    """How many copies of the representative make the axis (its size / `block`)."""
    stride: int
    """Global-rank distance from one copy to the next (`block` x the axis's stride in the mesh)."""
    ranks: tuple[int, ...]
    """The representative's ranks, ascending."""
    block: int = 1
    """The axis's replicas the representative holds together: more than one where one
    replica's ranks are not a whole number of a node's GPUs (`commdsl.dsl.fold.make_fold`)."""

    @property
    def label(self) -> str:
        """Which ranks the representative holds, as a reader names them: `dp = 0`, `dp < 2`."""
        return f"{self.axis} = 0" if self.block == 1 else f"{self.axis} < {self.block}"

    def replica_of(self, rank: int) -> int:
        """The replica (coordinate on `axis`) of a global rank."""
        return rank // self.stride % self.replicas

    def representative(self, rank: int) -> int:
        """The rank of the representative replica that `rank` runs as."""
        return rank - self.replica_of(rank) * self.stride

    def present(self, ranks: tuple[int, ...]) -> tuple[int, ...]:
        """The members of a group that issue ops: those of the representative replica."""
        stride, replicas = self.stride, self.replicas
        return tuple(r for r in ranks if r // stride % replicas == 0)


@dataclass(frozen=True)
class Program:
    """A fully expanded schedule: what the simulator and the executor run."""

    name: str
    doc: str
    source: str
    """The schedule file the program came from."""
    params: tuple[tuple[str, str], ...]
    """Resolved parameters, formatted with units, in declaration order."""
    world_size: int
    mesh: tuple[tuple[str, int], ...]
    """Mesh axes and sizes, outermost first (row-major, as torch's DeviceMesh)."""
    streams: tuple[str, ...]
    """Declared device streams; the first is each rank's default stream."""
    groups: tuple[Group, ...]
    """Every group, in the order the executor creates them on every rank."""
    ops: tuple[tuple[Op, ...], ...]
    """Per rank, the ops in issue order."""
    warnings: tuple[str, ...] = ()
    fold: Fold | None = None
    """Replicas folded into one (`Fold`): only the representative ranks have ops; None:
    every rank has its own."""
    fold_note: str = ""
    """What folding did, or why the program was not folded where it was asked for; empty
    where it was not asked for."""
    _groups_by_id: dict[str, Group] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._groups_by_id.update({g.id: g for g in self.groups})

    def group(self, group_id: str) -> Group:
        return self._groups_by_id[group_id]

    @property
    def num_ops(self) -> int:
        """The ops the program holds (of a folded program, the representative's)."""
        return sum(len(r) for r in self.ops)

    @property
    def total_ops(self) -> int:
        """The ops every rank runs together: `num_ops`, times the replicas if folded."""
        return self.num_ops * (self.fold.replicas if self.fold is not None else 1)

    def all_ops(self):
        for rank_ops in self.ops:
            yield from rank_ops

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "doc": self.doc,
            "source": self.source,
            "params": dict(self.params),
            "world_size": self.world_size,
            "mesh": dict(self.mesh),
            "streams": list(self.streams),
            "groups": [{"id": g.id, "family": g.family, "ranks": list(g.ranks)} for g in self.groups],
            "ranks": [[op.to_json() for op in rank_ops] for rank_ops in self.ops],
            "warnings": list(self.warnings),
        }
