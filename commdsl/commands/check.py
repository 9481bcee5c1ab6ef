"""`commdsl check`: load, validate, and summarise a schedule."""

from __future__ import annotations

import argparse
import json
from collections import Counter

from rich.console import Console
from rich.table import Table

from commdsl.cli import add_fold_argument, add_schedule_arguments, load_from_args
from commdsl.dsl.values import format_bytes
from commdsl.errors import escape_markup
from commdsl.ir import Program
from commdsl.progress import Progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_schedule_arguments(parser)
    add_fold_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def summarize(program: Program) -> dict:
    """Counts a reader wants first: ranks, ops by kind, bytes by transport (of every rank:
    a folded program's representative counts once for each replica)."""
    by_kind: Counter[str] = Counter()
    bytes_by_transport: Counter[str] = Counter()
    for op in program.all_ops():
        by_kind[op.kind.value] += 1
        # Count each transfer once: on the sending side for P2P, per rank for collectives.
        if op.transport is not None and op.kind.value != "recv":
            bytes_by_transport[op.transport.value] += op.size_bytes
    replicas = program.fold.replicas if program.fold is not None else 1
    for counter in (by_kind, bytes_by_transport):
        for key in counter:
            counter[key] *= replicas
    return {
        "name": program.name,
        "source": program.source,
        "world_size": program.world_size,
        "mesh": dict(program.mesh),
        "streams": list(program.streams),
        "groups": len(program.groups),
        "ops": program.total_ops,
        "ops_expanded": program.num_ops,
        "fold": program.fold_note,
        "ops_by_kind": dict(sorted(by_kind.items())),
        "bytes_by_transport": dict(sorted(bytes_by_transport.items())),
        "params": dict(program.params),
        "warnings": list(program.warnings),
    }


def run(args: argparse.Namespace) -> int:
    from commdsl.sim import check_deadlock  # deadlock and ordering check by simulation (exit code 3)

    with Progress("commdsl check") as progress:
        progress.phase(f"expanding {args.schedule}")
        program = load_from_args(args, fold=True)
        progress.phase("checking that every rank finishes", unit="ops")
        check_deadlock(program, progress.update)
    summary = summarize(program)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    console = Console(highlight=False)
    # Names, values and paths are the user's: printed with their control characters and
    # rich markup escaped (`escape_markup`).
    mesh = escape_markup(" × ".join(f"{a}={n}" for a, n in program.mesh) or "flat")
    console.print(f"[bold]{escape_markup(program.name)}[/]: ok  ({escape_markup(program.source)})")
    console.print(f"  ranks {program.world_size} (mesh {mesh}), streams {escape_markup(', '.join(program.streams))}, groups {len(program.groups)}")
    if program.params:  # one line each, however long: a list of names wrapped mid-name reads badly
        console.print("  params " + escape_markup(", ".join(f"{k}={v}" for k, v in program.params)), soft_wrap=True)
    table = Table(box=None, show_header=True, pad_edge=False)
    table.add_column("op kind")
    table.add_column("count", justify="right")
    for kind, n in summary["ops_by_kind"].items():
        table.add_row(kind, f"{n:,}")
    table.add_row("[bold]total[/]", f"[bold]{program.total_ops:,}[/]")
    console.print(table)
    if program.fold_note:
        console.print(f"  {escape_markup(program.fold_note)}")
    if summary["bytes_by_transport"]:
        console.print("  bytes by transport: " + ", ".join(f"{t} {format_bytes(b)}" for t, b in summary["bytes_by_transport"].items()))
    for warning in program.warnings[:20]:
        console.print(f"[yellow]warning[/]: {escape_markup(warning)}")
    if len(program.warnings) > 20:
        console.print(f"[yellow]... and {len(program.warnings) - 20} more warnings[/]")
    return 0
