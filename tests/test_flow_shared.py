"""A transport whose bandwidth the whole host shares (gloo over loopback TCP): an
exchange takes twice a one-way send, and a calibrated collective alone keeps its time."""

from __future__ import annotations

import pytest

from commdsl.dsl import load_schedule_text
from commdsl.errors import MachineError
from commdsl.machine import load_machine_text
from commdsl.sim import simulate

MACHINE = """
name: loopback
devices: 4
device: {{name: cpu, peak_tflops: {{fp32: 1}}, memory_bandwidth_gb_per_s: 100, sm_count: 1}}
kernel_launch_us: 0
comm_launch_us: 0
host_link: {{latency_us: 0, bandwidth_gb_per_s: 10}}
transports:
  nccl:
    latency_us: {latency}
    bandwidth_gb_per_s: 10
    {shared}
    collectives: {{all_reduce: {{latency_us: 0, bandwidth_gb_per_s: 4}}}}
{extra}
"""


def machine(shared: bool, latency_us: float = 0, extra: str = "", shared_gb_per_s: float = 10):
    shared_line = f"shared_bandwidth_gb_per_s: {shared_gb_per_s}" if shared else ""
    return load_machine_text(MACHINE.format(shared=shared_line, latency=latency_us, extra=extra), "m.yaml")


def makespan_ms(body: str, shared: bool, world: int = 2) -> float:
    program = "\n".join("  " + line for line in body.strip("\n").splitlines())
    prog = load_schedule_text(f"name: t\nworld: {world}\nprogram: |\n{program}\n", "t.yaml")
    return simulate(prog, machine(shared), "flow").timeline.makespan_us / 1e3


ONE_WAY = """
if rank == 0:
    send x 100MB to 1
if rank == 1:
    recv x 100MB from 0
"""
EXCHANGE = """
batch:
    isend x 100MB to 1 - rank
    irecv y 100MB from 1 - rank
"""
TWO_PAIRS = """
if rank % 2 == 0:
    send x 100MB to rank + 1
else:
    recv x 100MB from rank - 1
"""


@pytest.mark.parametrize("shared", [False, True])
def test_one_way_send_gets_the_full_bandwidth(shared: bool) -> None:
    assert makespan_ms(ONE_WAY, shared) == pytest.approx(10.0, rel=1e-3)  # 1e8 B at 10 GB/s


def test_an_exchange_shares_the_host_bandwidth() -> None:
    assert makespan_ms(EXCHANGE, shared=False) == pytest.approx(10.0, rel=1e-3)  # full duplex links
    assert makespan_ms(EXCHANGE, shared=True) == pytest.approx(20.0, rel=1e-3)  # both directions share 10 GB/s


def test_disjoint_pairs_share_the_host_too() -> None:
    assert makespan_ms(TWO_PAIRS, shared=False, world=4) == pytest.approx(10.0, rel=1e-3)
    assert makespan_ms(TWO_PAIRS, shared=True, world=4) == pytest.approx(20.0, rel=1e-3)


def test_a_calibrated_collective_alone_keeps_its_measured_time() -> None:
    # all_reduce override: 4 GB/s effective; ring on 2 ranks moves 2(n-1)/n * S = S bytes serially.
    body = "all_reduce g 100MB"
    assert makespan_ms(body, shared=True) == pytest.approx(25.0, rel=1e-3)
    assert makespan_ms(body, shared=False) == pytest.approx(25.0, rel=1e-3)


def test_a_collective_and_a_send_contend_on_the_shared_channel() -> None:
    body = """
if rank < 2:
    all_reduce g 100MB group=pair
else:
    if rank == 2:
        send x 100MB to 3 group=other
    else:
        recv x 100MB from 2 group=other
"""
    program = "\n".join("  " + line for line in body.strip("\n").splitlines())
    text = f"name: t\nworld: 4\ngroups: {{pair: [0, 1], other: [2, 3]}}\nprogram: |\n{program}\n"
    alone = 25.0
    with_send = simulate(load_schedule_text(text, "t.yaml"), machine(True), "flow").timeline.makespan_us / 1e3
    assert with_send > alone * 1.2  # the send takes part of the host's 10 GB/s


def test_bad_shared_bandwidth_is_a_machine_error() -> None:
    with pytest.raises(MachineError, match="shared_bandwidth_gb_per_s"):
        machine(True, shared_gb_per_s=-3)


PROFILED = """
name: profiled
devices: 2
device: {name: cpu, peak_tflops: {fp32: 1}, memory_bandwidth_gb_per_s: 100, sm_count: 1}
kernel_launch_us: 0
comm_launch_us: 0
host_link: {latency_us: 0, bandwidth_gb_per_s: 10}
transports:
  nccl:
    latency_us: 0
    bandwidth_gb_per_s: 10
    collectives:
      all_reduce:
        latency_us: 10
        bandwidth_gb_per_s: 4
        measured_ranks: 2
        measured_us: [[1000000, 500], [4000000, 1000], [16000000, 8000]]
"""


