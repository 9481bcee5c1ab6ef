"""Sweeps: simulate every combination of schedules, params, machines and node counts.

(The module is `sweeps`, not `sweep`: `commdsl.sweep` is its function, and a submodule
of that name would replace the function on the package once imported.)

    rows = commdsl.sweep(["1f1b", "gpipe"], {"stages": "2,4,8", "microbatches": "8:64:x2"},
                         machines=["dgx-h100", "dgx-a100"], nodes=[1, 2], jobs=2)
    best = best_rows(rows, Objective.MAKESPAN, max_memory_bytes=80 << 30)

A param's values are a list (`2,4,8`, `16MiB,32MiB`), a range with a step (`2:8:2`, both
ends included) or a range with a factor (`8:64:x2`). Points run in worker processes
(`concurrent.futures.ProcessPoolExecutor`) or as Ray tasks (`executor="ray"`); each
point's schedule text and machine travel with it, so a worker reads no file. A point
that fails (an `assert` of the schedule, a deadlock, a rank out of memory, a limit) is a
row with its error, never the end of the sweep. Everything a user can get wrong in the
sweep itself (a schedule that is no schedule, an unknown param, an empty range, too many
points, an unknown machine, an unwritable output) is one `UsageError` before any point runs.
"""

from __future__ import annotations

import csv
import decimal
import enum
import html
import io
import itertools
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path

from commdsl.arguments import describe, is_amount, member, path_text, whole_number
from commdsl.errors import CommdslError, UsageError, did_you_mean
from commdsl.files import check_output_path
from commdsl.limits import DEFAULT_MAX_OPS, MAX_SWEEP_POINTS

MAX_JOBS = 1024
"""Most worker processes (or CPUs of a local Ray instance) a sweep starts: more than one
machine's CPUs, and the same bound on every machine."""


class Objective(str, enum.Enum):
    """What "best" means: the smallest value of this over the points that succeed (and
    fit the memory cap, where one is given)."""

    MAKESPAN = "makespan"
    BUBBLE = "bubble"
    EXPOSED_COMM = "exposed_comm"
    """The largest rank's exposed communication."""
    PEAK_MEMORY = "peak_memory"
    """The largest rank's peak of declared memory."""


class Executor(str, enum.Enum):
    LOCAL = "local"
    """Worker processes on this machine."""
    RAY = "ray"
    """Ray tasks on an existing Ray cluster (`address`) or a local one."""


@dataclass(frozen=True)
class Point:
    """One combination to simulate."""

    schedule: str
    """The schedule as the user named it."""
    params: tuple[tuple[str, str], ...]
    machine: str
    nodes: int | None


@dataclass(frozen=True)
class Row:
    """One point's outcome: its metrics, or the error that ended it."""

    schedule: str
    params: dict[str, str]
    machine: str
    nodes: int | None
    world_size: int | None = None
    num_ops: int | None = None
    makespan_us: float | None = None
    bubble_fraction: float | None = None
    exposed_comm_us: float | None = None
    """The largest rank's exposed communication."""
    peak_memory_bytes: int | None = None
    """The largest rank's peak of declared memory."""
    exposed_comm_us_per_rank: tuple[float, ...] = ()
    peak_memory_bytes_per_rank: tuple[int, ...] = ()
    error: str | None = None
    """The failure's message (its first line), None for a point that succeeded."""
    error_kind: str | None = None
    """The failure's class: ScheduleError, DeadlockError, MemoryExceededError, ..."""
    cpu_s: float = 0.0
    """CPU time of the point in its worker: load, simulate, summarise."""

    @property
    def ok(self) -> bool:
        return self.error is None

    def value(self, objective: Objective) -> float:
        """The point's value of `objective` (a failed point: infinity)."""
        if not self.ok:
            return math.inf
        value = {Objective.MAKESPAN: self.makespan_us, Objective.BUBBLE: self.bubble_fraction,
                 Objective.EXPOSED_COMM: self.exposed_comm_us, Objective.PEAK_MEMORY: self.peak_memory_bytes}[objective]  # fmt: skip
        return math.inf if value is None else float(value)

    def to_json(self) -> dict:
        out = asdict(self)
        out["exposed_comm_us_per_rank"] = list(self.exposed_comm_us_per_rank)
        out["peak_memory_bytes_per_rank"] = list(self.peak_memory_bytes_per_rank)
        return out


