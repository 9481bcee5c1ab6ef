"""The network: how long moving bytes takes. The engine decides *when* a transfer may
start (all members active, both sides of a send/recv active); the network decides when
it ends, and reports that through the SimPy environment.

`Network` is the interface the flow model (links, paths, max-min sharing) plugs into:
it gets every transfer at the simulated time it starts, so it can share bandwidth
between the transfers in flight. `AnalyticNetwork` ignores contention: a transfer takes
`latency_steps * latency + serial_bytes / bandwidth` of its transport (see
`commdsl.sim.collectives`), one SimPy timeout per collective, whatever its size.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import simpy

from commdsl.ir import OpKind, Transport
from commdsl.machine.model import Machine
from commdsl.sim.collectives import CommPlan


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


class Network(abc.ABC):
    """Times transfers. Implementations must call `done()` exactly once per `start()`,
    from a SimPy event at the simulated end time (never synchronously)."""

    name: str = "abstract"

    def __init__(self, env: simpy.Environment, machine: Machine):
        self.env = env
        self.machine = machine

    @abc.abstractmethod
    def start(self, transfer: Transfer, done: Callable[[], None]) -> None:
        """Begin `transfer` now (env.now); call `done()` when its last byte arrives."""

    def meta(self) -> dict:
        """What goes into the timeline's metadata about this network model."""
        return {"model": self.name}


class AnalyticNetwork(Network):
    """Latency + bytes / bandwidth per transfer, by the algorithm's step and byte counts;
    no contention between concurrent transfers."""

    name = "analytic"

    def duration_us(self, transfer: Transfer) -> float:
        link = self.machine.transport(transfer.transport)
        assert link is not None, "the engine checks transports before simulating"
        p = transfer.plan
        return p.latency_steps * link.latency_us + p.serial_bytes / (link.bandwidth_gb_per_s * 1e3)

    def start(self, transfer: Transfer, done: Callable[[], None]) -> None:
        # Always through an event, even for zero time: keeps the engine's call depth flat.
        self.env.timeout(self.duration_us(transfer)).callbacks.append(lambda _ev: done())


NETWORKS: Mapping[str, type[Network]] = MappingProxyType({"analytic": AnalyticNetwork})
"""`--network NAME` -> model (read-only; the flow model registers here next)."""
