"""A compact terminal Gantt chart for small schedules.

One row per (rank, stream) and one per rank for its comm queues; time runs left to
right in `width` columns. A cell shows what covers most of its time slice: a compute
op's first letter (F, B, W...), `>` send, `<` recv, `=` collective, `c` copy, `.` idle.
"""

from __future__ import annotations

from commdsl.dsl.values import format_us
from commdsl.ir import OpKind
from commdsl.sim.result import SimOutcome

MAX_RANKS = 32
MAX_OPS = 5000

_STYLE = {"compute": "green", "send": "cyan", "recv": "blue", "collective": "magenta", "copy": "yellow"}


def fits(result: SimOutcome) -> bool:
    return result.program.world_size <= MAX_RANKS and result.program.num_ops <= MAX_OPS and result.makespan_us > 0


def _symbol(op) -> tuple[str, str]:
    if op.kind is OpKind.COMPUTE:
        letter = next((c for c in op.name if c.isalnum()), "#")
        return letter, "compute"
    if op.kind is OpKind.SEND:
        return ">", "send"
    if op.kind is OpKind.RECV:
        return "<", "recv"
    if op.kind.is_collective:
        return "=", "collective"
    return "c", "copy"


def gantt_lines(result: SimOutcome, width: int = 96) -> list[str]:
    """Rich-markup lines of the chart (header, one row per track, legend)."""
    raw, program = result.raw, result.program
    makespan = result.makespan_us
    col_us = makespan / width
    rows: dict[tuple[int, str], list[float]] = {}
    cells: dict[tuple[int, str], list[tuple[str, str] | None]] = {}
    for g, op in enumerate(raw.ops):
        if not (op.kind is OpKind.COMPUTE or op.kind is OpKind.COPY or op.kind.is_comm):
            continue
        s, e = raw.start[g], raw.end[g]
        if e <= s:
            continue
        track = (op.rank, "comm" if op.kind.is_comm else op.stream)
        cover = rows.setdefault(track, [0.0] * width)
        cell = cells.setdefault(track, [None] * width)
        sym = _symbol(op)
        first, last = int(s / col_us), min(int(e / col_us), width - 1)
        for c in range(first, last + 1):
            overlap = min(e, (c + 1) * col_us) - max(s, c * col_us)
            if overlap > cover[c]:
                cover[c] = overlap
                cell[c] = sym
    label_w = max((len(f"{r} {t}") for r, t in cells), default=4)
    end = format_us(makespan, 3)
    out = [f"{'':{label_w}}  0{' ' * (width - 1 - len(end))}{end}"]
    stream_order = {s: i for i, s in enumerate(program.streams)}
    for track in sorted(cells, key=lambda t: (t[0], t[1] == "comm", stream_order.get(t[1], 0))):
        text = []
        for sym in cells[track]:
            if sym is None:
                text.append("[dim].[/]")
            else:
                text.append(f"[{_STYLE[sym[1]]}]{_escape(sym[0])}[/]")
        out.append(f"{track[0]} {track[1]:<{label_w - len(str(track[0])) - 1}} |" + "".join(text) + "|")
    out.append(f"{'':{label_w}}  each column = {format_us(col_us, 3)};  F/B...: compute   >: send   <: recv   =: collective   c: copy   .: idle")
    return out


def _escape(ch: str) -> str:
    return "\\[" if ch == "[" else ch

