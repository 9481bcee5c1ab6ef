"""`commdsl simulate`: predict a schedule's timeline on a machine.

    commdsl simulate 1f1b                              # summary, critical path, Gantt
    commdsl simulate 1f1b --machine a100-nvlink --trace predicted.json
    commdsl simulate my.yaml -p stages=8 --json        # summary as JSON (makespan_us, flows, links, ...)
    commdsl simulate memcpy_vs_nccl --machine pcie-nvlink-pairs --links   # busiest links
    commdsl simulate tp_mlp --machine dgx-h100 --nodes 2 -p dp=2 -p tp=8  # a 2-node cluster
    commdsl simulate 1f1b --network analytic           # no contention (the closed forms)
    commdsl simulate 1f1b --machine machine.yaml --samples 25   # draw the calibrated compute stalls
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from commdsl.cli import add_schedule_arguments, count_at_least, load_from_args
from commdsl.machine import DEFAULT_MACHINE, resolve_machine
from commdsl.progress import Progress
from commdsl.sim import NETWORKS, simulate
from commdsl.sim.gantt import fits, gantt_lines
from commdsl.sim.models import DEFAULT_NETWORK
from commdsl.sim.summary import Summary, format_bytes, format_us, summarize

_PATH_ROWS = 24


def add_machine_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of every command that simulates."""
    parser.add_argument("--machine", default=DEFAULT_MACHINE, metavar="NAME|PATH",
                        help=f"machine preset or machine YAML file (default {DEFAULT_MACHINE})")  # fmt: skip
    parser.add_argument("--network", default=DEFAULT_NETWORK, choices=sorted(NETWORKS),
                        help=f"network model: flow (links shared max-min), analytic (no contention), flow-steps "
                             f"(collectives step by step, for validation); default {DEFAULT_NETWORK}")  # fmt: skip
    parser.add_argument("--nodes", type=count_at_least(1), default=None, metavar="N",
                        help="number of nodes of a machine with a topology (e.g. --machine dgx-h100 --nodes 8)")  # fmt: skip