@dataclass(frozen=True)
class _Task:
    """What a worker needs for its points: each schedule's text and each machine, so it
    reads no file (a Ray node need not share this machine's files)."""

    schedules: dict[str, tuple[str, str]]
    """Schedule as named -> (display name, YAML text)."""
    machines: dict[tuple[str, int | None], object]
    """(machine, nodes) -> `Machine`."""
    network: str
    max_ops: int
    points: tuple[Point, ...] = field(default=())


# ---- the grammar of values -----------------------------------------------------------

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_BOUND = re.compile(rf"\s*({_NUMBER})\s*([A-Za-z]*)\s*")
_FACTOR = re.compile(rf"\s*x\s*({_NUMBER})\s*")


def parse_values(name: str, text: str) -> tuple[str, ...]:
    """The values of `-p NAME=TEXT`: a list (`2,4,8`), a range with a step (`a:b:step`)
    or a factor (`a:b:xF`), both ends included, its bounds plain numbers or numbers with
    one unit (`1MiB:8MiB:x2`, `1ms:4ms:1ms`); each value as the schedule reads it."""
    from commdsl.dsl.values import INT_LIMIT

    text = str(text).strip()
    flag = f"-p {name}={text}"
    if ":" in text:
        parts = text.split(":")
        start_m, stop_m = (_BOUND.fullmatch(p) for p in parts[:2]) if len(parts) == 3 else (None, None)
        factor_m = _FACTOR.fullmatch(parts[2]) if len(parts) == 3 else None
        step_m = _BOUND.fullmatch(parts[2]) if len(parts) == 3 and factor_m is None else None
        if start_m is None or stop_m is None or (factor_m is None and step_m is None):
            raise UsageError(f"{flag}: a range is START:STOP:STEP or START:STOP:xFACTOR, e.g. 2:8:2, 8:64:x2 or 1MiB:8MiB:x2")
        unit = start_m.group(2)
        units = {unit, stop_m.group(2)} | ({step_m.group(2)} if step_m else set())
        if len(units) > 1:
            raise UsageError(f"{flag}: the range's bounds{'' if factor_m else ' and step'} take one unit, got "
                             + ", ".join(sorted(u or "none" for u in units)))  # fmt: skip
        numbers = [start_m.group(1), stop_m.group(1), (factor_m or step_m).group(1)]
        integral = all(re.fullmatch(r"[-+]?\d+", x) for x in numbers)
        for x in numbers:  # integers step exactly (as ints), other numbers as floats
            if integral and abs(float(x)) >= INT_LIMIT:
                raise UsageError(f"{flag}: {_clip(x)} is too large (the limit is 2**63)")
            if not math.isfinite(float(x)):
                raise UsageError(f"{flag}: {_clip(x)} is too large for a number (the limit is about 1.8e308)")
        # (via Decimal: int() refuses a text of more than 4,300 digits, leading zeros too)
        start, stop, step = (int(decimal.Decimal(x)) if integral else float(x) for x in numbers)
        factor = factor_m is not None
        if factor and step <= 1:
            raise UsageError(f"{flag}: the factor must be more than 1, got x{numbers[2]}")
        if factor and start <= 0:
            raise UsageError(f"{flag}: a range with a factor starts above 0, got {parts[0].strip()}")
        if not factor and step <= 0:
            raise UsageError(f"{flag}: the step must be more than 0, got {parts[2].strip()}")
        if start > stop:
            raise UsageError(f"{flag}: the range is empty ({parts[0].strip()} is past {parts[1].strip()})")
        values = []
        x = start
        while x <= (stop if integral else stop + abs(stop) * 1e-12):
            if len(values) >= MAX_SWEEP_POINTS:
                raise UsageError(f"{flag}: more than {MAX_SWEEP_POINTS:,} values, the most points a sweep may have")
            values.append((str(int(x)) if integral else f"{x:.12g}") + unit)
            x = x * step if factor else x + step
        return tuple(values)
    values = tuple(v.strip() for v in text.split(","))
    if not text or any(not v for v in values):
        raise UsageError(f"{flag}: give one or more values separated by commas, e.g. -p {name}=2,4,8")
    return values


