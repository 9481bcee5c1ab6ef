"""Compute slowing communication (`compute_comm_slowdown`): by hand on every network,
under contention on the flow network, together with the reverse effect, and no change
at all with a factor of 1.0."""

from __future__ import annotations

import pytest

from commdsl.dsl import load_schedule, load_schedule_text
from commdsl.errors import MachineError
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.sim import simulate
from commdsl.sim.summary import summarize

NETWORKS = ("flow", "analytic", "flow-steps")


def machine(extra: str = ""):
    """4 ranks, no topology (the implied star): nccl at 100 GB/s (1e5 B/us), no latency."""
    return load_machine_text(
        f"""
name: four
devices: 4
device: {{name: t, peak_tflops: {{fp32: 1}}, memory_bandwidth_gb_per_s: 1000, sm_count: 4, kind: cpu}}
kernel_launch_us: 0
comm_launch_us: 0
host_link: {{latency_us: 0, bandwidth_gb_per_s: 10}}
transports:
  nccl: {{latency_us: 0, bandwidth_gb_per_s: 100}}
{extra}
""",
        "four.yaml",
    )


def sched(body: str, world: int = 4):
    program = "\n".join("  " + line for line in body.strip("\n").splitlines())
    return load_schedule_text(f"name: t\nworld: {world}\nstreams: [a, b]\nprogram: |\n{program}\n", "t.yaml")


def spans(result) -> dict[str, tuple[float, float]]:
    """op name -> (start, end) of its last op by that name."""
    return {op.name: (result.raw.start[g], result.raw.end[g]) for g, op in enumerate(result.raw.ops)}


SEND = """
if rank == 0:
    send x 400MB to 1 on b
if rank == 1:
    recv x 400MB from 0 on b
{compute}
"""


@pytest.mark.parametrize("network", NETWORKS)
def test_a_send_alone_and_while_the_receiver_computes(network):
    """400 MB at 1e5 B/us: 4000 us alone; factor 2 while rank 1 computes all along: 8000 us."""
    slow = machine("compute_comm_slowdown: 2.0")
    assert spans(simulate(sched(SEND.format(compute="")), slow, network=network))["x"][1] == pytest.approx(4000, rel=1e-12)
    busy = sched(SEND.format(compute="if rank == 1:\n    compute C 20ms on a"))
    r = simulate(busy, slow, network=network)
    assert spans(r)["x"][1] == pytest.approx(8000, rel=1e-12)
    assert spans(r)["C"] == pytest.approx((0, 20000), rel=1e-12)  # compute itself is not slowed
    assert spans(simulate(busy, machine(), network=network))["x"][1] == pytest.approx(4000, rel=1e-12)


@pytest.mark.parametrize("network", NETWORKS)
@pytest.mark.parametrize(
    "compute",
    [
        "if rank == 1:\n    compute C 1ms on a",  # 0-1000 us: overlaps the start
        "if rank == 1:\n    host H 1ms\n    compute C 1ms on a",  # 1000-2000 us: starts mid-transfer
        "if rank == 0:\n    compute C 1ms on a",  # the sender computes: same thing
    ],
)
def test_a_send_overlapping_compute_only_partly(network, compute):
    """1000 us at half speed moves 0.5e8 B; the other 3.5e8 B take 3500 us: 4500 us."""
    r = simulate(sched(SEND.format(compute=compute)), machine("compute_comm_slowdown: 2.0"), network=network)
    assert spans(r)["x"][1] == pytest.approx(4500, rel=1e-12)


@pytest.mark.parametrize("network", NETWORKS)
@pytest.mark.parametrize("compute_us,end_us", [(20000, 3000), (1000, 2000)])
def test_a_collective_is_slowed_while_one_member_computes(network, compute_us, end_us):
    """Ring all_reduce of 100 MB on 4 ranks: 1.5e8 serial bytes, 1500 us alone. Rank 2
    computing all along: 3000 us. Computing for the first 1000 us: 0.5e8 B then, the
    other 1e8 B in 1000 us: 2000 us."""
    body = f"all_reduce g 100MB on b\nif rank == 2:\n    compute C {compute_us}us on a"
    r = simulate(sched(body), machine("compute_comm_slowdown: 2.0"), network=network)
    assert spans(r)["g"][1] == pytest.approx(end_us, rel=1e-12)


def test_a_slowed_flow_under_contention_is_capped_at_its_solo_rate_over_the_factor():
    """Ranks 0 and 2 both send 100 MB to rank 1 (its downlink: 1e5 B/us). Rank 2
    computes, factor 4: its flow is capped at 2.5e4 B/us, rank 0's gets the other
    7.5e4 (done at 1e8 / 7.5e4 = 1333.3 us); rank 2's stays at its cap: 4000 us."""
    body = """
if rank == 0:
    send a 100MB to 1 on b
if rank == 2:
    send c 100MB to 1 on b
    compute C 20ms on a
if rank == 1:
    batch:
        irecv a 100MB from 0 on b
        irecv c 100MB from 2 on b
"""
    s = spans(simulate(sched(body), machine("compute_comm_slowdown: 4.0")))
    assert s["a"][1] == pytest.approx(1e8 / 7.5e4, rel=1e-12)
    assert s["c"][1] == pytest.approx(4000, rel=1e-12)
    # Factor 2: a cap of 5e4 is its fair share anyway, nothing changes (2000 us both).
    s = spans(simulate(sched(body), machine("compute_comm_slowdown: 2.0")))
    assert (s["a"][1], s["c"][1]) == pytest.approx((2000, 2000), rel=1e-12)


