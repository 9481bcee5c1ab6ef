"""The network: how long moving bytes takes. The engine decides *when* a transfer may
start (all members active, both sides of a send/recv active); the network decides when
it ends, and reports that through the SimPy environment.

`Network` is the interface: it gets every transfer at the simulated time it starts, so
it can share bandwidth between the transfers in flight.

  * `analytic`: no contention; a transfer takes `latency_steps * latency + serial_bytes /
    bandwidth` of its transport (or the transport's per-collective override, see
    `commdsl.machine.model`), one SimPy timeout per collective, whatever its size;
  * `flow` (the default): links, routes and max-min sharing (`commdsl.sim.flow`);
  * `flow-steps`: the flow network running collectives step by step (validation).

Compute slowing communication (a transfer's `compute_comm_slowdown`, from
`Machine.interference`: its op's `interference_by_op` entry or the machine-wide factor;
!= 1.0): the engine tells the network when compute starts or ends on a device
(`compute_changed`, at the true times; never called when every factor is 1.0). A transfer is slowed while any of its
endpoint devices computes (a collective: any member, since a ring advances at its
slowest member's pace); its bandwidth part is slowed, and its latency too on the host's
CPUs (a transport with a shared bandwidth: loopback TCP, where the latency is CPU work).

  * `analytic`: the bandwidth part of a transfer progresses at 1 / factor while slowed:
    its one timeout is rescheduled when that changes (exact for its formula, no contention);
  * `flow`, `flow-steps`: a slowed flow's cap is its uncontended rate / factor, and max-min
    rates are recomputed for the flows connected to it (see `commdsl.sim.flow`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import simpy

from commdsl.ir import Dtype, Algo, Op, OpKind, ReduceOp, Transport
from commdsl.machine.model import LinkKind, Machine
from commdsl.sim.collectives import DEFAULT_ALGO, CommPlan


@dataclass(frozen=True, slots=True)
class Transfer:
    """One data movement: a whole collective, or one matched send/recv pair."""

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
    ops: tuple[int, ...] = ()
    """The engine's op numbers (g) the transfer completes, for per-flow statistics."""
    dtype: Dtype = Dtype.FP32
    """Element type: a reduction's cost can depend on it (calibration profiles per dtype)."""
    reduce_op: ReduceOp | None = None
    """A reduction's op: its cost can depend on it too (gloo's avg; calibration profiles per op)."""


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
    def of(t: Transfer, start_us: float, end_us: float, latency_us: float, bottleneck: str = "", links: int = 0) -> FlowStat:
        return FlowStat(t.ops, t.kind, t.transport, t.plan.algo, t.size_bytes, start_us, end_us, latency_us, bottleneck, links)

    @property
    def algbw_gb_per_s(self) -> float:
        """size / time, as nccl-tests' algbw."""
        d = self.end_us - self.start_us
        return self.size_bytes / (d * 1e3) if d > 0 else 0.0


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


class Network(abc.ABC):
    """Times transfers. Implementations must call `done()` exactly once per `start()`,
    from a SimPy event at the simulated end time (never synchronously)."""

    name: str = "abstract"

    def __init__(self, env: simpy.Environment, machine: Machine, world_size: int):
        self.env = env
        self.machine = machine
        self.world_size = world_size

    @abc.abstractmethod
    def start(self, transfer: Transfer, done: Callable[[], None]) -> None:
        """Begin `transfer` now (env.now); call `done()` when its last byte arrives."""

    def compute_changed(self, rank: int, computing: bool) -> None:
        """Compute started (`computing`) or ended on device `rank`; called only on machines
        where compute slows some comm op (`Machine.slows_comm`; see the module doc)."""

    def choose_algo(self, op: Op, ranks: tuple[int, ...]) -> Algo:
        """The algorithm of a collective whose op names none (ranks: the group, global)."""
        return DEFAULT_ALGO[op.kind]

    def meta(self) -> dict:
        """What goes into the timeline's metadata about this network model."""
        return {"model": self.name}

    def flow_stats(self) -> list[FlowStat]:
        """Every transfer, in start order."""
        return []

    def link_stats(self, makespan_us: float) -> list[LinkStat]:
        """Every link direction that carried bytes (none without a link model)."""
        return []

    def counter_samples(self) -> Iterable[tuple[float, str, float]]:
        """(time, link name, utilisation 0..1) in time order, for trace counters."""
        return ()


