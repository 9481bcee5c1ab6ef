"""Sizes within the documented limits (docs/limits.md): the mechanisms that keep them
linear, checked for giving the same answers as the direct computation they replace.
(How long the sizes take is measured by `bench/scale_limits.py`, not here.)"""

from __future__ import annotations

import pytest

from commdsl.dsl import load_schedule_text
from commdsl.ir import Algo, OpKind, Transport
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.sim import simulate
from commdsl.sim.collectives import plan
from commdsl.sim.fabric import Fabric

SHARED_GLOO = """
name: shared-gloo
devices: 8
device: {name: t, peak_tflops: {fp32: 1}, memory_bandwidth_gb_per_s: 100, sm_count: 1}
kernel_launch_us: 1
comm_launch_us: 2
host_link: {latency_us: 1, bandwidth_gb_per_s: 10}
transports:
  gloo: {latency_us: 30, bandwidth_gb_per_s: 3, shared_bandwidth_gb_per_s: 5}
"""


def _machines():
    return [("h100-nvlink", resolve_machine("h100-nvlink"), Transport.NCCL),
            ("cpu-loopback", resolve_machine("cpu-loopback"), Transport.GLOO),
            ("shared-gloo", load_machine_text(SHARED_GLOO, "shared-gloo.yaml"), Transport.GLOO)]  # fmt: skip


@pytest.mark.parametrize("name,machine,transport", _machines(), ids=[m[0] for m in _machines()])
@pytest.mark.parametrize("ranks", [(0, 1), (0, 2, 5), tuple(range(8))])
def test_star_all_to_all_loads_are_the_per_pair_loads(name, machine, transport, ranks):
    """On the implied star the all_to_all summed per channel charges each channel what
    routing its n(n-1) pairs one by one charges, with the same cap and step latency."""
    fabric = Fabric(machine, 8)
    size = 3 * 2**20
    p = plan(OpKind.ALL_TO_ALL, Algo.DIRECT, len(ranks), size, machine.chunk_bytes)
    loads, cap, latency = fabric.collective_load(OpKind.ALL_TO_ALL, Algo.DIRECT, ranks, size, transport, None, p)
    want, want_cap, want_latency = fabric._pairwise_load(OpKind.ALL_TO_ALL, Algo.DIRECT, ranks, size, transport, None, p)
    assert list(loads) == list(want)  # in the same order: traces list link counters by it
    assert all(loads[c] == pytest.approx(want[c], rel=1e-12) for c in want)
    assert (cap, latency) == (want_cap, want_latency)


CONTENDED = """
name: contended
world: 6
program: |
  all_to_all tokens 24MiB group=evens
  if rank == 1:
      send x 64MiB to 0
  if rank == 0:
      recv x 64MiB from 1
  all_to_all moe 12MiB
groups:
  evens: [[0, 2, 4], [1, 3, 5]]
"""


@pytest.mark.parametrize("network", ["flow", "analytic"])
@pytest.mark.parametrize("machine_name", ["h100-nvlink", "cpu-loopback"])
def test_aggregated_all_to_all_simulates_like_the_per_pair_model(monkeypatch, network, machine_name):
    """A schedule whose all_to_alls contend with each other and with a send gives the
    same timeline, op by op, with the aggregated loads and with every pair routed."""
    program = load_schedule_text(CONTENDED, "contended.yaml")
    machine = resolve_machine(machine_name)
    aggregated = simulate(program, machine, network)
    monkeypatch.setattr(Fabric, "_star_all_to_all_load", lambda self, ranks, size, transport: self._pairwise_load(
        OpKind.ALL_TO_ALL, Algo.DIRECT, ranks, size, transport, None,
        plan(OpKind.ALL_TO_ALL, Algo.DIRECT, len(ranks), size, machine.chunk_bytes)))  # fmt: skip
    per_pair = simulate(program, machine, network)
    assert aggregated.makespan_us == pytest.approx(per_pair.makespan_us, rel=1e-9)
    assert len(aggregated.timeline.spans) == len(per_pair.timeline.spans) > 0
    for a, b in zip(aggregated.timeline.spans, per_pair.timeline.spans):
        assert (a.start_us, a.end_us) == pytest.approx((b.start_us, b.end_us), rel=1e-9)


def test_all_to_all_over_4096_ranks_on_one_nvlink_node():
    """One all_to_all over 4,096 ranks of the h100-nvlink star (16.8 M pairs) simulates,
    and alone on the fabric the flow network agrees with the contention-free model."""
    program = load_schedule_text("name: a2a\nworld: 4096\nprogram: |\n  all_to_all tokens 4096MiB\n", "a2a.yaml")
    machine = resolve_machine("h100-nvlink")
    flow = simulate(program, machine, "flow")
    analytic = simulate(program, machine, "analytic")
    assert flow.makespan_us == pytest.approx(analytic.makespan_us, rel=1e-9)
    assert flow.makespan_us > 4096 * 2**20 * 4095 / 4096 / 370e3  # at least the bytes at the nccl rate
