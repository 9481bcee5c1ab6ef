"""The analytic network: latency + bytes / bandwidth per transfer, no contention.

On a machine with a topology a transfer takes the time it takes alone on its routes: a
point-to-point transfer on its links (staged through host memory: at most the
transport's `staged` cap), a collective by its algorithm's pairs of ranks on theirs
(`Fabric.collective_load`: the slowest route caps it), an NCCL collective as NCCL's
model lays it out; so the analytic and flow networks agree on any transfer that runs
alone.

With a `compute_comm_slowdown` (see `commdsl.sim.network`), the bandwidth part of a
transfer progresses at 1 / factor while slowed: its one timeout is rescheduled when that
changes (exact for its formula, no contention).
"""

from __future__ import annotations

import simpy

from commdsl.ir import OpKind
from commdsl.machine.model import Machine
from commdsl.sim.nccl_flows import machine_links
from commdsl.sim.network import Done, FlowStat, Network, Transfer, timeout
from commdsl.sim.shape_memo import shape_table


class _Timed:
    """A transfer of the analytic network on a machine where compute slows comm."""

    __slots__ = ("record", "devices", "nbusy", "t_mark", "work_left_us", "slow", "factor", "token", "transfer", "ops", "done")

    def __init__(self, record: int, devices: tuple[int, ...], t_mark: float, work_left_us: float, slow: float, transfer: Transfer,
                 ops: tuple[int, ...], done: Done):  # fmt: skip
        self.record = record
        """Its number in the network's `TransferLog`."""
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
        self.transfer = transfer
        self.ops = ops
        self.done = done


class AnalyticNetwork(Network):
    """Latency + bytes / bandwidth per transfer, by the algorithm's step and byte counts;
    no contention between concurrent transfers. With a `compute_comm_slowdown`, the
    bandwidth part runs that many times slower while any endpoint device computes."""

    name = "analytic"

    def __init__(self, env: simpy.Environment, machine: Machine, world_size: int):
        super().__init__(env, machine, world_size)
        self._times: list[tuple[float, float]] = []
        """Per distinct transfer (its index in `records`), its (time, latency part)."""
        self._slow: list[float] = []
        """Per distinct transfer, its `compute_comm_slowdown`."""
        self._busy = [False] * world_size
        """Per device, whether compute runs on it."""
        self._on_device: list[dict[_Timed, None]] = [{} for _ in range(world_size)] if machine.slows_comm() else []
        """Per device, the transfers in flight with an endpoint on it (slowdown only)."""
        if machine.topology is not None:  # routes of point-to-point transfers
            self.fabric, self.nccl = machine_links(machine, world_size)
        self._known: dict[int, tuple[tuple[float, float], float, Transfer]] = shape_table(machine, ("analytic", world_size))
        """By id of a `Transfer`, for every simulation on this machine and world size
        (`commdsl.sim.shape_memo`): its (time, latency part), its slowdown, and the
        transfer (which keeps its id from being reused)."""

    def duration_us(self, transfer: Transfer) -> tuple[float, float]:
        """(time, latency part) of a transfer."""
        p = transfer.plan
        if p.proto is not None and self.nccl is not None:
            # NCCL's kernel alone on the links: latency + bytes at its solo rate.
            t = transfer
            co = self.nccl.coflow(t.kind, t.ranks, t.size_bytes, t.root, p.algo, p.proto, t.group)
            return co.latency_us + t.size_bytes / co.solo_rate(self.nccl.fabric.capacity), co.latency_us
        if self.fabric is not None and transfer.kind in (OpKind.SEND, OpKind.COPY):
            # Alone on its route, as the flow network times it uncontended.
            return self.fabric.p2p_time_us(transfer.ranks[0], transfer.ranks[1], transfer.transport, transfer.size_bytes)
        if self.fabric is not None:
            # Its pairs on their routes, as the flow network's coflow runs alone.
            t = transfer
            return self.fabric.collective_time_us(t.kind, p.algo, t.ranks, float(t.size_bytes), t.transport, t.root, p)
        link = self.machine.sized_link(transfer.transport, transfer.kind, len(transfer.ranks), transfer.size_bytes,
                                       p.latency_steps, p.serial_bytes, transfer.dtype, transfer.reduce_op)  # fmt: skip
        assert link is not None, "the engine checks transports before simulating"
        latency = p.latency_steps * link.latency_us
        return latency + p.serial_bytes / (link.bandwidth_gb_per_s * 1e3), latency

    def solo_rate(self, transfer: Transfer) -> float:
        duration, latency = self.duration_us(transfer)
        return transfer.size_bytes / (duration - latency) if duration > latency else float("inf")

    def start(self, transfer: Transfer, ops: tuple[int, ...], done: Done) -> None:
        log = self.records
        spec, new = log.intern(transfer)
        if new:  # what a transfer of this shape takes is worked out once per machine
            known = self._known.get(id(transfer))
            if known is None:
                slow = self.machine.interference(transfer.kind, transfer.dtype).compute_comm_slowdown
                known = self._known[id(transfer)] = (self.duration_us(transfer), slow, transfer)
            self._times.append(known[0])
            self._slow.append(known[1])
        duration, latency = self._times[spec]
        slow = self._slow[spec]
        now = self.env._now
        record = log.add(spec, ops, now)
        log.end[record] = now + duration
        if slow == 1.0 or duration == latency:
            # Always through an event, even for zero time: keeps the engine's call depth flat.
            timeout(self.env, duration, (transfer, ops, done), _fire)
            return
        # On the host's CPUs (a shared bandwidth) the latency is CPU work too: all of it slows.
        unslowed = 0.0 if self.machine.shared_bandwidth(transfer.transport) is not None else latency
        x = _Timed(record, tuple(dict.fromkeys(transfer.ranks)), now + unslowed, duration - unslowed, slow, transfer, ops, done)
        for d in x.devices:
            self._on_device[d][x] = None
            x.nbusy += self._busy[d]
        x.factor = slow if x.nbusy else 1.0
        self._schedule(x)

    def _schedule(self, x: _Timed) -> None:
        x.token += 1
        token = x.token
        end = x.t_mark + x.work_left_us * x.factor
        self.records.end[x.record] = end
        self.env.timeout(end - self.env._now).callbacks.append(lambda _ev: self._finish(x, token))

    def _finish(self, x: _Timed, token: int) -> None:
        if token != x.token:
            return  # rescheduled
        for d in x.devices:
            del self._on_device[d][x]
        x.done(x.transfer, x.ops)

    def compute_changed(self, rank: int, computing: bool) -> None:
        self._busy[rank] = computing
        now = self.env._now
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
        log, times = self.records, self._times
        return [FlowStat.of(log.transfers[spec], log.ops(i), log.start_us(i), log.end[i], times[spec][1]) for i, spec in enumerate(log.kind)]


def _fire(ev: simpy.Timeout) -> None:
    """The end of an unslowed transfer: its timeout's value is (transfer, ops, done)."""
    transfer, ops, done = ev._value  # the `value` property's attribute, without its call
    done(transfer, ops)