class _Timed:
    """A transfer of the analytic network on a machine where compute slows comm."""

    __slots__ = ("record", "devices", "nbusy", "t_mark", "work_left_us", "slow", "factor", "token", "done")

    def __init__(self, record: list, devices: tuple[int, ...], t_mark: float, work_left_us: float, slow: float,
                 done: Callable[[], None]):  # fmt: skip
        self.record = record
        self.devices = devices
        self.nbusy = 0
        """Its devices that compute now."""
        self.t_mark = t_mark
        """When its bandwidth part (re)starts at the current factor: the end of its
        latency, or the last change of factor after it."""
        self.work_left_us = work_left_us
        """Bandwidth time left at t_mark, unslowed."""
        self.slow = slow
        """Its slowdown while any of its devices computes."""
        self.factor = 1.0
        self.token = 0
        """Generation of its timeout (a rescheduled one supersedes the old)."""
        self.done = done


class AnalyticNetwork(Network):
    """Latency + bytes / bandwidth per transfer, by the algorithm's step and byte counts;
    no contention between concurrent transfers. With a `compute_comm_slowdown`, the
    bandwidth part runs that many times slower while any endpoint device computes."""

    name = "analytic"

    def __init__(self, env: simpy.Environment, machine: Machine, world_size: int):
        super().__init__(env, machine, world_size)
        self.records: list[list] = []
        """Per transfer: [transfer, start_us, end_us, latency_us]."""
        self._busy = [False] * world_size
        """Per device, whether compute runs on it."""
        self._on_device: list[dict[_Timed, None]] = [{} for _ in range(world_size)] if machine.slows_comm() else []
        """Per device, the transfers in flight with an endpoint on it (slowdown only)."""

    def duration_us(self, transfer: Transfer) -> tuple[float, float]:
        """(time, latency part) of a transfer."""
        p = transfer.plan
        link = self.machine.sized_link(transfer.transport, transfer.kind, len(transfer.ranks), transfer.size_bytes,
                                       p.latency_steps, p.serial_bytes, transfer.dtype, transfer.reduce_op)  # fmt: skip
        assert link is not None, "the engine checks transports before simulating"
        latency = p.latency_steps * link.latency_us
        return latency + p.serial_bytes / (link.bandwidth_gb_per_s * 1e3), latency

    def start(self, transfer: Transfer, done: Callable[[], None]) -> None:
        duration, latency = self.duration_us(transfer)
        now = self.env.now
        record = [transfer, now, now + duration, latency]
        self.records.append(record)
        slow = self.machine.interference(transfer.kind, transfer.dtype).compute_comm_slowdown
        if slow == 1.0 or duration == latency:
            # Always through an event, even for zero time: keeps the engine's call depth flat.
            self.env.timeout(duration).callbacks.append(lambda _ev: done())
            return
        # On the host's CPUs (a shared bandwidth) the latency is CPU work too: all of it slows.
        unslowed = 0.0 if self.machine.shared_bandwidth(transfer.transport) is not None else latency
        x = _Timed(record, tuple(dict.fromkeys(transfer.ranks)), now + unslowed, duration - unslowed, slow, done)
        for d in x.devices:
            self._on_device[d][x] = None
            x.nbusy += self._busy[d]
        x.factor = slow if x.nbusy else 1.0
        self._schedule(x)

    def _schedule(self, x: _Timed) -> None:
        x.token += 1
        token = x.token
        end = x.t_mark + x.work_left_us * x.factor
        x.record[2] = end
        self.env.timeout(end - self.env.now).callbacks.append(lambda _ev: self._finish(x, token))

    def _finish(self, x: _Timed, token: int) -> None:
        if token != x.token:
            return  # rescheduled
        for d in x.devices:
            del self._on_device[d][x]
        x.done()

    def compute_changed(self, rank: int, computing: bool) -> None:
        self._busy[rank] = computing
        now = self.env.now
        step = 1 if computing else -1
        for x in self._on_device[rank]:
            x.nbusy += step
            factor = x.slow if x.nbusy else 1.0
            if factor == x.factor:
                continue
            if now > x.t_mark:  # past its latency: bank the work done at the old factor
                x.work_left_us = max(0.0, x.work_left_us - (now - x.t_mark) / x.factor)
                x.t_mark = now
            x.factor = factor
            self._schedule(x)

    def flow_stats(self) -> list[FlowStat]:
        return [FlowStat.of(t, start, end, latency) for t, start, end, latency in self.records]


# The flow models subclass `Network` (imported from this module), so they are imported
# after it is defined.
from commdsl.sim.flow import FlowNetwork, SteppedFlowNetwork  # noqa: E402

NETWORKS: Mapping[str, type[Network]] = MappingProxyType(
    {"flow": FlowNetwork, "analytic": AnalyticNetwork, "flow-steps": SteppedFlowNetwork}
)
"""`--network NAME` -> model (read-only)."""

DEFAULT_NETWORK = "flow"
