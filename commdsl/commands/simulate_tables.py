"""The terminal tables of `commdsl simulate`: a `Summary` printed with rich (the
command imports this module only when it prints to the terminal, not for `--json`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from rich.console import Console
from rich.table import Table

from commdsl.errors import escape_markup as escape
from commdsl.sim.gantt import fits, gantt_lines
from commdsl.sim.simulate import SimResult
from commdsl.sim.summary import Summary, format_bytes, format_us

_PATH_ROWS = 24
"""Critical-path steps shown: the first and last half of them, however long the path."""
_RANK_ROWS = 64
"""Ranks shown in the per-rank tables: the first and last half of them (--json has all)."""

T = TypeVar("T")


def _bounded(rows: Sequence[T], limit: int) -> tuple[Sequence[T], int, Sequence[T]]:
    """The first and the last `limit // 2` of `rows` and how many lie between them (all
    of `rows`, none between, if they fit in `limit`)."""
    if len(rows) <= limit:
        return rows, 0, ()
    half = limit // 2
    return rows[:half], len(rows) - 2 * half, rows[-half:]


def print_terminal(result: SimResult, summary: Summary, *, links: int | None, gantt: str, trace: str | None) -> None:
    """What `commdsl simulate` prints without --json: the summary, the `links` busiest
    links (None: none), the Gantt chart (`gantt`: auto, always, never) and where the
    trace went."""
    console = Console(highlight=False, soft_wrap=True)
    print_summary(console, summary)
    if links is not None:
        print_links(console, summary, links)
    if gantt == "always" or (gantt == "auto" and fits(result)):
        console.print()
        for line in gantt_lines(result):
            console.print(line)
    if trace:
        console.print(f"\ntrace: {escape(trace)} (open it in https://ui.perfetto.dev)")
        if result.program.fold is not None:
            console.print(f"  it holds the {result.program.fold.label} ranks, which stand for every replica (--no-fold: every rank's)")


def print_summary(console: Console, s: Summary) -> None:
    console.print(f"[bold]{escape(s.schedule)}[/] on {escape(s.machine)} ({s.network} network): "
                  f"{s.world_size} ranks, {s.num_ops:,} ops")  # fmt: skip
    bubble = f"{s.bubble_fraction:.4f}" if s.bubble_fraction is not None else "-"
    console.print(f"  makespan [bold]{format_us(s.makespan_us)}[/]   bubble fraction {bubble}")
    if s.fold:
        console.print(f"  {escape(s.fold)}")
    if s.sample_makespans_us:
        ms = s.sample_makespans_us
        console.print(f"  per-op medians over {len(ms)} samples of the machine's compute stalls; "
                      f"sample makespans {format_us(min(ms))} to {format_us(max(ms))}")  # fmt: skip
    table = Table(box=None, pad_edge=False)
    for col in ("rank", "compute", "comm", "exposed comm", "idle", "bubble"):
        table.add_column(col, justify="right")
    head, skipped, tail = _bounded(s.ranks, _RANK_ROWS)
    for i, r in enumerate((*head, *tail)):
        if skipped and i == len(head):
            table.add_row("...", f"{skipped} more ranks", "", "", "", "")
        table.add_row(
            str(r.rank), format_us(r.compute_us), format_us(r.comm_us), format_us(r.exposed_comm_us),
            format_us(r.idle_us), f"{r.bubble_fraction:.4f}" if r.bubble_fraction is not None else "-",
        )  # fmt: skip
    console.print(table)
    if s.memory:
        print_memory(console, s)
    path = s.critical_path
    console.print(f"critical path ({len(path)} ops):")
    head, skipped, tail = _bounded(path, _PATH_ROWS)
    for i, step in enumerate((*head, *tail)):
        if skipped and i == len(head):
            console.print(f"  ... {skipped} more ...")
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
    head, skipped, tail = _bounded(s.memory, _RANK_ROWS)
    for i, m in enumerate((*head, *tail)):
        if skipped and i == len(head):
            table.add_row("...", "", "", f"{skipped} more ranks")
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
