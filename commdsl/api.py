"""The Python API: what the command line does, as functions.

    import commdsl

    program = commdsl.load("1f1b", stages=8, microbatches=32)   # a path or a bundled name
    result = commdsl.simulate(program, machine="dgx-h100")
    print(result.makespan_us, result.summary().bubble_fraction)
    result.timeline.write("predicted.json")                      # Chrome trace for Perfetto

    measured = commdsl.read_timeline("measured.json")            # from `commdsl run`
    cmp = commdsl.compare(result, measured)
    print(f"{cmp.makespan_error_pct:+.1f}%")

Every function raises a `commdsl.CommdslError` (with file, line and column where there
is one) on bad input, as the command line prints it. Results are dataclasses with
`to_json()`, the same JSON the command line's `--json` prints. None of this imports
torch: running a schedule for real is `commdsl run` (or `torchrun -m commdsl.run`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from collections.abc import Mapping
from typing import TYPE_CHECKING

from commdsl.arguments import describe, is_amount, path_text, whole_number
from commdsl.errors import UsageError

if TYPE_CHECKING:  # the heavy modules load on first use, so `import commdsl` stays light
    from commdsl.comparison import Comparison
    from commdsl.ir import Program
    from commdsl.machine.model import Machine
    from commdsl.sim.simulate import SimResult
    from commdsl.timeline import Timeline

PathLike = str | os.PathLike


def load(schedule: PathLike, params: Mapping[str, object] | None = None, /, *, max_ops: int | None = None,
         validate: bool = True, **kw_params: object) -> Program:  # fmt: skip
    """Load a schedule (a file, or the name of a bundled schedule) and expand it for every
    rank. Params override the schedule's, as `-p key=value` does: give them as keywords
    (`stages=8`, `act="64MiB"`) or as a mapping; values are written as in the schedule
    (numbers, or strings with units). `validate` runs the cross-rank checks (send/recv
    matching, collective order) that every command runs."""
    from commdsl.dsl import DEFAULT_MAX_OPS, load_schedule

    text = path_text("load", "schedule", schedule, "a schedule file or the name of a bundled schedule")
    if params is not None and not isinstance(params, Mapping):
        raise UsageError(f"load: params must be a mapping of param names to values (or keywords), got {describe(params)}")
    max_ops = DEFAULT_MAX_OPS if max_ops is None else whole_number("max_ops", max_ops)
    merged = {**(params or {}), **kw_params}
    overrides = {str(k): _param_text(v) for k, v in merged.items()}
    return load_schedule(text, overrides, max_ops=max_ops, validate=validate, overrides_from="load")


def load_machine(name: PathLike | None = None, *, nodes: int | None = None) -> Machine:
    """A machine: a preset name (`dgx-h100`; None: the default preset) or a machine file
    (from `commdsl calibrate`); `nodes` makes a cluster of a machine with a topology.
    Machines are immutable, so a repeated call returns the machine already loaded (a
    file's is loaded again once it changes): a planner that simulates thousands of
    candidates by machine name loads each machine once."""
    text = None if name is None else path_text("load_machine", "name", name, "a preset name or a machine file (or None)")
    nodes = None if nodes is None else whole_number("nodes", nodes)
    try:
        stat = os.stat(text) if text is not None else None
        stamp = (stat.st_mtime_ns, stat.st_size) if stat is not None else None
    except OSError:
        stamp = None  # a preset name, or no such file (resolve_machine says so)
    return _cached_machine(text, nodes, stamp)


@functools.lru_cache(maxsize=64)
def _cached_machine(name: str | None, nodes: int | None, stamp: tuple[int, int] | None) -> Machine:
    """`resolve_machine(name, nodes=nodes)`, once per (name, nodes, file's mtime and size)."""
    from commdsl.machine import resolve_machine

    return resolve_machine(name, nodes=nodes)


def simulate(program: Program | PathLike, machine: Machine | PathLike | None = None, network: str = "flow", *,
             nodes: int | None = None, samples: int = 1, seed: int = 0) -> SimResult:  # fmt: skip
    """Predict a program's timeline (`commdsl simulate`). `program` may also be a schedule
    path or bundled name, loaded with its own params. `machine` is a `Machine`, a preset
    name or a machine file (None: the default preset); `network` is `flow` (links shared
    max-min), `analytic` (no contention) or `flow-steps`. `samples` > 1 draws a calibrated
    CPU machine's noise and reports per-op medians. Raises `DeadlockError` (with every
    stuck rank's op and source line) if the program cannot finish."""
    from commdsl.ir import Program
    from commdsl.machine.model import Machine
    from commdsl.sim import simulate as run_simulation

    samples = whole_number("samples", samples)
    if not isinstance(program, Program):
        if callable(getattr(program, "build", None)):
            raise UsageError(f"simulate: program must be a Program, a schedule file or a bundled schedule's name, got {describe(program)}",
                             hint="call its .build() to get the Program")  # fmt: skip
        program = load(path_text("simulate", "program", program, "a Program, a schedule file or a bundled schedule's name"))
    if not isinstance(machine, Machine):
        if machine is not None:
            path_text("simulate", "machine", machine, "a Machine, a preset name or a machine file (or None)")
        machine = load_machine(machine, nodes=nodes)
    elif nodes is not None:
        machine = machine.with_nodes(nodes)
    return run_simulation(program, machine, network, samples=samples, seed=seed)


@dataclass(frozen=True)
class Metrics:
    """What a planner compares candidates by, as plain values (from `SimResult.summary()`)."""

    makespan_us: float
    """From the first op's start to the last op's end."""
    bubble_fraction: float | None
    """Mean over the ranks that compute of the idle fraction of their compute streams;
    None when no rank computes."""
    exposed_comm_us: tuple[float, ...]
    """Per rank, communication time not overlapped by its compute."""
    peak_memory_bytes: tuple[int, ...]
    """Per rank, its peak of declared buffers (`alloc`/`free`); zeros where none are declared."""
    compute_us: tuple[float, ...]
    """Per rank, time covered by its compute ops."""

    @property
    def max_peak_memory_bytes(self) -> int:
        """The largest rank's peak: what must fit in one device."""
        return max(self.peak_memory_bytes, default=0)

    @property
    def max_exposed_comm_us(self) -> float:
        return max(self.exposed_comm_us, default=0.0)


def metrics(result: SimResult) -> Metrics:
    """Makespan, bubble fraction, exposed communication and peak memory per rank of a
    simulation, as plain values: the summary's (`SimResult.summary()`) per-rank figures
    and memory peaks, without the parts a planner's loop does not read (links,
    transfers, critical path), which cost it more than these."""
    from commdsl.sim.folding import unfolded
    from commdsl.sim.memory import memory_profile
    from commdsl.sim.result import SimOutcome
    from commdsl.sim.summary import _rank_summaries

    if not isinstance(result, SimOutcome):
        raise UsageError(f"metrics takes a simulation's result (the SimResult that commdsl.simulate returns), got {describe(result)}")
    program = result.program
    ranks = unfolded(tuple(_rank_summaries(result)), program)  # folded: every rank's, as the summary's
    bubbles = [r.bubble_fraction for r in ranks if r.bubble_fraction is not None]
    peaks = [0] * program.world_size
    for m in unfolded(memory_profile(result.raw), program):
        peaks[m.rank] = m.peak_bytes
    return Metrics(
        makespan_us=result.makespan_us,
        bubble_fraction=sum(bubbles) / len(bubbles) if bubbles else None,  # as the summary's
        exposed_comm_us=tuple(r.exposed_comm_us for r in ranks),
        peak_memory_bytes=tuple(peaks),
        compute_us=tuple(r.compute_us for r in ranks),
    )


def read_timeline(path: PathLike) -> Timeline:
    """A timeline written by `commdsl simulate --trace` or `commdsl run --out`."""
    from commdsl.timeline import Timeline

    return Timeline.read(path_text("read_timeline", "path", path, "a timeline file"))


def compare(predicted: SimResult | Timeline | PathLike, measured: Timeline | PathLike, *,
            min_duration_us: float = 10.0) -> Comparison:  # fmt: skip
    """Compare a prediction with a measurement op by op (`commdsl compare`): makespan
    error, per-op start and duration errors, per-rank breakdowns. Ops pair by identity
    (rank and index), never by timestamp. Ops shorter than `min_duration_us` (measured)
    are left out of the duration-error percentages."""
    from commdsl.sim.simulate import SimResult
    from commdsl.timeline import Timeline

    if isinstance(predicted, SimResult):
        predicted = predicted.timeline
    if not isinstance(predicted, Timeline):
        predicted = path_text("compare", "predicted", predicted, "a SimResult, a Timeline or a timeline file")
    if isinstance(measured, SimResult):
        raise UsageError("compare: measured must be a Timeline or a timeline file, got a SimResult",
                         hint="a simulation's result is a prediction: give it as `predicted`, or its `.timeline` as `measured`")  # fmt: skip
    if not isinstance(measured, Timeline):
        measured = path_text("compare", "measured", measured, "a Timeline or a timeline file")
    if not is_amount(min_duration_us):
        raise UsageError(f"compare: min_duration_us must be a number of microseconds from 0, got {describe(min_duration_us)}")
    pred, pred_name = (predicted, "predicted") if isinstance(predicted, Timeline) else (read_timeline(predicted), predicted)
    meas, meas_name = (measured, "measured") if isinstance(measured, Timeline) else (read_timeline(measured), measured)
    return compare_named(pred, meas, pred_name, meas_name, min_duration_us)


def compare_named(predicted: Timeline, measured: Timeline, predicted_name: str, measured_name: str,
                  min_duration_us: float = 10.0) -> Comparison:  # fmt: skip
    """`compare` of two timelines that messages call by these names (their files)."""
    from commdsl.comparison import compare_timelines, unfolded
    from commdsl.errors import UsageError

    predicted = unfolded(predicted)  # a folded program's representatives stand for every replica
    if predicted.world_size != measured.world_size:
        raise UsageError(f"the timelines have different world sizes: {predicted.world_size} ({predicted_name}) "
                         f"vs {measured.world_size} ({measured_name})")  # fmt: skip
    if predicted.schedule != measured.schedule:
        raise UsageError(f"the timelines are of different schedules: '{predicted.schedule}' ({predicted_name}) "
                         f"vs '{measured.schedule}' ({measured_name})")  # fmt: skip
    # A run's timeline holds a span of every rank with ops: one missing would show as a
    # rank that did no work. (A hung run's partial timeline may hold no span of a rank that
    # started no op: its ops are listed as unpaired.)
    if measured.source == "measured" and not measured.meta.get("partial"):
        lost = sorted({s.rank for s in predicted.spans} - {s.rank for s in measured.spans})
        if lost:
            shown = ", ".join(map(str, lost[:8])) + (", ..." if len(lost) > 8 else "")
            raise UsageError(f"{measured_name} holds no span of rank(s) {shown}, which have ops in {predicted_name}: "
                             "the run's timeline is missing ranks", hint="`torchrun -m commdsl.run --out` writes every rank's ops")  # fmt: skip
    cmp = compare_timelines(predicted, measured, min_duration_us=min_duration_us)
    if not cmp.ops:
        raise UsageError("the timelines have no op in common (are they of the same schedule and params?)")
    return cmp


def _param_text(value: object) -> str:
    """A param value as the schedule language reads it (`True` -> `true`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