def machine_from_args(args: argparse.Namespace):
    """--machine, with --nodes applied."""
    return resolve_machine(args.machine, nodes=args.nodes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_schedule_arguments(parser)
    add_machine_arguments(parser)
    parser.add_argument("--trace", metavar="OUT.json", default=None,
                        help="write the predicted timeline as Chrome-trace JSON (opens in Perfetto)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--gantt", choices=("auto", "always", "never"), default="auto",
                        help="terminal Gantt chart (auto: for small schedules)")  # fmt: skip
    parser.add_argument("--links", type=count_at_least(1), nargs="?", const=10, default=None, metavar="N",
                        help="print the N busiest links (default 10) with bytes, busy time and utilisation")  # fmt: skip
    add_sampling_arguments(parser)


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """--samples and --seed (simulate, and run --compare)."""
    parser.add_argument("--samples", type=count_at_least(1), default=1, metavar="N",
                        help="draw the machine's random compute stalls (compute_noise, from calibration) in N runs "
                             "and report each op's median, as commdsl.run does over its iterations (default 1: no noise)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="first random seed of --samples (default 0)")


def run(args: argparse.Namespace) -> int:
    with Progress("commdsl simulate") as progress:
        progress.phase(f"expanding {args.schedule}")
        program = load_from_args(args)
        machine = machine_from_args(args)
        progress.phase(f"simulating on {machine.name}", unit="ops")
        result = simulate(program, machine, args.network, samples=args.samples, seed=args.seed, progress=progress.update)
        if args.trace:
            progress.phase(f"writing the trace {args.trace}")
            result.timeline.write(args.trace, program.streams, flag="--trace")
        progress.phase("summarising")
        summary = summarize(result)
    if args.json:
        print(json.dumps(summary.to_json(), indent=1))
        return 0
    console = Console(highlight=False, soft_wrap=True)
    print_summary(console, summary)
    if args.links is not None:
        print_links(console, summary, args.links)
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
    if s.sample_makespans_us:
        ms = s.sample_makespans_us
        console.print(f"  per-op medians over {len(ms)} samples of the machine's compute stalls; "
                      f"sample makespans {format_us(min(ms))} to {format_us(max(ms))}")  # fmt: skip
    table = Table(box=None, pad_edge=False)
    for col in ("rank", "compute", "comm", "exposed comm", "idle", "bubble"):
        table.add_column(col, justify="right")
    for r in s.ranks:
        table.add_row(
            str(r.rank), format_us(r.compute_us), format_us(r.comm_us), format_us(r.exposed_comm_us),
            format_us(r.idle_us), f"{r.bubble_fraction:.4f}" if r.bubble_fraction is not None else "-",
        )  # fmt: skip
    console.print(table)
    if s.memory:
        print_memory(console, s)
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
    if s.transfers:
        console.print("transfers:")
        table = Table(box=None, pad_edge=False)
        for col in ("transport", "op", "count", "bytes", "mean time", "mean algbw"):
            table.add_column(col, justify="right")
        for t in s.transfers:
            table.add_row(t.transport, t.kind, str(t.count), format_bytes(t.bytes), format_us(t.mean_us), f"{t.mean_algbw_gb_per_s:.2f} GB/s")
        console.print(table)
    if s.slowed:
        if s.sm_share:
            why = "NCCL kernels hold SMs, one per channel, and their transfers share the device's memory bandwidth"
        else:
            own = ", or the op's own factor where the machine lists it (interference_by_op)" if s.per_op_interference else ""
            why = f"interference x{s.compute_slowdown:g} while an NCCL kernel of the device runs{own}"
        console.print(f"compute slowed by comm kernels ({why}):")
        for c in s.slowed:
            console.print(f"  {escape(c.name)}: {c.slowed_ops} of {c.ops} ops slowed, mean {format_us(c.nominal_us)} -> "
                          f"{format_us(c.mean_us)} (x{c.mean_us / c.nominal_us:.2f})")  # fmt: skip
    for w in s.warnings[:10]:
        console.print(f"[yellow]warning[/]: {escape(w)}")


def print_memory(console: Console, s: Summary) -> None:
    """Each rank's peak of declared memory and the largest things live at it."""
    console.print("memory (declared buffers; peak per rank and what is live then):")
    table = Table(box=None, pad_edge=False)
    for col, justify in (("rank", "right"), ("peak", "right"), ("at", "right"), ("live at the peak", "left")):
        table.add_column(col, justify=justify)
    for m in s.memory:
        shown = [f"{escape(g.first)}{f' +{g.count - 1}' if g.count > 1 else ''} {format_bytes(g.size_bytes)} ({escape(g.statement)})"
                 for g in m.live_at_peak[:3]]  # fmt: skip
        if len(m.live_at_peak) > 3:
            more = len(m.live_at_peak) - 3
            shown.append(f"+{more} more statement{'' if more == 1 else 's'}")
        table.add_row(str(m.rank), format_bytes(m.peak_bytes), format_us(m.peak_us), "; ".join(shown) or "-")
    console.print(table)


def print_links(console: Console, s: Summary, top: int) -> None:
    if not s.links:
        console.print(f"links: the {s.network} network has no link model (use --network flow)")
        return
    console.print(f"busiest links (of {len(s.links)} that carried bytes):")
    table = Table(box=None, pad_edge=False)
    for col in ("link", "kind", "GB/s", "bytes", "busy", "utilisation", "peak"):
        table.add_column(col, justify="right")
    for link in s.links[:top]:
        table.add_row(escape(link.name), link.kind, f"{link.bandwidth_gb_per_s:g}", format_bytes(link.bytes), format_us(link.busy_us),
                      f"{link.utilization:.3f}", f"{link.peak_utilization:.3f}")  # fmt: skip
    console.print(table)
