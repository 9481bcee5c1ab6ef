"""The simulation engine: the execution semantics of DESIGN.md on a SimPy clock.

Per rank there is a host, one FIFO per stream and one comm queue per group. They are
small state machines, each with an idempotent `advance`: do everything that can be done
at the current simulated time, then either finish or wait. Whatever may unblock an
entity "kicks" it (puts it on a to-do deque that every SimPy callback drains), so the
call depth stays flat and the only SimPy events are:

  * one timeout per op that takes time on a stream (compute, copy), or that starts
    later than now because the host issues it later;
  * one timeout per transfer (a whole collective, or a send/recv pair), from the network.

With interference (any of `comm_compute_slowdown`, `compute_comm_slowdown`,
`copy_compute_slowdown`, `compute_copy_slowdown` or a per-op factor of
`interference_by_op` other than 1.0), a compute op runs on a
timer that starts at its true start and is rescheduled when the NCCL kernels or copies
of its device change (copies likewise, when compute starts or stops there); with
`compute_comm_slowdown`, the network also hears when each device starts and stops
computing (`Network.compute_changed`). With all factors 1.0 none of this runs.

With a random generator (`simulate --samples N`: one sample) and the machine's
`compute_noise`, each compute op's time gets its random stalls, and a stream that was
kept waiting for a comm op or another stream's event may wake late; each drawn once.

The host runs ahead of `env.now` on its own clock as long as it does not block: issuing
only stamps each op with the time it reaches its stream (`ready`). Everything another
entity can observe happens through events at its true time, so the network sees
transfers in time order.

Per op the engine keeps flat arrays indexed by a global op number `g` (ranks laid out
one after another): issue start/end, start, end, state, and `cause`, the op whose
completion let it start last (what the critical path walks back along).
"""

from __future__ import annotations

import math
import random
from array import array
from collections import deque
from dataclasses import dataclass

import simpy

from commdsl.errors import MachineError
from commdsl.ir import HOST_STREAM, Algo, CopyDir, Dtype, Op, OpKind, Program, Transport
from commdsl.machine.model import Machine
from commdsl.sim.collectives import plan, resolve_algo
from commdsl.sim.network import Network, Transfer

# Op states.
PENDING, ELIGIBLE, ACTIVE, DONE = 0, 1, 2, 3
"""PENDING: not run yet. ELIGIBLE (comm ops): the issuing stream's earlier work is done,
the op waits in its comm queue. ACTIVE (comm ops): its kernel runs (maybe waiting for
peers). DONE: finished."""

# Stream FIFO entries are ints: g * 4 + tag.
_EXEC, _MARK, _SYNC = 0, 1, 2
"""EXEC: the op itself runs on the stream. MARK: a comm op's dependency on the stream's
earlier work (zero time; then the op joins its comm queue). SYNC: the stream waits for a
synchronous comm op (or a synchronous batch, at its last op)."""

_HOST, _STREAM, _QUEUE = 0, 1, 2  # entity kinds

_DEVICE_KINDS = frozenset({OpKind.COMPUTE, OpKind.COPY, OpKind.RECORD, OpKind.WAIT_EVENT})
_COMM_KINDS = frozenset(k for k in OpKind if k.is_comm)
_COLLECTIVE_KINDS = frozenset(k for k in OpKind if k.is_collective)
# Enum members are looked up through descriptors (slow in hot loops): bind them once.
_COMPUTE, _COPY, _SEND, _RECV, _WAIT, _WAIT_EVENT, _HOST_OP, _SYNCHRONIZE = (
    OpKind.COMPUTE, OpKind.COPY, OpKind.SEND, OpKind.RECV, OpKind.WAIT, OpKind.WAIT_EVENT, OpKind.HOST, OpKind.SYNCHRONIZE,
)  # fmt: skip
_GLOO = Transport.GLOO
_NCCL = Transport.NCCL
ALGOS = tuple(Algo)
"""`RawResult.algos` holds indices into this tuple (one byte per op)."""


class _Entity:
    __slots__ = ("kind", "rank", "kicked")

    def __init__(self, kind: int, rank: int):
        self.kind = kind
        self.rank = rank
        self.kicked = False


class _Host(_Entity):
    __slots__ = ("pc", "end", "t", "cause", "block_g", "block_deps", "sync_targets")

    def __init__(self, rank: int, first: int, end: int):
        super().__init__(_HOST, rank)
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
        self.sync_targets: list[tuple[_Entity, int]] = []


