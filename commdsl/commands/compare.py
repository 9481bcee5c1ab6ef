"""`commdsl compare PREDICTED MEASURED`: where and by how much a prediction missed."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from commdsl.api import compare_named
from commdsl.cli import non_negative_number
from commdsl.comparison import Comparison, combined_trace, compare_trace, unfolded
from commdsl.dsl.values import format_bytes, format_us
from commdsl.errors import UsageError, require_output_folder
from commdsl.errors import escape_markup as escape
from commdsl.files import OutputPath, write_text
from commdsl.interop.kineto_read import is_trace_path, read_job
from commdsl.timeline import Timeline

EXIT_OVER_MAX_ERROR = 4
"""Exit code when the makespan error exceeds --max-error."""
MAX_UNMATCHED_SHOWN = 20
"""Unpaired ops and trace events the terminal report lists (--json lists all)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("predicted", help="predicted timeline (commdsl simulate --trace)")
    parser.add_argument("measured", help="measured timeline (torchrun -m commdsl.run --out), or a folder of PyTorch profiler "
                        "(Kineto) traces of any job, one per rank (commdsl run --profile, torch.profiler)")
    parser.add_argument("--step", type=int, default=None, metavar="N",
                        help="with profiler traces: compare step ProfilerStep#N (default: the last step of every rank's trace that holds work)")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.add_argument("--html", metavar="OUT", action=OutputPath, help="write a self-contained HTML report")
    parser.add_argument("--trace", metavar="OUT", action=OutputPath, help="write one Chrome trace holding both timelines")
    parser.add_argument("--max-error", type=non_negative_number, metavar="PCT",
                        help=f"exit {EXIT_OVER_MAX_ERROR} when |makespan error| exceeds PCT percent")  # fmt: skip
    parser.add_argument("--min-duration", type=non_negative_number, default=10.0, metavar="US",
                        help="leave ops shorter than this (measured, us) out of the duration-error percentages")  # fmt: skip


def print_comparison(cmp: Comparison, console: Console) -> None:
    data = cmp.to_json()
    drawn = f" (per-op medians of {cmp.predicted_samples} samples)" if cmp.predicted_samples > 1 else ""
    iters = f" (per-op medians of {cmp.measured_iterations} iterations)" if cmp.measured_iterations else ""
    console.print(f"[bold]{cmp.schedule}[/]: predicted {format_us(cmp.predicted_makespan_us)}{drawn}, "
                  f"measured {format_us(cmp.measured_makespan_us)}{iters}, makespan error [bold]{cmp.makespan_error_pct:+.2f}%[/]")  # fmt: skip
    d, s = data["duration_error_pct"], data["start_error_us"]
    table = Table(box=None, pad_edge=False)
    for col in ("per-op error", "median", "p90", "worst", "worst op"):
        table.add_column(col)
    table.add_row("duration %", f"{d['median']:.1f}", f"{d['p90']:.1f}", f"{d['worst']:.1f}",
                  f"{d.get('worst_name', '')} {d.get('worst_source', '')}")  # fmt: skip
    table.add_row("start", format_us(s["median"]), format_us(s["p90"]), format_us(s["worst"]),
                  f"{s.get('worst_name', '')} {s.get('worst_source', '')}")  # fmt: skip
    console.print(table)
    ranks = Table(box=None, pad_edge=False)
    ranks.add_column("rank")
    for col in ("compute", "comm", "exposed comm", "idle"):
        ranks.add_column(f"{col} pred/meas", justify="right")
    for r, (p, m) in sorted(cmp.ranks.items()):
        ranks.add_row(str(r), *(f"{format_us(getattr(p, f))} / {format_us(getattr(m, f))}"
                                for f in ("compute_us", "comm_us", "exposed_comm_us", "idle_us")))  # fmt: skip
    console.print(ranks)
    for c in cmp.compute_rates:
        ranks_text = ", ".join(f"{t:.3g} on rank {r}" for r, t in sorted(c.measured_tflops.items()))
        console.print(f"FLOP block in {c.dtype}: the machine file says {c.machine_tflops:.3g} TFLOP/s, this run's start-up timed "
                      f"{ranks_text} (the machine file {c.error_pct:+.1f}%): FLOP-sized compute is predicted off by about as "
                      f"much for the machine's speed alone")  # fmt: skip
    if cmp.memory_peaks:
        print_memory_peaks(cmp, console)
    console.print(f"{len(cmp.ops)} ops compared")
    for warning in cmp.warnings():
        console.print(f"[yellow]warning[/]: {escape(warning)}")
    if cmp.unmatched:
        shown = "\n  ".join(escape(u) for u in cmp.unmatched[:MAX_UNMATCHED_SHOWN])
        more = f"\n  ... and {len(cmp.unmatched) - MAX_UNMATCHED_SHOWN} more (--json lists all)" if len(cmp.unmatched) > MAX_UNMATCHED_SHOWN else ""
        console.print(f"[yellow]not paired[/] ({len(cmp.unmatched)}):\n  {shown}{more}")
    elif cmp.only_predicted or cmp.only_measured:
        console.print(f"[yellow]warning[/]: {len(cmp.only_predicted)} ops only predicted, {len(cmp.only_measured)} only measured "
                      f"(e.g. {(cmp.only_predicted + cmp.only_measured)[:3]})")  # fmt: skip


def print_memory_peaks(cmp: Comparison, console: Console) -> None:
    """Each rank's peak of declared memory, predicted against measured."""
    console.print(f"memory peak per rank (measured: {cmp.memory_source or 'the run'}):")
    table = Table(box=None, pad_edge=False)
    for col in ("rank", "predicted", "measured", "error"):
        table.add_column(col, justify="right")
    for r, (p, m) in cmp.memory_peaks.items():
        error = f"{100.0 * (p - m) / m:+.1f}%" if m else "-"
        table.add_row(str(r), format_bytes(p), format_bytes(m), error)
    console.print(table)


def run(args: argparse.Namespace) -> int:
    require_output_folder("--html", args.html)
    predicted = unfolded(Timeline.read(args.predicted))
    if is_trace_path(args.measured):
        from commdsl.progress import Progress

        with Progress("commdsl compare") as progress:
            progress.phase(f"reading the profiler traces in {args.measured}")
            job = read_job(args.measured, args.step, "a comparison")
            progress.phase("finding the schedule's ops in the traces")
            cmp, match = compare_trace(predicted, job, min_duration_us=args.min_duration)
        measured = match.measured
    else:
        if args.step is not None:
            raise UsageError("--step applies to profiler traces; a measured timeline holds per-op medians already")
        measured = Timeline.read(args.measured)
        cmp = compare_named(predicted, measured, args.predicted, args.measured, args.min_duration)
    if args.json:
        cmp.write_json(sys.stdout)
        print()
        for warning in cmp.warnings():  # on stderr, so that stdout stays JSON
            Console(stderr=True, highlight=False).print(f"[yellow]warning[/]: {escape(warning)}")
    else:
        print_comparison(cmp, Console(highlight=False))
    if args.html:
        from commdsl.report import render_html

        write_text(args.html, render_html(cmp, predicted, measured), "--html")
    if args.trace:
        write_text(args.trace, json.dumps(combined_trace(predicted, measured), sort_keys=True, separators=(",", ":")) + "\n", "--trace")
    if args.max_error is not None and abs(cmp.makespan_error_pct) > args.max_error:
        Console(stderr=True, highlight=False).print(
            f"makespan error {cmp.makespan_error_pct:+.2f}% exceeds --max-error {args.max_error:g}%"
        )
        return EXIT_OVER_MAX_ERROR
    return 0
