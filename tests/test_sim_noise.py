"""Sampled simulation: the machine's random compute stalls (`compute_noise`), drawn per
op with a seed, reported as per-op medians over the samples."""

from __future__ import annotations

import importlib
import json
import random
import statistics
import weakref
from array import array
from bisect import insort

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commdsl.calibrate.executor_probes import STALL_MIN_US, NoiseResult, Stalls, combine_pieces, stalls
from commdsl.cli import main
from commdsl.errors import MachineError, UsageError
from commdsl.sim import simulate
from commdsl.sim.contention import poisson
from commdsl.sim.engine import Engine
from commdsl.sim.models import NETWORKS
from commdsl.sim.medians import medians
from commdsl.sim.simulate import _run, out_of_the_running
from commdsl.timeline import Timeline

simulate_module = importlib.import_module("commdsl.sim.simulate")  # the module: `commdsl.sim.simulate` is also the function

try:
    from test_sim_engine import machine, sched
except ImportError:  # tests/ imported as a package
    from tests.test_sim_engine import machine, sched

NOISE = "compute_noise: {{stalls_per_s: {rate}, stall_us: {stall}}}"


def noisy(rate: float = 100.0, stall_us: float = 4000.0, **kw):
    return machine(extra=NOISE.format(rate=rate, stall=stall_us), kind="cpu", **kw)


# Two ranks that meet at an all_reduce after every compute op: whoever stalls, both wait.
PIPE = """\
for i in range({rounds}):
    compute C[i] 10ms on a
    all_reduce r[i] 1KB
"""
ALONE = "for i in range({rounds}):\n    compute C[i] 10ms on a"


def pipe(rounds: int):
    return sched(PIPE.format(rounds=rounds), world="2")


def alone(rounds: int):
    return sched(ALONE.format(rounds=rounds))


def test_the_machine_file_reads_and_checks_compute_noise():
    m = noisy(12.5, 3500)
    assert (m.compute_noise.stalls_per_s, m.compute_noise.stall_us) == (12.5, 3500.0)
    assert m.to_json()["compute_noise"] == {"stalls_per_s": 12.5, "stall_us": 3500.0, "wake_stall_probability": 0.0, "wake_stall_us": 0.0,
                                            "duration_stretch": 1.0}  # fmt: skip
    assert machine().compute_noise is None
    with pytest.raises(MachineError, match="compute_noise.stall_us must not be negative, got -1"):
        noisy(1, -1)
    with pytest.raises(MachineError, match="compute_noise is missing 'stall_us'"):
        machine(kind="cpu", extra="compute_noise: {stalls_per_s: 3}")
    with pytest.raises(MachineError, match="unknown key 'stalls'"):
        machine(kind="cpu", extra="compute_noise: {stalls: 3, stall_us: 1}")
    with pytest.raises(MachineError, match="compute_noise.wake_stall_probability must be below 1, got 1.5"):
        machine(kind="cpu", extra="compute_noise: {stalls_per_s: 3, stall_us: 1, wake_stall_probability: 1.5, wake_stall_us: 2}")
    with pytest.raises(MachineError, match="compute_noise describes a CPU host .* but device.kind is gpu"):
        machine(extra="compute_noise: {stalls_per_s: 3, stall_us: 1}")
    for bad in ("0", "-1.02", "fast"):
        with pytest.raises(MachineError, match="compute_noise.duration_stretch must "):
            machine(kind="cpu", extra=f"compute_noise: {{stalls_per_s: 3, stall_us: 1, duration_stretch: {bad}}}")


