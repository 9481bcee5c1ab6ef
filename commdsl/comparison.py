"""Compare a predicted and a measured timeline, op by op.

Spans are paired by op id ("rank:index"), never by timestamp: both timelines come from
the same expanded Program. Each timeline's times are taken relative to its own first
start, so a measured trace with wall-clock timestamps compares with a simulated one
that starts at zero.

Definitions (all errors are predicted minus measured):
  * makespan error % = (predicted makespan - measured makespan) / measured makespan * 100
  * per-op duration error % = (pred duration - meas duration) / meas duration * 100,
    over ops that do work (compute, host work, copies, communication). Waits, records
    and synchronizes are left out: their span is how long a stream sat blocked, a
    consequence of other ops' timing that both timelines draw but neither predicts
    on its own (their start errors still count). Ops whose measured duration is below
    `min_duration_us` are left out too: a 2 us op with a 1 us error is not a 50% miss;
  * per-op start error (us) = pred start - meas start, and as % of the measured makespan;
  * memory: each rank's peak of declared buffers (`alloc`/`free`), predicted and
    measured (`MEMORY_PEAK_META`), where both timelines carry it.
Statistics use absolute values: median, p90 and worst.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field, replace
from typing import TextIO

from commdsl.breakdown import Breakdown, breakdown_of
from commdsl.errors import UsageError
from commdsl.interop.kineto_read import IMPORTED_HOST_GAP, kernel_op_names
from commdsl.ir import Dtype, Fold, OpKind
from commdsl.machine.model import Machine
from commdsl.timeline import FLOP_RATE_META, FOLD_META, MEMORY_PEAK_META, REQUESTED_DURATION_ARG, Span, SpanRole, Timeline

NON_BUSY_KINDS = frozenset({OpKind.WAIT.value, OpKind.WAIT_EVENT.value, OpKind.RECORD.value, OpKind.SYNCHRONIZE.value,
                            OpKind.ALLOC.value, OpKind.FREE.value})  # fmt: skip


@dataclass(frozen=True, slots=True)
class OpError:
    op_id: str
    kind: str
    name: str
    source: str
    """file:line of the statement that produced the op."""
    predicted_start_us: float
    measured_start_us: float
    predicted_duration_us: float
    measured_duration_us: float

    @property
    def start_error_us(self) -> float:
        return self.predicted_start_us - self.measured_start_us

    @property
    def duration_error_us(self) -> float:
        return self.predicted_duration_us - self.measured_duration_us

    @property
    def duration_error_pct(self) -> float:
        return 100.0 * self.duration_error_us / self.measured_duration_us if self.measured_duration_us > 0 else 0.0


@dataclass(frozen=True)
class ErrorStats:
    median: float
    p90: float
    worst: float
    worst_op: str | None
    """Op id of the worst case."""

    @staticmethod
    def of(values: list[tuple[float, str]]) -> ErrorStats:
        if not values:
            return ErrorStats(0.0, 0.0, 0.0, None)
        mags = sorted(abs(v) for v, _ in values)
        worst_value, worst_op = max(values, key=lambda x: abs(x[0]))
        return ErrorStats(statistics.median(mags), _percentile(mags, 90), abs(worst_value), worst_op)


@dataclass(frozen=True)
class ComputeRate:
    """The executor's FLOP block in one dtype: the machine file's rate against the run's.
    FLOP-sized compute is predicted off by about `error_pct` for the machine's speed
    that day alone, before any modelling error."""

    dtype: str
    machine_tflops: float
    """The machine file's `peak_tflops` (a calibrated machine's is this block's rate)."""
    measured_tflops: dict[int, float]
    """Per rank, the block's rate timed at the run's start-up."""

    @property
    def error_pct(self) -> float:
        """(machine - measured) / measured, measured the median over the ranks."""
        measured = statistics.median(self.measured_tflops.values())
        return 100.0 * (self.machine_tflops - measured) / measured if measured > 0 else 0.0


