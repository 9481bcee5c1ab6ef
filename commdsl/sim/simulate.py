"""`simulate()`: run the engine and turn its per-op arrays into a `Timeline`.

A run pauses Python's cyclic garbage collector (the engine's many small objects live
until the end of the run; a collection would walk them all, a cost per op that grows with
the program). A sampled run wires the program once, runs it once per sample and keeps each
sample's time columns, and its other per-op arrays and network records while it can
still be the median sample; not its engine. A run without samples starts from the
wiring and hosts' first pass the same program's last run on the machine left
(`_run_reusing`).
"""

from __future__ import annotations

import gc
import random
import weakref
from bisect import insort
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from commdsl.dsl.values import format_us
from commdsl.arguments import whole_number
from commdsl.errors import LimitError, MachineError, UsageError
from commdsl.ir import Program
from commdsl.limits import HORIZON_US
from commdsl.machine.model import Machine, timeless_machine
from commdsl.sim.collector import frozen, gc_paused
from commdsl.sim.engine import Engine, Issued
from commdsl.sim.entities import RawResult
from commdsl.sim.folding import approximate, inexact
from commdsl.sim.medians import medians
from commdsl.sim.memory import check_memory
from commdsl.sim.models import DEFAULT_NETWORK, NETWORKS, check_network
from commdsl.sim.network import Network
from commdsl.sim.result import SimOutcome
from commdsl.sim.shape_memo import shape_table
from commdsl.sim.wiring import Wiring

if TYPE_CHECKING:
    from commdsl.sim.summary import Summary
    from commdsl.timeline import Timeline

REUSE_MAX_OPS = 1 << 17
"""The largest program (in ops) whose wiring and hosts' first pass a run leaves for the
same program's next run (`_run_reusing`): about 70 bytes an op, kept as long as the
program lives, pay where a call's fixed costs matter (a planner's inner loop), not
where the run itself dwarfs them."""

# The outputs' modules (summary, trace) import `SimOutcome`, never this module: they load
# where an output is first asked for, as `check_deadlock` needs none of them.


@dataclass(frozen=True)
class SimResult(SimOutcome):
    """A simulation's outcome (`SimOutcome`) with its outputs: the summary, the predicted
    `timeline`, the Chrome trace. Frozen, as its outputs are made from it (and the
    timeline is kept once built): a changed field would leave them disagreeing."""

    _timeline: Timeline | None = field(default=None, repr=False)

    def summary(self) -> Summary:
        """What `commdsl simulate` prints: makespan, per-rank breakdown, bubble fraction,
        critical path, transfers, links."""
        from commdsl.sim.summary import summarize

        return summarize(self)

    def to_json(self) -> dict:
        """The summary as JSON, as `commdsl simulate --json` prints it."""
        return self.summary().to_json()

    @property
    def timeline(self) -> Timeline:
        """The predicted `Timeline`, built on first use (summaries need only `raw`)."""
        if self._timeline is None:
            from commdsl.sim.trace import predicted_timeline

            object.__setattr__(self, "_timeline", predicted_timeline(self))  # a cache, not a field a caller sets
        return self._timeline

    def write_trace(self, path: str | Path, flag: str = "--trace", progress: Callable[[int, int], None] | None = None) -> None:
        """Write the predicted timeline as a Chrome trace, streamed from the per-op arrays
        (the same bytes as `timeline.write(path, program.streams)`, without the timeline
        in memory); `flag` names the file in a usage error; `progress` hears (spans
        written, spans in all) as it goes."""
        from commdsl.sim.trace import write_trace

        write_trace(self, path, flag, progress)


