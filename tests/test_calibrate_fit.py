"""The calibration fit recovers known latency and bandwidth from synthetic measurements."""

from __future__ import annotations

import random
import statistics

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from commdsl.calibrate.fit import (
    MAX_POINT_US, MAX_RUNS_FACTOR, MIN_POINT_US, WILD_US, comm_mean_us, expected_us, fit_linear, monotone, pass_ratios, precise,
)  # fmt: skip

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


def test_expected_time_keeps_the_stalls_a_median_hides() -> None:
    # A gloo call on a small shared CPU: 0.2 ms, or 4 ms when it stalls (40% of runs).
    samples = [200.0] * 9 + [4000.0] * 6
    assert expected_us(samples) == pytest.approx((200.0 * 8 + 4000.0 * 5) / 13)
    assert sorted(samples)[len(samples) // 2] == 200.0  # what the median said


def test_expected_time_drops_one_wild_outlier() -> None:
    assert expected_us([10.0, 11.0, 12.0, 13.0, 100_000.0]) == pytest.approx(12.0)
    assert expected_us([10.0, 30.0]) == pytest.approx(20.0)  # too few to trim
    with pytest.raises(ValueError):
        expected_us([])


def test_a_communication_point_keeps_its_stalls_and_drops_only_a_wild_run() -> None:
    # A broadcast that stalls for a slice in one run of 41: the stall stays (a trimmed
    # mean would drop it), a preemption does not.
    assert comm_mean_us([200.0] * 40 + [4200.0]) == pytest.approx((200.0 * 40 + 4200.0) / 41)
    assert comm_mean_us([200.0] * 40 + [WILD_US + 1000.0]) == pytest.approx(200.0)
    # A slow op's spread is not wild: up to its median again above the median stays.
    assert comm_mean_us([100_000.0] * 10 + [195_000.0]) == pytest.approx(1_195_000.0 / 11)
    assert comm_mean_us([100_000.0] * 10 + [205_000.0]) == pytest.approx(100_000.0)
    with pytest.raises(ValueError):
        comm_mean_us([])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2**28), st.floats(1.0, 1e6)), min_size=1, max_size=12, unique_by=lambda p: p[0]))
def test_monotone_profile_is_non_decreasing_and_keeps_the_total(points) -> None:
    out = monotone(points)
    assert [s for s, _ in out] == sorted(s for s, _ in points)
    assert all(a[1] <= b[1] * (1 + 1e-12) for a, b in zip(out, out[1:]))
    # Pool-adjacent-violators averages within blocks: the total time is unchanged.
    assert sum(t for _, t in out) == pytest.approx(sum(t for _, t in points))


def test_monotone_profile_keeps_ordered_points_and_pools_a_stall() -> None:
    ordered = [(1024, 100.0), (4096, 120.0), (16384, 300.0)]
    assert monotone(ordered) == ordered
    # 4 KiB landed on stalls: it and the next point, out of order, average.
    assert monotone([(1024, 200.0), (4096, 3600.0), (16384, 400.0), (65536, 5000.0)]) == [
        (1024, 200.0), (4096, 2000.0), (16384, 2000.0), (65536, 5000.0)]


STEADY = [25_000.0, 25_250.0, 24_750.0, 25_125.0, 24_875.0]  # 0.125 s in all
STALLS = [200.0, 4000.0, 200.0, 200.0, 4000.0]  # gloo calls that stall for a slice


def test_sampling_goes_on_while_the_estimate_is_loose() -> None:
    assert not precise(STEADY[:4], 5)  # fewer than the minimum
    assert precise(STEADY, 5)  # standard error ~0.4%
    assert not precise([t * 25 for t in STALLS], 5)
    # ... until the run budget or the time budget is spent.
    assert precise(STALLS * MAX_RUNS_FACTOR, 5)
    assert precise([MAX_POINT_US / 4, 1.0, MAX_POINT_US / 2, 3.0, MAX_POINT_US / 4], 5)