def test_explicit_durations_run_stretched_in_every_simulation():
    """`duration_stretch` is the typical time, not noise: one sample or many, a 10 ms op
    runs 10.3 ms; FLOP-sized work keeps the device's rate."""
    stretched = machine(kind="cpu", extra="compute_noise: {stalls_per_s: 0, stall_us: 0, duration_stretch: 1.03}")
    assert simulate(alone(4), stretched).makespan_us == pytest.approx(41_200, rel=1e-6)
    assert simulate(alone(4), stretched, samples=3).makespan_us == pytest.approx(41_200, rel=1e-6)
    assert simulate(alone(4), noisy(0, 0)).makespan_us == pytest.approx(40_000, rel=1e-6)
    flops = sched("compute C 2TFLOP on a")
    assert simulate(flops, stretched).makespan_us == simulate(flops, machine()).makespan_us


def test_one_sample_is_the_noise_free_simulation():
    program = pipe(5)
    assert simulate(program, noisy()).makespan_us == simulate(program, machine()).makespan_us == pytest.approx(50_000, rel=1e-3)


def test_samples_need_a_noise_model_and_a_positive_count():
    program = pipe(2)
    with pytest.raises(UsageError, match="machine m has no compute_noise"):
        simulate(program, machine(), samples=3)
    with pytest.raises(UsageError, match="--samples must be at least 1, got 0"):
        simulate(program, noisy(), samples=0)


def test_samples_are_reproducible_from_the_seed():
    program = pipe(6)
    a = simulate(program, noisy(), samples=9, seed=4)
    b = simulate(program, noisy(), samples=9, seed=4)
    c = simulate(program, noisy(), samples=9, seed=5)
    assert a.sampling["sample_makespans_us"] == b.sampling["sample_makespans_us"]
    assert a.sampling["sample_makespans_us"] != c.sampling["sample_makespans_us"]
    assert (a.sampling["samples"], a.sampling["seed"]) == (9, 4)


def test_stalls_add_their_expected_time_to_a_lone_rank():
    # One rank, no synchronisation: the mean makespan is the work plus rate x work x stall.
    rounds, rate, stall = 10, 20.0, 3000.0
    program = alone(rounds)
    result = simulate(program, noisy(rate, stall), samples=400, seed=1)
    mean = statistics.fmean(result.sampling["sample_makespans_us"])
    expected = rounds * 10_000 * (1 + rate * 1e-6 * stall)  # 100 ms + 2 stalls of 3 ms on average
    assert mean == pytest.approx(expected, rel=0.03)
    assert min(result.sampling["sample_makespans_us"]) == pytest.approx(rounds * 10_000)


def test_where_ranks_synchronise_the_late_one_sets_the_pace():
    # Each round waits for the slower rank, so the median makespan over samples exceeds
    # the makespan of one rank's median work (the noise-free one): the bias a noise-free
    # simulation has on a shared CPU. Without synchronisation the median stays close to it.
    rate, stall = 15.0, 4000.0
    synced = simulate(pipe(12), noisy(rate, stall), samples=61, seed=2)
    lone = simulate(alone(12), noisy(rate, stall), samples=61, seed=2)
    base = 12 * 10_000
    assert lone.makespan_us - base < synced.makespan_us - base
    # Per round: P(some rank stalls) = 1 - exp(-2 x 0.15) = 0.26 against 0.14 for one rank.
    assert synced.makespan_us >= base + 2 * stall


def test_the_median_sample_is_run_again_from_its_own_seed():
    # Flows, links and the critical path come from the median sample, run again from its
    # seed (only each sample's times are kept): the same draws, so its last transfer, the
    # final all_reduce, ends at the median of the sample makespans.
    result = simulate(pipe(8), noisy(30, 3000), samples=9, seed=11)
    makespans = result.sampling["sample_makespans_us"]
    assert len(set(makespans)) > 1
    assert max(f.end_us for f in result.flow_stats()) == statistics.median(makespans)
    assert result.raw.ops[result.critical_path[-1]].name == "r[7]"


# The host never blocks here (NCCL calls return at once, host work runs on its own clock);
# a blocking gloo all_reduce stops it at the first.
HOSTED = "host prep 2ms\n" + PIPE
BLOCKING = HOSTED.replace("all_reduce r[i] 1KB", "all_reduce r[i] 1KB transport=gloo")