def simulate(program: Program, machine: Machine, network: str = DEFAULT_NETWORK, *, samples: int = 1, seed: int = 0,
             progress: Callable[[int, int], None] | None = None, fold: bool = True) -> SimResult:  # fmt: skip
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
    the sample whose makespan is the median.

    `fold`: where every rank runs the same ops and nothing tells them apart, simulate rank
    0 alone and copy its timeline to the others (`commdsl.sim.symmetry`: the same result,
    in a fraction of the time); False simulates every rank."""
    with gc_paused():
        return _simulate(program, machine, network, samples, seed, progress, fold)


def _simulate(program: Program, machine: Machine, network: str, samples: int, seed: int,
              progress: Callable[[int, int], None] | None, fold: bool) -> SimResult:  # fmt: skip
    check_network(network)
    samples = whole_number("--samples", samples)
    if (why := inexact(program, machine, network, samples)) is not None:
        hint, topo = "load it with fold=False", machine.topology
        if topo is not None and program.fold.stride % topo.gpus_per_node:
            hint += f", or with fold_unit={topo.gpus_per_node} (each folded copy on nodes of its own)"
        raise UsageError(f"{program.name} is folded along {program.fold.axis}, but simulated folded it would not be what a "
                         f"run of every rank gives: {why}", hint=hint)  # fmt: skip
    if samples > 1 and machine.compute_noise is None:
        raise UsageError(f"machine {machine.name} has no compute_noise, so every sample would be the same",
                         hint="calibrate the machine (`torchrun -m commdsl.calibrate`) or add compute_noise: {stalls_per_s, stall_us}")  # fmt: skip
    topo = machine.topology
    if topo is not None and program.world_size > topo.num_devices:
        raise MachineError(
            f"machine {machine.name} has {topo.nodes} node(s) x {topo.gpus_per_node} devices = {topo.num_devices}, "
            f"but the schedule has {program.world_size} ranks",
            hint=(f"simulate with --nodes {-(-program.world_size // topo.gpus_per_node)}, or set topology.nodes" if topo.networked
                  else "use a machine with as many devices, or one whose nodes have NICs (docs/machines.md)"),
        )  # fmt: skip
    warnings = []
    if (why := approximate(program, machine, network)) is not None:
        warnings.append(f"folded along {program.fold.axis}: {why}")
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
        if ops <= REUSE_MAX_OPS:
            raw, engine, makespan = _run_reusing(program, machine, network, run_progress(0), fold)
        else:
            raw, engine, makespan = _run(program, machine, network, None, run_progress(0), fold=fold)
        check_memory(raw, machine)
        return SimResult(program, machine, network, raw, engine.network.meta(), critical_path(raw), makespan, warnings,
                         engine.network, engine.nominal_us)  # fmt: skip
    # Each sample keeps its four time columns (32 bytes per op); while it can still be the
    # median sample, also the rest of its per-op arrays and its network's flat records,
    # not its engine. The wiring is made once and shared by every sample, and so is the
    # hosts' first pass where no host blocks in it (`Engine.issued`).
    times: list[tuple[array, array, array, array]] = []
    kept: dict[int, tuple[RawResult, Network, dict[int, float]]] = {}
    ranked: list[tuple[float, int]] = []  # (makespan, sample), sorted: the order that picks the median
    makespans: list[float] = []
    wiring = issued = None
    # A network out of the running, like each finished engine, is a reference cycle: only
    # a collection frees it. Frozen, the objects made before (the program's) are left out
    # of collections, which then walk what the samples made: a few objects per entity and
    # transfer shape, not per op.
    with frozen():
        for i in range(samples):
            raw, engine, makespan = _run(program, machine, network, random.Random(seed + i), run_progress(i), wiring, fold, issued)
            wiring, issued = engine.wiring, engine.issued
            times.append((raw.issue_start, raw.issue_end, raw.start, raw.end))
            kept[i] = (raw, engine.network, engine.nominal_us)
            makespans.append(makespan)
            del engine, raw
            insort(ranked, (makespan, i))
            dropped = [kept.pop(j) for j in out_of_the_running(ranked, samples) if j in kept]
            if dropped:
                del dropped
                gc.collect()
    # The median sample stands for the run: its causes, flows and links.
    like, like_network, like_nominal = kept[ranked[(samples - 1) // 2][1]]
    columns = [medians(list(column)) for column in zip(*times)]
    raw = RawResult(like.ops, like.base, *columns, like.state, like.cause, like.partner, like.algos, like.protos, like.kinds)
    check_memory(raw, machine)
    sampling = {"samples": samples, "seed": seed, "stat": "median", "sample_makespans_us": [round(m, 3) for m in makespans]}
    return SimResult(program, machine, network, raw, like_network.meta(), critical_path(like), _makespan(raw), warnings,
                     like_network, like_nominal, sampling)  # fmt: skip


def out_of_the_running(ranked: list[tuple[float, int]], samples: int) -> list[int]:
    """The samples run so far that can no longer be the median of `samples`: `ranked` holds
    them as (makespan, number), sorted, the order whose middle entry is the median sample
    once all have run. One at place r there ends at r or later, by at most the number of
    samples still to run (those come after it on a tie: their numbers are higher)."""
    middle, left = (samples - 1) // 2, samples - len(ranked)
    return [i for r, (_, i) in enumerate(ranked) if r > middle or r + left < middle]


def _run(program: Program, machine: Machine, network: str, rng: random.Random | None,
         progress: Callable[[int], None] | None = None, wiring: Wiring | None = None, fold: bool = True,
         issued: Issued | None = None, keep_issued: bool = False) -> tuple[RawResult, Engine, float]:  # fmt: skip
    """One run of the engine (with `rng`, one sample): its per-op arrays, the engine and
    the makespan. `wiring` and `issued` as `Engine`'s; a sampled run (`rng`), or one with
    `keep_issued`, keeps its hosts' pass for the next run."""
    engine = Engine(program, machine, NETWORKS[network], rng, wiring, fold, issued, keep_issued=keep_issued or rng is not None)
    raw = engine.run(progress)
    if engine.folded and engine.unfinished():
        # Rank 0 alone could not finish: run every rank, for the deadlock report's sake.
        engine = Engine(program, machine, NETWORKS[network], rng, engine.wiring, fold=False)
        raw = engine.run(progress)
    if engine.unfinished():
        from commdsl.sim.deadlock import deadlock_error  # only a schedule that cannot finish needs it

        raise deadlock_error(engine)
    return raw, engine, check_horizon(raw, machine)