def measured_flop_rates(measured: Timeline) -> dict[str, dict[int, float]]:
    """Per dtype, per rank, the FLOP block's rate a run timed at start-up (`FLOP_RATE_META`;
    empty for a timeline without FLOP-sized ops, or a predicted one)."""
    by_dtype: dict[str, dict[int, float]] = {}
    value = measured.meta.get(FLOP_RATE_META, {})
    try:
        for rank, rates in value.items():
            for dtype, tflops in rates.items():
                Dtype(dtype)
                by_dtype.setdefault(dtype, {})[int(rank)] = float(tflops)
    except (AttributeError, TypeError, ValueError):
        shown = json.dumps(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise UsageError(f"the measured timeline's meta.{FLOP_RATE_META} is not {{rank: {{dtype: TFLOP/s}}}}: {shown}") from None
    return by_dtype


def run_flop_rates(measured: Timeline) -> dict[Dtype, float]:
    """Per dtype, the FLOP block's rate the run timed at start-up, median over ranks."""
    return {Dtype(d): statistics.median(by_rank.values()) for d, by_rank in measured_flop_rates(measured).items()}


def machine_at_run_rate(machine: Machine, measured: Timeline) -> Machine | None:
    """`machine` with the compute rates the run timed at start-up (`run_flop_rates`) in
    place of its own, to re-simulate with the machine's speed that day taken out; None
    where the run timed none."""
    rates = run_flop_rates(measured)
    return machine.with_peak_tflops(rates) if rates else None


def compute_rates(predicted: Timeline, measured: Timeline) -> list[ComputeRate]:
    """`ComputeRate` of every dtype whose rate both timelines carry."""
    machine = predicted.meta.get("machine", {}).get("device", {}).get("peak_tflops", {})
    by_dtype = measured_flop_rates(measured)
    return [ComputeRate(d, float(machine[d]), by_dtype[d]) for d in sorted(by_dtype) if d in machine]


DURATION_DRIFT_PCT = 10.0
"""A rank whose compute ops with an explicit duration ran, in the median, more than this
far (percent) from their requested durations is reported (`DurationDrift`)."""


@dataclass(frozen=True)
class DurationDrift:
    """One rank's compute ops with an explicit duration (`compute F 2ms`), measured
    against the durations they asked for (`REQUESTED_DURATION_ARG` of measured spans).
    The executor sizes such ops from its timing of a compute block; when that timing is
    off (a busy machine), the ops run longer or shorter than the schedule says."""

    rank: int
    ops: int
    off: int
    """Ops more than DURATION_DRIFT_PCT from their requested duration."""
    median_ratio: float
    """Median over the ops of measured / requested duration."""
    worst_op: str
    """Op id of the op furthest from its request (by ratio)."""
    worst_name: str
    worst_ratio: float

    @property
    def drifted(self) -> bool:
        """Whether the rank's typical op ran more than DURATION_DRIFT_PCT off."""
        return abs(self.median_ratio - 1.0) * 100.0 > DURATION_DRIFT_PCT

    def warning(self) -> str:
        return (f"rank {self.rank}: its compute ops with an explicit duration ran x{self.median_ratio:.2f} their requested "
                f"durations in the median ({self.off} of {self.ops} more than {DURATION_DRIFT_PCT:g}% off; furthest "
                f"{self.worst_name} (op {self.worst_op}) x{self.worst_ratio:.2f}): the measured timeline does not run the "
                "schedule's durations. Causes: the machine's speed changed (other work on it), its timing of the compute "
                "block was off (see meta.compute_timing), or, on a CPU, the run's own communication threads took cores "
                "from compute")  # fmt: skip

    def to_json(self) -> dict:
        return {"rank": self.rank, "ops": self.ops, "off": self.off, "median_ratio": round(self.median_ratio, 4),
                "worst_op": self.worst_op, "worst_name": self.worst_name, "worst_ratio": round(self.worst_ratio, 4),
                "drifted": self.drifted}  # fmt: skip


def duration_drifts(measured: Timeline) -> list[DurationDrift]:
    """`DurationDrift` of every rank with compute ops that asked for a duration (none
    for a predicted timeline, or a measured one without such ops)."""
    by_rank: dict[int, list[tuple[float, Span]]] = {}
    for s in measured.spans:
        if s.role is not SpanRole.EXEC or s.kind != OpKind.COMPUTE.value:
            continue
        requested = dict(s.args).get(REQUESTED_DURATION_ARG)
        if isinstance(requested, (int, float)) and requested > 0:
            by_rank.setdefault(s.rank, []).append((s.duration_us / requested, s))
    out = []
    for rank, ratios in sorted(by_rank.items()):
        worst_ratio, worst = max(ratios, key=lambda rs: max(rs[0], 1.0 / rs[0]) if rs[0] > 0 else float("inf"))
        off = sum(1 for r, _ in ratios if abs(r - 1.0) * 100.0 > DURATION_DRIFT_PCT)
        out.append(DurationDrift(rank, len(ratios), off, statistics.median(r for r, _ in ratios), worst.op_id,
                                 _arg(worst, "name", worst.name), worst_ratio))  # fmt: skip
    return out


def machine_is_calibrated(machine_json: dict) -> bool:
    """Whether a machine description (`Machine.to_json`, as predicted timelines keep it)
    says where it was measured (`calibration:`, which `commdsl calibrate` writes). Presets
    hold estimates for a kind of machine."""
    return machine_json.get("calibration") is not None


def calibration_hint(machine_json: dict, ranks: int) -> str | None:
    """The warning that a prediction comes from an uncalibrated machine description, with
    how to calibrate; None for a calibrated one."""
    if not machine_json:
        return None  # no machine recorded: not a simulator's timeline
    name = machine_json.get("name", "?")
    if machine_is_calibrated(machine_json):
        if machine_json["calibration"].get("quick"):
            return f"machine {name} is a rough calibration (--quick): calibrate without --quick before trusting the figures"
        return None
    return (f"machine {name} is not calibrated: its numbers are estimates for a kind of machine, not measurements of this one, "
            f"so predictions can be far off. Calibrate this machine: `commdsl calibrate -n {ranks} --out my.yaml` "
            f"(or `--quick`: a rough file in a minute or two), then use `--machine my.yaml`")  # fmt: skip


RankBreakdown = Breakdown
"""Per-rank time split, in microseconds (see commdsl.breakdown for the definitions)."""


@dataclass
class Comparison:
    schedule: str
    predicted_makespan_us: float
    measured_makespan_us: float
    ops: list[OpError]
    only_predicted: list[str] = field(default_factory=list)
    only_measured: list[str] = field(default_factory=list)
    ranks: dict[int, tuple[RankBreakdown, RankBreakdown]] = field(default_factory=dict)
    """rank -> (predicted, measured)."""
    min_duration_us: float = 10.0
    predicted_samples: int = 1
    """Samples the prediction's per-op medians come from (`simulate --samples`); 1: exact."""
    measured_iterations: int | None = None
    """Iterations the measured per-op medians come from (`commdsl.run --iters`), if known."""
    compute_rates: list[ComputeRate] = field(default_factory=list)
    memory_peaks: dict[int, tuple[int, int]] = field(default_factory=dict)
    """rank -> (predicted, measured) peak of declared memory, in bytes; empty unless both
    timelines carry it."""
    memory_source: str = ""
    """What the measured peak counts (`memory_peak_source` of the measured meta)."""
    duration_drifts: list[DurationDrift] = field(default_factory=list)
    """Per rank with compute ops of explicit duration, how they ran against their requests."""
    calibration_hint: str | None = None
    """Set when the prediction's machine is not calibrated (`calibration_hint`)."""
    unmatched: list[str] = field(default_factory=list)
    """Against profiler traces (`compare_trace`): the ops and trace events left unpaired."""

    @property
    def makespan_error_pct(self) -> float:
        if self.measured_makespan_us <= 0:
            return 0.0
        return 100.0 * (self.predicted_makespan_us - self.measured_makespan_us) / self.measured_makespan_us

    def warnings(self) -> list[str]:
        """What a reader must know before trusting the numbers: ranks whose explicit
        durations ran off (`DurationDrift.drifted`), an uncalibrated machine."""
        return [d.warning() for d in self.duration_drifts if d.drifted] + ([self.calibration_hint] if self.calibration_hint else [])

    def duration_stats(self) -> ErrorStats:
        return ErrorStats.of([
            (e.duration_error_pct, e.op_id) for e in self.ops
            if e.kind not in NON_BUSY_KINDS and e.measured_duration_us >= self.min_duration_us
        ])  # fmt: skip

    def start_stats(self) -> ErrorStats:
        return ErrorStats.of([(e.start_error_us, e.op_id) for e in self.ops])

    def op(self, op_id: str) -> OpError:
        return next(e for e in self.ops if e.op_id == op_id)

    def to_json(self) -> dict:
        """The comparison as JSON-able values (what `write_json` writes)."""
        return {**self._summary_json(), "ops": [_op_json(e) for e in self.ops]}

    def write_json(self, out: TextIO) -> None:
        """Write `to_json()` to `out` as `json.dump(..., indent=1)` writes it, the ops a
        batch at a time: one dict per op and the whole text at once (half a million ops
        of a 300 MB timeline) would be held otherwise."""
        head = json.dumps({**self._summary_json(), "ops": []}, indent=1)
        empty = '"ops": []\n}'
        assert head.endswith(empty), "ops is the last key"
        out.write(head[: -len(empty)] + '"ops": [')
        for i in range(0, len(self.ops), _OPS_PER_WRITE):
            batch = self.ops[i : i + _OPS_PER_WRITE]
            # each op's object, one level deeper than json.dumps puts it (in the list of ops)
            texts = ("\n  " + json.dumps(_op_json(e), indent=1).replace("\n", "\n  ") for e in batch)
            out.write(("," if i else "") + ",".join(texts))
        out.write("\n ]\n}" if self.ops else "]\n}")

    def _summary_json(self) -> dict:
        """`to_json()` but its ops."""
        d, s = self.duration_stats(), self.start_stats()
        return {
            "schedule": self.schedule,
            "predicted_makespan_us": round(self.predicted_makespan_us, 3),
            "measured_makespan_us": round(self.measured_makespan_us, 3),
            "makespan_error_pct": round(self.makespan_error_pct, 3),
            "predicted_samples": self.predicted_samples,
            "measured_iterations": self.measured_iterations,
            "ops_compared": len(self.ops),
            "only_predicted": self.only_predicted,
            "only_measured": self.only_measured,
            "duration_error_pct": _stats_json(d, self, "duration"),
            "start_error_us": _stats_json(s, self, "start"),
            "start_error_pct_of_makespan": {
                k: round(100.0 * v / self.measured_makespan_us, 3) if self.measured_makespan_us else 0.0
                for k, v in (("median", s.median), ("p90", s.p90), ("worst", s.worst))
            },
            "ranks": {
                str(r): {"predicted": _breakdown_json(p), "measured": _breakdown_json(m)} for r, (p, m) in sorted(self.ranks.items())
            },
            "flop_block_tflops": [
                {"dtype": c.dtype, "machine": c.machine_tflops, "measured": {str(r): t for r, t in sorted(c.measured_tflops.items())},
                 "machine_error_pct": round(c.error_pct, 3)}
                for c in self.compute_rates
            ],  # fmt: skip
            "memory_peak_bytes": {str(r): {"predicted": p, "measured": m} for r, (p, m) in sorted(self.memory_peaks.items())},
            "memory_source": self.memory_source,
            "compute_duration_drift": [d.to_json() for d in self.duration_drifts],
            "machine_calibrated": self.calibration_hint is None,
            "unmatched": self.unmatched,
        }


_OPS_PER_WRITE = 4096
"""Ops `Comparison.write_json` encodes into one write."""


def _op_json(e: OpError) -> dict:
    return {
        "op_id": e.op_id, "kind": e.kind, "name": e.name, "source": e.source,
        "predicted_start_us": round(e.predicted_start_us, 3), "measured_start_us": round(e.measured_start_us, 3),
        "predicted_duration_us": round(e.predicted_duration_us, 3), "measured_duration_us": round(e.measured_duration_us, 3),
    }  # fmt: skip


def _stats_json(st: ErrorStats, cmp: Comparison, which: str) -> dict:
    out = {"median": round(st.median, 3), "p90": round(st.p90, 3), "worst": round(st.worst, 3), "worst_op": st.worst_op}
    if st.worst_op is not None:
        e = cmp.op(st.worst_op)
        out["worst_source"] = e.source
        out["worst_name"] = e.name
    return out


def _breakdown_json(b: RankBreakdown) -> dict:
    return {k: round(getattr(b, k), 3) for k in ("compute_us", "comm_us", "exposed_comm_us", "idle_us")}


def _percentile(sorted_values: list[float], pct: float) -> float:
    """Linear-interpolated percentile of an ascending list."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * pct / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def rank_breakdowns(timeline: Timeline) -> dict[int, RankBreakdown]:
    """Compute / communication / exposed communication / idle per rank, from EXEC spans,
    with the simulator summary's definitions (commdsl.breakdown)."""
    ops: dict[int, list[tuple[OpKind, float, float]]] = {r: [] for r in range(timeline.world_size)}
    for s in timeline.spans:
        if s.role is SpanRole.EXEC:
            ops.setdefault(s.rank, []).append((OpKind(s.kind), s.start_us, s.end_us))
    makespan = timeline.makespan_us
    return {r: breakdown_of(spans, makespan) for r, spans in sorted(ops.items())}


def unfolded(predicted: Timeline) -> Timeline:
    """A predicted timeline of every rank: where the simulated program was folded
    (`FOLD_META`), each rank outside the representative gets its representative's spans
    (same times, its own rank and op ids: a replica runs its representative's ops in the
    same order) and memory peak; else `predicted` itself."""
    meta_fold = predicted.meta.get(FOLD_META)
    if not meta_fold:
        return predicted
    fold = Fold(meta_fold["axis"], meta_fold["replicas"], meta_fold["stride"], tuple(meta_fold["ranks"]), meta_fold["block"])
    shown = set(fold.ranks)
    by_rank: dict[int, list[Span]] = {}
    for s in predicted.spans:
        by_rank.setdefault(s.rank, []).append(s)
    spans = list(predicted.spans)
    peaks = dict(predicted.meta.get(MEMORY_PEAK_META, {}))
    for rank in range(predicted.world_size):
        if rank in shown:
            continue
        rep = fold.representative(rank)
        spans += [replace(s, rank=rank, op_id=f"{rank}:{s.op_id.split(':', 1)[1]}") for s in by_rank.get(rep, ())]
        if str(rep) in peaks:
            peaks[str(rank)] = peaks[str(rep)]
    meta = {k: v for k, v in predicted.meta.items() if k != FOLD_META}  # unfolded now: once only
    if peaks:
        meta[MEMORY_PEAK_META] = peaks
    tracks = {r: predicted.tracks[rep] for r in range(predicted.world_size) if (rep := fold.representative(r)) in predicted.tracks}
    return replace(predicted, spans=spans, meta=meta, tracks=tracks)


def compare_timelines(predicted: Timeline, measured: Timeline, *, min_duration_us: float = 10.0,
                      measured_origin_us: float | None = None) -> Comparison:  # fmt: skip
    """Pair the ops of two timelines by op id (a folded prediction: `unfolded` first).
    Start times are taken from each timeline's first start, or for the measured one from
    `measured_origin_us` where given (a profiler trace's step start: its first paired op
    may start well after it)."""
    pred, meas = predicted.exec_spans(), measured.exec_spans()
    p0 = min((s.start_us for s in predicted.spans), default=0.0)
    m0 = min((s.start_us for s in measured.spans), default=0.0) if measured_origin_us is None else measured_origin_us
    ops = []
    for op_id in sorted(set(pred) & set(meas), key=_op_key):
        p, m = pred[op_id], meas[op_id]
        ops.append(
            OpError(op_id, p.kind, _arg(p, "name", p.name), _arg(p, "source", ""), p.start_us - p0, m.start_us - m0,
                    p.duration_us, m.duration_us)  # fmt: skip
        )
    pb, mb = rank_breakdowns(predicted), rank_breakdowns(measured)
    return Comparison(
        schedule=predicted.schedule,
        predicted_makespan_us=predicted.makespan_us,
        measured_makespan_us=measured.makespan_us,
        ops=ops,
        only_predicted=sorted(set(pred) - set(meas), key=_op_key),
        only_measured=sorted(set(meas) - set(pred), key=_op_key),
        ranks={r: (pb[r], mb[r]) for r in sorted(set(pb) & set(mb))},
        min_duration_us=min_duration_us,
        predicted_samples=int(predicted.meta.get("samples", 1)),
        measured_iterations=measured.meta.get("iters"),
        compute_rates=compute_rates(predicted, measured),
        memory_peaks=memory_peaks(predicted, measured),
        memory_source=str(measured.meta.get("memory_peak_source", "")),
        duration_drifts=duration_drifts(measured),
        calibration_hint=calibration_hint(predicted.meta.get("machine", {}), measured.world_size),
    )


def memory_peaks(predicted: Timeline, measured: Timeline) -> dict[int, tuple[int, int]]:
    """rank -> (predicted, measured) peak of declared memory, for ranks both report."""
    peaks = []
    for tl in (predicted, measured):
        value = tl.meta.get(MEMORY_PEAK_META, {})
        try:
            peaks.append({int(r): int(v) for r, v in value.items()})
        except (AttributeError, TypeError, ValueError):
            raise UsageError(f"the {tl.source} timeline's meta.{MEMORY_PEAK_META} is not {{rank: bytes}}: {value!r}") from None
    pred, meas = peaks
    return {r: (pred[r], meas[r]) for r in sorted(pred.keys() & meas.keys())}


def _op_key(op_id: str) -> tuple[int, int]:
    rank, _, index = op_id.partition(":")
    return int(rank), int(index)


def _arg(span: Span, key: str, default: str) -> str:
    for k, v in span.args:
        if k == key:
            return str(v)
    return default


def combined_trace(predicted: Timeline, measured: Timeline, streams: tuple[str, ...] = ()) -> dict:
    """One Chrome trace with both timelines as separate processes (predicted rank r is
    pid r, measured rank r is pid world_size + r), each starting at time zero."""
    events: list[dict] = []
    offset_pid = max(predicted.world_size, measured.world_size)
    for label, tl, pid_base in (("predicted", predicted, 0), ("measured", measured, offset_pid)):
        trace = tl.to_chrome_trace(streams)
        t0 = min((s.start_us for s in tl.spans), default=0.0)
        for ev in trace["traceEvents"]:
            ev = dict(ev)
            if ev.get("ph") == "M" and ev["name"] == "process_name":
                ev["args"] = {"name": f"{label} {ev['args']['name']}"}
            ev["pid"] = ev["pid"] + pid_base
            if "ts" in ev:
                ev["ts"] = round(ev["ts"] - t0, 3)
            events.append(ev)
    return {"traceEvents": events, "displayTimeUnit": "ms"}



# ---- a real job's profiler traces as the measured side ------------------------------------

@dataclass
class TraceMatch:
    """A predicted timeline's ops found in a job's profiler traces (`match_trace`)."""

    measured: Timeline
    """The trace's spans of the matched ops, under the predicted op ids."""
    step_us: float
    """The trace's step time (first start to last end over the ranks)."""
    unmatched: list[str] = field(default_factory=list)
    """Ops and trace events left unpaired, and names found more or fewer times than the
    schedule has ops of that name, one line each."""
    skipped: list[str] = field(default_factory=list)
    """Op ids of predicted waits, records, synchronizes, allocs and frees the trace has no
    range for (they do no work of their own; real jobs do not annotate them): not sought,
    so not "only predicted" either."""


def _pred_in_bytes(span: Span) -> int:
    """The input bytes of a predicted comm op (its `In msg nelems` x its dtype's size)."""
    args = dict(span.args)
    return int(args.get("In msg nelems", 0)) * Dtype(str(args.get("dtype", "fp32"))).itemsize


def _align(preds: list[Span], comms: list, fits) -> list[tuple[int, int]]:
    """The longest in-order pairing of `preds` with `comms` where `fits(p, c)` (an LCS):
    issue order is kept on both sides; anything out of order is left unpaired."""
    n, m = len(preds), len(comms)
    best = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, below = best[i], best[i + 1]
        for j in range(m - 1, -1, -1):
            row[j] = below[j + 1] + 1 if fits(preds[i], comms[j]) else max(below[j], row[j + 1])
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        if fits(preds[i], comms[j]) and best[i][j] == best[i + 1][j + 1] + 1:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif best[i + 1][j] >= best[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


@dataclass(frozen=True)
class CommLane:
    """A process group whose comm ops a rank issues in order: a trace's NCCL kernels or
    gloo ranges of the group pair with the schedule's ops in it in that order, and the
    order across groups is free (each group runs on its own communicator and stream)."""

    groups: tuple[str, ...]
    """The schedule's group ids in it: groups of the same ranks are one lane, since a trace
    names a group by its ranks (torch names process groups "0", "1", ...)."""
    ranks: frozenset[int]
    """Its members as the prediction shows them: the ranks with ops in the group."""
    size: int
    """Its size (the ops' `Group size`); more than `len(ranks)` where a member has no op in it."""

    @property
    def label(self) -> str:
        return "/".join(self.groups)

    def holds(self, group: tuple[int, ...]) -> bool:
        """Whether a trace's process group of these ranks is this lane's."""
        if len(self.ranks) == self.size:
            return set(group) == self.ranks
        return self.ranks <= set(group) and len(group) == self.size


def comm_lanes(spans: list[Span]) -> dict[str, CommLane]:
    """The lane of each group id the predicted comm ops name (`Process Group Name`)."""
    members: dict[str, set[int]] = {}
    sizes: dict[str, int] = {}
    for s in spans:
        if OpKind(s.kind).is_comm:
            group = _arg(s, "Process Group Name", "world")
            members.setdefault(group, set()).add(s.rank)
            sizes[group] = max(sizes.get(group, 0), int(_arg(s, "Group size", "0")))
    by_ranks: dict[tuple[frozenset[int], int], list[str]] = {}
    for group, ranks in members.items():
        by_ranks.setdefault((frozenset(ranks), max(sizes[group], len(ranks))), []).append(group)
    return {g: CommLane(tuple(sorted(gs)), ranks, size) for (ranks, size), gs in by_ranks.items() for g in gs}


def _fits(p: Span, c) -> bool:
    """Whether predicted comm op `p` can be trace comm `c`: the kind (or one the backend runs
    as `c`'s), the input bytes and the group's size agree where the trace gives them. A
    trace's all_to_all whose input does not split evenly over its group (one no schedule
    holds as it is: `import kineto` replays it at its group's mean) fits any all_to_all."""
    group_size = int(_arg(p, "Group size", str(len(c.group) if c.group else 1)))
    chunk = group_size * (c.dtype.itemsize if c.dtype else 1)
    uneven = OpKind(p.kind) is OpKind.ALL_TO_ALL and c.in_bytes is not None and c.in_bytes % chunk != 0
    return OpKind(p.kind) in (c.kinds | c.runs_for) and (c.in_bytes is None or c.in_bytes == _pred_in_bytes(p) or uneven) and (
        c.group is None or len(c.group) == group_size)


def _comm_text(c, trace) -> str:
    size = "?" if c.in_bytes is None else c.in_bytes
    return f"{c.name} ({'/'.join(sorted(k.value for k in c.kinds))}, {size} B in) at {c.start_us - trace.step_start_us:.1f} us into the step"


def _match_comms(rank: int, ops: list[Span], lanes: dict[str, CommLane], trace, measured: Timeline) -> list[str]:
    """Pair a rank's comm ops (in issue order) with its trace's comms, per process group:
    a trace comm is in the lane its group's ranks name (`Process Group Ranks`, or
    `distributedInfo.pg_config` by `Process Group Name`); one whose trace names no group
    (gloo's ranges) is in the one lane holding an op it fits, and is listed as ambiguous
    where several do. In a lane, the longest in-order pairing (`_align`) of the ops with
    the comms in the order the host issued them (`TraceComm.issued_us`). Appends the
    pairs' spans to `measured`; returns what did not pair, one line each."""
    unmatched: list[str] = []
    mine: dict[CommLane, list[Span]] = {}
    for s in ops:
        mine.setdefault(lanes[_arg(s, "Process Group Name", "world")], []).append(s)
    found: dict[CommLane, list] = {lane: [] for lane in mine}
    for c in trace.comms:
        if c.group is not None:
            hits = [lane for lane in mine if lane.holds(c.group)]
            why = f"in process group {list(c.group)}, which none of rank {rank}'s ops is in"
        else:
            hits = [lane for lane, ps in mine.items() if any(_fits(p, c) for p in ps)]
            why = "in the trace, not in the schedule"
        if len(hits) == 1:
            found[hits[0]].append(c)
        elif hits:
            unmatched.append(f"rank {rank}: {_comm_text(c, trace)}: ambiguous, the trace names no process group and it fits ops "
                             f"of groups {', '.join(lane.label for lane in hits)}; not paired")  # fmt: skip
        else:
            unmatched.append(f"rank {rank}: {_comm_text(c, trace)}: {why}")
    for lane, preds in mine.items():
        comms = sorted(found[lane], key=lambda c: (c.issued_us, c.start_us, c.end_us))
        pairs = _align(preds, comms, _fits)
        for i, j in pairs:
            p, c = preds[i], comms[j]
            measured.spans.append(Span(p.op_id, rank, c.track, SpanRole.EXEC, p.kind, c.name, c.start_us, c.end_us, p.args))
        paired_p, paired_c = {i for i, _ in pairs}, {j for _, j in pairs}
        unmatched += [f"rank {rank}: {p.kind} {_arg(p, 'name', p.name)} (op {p.op_id}, {_pred_in_bytes(p)} B in, group {lane.label}): "
                      "not in the trace in this order" for i, p in enumerate(preds) if i not in paired_p]  # fmt: skip
        unmatched += [f"rank {rank}: {_comm_text(c, trace)}, group {lane.label}: in the trace, not in the schedule in this order"
                      for j, c in enumerate(comms) if j not in paired_c]  # fmt: skip
    return unmatched


def match_trace(predicted: Timeline, job) -> TraceMatch:
    """Find each predicted op in `job` (a `commdsl.interop.kineto_read.KinetoJob`):
      * compute, copies, host work and memory ops by name: a rank's ops named N pair, in
        order, with its ranges named N (device ranges where the trace has them, else host
        ranges) when there are as many of each; otherwise every one is listed as ambiguous.
        Ops whose name no range has pair, by their name less its indices B (`fwd[3]`: fwd),
        with the ranges named B, else with the kernels `import kineto` names B (the
        innermost device range around a kernel, else its function; copies: `copy`), in
        issue order, when there are as many of each;
      * communication by kind and input size, per process group in issue order
        (`_match_comms`): the longest in-order pairing of a rank's ops in a group with
        the trace's NCCL kernels or gloo ranges of that group.
    Nothing is paired on a guess: what does not pair is listed in `unmatched`. `job` holds
    every rank's trace (`compare_trace` checks)."""
    pred = sorted((s for s in predicted.spans if s.role is SpanRole.EXEC), key=lambda s: _op_key(s.op_id))
    measured = Timeline("measured", predicted.schedule, job.world_size,
                        meta={"trace": job.folder, "step": next(iter(job.ranks.values())).step,
                              "profiler": sorted({t.profiler.split(", trace_id")[0] for t in job.ranks.values()})})  # fmt: skip
    match = TraceMatch(measured, job.step_us)
    lanes = comm_lanes(pred)
    for rank in sorted({s.rank for s in pred}):
        trace = job.ranks[rank]
        mine = [s for s in pred if s.rank == rank]
        by_name: dict[str, list[Span]] = {}
        for s in mine:
            if not OpKind(s.kind).is_comm:
                by_name.setdefault(_arg(s, "name", s.name), []).append(s)
        ranges: dict[str, list] = {}
        for r in trace.ranges:
            ranges.setdefault(r.name, []).append(r)
        unnamed: dict[str, list[Span]] = {}  # ops no range is named after, by their name less its indices
        for name, ops in by_name.items():
            found = _device_first(ranges.get(name, []))
            if not found:
                match.skipped += [s.op_id for s in ops if s.kind in NON_BUSY_KINDS]
                for s in ops:
                    if s.kind not in NON_BUSY_KINDS:
                        unnamed.setdefault(_INDICES.sub("", name), []).append(s)
            elif len(found) != len(ops):
                match.unmatched.append(f"rank {rank}: {name}: ambiguous, {len(ops)} op(s) of this name ({', '.join(s.op_id for s in ops)}) "
                                       f"and {len(found)} range(s) in the trace; none paired")  # fmt: skip
            else:
                _pair(measured, rank, ops, found)
        # Ops named `fwd[3]` against ranges named `fwd`, in order; then an imported
        # schedule's ops against the kernels and copies `import kineto` named them after.
        kernels: dict[str, list] = {"copy": list(trace.copies)}
        for k, label in zip(trace.kernels, kernel_op_names(trace)):
            kernels.setdefault(label, []).append(k)
        for base, ops in unnamed.items():
            ops.sort(key=lambda s: _op_key(s.op_id))
            found = _device_first(ranges.get(base, []))
            if not found and base == IMPORTED_HOST_GAP and all(s.kind == OpKind.HOST.value for s in ops):
                match.skipped += [s.op_id for s in ops]  # an imported schedule's host time between launches: no range of its own
                continue
            if len(found) != len(ops):
                found = sorted(kernels.get(base, []), key=lambda k: (k.launch[0] if k.launch else k.start_us, k.start_us))
            if len(found) == len(ops):
                _pair(measured, rank, ops, found)
            elif not found:
                match.unmatched += [f"rank {rank}: {s.kind} {_arg(s, 'name', s.name)} (op {s.op_id}): no range named "
                                    f"{_arg(s, 'name', s.name)} in the trace" for s in ops]  # fmt: skip
            else:
                ids = ", ".join(s.op_id for s in ops[:8]) + (", ..." if len(ops) > 8 else "")
                match.unmatched.append(f"rank {rank}: {base}: ambiguous, {len(ops)} op(s) of this name ({ids}) and {len(found)} "
                                       "range(s) or kernel(s) in the trace; none paired")  # fmt: skip

        comm_ops = [s for s in mine if OpKind(s.kind).is_comm]
        match.unmatched += _match_comms(rank, comm_ops, lanes, trace, measured)
    return match


_INDICES = re.compile(r"(\[[^\]]*\])+$")
"""An op name's trailing indices (`fwd[3]`, `w[1, 2]`)."""


def _device_first(found: list) -> list:
    """Ranges of a name: those on the GPU's streams where there are any, else the host's."""
    return [r for r in found if r.place.value == "device"] or found


def _pair(measured: Timeline, rank: int, ops: list[Span], found: list) -> None:
    """Pair ops with trace ranges (or kernels, copies) in order: the ranges' times under the ops' ids."""
    for s, r in zip(ops, found):
        measured.spans.append(Span(s.op_id, rank, r.track, SpanRole.EXEC, s.kind, s.name, r.start_us, r.end_us, s.args))


def compare_trace(predicted: Timeline, job, *, min_duration_us: float = 10.0) -> tuple[Comparison, TraceMatch]:
    """`compare_timelines` against a job's profiler traces (`match_trace`): the measured
    makespan is the trace's step time, and what did not pair is in `Comparison.unmatched`."""
    if predicted.world_size != job.world_size:
        raise UsageError(f"the prediction has {predicted.world_size} ranks, the traces' job {job.world_size} ({job.folder})")
    job.require_every_rank("a comparison")
    match = match_trace(predicted, job)
    if not match.measured.spans:
        raise UsageError(f"no op of {predicted.schedule} was found in the traces of {job.folder}",
                         hint="ops are found by record_function ranges named as the schedule names them, comm ops by kind and size")  # fmt: skip
    step_start_us = min(t.step_start_us for t in job.ranks.values())
    cmp = compare_timelines(predicted, match.measured, min_duration_us=min_duration_us, measured_origin_us=step_start_us)
    cmp.measured_makespan_us = match.step_us
    cmp.unmatched = match.unmatched
    skipped = set(match.skipped)
    cmp.only_predicted = [op_id for op_id in cmp.only_predicted if op_id not in skipped]
    return cmp, match