def _clip(number: str) -> str:
    """A number as written, its start only where it is long (its digits could fill screens)."""
    return number if len(number) <= 40 else f"{number[:20]}... ({len(number)} characters)"


def _listed(name: str, given: object, takes: str) -> list:
    """A sweep's argument that is one value (a text, a path) or a list or tuple of them."""
    if isinstance(given, (str, os.PathLike)):
        return [given]
    if not isinstance(given, (list, tuple)):
        raise UsageError(f"sweep: {name} must be {takes}, got {describe(given)}")
    return list(given)


def _points(schedules: Sequence[str], params: Mapping[str, Sequence[str]], machines: Sequence[str],
            nodes: Sequence[int | None]) -> list[Point]:  # fmt: skip
    names = list(params)
    count = len(schedules) * len(machines) * len(nodes) * math.prod(len(v) for v in params.values())
    if count > MAX_SWEEP_POINTS:
        raise UsageError(f"the sweep has {count:,} points, more than the limit of {MAX_SWEEP_POINTS:,}",
                         hint="sweep fewer values, or split the sweep into several")  # fmt: skip
    return [
        Point(schedule, tuple(zip(names, combo)), machine, n)
        for schedule in schedules
        for combo in itertools.product(*(params[k] for k in names))
        for machine in machines
        for n in nodes
    ]


def declared_params(display: str, text: str) -> list[str]:
    """The params a schedule's text declares. A text that is no schedule at all (not YAML,
    not a mapping, an unknown top-level key, no `program:`) is refused with the loader's
    message, as a `UsageError`, before any point runs; what depends on a point's values
    (a param's value, the world, the program) fails that point, as a row."""
    from commdsl.dsl import loader
    from commdsl.errors import ScheduleError

    try:
        return loader.declared_params(text, display)
    except ScheduleError as err:
        raise UsageError(err.message, err.loc, hint=err.hint, related=err.related) from None


# ---- the work of one point -------------------------------------------------------------


def evaluate(task: _Task) -> list[Row]:
    """Simulate each of the task's points: a row each, with its metrics or its error."""
    from commdsl.api import metrics
    from commdsl.dsl import load_schedule_text
    from commdsl.sim import simulate
    from commdsl.sim.folding import approximate, fold_unit, inexact

    rows = []
    for point in task.points:
        started = time.process_time()
        base = {"schedule": point.schedule, "params": dict(point.params), "machine": point.machine, "nodes": point.nodes}
        display, text = task.schedules[point.schedule]
        machine = task.machines[(point.machine, point.nodes)]
        program = None
        try:
            # Data-parallel replicas folded where that is exactly a run of every rank
            # (commdsl.sim.folding); every rank expanded where it would be only close.
            program = load_schedule_text(text, display, dict(point.params), max_ops=task.max_ops, fold=True,
                                         fold_unit=fold_unit(machine, task.network))  # fmt: skip
            if program.fold is not None and (inexact(program, machine, task.network) or approximate(program, machine, task.network)):
                program = load_schedule_text(text, display, dict(point.params), max_ops=task.max_ops)
            result = simulate(program, machine, task.network)
            m = metrics(result)
        except CommdslError as err:
            rows.append(Row(**base, world_size=program.world_size if program else None,
                            num_ops=program.total_ops if program else None, error=str(err).split("\n")[0],
                            error_kind=type(err).__name__, cpu_s=time.process_time() - started))  # fmt: skip
            continue
        rows.append(Row(**base, world_size=program.world_size, num_ops=program.total_ops, makespan_us=m.makespan_us,
                        bubble_fraction=m.bubble_fraction, exposed_comm_us=m.max_exposed_comm_us,
                        peak_memory_bytes=m.max_peak_memory_bytes, exposed_comm_us_per_rank=m.exposed_comm_us,
                        peak_memory_bytes_per_rank=m.peak_memory_bytes, cpu_s=time.process_time() - started))  # fmt: skip
    return rows