class _Stream(_Entity):
    __slots__ = ("name", "fifo", "busy", "pushed", "done", "last_g", "last_end", "woke", "drain_waiters", "cur", "cur_cause",
                 "delay", "work_left", "t_run", "factor", "token", "slowed")  # fmt: skip

    def __init__(self, rank: int, name: str):
        super().__init__(_STREAM, rank)
        self.name = name
        self.fifo: deque[int] = deque()
        self.busy = False
        self.cur = -1
        """The entry being timed (busy), and the op its start waited for."""
        self.cur_cause = -1
        self.pushed = 0
        self.done = 0
        self.last_g = -1
        self.last_end = 0.0
        self.woke = False
        """The last entry went on when another thread's work ended, its late wake-up
        left to the op after it (`Engine._woken`)."""
        self.drain_waiters: list[tuple[int, _Entity]] = []
        # Interference (only used when the machine's slowdown factor is not 1):
        self.delay = False
        """The timer only waits for the entry's start (a compute op starts at its true time)."""
        self.work_left = 0.0
        """Of the running compute op: microseconds of work left at t_run, unslowed."""
        self.t_run = 0.0
        self.factor = 1.0
        """Current slowdown of the running compute op."""
        self.token = 0
        """Generation of the compute timer (a rescheduled timer supersedes the old one)."""
        self.slowed = False


class _Queue(_Entity):
    """One group's comm queue on one rank: items (an op, or a P2P batch) in issue order."""

    __slots__ = ("group", "fifo", "active", "remaining", "pushed", "done", "last_g", "last_end", "drain_waiters")

    def __init__(self, rank: int, group: str):
        super().__init__(_QUEUE, rank)
        self.group = group
        self.fifo: deque[int] = deque()
        """Items: the op's g, or the first g of a batch."""
        self.active = False
        self.remaining = 0
        """Ops of the active item not finished yet."""
        self.pushed = 0
        self.done = 0
        self.last_g = -1
        self.last_end = 0.0
        self.drain_waiters: list[tuple[int, _Entity]] = []


class _Collective:
    """One collective instance: the k-th collective of a group, across its members."""

    __slots__ = ("group", "seq", "size", "ops", "arrived")

    def __init__(self, group: str, seq: int, size: int):
        self.group = group
        self.seq = seq
        self.size = size
        self.ops: list[int] = []
        """Members' ops (g), in rank order as found in the program."""
        self.arrived: list[int] = []
        """Members' ops that are active, in arrival order."""


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


