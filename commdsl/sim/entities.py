"""The engine's state: op states, stream entries, and the entities that advance.

Per rank there is a host, one FIFO per stream and one comm queue per group; a
collective instance joins the members' ops of the k-th collective of a group. Each
entity is a small state machine the engine advances (`commdsl.sim.engine`).
"""

from __future__ import annotations

from array import array
from collections.abc import Collection
from dataclasses import dataclass

from commdsl.ir import Algo, Op, OpKind, Protocol

# Op states.
PENDING, ELIGIBLE, ACTIVE, DONE = 0, 1, 2, 3
"""PENDING: not run yet. ELIGIBLE (comm ops): the issuing stream's earlier work is done,
the op waits in its comm queue. ACTIVE (comm ops): its kernel runs (maybe waiting for
peers). DONE: finished."""

# Stream FIFO entries are ints: g * 4 + tag.
EXEC, MARK, SYNC = 0, 1, 2
"""EXEC: the op itself runs on the stream. MARK: a comm op's dependency on the stream's
earlier work (zero time; then the op joins its comm queue). SYNC: the stream waits for a
synchronous comm op (or a synchronous batch, at its last op)."""

HOST, STREAM, QUEUE = 0, 1, 2
"""Entity kinds."""

ALGOS = tuple(Algo)
"""`RawResult.algos` holds indices into this tuple (one byte per op)."""
PROTOS = (None, *Protocol)
"""`RawResult.protos` holds indices into this tuple (0: no protocol, the op has no NCCL model)."""
KINDS = tuple(OpKind)
"""The engine's per-op kind codes (one byte per op) are indices into this tuple."""
KIND_CODE = {k: i for i, k in enumerate(KINDS)}


def kind_table(kinds: Collection[OpKind]) -> bytes:
    """Per kind code, 1 if its kind is one of `kinds`, else 0: indexed by a code, or a
    `bytes.translate` table (256 entries) that maps a run of codes to 0/1 selectors."""
    return bytes(k in kinds for k in KINDS).ljust(256, b"\0")


def op_index_typecode(n: int) -> str:
    """The `array` typecode of per-op arrays that hold an op number (g) or -1, for a
    program of n ops: 4 bytes an entry while g fits."""
    return "i" if n < 2**31 else "q"


def entry_typecode(n: int) -> str:
    """The `array` typecode of a stream's entries (g * 4 + tag), and of a comm queue's
    items (g), for a program of n ops: 4 bytes an entry while it fits. Unsigned (an entry
    is never negative): appending to an unsigned array converts the item in C, where a
    signed one parses it with a format string (the host appends an entry per op)."""
    return "I" if 4 * n < 2**32 else "Q"


class Entity:
    __slots__ = ("kind", "rank", "kicked")

    def __init__(self, kind: int, rank: int):
        self.kind = kind
        self.rank = rank
        self.kicked = False


class Host(Entity):
    """A rank's host thread: issues its ops in program order."""

    __slots__ = ("pc", "end", "t", "cause", "block_g", "block_deps", "sync_targets")

    def __init__(self, rank: int, first: int, end: int):
        super().__init__(HOST, rank)
        self.pc = first
        """Global number of the next op to issue."""
        self.end = end
        self.t = 0.0
        """The host's own clock (may run ahead of env.now)."""
        self.cause = -1
        """The op that last unblocked the host (the host's link in the critical path)."""
        self.block_g = -1
        """Op the host is blocked in, or -1."""
        self.block_deps: tuple[int, ...] = ()
        self.sync_targets: list[tuple[Entity, int]] = []


class _Fifo(Entity):
    """An entity that runs the entries of its `fifo` in order (a stream, a comm queue)."""

    __slots__ = ()

    def head(self) -> int:
        """The entry at the head of the FIFO; -1 when it is empty."""
        return self.fifo[self.done] if self.done < len(self.fifo) else -1