# ---- the sweep ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepPlan:
    """A checked sweep: its points and what their workers need, ready to run."""

    points: tuple[Point, ...]
    task: _Task


def plan(schedules: Sequence[str] | str, params: Mapping[str, object] | None = None, *,
         machines: Sequence[str] | str = ("dgx-h100",), nodes: Sequence[int | None] | int | None = None,
         network: str = "flow", max_ops: int = DEFAULT_MAX_OPS) -> SweepPlan:  # fmt: skip
    """Check a sweep before any point runs: every schedule found and declaring every
    param, every value list and range non-empty, every machine (with its nodes) known.
    `params` maps a name to its values: a text as `-p` takes it (`"8:64:x2"`) or a list."""
    from commdsl.dsl.loader import resolve_schedule
    from commdsl.files import is_file, read_text
    from commdsl.resources import bundled_schedules
    from commdsl.sim.models import check_network

    from commdsl.api import load_machine

    schedules = [path_text("sweep", "a schedule", x, "a schedule file or the name of a bundled schedule")
                 for x in _listed("schedules", schedules, "a schedule or a list of schedules")]  # fmt: skip
    machines = ([m.strip() for m in machines.split(",")] if isinstance(machines, str) else
                [path_text("sweep", "a machine", m, "a preset name or a machine file")
                 for m in _listed("machines", machines, "a machine or a list of machines")])  # fmt: skip
    node_counts = [None if n is None else whole_number("nodes", n)
                   for n in ([nodes] if nodes is None or not isinstance(nodes, (list, tuple)) else nodes)]  # fmt: skip
    max_ops = DEFAULT_MAX_OPS if max_ops is None else whole_number("max_ops", max_ops)
    if not schedules:
        raise UsageError("a sweep needs at least one schedule")
    if not machines or any(not m for m in machines):
        raise UsageError("--machine: give one or more machines separated by commas, e.g. dgx-h100,dgx-a100")
    if not node_counts:
        raise UsageError("--nodes: give one or more node counts, e.g. 1,2,4")
    check_network(network)
    if params is not None and not isinstance(params, Mapping):
        raise UsageError(f"sweep: params must be a mapping of param names to values (a text such as '2,4,8', or a list), "
                         f"got {describe(params)}")  # fmt: skip
    values: dict[str, tuple[str, ...]] = {}
    for name, given in (params or {}).items():
        if isinstance(given, (list, tuple)):
            if not given:
                raise UsageError(f"param '{name}' has no values")
            values[str(name)] = tuple(str(v) for v in given)
        else:
            values[str(name)] = parse_values(str(name), str(given))
    texts: dict[str, tuple[str, str]] = {}
    for schedule in schedules:
        path = resolve_schedule(schedule)
        if path is None:
            raise UsageError(f"no such schedule file or bundled schedule: {schedule}",
                             hint="bundled schedules: " + ", ".join(bundled_schedules()))  # fmt: skip
        display = schedule if is_file(schedule) else f"schedules/{path.name}"
        texts[schedule] = (display, read_text(path, display, UsageError, "schedule"))
        declared = declared_params(*texts[schedule])
        for name in values:
            if name not in declared:
                raise UsageError(f"-p {name}: schedule {schedule} has no param '{name}'"
                                 + (f" (params: {', '.join(declared)})" if declared else " (it declares none)"),
                                 hint=did_you_mean(name, declared) or "every schedule of a sweep takes the same params")  # fmt: skip
    loaded = {}
    for machine in machines:
        for n in node_counts:
            loaded[(machine, n)] = load_machine(machine, nodes=n)
    points = _points(schedules, values, machines, node_counts)
    return SweepPlan(tuple(points), _Task(texts, loaded, network, max_ops))


