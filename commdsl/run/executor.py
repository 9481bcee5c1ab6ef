"""The op loop: one rank's program, issued in order by the host, run on its streams.

`Executor` holds what both devices share: planning (buffers, kernels, comm plans,
batches), the iteration loop with its records, fills and checks, and the description
of unfinished ops the watchdog prints. `CpuExecutor` runs streams and comm queues as
threads (see `streams.py`); `CudaExecutor` uses CUDA streams, CUDA events and NCCL.

Per op kind (docs/simulator.md, "Execution semantics", rules 1-4):

    compute / copy     queued on its stream
    copy to a rank     queued on its stream: a copy into the destination's buffer, opened
                       at start-up (`commdsl.run.peer`); nothing runs on the destination
    comm op            async: waits for the work queued on its stream, then joins its
                       group's comm queue; sync (no handle): the stream then waits for
                       it; a gloo-transport sync op also blocks the host, as gloo does;
                       on CPU a memcpy send/recv runs on its stream instead, as a copy
    batch of P2P       one batch_isend_irecv, issued at its first op
    wait on a stream   the stream waits for the handle's ops
    wait on host       the host blocks until the handle's ops finish
    record/wait_event  stream-ordered events
    synchronize        the host waits for one stream, or (device) for everything
    host               the host sleeps for the duration (it does no device work)
    alloc / free       a real buffer (torch.empty) made or dropped in stream order (CPU:
                       on the stream's thread; CUDA: by the host with the stream current,
                       as the caching allocator orders memory by stream); buffers still
                       live at the end of an iteration are dropped then
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from commdsl.errors import CommdslError, ScheduleError
from commdsl.ir import HOST_STREAM, MEMORY_KINDS, HostMemory, Op, OpKind, Program, Transport
from commdsl.run.check import Checker
from commdsl.run.comm import CommPlan, launch, make_plan
from commdsl.run.compute import Kernels, KernelSpec
from commdsl.run.config import RunConfig
from commdsl.run.peer import PeerBuffers
from commdsl.run.streams import Aborted, RunSignals, WorkQueue
from commdsl.run.tensors import BufferPool, CopyBuffers, DeclaredMemory, check_supported
from commdsl.run.timing import IterRecord, now_ns

DUMP_MAX_ELEMENTS = 4096
"""--dump-values keeps tensors up to this many elements."""
MEMCPY_TAG_BASE = 1 << 24
"""Tags of memcpy sends and recvs (plus their position among the messages from one rank
to another in their group), clear of the default tag 0 the other sends use."""
PEER_STORE_PREFIX = "commdsl/peer"


class OpFailed(CommdslError):
    """A torch call behind an op raised (exit code 1)."""

    kind = "run error"


@dataclass
class RankSetup:
    """Everything an executor needs about its rank."""

    program: Program
    rank: int
    backend: str
    device: torch.device
    groups: dict[str, dist.ProcessGroup]
    control: dist.ProcessGroup
    config: RunConfig
    kernels: Kernels
    checker: Checker | None
    store: dist.Store | None = None
    """The rendezvous store: copies to other ranks exchange their buffers' handles there."""


