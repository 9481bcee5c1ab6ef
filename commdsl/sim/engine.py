"""The simulation engine: the execution semantics on a SimPy clock.

Per rank there is a host, one FIFO per stream and one comm queue per group
(`commdsl.sim.entities`). They are small state machines, each with an idempotent
`advance`: do everything that can be done at the current simulated time, then either
finish or wait. Whatever may unblock an entity "kicks" it (puts it on a to-do list that
every SimPy callback drains), so the call depth stays flat and the only SimPy events are:

  * one timeout per op that takes time on a stream (compute, copy), or that starts
    later than now because the host issues it later;
  * one timeout per transfer (a whole collective, or a send/recv pair), from the network.

The semantics, in the order an op meets them:

  1. The host walks its rank's program in order; issuing an op costs host time (launch
     overhead). Device ops go to their stream; a comm op puts a mark on its stream and
     joins its group's comm queue once the stream reaches the mark.
  2. A stream runs its entries one after another; `record`/`wait_event` and waits on
     handles order streams without blocking the host.
  3. The host blocks in `synchronize`, a wait on the host, and a blocking gloo call.
  4. A comm queue runs its items (an op, or a P2P batch as one unit) in issue order:
     NCCL's one order per communicator. NCCL also runs a communicator's transfers from
     one rank to another one at a time, in order, even those of one batch.
  5. A collective moves data once every member is active; a send and its recv once both
     are. The network times the transfer.
  6. memcpy transfers (a one-sided peer copy, a send/recv with transport=memcpy) have no
     communicator: they run on their stream like a copy, ordered only by it, events and
     waits; a send/recv pair moves once both ends are at the head of their streams. They
     hold the GPUs' copy engines while they move (`commdsl.sim.copy_engines`).

How fast work runs while other work shares its device (NCCL kernels holding SMs, a CPU
host's threads sharing cores) and a CPU host's random noise are the contention model's
(`commdsl.sim.contention`): the engine asks it for factors and re-times running work
when they change. With the exact model none of that bookkeeping runs.

The host runs ahead of `env.now` on its own clock as long as it does not block: issuing
only stamps each op with the time it reaches its stream (`ready`). Everything another
entity can observe happens through events at its true time, so the network sees
transfers in time order.

Per op the engine keeps flat arrays indexed by a global op number `g` (ranks laid out
one after another): issue start/end, start, end, state, and `cause`, the op whose
completion let it start last (what the critical path walks back along). Its hot paths
read a byte of kind code per op (`Wiring.kinds`) rather than the op. A transfer is one
`Transfer` per distinct shape (kind, ranks, size, transport, plan), built on first use
and started with each occurrence's ops, so matching a send with its recv allocates no
plan, no transfer and no callback.

Where every rank runs the same ops and nothing tells ranks apart (`commdsl.sim.symmetry`),
the engine runs rank 0 alone (`folded`) and copies its outcome to the others.

This module is the engine's source, and also what the install compiles with Cython where
it can (`engine.pxd` types it; `commdsl.native` says which runs): what the compiled
engine cannot do, such as a closure in a method it makes a C call, stays out of its hot
methods. The engine and the networks read SimPy's clock as `env._now`, the attribute
behind its `now` property: a property read runs a Python frame, several per op.
"""

from __future__ import annotations

import random
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import simpy

from commdsl.ir import HOST_STREAM, MEMORY_KINDS, Algo, CopyDir, HostMemory, Op, OpKind, Program, Transport
from commdsl.machine.model import Machine
from commdsl.sim.collectives import plan
from commdsl.sim.chains import ChainRuns
from commdsl.sim.contention import compute_us, contention_model
from commdsl.sim.copy_engines import CopyEngines
from commdsl.sim.entities import (ACTIVE, ALGOS, DONE, KIND_CODE, PROTOS, ELIGIBLE, EXEC, MARK, QUEUE, STREAM, SYNC,
                                  Collective, Entity, Host, Queue, RawResult, Stream, entry_typecode, kind_table, op_index_typecode)
from commdsl.sim.network import Network, Transfer, timeout
from commdsl.sim.shape_memo import shape_table
from commdsl.sim.symmetry import interchangeable, replicate
from commdsl.sim.wiring import Wiring, wire

_DEVICE_KINDS = frozenset({OpKind.COMPUTE, OpKind.COPY, OpKind.RECORD, OpKind.WAIT_EVENT})
_COMM_KINDS = frozenset(k for k in OpKind if k.is_comm)
_COLLECTIVE_KINDS = frozenset(k for k in OpKind if k.is_collective)
# Enum members are looked up through descriptors (slow in hot loops): bind them once.
_COMPUTE, _COPY, _SEND, _RECV, _WAIT, _WAIT_EVENT, _HOST_OP, _SYNCHRONIZE = (
    OpKind.COMPUTE, OpKind.COPY, OpKind.SEND, OpKind.RECV, OpKind.WAIT, OpKind.WAIT_EVENT, OpKind.HOST, OpKind.SYNCHRONIZE,
)  # fmt: skip
# The same as kind codes (`Wiring.kinds`), and per code whether it is in a set.
_K_COMPUTE, _K_COPY, _K_SEND, _K_WAIT, _K_WAIT_EVENT = (KIND_CODE[k] for k in (_COMPUTE, _COPY, _SEND, _WAIT, _WAIT_EVENT))
_IS_DEVICE, _IS_MEMORY, _IS_COMM = kind_table(_DEVICE_KINDS), kind_table(MEMORY_KINDS), kind_table(_COMM_KINDS)
_GLOO = Transport.GLOO
_PAGEABLE = HostMemory.PAGEABLE
_NCCL = Transport.NCCL
_MEMCPY = Transport.MEMCPY
_IDLE = object()
"""`Engine.pair_fifo` has no entry: no NCCL transfer moves between those ranks."""
PROGRESS_EVENTS = 20_000
"""`Engine.run` with a progress callback reports after every this many SimPy events."""


