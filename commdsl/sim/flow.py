"""The flow network: transfers share links by max-min fairness (docs/simulator.md, "Network models").

Every transfer becomes one fluid entity, a *flow*, with a byte demand on each channel
(link direction) it touches, expressed as a weight per unit of progress:

  * a P2P transfer (a send/recv pair, or a one-sided peer copy) moves S bytes along its
    route: weight 1 on every channel of the path; staged through host memory it is one
    pipelined flow over both legs (chunks move device->host and host->device at once, at
    the slower leg's pace), weight 2 on the socket's memory where the machine gives its
    bandwidth (each byte written, then read), capped at the transport's `staged`
    bandwidth (what one staged copy's pipeline, or NCCL's SHM path, reaches);
  * a collective is one *coflow*: its algorithm (`collectives.edges`) fixes the bytes
    between each pair of ranks; routing them gives the bytes per channel, and the weight
    of a channel is those bytes over the algorithm's serial bytes, the unit the whole
    collective progresses in. All its channels progress together at the one rate
    max-min sharing allows, so a 64-rank ring costs a handful of events, yet contends
    with every other flow on every link it touches;
  * on a machine with NCCL's model (`nccl:`), an NCCL transfer is likewise one coflow,
    its loads, cap and latency from `commdsl.sim.nccl_flows` (NCCL's algorithm, protocol
    and channels).

A flow first waits its latency (steps x (transport latency + path link latency)), not
holding bandwidth, then moves its bytes at rate r (progress units per microsecond),
putting r * weight on each channel. Rates are max-min fair by progressive filling:
raise every unfrozen flow's rate together; a channel that fills freezes the flows on it;
a flow that reaches its cap (the transport's bandwidth: what one NCCL kernel, copy or
gloo connection reaches) freezes at it. Rates are recomputed when a flow starts moving
or ends, only over the flows connected to it through shared channels, and the network
keeps a single pending wake-up (the earliest completion or activation) on the SimPy
clock. A flow alone on its channels takes the fast path: no recomputation, one event.

Compute slowing comm (F = the op's `compute_comm_slowdown`, from `Machine.interference`:
its `interference_by_op` entry or the machine-wide factor; F != 1.0): a flow is slowed
while any device it has an endpoint on computes (a P2P transfer: sender or receiver; a
collective: any member, as a ring advances at its slowest member's pace; the stepped
mode's per-pair flows follow their collective's members). A slowed flow's cap is its solo
rate / F: alone it moves F times slower, and under contention it slows only where its
max-min share was above that. On a shared channel (the host's CPUs copying every byte,
`Machine.shared`) its weight is F times its own too: compute holds the CPUs, so each
byte costs F times as much of them, and its latency, CPU work too, runs F times slower
while compute runs there. When compute starts or ends on a device, the flows on it
whose state changes get their new cap: a solo flow is rescheduled on its own (no
recomputation), a moving shared one is recomputed with the flows connected to it, a
flow still in its latency just takes the cap with it. With F = 1.0 for every op none of
this exists (the engine does not even report compute).

A flow is built once per distinct `Transfer` (its legs, cached) and its runs are logged
flat: the transfers in the network's `TransferLog`, link loads as (time, channel, load)
arrays, and each interval a flow moved alone as one entry that `_samples` expands into its
two samples per channel when link statistics or trace counters are asked for.

`SteppedFlowNetwork` (`--network flow-steps`) is the validation mode: it runs each
collective step by step, one flow per pair of ranks per step, and waits for the whole
step before the next. Uncontended, both give the same time (tests check it).
"""

from __future__ import annotations

import heapq
import math
from array import array
from bisect import bisect_right
from collections.abc import Collection, Iterator
from dataclasses import dataclass, replace
from functools import reduce
from itertools import accumulate, chain, compress, islice, repeat
from operator import add, gt, is_, itemgetter, le, mul, sub

import simpy

try:
    import cython

    COMPILED = cython.compiled
    """This module runs compiled (Cython reads `cython.compiled` as True when it builds it)."""
except ImportError:  # no Cython here: the module runs as Python
    COMPILED = False

from commdsl.ir import Dtype, Algo, OpKind, ReduceOp, Transport
from commdsl.machine.model import LinkSpec, Machine
from commdsl.sim.collectives import CommPlan, edges
from commdsl.sim.fabric import solo_rate
from commdsl.sim.nccl_flows import machine_links
from commdsl.sim.network import Done, FlowStat, LinkStat, Network, Transfer

_ACTIVATE, _FINISH = 0, 1
_INF = math.inf
_UNSCHEDULED = -1.0
"""A flow's rate while it has no valid finish event (recomputation gives it one)."""
_STRETCH = 8
"""Solo intervals of one flow's demands logged one after another from which on link
statistics expand them channel by channel in whole arrays rather than sample by sample."""


