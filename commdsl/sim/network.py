"""The network interface: how long moving bytes takes. The engine decides *when* a
transfer may start (all members active, both sides of a send/recv active); the network
decides when it ends, and reports that through the SimPy environment.

`Network` is the interface: it gets every transfer at the simulated time it starts, so
it can share bandwidth between the transfers in flight. The models (`commdsl.sim.models`
lists them by name):

  * `analytic` (`commdsl.sim.analytic`): no contention; a transfer takes `latency_steps *
    latency + serial_bytes / bandwidth` of its transport (or the transport's
    per-collective override, see `commdsl.machine.model`), one SimPy timeout per
    collective, whatever its size;
  * `flow` (the default, `commdsl.sim.flow`): links, routes and max-min sharing;
  * `flow-steps`: the flow network running collectives step by step (validation).

Both models log every transfer they start in a `TransferLog` (flat arrays: which distinct
`Transfer`, its ops, start, end), from which `flow_stats()` builds one `FlowStat` per
transfer when asked.

Compute slowing communication (a transfer's `compute_comm_slowdown`, from
`Machine.interference`: its op's `interference_by_op` entry or the machine-wide factor;
!= 1.0): the engine tells the network when compute starts or ends on a device
(`compute_changed`, at the true times; never called when every factor is 1.0). A transfer is slowed while any of its
endpoint devices computes (a collective: any member, since a ring advances at its
slowest member's pace); its bandwidth part is slowed, and its latency too on the host's
CPUs (a transport with a shared bandwidth: loopback TCP, where the latency is CPU work).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from heapq import heappush

import simpy
from simpy.events import NORMAL, Timeout

from commdsl.errors import MachineError, ScheduleError
from commdsl.ir import Algo, Dtype, Op, OpKind, Protocol, ReduceOp, Transport
from commdsl.machine.model import LinkKind, Machine
from commdsl.sim.collectives import DEFAULT_ALGO, CommPlan, plan, resolve_algo
from commdsl.sim.fabric import Fabric
from commdsl.sim.nccl_flows import NcclFlows


@dataclass(frozen=True, slots=True)
class Transfer:
    """One data movement: a whole collective, or one matched send/recv pair. It says what
    moves, not which ops move it: the engine builds one per distinct shape of transfer and
    starts it with the op numbers of each occurrence (`Network.start`)."""

    kind: OpKind
    """The collective's kind; SEND for a point-to-point transfer."""
    ranks: tuple[int, ...]
    """Global ranks involved: the group's members in group order, or (src, dst)."""
    size_bytes: int
    """nccl-tests size of the op (largest buffer)."""
    transport: Transport
    plan: CommPlan
    """The algorithm's steps and bytes."""
    root: int | None = None
    dtype: Dtype = Dtype.FP32
    """Element type: a reduction's cost can depend on it (calibration profiles per dtype)."""
    reduce_op: ReduceOp | None = None
    """A reduction's op: its cost can depend on it too (gloo's avg; calibration profiles per op)."""
    group: tuple[int, ...] = ()
    """A send's group: the ranks of its communicator (NCCL's point-to-point channels depend
    on the communicator's size and nodes); empty for collectives and copies."""


@dataclass(frozen=True, slots=True)
class FlowStat:
    """One transfer as the network timed it (`--json` "flows")."""

    ops: tuple[int, ...]
    """Op numbers (g) of the members; `SimResult.op_at` gives the ops."""
    kind: OpKind
    transport: Transport
    algo: Algo
    size_bytes: int
    start_us: float
    end_us: float
    latency_us: float
    """The latency part of its time (steps x per-step latency, plus link latencies)."""
    bottleneck: str
    """The link its algorithm loads most relative to the link's bandwidth ("" without links)."""
    links: int
    """Number of link directions it uses."""

    @staticmethod
    def of(t: Transfer, ops: tuple[int, ...], start_us: float, end_us: float, latency_us: float, bottleneck: str = "",
           links: int = 0) -> FlowStat:  # fmt: skip
        return FlowStat(ops, t.kind, t.transport, t.plan.algo, t.size_bytes, start_us, end_us, latency_us, bottleneck, links)

    @property
    def algbw_gb_per_s(self) -> float:
        """size / time, as nccl-tests' algbw."""
        return algbw_gb_per_s(self.size_bytes, self.end_us - self.start_us)


def algbw_gb_per_s(size_bytes: float, duration_us: float) -> float:
    """A transfer's size over its time (GB/s), as nccl-tests' algbw; 0 for no time."""
    return size_bytes / (duration_us * 1e3) if duration_us > 0 else 0.0