def sweep(schedules: Sequence[str] | str, params: Mapping[str, object] | None = None, *,
          machines: Sequence[str] | str = ("dgx-h100",), nodes: Sequence[int | None] | int | None = None,
          network: str = "flow", jobs: int = 1, executor: Executor | str = Executor.LOCAL, address: str | None = None,
          max_ops: int = DEFAULT_MAX_OPS, progress: Callable[[int, int], None] | None = None) -> list[Row]:  # fmt: skip
    """Simulate every combination (`plan`) and return one `Row` per point, in the order of
    the points (schedules, then params as given, then machines, then nodes). `jobs`:
    worker processes (local) or CPUs of a local Ray instance; `executor="ray"` runs the
    points as Ray tasks on the cluster at `address` (None: a local instance). `progress`
    hears (points done, points in all)."""
    checked = plan(schedules, params, machines=machines, nodes=nodes, network=network, max_ops=max_ops)
    return run_plan(checked, jobs=jobs, executor=executor, address=address, progress=progress)


def run_plan(checked: SweepPlan, *, jobs: int = 1, executor: Executor | str = Executor.LOCAL, address: str | None = None,
             progress: Callable[[int, int], None] | None = None) -> list[Row]:  # fmt: skip
    """Run a checked sweep's points (see `sweep`)."""
    executor = member(Executor, executor, "executor")
    jobs = whole_number("jobs", jobs, maximum=MAX_JOBS)
    if progress is not None and not callable(progress):
        raise UsageError(f"sweep: progress must be a function taking (points done, points in all), or None, got {describe(progress)}")
    if address is not None and not isinstance(address, str):
        raise UsageError(f"sweep: address must be a Ray cluster's address (a text) or None, got {describe(address)}")
    if address is not None and executor is not Executor.RAY:
        raise UsageError("--address names a Ray cluster: use it with --executor ray")
    tasks = _chunks(checked, jobs)
    total = len(checked.points)
    report = progress or (lambda done, total: None)
    report(0, total)
    if executor is Executor.RAY:
        results = _run_ray(tasks, jobs, address, report, total)
    elif jobs == 1:
        results = []
        for task in tasks:
            results.append(evaluate(task))
            report(sum(len(r) for r in results), total)
    else:
        results = _run_local(tasks, jobs, report, total)
    return [row for rows in results for row in rows]


def _chunks(checked: SweepPlan, jobs: int) -> list[_Task]:
    """The points in tasks of a few each: enough tasks to keep every worker busy to the
    end and to move the progress bar, few enough that sending them costs little."""
    points = checked.points
    size = max(1, min(16, len(points) // (8 * jobs)))
    base = checked.task
    return [_Task(base.schedules, base.machines, base.network, base.max_ops, points[i:i + size])
            for i in range(0, len(points), size)]  # fmt: skip


def _run_local(tasks: list[_Task], jobs: int, report: Callable[[int, int], None], total: int) -> list[list[Row]]:
    results: list[list[Row] | None] = [None] * len(tasks)
    done = 0
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks))) as pool:
        futures = {pool.submit(evaluate, task): i for i, task in enumerate(tasks)}
        for future in as_completed(futures):
            try:
                rows = results[futures[future]] = future.result()
            except BrokenProcessPool:
                raise _worker_died(tasks[futures[future]], "a worker process ended abruptly") from None
            done += len(rows)
            report(done, total)
    return results  # type: ignore[return-value]


