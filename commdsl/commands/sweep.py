"""`commdsl sweep`: simulate every combination of schedules, params, machines and nodes.

    commdsl sweep 1f1b gpipe -p stages=2,4,8 -p microbatches=8:64:x2 --machine dgx-h100,dgx-a100 --nodes 1,2 -j 2
    commdsl sweep 1f1b -p stages=2:8:2 --out results.csv --html report.html
    commdsl sweep 1f1b -p stages=2,4,8 --objective makespan --max-memory 80GiB
    commdsl sweep 1f1b -p stages=2,4,8 --executor ray --address auto      # on a Ray cluster
"""

from __future__ import annotations

import argparse
import os

from commdsl.cli import count_at_least
from commdsl.dsl import DEFAULT_MAX_OPS, parse_overrides
from commdsl.errors import UsageError
from commdsl.progress import Progress
from commdsl.sim.models import DEFAULT_NETWORK, NETWORKS
from commdsl.sweeps import MAX_JOBS, OUT_SUFFIXES, Executor, Objective, check_output

DEFAULT_TOP = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("schedules", nargs="+", metavar="SCHEDULE",
                        help="schedule files or bundled schedules; several compare families on the same params")  # fmt: skip
    parser.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUES",
                        help="a param's values: a list (stages=2,4,8), a range with a step (stages=2:8:2) or a factor "
                             "(microbatches=8:64:x2), both ends included (repeatable)")  # fmt: skip
    parser.add_argument("--machine", default="dgx-h100", metavar="NAMES",
                        help="machine presets or files, separated by commas (default dgx-h100)")  # fmt: skip
    parser.add_argument("--nodes", default=None, metavar="COUNTS",
                        help="node counts of machines with a topology, separated by commas (e.g. 1,2,4)")  # fmt: skip
    parser.add_argument("--network", default=DEFAULT_NETWORK, choices=sorted(NETWORKS),
                        help=f"network model (default {DEFAULT_NETWORK}; analytic: no contention, the fastest)")  # fmt: skip
    parser.add_argument("-j", "--jobs", type=parse_jobs, default=min(os.cpu_count() or 1, MAX_JOBS), metavar="N",
                        help=f"worker processes (or CPUs of a local Ray instance), 1 to {MAX_JOBS:,}: each is a process "
                             "of its own, so more would only exhaust the system; default: this machine's CPUs")  # fmt: skip
    parser.add_argument("--executor", default=Executor.LOCAL.value, choices=[e.value for e in Executor],
                        help="local worker processes, or Ray tasks (pip install 'commdsl[ray]')")  # fmt: skip
    parser.add_argument("--address", default=None, metavar="ADDR",
                        help="with --executor ray: the Ray cluster (auto, or host:port; default a local instance)")  # fmt: skip
    parser.add_argument("--objective", default=Objective.MAKESPAN.value, choices=[o.value for o in Objective],
                        help="what the best points minimise (default makespan)")  # fmt: skip
    parser.add_argument("--max-memory", default=None, metavar="SIZE",
                        help="best points only among those whose largest rank's peak memory fits, e.g. 80GiB")  # fmt: skip
    parser.add_argument("--top", type=count_at_least(1), default=DEFAULT_TOP, metavar="N",
                        help=f"rows of the table of best points (default {DEFAULT_TOP})")  # fmt: skip
    parser.add_argument("--out", default=None, metavar="FILE",
                        help="write every point (params, machine, nodes, metrics, error) as .csv, .json or .parquet")  # fmt: skip
    parser.add_argument("--html", default=None, metavar="FILE",
                        help="write a self-contained report: makespan against peak memory, the Pareto front, the table")  # fmt: skip
    parser.add_argument("--max-ops", type=count_at_least(1), default=None, metavar="N",
                        help="a point whose schedule expands to more than N ops fails (default 5,000,000)")  # fmt: skip


def parse_jobs(text: str) -> int:
    """-j: a whole number from 1 to `MAX_JOBS`."""
    jobs = count_at_least(1)(text)
    if jobs > MAX_JOBS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_JOBS:,}, got {jobs:,}")
    return jobs