@dataclass(frozen=True, slots=True)
class LinkStat:
    """One link direction over the whole simulation (`--links`)."""

    name: str
    kind: LinkKind
    bandwidth_gb_per_s: float
    bytes: float
    """Bytes carried."""
    busy_us: float
    """Time with any traffic."""
    utilization: float
    """bytes / (bandwidth x makespan)."""
    peak_utilization: float


class TransferLog:
    """Every transfer a network started, in start order, as flat arrays: per transfer the
    index of its `Transfer` (each distinct one kept once), its ops (g), its start and end.
    `log[i]` is (transfer, ops, start_us, end_us)."""

    def __init__(self) -> None:
        self.transfers: list[Transfer] = []
        """The distinct transfers, by their index."""
        self._index: dict[int, int] = {}
        """id(transfer) -> its index (the list keeps every transfer alive, so ids stay unique)."""
        # Unsigned (no entry is negative): their appends convert items in C (a signed
        # array's parse them with a format string).
        self.kind = array("I")
        """Per started transfer, the index of its `Transfer`."""
        self.start = array("d")
        self.end = array("d")
        self._ops = array("Q")
        self._ops_at = array("Q")
        """Where each transfer's ops begin in `_ops` (they end where the next one's begin)."""
        self._int_start: dict[int, int] = {}
        """Starts that were ints (SimPy's clock is the int 0 until its first event), as they
        were: statistics show them as given."""

    def intern(self, transfer: Transfer) -> tuple[int, bool]:
        """(the index of `transfer`, whether it is new)."""
        i = self._index.get(id(transfer))
        if i is not None:
            return i, False
        i = self._index[id(transfer)] = len(self.transfers)
        self.transfers.append(transfer)
        return i, True

    def add(self, index: int, ops: tuple[int, ...], start_us: float) -> int:
        """Log a transfer (by its `intern` index) starting now; returns its number (its end
        is set in `end` when it is known)."""
        if start_us.__class__ is int:
            self._int_start[len(self.kind)] = start_us
        self.kind.append(index)
        self.start.append(start_us)
        self.end.append(start_us)
        self._ops_at.append(len(self._ops))
        self._ops.extend(ops)
        return len(self.kind) - 1

    def start_us(self, i: int) -> float:
        """Transfer i's start, as it was given."""
        return self._int_start.get(i, self.start[i]) if self._int_start else self.start[i]

    def ops(self, i: int) -> tuple[int, ...]:
        at = self._ops_at
        return tuple(self._ops[at[i] : at[i + 1] if i + 1 < len(at) else len(self._ops)])

    def __len__(self) -> int:
        return len(self.kind)

    def __getitem__(self, i: int) -> tuple[Transfer, tuple[int, ...], float, float]:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        return self.transfers[self.kind[i]], self.ops(i), self.start_us(i), self.end[i]

    def __iter__(self) -> Iterator[tuple[Transfer, tuple[int, ...], float, float]]:
        return (self[i] for i in range(len(self)))


_NCCL = Transport.NCCL  # bound once: an enum member read through its class is a Python-level lookup

Done = Callable[[Transfer, tuple[int, ...]], None]
"""What a network calls when a transfer's last byte arrives: done(transfer, ops)."""


def timeout(env: simpy.Environment, delay: float, value: object, callback: Callable[[Timeout], None]) -> None:
    """`env.timeout(delay, value).callbacks.append(callback)`: the same SimPy event,
    scheduled as `Environment.schedule` does (at now + delay, normal priority, the
    environment's next event id), so SimPy runs it in the same order; made without the
    Python frames of SimPy's constructor and `schedule`, where this module is compiled
    (the engine's timers and the networks' transfers: most of a simulation's events).
    It writes SimPy's `Environment._queue` and `_eid` and the event's fields as its
    constructor does, as the engine reads the clock as `env._now`."""
    if delay < 0:
        raise ValueError(f"Negative delay {delay}")
    ev = Timeout.__new__(Timeout)
    ev.env = env
    ev.callbacks = [callback]
    ev._value = value
    ev._delay = delay
    ev._ok = True
    heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), ev))


