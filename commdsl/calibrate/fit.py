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
    preds = [intercept + slope * x for x in xs]
    mean = sum(ts) / len(ts)
    ss_tot = sum((t - mean) ** 2 for t in ts)
    ss_res = sum((t - p) ** 2 for t, p in zip(ts, preds))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    residuals = tuple(100.0 * (p - t) / t if t else 0.0 for p, t in zip(preds, ts))
    return LinearFit(intercept, slope, r2, residuals, tuple(xs), tuple(ts))
