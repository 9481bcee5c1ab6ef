"""Clocks, per-iteration records, and the measured timeline.

Clock. Every timestamp is `time.monotonic_ns()` (CLOCK_MONOTONIC): one clock shared by
every process of a machine, so ranks on rank 0's host need no correction at all
(bound 0). Ranks on other hosts are aligned to rank 0 by ping-pong over the control
group: the rank sends its time t1, rank 0 answers with its time t2, the rank reads t3;
offset = t2 - (t1 + t3) / 2, wrong by at most half the round trip (t3 - t1) / 2. We
keep the round with the shortest round trip and report that bound per rank. The
ping-pong also runs between ranks of one host, where the true offset is 0, as a
self-check (`meta.clock`). On CUDA, device times come from CUDA events, anchored to the
host clock once per iteration (`executor.CudaExecutor`).

Statistics. Each measured iteration starts at a common origin (the earliest rank's
start). A span's start and end are the medians over iterations of the op's start and
end relative to that origin. Medians keep every ordering that holds in every
iteration (same-stream ops do not overlap, a recv ends after its send starts, ...),
because order statistics are monotone.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from commdsl.ir import HOST_STREAM, Op, OpKind, Program
from commdsl.run.check import match_p2p
from commdsl.timeline import COMM_TRACK_PREFIX, REQUESTED_DURATION_ARG, Flow, Span, SpanRole, Timeline, comm_span_args, gloo_span_name, nccl_kernel_name, op_span_args

now_ns = time.monotonic_ns


@dataclass
class IterRecord:
    """Timestamps (ns, this rank's clock; 0 = not yet) of one iteration's ops."""

    begin_ns: int
    issue_start: list[int]
    issue_end: list[int]
    exec_start: list[int]
    exec_end: list[int]

    @classmethod
    def empty(cls, num_ops: int) -> IterRecord:
        return cls(0, [0] * num_ops, [0] * num_ops, [0] * num_ops, [0] * num_ops)


@dataclass(frozen=True)
class ClockSync:
    """How this rank's clock maps to rank 0's."""

    host: str
    applied_offset_ns: int
    """Added to this rank's timestamps: 0 on rank 0's host, else the measured offset."""
    bound_ns: int
    """Bound on the alignment error of `applied_offset_ns`."""
    measured_offset_ns: int
    measured_rtt_ns: int


def measure_clock(control: dist.ProcessGroup, rank: int, world_size: int, hosts: list[str], rounds: int = 16) -> ClockSync:
    """Ping-pong with rank 0, one rank after another; returns this rank's alignment."""
    buf = torch.zeros(1, dtype=torch.int64)
    best_rtt, best_offset = 0, 0
    if rank == 0:
        for peer in range(1, world_size):
            for _ in range(rounds):
                dist.recv(buf, src=peer, group=control)
                buf[0] = now_ns()
                dist.send(buf, dst=peer, group=control)
    else:
        best_rtt = None
        for _ in range(rounds):
            t1 = now_ns()
            buf[0] = t1
            dist.send(buf, dst=0, group=control)
            dist.recv(buf, src=0, group=control)
            t3 = now_ns()
            rtt = t3 - t1
            if best_rtt is None or rtt < best_rtt:
                best_rtt, best_offset = rtt, int(buf[0].item()) - (t1 + t3) // 2
    same_host = hosts[rank] == hosts[0]
    if same_host:
        return ClockSync(hosts[rank], 0, 0, best_offset, best_rtt)
    return ClockSync(hosts[rank], best_offset, best_rtt // 2, best_offset, best_rtt)


@dataclass
class RankResult:
    """What one rank sends to rank 0 at the end."""

    rank: int
    clock: ClockSync
    records: list[IterRecord]
    """Measured iterations only."""
    check_failures: list[str] = field(default_factory=list)
    values: dict = field(default_factory=dict)
    """op id -> {"in": [...], "out": [...]} for --dump-values."""
    calibration_us: float = 0.0
    flop_block_tflops: dict[str, float] = field(default_factory=dict)
    """Per dtype of the rank's FLOP-sized ops, the FLOP block's rate at start-up."""
    memory: dict = field(default_factory=dict)
    """The program's declared buffers over the measured iterations: `peak_bytes` and
    `live_at_peak` (the executor's accounting), and on a GPU `cuda_peak_bytes`
    (torch.cuda.max_memory_allocated above what was allocated before them)."""


def exec_track(op: Op) -> str:
    """The track an op's EXEC span sits on."""
    if op.kind.is_comm:
        return COMM_TRACK_PREFIX + op.group
    if op.kind in (OpKind.HOST, OpKind.SYNCHRONIZE) or op.stream == HOST_STREAM:
        return HOST_STREAM
    return op.stream


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def iteration_origins(results: list[RankResult]) -> list[int]:
    """Per measured iteration, its time zero (ns, rank 0's clock): the earliest begin over
    the ranks that began it (a partial record after a hang may be of a rank that never did)."""
    iters = max((len(r.records) for r in results), default=0)
    return [min((r.records[i].begin_ns + r.clock.applied_offset_ns for r in results if i < len(r.records) and r.records[i].begin_ns),
                default=0) for i in range(iters)]  # fmt: skip


def iteration_records(program: Program, results: list[RankResult]) -> dict:
    """Every measured iteration's op times (`--records FILE`): per iteration, op id ->
    [start_us, end_us] of its execution from the iteration's time zero (null: not run),
    the raw data behind the timeline's per-op medians."""
    origins = iteration_origins(results)
    iterations = []
    for i, origin in enumerate(origins):
        ops = {}
        for r in sorted(results, key=lambda r: r.rank):
            if i >= len(r.records):
                continue
            rec, off = r.records[i], r.clock.applied_offset_ns
            for op in program.ops[r.rank]:
                k = op.index
                started = rec.exec_start[k]
                ops[op.id] = [round((started + off - origin) / 1e3, 3), round((rec.exec_end[k] + off - origin) / 1e3, 3)] if started and rec.exec_end[k] else None
        iterations.append(ops)
    return {"schedule": program.name, "world_size": program.world_size, "iterations": iterations}


def measured_comm_name(backend: str) -> Callable[[Op], str]:
    """How a run names its comm ops' spans: by the backend that ran them (every comm op
    runs on the run's backend, whatever transport it declares). NCCL ops take the kernel
    name the PyTorch profiler shows (`ncclDevKernel_...`), gloo ops `gloo:<kind>`, as
    the simulator names them."""
    if backend == "nccl":
        return nccl_kernel_name
    if backend == "gloo":
        return gloo_span_name
    raise ValueError(f"no span names for backend {backend!r} (known: nccl, gloo)")


def build_timeline(program: Program, results: list[RankResult], meta: dict, *, now: int | None = None) -> Timeline:
    """Merge the ranks' records into one measured Timeline (rank 0).

    With `now` (a partial timeline after a hang), unfinished ops that started end at
    `now` and are marked `state: running`; ops never started get no EXEC span."""
    tl = Timeline("measured", program.name, program.world_size, meta=meta)
    comm_name = measured_comm_name(meta["backend"])
    by_rank = {r.rank: r for r in results}
    origins = iteration_origins(results)
    iters = len(origins)
    iter_makespans = []
    for i in range(iters):
        ends = [max(rec.exec_end + rec.issue_end) + r.clock.applied_offset_ns
                for r in results if i < len(r.records) for rec in [r.records[i]] if rec.begin_ns and rec.exec_end]  # fmt: skip
        iter_makespans.append((max(ends) - origins[i]) / 1e3 if ends else 0.0)
    tl.meta["iteration_makespans_us"] = [round(x, 3) for x in iter_makespans]

    for rank in sorted(by_rank):
        res = by_rank[rank]
        off = res.clock.applied_offset_ns
        for op in program.ops[rank]:
            i = op.index
            recs = [(rec, origins[k]) for k, rec in enumerate(res.records)]
            track = exec_track(op)
            group_size = len(program.group(op.group).ranks) if op.group else 0
            if op.kind.is_comm:
                name, args = comm_name(op), comm_span_args(op, group_size)
            else:
                name, args = op.name, op_span_args(op)
                if op.kind is OpKind.COMPUTE and op.duration_us is not None:
                    args += ((REQUESTED_DURATION_ARG, op.duration_us),)
            started = [(rec.exec_start[i], rec.exec_end[i], o) for rec, o in recs if rec.exec_start[i]]
            if started:
                state = ()
                if now is not None and any(e == 0 for _, e, _ in started):
                    state = (("state", "running"),)
                s = _median([(st + off - o) / 1e3 for st, _, o in started])
                e = _median([((en or now or st) + off - o) / 1e3 for st, en, o in started])
                tl.spans.append(Span(op.id, rank, track, SpanRole.EXEC, op.kind.value, name, s, max(s, e), args + state))
            if track != HOST_STREAM:
                issued = [(rec.issue_start[i], rec.issue_end[i], o) for rec, o in recs if rec.issue_start[i]]
                if issued:
                    s = _median([(st + off - o) / 1e3 for st, _, o in issued])
                    e = _median([((en or now or st) + off - o) / 1e3 for st, en, o in issued])
                    tl.spans.append(Span(op.id, rank, HOST_STREAM, SpanRole.ISSUE, op.kind.value, op.name, s, max(s, e),
                                         (("name", op.name), ("source", f"{op.loc.file}:{op.loc.line}"))))  # fmt: skip
    for recv_id, send in sorted(match_p2p(program).items()):
        tl.flows.append(Flow(send.id, recv_id))
    return tl