class Network:
    """Times transfers. Implementations must call `done(transfer, ops)` exactly once per
    `start()`, from a SimPy event at the simulated end time (never synchronously)."""

    name: str = "abstract"

    def __init__(self, env: simpy.Environment, machine: Machine, world_size: int):
        self.env = env
        self.machine = machine
        self.world_size = world_size
        self.nccl: NcclFlows | None = None
        """NCCL's choices and loads on the machine's links (machines with `nccl:`)."""
        self.fabric: Fabric | None = None
        """The machine's links and routes (machines with a topology; the flow network's always)."""
        self.records = TransferLog()
        """Every transfer started, with its ops, start and end (`flow_stats`)."""
        self._algo_cache: dict[tuple, Algo] = {}
        """(ranks, size, transport) of an all_reduce across nodes -> `choose_algo`'s choice."""

    def start(self, transfer: Transfer, ops: tuple[int, ...], done: Done) -> None:
        """Begin `transfer` of the engine's ops `ops` (g) now (env.now); call
        `done(transfer, ops)` when its last byte arrives."""
        raise NotImplementedError

    def solo_rate(self, transfer: Transfer) -> float:
        """Bytes of the op's size per microsecond the transfer moves alone, latency aside."""
        raise NotImplementedError

    def compute_changed(self, rank: int, computing: bool) -> None:
        """Compute started (`computing`) or ended on device `rank`; called only on machines
        where compute slows some comm op (`Machine.slows_comm`; see the module doc)."""

    def check_copy(self, op: Op) -> None:
        """Raise `MachineError` at a memcpy transfer (peer copy, memcpy send or recv) that
        the machine cannot route (memcpy never crosses nodes)."""
        if self.fabric is None:
            return
        src, dst = (op.peer, op.rank) if op.kind is OpKind.RECV else (op.rank, op.peer)
        try:
            self.fabric.route(src, dst, Transport.MEMCPY)
        except MachineError as e:
            raise MachineError(f"{op.label}: {e.message}", op.loc, rank=op.rank, hint=e.hint) from None

    def choose(self, op: Op, ranks: tuple[int, ...]) -> tuple[Algo, Protocol | None]:
        """The algorithm and protocol `op` runs with on the group `ranks` (global): NCCL's
        choice (`commdsl.sim.nccl`) on a machine with an NCCL model, else what the op forces
        or the model's default, without protocols."""
        if self.nccl is not None and op.transport is _NCCL:
            c = self.nccl.choose(op, ranks)
            return c.algo, c.proto
        link = self.machine.transport(op.transport)
        if link is not None and link.latency_us == 0.0 and link.bandwidth_gb_per_s == float("inf"):
            # A free transport (the deadlock check's timeless machine): nothing depends on the
            # algorithm, so whatever the op asks for stands.
            return op.algo or DEFAULT_ALGO[op.kind], op.proto
        if op.proto is not None:
            raise ScheduleError(f"proto={op.proto.value}: machine {self.machine.name} has no NCCL model for {op.transport.value} "
                                f"transfers, so no protocols", op.loc, rank=op.rank,
                                hint="pick a machine with nccl: in its file (dgx-h100, dgx-a100), or drop proto=")  # fmt: skip
        algo = resolve_algo(op)  # an explicit algo= the simulator cannot model is an error
        if op.algo is None and op.kind.is_collective:
            algo = self.choose_algo(op, ranks)
        return algo, None

    def choose_algo(self, op: Op, ranks: tuple[int, ...]) -> Algo:
        """The algorithm of a collective whose op names none, without an NCCL model.
        NCCL-like on a machine with a topology: rings inside a node; for an all_reduce whose
        group spans nodes, the faster of ring and double binary tree alone on the routes for
        this size (`Fabric.collective_time_us`). Elsewhere the op kind's default."""
        kind = op.kind
        fabric = self.fabric
        if kind is not OpKind.ALL_REDUCE or fabric is None or fabric.topology is None or len(ranks) <= 2:
            return DEFAULT_ALGO[kind]
        g = fabric.topology.gpus_per_node
        if len({r // g for r in ranks}) == 1:
            return Algo.RING
        key = (ranks, op.size_bytes, op.transport)
        algo = self._algo_cache.get(key)
        if algo is None:
            times = {candidate: fabric.collective_time_us(kind, candidate, ranks, op.size_bytes, op.transport, None,
                                                          plan(kind, candidate, len(ranks), op.size_bytes, self.machine.chunk_bytes))[0]
                     for candidate in (Algo.RING, Algo.TREE)}  # fmt: skip
            algo = self._algo_cache[key] = min(times, key=times.__getitem__)  # a tie: ring, the first
        return algo

    def meta(self) -> dict:
        """What goes into the timeline's metadata about this network model."""
        return {"model": self.name}

    def flow_stats(self) -> list[FlowStat]:
        """Every transfer, in start order."""
        return []

    def link_stats(self, makespan_us: float, channels: Collection[int] | None = None) -> list[LinkStat]:
        """Every link direction that carried bytes (none without a link model); with
        `channels` (channel ids of the fabric), only those among them."""
        return []

    def counter_columns(self, chunk: int) -> Iterator[tuple[list[float], list[str], list[float]]]:
        """(times, link names, utilisations 0..1) of the trace counters' samples in time
        order, about `chunk` at a time (none without a link model)."""
        return iter(())
