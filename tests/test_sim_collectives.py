"""Every collective's simulated time equals its algorithm's formula (nccl-tests busbw)."""

from __future__ import annotations

import math

import pytest

from commdsl.dsl import load_schedule_text
from commdsl.errors import ScheduleError
from commdsl.ir import OpKind
from commdsl.machine import load_machine_text
from commdsl.sim import simulate
from commdsl.sim.collectives import bus_factor

LATENCY_US = 7.0
BW_GB_PER_S = 100.0  # 1e5 bytes per microsecond
CHUNK = 1024 * 1024


def machine(latency_us: float = LATENCY_US):
    return load_machine_text(
        f"""
name: net
devices: 64
device: {{name: test, peak_tflops: {{fp32: 1.0}}, memory_bandwidth_gb_per_s: 1000, sm_count: 1}}
kernel_launch_us: 0
comm_launch_us: 0
host_link: {{latency_us: 0, bandwidth_gb_per_s: 10}}
transports:
  nccl: {{latency_us: {latency_us}, bandwidth_gb_per_s: {BW_GB_PER_S}}}
chunk_bytes: {CHUNK}
""",
        "net.yaml",
    )


def one_op(n: int, statement: str, size: str):
    statement = "\n  ".join(statement.splitlines())
    text = f"""
name: one
params: {{n: {n}, size: {size}}}
world: n
streams: [s]
program: |
  {statement}
"""
    return load_schedule_text(text, "one.yaml")


def op_time(program, latency_us: float = LATENCY_US) -> float:
    result = simulate(program, machine(latency_us))
    assert all(result.raw.start[g] == 0.0 for g in range(len(result.raw.ops)))
    ends = set(result.raw.end)
    assert len(ends) == 1, "every member finishes the collective together"
    return ends.pop()


def beta(size_bytes: float) -> float:
    return size_bytes / (BW_GB_PER_S * 1e3)


SIZE = 48 * 1024 * 1024  # divisible by 2, 3, 4, 6, 8
GROUP_SIZES = (2, 3, 4, 6, 8)

# kind -> (statement, latency steps, serial bytes)
FORMULAS = {
    OpKind.ALL_REDUCE: ("all_reduce x size", lambda n: 2 * (n - 1), lambda n, s: 2 * (n - 1) * s / n),
    OpKind.ALL_GATHER: ("all_gather x size", lambda n: n - 1, lambda n, s: (n - 1) * s / n),
    OpKind.REDUCE_SCATTER: ("reduce_scatter x size", lambda n: n - 1, lambda n, s: (n - 1) * s / n),
    OpKind.ALL_TO_ALL: ("all_to_all x size", lambda n: 1, lambda n, s: (n - 1) * s / n),
    OpKind.GATHER: ("gather x size dst=0", lambda n: 1, lambda n, s: (n - 1) * s / n),
    OpKind.SCATTER: ("scatter x size src=0", lambda n: 1, lambda n, s: (n - 1) * s / n),
}


@pytest.mark.parametrize("n", GROUP_SIZES)
@pytest.mark.parametrize("kind", list(FORMULAS), ids=lambda k: k.value)
def test_collective_time_is_its_formula(kind, n):
    statement, steps, serial = FORMULAS[kind]
    t = op_time(one_op(n, statement, f"{SIZE}B"))
    assert t == pytest.approx(steps(n) * LATENCY_US + beta(serial(n, SIZE)), rel=1e-12)


@pytest.mark.parametrize("n", GROUP_SIZES)
@pytest.mark.parametrize("kind", list(FORMULAS), ids=lambda k: k.value)
def test_bus_bandwidth_equals_link_bandwidth_without_latency(kind, n):
    """nccl-tests: busbw = algbw * factor; a bandwidth-bound ring/direct algorithm
    reaches exactly the link bandwidth."""
    t_us = op_time(one_op(n, FORMULAS[kind][0], f"{SIZE}B"), latency_us=0.0)
    algbw_gb_per_s = SIZE / (t_us * 1e3)
    assert algbw_gb_per_s * bus_factor(kind, n) == pytest.approx(BW_GB_PER_S, rel=1e-12)


@pytest.mark.parametrize("n", GROUP_SIZES)
@pytest.mark.parametrize("statement", ["broadcast x size src=0", "reduce x size dst=0"])
def test_broadcast_and_reduce_are_a_pipelined_chain(statement, n):
    for size in (SIZE, CHUNK // 2, 5 * CHUNK + 4):
        k = max(1, math.ceil(size / CHUNK))
        t = op_time(one_op(n, statement, f"{size}B"))
        assert t == pytest.approx((n - 2 + k) * (LATENCY_US + beta(size / k)), rel=1e-12)


def test_chain_bus_bandwidth_approaches_link_bandwidth_as_chunks_grow():
    n, size = 8, 1024 * CHUNK
    t_us = op_time(one_op(n, "broadcast x size src=0", f"{size}B"), latency_us=0.0)
    busbw = size / (t_us * 1e3) * bus_factor(OpKind.BROADCAST, n)
    k = size // CHUNK
    assert busbw == pytest.approx(BW_GB_PER_S * k / (n - 2 + k), rel=1e-12)
    assert busbw > 0.99 * BW_GB_PER_S


@pytest.mark.parametrize("n", (2, 3, 4, 8, 16))
def test_tree_all_reduce(n):
    t = op_time(one_op(n, "all_reduce x size algo=tree", f"{SIZE}B"))
    assert t == pytest.approx(2 * math.ceil(math.log2(n)) * LATENCY_US + beta(2 * SIZE), rel=1e-12)


@pytest.mark.parametrize("n", (2, 5))
def test_barrier_is_latency_only(n):
    assert op_time(one_op(n, "barrier", "0B")) == pytest.approx(2 * (n - 1) * LATENCY_US)


def test_send_recv_is_latency_plus_bytes_over_bandwidth():
    program = one_op(2, "if rank == 0:\n    send x size to 1\nelse:\n    recv x size from 0", f"{SIZE}B")
    assert op_time(program) == pytest.approx(LATENCY_US + beta(SIZE), rel=1e-12)


def test_single_rank_collective_is_free():
    assert op_time(one_op(1, "all_reduce x size", f"{SIZE}B")) == 0.0


def test_algorithm_without_a_model_is_an_error():
    with pytest.raises(ScheduleError, match="no tree algorithm for all_gather"):
        simulate(one_op(4, "all_gather x size algo=tree", f"{SIZE}B"), machine())