def _worker_died(task: _Task, what: str) -> CommdslError:
    """The error of a sweep whose worker died (not a point's failure: the process that
    ran it is gone, e.g. killed for memory by the system)."""
    first = task.points[0]
    return CommdslError(f"{what} while simulating {first.schedule} {' '.join(f'{k}={v}' for k, v in first.params)} "
                        f"on {first.machine} (or one of the {len(task.points) - 1} points after it in its task)",
                        hint="the system may have stopped it for memory: run fewer jobs (-j), or sweep smaller points")  # fmt: skip


def _run_ray(tasks: list[_Task], jobs: int, address: str | None, report: Callable[[int, int], None],
             total: int) -> list[list[Row]]:  # fmt: skip
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs Ray", hint="pip install 'commdsl[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        options = {"address": address} if address else {"num_cpus": jobs, "include_dashboard": False}
        try:
            ray.init(**options, log_to_driver=False, configure_logging=False)
        except Exception as err:  # Ray raises bare Exceptions too (a cluster it cannot start or reach)
            raise UsageError(f"--executor ray: cannot start or reach Ray{f' at {address}' if address else ''}: {err}") from None
    try:
        remote = ray.remote(num_cpus=1)(evaluate)
        refs = [remote.remote(task) for task in tasks]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[list[Row] | None] = [None] * len(tasks)
        pending, done = list(refs), 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                try:
                    rows = results[index[ref]] = ray.get(ref)
                except ray.exceptions.RayError as err:
                    raise _worker_died(tasks[index[ref]], f"a Ray task failed ({type(err).__name__})") from None
                done += len(rows)
            report(done, total)
        return results  # type: ignore[return-value]
    finally:
        if started_here:
            ray.shutdown()


# ---- what is best ---------------------------------------------------------------------------


def best_rows(rows: Iterable[Row], objective: Objective | str = Objective.MAKESPAN,
              max_memory_bytes: int | None = None) -> list[Row]:  # fmt: skip
    """The points that succeeded and fit the memory cap (the largest rank's peak at most
    `max_memory_bytes`), best first by `objective`."""
    objective = member(Objective, objective, "objective")
    if max_memory_bytes is not None and not is_amount(max_memory_bytes):
        raise UsageError(f"max_memory_bytes must be a number of bytes from 0 (or None), got {describe(max_memory_bytes)}")
    fit = [r for r in rows if r.ok and (max_memory_bytes is None or (r.peak_memory_bytes or 0) <= max_memory_bytes)]
    return sorted(fit, key=lambda r: r.value(objective))


def pareto_front(rows: Iterable[Row]) -> list[Row]:
    """The points that succeeded and that no other point beats on both makespan and peak
    memory (at most as large on both, smaller on one), by increasing peak memory."""
    ok = sorted((r for r in rows if r.ok), key=lambda r: (r.peak_memory_bytes or 0, r.makespan_us))
    front: list[Row] = []
    for r in ok:
        if not front or r.makespan_us < front[-1].makespan_us:
            front.append(r)
    return front


# ---- outputs ------------------------------------------------------------------------------------

OUT_SUFFIXES = (".csv", ".json", ".parquet")


def check_output(flag: str, path: str | None, suffixes: Sequence[str]) -> None:
    """An output path a sweep can write: a known suffix, and a file commdsl can write
    (`commdsl.files.check_output_path`). Checked before any point runs."""
    if path is None:
        return
    suffix = Path(path).suffix.lower()
    if suffix not in suffixes:
        raise UsageError(f"{flag} {path}: the file must end in {', '.join(suffixes)}")
    check_output_path(flag, path)
    if suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise UsageError(f"{flag} {path}: writing parquet needs pyarrow", hint="pip install 'commdsl[parquet]'") from None


def param_names(rows: Sequence[Row]) -> list[str]:
    names: dict[str, None] = {}
    for r in rows:
        names.update(dict.fromkeys(r.params))
    return list(names)


