"""Self-contained HTML report of a comparison: both timelines on one time axis.

The page has no scripts and no external resources, so it opens offline: inline SVG
with one lane per (rank, track), predicted above measured, and the error tables.
"""

from __future__ import annotations

import html

from commdsl.comparison import Comparison
from commdsl.dsl.values import format_us
from commdsl.timeline import SpanRole, Timeline

_COLORS = {
    "compute": "#4e79a7", "host": "#9c755f", "copy": "#76b7b2", "send": "#f28e2b", "recv": "#edc948",
    "all_reduce": "#e15759", "all_gather": "#b07aa1", "reduce_scatter": "#ff9da7", "all_to_all": "#59a14f",
    "broadcast": "#8cd17d", "reduce": "#d37295", "gather": "#a0cbe8", "scatter": "#fabfd2", "barrier": "#79706e",
}  # fmt: skip
_LANE_PX = 16
_WIDTH_PX = 1100
_LABEL_PX = 190


def _lanes(tl: Timeline) -> dict[tuple[int, str], list]:
    lanes: dict[tuple[int, str], list] = {}
    t0 = min((s.start_us for s in tl.spans), default=0.0)
    for s in tl.spans:
        if s.role is SpanRole.EXEC and s.kind in _COLORS:
            lanes.setdefault((s.rank, s.track), []).append((s.start_us - t0, s.end_us - t0, s))
    return lanes


_SVG_STYLE = (".lbl { font: 11px monospace; fill: #333; } .tick { font: 10px monospace; fill: #666; text-anchor: middle; } "
              ".grid { stroke: #eee; } .title { font: bold 13px sans-serif; fill: #222; } .svg-key { font: 11px sans-serif; fill: #333; }")
_MEASURED = ' opacity="0.6"'
"""Measured lanes are lighter than predicted ones."""


def timeline_svg(cmp: Comparison, predicted: Timeline, measured: Timeline, *, title: tuple[str, ...] = ()) -> str:
    """Both timelines on one time axis as a standalone SVG: per rank and track, the
    predicted lane above the measured one (lighter), a time grid, a legend of the op
    kinds shown, and the lines of `title` on top (the HTML report and the README's picture)."""
    p_lanes, m_lanes = _lanes(predicted), _lanes(measured)
    keys = sorted(set(p_lanes) | set(m_lanes))
    horizon = max(cmp.predicted_makespan_us, cmp.measured_makespan_us, 1e-9)
    scale = (_WIDTH_PX - _LABEL_PX - 10) / horizon
    rows: list[str] = []
    top = 20 + 18 * len(title)
    y = top
    shown: set[str] = set()
    for rank, track in keys:
        for label, lanes in (("predicted", p_lanes), ("measured", m_lanes)):
            rows.append(f'<text x="4" y="{y + 12}" class="lbl">rank {rank} {html.escape(track)} · {label}</text>')
            for a, b, s in lanes.get((rank, track), []):
                x = _LABEL_PX + a * scale
                w = max((b - a) * scale, 0.5)
                tip = f"{s.name} [{s.op_id}] {s.kind} {format_us(a)} → {format_us(b)} ({format_us(b - a)})"
                shown.add(s.kind)
                rows.append(
                    f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{_LANE_PX - 3}" fill="{_COLORS[s.kind]}"'
                    f'{_MEASURED if label == "measured" else ""}><title>{html.escape(tip)}</title></rect>'
                )
            y += _LANE_PX
        y += 6
    ticks = []
    for i in range(11):
        t = horizon * i / 10
        x = _LABEL_PX + t * scale
        ticks.append(f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{y}" class="grid"/>'
                     f'<text x="{x:.1f}" y="{top - 10}" class="tick">{format_us(t, 3)}</text>')  # fmt: skip
    legend, x = [], _LABEL_PX
    for kind in (k for k in _COLORS if k in shown):
        legend.append(f'<rect x="{x}" y="{y + 6}" width="10" height="10" fill="{_COLORS[kind]}"/>'
                      f'<text x="{x + 14}" y="{y + 15}" class="svg-key">{kind}</text>')  # fmt: skip
        x += 24 + 7 * len(kind)
    head = "".join(f'<text x="4" y="{16 + 18 * i}" class="{"title" if i == 0 else "lbl"}">{html.escape(line)}</text>'
                   for i, line in enumerate(title))  # fmt: skip
    return (f'<svg width="{_WIDTH_PX}" height="{y + 26}" xmlns="http://www.w3.org/2000/svg">'
            f'<style>{_SVG_STYLE}</style><rect width="100%" height="100%" fill="white"/>{head}'
            f'{"".join(ticks)}{"".join(rows)}{"".join(legend)}</svg>')  # fmt: skip