class _Flow:
    """One fluid entity on the channels (see the module doc)."""

    __slots__ = ("demands", "cap", "solo", "remaining", "total", "rate", "t_upd", "version", "is_solo", "then", "mark",
                 "leg", "nbusy", "transfer", "ops", "record")  # fmt: skip

    def __init__(self, leg: _Leg, t_act: float, then: Done, transfer: Transfer | None, ops: tuple[int, ...], record: int):
        self.leg = leg
        """What it was built from (its unslowed cap and solo rate, its devices)."""
        self.demands = leg.demands
        """(channel, weight) pairs: channel load = weight * rate."""
        self.cap = leg.cap
        """The most it may move at (progress units per us); solo / F while slowed."""
        self.solo = leg.solo
        """The rate when alone: min(cap, capacity / weight over its channels)."""
        self.nbusy = 0
        """Its devices that compute now (compute slowing comm only)."""
        total = leg.total
        self.remaining = total
        self.total = total
        self.rate = _UNSCHEDULED
        self.t_upd = t_act
        """`remaining` is measured at t_upd and `rate` applies from it; t_upd > now: still
        in its latency (holding no bandwidth)."""
        self.version = 0
        self.is_solo = False
        self.then = then
        """Called when the flow ends: then(transfer, ops)."""
        self.transfer = transfer
        self.ops = ops
        self.record = record
        """Its transfer's number in the network's `TransferLog` (-1: one step of a stepped
        collective, logged as a whole)."""
        self.mark = 0


@dataclass(frozen=True, slots=True)
class _Leg:
    """A flow to start: its demands, cap, latency and bytes (progress units)."""

    demands: tuple[tuple[int, float], ...]
    cap: float
    solo: float
    latency_us: float
    total: float
    devices: tuple[int, ...]
    """Ranks whose compute slows it (its endpoints; a collective's members)."""
    slowed_demands: tuple[tuple[int, float], ...] = ()
    """Its demands while one of `devices` computes (see `FlowNetwork._slowed`)."""
    slow: float = 1.0
    """Its slowdown while one of `devices` computes (its op's `compute_comm_slowdown`)."""
    cpu_latency: bool = False
    """Its latency is the host CPUs' work too (it crosses a shared CPU channel): slowed
    like its bytes while compute runs on one of `devices`."""