def test_runs_that_agree_go_on_until_the_point_has_its_time() -> None:
    # Agreeing runs under MIN_POINT_US of measured time: a stall may be yet to come.
    fast = [1000.0, 1010.0, 990.0, 1005.0, 995.0]
    assert sum(fast * 19) < MIN_POINT_US < sum(fast * 21)
    assert not precise(fast * 19, 30)
    assert precise(fast * 21, 30)


def test_a_point_measured_in_passes_takes_a_share_per_pass_and_judges_all_runs() -> None:
    stalls = [t * 25 for t in STALLS]
    # 15 runs in 3 passes: 5 a pass, however precise the runs so far.
    assert not precise(STEADY[:4], 15, earlier=STEADY * 2, passes=3)
    assert precise(STEADY, 15, earlier=STEADY * 2, passes=3)
    # A pass stops early once every run so far is precise, not its own alone...
    assert not precise(STEADY, 15, earlier=stalls, passes=3)
    assert precise(stalls, 15, earlier=STEADY * 40, passes=3)
    # ... after its share of the time floor...
    fast = [1000.0, 1010.0, 990.0, 1005.0, 995.0]
    assert not precise(fast * 6, 15, earlier=fast * 12, passes=3)  # 30 ms of 33
    assert precise(fast * 7, 15, earlier=fast * 12, passes=3)
    # ... and at its share of the run budget (8 x 15 / 3) or of the time budget.
    assert not precise(STALLS * 7, 15, passes=3)
    assert precise(STALLS * 8, 15, passes=3)
    assert precise([MAX_POINT_US / 6, 1.0, MAX_POINT_US / 6, 3.0, 1.0], 15, passes=3)
    assert not precise([MAX_POINT_US / 8, 1.0, MAX_POINT_US / 8, 3.0, 1.0], 15, passes=3)


def _pooled_estimate(rng: random.Random, min_runs: int, base_us: float, stall_p: float, passes: int = 3) -> float:
    """One calibration point as `calibrate` takes it: `passes` passes, each sampling until
    `precise`, the expected time of all runs. A run: `base_us` (+-10%), plus a stall (4 ms
    on average, exponential) in a fraction `stall_p` of runs, as gloo's calls on the CI VM."""
    pooled: list[float] = []
    for _ in range(passes):
        runs: list[float] = []
        while not precise(runs, min_runs, earlier=pooled, passes=passes):
            runs.append(rng.gauss(base_us, base_us / 10) + (rng.expovariate(1 / 4000.0) if rng.random() < stall_p else 0.0))
        pooled += runs
    return comm_mean_us(pooled)


@pytest.mark.parametrize("base_us, stall_p", [(1000.0, 0.2), (1000.0, 0.05), (600.0, 0.05), (150.0, 0.03)])
def test_a_stalling_point_comes_out_at_its_mean(base_us: float, stall_p: float) -> None:
    """Stopping as soon as the runs agree, and a trimmed mean, both favour runs without
    stalls: with them, these points came out at 0.95, 0.91, 0.87 and 0.71x their mean on
    average. Now within a few percent, over 200 seeded calibrations each."""
    from commdsl.calibrate.main import REPEATS

    rng = random.Random(7)
    true_us = base_us + stall_p * 4000.0
    ratio = statistics.fmean(_pooled_estimate(rng, REPEATS, base_us, stall_p) / true_us for _ in range(200))
    assert 0.96 < ratio < 1.04


def test_pass_ratios_tell_a_slow_pass_by_the_points_that_move_together() -> None:
    # Two points measured in three passes; the second ran 1.5x slow on both.
    a = [[100.0] * 4, [150.0] * 4, [100.0] * 4]
    b = [[10.0] * 4, [15.0] * 4, [10.0] * 4]
    assert pass_ratios([a, b], statistics.fmean) == pytest.approx((100 / (350 / 3), 150 / (350 / 3), 100 / (350 / 3)))
    # One point moving the other way is outvoted: the median over points.
    c = [[300.0] * 4, [200.0] * 4, [300.0] * 4]
    assert pass_ratios([a, b, c], statistics.fmean)[1] == pytest.approx(150 / (350 / 3))
    assert pass_ratios([], statistics.fmean) == ()