@pytest.mark.parametrize("network", ["flow", "analytic"])
@pytest.mark.parametrize("size, expected_us", [
    (1_000_000, 500.0),                     # a measured point
    (2_000_000, 500.0 * 2 ** 0.5),          # log-log halfway between 1 MB (500) and 4 MB (1000)
    (8_000_000, 1000.0 * 8 ** 0.5),         # halfway between 4 MB (1000) and 16 MB (8000)
    (32_000_000, 16000.0),                  # beyond the largest: bandwidth-bound, 2x the 16 MB time
    (500_000, 500.0),                       # below the smallest: latency-bound
])  # fmt: skip
def test_a_measured_profile_sets_the_collective_time(network: str, size: int, expected_us: float) -> None:
    prog = load_schedule_text(f"name: t\nworld: 2\nprogram: |\n  all_reduce g {size}B\n", "t.yaml")
    machine = load_machine_text(PROFILED, "m.yaml")
    assert simulate(prog, machine, network).timeline.makespan_us == pytest.approx(expected_us, rel=1e-6)


def test_a_profile_applies_only_to_groups_of_its_size() -> None:
    # On 4 ranks the fitted line holds: ring 2(n-1) = 6 steps x 10 us + 1.5 x 4 MB at 4 GB/s.
    prog = load_schedule_text("name: t\nworld: 4\nprogram: |\n  all_reduce g 4000000B\n", "t.yaml")
    machine = load_machine_text(PROFILED.replace("devices: 2", "devices: 4"), "m.yaml")
    assert simulate(prog, machine, "analytic").timeline.makespan_us == pytest.approx(60 + 1.5 * 4e6 / 4e3)  # not the profile's 1000


def test_bad_profiles_are_machine_errors() -> None:
    for bad, message in (("[[1000, 5]]", "at least two"), ("[[1000, 5], [500, 9]]", "sizes must increase"),
                         ("[[1000, 5], [2000]]", "pair"), ("[[1000, -5], [2000, 9]]", "time")):  # fmt: skip
        text = PROFILED.replace("[[1000000, 500], [4000000, 1000], [16000000, 8000]]", bad)
        with pytest.raises(MachineError, match=message):
            load_machine_text(text, "m.yaml")
    without_ranks = PROFILED.replace("        measured_ranks: 2\n", "")
    with pytest.raises(MachineError, match="go together"):
        load_machine_text(without_ranks, "m.yaml")


def test_a_dtype_uses_its_own_table_else_the_fp32_one() -> None:
    text = PROFILED.replace(
        "        measured_us: [[1000000, 500], [4000000, 1000], [16000000, 8000]]\n",
        "        measured_us: [[1000000, 500], [4000000, 1000], [16000000, 8000]]\n"
        "        measured_us_by_dtype: {bf16: [[1000000, 4000], [4000000, 8000]]}\n",
    )
    machine = load_machine_text(text, "m.yaml")

    def time_us(line: str) -> float:
        prog = load_schedule_text(f"name: t\nworld: 2\nprogram: |\n  {line}\n", "t.yaml")
        return simulate(prog, machine, "flow").timeline.makespan_us

    assert time_us("all_reduce g 1000000B dtype=bf16") == pytest.approx(4000.0)  # the bf16 table
    assert time_us("all_reduce g 1000000B") == pytest.approx(500.0)  # fp32
    assert time_us("all_reduce g 1000000B dtype=fp16") == pytest.approx(500.0)  # no fp16 table: the fp32 one
    with pytest.raises(MachineError, match="unknown dtype 'bf17'"):
        load_machine_text(text.replace("{bf16:", "{bf17:"), "m.yaml")