class Executor:
    """Shared planning and iteration loop; subclasses issue the ops."""

    def __init__(self, setup: RankSetup):
        self.setup = setup
        self.program = setup.program
        self.rank = setup.rank
        self.ops: tuple[Op, ...] = setup.program.ops[setup.rank]
        self.signals = RunSignals()
        per_op = setup.checker is not None
        self.pool = BufferPool(setup.device, setup.backend, per_op=per_op)
        self.memory = DeclaredMemory(setup.device)
        """The buffers of the program's alloc/free ops."""
        self.comm: dict[int, CommPlan] = {}
        """Lead op index -> plan (a batch is planned at its first op)."""
        self.lead_of: dict[int, int] = {}
        """Comm op index -> index of the op that issues it (itself, or its batch's first op)."""
        self.copies: dict[int, CopyBuffers] = {}
        self.peers = PeerBuffers(setup.program, setup.rank, setup.device, per_op)
        """Buffers other ranks copy into, and those this rank's copies write."""
        self.peer_source: dict[int, torch.Tensor] = {}
        """Copy to another rank -> the buffer it reads."""
        self.kernel: dict[int, KernelSpec] = {}
        self.rec = IterRecord.empty(len(self.ops))
        self.phase: tuple[str, int] | None = None
        """What the host is doing outside the ops (a barrier...), and since when (ns)."""
        self.host_op: int | None = None
        """Index of the op the host is issuing right now."""
        self.profiling = setup.config.profile_dir is not None
        """`--profile`: each op runs inside a `record_function` range named as the schedule
        names it (`op_range`), which the profiler's trace shows."""
        self.step_name: str | None = None
        """`--profile`: the name of the range around this iteration's ops (after the
        iteration-start barrier, so the step holds the schedule's work alone)."""
        self._plan()

    # ---- planning ----------------------------------------------------------------

    def _plan(self) -> None:
        setup = self.setup
        batches: dict[int, list[Op]] = {}
        for op in self.ops:
            if op.kind.is_comm:
                check_supported(op, setup.backend)
                if op.batch is not None:
                    batches.setdefault(op.batch, []).append(op)
                    self.lead_of[op.index] = op.batch
                else:
                    self.lead_of[op.index] = op.index
            elif op.is_peer_copy:
                self.peer_source[op.index] = self.pool.peer_source(op)
            elif op.kind is OpKind.COPY:
                self.copies[op.index] = self.pool.copy(op)
        self.size_compute()
        for op in self.ops:
            if not op.kind.is_comm or self.lead_of[op.index] != op.index:
                continue
            members = tuple(batches[op.batch]) if op.batch is not None else (op,)
            groups = {m.group for m in members}
            if len(groups) > 1:
                raise ScheduleError(f"a batch mixes groups {sorted(groups)}; batch_isend_irecv takes one group",
                                    op.loc, rank=self.rank)  # fmt: skip
            size = len(self.program.group(op.group).ranks)
            bufs = tuple(self.pool.comm(m, size) for m in members)
            self.comm[op.index] = make_plan(members, setup.groups[op.group], size, bufs, setup.backend, setup.device)
        sent: dict[tuple[int, int, str], int] = {}
        for op in self.ops:
            if op.kind.is_p2p:  # the k-th message from one rank to another in a group matches the k-th recv
                channel = (op.rank, op.peer, op.group) if op.kind is OpKind.SEND else (op.peer, op.rank, op.group)
                k = sent[channel] = sent.get(channel, -1) + 1
                if op.transport is Transport.MEMCPY:
                    self.comm[op.index].tag = MEMCPY_TAG_BASE + k
        if self.peers.used:
            self.peers.open(setup.store, setup.control, PEER_STORE_PREFIX)

    def size_compute(self) -> None:
        """Size every compute op from the kernels' current timing (`Kernels.spec`): at
        planning, and again between iterations when the timing was re-checked."""
        kernels = self.setup.kernels
        for op in self.ops:
            if op.kind is OpKind.COMPUTE:
                spec = kernels.spec(op)
                kernels.prepare(op.stream, spec)
                self.kernel[op.index] = spec

    def op_range(self, op: Op) -> contextlib.AbstractContextManager:
        """A `record_function` range named after `op` while profiling, else nothing."""
        return torch.profiler.record_function(op.name) if self.profiling else contextlib.nullcontext()

    def issue_range(self, op: Op) -> contextlib.AbstractContextManager:
        """The range around the host's issue of `op` (`op_range` where the device's
        profiler projects host ranges onto the streams' work, as CUDA's does)."""
        return contextlib.nullcontext()

    def leads(self, indices: tuple[int, ...]) -> list[int]:
        """The distinct issuing ops behind a handle's op indices."""
        return sorted({self.lead_of[i] for i in indices})

    def buffers_of(self, op: Op):
        plan = self.comm[self.lead_of[op.index]]
        return plan.buffers[plan.ops.index(op)]

    # ---- iterations -----------------------------------------------------------------

    def run_iteration(self) -> IterRecord:
        self.rec = rec = IterRecord.empty(len(self.ops))
        self.begin_iteration()
        self._fill_inputs()
        self.phase = ("the iteration-start barrier (waiting for the other ranks)", now_ns())
        dist.barrier(group=self.setup.control)
        self.phase = None
        rec.begin_ns = self.anchor()
        try:
            with torch.profiler.record_function(self.step_name) if self.step_name else contextlib.nullcontext():
                for op in self.ops:
                    i = op.index
                    self.host_op = i
                    rec.issue_start[i] = now_ns()
                    with self.issue_range(op):
                        self.issue(op)
                    rec.issue_end[i] = now_ns()
                self.host_op = None
                self.drain()
            if self.peers.used:  # every copy of the iteration has landed before anyone looks
                self.phase = ("the iteration-end barrier (copies to other ranks landing)", now_ns())
                dist.barrier(group=self.setup.control)
                self.phase = None
        except Aborted:
            pass
        self.raise_failure()
        self.end_iteration()
        self.memory.release_all()
        return rec

    def raise_failure(self) -> None:
        exc = self.signals.failure
        if exc is None:
            return
        if isinstance(exc, CommdslError):
            raise exc
        raise OpFailed(f"{type(exc).__name__}: {exc}")

    def _fill_inputs(self) -> None:
        checker = self.setup.checker
        if checker is None:
            return
        for op in self.ops:
            exp = checker.expect.get(op.index)
            if exp is not None and exp.inp is not None:
                buf = self.peer_source[op.index] if op.is_peer_copy else self.buffers_of(op).inp
                buf.copy_(exp.inp.view(buf.dtype) if buf.dtype != exp.inp.dtype else exp.inp)
        for exp in checker.arrivals:  # a copy that does not land must not find last iteration's values
            self.peers.landing(exp.op).zero_()

    def verify(self) -> list[str]:
        checker = self.setup.checker
        if checker is None:
            return []
        failures = []
        for op in self.ops:
            if op.kind.is_comm:
                out = self.buffers_of(op).out
                if out is not None:
                    why = checker.verify(op, out)
                    if why:
                        failures.append(why)
        for exp in checker.arrivals:
            why = checker.verify_arrival(exp, self.peers.landing(exp.op))
            if why:
                failures.append(why)
        return failures

    def dump_values(self) -> dict:
        """op id -> input and output values (small tensors), after an iteration."""
        checker = self.setup.checker
        out: dict = {}
        for op in self.ops:
            if not op.kind.is_comm or op.kind is OpKind.BARRIER:
                continue
            exp = checker.expect.get(op.index) if checker else None
            buf = self.buffers_of(op)
            entry: dict = {"name": op.name, "kind": op.kind.value}
            if exp is not None and exp.inp is not None and exp.inp.numel() <= DUMP_MAX_ELEMENTS:
                entry["in"] = exp.inp.double().tolist()
            if buf.out is not None and buf.out.numel() <= DUMP_MAX_ELEMENTS:
                got = buf.out.detach().cpu()
                if exp is not None and exp.out is not None and got.dtype != exp.out.dtype:
                    got = got.view(exp.out.dtype)
                entry["out"] = got.double().tolist()
            out[op.id] = entry
        return out

    # ---- what the watchdog prints ----------------------------------------------------------

    def unfinished(self) -> list[tuple[Op, str, int]]:
        """(op, "running" | "queued", issued at ns) for every issued, unfinished op."""
        rec = self.rec
        out = []
        for op in self.ops:
            i = op.index
            if rec.issue_start[i] and not self.finished(i):
                out.append((op, "running" if self.started(i) else "queued", rec.issue_start[i]))
        return out

    def started(self, i: int) -> bool:
        return bool(self.rec.exec_start[i])

    def finished(self, i: int) -> bool:
        return bool(self.rec.exec_end[i])

    # ---- device-specific ------------------------------------------------------------------

    def begin_iteration(self) -> None:
        """Fresh per-iteration state (events)."""

    def anchor(self) -> int:
        """Mark the iteration's start; returns it in host ns."""
        return now_ns()

    def issue(self, op: Op) -> None:
        raise NotImplementedError

    def drain(self) -> None:
        raise NotImplementedError

    def end_iteration(self) -> None:
        """Read device timestamps into `self.rec`."""

    def close(self) -> None:
        """Stop worker threads (after the last iteration) and release other ranks' buffers."""
        self.signals.stop.set()
        self.peers.close()

    def host_work(self, op: Op) -> None:
        rec = self.rec
        rec.exec_start[op.index] = now_ns()
        time.sleep((op.duration_us or 0.0) * 1e-6)
        rec.exec_end[op.index] = now_ns()