@pytest.mark.parametrize("text, shared", [(HOSTED, True), (BLOCKING, False)])
def test_later_samples_start_from_the_first_samples_hosts_pass(text: str, shared: bool):
    """Where no host blocks in its first pass, a sampled simulation issues the program
    once and starts each later sample from what that pass left; each sample is still the
    run of its own seed from scratch, so the medians are those of independent runs."""
    program, m = sched(text.format(rounds=6), world="2"), noisy(100, 3000)
    first = Engine(program, m, NETWORKS["flow"], random.Random(3), keep_issued=True)
    first.run()
    assert (first.issued is not None) == shared
    runs = [_run(program, m, "flow", random.Random(3 + i))[0] for i in range(5)]
    result = simulate(program, m, samples=5, seed=3)
    assert result.sampling["sample_makespans_us"] == [round(max(max(r.end), max(r.issue_end)), 3) for r in runs]
    for name in ("issue_start", "issue_end", "start", "end"):
        assert getattr(result.raw, name) == medians([getattr(r, name) for r in runs]), name
    assert len(set(result.sampling["sample_makespans_us"])) > 1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=15))
def test_a_sample_out_of_the_running_is_never_the_median(makespans: list[int]) -> None:
    """A sampled run drops what only the median sample needs (its network, causes) from
    the samples that can no longer be it: never the median, and at most half of them
    kept (plus one) once each sample has run."""
    samples = len(makespans)
    median = sorted(range(samples), key=makespans.__getitem__)[(samples - 1) // 2]  # as simulate() picked it
    ranked: list[tuple[float, int]] = []
    kept: set[int] = set()
    for i, makespan in enumerate(makespans):
        insort(ranked, (float(makespan), i))
        kept.add(i)
        kept -= set(out_of_the_running(ranked, samples))
        assert median in kept or median > i
        assert len(kept) <= samples // 2 + 1
    assert kept == {median}


@pytest.mark.parametrize("samples", [9, 25])
def test_a_sampled_run_frees_the_networks_out_of_the_running(monkeypatch, samples: int):
    """Each sample's network records stay only while it can still be the median sample:
    at most half the samples' networks, plus one, are alive when a sample starts (each
    one run so far without the pruning; up to 17 of 25 if a collection misses networks
    kept long enough to age)."""
    networks: weakref.WeakSet = weakref.WeakSet()
    alive: list[int] = []
    real_run = simulate_module._run

    def run(*args, **kwargs):
        alive.append(len(networks))
        raw, engine, makespan = real_run(*args, **kwargs)
        networks.add(engine.network)
        return raw, engine, makespan

    monkeypatch.setattr(simulate_module, "_run", run)
    result = simulate(pipe(6), noisy(100, 3000), samples=samples, seed=2)
    assert len(alive) == samples and max(alive) <= samples // 2 + 1, alive
    assert result.network_model in networks and max(f.end_us for f in result.flow_stats()) == statistics.median(result.sampling["sample_makespans_us"])


def test_per_op_medians_make_the_timeline_and_its_metadata(tmp_path):
    program = pipe(4)
    result = simulate(program, noisy(), samples=7, seed=0)
    raw = result.raw
    for g in range(len(raw.ops)):
        assert raw.end[g] >= raw.start[g]
    path = tmp_path / "t.json"
    result.timeline.write(str(path))
    meta = Timeline.read(str(path)).meta
    assert meta["samples"] == 7 and len(meta["sample_makespans_us"]) == 7 and meta["stat"] == "median"


def test_poisson_draws_have_the_mean_and_variance():
    rng = random.Random(0)
    for mean in (0.05, 2.0, 80.0):
        draws = [poisson(rng.random(), mean) for _ in range(20_000)]
        assert statistics.fmean(draws) == pytest.approx(mean, rel=0.05)
        assert statistics.pvariance(draws) == pytest.approx(mean, rel=0.1)
    # The inverse CDF: P(0) = exp(-mean) of the uniforms give 0, the next P(1) give 1.
    assert [poisson(u, 2.0) for u in (0.0, 0.1353, 0.1354, 0.406, 0.407)] == [0, 0, 1, 1, 2]
    assert poisson(1.0 - 2**-53, 0.5) > 0 and poisson(0.999, 0.0) == 0


def test_stall_statistics_from_measured_excess_times():
    # 100 ops of 10 ms: most ran 0.2 ms over, 5 stalled 4 ms more, one ran 0.9 ms more (noise).
    compute = stalls([200.0] * 94 + [1100.0] + [4200.0] * 5)
    assert (compute.samples, compute.stalled, compute.mean_us) == (100, 5, pytest.approx(4000.0))
    # Wake-ups: 50 gaps of 60 us, 10 of which 2 ms late.
    wake = stalls([60.0] * 40 + [2060.0] * 10)
    result = NoiseResult(compute, wake, 10_000.0)
    assert result.stalls_per_s == pytest.approx(5.0)  # 5 stalls in 1 s of compute
    assert result.wake_stall_probability == pytest.approx(0.2)
    assert result.duration_stretch == pytest.approx(1.02)  # the typical op: 10.2 ms for 10
    assert result.machine_json() == {"stalls_per_s": 5.0, "stall_us": 4000.0, "wake_stall_probability": 0.2, "wake_stall_us": 2000.0,
                                     "duration_stretch": 1.02}  # fmt: skip
    assert stalls([]) == Stalls(0, 0, 0.0) and NoiseResult(stalls([]), stalls([]), 1.0).stalls_per_s == 0.0
    assert stalls([300.0] * 10).stalled == 0
    assert STALL_MIN_US == 1000.0


def test_calibration_keeps_the_median_piece_of_the_stall_probe():
    """One piece counted during a stall episode (30 a second) is outvoted by the other two;
    the kept piece is a whole piece (its stall length and wake-ups with it), and its
    typical excess is the median of the pieces' (an episode may sit in a middle piece)."""
    def piece(stalled: int, wake_stalled: int, typical_us: float) -> NoiseResult:
        return NoiseResult(Stalls(600, stalled, 3500.0, typical_us), Stalls(500, wake_stalled, 2500.0), 10_000.0)

    episode, quiet, typical = piece(180, 30, 300.0), piece(30, 10, 200.0), piece(48, 20, 1400.0)
    kept = combine_pieces([episode, quiet, typical])
    assert (kept.compute.stalled, kept.wake, kept.compute.mean_us) == (48, typical.wake, 3500.0)
    assert kept.stalls_per_s == pytest.approx(8.0)
    assert kept.duration_stretch == pytest.approx(1.03)  # 300 us: not the kept piece's 1400
    two = combine_pieces([quiet, episode])
    assert (two.compute.stalled, two.duration_stretch) == (30, pytest.approx(1.02))  # the lower of two
    assert combine_pieces([episode]) == episode


def test_late_wake_ups_delay_what_waited_on_comm():
    # Every wait on the all_reduce wakes 2 ms late (probability ~1): each of the 4 rounds'
    # compute starts 2 ms after the all_reduce before it (none before the first).
    m = machine(kind="cpu", extra="compute_noise: {stalls_per_s: 0, stall_us: 0, wake_stall_probability: 0.999999, wake_stall_us: 2000}")
    result = simulate(pipe(4), m, samples=3)
    assert result.makespan_us == pytest.approx(4 * 10_000 + 3 * 2000, rel=1e-4)


def test_late_wake_ups_need_a_busy_cpu():
    """On an idle CPU a thread wakes at once: blocking collectives back to back (nothing
    computing) never wake late, though every wake-up is drawn late (probability ~1).
    Where compute runs elsewhere when the comm op ends, the stream waiting on it wakes
    late: rank 1 computes 30 ms while rank 0 runs two 1 ms all_reduces in a subgroup."""
    m = machine(kind="cpu", extra="compute_noise: {stalls_per_s: 0, stall_us: 0, wake_stall_probability: 0.999999, wake_stall_us: 2000}")
    back_to_back = sched("for i in range(4):\n    all_reduce r[i] 1KB", world="2")
    quiet = simulate(back_to_back, m, samples=3)
    assert quiet.makespan_us == pytest.approx(simulate(back_to_back, machine()).makespan_us)
    busy = sched("if rank == 1:\n    compute C 30ms on a\nif rank == 0:\n    send s 1KB to 2\n    send t 1KB to 2\n"
                 "if rank == 2:\n    recv s 1KB from 0\n    recv t 1KB from 0", world="3")  # fmt: skip
    base = simulate(busy, machine())
    late = simulate(busy, m, samples=3)
    ends = {s.op_id: s.end_us for s in late.timeline.exec_spans().values()}
    base_ends = {s.op_id: s.end_us for s in base.timeline.exec_spans().values()}
    # rank 0's second send waits for the first (a blocking send): woken late, 2 ms.
    assert ends["0:1"] - base_ends["0:1"] == pytest.approx(2000, rel=1e-3)


def test_cli_samples(tmp_path, capsys):
    path = tmp_path / "noisy.yaml"
    path.write_text(_NOISY_FILE)
    args = ["simulate", "1f1b", "-p", "stages=2", "-p", "microbatches=4", "--machine", str(path)]
    assert main([*args, "--samples", "5", "--gantt", "never"]) == 0
    assert "per-op medians over 5 samples" in capsys.readouterr().out
    assert main([*args, "--samples", "5", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["sample_makespans_us"]) == 5
    assert main(["simulate", "1f1b", "--samples", "3"]) == 2
    assert "has no compute_noise" in capsys.readouterr().err


_NOISY_FILE = """\
name: noisy
devices: 8
device: {name: cpu, peak_tflops: {fp32: 0.1}, memory_bandwidth_gb_per_s: 10, sm_count: 1, kind: cpu}
kernel_launch_us: 5
comm_launch_us: 10
host_link: {latency_us: 1, bandwidth_gb_per_s: 10}
transports:
  nccl: {latency_us: 50, bandwidth_gb_per_s: 5}
  gloo: {latency_us: 50, bandwidth_gb_per_s: 5}
compute_noise: {stalls_per_s: 20, stall_us: 4000}
"""


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=9).flatmap(
    lambda n: st.lists(st.lists(st.floats(min_value=0.0, max_value=1e12), min_size=n, max_size=n), min_size=1, max_size=20)))
def test_sample_medians_are_statistics_median(rows: list[list[float]]) -> None:
    """A sampled run's per-op medians (`medians`: C-level passes, or compiled a C loop for
    three samples) are exactly `statistics.median` of the samples' values, odd and even
    sample counts alike; of an odd count, the very value `sorted` puts in the middle."""
    columns = [array("d", column) for column in zip(*rows)]
    got = medians(columns)
    assert list(got) == [statistics.median(row) for row in rows]
    if len(columns) % 2:
        assert got.tobytes() == array("d", [sorted(row)[len(row) // 2] for row in rows]).tobytes()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, -0.0, 1.0, 2.5]), min_size=3, max_size=3), min_size=1, max_size=20))
def test_three_samples_median_is_the_middle_value_bit_for_bit(rows: list[list[float]]) -> None:
    """Of three samples with ties and signed zeros, the median is the value a stable sort
    puts in the middle, to the bit (the compiled C loop's case)."""
    columns = [array("d", column) for column in zip(*rows)]
    assert medians(columns).tobytes() == array("d", [sorted(row)[1] for row in rows]).tobytes()
