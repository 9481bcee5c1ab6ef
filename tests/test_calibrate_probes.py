"""The probes' arithmetic (`executor_probes.overlap_from`, `OverlapPieces`, `barrier_from`): known
slowdowns and barrier times of synthetic records come back exactly. The probes
themselves run in test_calibrate_e2e."""

from __future__ import annotations

import statistics

import pytest

from commdsl.calibrate.executor_probes import MAX_SLOWDOWN, Overlap, OverlapPieces, barrier_from, overlap_from


def rank_records(skew_us: float, comm_slow: float, compute_slow: float) -> dict[str, tuple[float, float]]:
    """One iteration, one round on a rank that enters comm ops `skew_us` after the first
    (the last member enters 1000 us after it): the comm op alone (5 ms from the last
    member's start), 20 ms of compute alone, then both issued together: the comm op
    `comm_slow` times slower, compute `compute_slow` times slower while it runs here."""
    beside = 5000.0 * comm_slow
    b_start, b_end = 30000.0 + skew_us, 31000.0 + beside
    overlap = b_end - b_start
    before = b_start - 30000.0  # compute alone before the op starts on this rank
    return {
        "A[0]": (skew_us, 6000.0),
        "C[0]": (6000.0, 26000.0),
        "B[0]": (b_start, b_end),
        "D[0]": (30000.0, b_end + 20000.0 - before - overlap / compute_slow),
    }


@pytest.mark.parametrize("comm_slow,compute_slow", [(2.0, 1.5), (1.3, 1.9), (1.0, 1.0), (3.0, 1.2)])
def test_known_slowdowns_come_back(comm_slow, compute_slow):
    records = [[rank_records(0.0, comm_slow, compute_slow)] * 3, [rank_records(1000.0, comm_slow, compute_slow)] * 3]
    o = overlap_from(records, rounds=1)
    assert o.comm_alone_us == pytest.approx(5000.0)
    assert o.comm_beside_us == pytest.approx(5000.0 * comm_slow)
    assert o.compute_alone_us == (20000.0, 20000.0)
    assert o.compute_comm_slowdown == pytest.approx(comm_slow)
    assert o.comm_compute_slowdown == pytest.approx(compute_slow)


def test_compute_slowdown_is_the_slowest_ranks():
    """Ranks meet at every comm op, so the rank whose compute the op slows most paces
    them: rank 1 slowed 1.8x, rank 0 1.2x -> 1.8."""
    records = [[rank_records(0.0, 2.0, 1.2)] * 3, [rank_records(1000.0, 2.0, 1.8)] * 3]
    assert overlap_from(records, rounds=1).comm_compute_slowdown == pytest.approx(1.8)


def test_compute_slowdown_from_the_overlap_on_each_rank():
    o = Overlap(comm_alone_us=5000, comm_beside_us=10000, compute_alone_us=(20000,), compute_beside_us=(23333.333333,), overlap_us=(10000,))
    assert o.comm_compute_slowdown == pytest.approx(1.5)
    assert o.compute_comm_slowdown == pytest.approx(2.0)


def test_edge_cases_stay_in_range():
    # Compute lost nothing (or gained: noise): no slowdown; never below 1 for the comm op either.
    assert Overlap(5000, 4000, (20000,), (19900,), (4000,)).comm_compute_slowdown == 1.0
    assert Overlap(5000, 4000, (20000,), (19900,), (4000,)).compute_comm_slowdown == 1.0
    # Compute stopped while the op ran (lost all of the overlap): capped.
    assert Overlap(5000, 10000, (20000,), (30000,), (10000,)).comm_compute_slowdown == MAX_SLOWDOWN
    assert Overlap(5000, 10000, (20000,), (25000,), (0,)).comm_compute_slowdown == 1.0


def test_barrier_time_leaves_out_the_arrival_skew():
    """Rank 1 reaches each barrier 3 ms after rank 0; both leave `cost` after rank 1
    arrives: the barrier's time is `cost`, whatever the skew (per-rank spans would say
    3 ms more on rank 0)."""
    costs = [400.0, 900.0, 1100.0]
    rank0 = [[(10_000.0 * k, 10_000.0 * k + 3000.0 + c) for k, c in enumerate(costs)]] * 4
    rank1 = [[(10_000.0 * k + 3000.0, 10_000.0 * k + 3000.0 + c) for k, c in enumerate(costs)]] * 4
    assert barrier_from([rank0, rank1]) == pytest.approx(800.0)
    assert barrier_from([rank1, rank0]) == pytest.approx(800.0)


def test_factors_are_the_median_pieces():
    """A piece run in a slow spell (the op alone slow, beside compute fast: x1.1 where the
    others say x2.0 and x1.8) is outvoted; so is each factor apart: the compute slowdown
    is the median of the pieces' slowest-rank slowdowns (rank 0's in one piece, rank 1's
    in another), not that of median times."""
    typical = Overlap(5000, 10000, (20000, 20000), (30000, 20000), (10000, 10000))  # x2.0, rank 0 x2.0
    other = Overlap(5000, 9000, (20000, 20000), (20000, 25000), (10000, 10000))  # x1.8, rank 1 x2.0
    spell = Overlap(6700, 7400, (20000, 20000), (21000, 21000), (7000, 7000))  # x1.1, x1.17
    o = OverlapPieces((spell, typical, other))
    assert o.compute_comm_slowdown == pytest.approx(1.8)
    assert o.comm_compute_slowdown == pytest.approx(2.0)
    assert (o.comm_alone_us, o.comm_beside_us) == (5000, 9000)
    assert OverlapPieces((typical,)).compute_comm_slowdown == typical.compute_comm_slowdown


def test_the_ops_slowdown_is_over_the_loops_time_alone():
    """The simulator scales the loop-calibrated time: the op's slowdown beside compute is
    its median time beside compute over the loop's time alone (5 ms here), not over the
    probe's own time alone (7-8.4 ms, slow right after compute); at least 1. The compute
    slowdown stays the median of the pieces'."""
    pieces = tuple(Overlap(alone, beside, (20000,), (26000,), (10000,))
                   for alone, beside in ((7000, 9000), (8400, 10000), (7600, 9500)))  # fmt: skip
    o = OverlapPieces(pieces, loop_alone_us=5000)
    assert o.compute_comm_slowdown == pytest.approx(9500 / 5000)
    assert OverlapPieces(pieces).compute_comm_slowdown == pytest.approx(statistics.median(b / a for a, b in ((7000, 9000), (8400, 10000), (7600, 9500))))
    assert o.comm_compute_slowdown == OverlapPieces(pieces).comm_compute_slowdown
    assert OverlapPieces(pieces, loop_alone_us=20000).compute_comm_slowdown == 1.0