def make_executor(setup: RankSetup) -> Executor:
    """The executor for the setup's backend: NCCL on GPUs, gloo on CPU."""
    return CudaExecutor(setup) if setup.backend == "nccl" else CpuExecutor(setup)


class CpuExecutor(Executor):
    """gloo on CPU: streams and comm queues are worker threads (see streams.py). While
    profiling, an op's range is on the thread that runs it (its stream's, its group's
    comm queue's, or the host's), spanning its execution."""

    def __init__(self, setup: RankSetup):
        super().__init__(setup)
        on_start = setup.kernels.set_thread_count
        self.streams = {name: WorkQueue(f"stream-{name}", self.signals, on_start) for name in self.program.streams}
        queued = {self.ops[i].group for i in self.comm if self.ops[i].transport is not Transport.MEMCPY}
        self.queues = {gid: WorkQueue(f"comm-{gid}", self.signals) for gid in sorted(queued)}
        self.done: dict[int, threading.Event] = {}
        self.events: dict[int, threading.Event] = {}

    def begin_iteration(self) -> None:
        self.done = {i: threading.Event() for i in self.comm}
        self.events = {op.index: threading.Event() for op in self.ops if op.kind is OpKind.RECORD}

    def issue_range(self, op: Op) -> contextlib.AbstractContextManager:
        # Host work runs in the issue itself; every other op runs in a `_timed` task, which has its range.
        return self.op_range(op) if op.kind is OpKind.HOST else contextlib.nullcontext()

    def _timed(self, op: Op, fn):
        i = op.index

        def task() -> None:
            rec = self.rec
            rec.exec_start[i] = now_ns()
            try:
                with self.op_range(op):
                    fn()
            except (Aborted, CommdslError):
                raise
            except Exception as e:
                raise OpFailed(f"{op.label} failed on rank {self.rank}: {type(e).__name__}: {e}",
                               op.loc, rank=self.rank) from e  # fmt: skip
            rec.exec_end[i] = now_ns()

        return task

    def _wait_all(self, events: list[threading.Event]) -> None:
        for ev in events:
            self.signals.wait_event(ev)

    def issue(self, op: Op) -> None:
        kind = op.kind
        if kind.is_comm and op.transport is Transport.MEMCPY:  # no communicator: it runs on its stream
            plan, done = self.comm[op.index], self.done[op.index]
            self.streams[op.stream].submit(self._timed(op, lambda: self._transfer(plan, done)))
        elif kind.is_comm:
            if self.lead_of[op.index] == op.index:
                self._issue_comm(self.comm[op.index])
        elif kind is OpKind.COMPUTE:
            spec, kernels, stream = self.kernel[op.index], self.setup.kernels, op.stream
            self.streams[stream].submit(self._timed(op, lambda: kernels.run(stream, spec)))
        elif op.is_peer_copy:  # a memcpy into the destination's shared pages, by this stream's thread
            target, source = self.peers.target(op), self.peer_source[op.index]
            self.streams[op.stream].submit(self._timed(op, lambda: target.copy_(source)))
        elif kind is OpKind.COPY:
            bufs, stream = self.copies[op.index], self.streams[op.stream]
            ticket = stream.submit(self._timed(op, lambda: bufs.dst.copy_(bufs.src)))
            if op.host_memory is HostMemory.PAGEABLE:  # as cudaMemcpyAsync from pageable memory: returns when done
                stream.wait_for(ticket)
        elif kind is OpKind.WAIT:
            events = [self.done[j] for j in self.leads(op.waits_for)]
            if op.stream == HOST_STREAM:
                self._timed(op, lambda: self._wait_all(events))()
            else:
                self.streams[op.stream].submit(self._timed(op, lambda: self._wait_all(events)))
        elif kind is OpKind.RECORD:
            self.streams[op.stream].submit(self._timed(op, self.events[op.index].set))
        elif kind is OpKind.WAIT_EVENT:
            event = self.events[op.waits_for[0]]
            self.streams[op.stream].submit(self._timed(op, lambda: self.signals.wait_event(event)))
        elif kind is OpKind.SYNCHRONIZE:
            if op.stream == HOST_STREAM:  # device-wide: every stream and comm queue
                targets = [(q, q.position) for q in (*self.streams.values(), *self.queues.values())]
            else:
                q = self.streams[op.stream]
                targets = [(q, q.position)]
            self._timed(op, lambda: [q.wait_for(t) for q, t in targets])()
        elif kind is OpKind.HOST:
            self.host_work(op)
        elif kind is OpKind.ALLOC:
            self.streams[op.stream].submit(self._timed(op, lambda: self.memory.alloc(op)))
        elif kind is OpKind.FREE:
            self.streams[op.stream].submit(self._timed(op, lambda: self.memory.free(op)))
        else:  # pragma: no cover
            raise AssertionError(kind)

    def _issue_comm(self, plan: CommPlan) -> None:
        lead = plan.lead
        stream = self.streams[lead.stream]
        ticket = stream.position
        done = self.done[lead.index]
        rec_ops = [o.index for o in plan.ops]

        def run() -> None:
            stream.wait_for(ticket)  # the work queued on the issuing stream before the op
            rec = self.rec
            t0 = now_ns()
            for i in rec_ops:
                rec.exec_start[i] = t0
            try:
                with self.op_range(lead):
                    for work in launch(plan):
                        work.wait()
            except Exception as e:
                raise OpFailed(f"{lead.kind.value} {lead.name} failed on rank {self.rank}: {type(e).__name__}: {e}",
                               lead.loc, rank=self.rank) from e  # fmt: skip
            t1 = now_ns()
            for i in rec_ops:
                rec.exec_end[i] = t1
            done.set()

        self.queues[lead.group].submit(run)
        if not lead.is_async:
            stream.submit(lambda: self.signals.wait_event(done), only_waits_for=done)
            if lead.transport is Transport.GLOO:  # a blocking gloo call blocks its caller
                self.signals.wait_event(done)

    def _transfer(self, plan: CommPlan, done: threading.Event) -> None:
        """A memcpy send or recv on its stream's thread: the stream holds it to its end."""
        for work in launch(plan):
            work.wait()
        done.set()

    def drain(self) -> None:
        for q in (*self.streams.values(), *self.queues.values()):
            q.drain()

    def close(self) -> None:
        super().close()
        for q in (*self.streams.values(), *self.queues.values()):
            q.join()