@pytest.mark.parametrize("network", ["flow", "flow-steps", "analytic"])
def test_a_reduce_op_uses_its_own_table_in_its_dtype_first(network: str) -> None:
    """gloo's avg costs more than its sum: a reduction with an op of its own
    (`measured_us_by_op`) takes that op's table; the dtype comes first (`profile_for`)."""
    text = PROFILED.replace(
        "        measured_us: [[1000000, 500], [4000000, 1000], [16000000, 8000]]\n",
        "        measured_us: [[1000000, 500], [4000000, 1000], [16000000, 8000]]\n"
        "        measured_us_by_dtype: {bf16: [[1000000, 4000], [4000000, 8000]]}\n"
        "        measured_us_by_op: {avg: {fp32: [[1000000, 600], [4000000, 1200]]}, max: {bf16: [[1000000, 4400], [4000000, 8800]]}}\n",
    )
    machine = load_machine_text(text, "m.yaml")

    def time_us(line: str) -> float:
        prog = load_schedule_text(f"name: t\nworld: 2\nprogram: |\n  {line}\n", "t.yaml")
        return simulate(prog, machine, network).timeline.makespan_us

    assert time_us("all_reduce g 1000000B op=avg") == pytest.approx(600.0)  # the fp32 avg table
    assert time_us("all_reduce g 1000000B op=sum") == pytest.approx(500.0)  # sum: the plain table
    assert time_us("all_reduce g 1000000B op=min") == pytest.approx(500.0)  # no min table: the plain one
    assert time_us("all_reduce g 1000000B op=max dtype=bf16") == pytest.approx(4400.0)  # max in bf16
    assert time_us("all_reduce g 1000000B op=avg dtype=bf16") == pytest.approx(4000.0)  # bf16 (sum) before fp32 avg
    assert time_us("all_reduce g 1000000B op=avg dtype=fp16") == pytest.approx(600.0)  # no fp16 table: fp32 avg
    # In one schedule too: a sum and an avg of the same size and dtype are timed apart.
    assert time_us("all_reduce g 1000000B op=sum\n  all_reduce h 1000000B op=avg") == pytest.approx(500.0 + 600.0)


def test_compute_slows_transfers_on_the_host_cpus_by_their_cost_not_only_their_cap() -> None:
    """The shared channel is the host's CPUs copying bytes: while compute holds them,
    each byte costs F times as much, so an exchange under compute takes F times its
    uncontended time (100 MB each way at 10 GB/s shared: 20 ms, then 40 ms with F = 2),
    where capping each flow at solo / F alone would leave it at 20 ms (each flow's share,
    5 GB/s, is already below 10 / 2)."""
    slowed = machine(True, extra="compute_comm_slowdown: 2.0")
    body = EXCHANGE + "compute C 1s on b\n"
    program = "\n".join("  " + line for line in body.strip("\n").splitlines())
    prog = load_schedule_text(f"name: t\nworld: 2\nstreams: [a, b]\nprogram: |\n{program}\n", "t.yaml")
    ends = {}
    for network in ("flow", "flow-steps"):
        r = simulate(prog, slowed, network)
        ends[network] = max(r.raw.end[g] for g, op in enumerate(r.raw.ops) if op.kind.is_comm)
    assert ends["flow"] == pytest.approx(40_000, rel=1e-9) and ends["flow-steps"] == pytest.approx(40_000, rel=1e-9)
    assert makespan_ms(EXCHANGE, True) == pytest.approx(20.0, rel=1e-3)  # without compute


def send_span(body: str, shared: bool, network: str) -> tuple[float, float]:
    """(start, end) of rank 0's send `x` in `body` (streams a, b) on a machine with 1 ms
    of latency and compute slowing comm 2x."""
    m = machine(shared, latency_us=1000, extra="compute_comm_slowdown: 2.0", shared_gb_per_s=20)
    program = "\n".join("  " + line for line in body.strip("\n").splitlines())
    r = simulate(load_schedule_text(f"name: t\nworld: 2\nstreams: [a, b]\nprogram: |\n{program}\n", "t.yaml"), m, network)
    x = next(g for g, op in enumerate(r.raw.ops) if op.name == "x" and op.rank == 0)
    return r.raw.start[x], r.raw.end[x]


SEND_BESIDE_COMPUTE = """
if rank == 0:
    compute C 50ms on a
    send x 10MB to 1 on b
if rank == 1:
    recv x 10MB from 0 on b
"""


@pytest.mark.parametrize("network", ["flow", "analytic"])
@pytest.mark.parametrize("shared", [False, True])
def test_on_the_host_cpus_compute_slows_a_transfers_latency_too(network: str, shared: bool) -> None:
    """1 ms latency + 1e7 B at 10 GB/s (1 ms), beside compute at factor 2: the bytes take
    2 ms; the latency 2 ms where the host's CPUs run it (a shared bandwidth), else 1 ms."""
    start, end = send_span(SEND_BESIDE_COMPUTE, shared, network)
    assert end - start == pytest.approx(4000.0 if shared else 3000.0, rel=1e-9)


@pytest.mark.parametrize("network", ["flow", "analytic"])
@pytest.mark.parametrize("shared", [False, True])
def test_compute_starting_during_the_latency_slows_the_rest_of_it(network: str, shared: bool) -> None:
    """The send starts at 0; compute starts at 500 us, halfway through its 1 ms latency.
    On the host's CPUs the other 500 us of latency take 1000 us, then the 1 ms of bytes
    2 ms: 3500 us; elsewhere the latency is not slowed: 1000 + 2000 us."""
    body = """
if rank == 0:
    send x 10MB to 1 on b
    host H 500us
    compute C 50ms on a
if rank == 1:
    recv x 10MB from 0 on b
"""
    assert send_span(body, shared, network) == pytest.approx((0.0, 3500.0 if shared else 3000.0), rel=1e-9)
