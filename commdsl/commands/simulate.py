"""`commdsl simulate`: predict a schedule's timeline on a machine.

    commdsl simulate 1f1b                              # summary, critical path, Gantt
    commdsl simulate 1f1b --machine a100-nvlink --trace predicted.json
    commdsl simulate my.yaml -p stages=8 --json        # summary as JSON (makespan_us, ...)
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from commdsl.cli import add_schedule_arguments, load_from_args
from commdsl.errors import UsageError
from commdsl.machine import DEFAULT_MACHINE, resolve_machine
from commdsl.sim import NETWORKS, simulate
from commdsl.sim.gantt import fits, gantt_lines
from commdsl.sim.summary import Summary, format_us, summarize

_PATH_ROWS = 24


def add_machine_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of every command that simulates."""
    parser.add_argument("--machine", default=DEFAULT_MACHINE, metavar="NAME|PATH",
                        help=f"machine preset or machine YAML file (default {DEFAULT_MACHINE})")  # fmt: skip
    parser.add_argument("--network", default="analytic", choices=sorted(NETWORKS), help="network model (default analytic)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_schedule_arguments(parser)
    add_machine_arguments(parser)
    parser.add_argument("--trace", metavar="OUT.json", default=None,
                        help="write the predicted timeline as Chrome-trace JSON (opens in Perfetto)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--gantt", choices=("auto", "always", "never"), default="auto",
                        help="terminal Gantt chart (auto: for small schedules)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    program = load_from_args(args)
    machine = resolve_machine(args.machine)
    result = simulate(program, machine, args.network)
    if args.trace:
        try:
            result.timeline.write(args.trace, program.streams)
        except OSError as e:
            raise UsageError(f"cannot write trace {args.trace}: {e}") from None
    summary = summarize(result)
    if args.json:
        print(json.dumps(summary.to_json(), indent=1))
        return 0
    console = Console(highlight=False, soft_wrap=True)
    print_summary(console, summary)
    if args.gantt == "always" or (args.gantt == "auto" and fits(result)):
        console.print()
        for line in gantt_lines(result):
            console.print(line)
    if args.trace:
        console.print(f"\ntrace: {escape(args.trace)} (open it in https://ui.perfetto.dev)")
    return 0


def print_summary(console: Console, s: Summary) -> None:
    console.print(f"[bold]{escape(s.schedule)}[/] on {escape(s.machine)} ({s.network} network): "
                  f"{s.world_size} ranks, {s.num_ops:,} ops")  # fmt: skip
    bubble = f"{s.bubble_fraction:.4f}" if s.bubble_fraction is not None else "-"
    console.print(f"  makespan [bold]{format_us(s.makespan_us)}[/]   bubble fraction {bubble}")
    table = Table(box=None, pad_edge=False)
    for col in ("rank", "compute", "comm", "exposed comm", "idle", "bubble"):
        table.add_column(col, justify="right")
    for r in s.ranks:
        table.add_row(
            str(r.rank), format_us(r.compute_us), format_us(r.comm_us), format_us(r.exposed_comm_us),
            format_us(r.idle_us), f"{r.bubble_fraction:.4f}" if r.bubble_fraction is not None else "-",
        )  # fmt: skip
    console.print(table)
    path = s.critical_path
    console.print(f"critical path ({len(path)} ops):")
    shown = path if len(path) <= _PATH_ROWS else path[: _PATH_ROWS // 2] + path[-_PATH_ROWS // 2 :]
    for i, step in enumerate(shown):
        if len(path) > _PATH_ROWS and i == _PATH_ROWS // 2:
            console.print(f"  ... {len(path) - _PATH_ROWS} more ...")
        console.print(
            f"  {step.op_id:>9} {step.kind:<14} {escape(step.name):<16} {format_us(step.start_us):>12} -> "
            f"{format_us(step.end_us):>12}  {escape(step.source)}"
        )
    for w in s.warnings[:10]:
        console.print(f"[yellow]warning[/]: {escape(w)}")
