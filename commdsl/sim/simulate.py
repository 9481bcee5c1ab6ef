"""`simulate()`: run the engine and turn its per-op arrays into a `Timeline`."""

from __future__ import annotations

from dataclasses import dataclass, field

from commdsl.errors import UsageError
from commdsl.ir import HOST_STREAM, CopyDir, Op, OpKind, Program, Transport
from commdsl.machine.model import Machine, timeless_machine
from commdsl.sim.deadlock import deadlock_error
from commdsl.sim.engine import Engine, RawResult
from commdsl.sim.network import NETWORKS
from commdsl.timeline import COMM_TRACK_PREFIX, Flow, Span, SpanRole, Timeline, comm_span_args, nccl_kernel_name, op_span_args

_SMALL_MESSAGE_BYTES = 64 * 1024
"""Below this NCCL uses its low-latency (LL) protocol, above it Simple; only the kernel
name in traces depends on it."""

_MEMCPY_NAMES = {
    CopyDir.H2D: "Memcpy HtoD (Pinned -> Device)",
    CopyDir.D2H: "Memcpy DtoH (Device -> Pinned)",
    CopyDir.D2D: "Memcpy DtoD (Device -> Device)",
}
"""Copy span names as the PyTorch profiler (CUPTI) writes them."""


@dataclass
class SimResult:
    program: Program
    machine: Machine
    network: str
    raw: RawResult
    timeline: Timeline | None
    """None when simulated with `timeline=False` (deadlock checks)."""
    critical_path: list[int]
    """Global op numbers (see `op_at`) from the first to the last op of the path."""
    makespan_us: float
    warnings: list[str] = field(default_factory=list)

    def op_at(self, g: int) -> Op:
        return self.raw.ops[g]


def simulate(program: Program, machine: Machine, network: str = "analytic", *, timeline: bool = True) -> SimResult:
    """Simulate `program` on `machine`. Raises `DeadlockError` if it cannot finish."""
    if network not in NETWORKS:
        raise UsageError(f"unknown network model '{network}' (known: {', '.join(NETWORKS)})")
    engine = Engine(program, machine, NETWORKS[network])
    raw = engine.run()
    if engine.unfinished():
        raise deadlock_error(engine)
    warnings = []
    if program.world_size > machine.num_devices:
        warnings.append(
            f"machine {machine.name} has {machine.num_devices} devices but the schedule has {program.world_size} ranks; "
            f"the {network} network connects every pair of ranks like the machine's own devices"
        )
    makespan = max(raw.end, default=0.0)
    if len(raw.issue_end):
        makespan = max(makespan, max(raw.issue_end))
    tl = build_timeline(program, machine, raw, engine.network.meta()) if timeline else None
    return SimResult(program, machine, network, raw, tl, critical_path(raw), makespan, warnings)


def check_deadlock(program: Program) -> None:
    """Raise `DeadlockError` if `program` cannot finish. Whether it finishes does not
    depend on durations, so this simulates on a timeless machine: fast, and independent
    of machine rates (a missing rate cannot fail a check)."""
    simulate(program, timeless_machine(), timeline=False)


def critical_path(raw: RawResult) -> list[int]:
    """Walk back from the last-finishing op through the dependency that finished last."""
    if not raw.ops:
        return []
    end = raw.end
    last = max(range(len(end)), key=lambda g: (end[g], -g))
    path = [last]
    seen = {last}
    g = raw.cause[last]
    while g >= 0 and g not in seen:
        path.append(g)
        seen.add(g)
        g = raw.cause[g]
    path.reverse()
    return path


def build_timeline(program: Program, machine: Machine, raw: RawResult, network_meta: dict) -> Timeline:
    tl = Timeline(
        "predicted",
        program.name,
        program.world_size,
        meta={
            "params": dict(program.params),
            "machine": machine.to_json(),
            "network": network_meta,
            "streams": list(program.streams),
        },
    )
    group_size = {g.id: len(g.ranks) for g in program.groups}
    spans = tl.spans
    start, end, istart, iend = raw.start, raw.end, raw.issue_start, raw.issue_end
    comm_args_cache: dict[tuple, tuple] = {}
    for g, op in enumerate(raw.ops):
        op_id = op.id
        kind = op.kind.value
        if iend[g] > istart[g]:
            spans.append(Span(op_id, op.rank, HOST_STREAM, SpanRole.ISSUE, kind, _issue_name(op), istart[g], iend[g]))
        if op.kind.is_comm:
            key = (op.kind, op.group, op.size_bytes, op.dtype, op.reduce_op, op.loc.file, op.loc.line, op.name)
            args = comm_args_cache.get(key)
            if args is None:
                args = comm_span_args(op, group_size[op.group]) + (("algo", raw.algos[g]),)
                comm_args_cache[key] = args
            spans.append(Span(op_id, op.rank, COMM_TRACK_PREFIX + op.group, SpanRole.EXEC, kind, _comm_name(op, raw.algos[g]), start[g], end[g], args))
        else:
            track = op.stream if op.kind is not OpKind.WAIT or op.stream != HOST_STREAM else HOST_STREAM
            name = _MEMCPY_NAMES[op.copy_dir] if op.kind is OpKind.COPY else op.name
            spans.append(Span(op_id, op.rank, track, SpanRole.EXEC, kind, name, start[g], end[g], op_span_args(op)))
    partner = raw.partner
    for g, op in enumerate(raw.ops):
        if op.kind is OpKind.SEND and partner[g] >= 0:
            tl.flows.append(Flow(op_id_of(raw, g), op_id_of(raw, partner[g]), "p2p"))
    # Every rank shows its host, every declared stream (even if idle) and its comm queues.
    comm_tracks: dict[int, set[str]] = {}
    for op in raw.ops:
        if op.kind.is_comm:
            comm_tracks.setdefault(op.rank, set()).add(COMM_TRACK_PREFIX + op.group)
    tl.tracks = {
        r: [HOST_STREAM, *program.streams, *sorted(comm_tracks.get(r, ()))] for r in range(program.world_size) if program.ops[r]
    }
    return tl


def op_id_of(raw: RawResult, g: int) -> str:
    return raw.ops[g].id


def _comm_name(op: Op, algo: str) -> str:
    if op.transport is Transport.NCCL:
        protocol = "LL" if op.size_bytes < _SMALL_MESSAGE_BYTES else "Simple"
        # NCCL calls the pipelined chain of broadcast/reduce RING.
        return nccl_kernel_name(op, "ring" if algo == "chain" else algo if op.kind.is_collective else None, protocol)
    if op.transport is Transport.GLOO:
        return f"gloo:{op.kind.value}"
    return "Memcpy PtoP (Device -> Device)"


def _issue_name(op: Op) -> str:
    if op.kind.is_comm:
        return f"{op.transport.value}:{op.kind.value}"
    if op.kind is OpKind.COMPUTE:
        return "cudaLaunchKernel"
    if op.kind is OpKind.COPY:
        return "cudaMemcpyAsync"
    if op.kind is OpKind.RECORD:
        return "cudaEventRecord"
    return "cudaStreamWaitEvent"