def test_calibrate_warns_when_its_passes_ran_at_different_speeds() -> None:
    from commdsl.calibrate.main import PASS_DRIFT_WARN, drift_warnings

    assert drift_warnings({"communication": (0.97, 1.02, 1.01), "matmul": (0.98, 1.0, 1.02)}) == []
    slow = 1 + PASS_DRIFT_WARN + 0.05
    (warning,) = drift_warnings({"communication": (1.0, 1.0, 1.0), "matmul": (1.0, slow, 1.0)})
    assert warning.startswith(f"matmul ran {100 * (slow - 1):.0f}% slower in one pass than in another (x1.00 to x{slow:.2f}")
    assert drift_warnings({"matmul": ()}) == []


# A gloo broadcast and reduce on 2 ranks, as one calibration of the CI VM measured them
# (us): no per-chunk latency at large sizes, so the pipelined chain's law cannot fit them.
GLOO_CHAIN_US = {
    "broadcast": [(1024, 315.4), (4096, 315.4), (16384, 406.8), (65536, 497.3), (262144, 640.6), (1048576, 640.6),
                  (4194304, 1537.5), (16777216, 4300.2)],
    "reduce": [(1024, 945.6), (4096, 945.6), (16384, 945.6), (65536, 945.6), (262144, 952.0), (1048576, 952.0),
               (4194304, 3139.3), (16777216, 11576.7)],
}  # fmt: skip


def test_the_fit_report_says_what_a_flat_collective_law_means(capsys, tmp_path, monkeypatch) -> None:
    """The report printed `inf GB/s` for broadcast and reduce with worst residuals of
    30-150% and no word on what the simulator does with them."""
    import torch

    monkeypatch.setenv("COLUMNS", "300")  # table cells unwrapped
    from commdsl.calibrate.main import FULL, Results, _header, _print_report, build_machine, parse_args
    from commdsl.ir import Dtype, OpKind

    sizes = [s for s, _ in GLOO_CHAIN_US["broadcast"]]
    line = [(s, 50.0 + s / 2000.0) for s in sizes]  # 50 us + 2 GB/s
    res = Results({Dtype.FP32: [(128, 60.0), (256, 400.0), (512, 3000.0)]}, line, line, line, line,
                  {OpKind(k): pts for k, pts in GLOO_CHAIN_US.items()} | {OpKind.ALL_GATHER: line}, {}, 0.0, 5.0, 20.0, [])  # fmt: skip
    cfg = parse_args(["--out", str(tmp_path / "m.yaml")])
    machine, report = build_machine(cfg, res, 2, "gloo", torch.device("cpu"), "test")
    assert report.collectives[OpKind.BROADCAST].bandwidth_gb_per_s == float("inf")  # the best the law can do
    assert report.collectives[OpKind.ALL_GATHER].bandwidth_gb_per_s == pytest.approx(1.0, rel=1e-6)  # 2 GB/s of S, S/2 serial
    _print_report(report, res, FULL)
    out = " ".join(capsys.readouterr().out.split())
    assert "inf GB/s" not in out
    assert "us/step, no bandwidth term (*)" in out and "us/step + 1.000 GB/s" in out
    assert "groups of 2 ranks (the size measured) are simulated from the measured times, interpolated" in out
    assert "(*) broadcast, reduce: the law cannot fit the measured times" in out
    header = _header(cfg, 2, "gloo", "test", report, res)
    assert "inf GB/s" not in header and "# (*) broadcast, reduce: the law cannot fit" in header
    # The machine file keeps the measured profile the simulator interpolates at 2 ranks.
    assert machine["transports"]["gloo"]["collectives"]["broadcast"]["measured_us"][-1] == [16777216, 4300.2]