def test_both_effects_at_once_each_from_the_others_on_off_state():
    """Both factors 2. The send (4000 us alone) runs while the sender computes: 8000 us.
    The 10 ms compute is slowed while the NCCL kernel runs: 4000 us of work in those
    8000 us, then 6000 us alone: 14000 us."""
    body = """
if rank == 0:
    h = isend x 400MB to 1 on b
    compute C 10ms on a
    wait h
if rank == 1:
    recv x 400MB from 0 on b
"""
    r = simulate(sched(body), machine("comm_compute_slowdown: 2.0\ncompute_comm_slowdown: 2.0"))
    s = spans(r)
    assert s["x"][1] == pytest.approx(8000, rel=1e-12)
    assert s["C"] == pytest.approx((0, 14000), rel=1e-12)


@pytest.mark.parametrize("network", NETWORKS)
def test_factor_one_changes_nothing_on_a_bundled_schedule(network):
    program = load_schedule("fsdp")
    base = resolve_machine("dgx-h100")
    assert base.contention.compute_comm_slowdown == 1.0
    one = load_machine_text(
        open(base.source).read() + "\ncompute_comm_slowdown: 1.0\n", "one.yaml"
    )
    a, b = simulate(program, base, network=network), simulate(program, one, network=network)
    assert list(a.raw.start) == list(b.raw.start) and list(a.raw.end) == list(b.raw.end)
    if network != "analytic":
        assert a.network_model.events == b.network_model.events
    # And a factor above 1 does change this overlapped schedule.
    slow = load_machine_text(open(base.source).read() + "\ncompute_comm_slowdown: 1.5\n", "slow.yaml")
    assert simulate(program, slow, network=network).makespan_us > a.makespan_us


def test_loader_checks_and_to_json():
    m = machine("compute_comm_slowdown: 1.25")
    assert m.contention.compute_comm_slowdown == 1.25 and m.to_json()["compute_comm_slowdown"] == 1.25
    assert machine().to_json()["compute_comm_slowdown"] == 1.0
    with pytest.raises(MachineError, match="compute_comm_slowdown must be at least 1.0") as info:
        machine("compute_comm_slowdown: 0.5")
    assert (info.value.loc.file, info.value.loc.line, info.value.loc.column) == ("four.yaml", 10, 24)  # the value, on the line after nccl
    with pytest.raises(MachineError, match="compute_comm_slowdown must be a number"):
        machine("compute_comm_slowdown: fast")
    with pytest.raises(MachineError, match="compute_comm_slowdown must be a finite number"):
        machine("compute_comm_slowdown: .inf")


@pytest.mark.parametrize("network", NETWORKS)
def test_a_copy_slows_compute_on_its_device_only(network):
    """host_link 10 GB/s: a 10 MB copy from the host takes 1000 us. With
    copy_compute_slowdown 2, compute of 3000 us on the copy's device runs at half speed
    during that copy: 1000 us for 500 us of work, then 2500 us: ends at 3500 us. The
    other rank's compute is not slowed; nor is anything with a factor of 1.0."""
    body = "compute C 3000us on a\nif rank == 0:\n    copy x 10MB from host on b"
    slowed = simulate(sched(body), machine("copy_compute_slowdown: 2.0"), network=network)
    ends = {(op.rank, op.name): slowed.raw.end[g] for g, op in enumerate(slowed.raw.ops)}
    assert ends[(0, "C")] == pytest.approx(3500, rel=1e-12) and ends[(1, "C")] == pytest.approx(3000, rel=1e-12)
    assert ends[(0, "x")] == pytest.approx(1000, rel=1e-12)  # the copy itself is not slowed
    plain = simulate(sched(body), machine(), network=network)
    assert max(plain.raw.end) == pytest.approx(3000, rel=1e-12)
    assert machine("copy_compute_slowdown: 1.5").to_json()["copy_compute_slowdown"] == 1.5
    with pytest.raises(MachineError, match="copy_compute_slowdown must be at least 1.0"):
        machine("copy_compute_slowdown: 0.9")


