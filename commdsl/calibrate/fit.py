"""Fitting the machine model's linear laws to measurements.

Every rate in the machine model is a line: a transfer takes `latency + bytes / bandwidth`,
a collective `steps * latency + bus_bytes / bandwidth`, a matmul
`launch + flops / rate`. Measurements span sizes from KiB to hundreds of MiB, so an
ordinary least-squares fit would be ruled by the largest sizes and get the latency
wrong; we minimise *relative* error instead (weights 1/t^2), which is what a user
comparing predicted with measured times cares about.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LinearFit:
    """t = intercept + slope * x, fitted to points (x, t)."""

    intercept: float
    """Fixed cost, in the unit of t (microseconds): latency or launch overhead."""
    slope: float
    """Cost per unit of x (microseconds per byte or per FLOP)."""
    r2: float
    """Coefficient of determination of the fit, on the measured times."""
    residuals_pct: tuple[float, ...]
    """Per point, (predicted - measured) / measured * 100, in input order."""
    xs: tuple[float, ...]
    ts: tuple[float, ...]

    def predict(self, x: float) -> float:
        return self.intercept + self.slope * x

    @property
    def rate(self) -> float:
        """Units of x per microsecond (1 / slope); infinite for a flat line."""
        return math.inf if self.slope <= 0 else 1.0 / self.slope

    @property
    def max_abs_residual_pct(self) -> float:
        return max((abs(r) for r in self.residuals_pct), default=0.0)


def fit_linear(xs: list[float], ts: list[float], *, relative: bool = True, nonnegative: bool = True) -> LinearFit:
    """Weighted least squares of t = a + b x. With `relative`, weights are 1/t^2 so each
    point's relative error counts equally. With `nonnegative`, a negative intercept
    or slope (noise on tiny latencies) is clamped to zero and the other term refitted."""
    if len(xs) != len(ts) or len(xs) < 2:
        raise ValueError(f"need at least two (x, t) points to fit a line, got {len(xs)} x and {len(ts)} t")
    if any(t <= 0 for t in ts) and relative:
        raise ValueError(f"relative fitting needs positive times, got {min(ts)}")
    ws = [1.0 / (t * t) if relative else 1.0 for t in ts]
    sw = sum(ws)
    sx = sum(w * x for w, x in zip(ws, xs))
    st = sum(w * t for w, t in zip(ws, ts))
    sxx = sum(w * x * x for w, x in zip(ws, xs))
    sxt = sum(w * x * t for w, x, t in zip(ws, xs, ts))
    det = sw * sxx - sx * sx
    if det <= 0:
        raise ValueError("cannot fit a line: all points have the same x")
    slope = (sw * sxt - sx * st) / det
    intercept = (st - slope * sx) / sw
    if nonnegative and intercept < 0:
        intercept = 0.0
        slope = sxt / sxx
    if nonnegative and slope < 0:
        slope = 0.0
        intercept = st / sw
    return _make(intercept, slope, xs, ts)


def _make(intercept: float, slope: float, xs: list[float], ts: list[float]) -> LinearFit:
    r2, residuals = fit_quality([intercept + slope * x for x in xs], ts)
    return LinearFit(intercept, slope, r2, residuals, tuple(xs), tuple(ts))


def fit_quality(predicted: list[float], measured: list[float]) -> tuple[float, tuple[float, ...]]:
    """R^2 of predicted against measured, and per-point residuals in % of measured."""
    mean = sum(measured) / len(measured)
    ss_tot = sum((t - mean) ** 2 for t in measured)
    ss_res = sum((t - p) ** 2 for t, p in zip(measured, predicted))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return r2, tuple(100.0 * (p - t) / t if t else 0.0 for p, t in zip(predicted, measured))


@dataclass(frozen=True)
class StepFit:
    """t = steps * latency_us + bytes / bytes_per_us: the analytic model of a collective."""

    latency_us: float
    """Time of one latency-bound step."""
    bytes_per_us: float
    """Bandwidth the busiest rank achieves (bytes per microsecond = MB/s)."""
    r2: float
    residuals_pct: tuple[float, ...]

    @property
    def bandwidth_gb_per_s(self) -> float:
        return self.bytes_per_us / 1e3

    @property
    def max_abs_residual_pct(self) -> float:
        return max((abs(r) for r in self.residuals_pct), default=0.0)


def fit_steps(steps: list[float], nbytes: list[float], ts: list[float]) -> StepFit:
    """Relative-error least squares of t = latency * steps + bytes / bandwidth, both
    coefficients kept non-negative. Where every point has the same step count this is
    `fit_linear` with the intercept divided by the steps."""
    if not (len(steps) == len(nbytes) == len(ts)) or len(ts) < 2:
        raise ValueError(f"need at least two points, got {len(ts)}")
    if len(set(steps)) == 1:
        line = fit_linear(nbytes, ts)
        n = steps[0] or 1.0
        return StepFit(line.intercept / n, line.rate, line.r2, line.residuals_pct)
    ws = [1.0 / (t * t) for t in ts]
    a11 = sum(w * s * s for w, s in zip(ws, steps))
    a12 = sum(w * s * b for w, s, b in zip(ws, steps, nbytes))
    a22 = sum(w * b * b for w, b in zip(ws, nbytes))
    r1 = sum(w * s * t for w, s, t in zip(ws, steps, ts))
    r2 = sum(w * b * t for w, b, t in zip(ws, nbytes, ts))
    det = a11 * a22 - a12 * a12
    lat, inv_bw = ((a22 * r1 - a12 * r2) / det, (a11 * r2 - a12 * r1) / det) if det > 0 else (-1.0, -1.0)
    if lat < 0 or inv_bw < 0:
        # Clamp: fit the better single term.
        lat_only = r1 / a11 if a11 else 0.0
        bw_only = r2 / a22 if a22 else 0.0
        err_lat = sum(w * (t - lat_only * s) ** 2 for w, s, t in zip(ws, steps, ts))
        err_bw = sum(w * (t - bw_only * b) ** 2 for w, b, t in zip(ws, nbytes, ts))
        lat, inv_bw = (max(lat_only, 0.0), 0.0) if err_lat <= err_bw else (0.0, max(bw_only, 0.0))
    r2, residuals = fit_quality([lat * s + inv_bw * b for s, b in zip(steps, nbytes)], ts)
    return StepFit(lat, math.inf if inv_bw <= 0 else 1.0 / inv_bw, r2, residuals)


def monotone(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The closest non-decreasing profile to measured (size, time) points, sorted by
    size: pool-adjacent-violators least squares. Moving more bytes never takes less
    time in expectation, so where noise says otherwise the neighbours are averaged;
    points that are already in order are kept as measured."""
    ordered = sorted(points)
    blocks: list[list[float]] = []  # [sum of times, count] per pooled block
    for _, t in ordered:
        blocks.append([t, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    times = [total / count for total, count in blocks for _ in range(int(count))]
    return [(size, t) for (size, _), t in zip(ordered, times)]


def expected_us(samples: list[float]) -> float:
    """Expected time of a local op (a matmul, a copy): the mean of the samples without the
    single lowest and highest when there are at least five, else their mean. Compute
    stalls are a machine parameter of their own (`compute_noise`), so dropping the one
    slowest run keeps a stall out of the compute rate; communication keeps its stalls
    (`comm_mean_us`)."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    if len(ordered) >= 5:
        ordered = ordered[1:-1]
    return statistics.fmean(ordered)


WILD_US = 50_000.0
"""A communication run more than this much (and more than its median again) above the
median of its point is wild, a preempted VM or a page storm, and is left out; the
scheduler stalls gloo's calls meet on a shared CPU (one scheduler slice each) stay in."""


def comm_mean_us(samples: list[float]) -> float:
    """Expected time of a communication point: the plain mean of its runs, wild ones out
    (`WILD_US`). Not a trimmed mean: gloo's run times are skewed, a few runs far above
    the median, and dropping the slowest run takes a real share of the mean off (docs/validation.md, Calibration's design figures)."""
    if not samples:
        raise ValueError("no samples")
    median = statistics.median(samples)
    kept = [t for t in samples if t <= median + max(WILD_US, median)]
    return statistics.fmean(kept)


def pass_ratios(points: list[list[list[float]]], estimate: Callable[[list[float]], float]) -> tuple[float, ...]:
    """How fast the machine ran in each pass of a calibration: per pass, the median over
    `points` (each a list of its passes' runs) of the pass's own estimate over the
    estimate of all the point's runs. One number per pass, since most points move
    together (a slow spell of the machine slows every point measured in it)."""
    passes = min((len(p) for p in points), default=0)
    pooled = [estimate([t for runs in p for t in runs]) for p in points]
    ratios = []
    for k in range(passes):
        per_point = [estimate(p[k]) / whole for p, whole in zip(points, pooled) if p[k]]
        ratios.append(statistics.median(per_point) if per_point else 1.0)
    return tuple(ratios)


PRECISION = 0.05
"""Target standard error of a calibrated expected time, relative to it."""
MIN_POINT_US = 100_000.0
"""Runs adding up to at least this much measured time (0.1 s) per point before the
standard error may stop sampling..."""
MAX_RUNS_FACTOR = 8
"""...at most this many times the minimum number of runs per point..."""
MAX_POINT_US = 1.5e6
"""...and runs adding up to at most this much measured time (1.5 s) per point."""


def precise(samples: list[float], min_runs: int, *, earlier: list[float] | tuple[float, ...] = (), passes: int = 1) -> bool:
    """Whether a communication point has enough runs to stop sampling: at least
    `min_runs` and `MIN_POINT_US` of measured time, then a standard error of the mean
    within `PRECISION` of it; or the run or time budget spent.

    The time floor is there because stopping as soon as the runs agree favours
    stretches without stalls: gloo calls on a small shared CPU stall for a scheduler
    slice in a fraction of runs, and stopping on the standard error alone puts such
    points below their mean (docs/validation.md, Calibration's design figures); see tests/test_calibrate_fit.py).

    A point measured in `passes` passes (see `measure.Pooled`): `samples` are this pass's
    runs and `earlier` those of the passes before it. Each pass takes its share of the
    minimum and of the budgets, and stops early once all the runs so far are precise."""
    n = len(samples)
    if n < max(math.ceil(min_runs / passes), 2):
        return False
    spent_us = sum(samples)
    if n >= math.ceil(MAX_RUNS_FACTOR * min_runs / passes) or spent_us >= MAX_POINT_US / passes:
        return True
    if spent_us < MIN_POINT_US / passes:
        return False
    pooled = [*earlier, *samples]
    mean = statistics.fmean(pooled)
    return mean <= 0 or statistics.stdev(pooled) / math.sqrt(len(pooled)) <= PRECISION * mean


def nelder_mead(f: Callable[[list[float]], float], x0: list[float], progress: Callable[[str], None], rounds: int = 4) -> list[float]:
    """A local minimum of f near x0 by Nelder-Mead's simplex (no derivatives needed: the
    closed form of an NCCL time is a max of terms), restarted `rounds` times from the best
    point so far; `progress` hears the loss after each round."""
    x = list(x0)
    n = len(x)
    if n == 0:
        return x
    for r in range(rounds):
        simplex = [list(x)] + [[xi + (0.3 if i == j else 0.0) for j, xi in enumerate(x)] for i in range(n)]
        values = [f(s) for s in simplex]
        for _ in range(400 * n):
            order = sorted(range(n + 1), key=values.__getitem__)
            simplex = [simplex[i] for i in order]
            values = [values[i] for i in order]
            if values[-1] - values[0] < 1e-9 * (1.0 + abs(values[0])):
                break
            centre = [sum(s[j] for s in simplex[:-1]) / n for j in range(n)]
            worst = simplex[-1]
            refl = [c + (c - w) for c, w in zip(centre, worst)]
            fr = f(refl)
            if fr < values[0]:
                exp = [c + 2.0 * (c - w) for c, w in zip(centre, worst)]
                fe = f(exp)
                simplex[-1], values[-1] = (exp, fe) if fe < fr else (refl, fr)
            elif fr < values[-2]:
                simplex[-1], values[-1] = refl, fr
            else:
                contr = [c + 0.5 * (w - c) for c, w in zip(centre, worst)]
                fc = f(contr)
                if fc < values[-1]:
                    simplex[-1], values[-1] = contr, fc
                else:
                    best = simplex[0]
                    simplex = [best] + [[b + 0.5 * (s - b) for b, s in zip(best, p)] for p in simplex[1:]]
                    values = [values[0]] + [f(p) for p in simplex[1:]]
        x = simplex[min(range(n + 1), key=values.__getitem__)]
        progress(f"fit round {r + 1}/{rounds}: loss {min(values):.4g}")
    return x
