"""`simulate()`: run the engine and turn its per-op arrays into a `Timeline`.

A run pauses Python's cyclic garbage collector (the engine's objects live until the end
and form no cycles; a collection would walk them all, a cost per op that grows with the
program). A sampled run wires the program once, runs it once per sample and keeps each
sample's per-op arrays and network records, not its engine.
"""

from __future__ import annotations

import gc
import random
from contextlib import contextmanager
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from commdsl.dsl.values import format_us
from commdsl.errors import LimitError, MachineError, UsageError
from commdsl.ir import HOST_STREAM, CopyDir, Op, OpKind, Program, Protocol, Transport
from commdsl.limits import HORIZON_US
from commdsl.machine.model import Machine, timeless_machine
from commdsl.sim.deadlock import deadlock_error
from commdsl.sim.engine import Engine
from commdsl.sim.entities import ALGOS, PROTOS, RawResult
from commdsl.sim.memory import check_memory, memory_counters, memory_profile
from commdsl.sim.models import DEFAULT_NETWORK, NETWORKS
from commdsl.sim.network import FlowStat, LinkStat, Network
from commdsl.sim.wiring import Wiring
from commdsl.timeline import (COMM_TRACK_PREFIX, MEMORY_PEAK_META, CounterSample, Flow, Span, SpanRole, Timeline, comm_span_args,
                              gloo_span_name, nccl_kernel_name, op_span_args)

if TYPE_CHECKING:
    from commdsl.sim.summary import Summary

_MEMCPY_NAMES = {
    CopyDir.H2D: "Memcpy HtoD (Pinned -> Device)",
    CopyDir.D2H: "Memcpy DtoH (Device -> Pinned)",
    CopyDir.D2D: "Memcpy DtoD (Device -> Device)",
    CopyDir.PEER: "Memcpy PtoP (Device -> Device)",
}
"""Copy span names as the PyTorch profiler (CUPTI) writes them."""
_PEER_MEMCPY = _MEMCPY_NAMES[CopyDir.PEER]


@dataclass
class SimResult:
    """A simulation's outcome: per-op times (`raw`), the makespan and critical path, the
    network's per-flow and per-link statistics, and the predicted `timeline`."""

    program: Program
    machine: Machine
    network: str
    raw: RawResult
    network_meta: dict
    critical_path: list[int]
    """Global op numbers (see `op_at`) from the first to the last op of the path."""
    makespan_us: float
    warnings: list[str] = field(default_factory=list)
    network_model: Network | None = field(default=None, repr=False)
    """The network that timed the transfers: per-flow and per-link statistics."""
    nominal_us: dict[int, float] = field(default_factory=dict, repr=False)
    """Compute ops (g) slowed by comm kernels (interference): their time without it."""
    sampling: dict = field(default_factory=dict)
    """A sampled simulation's `samples`, `seed` and `sample_makespans_us`; empty otherwise."""
    _timeline: Timeline | None = field(default=None, repr=False)

    def flow_stats(self) -> list[FlowStat]:
        return self.network_model.flow_stats() if self.network_model is not None else []

    def link_stats(self) -> list[LinkStat]:
        return self.network_model.link_stats(self.makespan_us) if self.network_model is not None else []

    def op_at(self, g: int) -> Op:
        return self.raw.ops[g]

    def summary(self) -> Summary:
        """What `commdsl simulate` prints: makespan, per-rank breakdown, bubble fraction,
        critical path, transfers, links."""
        from commdsl.sim.summary import summarize  # it imports this module

        return summarize(self)

    def to_json(self) -> dict:
        """The summary as JSON, as `commdsl simulate --json` prints it."""
        return self.summary().to_json()

    @property
    def timeline(self) -> Timeline:
        """The predicted `Timeline`, built on first use (summaries need only `raw`)."""
        if self._timeline is None:
            self._timeline = build_timeline(self.program, self.machine, self.raw, self.network_meta, self.sampling)
            if self.network_model is not None:
                # Link utilisation as counters in a separate "links" process of the trace.
                tracks: dict[str, str] = {}
                for t, name, v in self.network_model.counter_samples():
                    track = tracks.get(name)
                    if track is None:
                        track = tracks[name] = f"link {name} util"
                    self._timeline.counters.append(CounterSample(track, -1, t, v))
            self._timeline.counters.extend(memory_counters(self.raw))
            peaks = memory_profile(self.raw)
            if peaks:
                self._timeline.meta[MEMORY_PEAK_META] = {str(m.rank): m.peak_bytes for m in peaks}
        return self._timeline