class FlowNetwork(Network):
    """Max-min fair sharing of links by flows and coflows (see the module doc)."""

    name = "flow"

    def __init__(self, env: simpy.Environment, machine: Machine, world_size: int):
        super().__init__(env, machine, world_size)
        self.fabric, self.nccl = machine_links(machine, world_size)
        nch = len(self.fabric.names)
        self._users: list[dict[_Flow, None]] = [{} for _ in range(nch)]
        """Per channel, the flows on it (latent or moving), in arrival order."""
        self._load = [0.0] * nch
        self._bytes = [0.0] * nch
        self._heap: list[tuple[float, int, int, _Flow, int]] = []
        self._seq = 0
        self._wake_t = _INF
        self._wake_gen = 0
        self._dirty: list[_Flow] = []
        self._mark = 0
        self._legs: dict[tuple, tuple[_Leg, ...]] = {}
        # Link utilisation samples (time, channel, load in bytes/us), appended in event
        # order but not always in time order (a solo flow's are written when it ends).
        self._s_t = array("d")
        self._s_c = array("i")
        self._s_v = array("d")
        # Intervals flows moved alone, one entry each (expanded by `_samples`): samples written
        # before, demands, from, to, rate.
        self._solo_at = array("q")
        self._solo_demands: list[tuple[tuple[int, float], ...]] = []
        self._solo_t0 = array("d")
        self._solo_t1 = array("d")
        self._solo_rate = array("d")
        self._leg_of: list[_Leg] = []
        """Per distinct transfer (its index in `records`), its flow."""
        self._wake_cb = self._on_wake_event
        self.events = 0
        """Flow starts and ends processed (the bench reports events per second)."""
        self._on_device: list[dict[_Flow, None]] = [{} for _ in range(world_size)] if machine.slows_comm() else []
        """Per device, the flows with an endpoint on it (compute slowing comm only)."""
        self._cpu_channels = frozenset(self.fabric.shared_channel.values())
        """Channels whose capacity is the host's CPUs copying bytes (loopback TCP): a
        slowed flow costs F times as much of them (`_Leg.slowed_demands`)."""
        self._busy = [False] * world_size
        """Per device, whether compute runs on it."""

    # ---- building flows --------------------------------------------------------------

    def _leg(self, channel_bytes: dict[int, float], total: float, cap: float, latency_us: float, devices: tuple[int, ...]) -> _Leg:
        demands = tuple((c, b / total) for c, b in channel_bytes.items()) if total > 0 else ()
        return _Leg(demands, cap, solo_rate(self.fabric.capacity, demands, cap), latency_us, total, devices, demands)

    def _slowed(self, leg: _Leg, slow: float) -> _Leg:
        """`leg` of an op that compute slows `slow` times (1.0: as is)."""
        if slow == 1.0:
            return leg
        # While compute holds the CPUs, a byte on a channel that is the host's CPUs copying
        # bytes costs F times as much of them, so concurrent transfers share what compute
        # leaves (capping only each flow's own rate predicts such exchanges far too fast).
        cpu = self._cpu_channels
        slowed = tuple((c, w * slow if c in cpu else w) for c, w in leg.demands) if cpu else leg.demands
        return replace(leg, slowed_demands=slowed, slow=slow, cpu_latency=any(c in cpu for c, _ in leg.demands))

    def _p2p_legs(self, src: int, dst: int, size: float, transport: Transport) -> tuple[_Leg, ...]:
        # Staged or not, one flow over every channel of the route: a staged copy moves in
        # chunks with both legs in flight, at the pace of the slower leg (and of host memory).
        route = self.fabric.route(src, dst, transport)
        cap = route.spec.bandwidth_gb_per_s * 1e3
        return (self._leg(_count(route.channels, size), size, cap, route.spec.latency_us + route.latency_us, (src, dst)),)

    def _collective_legs(self, kind: OpKind, algo: Algo, ranks: tuple[int, ...], size: float, transport: Transport,
                         root: int | None, p: CommPlan, dtype: Dtype = Dtype.FP32,
                         reduce_op: ReduceOp | None = None) -> tuple[_Leg, ...]:  # fmt: skip
        fabric = self.fabric
        channel_bytes, cap, step_latency = fabric.collective_load(kind, algo, ranks, size, transport, root, p)
        if fabric.topology is None:
            link = self.machine.sized_link(transport, kind, len(ranks), size, p.latency_steps, p.serial_bytes, dtype, reduce_op)
            step_latency = link.latency_us
            override = self._override_bandwidth(kind, transport, link)
            if override is not None:
                # The measured collective's parameters are its effective link parameters:
                # scale every channel's charge so that, alone, it runs at that bandwidth.
                cap = override
                channel_bytes = {c: v * fabric.capacity[c] / cap for c, v in channel_bytes.items()}
                shared = fabric.shared_channel.get(transport)
                if shared is not None and shared in channel_bytes:
                    # Measured alone, the collective already paid for sharing the host among its
                    # own flows: its charge on the shared channel binds only against other traffic.
                    channel_bytes[shared] = p.serial_bytes * fabric.capacity[shared] / cap
        return (self._leg(channel_bytes, p.serial_bytes, cap, p.latency_steps * step_latency, tuple(dict.fromkeys(ranks))),)

    def _override_bandwidth(self, kind: OpKind, transport: Transport, link: LinkSpec) -> float | None:
        """A calibrated per-collective bandwidth (bytes/us) on a machine without topology:
        `link`'s (see `Machine.sized_link`), if the collective has calibrated parameters."""
        if self.fabric.topology is not None or not self.machine.has_override(transport, kind):
            return None
        bw = link.bandwidth_gb_per_s * 1e3
        return bw if bw < _INF else None

    def legs(self, transfer: Transfer) -> tuple[_Leg, ...]:
        t = transfer
        key = (t.kind, t.plan.algo, t.plan.proto, t.ranks, t.size_bytes, t.transport, t.root, t.dtype, t.reduce_op, t.group)
        legs = self._legs.get(key)
        if legs is None:
            if t.plan.proto is not None and self.nccl is not None:
                legs = (self._nccl_leg(t),)
            elif t.kind is OpKind.SEND or t.kind is OpKind.COPY:
                legs = self._p2p_legs(t.ranks[0], t.ranks[1], float(t.size_bytes), t.transport)
            else:
                legs = self._collective_legs(t.kind, t.plan.algo, t.ranks, float(t.size_bytes), t.transport, t.root, t.plan, t.dtype,
                                             t.reduce_op)  # fmt: skip
            if self._on_device:
                slow = self.machine.interference(t.kind, t.dtype).compute_comm_slowdown
                legs = tuple(self._slowed(leg, slow) for leg in legs)
            self._legs[key] = legs
        return legs

    def _nccl_leg(self, t: Transfer) -> _Leg:
        """An NCCL transfer as NCCL runs it: its coflow's loads, cap and latency."""
        size = float(t.size_bytes)
        co = self.nccl.coflow(t.kind, t.ranks, t.size_bytes, t.root, t.plan.algo, t.plan.proto, t.group)
        return self._leg({c: w * size for c, w in co.channel_bytes}, size, co.cap, co.latency_us, tuple(dict.fromkeys(t.ranks)))

    # ---- the Network interface -----------------------------------------------------------

    def solo_rate(self, transfer: Transfer) -> float:
        legs = self.legs(transfer)
        move_us = sum(leg.total / leg.solo for leg in legs if leg.total)
        return transfer.size_bytes / move_us if move_us > 0 else _INF

    def start(self, transfer: Transfer, ops: tuple[int, ...], done: Done) -> None:
        log = self.records
        spec, new = log.intern(transfer)
        if new:  # a transfer of this shape: its flow is built once
            (leg,) = self.legs(transfer)
            self._leg_of.append(leg)
        self._start_flow(self._leg_of[spec], done, transfer, ops, log.add(spec, ops, self.env._now))

    def _start_flow(self, leg: _Leg, then: Done, transfer: Transfer | None = None, ops: tuple[int, ...] = (), record: int = -1) -> None:
        now = self.env._now
        self.events += 1
        f = _Flow(leg, now + leg.latency_us, then, transfer, ops, record)
        if not leg.demands or leg.total == 0:
            self._push(now + leg.latency_us, f, _FINISH)  # latency only (barrier, empty op)
            return
        if self._on_device:
            busy, on_device = self._busy, self._on_device
            for d in leg.devices:
                on_device[d][f] = None
                f.nbusy += busy[d]
            if f.nbusy:
                f.cap = f.solo = leg.solo / leg.slow
                f.demands = leg.slowed_demands
                if leg.cpu_latency:
                    f.t_upd = now + leg.latency_us * leg.slow
        users = self._users
        solo = True
        for c, _ in f.demands:
            u = users[c]
            if u:
                solo = False
                for other in u:
                    if other.is_solo:
                        self._unsolo(other, now)
            u[f] = None
        if solo:
            f.is_solo = True
            f.rate = f.solo
            self._push(f.t_upd + f.remaining / f.solo, f, _FINISH)
        elif f.t_upd > now:
            self._push(f.t_upd, f, _ACTIVATE)
        else:
            self._dirty.append(f)
            self._ensure_wake(now)

    def _unsolo(self, f: _Flow, now: float) -> None:
        """`f` was alone on its channels and no longer is: from now on it is scheduled
        by recomputation (its solo finish is cancelled)."""
        f.is_solo = False
        f.version += 1
        if f.t_upd > now:
            f.rate = _UNSCHEDULED
            self._push(f.t_upd, f, _ACTIVATE)  # it starts moving later, among others
        else:
            self._log_solo(f, now)  # it moved alone since t_upd: write that down
            f.remaining -= f.rate * (now - f.t_upd)
            f.t_upd = now
            f.rate = _UNSCHEDULED
            self._dirty.append(f)
            self._ensure_wake(now)

    def _log_solo(self, f: _Flow, until: float) -> None:
        """`f` moved alone on its channels from t_upd to `until` at its solo rate: one
        entry instead of two samples per channel (expanded by `_samples`)."""
        self._solo_at.append(len(self._s_t))
        self._solo_demands.append(f.demands)
        self._solo_t0.append(f.t_upd)
        self._solo_t1.append(until)
        self._solo_rate.append(f.rate)

    def _sample(self, t: float, c: int, load: float) -> None:
        self._s_t.append(t)
        self._s_c.append(c)
        self._s_v.append(load)
        self._load[c] = load

    def _push(self, t: float, f: _Flow, what: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, what, f, f.version))
        self._ensure_wake(t)

    def _ensure_wake(self, t: float) -> None:
        if t < self._wake_t:
            self._wake_t = t
            self._wake_gen += 1
            gen = self._wake_gen
            now = self.env._now
            self.env.timeout(t - now if t > now else 0.0, gen).callbacks.append(self._wake_cb)

    def _on_wake_event(self, ev: simpy.Timeout) -> None:
        self._on_wake(ev.value)

    def _on_wake(self, gen: int) -> None:
        if gen != self._wake_gen:
            return  # superseded by an earlier wake-up
        self._wake_t = _INF
        now = self.env._now
        heap = self._heap
        finished: list[_Flow] = []
        while heap and heap[0][0] <= now:
            _, _, what, f, version = heapq.heappop(heap)
            if version != f.version:
                continue
            if what == _ACTIVATE:
                self._dirty.append(f)
            else:
                finished.append(f)
        seeds = self._dirty
        self._dirty = []
        users = self._users
        for f in finished:
            f.version += 1
            self.events += 1
            if f.is_solo and f.t_upd < now:
                self._log_solo(f, now)
            for c, w in f.leg.demands:  # bytes moved (not the slowed CPU cost)
                self._bytes[c] += w * f.total
                del users[c][f]
            if self._on_device and f.demands:
                for d in f.leg.devices:
                    del self._on_device[d][f]
        for f in finished:  # then what they leave behind (never a finished flow)
            for c, _ in f.demands:
                u = users[c]
                if u:
                    seeds.extend(u)
                elif self._load[c] != 0.0:
                    self._sample(now, c, 0.0)
        if seeds:
            self._recompute(seeds, now)
        while heap and heap[0][4] != heap[0][3].version:
            heapq.heappop(heap)
        if heap:
            self._ensure_wake(heap[0][0])
        log_end = self.records.end
        for f in finished:
            if f.record >= 0:
                log_end[f.record] = now
            f.then(f.transfer, f.ops)

    # ---- compute slowing comm ---------------------------------------------------------

    def compute_changed(self, rank: int, computing: bool) -> None:
        """Compute started or ended on `rank`: flows on it whose slowed state changes get
        their new cap (see the module doc)."""
        self._busy[rank] = computing
        now = self.env._now
        step = 1 if computing else -1
        for f in self._on_device[rank]:
            before = f.nbusy
            f.nbusy = before + step
            if before and f.nbusy:
                continue  # another of its devices still computes
            leg = f.leg
            if f.nbusy:
                f.cap = f.solo = leg.solo / leg.slow
                f.demands = leg.slowed_demands
            else:
                f.cap, f.solo = leg.cap, leg.solo
                f.demands = leg.demands
            if leg.cpu_latency and f.t_upd > now:  # in its latency, which the CPUs run too: the rest stretches or shrinks
                f.t_upd = now + (f.t_upd - now) * (leg.slow if f.nbusy else 1.0 / leg.slow)
                if not f.is_solo:
                    f.version += 1
                    self._push(f.t_upd, f, _ACTIVATE)
            if f.is_solo:  # alone on its channels: reschedule it, nothing else changes
                if f.t_upd < now:
                    self._log_solo(f, now)
                    f.remaining -= f.rate * (now - f.t_upd)
                    f.t_upd = now
                f.rate = f.solo
                f.version += 1
                self._push(f.t_upd + f.remaining / f.solo, f, _FINISH)
            elif f.t_upd <= now and f.rate != _UNSCHEDULED:  # moving among others: recompute
                self._dirty.append(f)
                self._ensure_wake(now)
            # else: in its latency, or already waiting for a recomputation: it takes its cap along

    # ---- max-min rates ----------------------------------------------------------------

    def _recompute(self, seeds: list[_Flow], now: float) -> None:
        """New max-min rates for every flow connected to `seeds` through channels."""
        self._mark += 1
        mark = self._mark
        users = self._users
        comp: list[_Flow] = []
        chans: list[int] = []
        seen_c: set[int] = set()
        todo = []
        for f in seeds:
            if f.mark != mark and f.demands:
                f.mark = mark
                todo.append(f)
        while todo:
            f = todo.pop()
            comp.append(f)
            for c, _ in f.demands:
                if c not in seen_c:
                    seen_c.add(c)
                    chans.append(c)
                    for g in users[c]:
                        if g.mark != mark:
                            g.mark = mark
                            todo.append(g)
        active: list[_Flow] = []
        for f in comp:
            if f.t_upd <= now:
                if f.rate > 0.0:
                    f.remaining -= f.rate * (now - f.t_upd)
                f.t_upd = now
                active.append(f)
            elif f.is_solo:
                f.is_solo = False
                f.version += 1
                f.rate = _UNSCHEDULED
                self._push(f.t_upd, f, _ACTIVATE)
        rates = self._maxmin(active)
        for f, r in zip(active, rates):
            # A flow keeps its pending finish if its rate did not change.
            if r != f.rate or f.is_solo:
                f.is_solo = False
                f.rate = r
                f.version += 1
                self._push(now + (f.remaining / r if f.remaining > 0.0 else 0.0), f, _FINISH)
        load = self._load
        new = dict.fromkeys(chans, 0.0)
        for f in active:
            for c, w in f.demands:
                new[c] += w * f.rate
        for c, v in new.items():
            if v != load[c]:
                self._sample(now, c, v)

    def _maxmin(self, flows: list[_Flow]) -> list[float]:
        """Progressive filling over `flows` (see the module doc)."""
        if len(flows) == 1:
            return [flows[0].solo]
        capacity = self.fabric.capacity
        wsum: dict[int, float] = {}
        count: dict[int, int] = {}
        on: dict[int, list[int]] = {}
        for i, f in enumerate(flows):
            for c, w in f.demands:
                if c in wsum:
                    wsum[c] += w
                    count[c] += 1
                    on[c].append(i)
                else:
                    wsum[c] = w
                    count[c] = 1
                    on[c] = [i]
        resid = {c: capacity[c] for c in wsum}
        stamp = dict.fromkeys(wsum, 0)
        heap = [(resid[c] / wsum[c], c, 0) for c in wsum]
        heapq.heapify(heap)
        by_cap = sorted(range(len(flows)), key=lambda i: flows[i].cap)
        ci = 0
        rate = [-1.0] * len(flows)
        left = len(flows)

        def freeze(i: int, r: float) -> None:
            rate[i] = r
            for c, w in flows[i].demands:
                count[c] -= 1
                stamp[c] += 1
                if count[c] > 0:
                    resid[c] -= w * r
                    wsum[c] -= w
                    level = resid[c] / wsum[c] if resid[c] > 0.0 else 0.0
                    heapq.heappush(heap, (level, c, stamp[c]))

        while left:
            while heap and heap[0][2] != stamp[heap[0][1]]:
                heapq.heappop(heap)
            while ci < len(by_cap) and rate[by_cap[ci]] >= 0.0:
                ci += 1
            link_level = heap[0][0] if heap else _INF
            cap_level = flows[by_cap[ci]].cap if ci < len(by_cap) else _INF
            if cap_level <= link_level:
                if cap_level == _INF:  # nothing limits the rest: infinitely fast
                    for i in range(len(flows)):
                        if rate[i] < 0.0:
                            rate[i] = _INF
                    break
                freeze(by_cap[ci], cap_level)
                left -= 1
            else:
                _, c, _ = heapq.heappop(heap)
                for i in on[c]:
                    if rate[i] < 0.0:
                        freeze(i, link_level)
                        left -= 1
        return rate

    # ---- outputs ------------------------------------------------------------------------

    def meta(self) -> dict:
        return {"model": self.name, "links": len(self.fabric.names), "topology": self.fabric.topology is not None}

    def _sample_arrays(self) -> tuple[array, array, array]:
        """The samples as flat arrays (time, channel, load bytes/us), in event order. Solo
        intervals are expanded into the arrays: a few bytes per sample, as there can be
        millions."""
        st, sc, sv = self._s_t, self._s_c, self._s_v
        at, demands, t0s, t1s, rates = self._solo_at, self._solo_demands, self._solo_t0, self._solo_t1, self._solo_rate
        t, c, v = array("d"), array("i"), array("d")
        i = j = 0
        while True:
            # The event samples up to the next solo interval's place, then every solo interval
            # logged at that place: per interval, its start on each channel, then its end.
            idx = at[j] if j < len(at) else len(st)
            t.extend(st[i:idx])
            c.extend(sc[i:idx])
            v.extend(sv[i:idx])
            i = idx
            if j == len(at):
                break
            k = bisect_right(at, idx, j)
            run = demands[j:k]
            lengths = set(map(len, run))
            if len(lengths) == 1:
                # Every interval on as many channels (P2P transfers, one collective): the
                # samples of the p-th channel of each interval written as strided slices.
                (n,) = lengths
                width = 2 * n
                base = len(t)
                t.frombytes(bytes(t.itemsize * width * (k - j)))
                c.frombytes(bytes(c.itemsize * width * (k - j)))
                v.frombytes(bytes(v.itemsize * width * (k - j)))
                run_t0s, run_t1s, run_rates = t0s[j:k], t1s[j:k], rates[j:k]
                for p in range(n):
                    pairs = list(map(itemgetter(p), run))
                    chans = array("i", map(itemgetter(0), pairs))
                    t[base + p :: width] = run_t0s
                    t[base + n + p :: width] = run_t1s
                    c[base + p :: width] = chans
                    c[base + n + p :: width] = chans
                    v[base + p :: width] = array("d", map(mul, map(itemgetter(1), pairs), run_rates))
            else:
                t.extend([x for d, t0, t1 in zip(run, t0s[j:k], t1s[j:k]) for x in [t0] * len(d) + [t1] * len(d)])
                c.extend([ch for d in run for _ in (0, 1) for ch, _w in d])
                v.extend([x for d, rate in zip(run, rates[j:k]) for x in [w * rate for _c, w in d] + [0.0] * len(d)])
            j = k
        return t, c, v

    def link_stats(self, makespan_us: float, channels: Collection[int] | None = None) -> list[LinkStat]:
        fabric = self.fabric
        out = []
        known: dict[tuple[bytes, bytes], tuple[float, float]] = {}
        """Samples -> busy time and top load: the links of a collective repeated have the same."""
        for c, samples in enumerate(self._channel_samples(channels)):
            if samples is None or self._bytes[c] <= 0.0:
                continue
            t, v = samples
            key = (t.tobytes(), v.tobytes())
            stats = known.get(key)
            if stats is None:
                stats = known[key] = _busy_and_top(t, v)
            busy, top = stats
            cap = fabric.capacity[c]
            # Division by a positive capacity keeps the order of loads, so the largest load
            # gives the largest utilisation, exactly.
            peak = top / cap if cap < _INF else 0.0
            bw = fabric.bandwidth_gb_per_s[c]
            util = self._bytes[c] / (bw * 1e3 * makespan_us) if makespan_us > 0 and bw < _INF else 0.0
            out.append(LinkStat(fabric.names[c], fabric.kinds[c], bw, self._bytes[c], busy, util, peak))
        return out

    def _channel_samples(self, channels: Collection[int] | None = None) -> list[tuple[array, array] | None]:
        """Per channel, its (time, load bytes/us) samples in event order, as two flat arrays:
        the event samples and the solo intervals expanded (per interval, its start on each of
        its channels, then its end), in the order `_sample_arrays` lists them. With
        `channels`, only theirs (None for every other channel)."""
        n = len(self.fabric.names)
        if channels is None:
            per = [(array("d"), array("d")) for _ in range(n)]
            own = per
            add_t = [t.append for t, _ in per]
            add_v = [v.append for _, v in per]
        else:
            # The other channels' samples go to one pair of arrays, and are dropped; no object
            # is made per channel but for `channels` (a big machine has a million channels).
            unread = (array("d"), array("d"))
            own = [unread] * n
            add_t, add_v = [unread[0].append] * n, [unread[1].append] * n
            for c in channels:
                own[c] = (array("d"), array("d"))
                add_t[c], add_v[c] = own[c][0].append, own[c][1].append
            per = [x if x is not unread else None for x in own]
        st, sc, sv = self._s_t, self._s_c, self._s_v
        at, demands, t0s, t1s, rates = self._solo_at, self._solo_demands, self._solo_t0, self._solo_t1, self._solo_rate
        if channels is not None:
            # A solo interval's demands on `channels` only: the flows' demands are shared
            # tuples (one per leg), each filtered once.
            wanted = frozenset(channels)
            kept: dict[int, tuple] = {}
            for d in demands:
                if id(d) not in kept:
                    kept[id(d)] = tuple(x for x in d if x[0] in wanted)
            demands = [kept[id(d)] for d in demands]

        def one_by_one(j: int, k: int) -> None:
            for d, t0, t1, rate in zip(demands[j:k], t0s[j:k], t1s[j:k], rates[j:k]):
                for c, w in d:
                    add_t[c](t0)
                    add_v[c](w * rate)
                for c, _w in d:
                    add_t[c](t1)
                    add_v[c](0.0)

        def stretch(j: int, k: int) -> None:
            """Intervals j..k-1 of one flow's demands (a leg names each channel once, `_leg`
            makes its demands from a dict): each channel gets their samples in two extends."""
            times = array("d", bytes(16 * (k - j)))
            times[0::2] = t0s[j:k]
            times[1::2] = t1s[j:k]
            run_rates = rates[j:k]
            by_weight: dict[float, array] = {}
            for c, w in demands[j]:
                loads = by_weight.get(w)
                if loads is None:
                    loads = by_weight[w] = array("d", bytes(16 * (k - j)))
                    loads[0::2] = array("d", map(mul, repeat(w), run_rates))
                own[c][0].extend(times)
                own[c][1].extend(loads)

        long_stretch = b"\1" * (_STRETCH - 1)
        i = j = 0
        while True:
            idx = at[j] if j < len(at) else len(st)
            for tk, c, vk in zip(st[i:idx], sc[i:idx], sv[i:idx]):
                add_t[c](tk)
                add_v[c](vk)
            i = idx
            if j == len(at):
                break
            k = bisect_right(at, idx, j)
            # The solo intervals logged at this place: those of one flow's demands logged one
            # after another (a collective repeated, as in a chain) in whole arrays past a few,
            # the others one by one. same[m] is 1 where interval base + m has the demands of the next.
            base = j
            same = bytes(map(is_, demands[base : k - 1], demands[base + 1 : k]))
            while j < k:
                m = same.find(long_stretch, j - base)
                start = k if m < 0 else base + m
                one_by_one(j, start)
                if start == k:
                    break
                m = same.find(b"\0", start - base)
                end = k if m < 0 else base + m + 1
                stretch(start, end)
                j = end
            j = k
        return per

    def counter_columns(self, chunk: int) -> Iterator[tuple[list[float], list[str], list[float]]]:
        """(times, channel names, utilisations 0..1) of the trace counters' samples in time
        order, about `chunk` at a time: only changes. Of several samples of a channel at one
        instant the last wins (a flow that ends as the next starts), and a value equal to
        the channel's last one is dropped, so back-to-back collectives on the same links
        cost two samples per link, not two each."""
        fabric = self.fabric
        names, capacity = fabric.names, fabric.capacity
        t, c, v = self._sample_arrays()
        in_order = chain.from_iterable(zip(map(t.__getitem__, order), map(c.__getitem__, order), map(v.__getitem__, order))
                                       for order in time_order(t))  # fmt: skip
        shown: dict[int, float] = {}
        pending: dict[int, float] = {}
        """The last sample of each channel at the instant `now`."""
        now = None
        times: list[float] = []
        links: list[str] = []
        utils: list[float] = []
        # In time order, then a sentinel whose time differs from every sample's: it shows
        # the last instant's samples and is itself never shown.
        for tk, ck, vk in chain(in_order, ((None, -1, 0.0),)):
            if tk != now:
                for ch, val in pending.items():
                    if shown.get(ch, 0.0 if val == 0.0 else -1.0) != val:
                        shown[ch] = val
                        cap = capacity[ch]
                        times.append(now)
                        links.append(names[ch])
                        utils.append(val / cap if cap < _INF else 0.0)
                pending.clear()
                if len(times) >= chunk:
                    yield times, links, utils
                    times, links, utils = [], [], []
                now = tk
            pending[ck] = vk
        if times:
            yield times, links, utils

    def flow_stats(self) -> list[FlowStat]:
        fabric = self.fabric
        log = self.records
        described: dict[int, tuple[float, str, int]] = {}
        """Per distinct transfer: its latency, bottleneck link and number of links."""
        out = []
        for i, spec in enumerate(log.kind):
            about = described.get(spec)
            if about is None:
                legs = self.legs(log.transfers[spec])
                worst, name, latency = -1.0, "", 0.0
                for leg in legs:
                    latency += leg.latency_us
                    for c, w in leg.demands:
                        load = w / fabric.capacity[c] if fabric.capacity[c] < _INF else 0.0
                        if load > worst:
                            worst, name = load, fabric.names[c]
                about = described[spec] = (latency, name, len({c for leg in legs for c, _ in leg.demands}))
            out.append(FlowStat.of(log.transfers[spec], log.ops(i), log.start_us(i), log.end[i], *about))
        return out


