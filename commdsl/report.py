"""Self-contained HTML report of a comparison (`commdsl compare --html`), and the
static SVG picture of both timelines (`timeline_svg`, the README's figure).

The page loads nothing from the network: its timeline is a canvas as wide as the page,
drawn by a small inline script from the spans embedded as JSON (one lane per rank and
track, predicted above measured; the mouse wheel zooms around the pointer, dragging
pans, a double click resets, hovering shows an op). Times are rounded to what a reader
can tell apart (`86.08 ms`: four significant digits), with one unit per table column.
The worst ops link to their statements, quoted from the schedule file under the tables.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

from commdsl.comparison import Comparison, OpError
from commdsl.dsl.values import format_us
from commdsl.files import is_file, source_lines
from commdsl.resources import resolve_schedule
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


SIGNIFICANT_DIGITS = 4
"""Digits a report shows of a time: 86.08 ms, 1.234 s, 412.5 us."""

_UNITS = (("s", 1e6), ("ms", 1e3), ("us", 1.0), ("ns", 1e-3))
"""Time units, largest first, with their size in microseconds."""

WORST_OPS = 25
"""Ops listed in the report's table of largest duration errors."""

SOURCE_CONTEXT_LINES = 1
"""Lines quoted above and below each linked statement."""


def time_unit(values_us: list[float]) -> tuple[str, float]:
    """The unit a column of times is shown in: the largest one that keeps the column's
    largest magnitude at 1 or more (microseconds for a column of zeros)."""
    top = max((abs(v) for v in values_us), default=0.0)
    return next(((u, m) for u, m in _UNITS if top >= m), ("us", 1.0) if top == 0 else _UNITS[-1])


def column_decimals(values_us: list[float], scale_us: float) -> int:
    """Decimals that show the column's largest magnitude with `SIGNIFICANT_DIGITS`
    digits: every entry of the column then has the same decimals."""
    top = max((abs(v) / scale_us for v in values_us), default=0.0)
    whole_digits = int(math.floor(math.log10(top))) + 1 if top > 0 else 1
    return max(SIGNIFICANT_DIGITS - whole_digits, 0)


def format_time(us: float) -> str:
    """One time with its own unit, rounded to `SIGNIFICANT_DIGITS`: `86.08 ms`."""
    unit, scale = time_unit([us])
    return f"{us / scale:.{column_decimals([us], scale)}f} {unit}"


def time_column(values_us: list[float]) -> tuple[str, list[str]]:
    """A table column of times in one unit: the unit, and each value as text."""
    unit, scale = time_unit(values_us)
    decimals = column_decimals(values_us, scale)
    return unit, [f"{v / scale:.{decimals}f}" for v in values_us]


def _table(headers: list[str], columns: list[list[str]], numeric: set[int]) -> str:
    """An HTML table from columns of (already escaped) cells; `numeric` columns align right."""
    head = "".join(f'<th{" class=num" if i in numeric else ""}>{h}</th>' for i, h in enumerate(headers))
    rows = "".join("<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{c}</td>' for i, c in enumerate(cells)) + "</tr>"
                   for cells in zip(*columns))  # fmt: skip
    return f"<table><tr>{head}</tr>{rows}</table>"


def _rank_table(cmp: Comparison) -> str:
    ranks = sorted(cmp.ranks.items())
    headers, columns = ["rank"], [[str(r) for r, _ in ranks]]
    for field_name, label in (("compute_us", "compute"), ("comm_us", "comm"), ("exposed_comm_us", "exposed comm"), ("idle_us", "idle")):
        for side, which in (("pred", 0), ("meas", 1)):
            unit, cells = time_column([getattr(pair[which], field_name) for _, pair in ranks])
            headers.append(f"{label} {side} ({unit})")
            columns.append(cells)
    return _table(headers, columns, set(range(1, len(headers))))