_COLUMNS = ("schedule", "machine", "nodes", "world_size", "num_ops", "makespan_us", "bubble_fraction", "exposed_comm_us",
            "peak_memory_bytes", "exposed_comm_us_per_rank", "peak_memory_bytes_per_rank", "error", "error_kind")  # fmt: skip


def write_rows(rows: Sequence[Row], path: str) -> None:
    """Every point, one row each: params (one column each), machine, nodes, metrics
    (the largest rank's and per rank), error. CSV cells of per-rank values are JSON lists."""
    suffix = Path(path).suffix.lower()
    names = param_names(rows)
    if suffix == ".json":
        with open(path, "w", encoding="utf-8") as f:
            json.dump([r.to_json() for r in rows], f, indent=1)
            f.write("\n")
        return
    columns: dict[str, list] = {f"param.{k}": [r.params.get(k) for r in rows] for k in names}
    for c in _COLUMNS:
        columns[c] = [getattr(r, c) for r in rows]
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns["exposed_comm_us_per_rank"] = [list(v) for v in columns["exposed_comm_us_per_rank"]]
        columns["peak_memory_bytes_per_rank"] = [list(v) for v in columns["peak_memory_bytes_per_rank"]]
        pq.write_table(pa.table(columns), path)
        return
    with open(path, "w", encoding="utf-8", newline="") as f:
        out = csv.writer(f)
        out.writerow(list(columns))
        for i in range(len(rows)):
            out.writerow([json.dumps(list(v[i])) if isinstance(v[i], tuple) else ("" if v[i] is None else v[i])
                          for v in columns.values()])  # fmt: skip


def describe_params(row: Row) -> str:
    return " ".join(f"{k}={v}" for k, v in row.params.items())


def write_html(rows: Sequence[Row], path: str, *, objective: Objective, max_memory_bytes: int | None, title: str) -> None:
    """A self-contained page (inline SVG and CSS, nothing fetched): makespan against the
    largest rank's peak memory, the Pareto front highlighted, the memory cap drawn, and
    the table of every point, best first."""
    Path(path).write_text(render_html(rows, objective=objective, max_memory_bytes=max_memory_bytes, title=title),
                          encoding="utf-8")  # fmt: skip


def render_html(rows: Sequence[Row], *, objective: Objective, max_memory_bytes: int | None, title: str) -> str:
    from commdsl.dsl.values import format_bytes

    ok = [r for r in rows if r.ok]
    front = {id(r) for r in pareto_front(rows)}
    ranked = best_rows(rows, objective, max_memory_bytes)
    best = {id(r): i + 1 for i, r in enumerate(ranked)}
    out = io.StringIO()
    esc = html.escape
    out.write(f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{esc(title)}</title><style>"
              "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
              "td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}td.l,th.l{text-align:left}"
              "tr.front td{font-weight:bold}tr.fail td{color:#a00}.cap{stroke:#c60;stroke-dasharray:4 3}"
              "</style></head><body>\n")  # fmt: skip
    failed = len(rows) - len(ok)
    cap = f", memory cap {format_bytes(max_memory_bytes)}" if max_memory_bytes is not None else ""
    out.write(f"<h1>{esc(title)}</h1>\n<p>{len(rows)} points, {len(ok)} simulated, {failed} failed; "
              f"objective {esc(objective.value)}{esc(cap)}; {len(front)} on the Pareto front (red).</p>\n")  # fmt: skip
    out.write(_svg(ok, front, max_memory_bytes))
    params = param_names(rows)
    out.write("<table><tr><th>best</th><th class='l'>schedule</th>"
              + "".join(f"<th class='l'>{esc(p)}</th>" for p in params)
              + "<th class='l'>machine</th><th>nodes</th><th>makespan ms</th><th>bubble</th><th>exposed comm ms</th>"
              "<th>peak memory</th><th class='l'>error</th></tr>\n")  # fmt: skip
    order = ranked + [r for r in rows if id(r) not in best]
    for r in order:
        cls = "front" if id(r) in front else ("fail" if not r.ok else "")
        cells = [str(best.get(id(r), "")), esc(r.schedule), *(esc(r.params.get(p, "")) for p in params), esc(r.machine),
                 "" if r.nodes is None else str(r.nodes)]  # fmt: skip
        if r.ok:
            bubble = "" if r.bubble_fraction is None else f"{r.bubble_fraction:.3f}"
            cells += [f"{r.makespan_us / 1e3:.3f}", bubble, f"{r.exposed_comm_us / 1e3:.3f}", format_bytes(r.peak_memory_bytes), ""]
        else:
            cells += ["", "", "", "", esc(f"{r.error_kind}: {r.error}")]
        left = {1, *range(2, 3 + len(params)), len(cells) - 1}
        out.write(f"<tr class='{cls}'>" + "".join(f"<td class='l'>{c}</td>" if i in left else f"<td>{c}</td>"
                                                    for i, c in enumerate(cells)) + "</tr>\n")  # fmt: skip
    out.write("</table>\n</body></html>\n")
    return out.getvalue()