def simulate(program: Program, machine: Machine, network: str = DEFAULT_NETWORK, *, samples: int = 1, seed: int = 0,
             progress: Callable[[int, int], None] | None = None) -> SimResult:  # fmt: skip
    """Simulate `program` on `machine`. Raises `DeadlockError` if it cannot finish and
    `MemoryExceededError` if a rank's declared buffers outgrow its device's memory.
    The timeline is built when `SimResult.timeline` is first read.

    `progress`, if given, hears (ops simulated so far, ops to simulate in all) every few
    thousand events (`Engine.run`); a sampled simulation simulates the program
    `samples` times.

    With `samples` > 1 the machine's random compute stalls (`Machine.compute_noise`) are
    drawn, one independent run per sample (seeds seed, seed + 1, ...), and the result
    holds each op's median start and end over the samples, as `commdsl.run` reports
    each op's median over its iterations: predicted and measured are then the same
    statistic of the same random process. Critical path, flows and links are those of
    the sample whose makespan is the median."""
    with _gc_paused():
        return _simulate(program, machine, network, samples, seed, progress)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, as it was after. The engine
    allocates millions of small objects that live until the end of the run and form no
    garbage cycles; each collection would walk them all (a cost per op growing with the
    program's size)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _simulate(program: Program, machine: Machine, network: str, samples: int, seed: int,
              progress: Callable[[int, int], None] | None) -> SimResult:  # fmt: skip
    if network not in NETWORKS:
        raise UsageError(f"unknown network model '{network}' (known: {', '.join(NETWORKS)})")
    if samples < 1:
        raise UsageError(f"--samples must be at least 1, got {samples}")
    if samples > 1 and machine.compute_noise is None:
        raise UsageError(f"machine {machine.name} has no compute_noise, so every sample would be the same",
                         hint="calibrate the machine (`torchrun -m commdsl.calibrate`) or add compute_noise: {stalls_per_s, stall_us}")  # fmt: skip
    topo = machine.topology
    if topo is not None and program.world_size > topo.num_devices:
        raise MachineError(
            f"machine {machine.name} has {topo.nodes} node(s) x {topo.gpus_per_node} devices = {topo.num_devices}, "
            f"but the schedule has {program.world_size} ranks",
            hint=f"simulate with --nodes {-(-program.world_size // topo.gpus_per_node)}, or set topology.nodes",
        )  # fmt: skip
    warnings = []
    if topo is None and program.world_size > machine.num_devices:
        warnings.append(
            f"machine {machine.name} has {machine.num_devices} devices but the schedule has {program.world_size} ranks; "
            f"the {network} network connects every pair of ranks like the machine's own devices"
        )
    ops = sum(len(rank_ops) for rank_ops in program.ops)

    def run_progress(i: int) -> Callable[[int], None] | None:
        """The engine's callback of the i-th simulation of the program."""
        return None if progress is None else lambda done: progress(i * ops + done, samples * ops)

    if progress is not None:
        progress(0, samples * ops)

    if samples == 1:
        raw, engine = _run(program, machine, network, None, run_progress(0))
        check_memory(raw, machine)
        return SimResult(program, machine, network, raw, engine.network.meta(), critical_path(raw), _makespan(raw), warnings,
                         engine.network, engine.nominal_us)  # fmt: skip
    # Each sample keeps its per-op arrays (41 bytes per op) and its network's flat records,
    # not its engine; the wiring is made once and shared by every sample.
    runs: list[tuple[RawResult, Network, dict[int, float]]] = []
    wiring = None
    for i in range(samples):
        raw, engine = _run(program, machine, network, random.Random(seed + i), run_progress(i), wiring)
        wiring = engine.wiring
        runs.append((raw, engine.network, engine.nominal_us))
        del engine
    makespans = [_makespan(raw) for raw, _, _ in runs]
    # The median sample stands for the run: its causes, flows and links.
    median = sorted(range(samples), key=makespans.__getitem__)[(samples - 1) // 2]
    like, like_network, like_nominal = runs[median]
    columns = [array("d", map(_median, zip(*(getattr(raw, name) for raw, _, _ in runs))))
               for name in ("issue_start", "issue_end", "start", "end")]  # fmt: skip
    raw = RawResult(like.ops, like.base, *columns, like.state, like.cause, like.partner, like.algos, like.protos)
    check_memory(raw, machine)
    sampling = {"samples": samples, "seed": seed, "stat": "median", "sample_makespans_us": [round(m, 3) for m in makespans]}
    return SimResult(program, machine, network, raw, like_network.meta(), critical_path(like), _makespan(raw), warnings,
                     like_network, like_nominal, sampling)  # fmt: skip


def _median(values: tuple[float, ...]) -> float:
    """`statistics.median` (the middle value; of an even count, the mean of the middle
    two), without its per-call overhead: it runs once per op and column."""
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _run(program: Program, machine: Machine, network: str, rng: random.Random | None,
         progress: Callable[[int], None] | None = None, wiring: Wiring | None = None) -> tuple[RawResult, Engine]:  # fmt: skip
    engine = Engine(program, machine, NETWORKS[network], rng, wiring)
    raw = engine.run(progress)
    if engine.unfinished():
        raise deadlock_error(engine)
    check_horizon(raw, machine)
    return raw, engine


def check_horizon(raw: RawResult, machine: Machine) -> None:
    """Refuse a simulation whose ops end past `HORIZON_US`, naming the first op that does
    (every value is bounded where it is given, so times stay finite, but a 1024TiB transfer
    over a 1 MB/s link still ends decades later, where times lose their nanoseconds)."""
    if max(raw.end, default=0.0) <= HORIZON_US and max(raw.issue_end, default=0.0) <= HORIZON_US:
        return
    late = min((g for g in range(len(raw.ops)) if max(raw.end[g], raw.issue_end[g]) > HORIZON_US),
               key=lambda g: max(raw.end[g], raw.issue_end[g]))  # fmt: skip
    op, start, end = raw.ops[late], raw.start[late], max(raw.end[late], raw.issue_end[late])
    raise LimitError(
        f"{op.kind.value} {op.name} (op {op.id}) ends at {format_us(end)} on machine {machine.name}, past the simulator's "
        f"horizon of {format_us(HORIZON_US)} (it runs {format_us(end - start)} from its start)",
        op.loc, rank=op.rank,
        hint="use smaller sizes or durations, or a machine with faster rates; see docs/limits.md",
    )  # fmt: skip


def _makespan(raw: RawResult) -> float:
    makespan = max(raw.end, default=0.0)
    if len(raw.issue_end):
        makespan = max(makespan, max(raw.issue_end))
    return makespan


def check_deadlock(program: Program, progress: Callable[[int, int], None] | None = None) -> None:
    """Raise `DeadlockError` if `program` cannot finish. Whether it finishes does not
    depend on durations, so this simulates on a timeless machine with the analytic
    network: fast, and independent of machine rates (a missing rate cannot fail a check).
    `progress` as `simulate`'s."""
    simulate(program, timeless_machine(), "analytic", progress=progress)


def critical_path(raw: RawResult) -> list[int]:
    """Walk back from the last-finishing op through the dependency that finished last."""
    if not raw.ops:
        return []
    end = raw.end
    last = end.index(max(end))  # the lowest g among those that end last
    path = [last]
    seen = {last}
    g = raw.cause[last]
    while g >= 0 and g not in seen:
        path.append(g)
        seen.add(g)
        g = raw.cause[g]
    path.reverse()
    return path


def build_timeline(program: Program, machine: Machine, raw: RawResult, network_meta: dict, sampling: dict | None = None) -> Timeline:
    tl = Timeline(
        "predicted",
        program.name,
        program.world_size,
        meta={
            "params": dict(program.params),
            "machine": machine.to_json(),
            "network": network_meta,
            "streams": list(program.streams),
            **(sampling or {}),
        },
    )
    group_size = {g.id: len(g.ranks) for g in program.groups}
    spans = tl.spans
    start, end, istart, iend, algos, protos = raw.start, raw.end, raw.issue_start, raw.issue_end, raw.algos, raw.protos
    # Names and annotations repeat across ranks and iterations: build each once (this
    # keeps the timeline within a few hundred bytes per op).
    kind_value = {k: k.value for k in OpKind}
    issue_names: dict[tuple, str] = {}
    args_cache: dict[tuple, tuple] = {}
    exec_role, issue_role = SpanRole.EXEC, SpanRole.ISSUE
    for g, op in enumerate(raw.ops):
        op_id = op.id
        kind = op.kind
        is_comm = kind in _COMM_KINDS and op.transport is not Transport.MEMCPY  # memcpy runs on its stream
        if iend[g] > istart[g]:
            key = (kind, op.transport, op.copy_dir)
            name = issue_names.get(key)
            if name is None:
                name = issue_names[key] = _issue_name(op)
            spans.append(Span(op_id, op.rank, HOST_STREAM, issue_role, kind_value[kind], name, istart[g], iend[g]))
        if is_comm:
            algo = ALGOS[algos[g]].value
            proto = PROTOS[protos[g]]
            # dtype, reduce op, transport and algo are fixed per statement (its loc).
            key = (id(op.loc), op.name, op.size_bytes, op.group, op.dtype, algo, proto)
            cached = args_cache.get(key)
            if cached is None:
                extra = (("algo", algo),) if proto is None else (("algo", algo), ("proto", proto.value))
                cached = args_cache[key] = (_comm_name(op, algo, proto), comm_span_args(op, group_size[op.group]) + extra)
            name, args = cached
            track = COMM_TRACK_PREFIX + op.group
        else:
            track = HOST_STREAM if kind is OpKind.WAIT and op.stream == HOST_STREAM else op.stream
            key = (id(op.loc), op.name, op.size_bytes, op.flops, kind)
            cached = args_cache.get(key)
            if cached is None:
                if kind is OpKind.COPY:
                    cached = (_MEMCPY_NAMES[op.copy_dir], op_span_args(op))
                elif kind in _COMM_KINDS:  # a memcpy send or recv
                    cached = (_PEER_MEMCPY, comm_span_args(op, group_size[op.group]))
                else:
                    cached = (op.name, op_span_args(op))
                args_cache[key] = cached
            name, args = cached
        spans.append(Span(op_id, op.rank, track, exec_role, kind_value[kind], name, start[g], end[g], args))
    partner = raw.partner
    for g, op in enumerate(raw.ops):
        if op.kind is OpKind.SEND and partner[g] >= 0:
            tl.flows.append(Flow(op.id, raw.ops[partner[g]].id, "p2p"))
    # Every rank shows its host, every declared stream (even if idle) and its comm queues.
    comm_tracks: dict[int, set[str]] = {}
    for op in raw.ops:
        if op.kind in _COMM_KINDS and op.transport is not Transport.MEMCPY:
            comm_tracks.setdefault(op.rank, set()).add(COMM_TRACK_PREFIX + op.group)
    tl.tracks = {
        r: [HOST_STREAM, *program.streams, *sorted(comm_tracks.get(r, ()))] for r in range(program.world_size) if program.ops[r]
    }
    return tl


_COMM_KINDS = frozenset(k for k in OpKind if k.is_comm)


def _comm_name(op: Op, algo: str, proto: Protocol | None) -> str:
    if op.transport is Transport.NCCL:
        # The protocol NCCL's model chose; without a model, the LL of the kernels NCCL
        # (2.19 and later) compiles for every collective and runs every protocol in.
        protocol = proto.value.upper() if proto is not None else "LL"
        # NCCL calls the pipelined chain of broadcast/reduce RING.
        return nccl_kernel_name(op, "ring" if algo == "chain" else algo if op.kind.is_collective else None, protocol)
    if op.transport is Transport.GLOO:
        return gloo_span_name(op)
    return _PEER_MEMCPY


def _issue_name(op: Op) -> str:
    if op.kind.is_comm:
        return f"{op.transport.value}:{op.kind.value}"
    if op.kind is OpKind.COMPUTE:
        return "cudaLaunchKernel"
    if op.kind is OpKind.COPY:
        return "cudaMemcpyPeerAsync" if op.copy_dir is CopyDir.PEER else "cudaMemcpyAsync"
    if op.kind is OpKind.RECORD:
        return "cudaEventRecord"
    return "cudaStreamWaitEvent"

