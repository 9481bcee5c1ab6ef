"""The calibration fit recovers known latency and bandwidth from synthetic measurements."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commdsl.calibrate.fit import fit_linear

SIZES = [2**k for k in range(10, 29)]  # 1 KiB .. 256 MiB, as calibrate measures


@settings(max_examples=60, deadline=None)
@given(latency_us=st.floats(0.5, 500), bandwidth_gbps=st.floats(0.05, 900))
def test_exact_points_recover_latency_and_bandwidth(latency_us: float, bandwidth_gbps: float) -> None:
    bytes_per_us = bandwidth_gbps * 1e9 / 1e6
    ts = [latency_us + s / bytes_per_us for s in SIZES]
    fit = fit_linear([float(s) for s in SIZES], ts)
    assert fit.intercept == pytest.approx(latency_us, rel=1e-6)
    assert fit.rate == pytest.approx(bytes_per_us, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.max_abs_residual_pct < 1e-6


def test_noisy_points_recover_within_noise() -> None:
    rng = random.Random(7)
    latency_us, bytes_per_us = 25.0, 2_000.0  # 25 us, 2 GB/s
    ts = [(latency_us + s / bytes_per_us) * rng.uniform(0.97, 1.03) for s in SIZES]
    fit = fit_linear([float(s) for s in SIZES], ts)
    assert fit.intercept == pytest.approx(latency_us, rel=0.1)  # relative weighting keeps the latency
    assert fit.rate == pytest.approx(bytes_per_us, rel=0.05)
    assert fit.max_abs_residual_pct < 6


def test_ordinary_least_squares_would_lose_the_latency() -> None:
    # Why calibrate fits relative error: unweighted, the 256 MiB points dominate.
    rng = random.Random(3)
    ts = [(10.0 + s / 10_000.0) * rng.uniform(0.98, 1.02) for s in SIZES]
    rel = fit_linear([float(s) for s in SIZES], ts)
    ols = fit_linear([float(s) for s in SIZES], ts, relative=False)
    assert abs(rel.intercept - 10.0) < abs(ols.intercept - 10.0)


def test_negative_intercept_is_clamped() -> None:
    fit = fit_linear([1.0, 2.0, 3.0], [0.9, 2.0, 3.1])
    assert fit.intercept == 0.0 and fit.slope > 0


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="at least two"):
        fit_linear([1.0], [1.0])
    with pytest.raises(ValueError, match="same x"):
        fit_linear([1.0, 1.0], [1.0, 2.0])


def test_step_fit_recovers_chain_broadcast_parameters() -> None:
    # Pipelined chain: steps = n - 2 + k, bytes = steps * S / k (k chunks of 512 KiB).
    from commdsl.calibrate.fit import fit_steps
    from commdsl.ir import Algo, OpKind
    from commdsl.sim.collectives import plan

    latency_us, bytes_per_us = 8.0, 40_000.0
    steps, nbytes, ts = [], [], []
    for s in SIZES:
        p = plan(OpKind.BROADCAST, Algo.CHAIN, 4, s, 512 * 1024)
        steps.append(p.latency_steps)
        nbytes.append(p.serial_bytes)
        ts.append(p.latency_steps * latency_us + p.serial_bytes / bytes_per_us)
    fit = fit_steps(steps, nbytes, ts)
    assert fit.latency_us == pytest.approx(latency_us, rel=1e-6)
    assert fit.bytes_per_us == pytest.approx(bytes_per_us, rel=1e-6)


def test_step_fit_with_constant_steps_divides_latency() -> None:
    from commdsl.calibrate.fit import fit_steps

    # Ring all_reduce on 4 ranks: 6 steps whatever the size.
    ts = [6 * 5.0 + 1.5 * s / 1000.0 for s in SIZES]
    fit = fit_steps([6.0] * len(SIZES), [1.5 * s for s in SIZES], ts)
    assert fit.latency_us == pytest.approx(5.0) and fit.bytes_per_us == pytest.approx(1000.0)
