"""Summary definitions (compute, comm, exposed comm, idle, bubble) and the Gantt chart."""

from __future__ import annotations

import pytest

from commdsl.dsl import load_schedule_text
from commdsl.machine import load_machine_text
from commdsl.sim import simulate
from commdsl.sim.gantt import gantt_lines
from commdsl.sim.summary import summarize

MACHINE = """
name: m
devices: 2
device: {name: t, peak_tflops: {fp32: 1}, memory_bandwidth_gb_per_s: 1, sm_count: 1}
kernel_launch_us: 0
comm_launch_us: 0
host_link: {latency_us: 0, bandwidth_gb_per_s: 1}
transports:
  nccl: {latency_us: 0, bandwidth_gb_per_s: 100}
"""

PROGRAM = """
name: overlap
world: 2
streams: [a, b]
program: |
  h = all_reduce x 200MB on b
  compute A 1ms on a
  wait h on a
  compute C 1ms on a
"""


def test_exposed_comm_idle_and_bubble_follow_their_definitions():
    # x: [0, 2 ms] (200 MB all_reduce on 2 ranks at 100 GB/s), A: [0, 1 ms], C: [2, 3 ms].
    result = simulate(load_schedule_text(PROGRAM, "o.yaml"), load_machine_text(MACHINE, "m.yaml"))
    s = summarize(result)
    assert s.makespan_us == 3000
    for r in s.ranks:
        assert (r.compute_us, r.comm_us, r.exposed_comm_us, r.idle_us) == (2000, 2000, 1000, 0)
        assert r.bubble_fraction == pytest.approx(1 / 3)
    assert [(p.kind, p.name) for p in s.critical_path][-3:] == [("all_reduce", "x"), ("wait", "h"), ("compute", "C")]
    data = s.to_json()
    assert data["makespan_us"] == 3000.0 and data["bubble_fraction"] == pytest.approx(1 / 3, abs=1e-9)


def test_gantt_has_a_row_per_rank_and_stream_plus_comm():
    result = simulate(load_schedule_text(PROGRAM, "o.yaml"), load_machine_text(MACHINE, "m.yaml"))
    lines = gantt_lines(result, width=30)
    rows = [line for line in lines if "|" in line]
    assert [row.split("|")[0].split() for row in rows] == [["0", "a"], ["0", "comm"], ["1", "a"], ["1", "comm"]]
    a_row = rows[0].split("|")[1]
    assert a_row.count("[green]A[/]") == 10 and a_row.count("[green]C[/]") == 10 and a_row.count("[dim].[/]") == 10
    assert rows[1].split("|")[1].count("[magenta]=[/]") == 20


@pytest.mark.parametrize("name", ["1f1b", "ddp_overlap", "memcpy_vs_nccl", "zbv", "tp_mlp"])
def test_the_one_pass_summary_is_each_ranks_breakdown(name):
    # summarize() reads the flat arrays; commdsl.breakdown.breakdown_of is the definition.
    from commdsl.api import load
    from commdsl.breakdown import breakdown_of
    from commdsl.machine import resolve_machine

    result = simulate(load(name), resolve_machine("pcie-nvlink-pairs" if name == "memcpy_vs_nccl" else "dgx-h100"))
    raw, s = result.raw, summarize(result)
    for rank, r in enumerate(s.ranks):
        b = raw.base[rank]
        ops = result.program.ops[rank]
        split = breakdown_of(((op.kind, raw.start[b + i], raw.end[b + i]) for i, op in enumerate(ops)), result.makespan_us)
        assert (r.compute_us, r.comm_us, r.exposed_comm_us, r.idle_us) == (split.compute_us, split.comm_us, split.exposed_comm_us, split.idle_us)