def test_a_bandwidth_too_small_to_tell_is_written_within_the_machine_limits(capsys, tmp_path, monkeypatch) -> None:
    """Three ranks calibrated up to 4 KiB fitted a reduce_scatter at 0.0008 GB/s, which the
    machine loader refuses: calibrate wrote a file commdsl could not read."""
    import torch

    monkeypatch.setenv("COLUMNS", "300")
    from commdsl.calibrate.main import FULL, Results, _print_report, build_machine, parse_args
    from commdsl.ir import Dtype, OpKind
    from commdsl.limits import MIN_BANDWIDTH_GB_PER_S
    from commdsl.machine import load_machine_text

    line = [(s, 50.0 + s / 2000.0) for s in (1024, 2048, 4096)]
    steep = [(1024, 1500.0), (2048, 3000.0), (4096, 6000.0)]  # slow and tiny: a fit below 0.001 GB/s
    res = Results({Dtype.FP32: [(128, 60.0), (256, 400.0), (512, 3000.0)]}, line, line, line, line,
                  {OpKind.REDUCE_SCATTER: steep, OpKind.ALL_GATHER: line}, {}, 0.0, 5.0, 20.0, [])  # fmt: skip
    cfg = parse_args(["--out", str(tmp_path / "m.yaml")])
    machine, report = build_machine(cfg, res, 3, "gloo", torch.device("cpu"), "test")
    assert report.collectives[OpKind.REDUCE_SCATTER].bandwidth_gb_per_s < MIN_BANDWIDTH_GB_PER_S
    written = machine["transports"]["gloo"]["collectives"]["reduce_scatter"]["bandwidth_gb_per_s"]
    assert written == MIN_BANDWIDTH_GB_PER_S
    load_machine_text(yaml.safe_dump(machine, sort_keys=False), "m.yaml")  # the file reads back
    _print_report(report, res, FULL)
    out = " ".join(capsys.readouterr().out.split())
    assert "(**) reduce_scatter: the sizes measured are too small to show a bandwidth" in out


def test_memcpy_gets_the_peer_copies_line_and_the_p2p_link_without_them(capsys, tmp_path, monkeypatch) -> None:
    """A calibrated file gave the memcpy transport the P2P link (gloo sends): a schedule's
    peer copies, which the executor runs as copies into the other rank's memory, were
    predicted at a gloo message's speed (memcpy_vs_nccl +21-26% long on the CI VM)."""
    import torch

    monkeypatch.setenv("COLUMNS", "300")
    from commdsl.calibrate.main import FULL, Results, _header, _print_report, build_machine, parse_args
    from commdsl.ir import Dtype, OpKind
    from commdsl.machine import load_machine_text

    sizes = (1024, 65536, 4194304)
    p2p = [(s, 50.0 + s / 2000.0) for s in sizes]  # 50 us + 2 GB/s
    res = Results({Dtype.FP32: [(128, 60.0), (256, 400.0), (512, 3000.0)]}, p2p, p2p, p2p, p2p, {OpKind.ALL_GATHER: p2p}, {}, 0.0,
                  5.0, 20.0, [])  # fmt: skip
    cfg = parse_args(["--out", str(tmp_path / "m.yaml")])
    machine, report = build_machine(cfg, res, 2, "gloo", torch.device("cpu"), "test")
    assert report.peer_copy is None
    assert machine["transports"]["memcpy"] == {k: v for k, v in machine["transports"]["gloo"].items() if k != "collectives"}
    assert "# Peer copies not measured: memcpy has the P2P link." in _header(cfg, 2, "gloo", "test", report, res)

    res.peer_copy = [(s, 2.0 + s / 10_000.0) for s in sizes]  # 2 us + 10 GB/s
    machine, report = build_machine(cfg, res, 2, "gloo", torch.device("cpu"), "test")
    assert machine["transports"]["memcpy"] == {"latency_us": pytest.approx(2.0, abs=1e-3), "bandwidth_gb_per_s": pytest.approx(10.0, rel=1e-3)}
    assert machine["transports"]["gloo"]["latency_us"] == pytest.approx(50.0, abs=1e-3)  # the other transports keep the P2P link
    _print_report(report, res, FULL)
    out = " ".join(capsys.readouterr().out.split())
    assert "peer copy 2.0 us + 10.000 GB/s (memcpy)" in out
    assert "# Peer copy fit (memcpy): latency 2.00 us, 10.000 GB/s" in _header(cfg, 2, "gloo", "test", report, res)
    load_machine_text(yaml.safe_dump(machine, sort_keys=False), "m.yaml")  # the file reads back