def _svg(ok: Sequence[Row], front: set[int], max_memory_bytes: int | None) -> str:
    """Makespan (ms, up) against the largest rank's peak memory (GiB, right)."""
    width, height, pad = 720, 420, 60
    if not ok:
        return "<p>No point was simulated.</p>\n"
    xs = [(r.peak_memory_bytes or 0) / 2**30 for r in ok]
    ys = [r.makespan_us / 1e3 for r in ok]
    x_hi = max(xs + ([max_memory_bytes / 2**30] if max_memory_bytes else [])) * 1.05 or 1.0
    y_hi = max(ys) * 1.05 or 1.0

    def sx(x: float) -> float:
        return pad + x / x_hi * (width - 2 * pad)

    def sy(y: float) -> float:
        return height - pad - y / y_hi * (height - 2 * pad)

    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-size='12'>",
             f"<line x1='{pad}' y1='{height - pad}' x2='{width - pad}' y2='{height - pad}' stroke='#000'/>",
             f"<line x1='{pad}' y1='{pad}' x2='{pad}' y2='{height - pad}' stroke='#000'/>",
             f"<text x='{width / 2}' y='{height - 15}' text-anchor='middle'>peak memory of the largest rank (GiB)</text>",
             f"<text x='15' y='{height / 2}' transform='rotate(-90 15 {height / 2})' text-anchor='middle'>makespan (ms)</text>"]  # fmt: skip
    for i in range(5):
        xv, yv = x_hi * i / 4, y_hi * i / 4
        parts.append(f"<text x='{sx(xv):.1f}' y='{height - pad + 15}' text-anchor='middle'>{xv:.3g}</text>")
        parts.append(f"<text x='{pad - 5}' y='{sy(yv) + 4:.1f}' text-anchor='end'>{yv:.3g}</text>")
    if max_memory_bytes is not None:
        cx = sx(max_memory_bytes / 2**30)
        parts.append(f"<line class='cap' x1='{cx:.1f}' y1='{pad}' x2='{cx:.1f}' y2='{height - pad}'/>")
    line = sorted((x, y) for r, x, y in zip(ok, xs, ys) if id(r) in front)
    if len(line) > 1:
        parts.append("<polyline fill='none' stroke='#d22' points='" + " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line) + "'/>")
    for r, x, y in zip(ok, xs, ys):
        on = id(r) in front
        tip = html.escape(f"{r.schedule} {describe_params(r)} {r.machine} nodes={r.nodes}: {y:.3f} ms, {x:.3f} GiB")
        parts.append(f"<circle cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='{4 if on else 3}' fill='{'#d22' if on else '#888'}'>"
                     f"<title>{tip}</title></circle>")  # fmt: skip
    parts.append("</svg>\n")
    return "\n".join(parts)