class Columns(NamedTuple):
    """The per-op arrays the engine writes, indexed by g: what `RawResult` holds."""

    issue_start: array
    issue_end: array
    cause: array
    start: array
    end: array
    state: bytearray


@dataclass(frozen=True)
class Issued:
    """What the hosts' first pass left where every host issued its whole program without
    blocking (`Engine._issue`): it depends on the program and the machine's launch costs
    alone, so another run of the program (a sampled simulation's next sample) starts from
    it rather than issuing again."""

    columns: Columns
    """Copies of the per-op arrays the pass writes (a host op runs in it: start, end, state)."""
    hosts: tuple[tuple[int, float, int], ...]
    """Per host that ran, its (pc, clock, cause) after the pass."""
    stream_fifos: tuple[tuple[int, str, array], ...]
    """(rank, stream, its entries) of every stream given entries."""
    queue_fifos: tuple[tuple[int, array], ...]
    """(`Queue.number`, its items) of every comm queue given items."""
    kicked: tuple[tuple[int, str], ...]
    """(rank, stream) of the streams the pass woke, in the order they run next."""


class Engine:
    """Simulate one `Program` on one `Machine` through a `Network`."""

    def __init__(self, program: Program, machine: Machine, network_cls: type[Network], rng: random.Random | None = None,
                 wiring: Wiring | None = None, fold: bool = True, issued: Issued | None = None, keep_issued: bool = False):  # fmt: skip
        """`wiring`: the program's `Wiring` from an earlier engine on the same program,
        machine and network model (a sampled simulation makes it once); None: wire now.
        `fold`: run rank 0 alone for all where ranks are interchangeable (`folded`).
        `issued`: the hosts' first pass from an earlier engine on the same program and
        machine, with the same `fold` (`Issued`); None: issue now, and with `keep_issued`
        keep what that pass left in `issued` for the next engine."""
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
        self.columns = Columns(array("d", zeros), array("d", zeros), array(op_index_typecode(n), [-1]) * n, array("d", zeros),
                               array("d", zeros), bytearray(n))  # fmt: skip
        # The same memory under the names the hot paths read: where the engine is compiled
        # (`commdsl.native`), typed views of the arrays.
        self.issue_start, self.issue_end, self.cause, self.start, self.end, self.state = self.columns
        self.ready = self.issue_end  # when the op reaches its stream (host launch done)
        self.waiters: dict[int, list[Entity]] = {}
        self._todo: list[Entity] = []
        """The entities kicked, in the order they were: `_drain` runs them from the front
        and empties it (a list read by position rather than a deque: where the engine is
        compiled, appending to it is a C call)."""
        self.hosts = [Host(r, self.base[r], self.base[r] + len(program.ops[r])) for r in range(program.world_size)]
        typecode = entry_typecode(n)
        self.streams: list[dict[str, Stream]] = [{s: Stream(r, s, typecode) for s in program.streams} for r in range(program.world_size)]
        self.group_ranks = {g.id: g.ranks for g in program.groups}
        self.contention = c = contention_model(machine, self.network, program.world_size, n, rng, self.group_ranks)
        self.folded = fold and c.rank_local and interchangeable(program) and not ChainRuns.in_ops(program.ops[0], machine)
        """Every rank runs what rank 0 runs (`commdsl.sim.symmetry`): the engine runs rank 0
        alone, each collective moves with all its members once rank 0's op arrives, and
        rank 0's outcome is copied to the others at the end."""
        if wiring is None:
            w = wire(program, ops, self.base, machine, self.network, self.folded)
        else:
            w = wiring
            for rank_queues in w.queues:
                for q in rank_queues.values():
                    q.reset()
            for inst in w.collectives:
                inst.reset()
        self.wiring = w
        self.queues, self.queue_list, self.queue_at, self.partner, self.coll_at = w.queues, w.queue_list, w.queue_at, w.partner, w.coll_at
        self.collectives, self.batch_last, self.batch_multi, self.algos = w.collectives, w.batch_last, w.batch_multi, w.algos
        self.batch_gloo = w.batch_gloo
        self.protos = w.protos
        self.on_stream = w.on_stream
        """Per op, 1 for a memcpy transfer: it runs on its stream (no comm queue)."""
        self.kind = w.kinds
        """Per op, its kind code (`KIND_CODE`)."""
        topo = machine.topology
        self.copy_engines = CopyEngines(topo.copy_engines, program.world_size) if topo is not None and topo.copy_engines else None
        """The GPUs' copy engines (None: not limited)."""
        self.pair_fifo: dict[tuple[str, int, int], deque[tuple[Transfer, tuple[int, ...]]] | None] = {}
        """(group, source, destination) of an NCCL transfer moving now -> the transfers
        between the same ranks in the same group waiting behind it, in order (with their
        ops); None while none waits (most transfers: no deque made for them)."""
        self._transfers: dict[tuple, Transfer] = w.transfers
        """One `Transfer` per distinct shape (what it moves, between whom, how), by the
        op fields it is built from: built once, started with each occurrence's ops."""
        self._p2p_shapes: dict[tuple, tuple[Transfer, tuple[str, int, int] | None, tuple[int, ...] | None]] = w.p2p_shapes
        """The same for point-to-point transfers, by (id of the op's spec, kind, rank), with
        what `_start_p2p` needs to start it (`_p2p_shape`)."""
        self._pair_of: dict[int, tuple[str, int, int]] = w.pair_of
        """id of an NCCL send's `Transfer` -> its (group, source, destination) in `pair_fifo`."""
        self._machine_transfers: dict[tuple, Transfer] = shape_table(machine, ("transfers",))
        """Every `Transfer` made on this machine, by its values and its group's name (so
        that the transfers of two groups stay apart in `_pair_of`): the first tables'
        misses (`commdsl.sim.shape_memo`). The network and the contention model then
        find what they worked out for it in earlier simulations."""
        self._on_transfer_done = self._transfer_done
        self.kernels = c.tracks_kernels
        """NCCL ops becoming active and finishing are reported to the contention model."""
        if self.kernels:  # the ops' kernel factors, looked up once per program (`Wiring.kernel_factors`)
            if w.kernel_factors is None:
                w.kernel_factors = array("d", bytes(8 * n))
            c.factor_at = w.kernel_factors
        self.traffic = c.tracks_traffic and c.traffic_matters(w.memory_bound)
        """Transfers starting and ending are reported to the contention model (where
        anything in this program depends on them)."""
        self.timed = c.timed
        """Compute ops (and, with `contention.timed_copies`, copies) start at their true
        time and end through `_on_timer`, re-timed when their factor changes."""
        self.noisy = c.noisy
        self.stretch = c.duration_stretch
        """Explicit compute durations run this many times long (`ComputeNoise.duration_stretch`)."""
        self.nominal_us: dict[int, float] = {}
        """Compute ops (g) that ran slowed, with their time at full speed."""
        self._work_us: dict[tuple[int, int], float] = {}
        """`_duration` by (id of the op's spec, its kind): the fields it reads are
        those (the ops one statement makes share a spec, held by the program as long as
        the engine runs it)."""
        self._machine_work_us: dict[tuple, float] = shape_table(machine, ("work_us",))
        """`_duration` by the op fields it reads, for every program on this machine
        (`commdsl.sim.shape_memo`): `_work_us`'s misses."""
        self.issued = issued
        """The hosts' first pass this run started from, or kept (`keep_issued`); None where
        it was not kept, or a host blocked in it."""
        self._keep_issued = keep_issued
        if self.folded:
            for inst in self.collectives:
                inst.needed = 1
            self._on_transfer_done = self._transfer_done_folded
        self._chains = ChainRuns(self) if ChainRuns.enabled(self) else None
        """Broadcasts and reduces whose members go one after another (`commdsl.sim.chains`);
        None where the run has none (or cannot use them)."""

    # ---- running --------------------------------------------------------------------

    def run(self, progress: Callable[[int], None] | None = None) -> RawResult:
        """Simulate to the end. `progress`, if given, hears the number of ops done every
        PROGRESS_EVENTS events and at the end; without it the simulation runs at full
        speed, as `env.run()`."""
        self._issue(self.hosts[:1] if self.folded else self.hosts)
        self._drain()
        c = self.columns
        if progress is None:
            self.env.run()
        else:
            step = self.env.step
            ranks = self.program.world_size if self.folded else 1  # ops done, as if every rank ran
            try:
                while True:
                    for _ in range(PROGRESS_EVENTS):
                        step()
                    progress(ranks * c.state.count(DONE))
            except simpy.core.EmptySchedule:
                progress(ranks * c.state.count(DONE))
        if self.folded and c.state.count(DONE, 0, m := len(self.program.ops[0])) == m:  # else `simulate` runs every rank
            replicate(self.program.world_size, m, [c.issue_start, c.issue_end, c.start, c.end], c.state, c.cause, self.nominal_us)
        w = self.wiring
        return RawResult(self.ops, self.base, c.issue_start, c.issue_end, c.start, c.end, c.state, c.cause, w.partner, self.algos,
                         self.protos, w.kinds)  # fmt: skip

    def _issue(self, hosts: list[Host]) -> None:
        """The hosts' first pass, in rank order, before any stream runs (as a drain of the
        kicked hosts would run it): each issues until it blocks or its program ends. It
        reads no clock but its own and draws nothing, so where no host blocked, what it
        left is the same in every run of the program: `issued` restores it instead."""
        todo, streams = self._todo, self.streams
        if (issued := self.issued) is not None:
            for column, saved in zip(self.columns, issued.columns):
                column[:] = saved
            for h, (pc, t, cause) in zip(hosts, issued.hosts):
                h.pc, h.t, h.cause = pc, t, cause
            for rank, name, fifo in issued.stream_fifos:
                streams[rank][name].fifo[:] = fifo
            for number, fifo in issued.queue_fifos:
                self.queue_list[number].fifo[:] = fifo
            for rank, name in issued.kicked:
                s = streams[rank][name]
                s.kicked = True
                todo.append(s)
            return
        for h in hosts:
            self._advance_host(h)
        if not self._keep_issued or any(h.pc != h.end or h.block_g >= 0 for h in hosts) or any(e.kind != STREAM for e in todo):
            return
        self.issued = Issued(
            columns=Columns(*(array(c.typecode, c) if isinstance(c, array) else bytes(c) for c in self.columns)),
            hosts=tuple((h.pc, h.t, h.cause) for h in hosts),
            stream_fifos=tuple((s.rank, s.name, array(s.fifo.typecode, s.fifo)) for rank in streams for s in rank.values() if s.fifo),
            queue_fifos=tuple((q.number, array(q.fifo.typecode, q.fifo)) for q in self.queue_list if q.fifo),
            kicked=tuple((s.rank, s.name) for s in todo),
        )  # fmt: skip

    def unfinished(self) -> bool:
        state = self.columns.state
        return state.count(DONE) != len(state)

    def _kick(self, e: Entity) -> None:
        if not e.kicked:
            e.kicked = True
            self._todo.append(e)

    def _drain(self) -> None:
        todo = self._todo
        i = 0
        while i < len(todo):  # what runs kicks more: it goes on the end, and runs in turn
            e = todo[i]
            i += 1
            entity = e  # where compiled, typed: its fields are C reads and stores
            entity.kicked = False
            kind = entity.kind
            if kind == STREAM:
                self._advance_stream(e)
            elif kind == QUEUE:
                self._advance_queue(e)
            else:
                self._advance_host(e)
        todo.clear()  # (a drain inside an advance would only run idempotent advances again)

    def _wait_on(self, g: int, e: Entity) -> None:
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
            todo = self._todo
            for e in w:
                if not e.kicked:
                    e.kicked = True
                    todo.append(e)

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
        if tag == SYNC:
            if op.batch is not None:
                return self.batch_ops(self.base[op.rank] + op.batch)
            return (g,)
        b = self.base[op.rank]
        return tuple([b + i for i in op.waits_for])

    def batch_ops(self, first: int) -> range:
        """The ops of the P2P batch whose first op is `first`, in issue order."""
        return range(first, self.batch_last[first] + 1)

    def batch_queues(self, first: int) -> tuple[Queue, ...]:
        """The comm queues the P2P batch whose first op is `first` occupies (usually one)."""
        return self.batch_multi.get(first) or (self.queue_list[self.queue_at[first]],)

    # ---- host -------------------------------------------------------------------------

    def _advance_host(self, h: Host) -> None:
        ops, kinds, on_stream = self.ops, self.kind, self.on_stream
        issue_start, issue_end, cause = self.issue_start, self.issue_end, self.cause
        launch_us, comm_launch_us = self.machine.kernel_launch_us, self.machine.comm_launch_us
        streams = self.streams[h.rank]
        queue_list, queue_at, todo = self.queue_list, self.queue_at, self._todo
        if h.block_g >= 0 and not self._host_unblocked(h):
            return
        # The host's pc and clock live in locals while it issues ops that do not block
        # (most ops); they go back to `h` before anything else reads them.
        g, end, t = h.pc, h.end, h.t
        while g < end:
            op = ops[g]
            k = kinds[g]
            if (memory := _IS_MEMORY[k]) or _IS_DEVICE[k] or on_stream[g] or (
                    k == _K_WAIT and op.stream != HOST_STREAM and not self._gloo_wait(op)):  # fmt: skip
                issue_start[g] = t
                if not memory:  # bookkeeping (alloc, free) goes in stream order with no launch, no time
                    t += launch_us
                issue_end[g] = t
                cause[g] = h.cause
                s = streams[op.spec.stream]  # onto its stream, which wakes if it was idle: most ops take this path
                fifo = s.fifo
                fifo.append(g * 4 + EXEC)
                if not s.busy and len(fifo) - s.done == 1 and not s.kicked:
                    s.kicked = True
                    todo.append(s)
                g += 1
                if k == _K_COPY and op.spec.host_memory is _PAGEABLE:
                    # cudaMemcpyAsync with pageable host memory returns once the copy is
                    # done: the host is blocked in it, from its issue to the copy's end.
                    h.block_g = g - 1
                    h.block_deps = (g - 1,)
                    h.pc, h.t = g, t
                    if not self._host_unblocked(h):
                        return
                    t = h.t
                continue
            if _IS_COMM[k]:
                # A comm op puts a MARK on its stream and an item in its comm queue: the op,
                # or for a P2P batch the batch, at its first op, in each queue it touches
                # (nothing else is issued between a batch's ops). A synchronous one then
                # holds the stream (SYNC), once, after a batch's last op; with gloo it
                # blocks the calling thread instead until the transfer is done.
                spec = op.spec
                issue_start[g] = t
                t += comm_launch_us
                issue_end[g] = t
                cause[g] = h.cause
                s = streams[spec.stream]
                fifo = s.fifo
                fifo.append(g * 4 + MARK)
                if not s.busy and len(fifo) - s.done == 1 and not s.kicked:
                    s.kicked = True
                    todo.append(s)
                if (batch := op.batch) is None:
                    queue_list[queue_at[g]].fifo.append(g)
                    first = g
                    sync = op.handle is None
                    blocking = sync and spec.transport is _GLOO
                else:
                    first = g - op.index + batch
                    if g == first:
                        for q in self.batch_queues(first):
                            q.fifo.append(first)
                    sync = g == self.batch_last[first] and op.handle is None
                    blocking = sync and first in self.batch_gloo
                g += 1
                if not blocking:
                    if sync:
                        fifo.append((g - 1) * 4 + SYNC)  # the stream holds the MARK: no need to wake it
                else:
                    h.block_g = g - 1
                    h.block_deps = (first,) if batch is None else range(first, g)
                    h.pc, h.t = g, t
                    if not self._host_unblocked(h):
                        return
                    t = h.t
                continue
            h.pc, h.t = g, t
            kind = op.kind
            if kind is _HOST_OP:
                self.start[g] = h.t
                h.t += op.duration_us
                self.cause[g] = h.cause
                h.cause = g
                self._finish(g, h.t)
            elif kind is _WAIT:  # on the host, or on a gloo handle (gloo's wait blocks the CPU)
                self.start[g] = h.t
                h.block_g = g
                h.block_deps = self._deps(g, EXEC)
                h.pc += 1
                if not self._host_unblocked(h):
                    return
                g, t = h.pc, h.t
                continue
            elif kind is _SYNCHRONIZE:
                self.start[g] = h.t
                h.block_g = g
                h.block_deps = ()
                if op.stream == HOST_STREAM:  # device synchronize: every stream and comm queue
                    targets = list(self.streams[op.rank].values()) + list(self.queues[op.rank].values())
                else:
                    targets = [self.streams[op.rank][op.stream]]
                h.sync_targets = [(e, len(e.fifo)) for e in targets]
                h.pc += 1
                if not self._host_unblocked(h):
                    return
                g, t = h.pc, h.t
                continue
            else:
                raise AssertionError(f"unhandled op kind {kind}")
            h.pc += 1
            g, t = h.pc, h.t
        h.pc, h.t = g, t

    def _gloo_wait(self, op: Op) -> bool:
        b = self.base[op.rank]
        ops = self.ops
        for i in op.waits_for:
            if ops[b + i].transport is _GLOO:
                return True
        return False

    def _host_unblocked(self, h: Host) -> bool:
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
        t = max(t, self.env._now)
        op = self.ops[g]
        blocking_call = op.kind in _COMM_KINDS or op.kind is _COPY  # a blocking gloo call, a pageable copy
        if blocking_call:  # the host's issue span covers the wait
            self.issue_end[g] = t
        else:
            self.cause[g] = cause
            self._finish(g, t)
        h.t = t
        h.cause = cause if blocking_call else g
        h.block_g = -1
        h.block_deps = ()
        h.sync_targets = []
        return True

    # ---- streams -----------------------------------------------------------------------

    def _advance_stream(self, s: Stream) -> None:
        if s.busy:
            return
        fifo = s.fifo
        now = self.env._now
        ready, cause, end, kinds, state = self.ready, self.cause, self.end, self.kind, self.state
        ops, queue_list, queue_at, todo = self.ops, self.queue_list, self.queue_at, self._todo
        while s.done < len(fifo):
            entry = fifo[s.done]
            g, tag = entry >> 2, entry & 3
            # Latest of: host issue (cause[g] holds the host's cause), the stream's previous
            # entry, the entry's dependencies. Ties go to dependencies, then the stream.
            t, c = ready[g], cause[g]
            if s.last_g >= 0 and s.last_end >= t:
                t, c = s.last_end, s.last_g
            if tag == MARK and t <= now:  # the comm op joins its comm queue now (_complete_entry, inlined)
                s.woke = False
                self.start[g] = now
                cause[g] = c
                s.done += 1  # pops the head
                state[g] = ELIGIBLE
                q = queue_list[queue_at[g]]
                if not q.kicked:
                    q.kicked = True
                    todo.append(q)
                if s.drain_waiters:
                    self._wake_drained(s)
                continue
            duration = 0.0
            woke = False
            if tag != MARK:
                k = kinds[g]
                if tag == SYNC and (batch := ops[g].batch) is None:  # fast path: one synchronous comm op
                    if state[g] != DONE:
                        self._wait_on(g, s)
                        return
                    if end[g] >= t:
                        c = g
                        t = end[g]
                        if self.noisy:
                            t, woke = self.contention.woken(entry, t, now)
                            if t > now and self._went_on_late(s, c, t):
                                continue
                    if t <= now:  # the stream goes on now (_complete_entry, inlined)
                        s.woke = woke
                        s.done += 1  # pops the head
                        s.last_g, s.last_end = c, now
                        if s.drain_waiters:
                            self._wake_drained(s)
                        continue
                elif tag == SYNC or k == _K_WAIT or k == _K_WAIT_EVENT:  # a synchronous batch, or a wait
                    # _deps, inlined: a batch's SYNC is at its last op and waits for the ops from
                    # the first; a wait waits for the ops it names (indices in its rank's program).
                    op = ops[g]
                    b = g - op.index
                    d = -1  # the dependency that finished last (lowest g on ties), as _latest
                    for i in range(batch, op.index + 1) if tag == SYNC else op.waits_for:
                        x = b + i
                        if state[x] != DONE:
                            self._wait_on(x, s)
                            return
                        if d < 0 or end[x] > end[d]:
                            d = x
                    if end[d] >= t:
                        c = d
                        t = end[d]
                        if self.noisy:
                            t, woke = self.contention.woken(entry, t, now)
                            if tag == SYNC and t > now and self._went_on_late(s, c, t):
                                continue
                elif self.on_stream[g]:  # a memcpy transfer: the stream holds it until its last byte
                    s.woke = False
                    self._start_stream_transfer(s, entry, t, c)
                    return
                elif k == _K_COMPUTE or k == _K_COPY:
                    op = ops[g]
                    explicit = op.spec.duration_us  # (the spec's field: `op.duration_us` is a property's call)
                    duration = explicit * self.stretch if k == _K_COMPUTE and explicit is not None else self._duration(op)
                    if s.woke and c == s.last_g:
                        t += self.contention.wake_us(entry)  # it starts right as its stream's wait ended
                    if self.noisy and k == _K_COMPUTE and duration > 0.0:
                        duration = self.contention.noisy_compute(g, t if t > now else now, duration, now)
                    s.woke = False
                    if self.timed and duration > 0.0 and (k == _K_COMPUTE or self.contention.timed_copies):
                        self._start_timed(s, entry, t, c, duration)
                        return
                else:  # record, alloc, free: ordering only
                    s.woke = False
            s.woke = woke
            start = t if t > now else now
            if tag != SYNC:  # EXEC: when the op starts; MARK: when the comm op may join its queue
                self.start[g] = start
                cause[g] = c
            if start > now or duration > 0.0:
                s.busy = True
                s.cur = entry
                s.cur_cause = c
                timeout(self.env, start + duration - now, s, self._on_stream_timer)
                return
            self._complete_entry(s, entry, start, c)

    def _went_on_late(self, s: Stream, c: int, t: float) -> bool:
        """Stream `s`, its SYNC entry at the head woken late (`Contention.woken`), goes on at
        `t`, after now: done at once, with no timer, where its next entry is there to wait
        for `t` itself and no host waits for the stream to drain (nothing else sees the
        stream before `t`). False: it needs the timer."""
        if s.drain_waiters or s.done + 1 >= len(s.fifo):
            return False
        s.woke = False
        s.done += 1  # pops the head
        s.last_g, s.last_end = c, t
        return True

    def _on_stream_timer(self, ev) -> None:
        s: Stream = ev._value  # `value`'s attribute (see `env._now`): the timer has fired
        s.busy = False
        self._complete_entry(s, s.cur, self.env._now, s.cur_cause)
        if not s.kicked:
            s.kicked = True
            self._todo.append(s)
        self._drain()

    def _hold(self, s: Stream, entry: int, t: float, c: int) -> bool:
        """Stream `s` holds `entry` (an op whose end is not known yet) from its start `t`:
        True once it starts now; False if it starts later (the stream wakes up then and
        calls again)."""
        now = self.env._now
        s.busy = True
        s.cur = entry
        s.cur_cause = c
        if t > now:  # wait until it really starts: what runs then decides its speed
            s.delay = True
            timeout(self.env, t - now, s, self._on_delay)
            return False
        g = entry >> 2
        self.start[g] = now
        self.cause[g] = c
        return True

    def _start_stream_transfer(self, s: Stream, entry: int, t: float, c: int) -> None:
        """A memcpy transfer at the head of its stream: active from its start (a send or
        recv then waits for its partner), done when its transfer is (`_transfer_done`)."""
        if self._hold(s, entry, t, c):
            g = entry >> 2
            self.state[g] = ACTIVE
            self._activated(g, self.env._now)

    # ---- work whose speed changes while it runs (the contention model's factors) -----

    def _start_timed(self, s: Stream, entry: int, t: float, c: int, duration: float) -> None:
        """Run a compute op or a copy whose speed follows the other work on its device."""
        if not self._hold(s, entry, t, c):
            return
        now = self.env._now
        g = entry >> 2
        s.work_left = duration
        s.t_run = now
        op = self.ops[g]
        is_copy = op.kind is _COPY
        contention = self.contention
        s.factor = contention.factor(s.rank, op)
        s.slowed = not is_copy and s.factor != 1.0  # `nominal_us` reports slowed compute only
        if contention.work(s.rank, is_copy, 1):
            self._retime(s.rank)
        self._timer(s)

    def _on_delay(self, ev) -> None:
        s: Stream = ev._value  # `value`'s attribute (see `env._now`): the timer has fired
        s.busy = False
        s.delay = False
        self._kick(s)
        self._drain()

    def _timer(self, s: Stream) -> None:
        s.token += 1
        timeout(self.env, s.work_left * s.factor, (s, s.token), self._on_timer)

    def _on_timer(self, ev) -> None:
        s, token = ev._value
        if token != s.token:
            return  # rescheduled when the work on its device changed
        s.busy = False
        g = s.cur >> 2
        if s.slowed:
            self.nominal_us[g] = self._duration(self.ops[g])
        if self.contention.work(s.rank, self.ops[g].kind is _COPY, -1):
            self._retime(s.rank)
        self._complete_entry(s, s.cur, self.env._now, s.cur_cause)
        self._kick(s)
        self._drain()

    def _kernel_changed(self, g: int, started: bool) -> None:
        if self.contention.kernel(g, self.ops[g], started):
            self._retime(self.ops[g].rank)

    def _retime(self, rank: int) -> None:
        """Re-time the running compute ops (and timed copies) of `rank` at their new factor."""
        now = self.env._now
        contention = self.contention
        timed_copies = contention.timed_copies
        for s in self.streams[rank].values():
            if not s.busy or s.delay or s.cur < 0 or s.cur & 3 != EXEC or self.on_stream[s.cur >> 2]:
                continue
            op = self.ops[s.cur >> 2]
            kind = op.kind
            if kind is not _COMPUTE and not (kind is _COPY and timed_copies):
                continue
            factor = contention.factor(rank, op)
            if s.factor == factor or s.t_run > now:
                continue
            s.work_left = max(0.0, s.work_left - (now - s.t_run) / s.factor)
            s.t_run = now
            s.factor = factor
            s.slowed = s.slowed or (factor != 1.0 and kind is _COMPUTE)
            self._timer(s)

    def _complete_entry(self, s: Stream, entry: int, t: float, c: int) -> None:
        s.done += 1  # pops the head
        g, tag = entry >> 2, entry & 3
        if tag == EXEC:
            self.end[g] = t  # _finish, inlined (once per op)
            self.state[g] = DONE
            w = self.waiters.pop(g, None)
            if w:
                for e in w:
                    if not e.kicked:
                        e.kicked = True
                        self._todo.append(e)
            if not _IS_MEMORY[self.kind[g]]:  # bookkeeping is nobody's cause on the critical path
                s.last_g, s.last_end = g, t
        elif tag == MARK:
            self.state[g] = ELIGIBLE
            q = self.queue_list[self.queue_at[g]]
            if not q.kicked:
                q.kicked = True
                self._todo.append(q)
        else:  # SYNC: the stream continues after the comm op(s)
            s.last_g, s.last_end = c, t
        if s.drain_waiters:
            self._wake_drained(s)

    def _wake_drained(self, e: Stream | Queue) -> None:
        keep = []
        for target, w in e.drain_waiters:
            if e.done >= target:
                self._kick(w)
            else:
                keep.append((target, w))
        e.drain_waiters = keep

    def _duration(self, op: Op) -> float:
        """Time of a compute or copy op from its work and the device's rates (`_work_us`)."""
        key = (id(op.spec), op.kind)
        duration = self._work_us.get(key)
        if duration is None:
            # What it reads of the op, as values: the same work on this machine in another program.
            spec = op.spec  # (its fields, read without the op's properties)
            shape = (op.kind, spec.duration_us, spec.flops, spec.size_bytes, spec.dtype, spec.copy_dir, spec.host_memory, self.stretch)
            duration = self._machine_work_us.get(shape)
            if duration is None:
                duration = self._machine_work_us[shape] = self._op_work_us(op)
            self._work_us[key] = duration
        return duration

    def _op_work_us(self, op: Op) -> float:
        if op.kind is _COMPUTE:
            if op.duration_us is not None:
                return op.duration_us * self.stretch  # an explicit duration wins
            return max(compute_us(self.machine, op))  # the slower of its FLOPs and its bytes
        if op.kind is _COPY:
            if op.copy_dir is CopyDir.D2D:
                return self.machine.device_copy_us(op.size_bytes)
            return self.machine.host_copy_us(op.size_bytes, op.copy_dir is CopyDir.D2H, op.host_memory is _PAGEABLE)
        return 0.0  # record, wait_event, wait: ordering only

    # ---- comm queues, matching, transfers -----------------------------------------------

    def _advance_queue(self, q: Queue) -> None:
        if q.active or q.done == len(q.fifo):
            return
        item = q.fifo[q.done]
        state = self.state
        if self.ops[item].batch is None:  # the common case: one op
            if state[item] != ELIGIBLE:
                return
            q.active = True
            q.remaining = 1
            start = self.start
            if q.last_g >= 0 and q.last_end > start[item]:
                self.cause[item] = q.last_g  # queue-bound: the previous item ended after the op was ready
            state[item] = ACTIVE
            now = self.env._now
            start[item] = now
            if self.kernels and self.ops[item].spec.transport is _NCCL:
                self._kernel_changed(item, True)
            c = self.coll_at[item]
            if c < 0:
                self._activated(item, now)
                return
            inst = self.collectives[c]
            if self._chains is not None and self._chains.arrived(inst, item, now):
                return
            arrived = inst.arrived  # _activated, inlined for a collective
            arrived.append(item)
            if len(arrived) == inst.needed:
                self._all_arrived(inst, item, now)
            return
        multi = self.batch_multi.get(item)
        if multi is None:
            queues = (q,)
        else:
            queues = multi
            for x in queues:
                if x.active or x.head() != item:
                    return  # a batch over several groups waits for the head of each queue
        last = self.batch_last[item]
        for g in range(item, last + 1):
            if state[g] != ELIGIBLE:
                return
        now = self.env._now
        for x in queues:
            x.active = True
            x.remaining = 0
        start, cause, queue_list, queue_at = self.start, self.cause, self.queue_list, self.queue_at
        for g in range(item, last + 1):
            x = queue_list[queue_at[g]]
            x.remaining += 1
            # Queue-bound if the previous item on the queue ended after the op was ready.
            if x.last_g >= 0 and x.last_end > start[g]:
                cause[g] = x.last_g
            state[g] = ACTIVE
            start[g] = now
            if self.kernels and self.ops[g].spec.transport is _NCCL:
                self._kernel_changed(g, True)
        for g in range(item, last + 1):
            self._activated(g, now)

    def _activated(self, g: int, now: float) -> None:
        c = self.coll_at[g]
        if c >= 0:  # a collective
            inst = self.collectives[c]
            if self._chains is not None and self._chains.arrived(inst, g, now):
                return
            inst.arrived.append(g)
            if len(inst.arrived) == inst.needed:
                self._all_arrived(inst, g, now)
            return
        k = self.kind[g]
        if k == _K_COPY:  # a peer copy: one-sided, nothing to wait for
            self._start_p2p(g, -1)
            return
        p = self.partner[g]
        if p >= 0 and self.state[p] == ACTIVE:
            if self.start[p] < now:
                self.cause[p] = g
            send, recv = (g, p) if k == _K_SEND else (p, g)
            self._start_p2p(send, recv)

    def _all_arrived(self, inst: Collective, g: int, now: float) -> None:
        """Op g, the last member of collective `inst` to become active, arrived: it moves."""
        start, cause = self.start, self.cause
        for m in inst.arrived:
            if m != g and start[m] < now:
                cause[m] = g  # it waited for the last member
        self._start_collective(inst)

    def _start_p2p(self, send: int, recv: int) -> None:
        """Move the bytes of a send and its recv (or of a peer copy, `recv` -1): memcpy once
        it holds its copy engines; NCCL once the group's earlier transfers from the same
        rank to the same rank are done (NCCL runs them in order); others at once."""
        so = self.ops[send]
        if recv >= 0:  # (a statement, not a conditional expression: Cython types each tuple)
            members = (send, recv)
        else:  # a peer copy
            members = (send,)
        # The shape is the op's spec (peer, size, transport, group, forced algo and protocol,
        # from which `wire` chose its algo and protocol), its kind and its rank.
        key = (id(so.spec), self.kind[send], so.rank)
        shape = self._p2p_shapes.get(key)
        if shape is None:
            shape = self._p2p_shapes[key] = self._p2p_shape(so, send)
        transfer, pair, gpus = shape
        if gpus is not None:
            self.copy_engines.acquire(gpus, partial(self._start_transfer, transfer, members, gpus))
        elif pair is not None:
            waiting = self.pair_fifo.get(pair, _IDLE)
            if waiting is _IDLE:
                self.pair_fifo[pair] = None
                self._start_transfer(transfer, members)
            elif waiting is None:
                self.pair_fifo[pair] = deque(((transfer, members),))
            else:
                waiting.append((transfer, members))
        else:
            self._start_transfer(transfer, members)

    def _p2p_shape(self, so: Op, send: int) -> tuple[Transfer, tuple[str, int, int] | None, tuple[int, ...] | None]:
        """The transfer of send (or peer copy) `so`, op `send`; its (group, source,
        destination) when NCCL orders it among its pair's transfers (`pair_fifo`); and the
        GPUs whose copy engines it holds when it is a memcpy that needs them."""
        transfer = self._p2p_transfer(so, send)
        if so.transport is _MEMCPY and self.copy_engines is not None:
            return transfer, None, self._engine_gpus(so.rank, so.peer)
        if so.transport is _NCCL:
            pair = self._pair_of[id(transfer)] = (so.group, so.rank, so.peer)
            return transfer, pair, None
        return transfer, None, None

    def _p2p_transfer(self, so: Op, send: int) -> Transfer:
        """The transfer of send (or peer copy) `so`, op `send`."""
        if so.kind is _COPY:
            key = (_COPY, so.rank, so.peer, so.size_bytes)
        else:
            key = (_SEND, so.rank, so.peer, so.size_bytes, so.transport, self.algos[send], self.protos[send], so.group,
                   self.group_ranks[so.group])  # fmt: skip
        transfer = self._machine_transfers.get(key)
        if transfer is not None:
            return transfer
        if so.kind is _COPY:
            p = plan(_SEND, Algo.DIRECT, 2, so.size_bytes, self.machine.chunk_bytes)
            transfer = Transfer(_COPY, (so.rank, so.peer), so.size_bytes, _MEMCPY, p, None)
        else:
            p = plan(_SEND, ALGOS[self.algos[send]], 2, so.size_bytes, self.machine.chunk_bytes, PROTOS[self.protos[send]])
            transfer = Transfer(_SEND, (so.rank, so.peer), so.size_bytes, so.transport, p, None, group=self.group_ranks[so.group])
        self._machine_transfers[key] = transfer
        return transfer

    def _engine_gpus(self, src: int, dst: int) -> tuple[int, ...]:
        """The GPUs whose copy engines a memcpy from `src` to `dst` holds (see
        `commdsl.sim.copy_engines`): the source's, and the destination's when staged."""
        topo = self.machine.topology
        g = topo.gpus_per_node
        return (src,) if topo.peers(src % g, dst % g) else (src, dst)

    def _start_transfer(self, transfer: Transfer, members: tuple[int, ...], engines: tuple[int, ...] = ()) -> None:
        if engines:
            self.network.start(transfer, members, partial(self._transfer_done, engines=engines))
        else:
            self.network.start(transfer, members, self._on_transfer_done)
        if self.traffic:
            for rank in self.contention.transfer(transfer, True):
                self._retime(rank)

    def _start_collective(self, inst: Collective) -> None:
        first = inst.ops[0]
        rep = self.ops[first]  # the lowest rank's op describes the collective
        key = (rep.kind, inst.group, rep.size_bytes, rep.transport, self.algos[first], self.protos[first], rep.root, rep.dtype,
               rep.reduce_op)  # fmt: skip
        transfer = self._transfers.get(key)
        if transfer is None:
            ranks = self.group_ranks[inst.group]
            transfer = self._machine_transfers.get(key + (ranks,))  # the group's name alone may mean other ranks elsewhere
            if transfer is None:
                p = plan(rep.kind, ALGOS[self.algos[first]], len(ranks), rep.size_bytes, self.machine.chunk_bytes, PROTOS[self.protos[first]])
                transfer = Transfer(rep.kind, ranks, rep.size_bytes, rep.transport, p, rep.root, rep.dtype, rep.reduce_op)
                self._machine_transfers[key + (ranks,)] = transfer
            self._transfers[key] = transfer
        # Folded: every member moves at once, in rank order (as they arrive when all ranks run).
        self._start_transfer(transfer, tuple(inst.ops) if self.folded else tuple(inst.arrived))

    def _transfer_done_folded(self, transfer: Transfer, members: tuple[int, ...]) -> None:
        """A collective of a folded run is done: its ops on rank 0 (the first member) finish."""
        self._transfer_done(transfer, members[:1])

    def _transfer_done(self, transfer: Transfer, members: tuple[int, ...], engines: tuple[int, ...] = ()) -> None:
        now = self.env._now
        kernels = self.kernels
        if self.traffic:
            for rank in self.contention.transfer(transfer, False):
                self._retime(rank)
        on_stream, queue_list, queue_at, todo = self.on_stream, self.queue_list, self.queue_at, self._todo
        end, state, waiters = self.end, self.state, self.waiters
        for g in members:
            if on_stream[g]:  # a memcpy transfer: its stream goes on
                op = self.ops[g]
                s = self.streams[op.rank][op.stream]
                s.busy = False
                self._complete_entry(s, s.cur, now, s.cur_cause)
                self._kick(s)
                continue
            end[g] = now  # _finish, inlined (once per comm op)
            state[g] = DONE
            w = waiters.pop(g, None)
            if w:
                for e in w:
                    if not e.kicked:
                        e.kicked = True
                        todo.append(e)
            if kernels and self.ops[g].spec.transport is _NCCL:
                self._kernel_changed(g, False)
            q = queue_list[queue_at[g]]
            q.remaining -= 1
            if q.remaining == 0:
                q.active = False
                q.done += 1  # pops the head
                q.last_g, q.last_end = g, now
                if q.drain_waiters:
                    self._wake_drained(q)
                if not q.kicked:
                    q.kicked = True
                    todo.append(q)
        if engines:
            self.copy_engines.release(engines)
        elif (key := self._pair_of.get(id(transfer))) is not None:  # an NCCL send: the next of its pair may go
            waiting = self.pair_fifo[key]
            if waiting:
                self._start_transfer(*waiting.popleft())
            else:
                del self.pair_fifo[key]  # idle again
        self._drain()