def parse_memory(text: str | None) -> int | None:
    """--max-memory: a size such as 80GiB."""
    if text is None:
        return None
    from commdsl.dsl.values import Unit, ValueFault, parse_quantity

    try:
        q = parse_quantity(text)
    except ValueFault:
        q = None
    if q is None or q.unit is not Unit.SIZE or q.value <= 0:
        raise UsageError(f"--max-memory {text}: give a size, e.g. 80GiB")
    return int(q.value)


def parse_nodes(text: str | None) -> list[int | None]:
    if text is None:
        return [None]
    counts = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise UsageError(f"--nodes {text}: give node counts >= 1 separated by commas, e.g. 1,2,4")
        counts.append(int(part))
    return counts


def run(args: argparse.Namespace) -> int:
    from commdsl.sweeps import plan, run_plan, write_html, write_rows

    check_output("--out", args.out, OUT_SUFFIXES)
    check_output("--html", args.html, (".html", ".htm"))
    max_memory = parse_memory(args.max_memory)
    if args.address is not None and args.executor != Executor.RAY.value:
        raise UsageError("--address names a Ray cluster: use it with --executor ray")
    objective = Objective(args.objective)
    with Progress("commdsl sweep") as progress:
        progress.phase("checking the sweep")
        checked = plan(args.schedules, parse_overrides(args.param), machines=args.machine.split(","),
                       nodes=parse_nodes(args.nodes), network=args.network, max_ops=args.max_ops or DEFAULT_MAX_OPS)  # fmt: skip
        progress.phase(f"simulating ({args.executor}, {args.jobs} jobs)", len(checked.points), unit="points")
        rows = run_plan(checked, jobs=args.jobs, executor=args.executor, address=args.address, progress=progress.update)
        if args.out:
            progress.phase(f"writing {args.out}")
            write_rows(rows, args.out)
        if args.html:
            progress.phase(f"writing {args.html}")
            write_html(rows, args.html, objective=objective, max_memory_bytes=max_memory,
                       title="commdsl sweep: " + " ".join(args.schedules))  # fmt: skip
    print_table(rows, objective, max_memory, args.top)
    return 0 if any(r.ok for r in rows) else 1  # every point failed: the rows say why, the exit says so


def print_table(rows, objective: Objective, max_memory: int | None, top: int) -> None:
    """The best points, then how many failed and why (one line per kind of failure)."""
    from collections import Counter

    from rich.console import Console
    from rich.table import Table

    from commdsl.dsl.values import format_bytes
    from commdsl.sweeps import best_rows, describe_params, pareto_front

    console = Console(highlight=False)
    if not console.is_terminal:  # a pipe or a log: wide rows rather than params cut short
        console = Console(highlight=False, width=200)
    best = best_rows(rows, objective, max_memory)
    front = {id(r) for r in pareto_front(rows)}
    failed = [r for r in rows if not r.ok]
    cap = f", peak memory <= {format_bytes(max_memory)}" if max_memory is not None else ""
    console.print(f"[bold]{len(rows)}[/] points: {len(rows) - len(failed)} simulated, {len(failed)} failed; "
                  f"best by {objective.value}{cap} ({len(best)} fit; * on the Pareto front of makespan and memory)")  # fmt: skip
    if best:
        table = Table(box=None, pad_edge=False)
        for name, justify in (("#", "right"), ("schedule", "left"), ("params", "left"), ("machine", "left"), ("nodes", "right"),
                              ("makespan ms", "right"), ("bubble", "right"), ("exposed comm ms", "right"), ("peak memory", "right")):  # fmt: skip
            table.add_column(name, justify=justify)
        for i, r in enumerate(best[:top], 1):
            bubble = "" if r.bubble_fraction is None else f"{r.bubble_fraction:.3f}"
            table.add_row(f"{i}{'*' if id(r) in front else ''}", r.schedule, describe_params(r), r.machine,
                          "" if r.nodes is None else str(r.nodes), f"{r.makespan_us / 1e3:,.3f}", bubble,
                          f"{r.exposed_comm_us / 1e3:,.3f}", format_bytes(r.peak_memory_bytes))  # fmt: skip
        console.print(table)
    reasons = Counter((r.error_kind, r.error) for r in failed)
    for (kind, error), n in reasons.most_common(5):
        console.print(f"[red]{n} failed[/] ({kind}): {error}", soft_wrap=True)
    if len(reasons) > 5:
        console.print(f"... and {len(reasons) - 5} other reasons (--out lists every point)")