def _run_reusing(program: Program, machine: Machine, network: str, progress: Callable[[int], None] | None,
                 fold: bool) -> tuple[RawResult, Engine, float]:  # fmt: skip
    """`_run` without a sample's draws, starting from the `Wiring` and hosts' first pass
    (`Issued`) an earlier run of the same program on this machine left, and leaving its
    own for the next. A program is immutable (its ops are tuples of immutable ops), so
    what follows from the program, the machine, the network model and `fold` alone stays
    true for as long as the program lives: the entry is keyed by the program's identity,
    holds it weakly, and is dropped when the program is freed. It is taken out of the
    table while the run uses it (its queues and collective instances are reset and
    filled by the run), so a run on another thread at the same time wires its own."""
    table = shape_table(machine, ("wirings",))
    key = (id(program), network, fold)
    held = table.pop(key, None)
    wiring = issued = None
    if held is not None and held[0]() is program:
        _, wiring, issued = held
    raw, engine, makespan = _run(program, machine, network, None, progress, wiring, fold, issued, keep_issued=True)
    table[key] = (weakref.ref(program, lambda _, table=table, key=key: table.pop(key, None)), engine.wiring, engine.issued)
    return raw, engine, makespan


def check_horizon(raw: RawResult, machine: Machine) -> float:
    """Refuse a simulation whose ops end past `HORIZON_US`, naming the first op that does
    (every value is bounded where it is given, so times stay finite, but a 1024TiB transfer
    over a 1 MB/s link still ends decades later, where times lose their nanoseconds); else
    return its makespan (`_makespan`)."""
    makespan = _makespan(raw)
    if makespan <= HORIZON_US:
        return makespan
    late = min((g for g in range(len(raw.ops)) if max(raw.end[g], raw.issue_end[g]) > HORIZON_US),
               key=lambda g: max(raw.end[g], raw.issue_end[g]))  # fmt: skip
    op, start, end = raw.ops[late], raw.start[late], max(raw.end[late], raw.issue_end[late])
    raise LimitError(
        f"{op.label} (op {op.id}) ends at {format_us(end)} on machine {machine.name}, past the simulator's "
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
