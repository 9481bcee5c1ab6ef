"""NCCL's ring broadcast / reduce as chains whose members go one after another
(`commdsl.sim.chains`, `commdsl.sim.nccl.chain`): one op alone ends at the latency plus
the pipelined chain, ops back to back pipeline along the chain, and a member that never
comes is still reported as a deadlock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from commdsl.calibrate.nccl_tests import TIMED_ITERS, Run, simulate_run
from commdsl.dsl import load_schedule_text
from commdsl.errors import DeadlockError
from commdsl.ir import Algo, OpKind
from commdsl.machine import resolve_machine
from commdsl.machine.nccl import HopKind
from commdsl.sim import nccl, simulate
from commdsl.sim.nccl_flows import machine_links

RANKS = 16  # two DGX H100 nodes


@pytest.fixture(scope="module")
def machine():
    return resolve_machine("dgx-h100").with_nodes(2)


def program(body: str, world: int = RANKS):
    text = "\n".join("  " + line for line in body.strip("\n").splitlines())
    return load_schedule_text(f"name: t\nworld: {world}\nstreams: [s]\nprogram: |\n{text}\n", "t.yaml", validate=False)


def ends_by_rank(raw, kind: OpKind) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for g, op in enumerate(raw.ops):
        if op.kind is kind:
            out.setdefault(op.rank, []).append(raw.end[g])
    return {r: sorted(v) for r, v in out.items()}


def the_chain(machine, kind: OpKind, size: int, root: int = 0) -> tuple[nccl.Chain, nccl.Choice, nccl.Layout]:
    _, flows = machine_links(machine, RANKS)
    ranks = tuple(range(RANKS))
    op = program(f"{kind.value} x {size}B {'src' if kind is OpKind.BROADCAST else 'dst'}={root}").ops[0][0]
    c = flows.choose(op, ranks)
    return flows.chain(kind, ranks, size, root, c.algo, c.proto), c, flows.layout(ranks)


@pytest.mark.parametrize("network", ["flow", "analytic"])
@pytest.mark.parametrize("size", [8, 4 << 20])
def test_one_broadcast_alone_ends_at_the_hops_plus_the_pipelined_chain(machine, network, size):
    raw = simulate(program(f"broadcast x {size}B src=0"), machine, network).raw
    ends = {r: e[0] for r, e in ends_by_rank(raw, OpKind.BROADCAST).items()}
    start = min(raw.start[g] for g, op in enumerate(raw.ops) if op.kind is OpKind.BROADCAST)
    chain, c, lay = the_chain(machine, OpKind.BROADCAST, size)
    # worked out here from the parts the model is made of: per channel ring from the root,
    # NCCL's base latency, every hop of the ring, one more step inside the last node, and
    # the pipelined bytes at the op's rate (the first chunk, what a member must hold before
    # it forwards, crosses every hop but the last before the last member takes in the whole
    # op: a line's worth to a GPU of its node, a whole step across the network), and NCCL's
    # net overhead for every message a channel sends across the network
    cfg = machine.nccl
    spec = cfg.protocol(c.proto)
    _, flows = machine_links(machine, RANKS)
    rate = flows.coflow(OpKind.BROADCAST, lay.ranks, size, 0, c.algo, c.proto).solo_rate(flows.fabric.capacity)
    intra_chunk = min(size, nccl.CHAIN_CHUNK_BYTES[c.proto] * c.channels)
    net_chunk = min(size, nccl.CHAIN_NET_STEP_BYTES[c.proto] * c.channels)
    message = cfg.net_overhead_us * (3 if c.proto.value == "simple" else 1)
    messages = -(-size // (c.channels * nccl.CHAIN_NET_STEP_BYTES[c.proto]))  # a step a message, per channel
    net = spec.hop_us(HopKind.NETWORK) + cfg.net_message_us(c.proto)
    intra = spec.hop_us(lay.intra_hop)
    expected = 0.0
    for ring in nccl.ring_orders(lay, min(c.channels, lay.ppn)):
        order = ring[ring.index(0):] + ring[:ring.index(0)]
        same = [a // 8 == b // 8 for a, b in zip(order, order[1:])]
        hops = sum(intra if s else net + message for s in same)
        held = sum(intra_chunk if s else net_chunk for s in same[:-1])
        expected = max(expected, spec.base_latency_us + hops + intra + (held + size) / rate + messages * message)
    assert max(ends.values()) - start == pytest.approx(expected, rel=1e-9)
    assert chain.alone_us == pytest.approx(expected, rel=1e-9)
    # the root ends first, after its own part; nobody else waits for the whole chain
    assert min(ends, key=ends.get) == 0
    assert ends[0] - start == pytest.approx(max(part[0] for part in chain.part_us), rel=1e-9)
    assert len({round(e, 6) for e in ends.values()}) > 2


def test_channels_whose_rings_differ_across_nodes_hold_a_member_to_its_latest_ring(machine):
    # Across nodes channel c's ring enters each node at GPU c (its NIC's): from root 0, rank 1
    # is the last of node 0 on channel 0's ring and the last of all on channel 1's, which
    # comes back to node 0 after node 1. One channel (8 B): rank 1 ends before node 1 does;
    # several: after every rank of node 1.
    for size, later in ((8, False), (4 << 20, True)):
        _, c, _ = the_chain(machine, OpKind.BROADCAST, size)
        assert (c.channels >= 2) == later
        raw = simulate(program(f"broadcast x {size}B src=0"), machine).raw
        ends = {r: e[0] for r, e in ends_by_rank(raw, OpKind.BROADCAST).items()}
        assert (ends[1] > max(ends[r] for r in range(8, 16))) == later
        assert (ends[1] < min(ends[r] for r in range(8, 16))) == (not later)
    # on one node every channel runs the same ring (NCCL's sameChannels): one chain
    one = resolve_machine("dgx-h100")
    flows = machine_links(one, 8)[1]
    op = program("broadcast x 4MiB src=0", world=8).ops[0][0]
    c = flows.choose(op, tuple(range(8)))
    assert c.channels >= 2 and len(flows.chain(OpKind.BROADCAST, tuple(range(8)), 4 << 20, 0, c.algo, c.proto).orders) == 1


@pytest.mark.parametrize("network", ["flow", "analytic"])
def test_a_member_at_a_nodes_exit_holds_a_whole_step_before_it_crosses_the_network(machine, network):
    # 4 MiB over 2 nodes runs LL128 on several channels: to a GPU of its node a member
    # forwards a warp's round of lines (38,400 B a channel), across the network a whole
    # step (576,000 B a channel: NCCL's proxy sends a step as one message)
    size = 4 << 20
    chain, c, lay = the_chain(machine, OpKind.BROADCAST, size)
    assert c.proto.value == "ll128" and c.channels >= 2
    _, flows = machine_links(machine, RANKS)
    rate = flows.coflow(OpKind.BROADCAST, lay.ranks, size, 0, c.algo, c.proto).solo_rate(flows.fabric.capacity)
    spec = machine.nccl.protocol(c.proto)
    line_us = 38400 * c.channels / rate
    step_us = min(size, 576000 * c.channels) / rate  # (or the op, if less: here 4 MiB on 16 channels)
    order, lead = chain.orders[0], chain.lead_us[0]
    exit_k = next(k for k in range(1, len(order)) if order[k - 1] // 8 != order[k] // 8)
    message = nccl.chain_message_us(machine.nccl, c.proto)
    assert message == machine.nccl.net_overhead_us == 1.0  # NCCL's net overhead on Intel hosts, once for LL128
    assert lead[exit_k] == pytest.approx(spec.hop_us(HopKind.NETWORK) + machine.nccl.net_message_us(c.proto) + step_us + message, rel=1e-9)
    assert lead[1] == pytest.approx(spec.hop_us(lay.intra_hop) + line_us, rel=1e-9)
    # and the simulator ends the op there: the longest ring's hops, each with its fill
    raw = simulate(program(f"broadcast x {size}B src=0"), machine, network).raw
    last = max(e[0] for e in ends_by_rank(raw, OpKind.BROADCAST).values())
    start = min(raw.start[g] for g, op in enumerate(raw.ops) if op.kind is OpKind.BROADCAST)
    assert last - start == pytest.approx(chain.alone_us, rel=1e-9)
    crossings = max(sum(a // 8 != b // 8 for a, b in zip(o, o[1:])) for o in chain.orders)
    assert chain.alone_us >= crossings * (step_us - line_us) + (len(order) - 1) * spec.hop_us(lay.intra_hop) + size / rate


@pytest.mark.parametrize("cpu", ["intel", "amd"])
def test_a_chain_across_nodes_pays_the_proxys_overhead_for_every_message(machine, cpu):
    # 1 GiB runs Simple: each channel sends its share across the network in 512 KiB steps,
    # each a message the proxy launches at NCCL's net overhead (1 us on Intel hosts, 2 on
    # AMD; x3 for Simple), in series with the transfer; on one node nothing crosses it
    from commdsl.machine.nccl import CpuVendor

    m = replace(machine, nccl=replace(machine.nccl, cpu=CpuVendor(cpu)))
    size = 1 << 30
    chain, c, lay = the_chain(m, OpKind.BROADCAST, size)
    assert c.proto.value == "simple"
    _, flows = machine_links(m, RANKS)
    rate = flows.coflow(OpKind.BROADCAST, lay.ranks, size, 0, c.algo, c.proto).solo_rate(flows.fabric.capacity)
    spec = m.nccl.protocol(c.proto)
    message = {"intel": 3.0, "amd": 6.0}[cpu]
    assert nccl.chain_message_us(m.nccl, c.proto) == message
    messages = size // c.channels // (512 << 10)
    root_part = spec.base_latency_us + spec.hop_us(lay.intra_hop) + size / rate + messages * message
    assert chain.part_us[0][0] == pytest.approx(root_part, rel=1e-9)
    one = resolve_machine("dgx-h100")
    _, flows1 = machine_links(one, 8)
    lay1 = flows1.layout(tuple(range(8)))
    c1 = nccl.Choice(c.algo, c.proto, 8)
    rate1 = 100e3
    alone = nccl.chain(one.nccl, OpKind.BROADCAST, lay1, c1, 0, float(size), rate1)
    assert alone.part_us[0][0] == pytest.approx(spec.base_latency_us + spec.hop_us(lay1.intra_hop) + size / rate1, rel=1e-9)


@pytest.mark.parametrize("kind", [OpKind.BROADCAST, OpKind.REDUCE])
@pytest.mark.parametrize("network", ["flow", "analytic"])
def test_back_to_back_chain_ops_pipeline_across_nodes(machine, kind, network):
    iters = 12
    root = "src=0" if kind is OpKind.BROADCAST else "dst=0"
    unlaunched = replace(machine, comm_launch_us=0.0, kernel_launch_us=0.0)  # the GPUs' side alone, as CUDA graphs run it
    raw = simulate(program(f"for i in range({iters}):\n    {kind.value} x[i] 8B {root}"), unlaunched, network).raw
    chain, c, lay = the_chain(machine, kind, 8)
    assert len(chain.orders) == 1  # one channel at 8 B: one ring
    last = ends_by_rank(raw, kind)[chain.orders[0][-1]]
    period = (last[-1] - last[iters // 2]) / (iters - 1 - iters // 2)
    cfg = machine.nccl
    spec = cfg.protocol(c.proto)
    one_hop_and_kernel = spec.base_latency_us + spec.hop_us(HopKind.NETWORK) + cfg.net_message_us(c.proto) + nccl.chain_message_us(cfg, c.proto)
    alone = nccl.latency_us(cfg, kind, lay, c.algo, c.proto)
    # the period of the chain: its slowest member's part, one network hop plus a kernel
    # (and the 8 bytes), under one op's end-to-end latency (every hop of the chain)
    assert period == pytest.approx(max(chain.part_us[0]), rel=1e-6)
    assert period == pytest.approx(one_hop_and_kernel, rel=0.05)
    assert period < alone - (RANKS - 3) * spec.hop_us(lay.intra_hop)
    # the data flows to the root for reduce: the root is the last member
    order = chain.orders[0]
    assert (order[0] == 0) == (kind is OpKind.BROADCAST) and (order[-1] == 0) == (kind is OpKind.REDUCE)


def test_flow_and_analytic_agree_on_a_chain_alone(machine):
    body = "for i in range(4):\n    broadcast x[i] 1MiB src=3\n    reduce y[i] 1MiB dst=5"
    a = simulate(program(body), machine, "flow").raw
    b = simulate(program(body), machine, "analytic").raw
    assert list(a.end) == pytest.approx(list(b.end), rel=1e-9)


def test_other_collectives_still_end_together(machine):
    raw = simulate(program("for i in range(3):\n    all_gather x[i] 1MiB"), machine).raw
    ends = ends_by_rank(raw, OpKind.ALL_GATHER)
    for i in range(3):
        assert len({round(e[i], 9) for e in ends.values()}) == 1


def test_a_member_that_never_comes_is_a_deadlock(machine):
    with pytest.raises(DeadlockError) as info:
        simulate(program("broadcast x 1MiB src=0\nif rank != 5:\n    broadcast y 1MiB src=0"), machine)
    text = info.value.format()
    assert "rank 5 never issues it" in text
    assert "broadcast y" in text


def test_a_member_that_arrives_late_holds_the_members_after_it_only(machine):
    # one channel at 8 B: its chain from root 0 is 0, 7, 6, ..., 1, then node 1
    chain, _, _ = the_chain(machine, OpKind.BROADCAST, 8)
    late = chain.orders[0][4]
    body = f"if rank == {late}:\n    compute F 1ms\nbroadcast x 8B src=0"
    raw = simulate(program(body), machine).raw
    ends = {r: e[0] for r, e in ends_by_rank(raw, OpKind.BROADCAST).items()}
    before, after = chain.orders[0][:4], chain.orders[0][4:]
    assert all(ends[r] < 100 for r in before)  # us: done long before the late member's 1 ms
    assert all(ends[r] > 1000 for r in after)


def test_nccl_tests_time_of_a_chain_is_averaged_over_ranks_as_nccl_tests_does():
    m = resolve_machine("dgx-h100")
    run = Run(OpKind.BROADCAST, 32, ranks_per_node=8)
    per_op = simulate_run(m, run, 8)
    flows = machine_links(m.with_nodes(4), 32)[1]
    ranks = tuple(range(32))
    op = program("broadcast x 8B src=0", world=32).ops[0][0]
    c = flows.choose(op, ranks)
    chain = flows.chain(OpKind.BROADCAST, ranks, 8, 0, Algo.RING, c.proto)
    # at least the slowest member's part per op, at most that plus the chain's fill spread over the ops
    slowest = max(max(part) for part in chain.part_us)
    assert slowest <= per_op <= slowest + chain.alone_us / TIMED_ITERS
    assert per_op < nccl.latency_us(m.nccl, OpKind.BROADCAST, flows.layout(ranks), c.algo, c.proto) / 2


@pytest.mark.parametrize("kind", [OpKind.BROADCAST, OpKind.REDUCE])
def test_the_calibration_closed_form_is_the_simulator_on_chain_points(kind):
    from commdsl.calibrate import nccl_tests as nt
    from commdsl.calibrate.nccl_logs import NcclTestsLog, Point
    from commdsl.ir import Dtype

    m = resolve_machine("dgx-h100")
    sizes = (8, 65536, 1 << 20, 64 << 20)
    log = NcclTestsLog("t.log", f"{kind.value}_perf", kind, 32, 1, 4, 8, False, Dtype.FP32, "NVIDIA H100 80GB HBM3",
                       tuple(Point(s, 1.0, None, 1) for s in sizes), None, None)  # fmt: skip
    run = nt.Run.of(log)
    points = nt._points(m, m, [log], [run])
    closed = nt._predict(points, nt._parameters(m))
    simulated = [simulate_run(m, run, s) for s in sizes]
    assert closed == pytest.approx(simulated, rel=1e-9)
    # and with the latencies moved (what a fit does), the closed form follows the simulator's model
    values = {**nt._parameters(m), "protocols.ll.base_latency_us": 3.0, "protocols.ll.hop.network": 6.0}
    cfg = replace(m.nccl, protocols=tuple((p, replace(sp, base_latency_us=3.0, hop_latency_us=tuple(
        (h, 6.0 if h is HopKind.NETWORK else us) for h, us in sp.hop_latency_us))) if p.value == "ll" else (p, sp)
        for p, sp in m.nccl.protocols))  # fmt: skip
    moved = replace(m, nccl=cfg)
    assert nt._predict(points[:2], values) == pytest.approx([simulate_run(moved, run, s) for s in sizes[:2]], rel=1e-9)


def test_a_program_with_chains_is_not_folded_and_one_without_still_is(machine):
    from commdsl.sim.engine import Engine
    from commdsl.sim.simulate import NETWORKS

    assert not Engine(program("for i in range(2):\n    broadcast x[i] 1MiB src=0"), machine, NETWORKS["flow"]).folded
    assert Engine(program("for i in range(2):\n    all_reduce x[i] 1MiB"), machine, NETWORKS["flow"]).folded
    # without NCCL's model a broadcast is a collective of the usual kind, and folds
    assert Engine(program("broadcast x 1MiB src=0"), resolve_machine("h100-nvlink"), NETWORKS["flow"]).folded