def _worst_table(worst: list[OpError], anchors: dict[str, str]) -> str:
    p_unit, predicted = time_column([e.predicted_duration_us for e in worst])
    m_unit, measured = time_column([e.measured_duration_us for e in worst])
    s_unit, starts = time_column([e.start_error_us for e in worst])
    sources = [f'<a href="#{anchors[e.source]}">{html.escape(e.source)}</a>' if e.source in anchors else html.escape(e.source) for e in worst]
    columns = [[html.escape(e.op_id) for e in worst], [html.escape(e.kind) for e in worst], [html.escape(e.name) for e in worst],
               predicted, measured, [f"{e.duration_error_pct:+.1f}" for e in worst], starts, sources]  # fmt: skip
    headers = ["op", "kind", "name", f"predicted ({p_unit})", f"measured ({m_unit})", "error (%)", f"start error ({s_unit})", "source"]
    return _table(headers, columns, {3, 4, 5, 6})


def _schedule_file(name: str) -> Path | None:
    """The file a span's "file:line" names: the path as written, or a bundled schedule."""
    if is_file(name):
        return Path(name)
    if Path(name).parent.name == "schedules":
        return resolve_schedule(Path(name).name)
    return None


def _sources(worst: list[OpError]) -> tuple[dict[str, str], str]:
    """Per "file:line" of the worst ops whose file is readable, the id of its quote, and
    the section that quotes each statement with a line around it."""
    wanted: dict[str, set[int]] = {}
    for e in worst:
        file, _, line = e.source.rpartition(":")
        if file and line.isdigit():
            wanted.setdefault(file, set()).add(int(line))
    anchors: dict[str, str] = {}
    blocks = []
    for file, numbers in wanted.items():
        path = _schedule_file(file)
        try:
            lines = source_lines(path.read_text(encoding="utf-8")) if path is not None else ()
        except (OSError, UnicodeDecodeError):  # a report never fails for a source it cannot quote
            lines = ()
        for number in sorted(n for n in numbers if 0 < n <= len(lines)):
            anchor = f"src-{len(anchors)}"
            anchors[f"{file}:{number}"] = anchor
            first, last = max(number - SOURCE_CONTEXT_LINES, 1), min(number + SOURCE_CONTEXT_LINES, len(lines))
            quoted = "".join(f'<span class="{"hit" if n == number else "ctx"}">{n:>5}  {html.escape(lines[n - 1])}</span>\n'
                             for n in range(first, last + 1))  # fmt: skip
            blocks.append(f'<div id="{anchor}" class="src"><div class="file">{html.escape(file)}:{number}</div><pre>{quoted}</pre></div>')
    return anchors, "".join(blocks)


def _timeline_data(predicted: Timeline, measured: Timeline) -> dict:
    """The spans the page's script draws: per lane (rank, track, side) its spans as
    [start, end, kind, name, op id] (kind and name as indexes into shared lists), times in
    microseconds from each timeline's first span."""
    p_lanes, m_lanes = _lanes(predicted), _lanes(measured)
    kinds = [k for k in _COLORS]
    names: dict[str, int] = {}
    lanes = []
    for rank, track in sorted(set(p_lanes) | set(m_lanes)):
        for side, source in (("predicted", p_lanes), ("measured", m_lanes)):
            spans = [[round(a, 3), round(b, 3), kinds.index(s.kind), names.setdefault(s.name, len(names)), s.op_id]
                     for a, b, s in source.get((rank, track), [])]  # fmt: skip
            lanes.append({"label": f"rank {rank} {track} · {side}", "measured": side == "measured", "spans": spans})
    return {"kinds": kinds, "colors": [_COLORS[k] for k in kinds], "names": list(names), "lanes": lanes}


def _legend(timeline: dict) -> str:
    """The op kinds the timeline shows, each with its colour."""
    shown = {s[2] for lane in timeline["lanes"] for s in lane["spans"]}
    keys = "".join(f'<span class="key"><i style="background:{timeline["colors"][k]}"></i>{html.escape(timeline["kinds"][k])}</span>'
                   for k in sorted(shown))  # fmt: skip
    return f'<div class="legend">{keys}</div>'


def _json_for_script(value: object) -> str:
    """JSON safe inside a <script> element: no "</" to close it early."""
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/")