class Engine:
    """Simulate one `Program` on one `Machine` through a `Network`."""

    def __init__(self, program: Program, machine: Machine, network_cls: type[Network], rng: random.Random | None = None):
        self.program = program
        self.machine = machine
        self.env = simpy.Environment()
        self.network = network_cls(self.env, machine, program.world_size)
        self.base = []
        ops: list[Op] = []
        for rank_ops in program.ops:
            self.base.append(len(ops))
            ops.extend(rank_ops)
        self.ops = ops
        n = len(ops)
        zeros = array("d", bytes(8 * n))
        self.issue_start = array("d", zeros)
        self.issue_end = array("d", zeros)
        self.ready = self.issue_end  # when the op reaches its stream (host launch done)
        self.start = array("d", zeros)
        self.end = array("d", zeros)
        self.state = bytearray(n)
        self.cause = array("q", [-1]) * n
        self.partner = array("q", [-1]) * n
        self.waiters: dict[int, list[_Entity]] = {}
        self._todo: deque[_Entity] = deque()
        self.hosts = [_Host(r, self.base[r], self.base[r] + len(program.ops[r])) for r in range(program.world_size)]
        self.streams: list[dict[str, _Stream]] = [{s: _Stream(r, s) for s in program.streams} for r in range(program.world_size)]
        self.queues: list[dict[str, _Queue]] = [{} for _ in range(program.world_size)]
        self.coll_of: list[_Collective | None] = [None] * n
        self.queue_of: list[_Queue | None] = [None] * n
        """Per comm op, its group's comm queue on its rank."""
        self.batch_ops: dict[int, tuple[int, ...]] = {}
        """P2P batches: first op (g) -> the batch's ops, in issue order."""
        self.batch_queues: dict[int, tuple[_Queue, ...]] = {}
        """P2P batches: first op (g) -> the comm queues it occupies (usually one)."""
        self.collectives: list[_Collective] = []
        self.algos = bytearray(n)
        self.group_ranks = {g.id: g.ranks for g in program.groups}
        self.interfere = machine.slows_compute()
        """Compute slows while an NCCL kernel of its device runs (DESIGN.md semantics 7)."""
        self.kernels: list[list[float]] = [[] for _ in range(program.world_size)]
        """Per rank, the compute slowdowns of its NCCL ops active (their kernels hold SMs)."""
        self.kernel_factor: dict[tuple[OpKind, Dtype], float] = {}
        """Per comm op kind and dtype, the compute slowdown while it runs (`Machine.interference`)."""
        self.nominal_us: dict[int, float] = {}
        """Compute ops (g) that ran slowed, with their time without interference."""
        self.slow_comm = machine.slows_comm()
        """Comm slows while compute runs on its devices: the network hears when compute
        starts and ends on each device (`Network.compute_changed`)."""
        self.copy_slowdown = machine.copy_compute_slowdown
        self.copy_interfere = self.copy_slowdown != 1.0
        """Compute slows while a copy runs on its device (on a CPU, a copy is a thread)."""
        self.copying = [0] * program.world_size
        """Per rank, copy ops running (only counted with `timed_copies`)."""
        self.copy_slowed = machine.compute_copy_slowdown
        """Copies slow while compute runs on their device (on a CPU, both are threads)."""
        noise = machine.compute_noise
        self.duration_stretch = noise.duration_stretch if noise is not None else 1.0
        """Explicit compute durations run this many times long (`ComputeNoise.duration_stretch`)."""
        self.timed_copies = self.copy_interfere or self.copy_slowed != 1.0
        self.count_compute = self.slow_comm or self.copy_slowed != 1.0 or (rng is not None and noise is not None)
        self.timed_compute = self.interfere or self.count_compute or self.timed_copies
        """Compute ops start at their true time and end through `_on_compute_timer`; with
        `timed_copies`, copy ops too."""
        self.computing = [0] * program.world_size
        """Per rank, compute ops running (only counted with `count_compute`)."""
        self.ranks_computing = 0
        """Ranks with a compute op running (`_woken` asks on every wait of a sampled run)."""
        self.rng = rng if machine.compute_noise is not None else None
        """Draws compute stalls and late wake-ups (a sampled simulation on a machine with
        `compute_noise`)."""
        self.stall_us: dict[int, float] = {}
        """Compute ops (g) with their stall time, drawn once per op."""
        self.wake_us: dict[int, float] = {}
        """Stream entries that waited on another thread's work, with their late wake-up."""
        self._prepare()

    # ---- setup --------------------------------------------------------------------

    def _prepare(self) -> None:
        """Static facts: send/recv pairing, collective instances, machine coverage."""
        machine = self.machine
        sends: dict[tuple, deque[int]] = {}
        recvs: dict[tuple, deque[int]] = {}
        seq: dict[tuple[int, str], int] = {}
        instances: dict[tuple[str, int], _Collective] = {}
        chosen: dict[tuple, Algo] = {}
        checked: set = set()
        for g, op in enumerate(self.ops):
            kind = op.kind
            if kind in _COMM_KINDS:
                if op.transport not in checked:
                    if machine.transport(op.transport) is None:
                        raise MachineError(
                            f"machine {machine.name} has no '{op.transport.value}' transport, which {op.kind.value} "
                            f"{op.name} on rank {op.rank} uses (machine transports: {', '.join(t.value for t, _ in machine.transports)})",
                            op.loc, rank=op.rank, hint="pick another --machine, or set the schedule's `transport:`",
                        )  # fmt: skip
                    checked.add(op.transport)
                queues = self.queues[op.rank]
                if op.group not in queues:
                    queues[op.group] = _Queue(op.rank, op.group)
                self.queue_of[g] = queues[op.group]
                algo = resolve_algo(op)  # an explicit algo= the simulator cannot model is an error
                if op.algo is None and kind in _COLLECTIVE_KINDS:
                    key = (op.group, kind, op.size_bytes, op.transport)
                    algo = chosen.get(key)
                    if algo is None:
                        algo = chosen[key] = self.network.choose_algo(op, self.group_ranks[op.group])
                self.algos[g] = ALGOS.index(algo)
            if kind is _SEND:
                key = (op.rank, op.peer, op.group)
                r = recvs.get(key)
                if r:
                    self._pair(g, r.popleft())
                else:
                    sends.setdefault(key, deque()).append(g)
            elif kind is _RECV:
                key = (op.peer, op.rank, op.group)
                s = sends.get(key)
                if s:
                    self._pair(s.popleft(), g)
                else:
                    recvs.setdefault(key, deque()).append(g)
            elif kind in _COLLECTIVE_KINDS:
                k = seq.get((op.rank, op.group), 0)
                seq[(op.rank, op.group)] = k + 1
                inst = instances.get((op.group, k))
                if inst is None:
                    inst = instances[(op.group, k)] = _Collective(op.group, k, len(self.group_ranks[op.group]))
                    self.collectives.append(inst)
                inst.ops.append(g)
                self.coll_of[g] = inst
            elif kind is _COMPUTE and op.duration_us is None and op.flops is not None:
                if (op.dtype, "flops") not in checked:
                    if machine.device.tflops(op.dtype) is None:
                        rates = ", ".join(d.value for d, _ in machine.device.peak_tflops)
                        raise MachineError(
                            f"machine {machine.name} has no {op.dtype.value} compute rate for compute {op.name} on rank {op.rank} "
                            f"(it lists: {rates})",
                            op.loc, rank=op.rank, hint="give the op a duration, another dtype=, or add the rate to the machine",
                        )  # fmt: skip
                    checked.add((op.dtype, "flops"))

        batches: dict[int, list[int]] = {}
        for g, op in enumerate(self.ops):
            if op.batch is not None:
                batches.setdefault(self.base[op.rank] + op.batch, []).append(g)
        for first, members in batches.items():
            self.batch_ops[first] = tuple(members)
            self.batch_queues[first] = tuple(dict.fromkeys(self.queue_of[m] for m in members))

    def _pair(self, send: int, recv: int) -> None:
        self.partner[send] = recv
        self.partner[recv] = send

    # ---- running --------------------------------------------------------------------

    def run(self) -> RawResult:
        for h in self.hosts:
            self._kick(h)
        self._drain()
        self.env.run()
        return RawResult(self.ops, self.base, self.issue_start, self.issue_end, self.start, self.end, self.state, self.cause, self.partner, self.algos)

    def unfinished(self) -> bool:
        return any(s != DONE for s in self.state)

    def _kick(self, e: _Entity) -> None:
        if not e.kicked:
            e.kicked = True
            self._todo.append(e)

    def _drain(self) -> None:
        todo = self._todo
        while todo:
            e = todo.popleft()
            e.kicked = False
            kind = e.kind
            if kind == _STREAM:
                self._advance_stream(e)
            elif kind == _QUEUE:
                self._advance_queue(e)
            else:
                self._advance_host(e)

    def _wait_on(self, g: int, e: _Entity) -> None:
        w = self.waiters.get(g)
        if w is None:
            self.waiters[g] = [e]
        else:
            w.append(e)

    def _finish(self, g: int, t: float) -> None:
        """Op g is done at time t: wake whatever waits on it."""
        self.end[g] = t
        self.state[g] = DONE
        w = self.waiters.pop(g, None)
        if w:
            for e in w:
                self._kick(e)

    def _first_pending(self, deps) -> int:
        state = self.state
        for d in deps:
            if state[d] != DONE:
                return d
        return -1

    def _latest(self, deps) -> int:
        """The dependency that finished last (lowest g on ties)."""
        end = self.end
        best = -1
        for d in deps:
            if best < 0 or end[d] > end[best]:
                best = d
        return best

    def _deps(self, g: int, tag: int) -> tuple[int, ...] | range:
        """What an entry must wait for before it can start (ops, as g)."""
        op = self.ops[g]
        if tag == _SYNC:
            if op.batch is not None:
                return self.batch_ops[self.base[op.rank] + op.batch]
            return (g,)
        b = self.base[op.rank]
        return tuple(b + i for i in op.waits_for)

    # ---- host -------------------------------------------------------------------------

    def _advance_host(self, h: _Host) -> None:
        ops = self.ops
        machine = self.machine
        if h.block_g >= 0 and not self._host_unblocked(h):
            return
        while h.pc < h.end:
            g = h.pc
            op = ops[g]
            kind = op.kind
            if kind in _DEVICE_KINDS or (kind is _WAIT and op.stream != HOST_STREAM and not self._gloo_wait(op)):
                self.issue_start[g] = h.t
                h.t += machine.kernel_launch_us
                self.issue_end[g] = h.t
                self.cause[g] = h.cause
                self._push(self.streams[op.rank][op.stream], g * 4 + _EXEC)
            elif kind in _COMM_KINDS:
                self._issue_comm(h, g, op)
                if h.block_g >= 0:
                    h.pc += 1
                    if not self._host_unblocked(h):
                        return
                    continue
            elif kind is _HOST_OP:
                self.start[g] = h.t
                h.t += op.duration_us
                self.cause[g] = h.cause
                h.cause = g
                self._finish(g, h.t)
            elif kind is _WAIT:  # on the host, or on a gloo handle (gloo's wait blocks the CPU)
                self.start[g] = h.t
                h.block_g = g
                h.block_deps = self._deps(g, _EXEC)
                h.pc += 1
                if not self._host_unblocked(h):
                    return
                continue
            elif kind is _SYNCHRONIZE:
                self.start[g] = h.t
                h.block_g = g
                h.block_deps = ()
                if op.stream == HOST_STREAM:  # device synchronize: every stream and comm queue
                    targets = list(self.streams[op.rank].values()) + list(self.queues[op.rank].values())
                else:
                    targets = [self.streams[op.rank][op.stream]]
                h.sync_targets = [(e, e.pushed) for e in targets]
                h.pc += 1
                if not self._host_unblocked(h):
                    return
                continue
            else:
                raise AssertionError(f"unhandled op kind {kind}")
            h.pc += 1

    def _gloo_wait(self, op: Op) -> bool:
        b = self.base[op.rank]
        return any(self.ops[b + i].transport is _GLOO for i in op.waits_for)

    def _host_unblocked(self, h: _Host) -> bool:
        """If what the host is blocked in is done, finish it and return True."""
        g = h.block_g
        pending = self._first_pending(h.block_deps)
        if pending >= 0:
            self._wait_on(pending, h)
            return False
        for e, target in h.sync_targets:
            if e.done < target:
                e.drain_waiters.append((target, h))
                return False
        # Unblocked: at the latest completion among what it waited for.
        t, cause = h.t, h.cause
        if h.block_deps:
            d = self._latest(h.block_deps)
            if self.end[d] >= t:
                t, cause = self.end[d], d
        for e, _ in h.sync_targets:
            if e.last_g >= 0 and e.last_end >= t:
                t, cause = e.last_end, e.last_g
        t = max(t, self.env.now)
        op = self.ops[g]
        if op.kind in _COMM_KINDS:  # a blocking gloo call: the host's issue span covers the wait
            self.issue_end[g] = t
        else:
            self.cause[g] = cause
            self._finish(g, t)
        h.t = t
        h.cause = cause if op.kind in _COMM_KINDS else g
        h.block_g = -1
        h.block_deps = ()
        h.sync_targets = []
        return True

    def _issue_comm(self, h: _Host, g: int, op: Op) -> None:
        self.issue_start[g] = h.t
        h.t += self.machine.comm_launch_us
        self.issue_end[g] = h.t
        self.cause[g] = h.cause
        stream = self.streams[op.rank][op.stream]
        self._push(stream, g * 4 + _MARK)
        if op.batch is None:
            q = self.queue_of[g]
            q.fifo.append(g)
            q.pushed += 1
            deps: tuple[int, ...] = (g,)
        else:
            # A batch is one item in each comm queue it touches, pushed at its first op
            # (nothing else is issued between a batch's ops).
            first = self.base[op.rank] + op.batch
            if g == first:
                for q in self.batch_queues[first]:
                    q.fifo.append(first)
                    q.pushed += 1
            deps = self.batch_ops[first]
            if g != deps[-1]:
                return  # a synchronous batch waits once, after its last op
        if op.handle is not None:
            return
        if any(self.ops[x].transport is _GLOO for x in deps):
            # A synchronous gloo call blocks the calling thread until the transfer is done.
            h.block_g = g
            h.block_deps = deps
        else:
            self._push(stream, g * 4 + _SYNC)

    # ---- streams -----------------------------------------------------------------------

    def _push(self, s: _Stream, entry: int) -> None:
        s.fifo.append(entry)
        s.pushed += 1
        if not s.busy and len(s.fifo) == 1:
            self._kick(s)

    def _advance_stream(self, s: _Stream) -> None:
        if s.busy:
            return
        fifo = s.fifo
        now = self.env.now
        ready, cause, end = self.ready, self.cause, self.end
        while fifo:
            entry = fifo[0]
            g, tag = entry >> 2, entry & 3
            # Latest of: host issue (cause[g] holds the host's cause), the stream's previous
            # entry, the entry's dependencies. Ties go to dependencies, then the stream.
            t, c = ready[g], cause[g]
            if s.last_g >= 0 and s.last_end >= t:
                t, c = s.last_end, s.last_g
            duration = 0.0
            woke = False
            if tag != _MARK:
                op = self.ops[g]
                if tag == _SYNC and op.batch is None:  # fast path: one synchronous comm op
                    if self.state[g] != DONE:
                        self._wait_on(g, s)
                        return
                    if end[g] >= t:
                        c = g
                        t, woke = self._woken(entry, end[g])
                elif tag == _SYNC or op.kind is _WAIT or op.kind is _WAIT_EVENT:
                    deps = self._deps(g, tag)
                    pending = self._first_pending(deps)
                    if pending >= 0:
                        self._wait_on(pending, s)
                        return
                    d = self._latest(deps)
                    if end[d] >= t:
                        c = d
                        t, woke = self._woken(entry, end[d])
                else:
                    duration = self._duration(op)
                    if s.woke and c == s.last_g and (op.kind is _COMPUTE or op.kind is _COPY):
                        t += self._wake(entry)  # it starts right as its stream's wait ended
                    if self.rng is not None and op.kind is _COMPUTE and duration > 0.0:
                        duration += self._stall(g, duration)
                    s.woke = False
                    if self.timed_compute and duration > 0.0 and (op.kind is _COMPUTE or (op.kind is _COPY and self.timed_copies)):
                        self._start_compute(s, entry, t, c, duration)
                        return
            s.woke = woke
            start = t if t > now else now
            if tag == _EXEC:
                self.start[g] = start
                cause[g] = c
            elif tag == _MARK:
                self.start[g] = start  # when the comm op may join its queue
                cause[g] = c
            if start > now or duration > 0.0:
                s.busy = True
                s.cur = entry
                s.cur_cause = c
                ev = self.env.timeout(start + duration - now, s)
                ev.callbacks.append(self._on_stream_timer)
                return
            self._complete_entry(s, entry, start, c)

    def _on_stream_timer(self, ev) -> None:
        s: _Stream = ev.value
        s.busy = False
        self._complete_entry(s, s.cur, self.env.now, s.cur_cause)
        self._kick(s)
        self._drain()

    # ---- interference: compute slowed by comm kernels, comm slowed by compute --------------

    def _start_compute(self, s: _Stream, entry: int, t: float, c: int, duration: float) -> None:
        """Run a compute op whose speed depends on the NCCL kernels and copies of its
        device, or a copy op that slows the compute of its device."""
        now = self.env.now
        s.busy = True
        s.cur = entry
        s.cur_cause = c
        if t > now:  # wait until it really starts: the kernels running then decide its speed
            s.delay = True
            self.env.timeout(t - now, s).callbacks.append(self._on_delay)
            return
        g = entry >> 2
        self.start[g] = now
        self.cause[g] = c
        s.work_left = duration
        s.t_run = now
        if self.ops[g].kind is _COPY:
            s.factor = self._copy_factor(s.rank)
            s.slowed = False  # `nominal_us` reports slowed compute only
            self._copies_changed(s.rank, 1)
        else:
            s.factor = self._compute_factor(s.rank)
            s.slowed = s.factor != 1.0
            if self.count_compute:
                self._computing_changed(s.rank, 1)
        self._compute_timer(s)

    def _on_delay(self, ev) -> None:
        s: _Stream = ev.value
        s.busy = False
        s.delay = False
        self._kick(s)
        self._drain()

    def _compute_timer(self, s: _Stream) -> None:
        s.token += 1
        self.env.timeout(s.work_left * s.factor, (s, s.token)).callbacks.append(self._on_compute_timer)

    def _on_compute_timer(self, ev) -> None:
        s, token = ev.value
        if token != s.token:
            return  # rescheduled when the kernels on its device changed
        s.busy = False
        g = s.cur >> 2
        if s.slowed:
            self.nominal_us[g] = self._duration(self.ops[g])
        if self.ops[g].kind is _COPY:
            self._copies_changed(s.rank, -1)
        elif self.count_compute:
            self._computing_changed(s.rank, -1)
        self._complete_entry(s, s.cur, self.env.now, s.cur_cause)
        self._kick(s)
        self._drain()

    def _computing_changed(self, rank: int, delta: int) -> None:
        """Compute ops running on `rank` changed by `delta`: when the device starts or
        stops computing, tell the network (comm slowed by compute) and re-time its copies."""
        before = self.computing[rank]
        self.computing[rank] = before + delta
        if (before == 0) != (self.computing[rank] == 0):
            self.ranks_computing += 1 if before == 0 else -1
            if self.slow_comm:
                self.network.compute_changed(rank, before == 0)
            if self.copy_slowed != 1.0:
                self._refactor(rank)

    def _compute_factor(self, rank: int) -> float:
        """Current slowdown of compute on `rank`: NCCL kernels and copies running there."""
        factor = max(self.kernels[rank], default=1.0)
        if self.copying[rank]:
            factor *= self.copy_slowdown
        return factor

    def _copy_factor(self, rank: int) -> float:
        """Current slowdown of copies on `rank`: compute running there."""
        return self.copy_slowed if self.computing[rank] else 1.0

    def _kernels_changed(self, g: int, started: bool) -> None:
        """Comm op g's kernel started or ended: compute on its device runs at the largest
        factor of the kernels running there (looked up once per op kind and dtype)."""
        op = self.ops[g]
        key = (op.kind, op.dtype)
        factor = self.kernel_factor.get(key)
        if factor is None:
            factor = self.kernel_factor[key] = self.machine.interference(op.kind, op.dtype).comm_compute_slowdown
        kernels = self.kernels[op.rank]
        before = max(kernels, default=1.0)
        if started:
            kernels.append(factor)
        else:
            kernels.remove(factor)
        if max(kernels, default=1.0) != before:
            self._refactor(op.rank)

    def _copies_changed(self, rank: int, delta: int) -> None:
        before = self.copying[rank]
        self.copying[rank] = before + delta
        if (before == 0) != (self.copying[rank] == 0):
            self._refactor(rank)

    def _refactor(self, rank: int) -> None:
        """Re-time the running compute ops (and timed copies) of `rank` at their new slowdown."""
        now = self.env.now
        compute_factor = self._compute_factor(rank)
        copy_factor = self._copy_factor(rank)
        for s in self.streams[rank].values():
            if not s.busy or s.delay or s.cur < 0 or s.cur & 3 != _EXEC:
                continue
            kind = self.ops[s.cur >> 2].kind
            if kind is _COMPUTE:
                factor = compute_factor
            elif kind is _COPY and self.timed_copies:
                factor = copy_factor
            else:
                continue
            if s.factor == factor or s.t_run > now:
                continue
            s.work_left = max(0.0, s.work_left - (now - s.t_run) / s.factor)
            s.t_run = now
            s.factor = factor
            s.slowed = s.slowed or (factor != 1.0 and kind is _COMPUTE)
            self._compute_timer(s)

    def _complete_entry(self, s: _Stream, entry: int, t: float, c: int) -> None:
        s.fifo.popleft()
        s.done += 1
        g, tag = entry >> 2, entry & 3
        if tag == _EXEC:
            self._finish(g, t)
            s.last_g, s.last_end = g, t
        elif tag == _MARK:
            self.state[g] = ELIGIBLE
            self._kick(self.queue_of[g])
        else:  # SYNC: the stream continues after the comm op(s)
            s.last_g, s.last_end = c, t
        if s.drain_waiters:
            self._wake_drained(s)

    def _wake_drained(self, e: _Stream | _Queue) -> None:
        keep = []
        for target, w in e.drain_waiters:
            if e.done >= target:
                self._kick(w)
            else:
                keep.append((target, w))
        e.drain_waiters = keep

    def _duration(self, op: Op) -> float:
        """Time of a compute or copy op from its work and the device's rates."""
        if op.kind is _COMPUTE:
            if op.duration_us is not None:
                return op.duration_us * self.duration_stretch  # an explicit duration wins
            dev = self.machine.device
            t = 0.0
            if op.flops:
                t = op.flops / (dev.tflops(op.dtype) * 1e6)
            if op.size_bytes:  # bytes moved: read size/2 and write size/2, a copy of size/2
                t = max(t, self.machine.device_copy_us(op.size_bytes / 2))
            return t
        if op.kind is _COPY:
            if op.copy_dir is CopyDir.D2D:
                return self.machine.device_copy_us(op.size_bytes)
            return self.machine.host_copy_us(op.size_bytes)
        return 0.0  # record, wait_event, wait: ordering only

    def _stall(self, g: int, duration_us: float) -> float:
        """Op g's random stall time: a Poisson number of stalls, `stalls_per_s` per second
        of its duration on average, each `stall_us` long (`Machine.compute_noise`). Drawn
        once: an op whose start is delayed comes back here. On a slowed device the stall
        is slowed with the op's work (a simplification)."""
        stall = self.stall_us.get(g)
        if stall is None:
            noise = self.machine.compute_noise
            stall = _poisson(self.rng, noise.stalls_per_s * duration_us / 1e6) * noise.stall_us
            self.stall_us[g] = stall
        return stall

    def _woken(self, entry: int, t: float) -> tuple[float, bool]:
        """Stream entry `entry` goes on at t, when another thread's work ended (a comm op,
        an event): (when it goes on, whether the late wake-up is left to the op after it).
        A thread wakes late only when the cores are busy: drawn here if compute runs on
        some rank; else left to a compute or copy op that starts right then (`_Stream.woke`),
        as calibration measures it (a compute op starting late after the comm op it waited
        for). Blocking collectives back to back with nothing computing follow each other
        within 0.2 ms on the CI VM; drawing their wake-ups predicted collectives 5-11% long."""
        if self.rng is None:
            return t, False
        if self.ranks_computing:
            return t + self._wake(entry), False
        return t, True

    def _wake(self, entry: int) -> float:
        """A late wake-up (`_woken`): `wake_stall_us` with probability
        `wake_stall_probability`, drawn once per entry."""
        wake = self.wake_us.get(entry)
        if wake is None:
            noise = self.machine.compute_noise
            wake = noise.wake_stall_us if self.rng.random() < noise.wake_stall_probability else 0.0
            self.wake_us[entry] = wake
        return wake

    # ---- comm queues, matching, transfers -----------------------------------------------

    def _advance_queue(self, q: _Queue) -> None:
        if q.active or not q.fifo:
            return
        item = q.fifo[0]
        state = self.state
        if self.ops[item].batch is None:  # the common case: one op
            if state[item] != ELIGIBLE:
                return
            q.active = True
            q.remaining = 1
            if q.last_g >= 0 and q.last_end > self.start[item]:
                self.cause[item] = q.last_g  # queue-bound: the previous item ended after the op was ready
            state[item] = ACTIVE
            now = self.env.now
            self.start[item] = now
            if self.interfere and self.ops[item].transport is _NCCL:
                self._kernels_changed(item, True)
            self._activated(item, now)
            return
        queues = self.batch_queues[item]
        if len(queues) > 1 and any(x.active or not x.fifo or x.fifo[0] != item for x in queues):
            return  # a batch over several groups waits for the head of each queue
        members = self.batch_ops[item]
        for g in members:
            if state[g] != ELIGIBLE:
                return
        now = self.env.now
        for x in queues:
            x.active = True
            x.remaining = 0
        for g in members:
            self.queue_of[g].remaining += 1
        for g in members:
            # Queue-bound if the previous item on the queue ended after the op was ready.
            x = self.queue_of[g]
            if x.last_g >= 0 and x.last_end > self.start[g]:
                self.cause[g] = x.last_g
            state[g] = ACTIVE
            self.start[g] = now
            if self.interfere and self.ops[g].transport is _NCCL:
                self._kernels_changed(g, True)
        for g in members:
            self._activated(g, now)

    def _activated(self, g: int, now: float) -> None:
        op = self.ops[g]
        if op.kind in _COLLECTIVE_KINDS:
            inst = self.coll_of[g]
            inst.arrived.append(g)
            if len(inst.arrived) == inst.size:
                for m in inst.arrived:
                    if m != g and self.start[m] < now:
                        self.cause[m] = g  # it waited for the last member
                self._start_collective(inst)
            return
        p = self.partner[g]
        if p >= 0 and self.state[p] == ACTIVE:
            if self.start[p] < now:
                self.cause[p] = g
            send, recv = (g, p) if op.kind is _SEND else (p, g)
            so = self.ops[send]
            algo = resolve_algo(so)
            transfer = Transfer(_SEND, (so.rank, so.peer), so.size_bytes, so.transport,
                                plan(_SEND, algo, 2, so.size_bytes, self.machine.chunk_bytes), None, (send, recv))  # fmt: skip
            self.network.start(transfer, lambda: self._transfer_done((send, recv)))

    def _start_collective(self, inst: _Collective) -> None:
        first = min(inst.ops)
        rep = self.ops[first]  # the lowest rank's op describes the collective
        ranks = self.group_ranks[inst.group]
        p = plan(rep.kind, ALGOS[self.algos[first]], len(ranks), rep.size_bytes, self.machine.chunk_bytes)
        members = tuple(inst.arrived)
        transfer = Transfer(rep.kind, ranks, rep.size_bytes, rep.transport, p, rep.root, members, rep.dtype, rep.reduce_op)
        self.network.start(transfer, lambda: self._transfer_done(members))

    def _transfer_done(self, members: tuple[int, ...]) -> None:
        now = self.env.now
        interfere = self.interfere
        for g in members:
            self._finish(g, now)
            if interfere and self.ops[g].transport is _NCCL:
                self._kernels_changed(g, False)
            q = self.queue_of[g]
            q.remaining -= 1
            if q.remaining == 0:
                q.active = False
                q.fifo.popleft()
                q.done += 1
                q.last_g, q.last_end = g, now
                if q.drain_waiters:
                    self._wake_drained(q)
                self._kick(q)
        self._drain()


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw: by inversion for small means (the usual case: a compute op sees
    well under one stall), by the normal approximation beyond 30."""
    if mean > 30.0:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    k, p, limit = 0, rng.random(), math.exp(-mean)
    while p > limit:
        k += 1
        p *= rng.random()
    return k