class CudaExecutor(Executor):
    """NCCL on GPUs: CUDA streams, CUDA events for timing, NCCL's own comm streams.

    NOT YET RUN ON A GPU: this path was written without one (see docs/executor.md).

    Timing: every device op has a start and an end CUDA event recorded around it on
    its stream. A comm op's start event is recorded on the issuing stream just before
    the call (the moment the stream's earlier work is done); since NCCL also queues it
    behind its group's earlier comm ops, its start is max(that, the previous comm op's
    end in the group). Its end event is recorded on a per-group timing stream made to
    wait on the Work. Event times are anchored to the host clock once per iteration.
    """

    def __init__(self, setup: RankSetup):
        super().__init__(setup)
        self.streams = {name: torch.cuda.Stream(device=setup.device) for name in self.program.streams}
        self.timing_streams = {gid: torch.cuda.Stream(device=setup.device) for gid in {self.ops[i].group for i in self.comm}}
        self.host_wait_stream = torch.cuda.Stream(device=setup.device)
        self.start_ev = [torch.cuda.Event(enable_timing=True) for _ in self.ops]
        self.end_ev = [torch.cuda.Event(enable_timing=True) for _ in self.ops]
        self.user_events = {op.index: torch.cuda.Event() for op in self.ops if op.kind is OpKind.RECORD}
        self.anchor_ev = torch.cuda.Event(enable_timing=True)
        self.anchor_ns = 0
        self.works: dict[int, list] = {}
        self.prev_in_group: dict[int, int] = {}
        """Lead comm op -> the previous lead comm op of the same group (for start times)."""
        last: dict[str, int] = {}
        for i in sorted(self.comm):
            g = self.ops[i].group
            if g in last:
                self.prev_in_group[i] = last[g]
            last[g] = i
        self.device_ops = [op.index for op in self.ops if _on_device(op)]

    def issue_range(self, op: Op) -> contextlib.AbstractContextManager:
        return self.op_range(op)  # CUDA's profiler shows it on the GPU too (gpu_user_annotation)

    def anchor(self) -> int:
        torch.cuda.synchronize(self.setup.device)
        before = now_ns()
        self.anchor_ev.record(torch.cuda.current_stream(self.setup.device))
        self.anchor_ev.synchronize()
        after = now_ns()
        self.anchor_ns = (before + after) // 2  # the event lies in [before, after]
        return self.anchor_ns

    def issue(self, op: Op) -> None:
        kind, i = op.kind, op.index
        if kind.is_comm:
            if self.lead_of[i] == i:
                self._issue_comm(self.comm[i])
            return
        if kind is OpKind.HOST:
            self.host_work(op)
            return
        if kind in MEMORY_KINDS:  # the allocator orders memory by the stream current at the call
            self.rec.exec_start[i] = now_ns()
            with torch.cuda.stream(self.streams[op.stream]):
                (self.memory.alloc if kind is OpKind.ALLOC else self.memory.free)(op)
            self.rec.exec_end[i] = now_ns()
            return
        if kind is OpKind.SYNCHRONIZE or (kind is OpKind.WAIT and op.stream == HOST_STREAM):
            self.rec.exec_start[i] = now_ns()
            if kind is OpKind.SYNCHRONIZE and op.stream == HOST_STREAM:
                torch.cuda.synchronize(self.setup.device)
            elif kind is OpKind.SYNCHRONIZE:
                self.streams[op.stream].synchronize()
            else:
                with torch.cuda.stream(self.host_wait_stream):
                    for j in self.leads(op.waits_for):
                        for w in self.works[j]:
                            w.wait()
                self.host_wait_stream.synchronize()
            self.rec.exec_end[i] = now_ns()
            return
        stream = self.streams[op.stream]
        with torch.cuda.stream(stream):
            self.start_ev[i].record(stream)
            if kind is OpKind.COMPUTE:
                self.setup.kernels.run(op.stream, self.kernel[i])
            elif op.is_peer_copy:  # cudaMemcpyAsync into the destination's memory, opened by CUDA IPC
                self.peers.target(op).copy_(self.peer_source[i], non_blocking=True)
            elif kind is OpKind.COPY:
                bufs = self.copies[i]
                bufs.dst.copy_(bufs.src, non_blocking=True)
            elif kind is OpKind.WAIT:
                for j in self.leads(op.waits_for):
                    for w in self.works[j]:
                        w.wait()  # makes the current stream wait for the NCCL op
            elif kind is OpKind.RECORD:
                self.user_events[i].record(stream)
            elif kind is OpKind.WAIT_EVENT:
                stream.wait_event(self.user_events[op.waits_for[0]])
            self.end_ev[i].record(stream)
        if kind is OpKind.COPY and op.host_memory is HostMemory.PAGEABLE:
            # CUDA may return from a pageable copy once its bytes are staged; the host is
            # held to the copy's end, as the simulator models it.
            self.end_ev[i].synchronize()

    def _issue_comm(self, plan: CommPlan) -> None:
        lead = plan.lead
        stream = self.streams[lead.stream]
        with torch.cuda.stream(stream):
            self.start_ev[lead.index].record(stream)
            works = launch(plan)  # NCCL waits for `stream`, then runs on its own stream
        self.works[lead.index] = works
        timing = self.timing_streams[lead.group]
        with torch.cuda.stream(timing):
            for w in works:
                w.wait()
            self.end_ev[lead.index].record(timing)
        if not lead.is_async:
            with torch.cuda.stream(stream):
                for w in works:
                    w.wait()

    def drain(self) -> None:
        torch.cuda.synchronize(self.setup.device)

    def started(self, i: int) -> bool:
        if not _on_device(self.ops[i]):
            return bool(self.rec.exec_start[i])
        lead = self.lead_of.get(i, i)
        return self.rec.issue_end[lead] != 0 and self.start_ev[lead].query()

    def finished(self, i: int) -> bool:
        if not _on_device(self.ops[i]):
            return bool(self.rec.exec_end[i])
        lead = self.lead_of.get(i, i)
        return self.rec.issue_end[lead] != 0 and self.end_ev[lead].query()

    def end_iteration(self) -> None:
        rec, a = self.rec, self.anchor_ev

        def at(ev: torch.cuda.Event) -> int:
            return self.anchor_ns + round(a.elapsed_time(ev) * 1e6)

        for i in self.device_ops:
            lead = self.lead_of.get(i, i)
            start = at(self.start_ev[lead])
            if lead in self.prev_in_group:
                start = max(start, at(self.end_ev[self.prev_in_group[lead]]))
            rec.exec_start[i], rec.exec_end[i] = start, max(start, at(self.end_ev[lead]))


def _on_device(op: Op) -> bool:
    """Ops timed with CUDA events (the rest are timed on the host)."""
    if op.kind in (OpKind.HOST, OpKind.SYNCHRONIZE) or op.kind in MEMORY_KINDS:
        return False
    return not (op.kind is OpKind.WAIT and op.stream == HOST_STREAM)