class Stream(_Fifo):
    """One stream of a rank: a FIFO of entries run one after another."""

    __slots__ = ("name", "fifo", "busy", "done", "last_g", "last_end", "woke", "drain_waiters", "cur", "cur_cause",
                 "delay", "work_left", "t_run", "factor", "token", "slowed")  # fmt: skip

    def __init__(self, rank: int, name: str, typecode: str = "q"):
        super().__init__(STREAM, rank)
        self.name = name
        self.fifo = array(typecode)
        """Every entry pushed (g * 4 + tag), in order: those before `done` have run, the
        one at `done` is the head. An array, not a deque of ints: the host may issue a whole
        program ahead of the clock, and an array holds an entry in 4 or 8 bytes."""
        self.busy = False
        self.cur = -1
        """The entry being timed (busy), and the op its start waited for."""
        self.cur_cause = -1
        self.done = 0
        """Entries run (and the position of the head in `fifo`)."""
        self.last_g = -1
        self.last_end = 0.0
        self.woke = False
        """The last entry went on when another thread's work ended, its late wake-up
        left to the op after it (`Contention.woken`)."""
        self.drain_waiters: list[tuple[int, Entity]] = []
        # Work whose speed can change while it runs (`Contention.timed`):
        self.delay = False
        """The timer only waits for the entry's start (timed work starts at its true time)."""
        self.work_left = 0.0
        """Of the running timed op: microseconds of work left at t_run, unslowed."""
        self.t_run = 0.0
        self.factor = 1.0
        """Current slowdown of the running timed op."""
        self.token = 0
        """Generation of the timer (a rescheduled timer supersedes the old one)."""
        self.slowed = False


class Queue(_Fifo):
    """One group's comm queue on one rank: items (an op, or a P2P batch) in issue order."""

    __slots__ = ("group", "number", "fifo", "active", "remaining", "done", "last_g", "last_end", "drain_waiters")

    def __init__(self, rank: int, group: str, typecode: str, number: int):
        super().__init__(QUEUE, rank)
        self.group = group
        self.number = number
        """Its place in `Wiring.queue_list`."""
        self.fifo = array(typecode)
        """Every item pushed (the op's g, or the first g of a batch), in order; the one at
        `done` is the head (as `Stream.fifo`)."""
        self.active = False
        self.remaining = 0
        """Ops of the active item not finished yet."""
        self.done = 0
        """Items finished (and the position of the head in `fifo`)."""
        self.last_g = -1
        self.last_end = 0.0
        self.drain_waiters: list[tuple[int, Entity]] = []

    def reset(self) -> None:
        """As new, for another run of the same program (`Wiring` is made once per program)."""
        self.__init__(self.rank, self.group, self.fifo.typecode, self.number)


class Collective:
    """One collective instance: the k-th collective of a group, across its members."""

    __slots__ = ("group", "seq", "size", "number", "ops", "arrived", "needed")

    def __init__(self, group: str, seq: int, size: int, number: int):
        self.group = group
        self.seq = seq
        self.size = size
        self.number = number
        """Its place in `Wiring.collectives`."""
        self.ops = array("q")
        """Members' ops (g), in the order found in the program (the first is the lowest)."""
        self.arrived: list[int] = []
        """Members' ops that are active, in arrival order."""
        self.needed = size
        """Arrivals it moves at: every member's, or 1 where the engine runs one rank for
        all (`commdsl.sim.symmetry`)."""

    def reset(self) -> None:
        """As new, for another run of the same program (its members stay)."""
        self.arrived = []
        self.needed = self.size


@dataclass
class RawResult:
    """Per-op outcome arrays (indexed by g) and what is needed to interpret them."""

    ops: list[Op]
    base: list[int]
    issue_start: array
    issue_end: array
    start: array
    end: array
    state: bytearray
    cause: array
    partner: array
    algos: bytearray
    """Per comm op, the index in `ALGOS` of the algorithm it runs."""
    protos: bytearray
    """Per comm op, the index in `PROTOS` of NCCL's protocol it runs with."""
    kinds: bytearray
    """Per op, its kind as an index in `KINDS` (reports split ops by kind in C-level passes)."""