def render_html(cmp: Comparison, predicted: Timeline, measured: Timeline) -> str:
    data = cmp.to_json()
    d, s = data["duration_error_pct"], data["start_error_us"]
    worst = sorted(cmp.ops, key=lambda e: abs(e.duration_error_us), reverse=True)[:WORST_OPS]
    anchors, source_section = _sources(worst)

    def where(stats: dict) -> str:
        source = stats.get("worst_source", "")
        name = html.escape(stats.get("worst_name", ""))
        return f'{name} <a href="#{anchors[source]}">{html.escape(source)}</a>' if source in anchors else f"{name} {html.escape(source)}"

    summary = [
        ("predicted makespan", format_time(cmp.predicted_makespan_us)),
        ("measured makespan", format_time(cmp.measured_makespan_us)),
        ("makespan error", f"{cmp.makespan_error_pct:+.2f}%"),
        ("ops compared", str(len(cmp.ops))),
        ("duration error (median / p90 / worst)", f"{d['median']:.1f}% / {d['p90']:.1f}% / {d['worst']:.1f}% {where(d)}"),
        ("start error (median / p90 / worst)",
         f"{format_time(s['median'])} / {format_time(s['p90'])} / {format_time(s['worst'])} {where(s)}"),
    ]  # fmt: skip
    summary_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{v}</td></tr>" for k, v in summary)
    sources = f"<h2>Statements</h2>{source_section}" if source_section else ""
    timeline = _timeline_data(predicted, measured)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>commdsl: {html.escape(cmp.schedule)} predicted vs measured</title>