_ORDER_BLOCK = 1 << 16
"""Samples `time_order` sorts at once (about): its memory beyond the arrays."""


def time_order(t: array, block: int = _ORDER_BLOCK) -> Iterator[list[int]]:
    """The positions of `t` sorted by time, stably (ties keep position order), in lists
    of about `block`, none empty: what `sorted(range(len(t)), key=t.__getitem__)` lists,
    without holding it. Samples are logged nearly in time order (a solo interval's start
    is written when it ends), so the positions up to a block's end that are no later
    than every time after it are final; the others wait for the next block."""
    n = len(t)
    # Per block, the earliest time in it or any block after it.
    earliest = list(accumulate(reversed([min(t[lo : lo + block]) for lo in range(0, n, block)]), min))[::-1]
    carry: list[int] = []  # sorted by time, then position; every one before the next block
    for b, lo in enumerate(range(0, n, block)):
        # Stable: tied with a block's position, a carried one (earlier) stays first.
        batch = sorted(chain(carry, range(lo, min(lo + block, n))), key=t.__getitem__)
        if b + 1 == len(earliest):
            yield batch
            return
        cut = bisect_right(batch, earliest[b + 1], key=t.__getitem__)
        carry = batch[cut:]
        del batch[cut:]
        if batch:
            yield batch