def render_html(cmp: Comparison, predicted: Timeline, measured: Timeline) -> str:
    svg = timeline_svg(cmp, predicted, measured)
    data = cmp.to_json()
    d, s = data["duration_error_pct"], data["start_error_us"]
    summary = [
        ("predicted makespan", format_us(cmp.predicted_makespan_us)),
        ("measured makespan", format_us(cmp.measured_makespan_us)),
        ("makespan error", f"{cmp.makespan_error_pct:+.2f}%"),
        ("ops compared", str(len(cmp.ops))),
        ("duration error (median / p90 / worst)", f"{d['median']:.1f}% / {d['p90']:.1f}% / {d['worst']:.1f}% {html.escape(d.get('worst_name', ''))} {html.escape(d.get('worst_source', ''))}"),
        ("start error (median / p90 / worst)", f"{format_us(s['median'])} / {format_us(s['p90'])} / {format_us(s['worst'])} {html.escape(s.get('worst_name', ''))} {html.escape(s.get('worst_source', ''))}"),
    ]
    summary_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{v}</td></tr>" for k, v in summary)
    rank_rows = "".join(
        f"<tr><td>{r}</td>" + "".join(f"<td>{format_us(getattr(p, f))}</td><td>{format_us(getattr(m, f))}</td>" for f in ("compute_us", "comm_us", "exposed_comm_us", "idle_us")) + "</tr>"
        for r, (p, m) in sorted(cmp.ranks.items())
    )
    worst = sorted(cmp.ops, key=lambda e: abs(e.duration_error_us), reverse=True)[:25]
    op_rows = "".join(
        f"<tr><td>{e.op_id}</td><td>{html.escape(e.kind)}</td><td>{html.escape(e.name)}</td><td>{format_us(e.predicted_duration_us)}</td>"
        f"<td>{format_us(e.measured_duration_us)}</td><td>{e.duration_error_pct:+.1f}%</td><td>{format_us(e.start_error_us)}</td><td>{html.escape(e.source)}</td></tr>"
        for e in worst
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>commdsl: {html.escape(cmp.schedule)} predicted vs measured</title>
<style>
body {{ font: 13px system-ui, sans-serif; margin: 18px; color: #222; }}
table {{ border-collapse: collapse; margin: 8px 0 18px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; }}
</style></head><body>
<h1>{html.escape(cmp.schedule)}: predicted vs measured</h1>
<table>{summary_rows}</table>
<h2>Timelines</h2><p>Each rank and track: predicted lane above, measured lane (lighter) below, one time axis.</p>
{svg}
<h2>Per rank</h2>
<table><tr><th>rank</th><th>compute pred</th><th>compute meas</th><th>comm pred</th><th>comm meas</th><th>exposed comm pred</th><th>exposed comm meas</th><th>idle pred</th><th>idle meas</th></tr>{rank_rows}</table>
<h2>Largest duration errors</h2>
<table><tr><th>op</th><th>kind</th><th>name</th><th>predicted</th><th>measured</th><th>error</th><th>start error</th><th>source</th></tr>{op_rows}</table>
</body></html>
"""