@pytest.mark.parametrize("network", NETWORKS)
def test_compute_slows_a_copy_on_its_device_only(network):
    """The reverse: with compute_copy_slowdown 2, a 1000 us copy on rank 0 runs at half
    speed while its 600 us compute runs (600 us for 300 us of copy), then alone: ends at
    1300 us. Rank 1's copy starts after its compute and is not slowed. With both factors
    2, the compute is slowed by the copy too: both run at half speed until the compute's
    600 us of work ends at 1200 us (the copy has done 600 us), then the copy ends at 1600."""
    body = "compute C 600us on a\nif rank == 0:\n    copy x 10MB from host on b\nelse:\n    copy y 10MB from host on a"
    slowed = simulate(sched(body), machine("compute_copy_slowdown: 2.0"), network=network)
    ends = {(op.rank, op.name): slowed.raw.end[g] for g, op in enumerate(slowed.raw.ops)}
    assert ends[(0, "x")] == pytest.approx(1300, rel=1e-12) and ends[(0, "C")] == pytest.approx(600, rel=1e-12)
    assert ends[(1, "y")] == pytest.approx(1600, rel=1e-12)  # 600 us of compute, then 1000 us alone
    both = simulate(sched(body), machine("compute_copy_slowdown: 2.0\ncopy_compute_slowdown: 2.0"), network=network)
    ends = {(op.rank, op.name): both.raw.end[g] for g, op in enumerate(both.raw.ops)}
    assert ends[(0, "C")] == pytest.approx(1200, rel=1e-12) and ends[(0, "x")] == pytest.approx(1600, rel=1e-12)
    assert machine("compute_copy_slowdown: 1.5").to_json()["compute_copy_slowdown"] == 1.5
    with pytest.raises(MachineError, match="compute_copy_slowdown must be at least 1.0"):
        machine("compute_copy_slowdown: 0.9")


BY_SEND = "interference_by_op:\n  {kind}:\n    any: {{comm_compute_slowdown: {cc}, compute_comm_slowdown: {cm}}}\n"


@pytest.mark.parametrize("network", NETWORKS)
def test_an_ops_own_factor_wins_over_the_machine_wide_one(network):
    """The send's own compute_comm_slowdown (4) applies, not the machine's (2): 400 MB at
    1e5 B/us take 16000 us while the receiver computes; an op not listed keeps 2."""
    slow = machine("compute_comm_slowdown: 2.0\n" + BY_SEND.format(kind="send", cc=1.0, cm=4.0))
    busy = sched(SEND.format(compute="if rank == 1:\n    compute C 20ms on a"))
    assert spans(simulate(busy, slow, network=network))["x"][1] == pytest.approx(16000, rel=1e-12)
    other = machine("compute_comm_slowdown: 2.0\n" + BY_SEND.format(kind="all_reduce", cc=1.0, cm=4.0))
    assert spans(simulate(busy, other, network=network))["x"][1] == pytest.approx(8000, rel=1e-12)


@pytest.mark.parametrize("network", NETWORKS)
def test_a_posted_recv_slows_compute_only_while_its_bytes_move(network):
    """On a CPU host a comm op is a thread: a recv posted at 0 whose send starts at 4000 us
    waits blocked until then, costing the cores nothing. Rank 1's 10 ms of compute runs
    at full speed to 4000 us, at 1/3 (the recv's factor) while the 4000 us transfer moves,
    then at full speed: it ends at 8000 + (10000 - 4000 - 4000/3) us."""
    m = machine(BY_SEND.format(kind="recv", cc=3.0, cm=1.0))
    body = "if rank == 0:\n    compute W 4ms on a\n    send x 400MB to 1 on a\nif rank == 1:\n    recv x 400MB from 0 on b\n    compute C 10ms on a"
    r = simulate(sched(body), m, network=network)
    assert spans(r)["x"] == pytest.approx((0, 8000), rel=1e-12)  # the recv's: posted at 0, its bytes from 4000 us
    assert spans(r)["C"][1] == pytest.approx(8000 + 10000 - 4000 - 4000 / 3, rel=1e-12)


@pytest.mark.parametrize("network", NETWORKS)
def test_compute_slows_by_the_factor_of_the_op_running_beside_it(network):
    """While the 4000 us send runs, compute on the sender goes at 1/3 (the send's own
    comm_compute_slowdown; the machine-wide 1.5 is for other ops): 10 ms of compute does
    4000/3 us of work by then and ends at 4000 + 10000 - 4000/3 us."""
    m = machine("comm_compute_slowdown: 1.5\n" + BY_SEND.format(kind="send", cc=3.0, cm=1.0))
    r = simulate(sched(SEND.format(compute="if rank == 0:\n    compute C 10ms on a")), m, network=network)
    assert spans(r)["x"][1] == pytest.approx(4000, rel=1e-12)
    assert spans(r)["C"][1] == pytest.approx(4000 + 10000 - 4000 / 3, rel=1e-12)
    # The machine-wide factor for an op not listed.
    m2 = machine("comm_compute_slowdown: 1.5\n" + BY_SEND.format(kind="broadcast", cc=3.0, cm=1.0))
    r2 = simulate(sched(SEND.format(compute="if rank == 0:\n    compute C 10ms on a")), m2, network=network)
    assert spans(r2)["C"][1] == pytest.approx(4000 + 10000 - 4000 / 1.5, rel=1e-12)
    # The summary says that some ops have their own factor.
    assert summarize(r).per_op_interference and not summarize(simulate(sched(SEND.format(compute="")), machine(), network=network)).per_op_interference