def _busy_and_top(t: array, v: array) -> tuple[float, float]:
    """A channel's busy time (the time from each sample with a load > 0 to the next,
    summed in time order) and its largest load, from its samples in event order (sorted
    by time first, stably, where they are not in time order already)."""
    if COMPILED:
        found = _busy_and_top_in_order(t, v)
        if found is not None:
            return found
    if not all(map(le, t, islice(t, 1, None))):
        order = sorted(range(len(t)), key=t.__getitem__)
        t, v = array("d", map(t.__getitem__, order)), array("d", map(v.__getitem__, order))
    # Added one by one from 0.0 in C-level passes (sum() compensates its rounding on Python 3.12+).
    busy = reduce(add, compress(map(sub, islice(t, 1, None), t), map(gt, v, repeat(0.0))), 0.0)
    top = max(v, default=0.0)
    return busy, top if top > 0.0 else 0.0


def _busy_and_top_in_order(t: array, v: array) -> tuple[float, float] | None:
    """`_busy_and_top` in one C loop where compiled (the same sums in the same order, and
    the largest load), or None where the samples are not in time order. Unused as Python,
    where `_busy_and_top`'s C-level passes are faster."""
    n = len(t)
    busy = 0.0
    top = 0.0
    for i in range(n):
        x = v[i]
        if x > top:
            top = x
        if i + 1 < n:
            if not t[i] <= t[i + 1]:
                return None
            if x > 0.0:
                busy += t[i + 1] - t[i]
    return busy, top