<style>{_PAGE_STYLE}</style></head><body>
<h1>{html.escape(cmp.schedule)}: predicted vs measured</h1>
<table>{summary_rows}</table>
<h2>Timelines</h2>
<p class="hint">Per rank and track, the predicted lane above the measured one (lighter). Wheel: zoom around the pointer;
drag: pan; double click: the whole run; hover: an op.</p>
<div id="timeline"><canvas id="lanes"></canvas><div id="tip"></div></div>
{_legend(timeline)}
<h2>Per rank</h2>
{_rank_table(cmp)}
<h2>Largest duration errors</h2>
{_worst_table(worst, anchors)}
{sources}
<script type="application/json" id="timeline-data">{_json_for_script(timeline)}</script>
<script>{_PAGE_SCRIPT}</script>
</body></html>
"""


_PAGE_STYLE = """
body { font: 13px system-ui, sans-serif; margin: 18px; color: #222; }
table { border-collapse: collapse; margin: 8px 0 18px; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.hint { color: #555; }
#timeline { position: relative; width: 100%; border: 1px solid #ddd; }
#lanes { display: block; width: 100%; cursor: grab; }
#tip { position: absolute; display: none; pointer-events: none; background: #fffff0; border: 1px solid #999;
       padding: 3px 6px; font: 12px monospace; white-space: pre; box-shadow: 1px 1px 3px #0003; }
.legend { margin: 4px 0 0; } .key { margin-right: 14px; }
.key i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; vertical-align: -1px; }
.src { margin: 6px 0; } .src .file { font: bold 12px monospace; }
.src pre { margin: 2px 0; background: #f7f7f7; padding: 4px; } .src .hit { background: #fff3a0; } .src .ctx { color: #777; }
.src:target pre { outline: 2px solid #e15759; }
"""

# The timeline's script: draws the lanes on a canvas as wide as the page; view = the
# time window shown [t0, t1] in microseconds. No library, no network.
_PAGE_SCRIPT = r"""
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("timeline-data").textContent);
  const canvas = document.getElementById("lanes"), tip = document.getElementById("tip");
  const ctx = canvas.getContext("2d");
  const LANE = 16, GAP = 3, TOP = 22, LABEL = 200;
  let end = 0;
  for (const lane of data.lanes) for (const s of lane.spans) end = Math.max(end, s[1]);
  end = end > 0 ? end : 1;
  let t0 = 0, t1 = end, width = 0;
  const UNITS = [["s", 1e6], ["ms", 1e3], ["us", 1], ["ns", 1e-3]];
  function fmt(us) {
    if (us === 0) return "0";
    const a = Math.abs(us);
    const [u, m] = UNITS.find(([, m]) => a >= m) || (a === 0 ? ["us", 1] : UNITS[3]);
    const v = us / m, whole = v === 0 ? 1 : Math.floor(Math.log10(Math.abs(v))) + 1;
    return v.toFixed(Math.max(4 - whole, 0)) + " " + u;
  }
  const xOf = (t) => LABEL + (t - t0) / (t1 - t0) * (width - LABEL - 8);
  const tOf = (x) => t0 + (x - LABEL) / (width - LABEL - 8) * (t1 - t0);
  function step(span) {  // a round tick step: 1, 2 or 5 times a power of ten, ~8 ticks
    const raw = span / 8, p = Math.pow(10, Math.floor(Math.log10(raw)));
    return [1, 2, 5, 10].map((k) => k * p).find((s) => s >= raw);
  }
  function draw() {
    const ratio = window.devicePixelRatio || 1;
    width = canvas.parentElement.clientWidth;
    const height = TOP + data.lanes.length * (LANE + GAP) + 8;
    canvas.width = width * ratio; canvas.height = height * ratio; canvas.style.height = height + "px";
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, width, height);
    ctx.font = "10px monospace"; ctx.textAlign = "center";
    const dt = step(t1 - t0);
    for (let t = Math.ceil(t0 / dt) * dt; t <= t1; t += dt) {
      const x = xOf(t);
      ctx.fillStyle = "#eee"; ctx.fillRect(x, TOP - 4, 1, height);
      ctx.fillStyle = "#666"; ctx.fillText(fmt(t), x, 12);
    }
    ctx.save(); ctx.beginPath(); ctx.rect(LABEL, 0, width - LABEL, height); ctx.clip();
    data.lanes.forEach((lane, i) => {
      const y = TOP + i * (LANE + GAP);
      ctx.globalAlpha = lane.measured ? 0.6 : 1;
      for (const s of lane.spans) {
        if (s[1] < t0 || s[0] > t1) continue;
        const x = xOf(s[0]);
        ctx.fillStyle = data.colors[s[2]];
        ctx.fillRect(x, y, Math.max(xOf(s[1]) - x, 0.5), LANE - 2);
      }
    });
    ctx.restore(); ctx.globalAlpha = 1;
    ctx.textAlign = "left"; ctx.font = "11px monospace"; ctx.fillStyle = "#333";
    data.lanes.forEach((lane, i) => ctx.fillText(lane.label, 4, TOP + i * (LANE + GAP) + 11, LABEL - 8));
    document.body.dataset.drawnSpans = String(data.lanes.reduce((n, l) => n + l.spans.length, 0));
  }
  function spanAt(x, y) {
    const i = Math.floor((y - TOP) / (LANE + GAP));
    if (i < 0 || i >= data.lanes.length || x < LABEL) return null;
    const t = tOf(x), slack = 3 * (t1 - t0) / (width - LABEL);
    let best = null;
    for (const s of data.lanes[i].spans) if (s[0] - slack <= t && t <= s[1] + slack && (!best || s[1] - s[0] < best[1] - best[0])) best = s;
    return best && [data.lanes[i], best];
  }
  let drag = null;
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const t = tOf(ev.offsetX), k = Math.exp(ev.deltaY * 0.002);
    const span = Math.min(Math.max((t1 - t0) * k, end * 1e-9), end * 1.02);
    const f = (t - t0) / (t1 - t0);
    t0 = t - f * span; t1 = t0 + span; draw();
  }, { passive: false });
  canvas.addEventListener("mousedown", (ev) => { drag = [ev.offsetX, t0, t1]; canvas.style.cursor = "grabbing"; });
  window.addEventListener("mouseup", () => { drag = null; canvas.style.cursor = "grab"; });
  canvas.addEventListener("dblclick", () => { t0 = 0; t1 = end; draw(); });
  canvas.addEventListener("mousemove", (ev) => {
    if (drag) {
      const shift = (ev.offsetX - drag[0]) / (width - LABEL - 8) * (drag[2] - drag[1]);
      t0 = drag[1] - shift; t1 = drag[2] - shift; draw(); tip.style.display = "none"; return;
    }
    const hit = spanAt(ev.offsetX, ev.offsetY);
    if (!hit) { tip.style.display = "none"; return; }
    const [lane, s] = hit;
    tip.textContent = data.names[s[3]] + "  [" + s[4] + "]  " + data.kinds[s[2]] + "\n" + lane.label + "\n" +
      fmt(s[0]) + " \u2192 " + fmt(s[1]) + "  (" + fmt(s[1] - s[0]) + ")";
    tip.style.left = Math.min(ev.offsetX + 12, width - 260) + "px"; tip.style.top = (ev.offsetY + 14) + "px";
    tip.style.display = "block";
  });
  canvas.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  window.addEventListener("resize", draw);
  draw();
})();
"""