def _count(channels: tuple[int, ...], nbytes: float) -> dict[int, float]:
    out: dict[int, float] = {}
    for c in channels:
        out[c] = out.get(c, 0.0) + nbytes
    return out


class SteppedFlowNetwork(FlowNetwork):
    """Validation mode: a collective runs step by step, one flow per pair of ranks per
    step (each moving its pair's bytes / steps), and the next step starts when the whole
    step is done. Costs one event per flow per step: for checking the coflow model, not
    for large schedules. NCCL transfers of a machine with an NCCL model run as coflows
    (their steps pipeline over channels and chunks; the model has no steps to walk)."""

    name = "flow-steps"

    def start(self, transfer: Transfer, ops: tuple[int, ...], done: Done) -> None:
        if transfer.kind is OpKind.SEND or transfer.kind is OpKind.COPY or (transfer.plan.proto is not None and self.nccl is not None):
            super().start(transfer, ops, done)
            return
        log = self.records
        spec, new = log.intern(transfer)
        if new:
            self._leg_of.append(self.legs(transfer)[0])
        record = log.add(spec, ops, self.env._now)

        def end(_t: Transfer | None = None, _ops: tuple[int, ...] = ()) -> None:
            log.end[record] = self.env._now
            done(transfer, ops)

        p = transfer.plan
        fabric = self.fabric
        steps = max(p.latency_steps, 1)
        coflow = self.legs(transfer)[0]
        link = self.machine.sized_link(transfer.transport, transfer.kind, len(transfer.ranks), float(transfer.size_bytes),
                                       p.latency_steps, p.serial_bytes, transfer.dtype, transfer.reduce_op)  # fmt: skip
        override = self._override_bandwidth(transfer.kind, transfer.transport, link)
        per_step: list[_Leg] = []
        for a, b, nbytes in edges(transfer.kind, p.algo, transfer.ranks, float(transfer.size_bytes), transfer.root, p):
            share = nbytes / steps
            chans = _count(fabric.route(a, b, transfer.transport).channels, share)
            if override is not None:  # the same scaling as the coflow's (see _collective_legs)
                chans = {c: v * fabric.capacity[c] / override for c, v in chans.items()}
            # The coflow's cap bounds its progress (serial bytes); a pair's flow gets its share.
            cap = coflow.cap * nbytes / p.serial_bytes
            per_step.append(self._slowed(self._leg(chans, share, cap, coflow.latency_us / steps, coflow.devices), coflow.slow))
        if not per_step:
            self._start_flow(_Leg((), _INF, _INF, coflow.latency_us, 0.0, ()), end)
            return
        state = {"step": 0, "left": 0}

        def run_step() -> None:
            state["left"] = len(per_step)
            for leg in per_step:
                self._start_flow(leg, step_done)

        def step_done(_t: Transfer | None, _ops: tuple[int, ...]) -> None:
            state["left"] -= 1
            if state["left"] == 0:
                state["step"] += 1
                if state["step"] == steps:
                    end()
                else:
                    run_step()

        run_step()
