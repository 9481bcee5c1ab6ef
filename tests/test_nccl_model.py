"""NCCL's model on GPU machines (`nccl:`): choice, channels, loads, and both networks."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commdsl.cli import main
from commdsl.dsl import load_schedule_text
from commdsl.errors import MachineError, ScheduleError
from commdsl.ir import Algo, OpKind, Protocol, Transport
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.machine.model import LinkKind
from commdsl.machine.nccl import CpuVendor, Generation, HopKind
from commdsl.sim import nccl, simulate
from commdsl.sim.fabric import Fabric
from commdsl.sim.nccl_flows import NcclFlows

H100 = resolve_machine("dgx-h100")
A100 = resolve_machine("dgx-a100")


def one_op(ranks: int, statement: str, extra: str = "", streams: str = "[s]") -> object:
    text = f"name: t\nworld: {ranks}\nstreams: {streams}\n{extra}program: |\n  {statement}\n"
    return load_schedule_text(text, "t.yaml")


def flows(machine, ranks: int) -> tuple[NcclFlows, nccl.Layout]:
    m = machine if ranks <= 8 else machine.with_nodes(ranks // 8)
    f = NcclFlows(Fabric(m, ranks), m.nccl)
    return f, f.layout(tuple(range(ranks)))


def pick(machine, kind: OpKind, ranks: int, size: int, **forced) -> tuple[str, str]:
    f, lay = flows(machine, ranks)
    c = nccl.select(f.cfg, kind, lay, size, forced.get("algo"), forced.get("proto"))
    return c.algo.value, c.proto.value


# ---- NCCL's choice ---------------------------------------------------------------------------


def test_nccl_picks_by_size_and_machine_as_its_tuning_table_does():
    # One H100 node: LL rings for small all_reduces, NVLink SHARP for large ones.
    assert pick(H100, OpKind.ALL_REDUCE, 8, 4096) == ("ring", "ll")
    assert pick(H100, OpKind.ALL_REDUCE, 8, 1 << 30) == ("nvls", "simple")
    # all_gather gains nothing from NVLS (it moves as much): rings, LL128 then Simple.
    assert pick(H100, OpKind.ALL_GATHER, 8, 8 << 20)[0] == "ring"
    assert pick(H100, OpKind.ALL_REDUCE, 1, 1 << 20) == ("ring", "simple")  # one rank: nothing to choose
    assert pick(H100, OpKind.ALL_GATHER, 8, 1 << 30) == ("ring", "simple")
    # A100 has no NVLS; across nodes small all_reduces take the double binary tree.
    assert pick(A100, OpKind.ALL_REDUCE, 8, 1 << 30) == ("ring", "simple")
    assert pick(A100, OpKind.ALL_REDUCE, 32, 4096) == ("tree", "ll")
    # Four H100 nodes: NVLS inside each node and a tree of the nodes (NCCL 2.27+'s NVLS
    # bandwidth: the switch's x2 for an all_reduce, the NICs', perChMaxNVLSTreeBw) up to
    # a few GiB, where the ring's bandwidth outweighs its longer latency.
    assert pick(H100, OpKind.ALL_REDUCE, 32, 1 << 30) == ("nvls_tree", "simple")
    assert pick(H100, OpKind.ALL_REDUCE, 32, 8 << 30) == ("ring", "simple")
    assert pick(H100, OpKind.ALL_REDUCE, 80, 1 << 30) == ("nvls_tree", "simple")


def test_the_op_or_the_machine_can_force_algorithm_and_protocol():
    assert pick(H100, OpKind.ALL_REDUCE, 8, 1 << 30, algo=Algo.RING) == ("ring", "simple")
    assert pick(H100, OpKind.ALL_REDUCE, 8, 1 << 30, algo=Algo.RING, proto=Protocol.LL) == ("ring", "ll")
    # Simple only: NVLS's latency (NCCL's 25 us) beats 14 ring steps of Simple even at 4 KiB.
    assert pick(H100, OpKind.ALL_REDUCE, 8, 4096, proto=Protocol.SIMPLE) == ("nvls", "simple")
    text = H100.source and open(H100.source).read() + "  algo: [ring]\n  proto: ll128\n"
    forced = load_machine_text(text, "forced.yaml")
    assert pick(forced, OpKind.ALL_REDUCE, 8, 1 << 30) == ("ring", "ll128")
    with pytest.raises(ScheduleError, match=r"NCCL has no nvls for all_reduce .* \(it has: .*ring/simple"):
        pick(A100, OpKind.ALL_REDUCE, 8, 1 << 20, algo=Algo.NVLS)
    with pytest.raises(ScheduleError, match="NCCL has no tree for all_gather"):
        pick(H100, OpKind.ALL_GATHER, 8, 1 << 20, algo=Algo.TREE)
    nvls_only = load_machine_text(open(H100.source).read() + "  algo: [nvls]\n", "nvls.yaml")
    with pytest.raises(ScheduleError, match=r"NCCL has no nvls among the machine's nccl.algo / nccl.proto "
                                            r"for broadcast on 8 ranks .* \(it has: ring/ll, ring/ll128, ring/simple\)"):
        pick(nvls_only, OpKind.BROADCAST, 8, 1 << 20)


def test_forcing_what_the_machine_lacks_is_an_error_at_the_op():
    with pytest.raises(ScheduleError) as info:
        simulate(one_op(8, "all_reduce x 1MiB algo=nvls"), A100)
    assert info.value.loc is not None and info.value.loc.line == 5
    with pytest.raises(ScheduleError, match="proto=ll: machine h100-nvlink has no NCCL model"):
        simulate(one_op(8, "all_reduce x 1MiB proto=ll"), resolve_machine("h100-nvlink"))


def test_channels_shrink_for_small_messages_as_ncclS_do():
    _, lay = flows(H100, 8)
    cfg = H100.nccl
    # Ring LL: a channel per 512 threads x 8 bytes x 8 ranks (enqueue.cc topoGetAlgoInfo).
    assert [nccl.collective_channels(cfg, Algo.RING, Protocol.LL, lay, s) for s in (8, 32768, 65536, 262144, 1 << 20)] == [1, 1, 2, 8, 24]
    assert nccl.collective_channels(cfg, Algo.RING, Protocol.SIMPLE, lay, 1 << 30) == cfg.channels
    assert nccl.collective_channels(cfg, Algo.NVLS, Protocol.SIMPLE, lay, 4096) == cfg.nvls_channels


def test_p2p_channels_ramp_with_size_so_p2p_bandwidth_does():
    cfg = H100.nccl
    comm = nccl.P2pComm(8, 1)
    per = [nccl.p2p_channels_per_transfer(cfg, comm, s, HopKind.NVLINK) for s in (4096, 1 << 20, 64 << 20, 256 << 20, 1 << 30)]
    assert per == [1, 4, 4, 16, 32]
    algbw = []
    for size in ("64KiB", "16MiB", "1GiB"):
        r = simulate(one_op(8, f"h = batch:\n      isend x {size} to (rank + 1) % 8\n      irecv x {size} from (rank + 7) % 8\n  wait h"), H100)
        algbw.append(r.flow_stats()[0].algbw_gb_per_s)
    assert algbw[0] < algbw[1] < algbw[2]


def test_p2p_channels_per_peer_across_nodes_follow_nccls_rule():
    cfg = H100.nccl
    # A peer across the network gets ceil(47 GB/s / 14) = 4 channels, rounded to a power of
    # two; then NCCL 2.29 halves it until a round of all peers (8 per batch) fits in the P2P
    # channels, which across nodes are the 16 ring channels of DGX H100 nodes, not one node's 32.
    assert (cfg.p2p_channel_count(1), cfg.p2p_channel_count(2)) == (32, 16)
    per_peer = {ranks: nccl.p2p_channels_per_peer(cfg, nccl.P2pComm(ranks, ranks // 8, 47.0)) for ranks in (16, 32, 64, 80, 512)}
    assert per_peer == {16: 4, 32: 4, 64: 2, 80: 1, 512: 1}
    assert nccl.p2p_channels_per_peer(cfg, nccl.P2pComm(8, 1, 47.0)) == cfg.p2p_channels_per_peer  # one node: the machine's
    # Across nodes every pair of the communicator is sized for the network, even two GPUs of
    # one node: a 1 GiB send between GPUs 0 and 1 uses the per-peer maximum of its communicator.
    assert nccl.p2p_channels_per_transfer(cfg, nccl.P2pComm(80, 10, 47.0), 1 << 30, HopKind.NETWORK) == 1
    assert nccl.p2p_channels_per_transfer(cfg, nccl.P2pComm(16, 2, 47.0), 1 << 30, HopKind.NETWORK) == 4
    # The NIC rate is the topology's: a DGX A100's 200 Gb/s NICs (23.5 GB/s) give 2 channels a peer.
    for name, nic, per_peer in (("dgx-h100", 47.0, 4), ("dgx-a100", 23.5, 2)):
        m = resolve_machine(name).with_nodes(2)
        comm = NcclFlows(Fabric(m, 16), m.nccl).p2p_comm(tuple(range(16)))
        assert (comm.ranks, comm.nodes, comm.nic_gb_per_s) == (16, 2, nic)
        assert nccl.p2p_channels_per_peer(m.nccl, comm) == per_peer


def test_sendrecv_over_b200_nodes_steps_down_as_nccls_p2p_channels_do():
    # DGX B200 nodes under NCCL 2.29.7 (together-nccl-tests' sendrecv scaling report): about
    # 43 GB/s at 2 and 4 nodes, 26 at 8, 14.6 from 16 on. NCCL's P2P channel rule gives the
    # steps: 4 channels a remote peer fill the NIC, 2 at 64 ranks, 1 from 128 (the 2-node
    # log prints "16 p2p channels, 4 p2p channels per peer").
    from commdsl.calibrate.nccl_tests import Run, bench_machine, busbw_gb_per_s, choice, simulate_run

    b200 = resolve_machine("dgx-b200")
    assert (b200.nccl.generation.value, b200.nccl.channels, b200.nccl.coll_channels(2), b200.nccl.p2p_channel_count(2)) == ("blackwell", 32, 16, 16)
    size = 64 << 20
    busbw = {}
    for nodes, channels in ((2, 4), (4, 4), (8, 2), (16, 1)):
        run = Run(OpKind.SEND, 8 * nodes)
        assert choice(bench_machine(b200, run), run, size).channels == channels
        busbw[nodes] = busbw_gb_per_s(OpKind.SEND, run.ranks, size, simulate_run(b200, run, size))
    assert busbw[2] == pytest.approx(busbw[4], rel=0.01)
    assert 42 < busbw[2] < 47  # the NIC's 47 GB/s at Simple's efficiency
    assert busbw[8] == pytest.approx(2 * 14, rel=0.02)  # two channels at NCCL's 14 GB/s each
    assert busbw[16] == pytest.approx(14, rel=0.02)


GH200 = resolve_machine("gh200-quad")


def test_rings_of_an_nvlink_mesh_node_spread_over_every_link():
    # A quad GH200 node: six NVLinks between every two GPUs, no switch. NCCL's search places
    # each ring on the links the rings before it left free; one order for all would put the
    # 24 channels on 4 of the 12 GPU-to-GPU directions.
    f, lay = flows(GH200, 4)
    assert lay.mesh and lay.intra_gb_per_s == pytest.approx(3 * 123.6)
    assert not flows(H100, 8)[1].mesh and not flows(resolve_machine("pcie-nvlink-pairs"), 8)[1].mesh
    rings = nccl.ring_orders(lay, 24)
    assert all(sorted(ring) == [0, 1, 2, 3] for ring in rings)
    assert sorted(nccl.ring_edges(lay, 24, 1.0).values()) == [8.0] * 12
    # Across nodes each ring still enters a node at member c and leaves at c + 1 (its rails).
    m = GH200.with_nodes(2)
    lay2 = NcclFlows(Fabric(m, 8), m.nccl).layout(tuple(range(8)))
    for c, ring in enumerate(nccl.ring_orders(lay2, 8)):
        assert (ring[0], ring[3], ring[4], ring[7]) == (c % 4, (c + 1) % 4, 4 + c % 4, 4 + (c + 1) % 4)


def test_a_collective_on_an_nvlink_mesh_node_uses_all_its_links():
    # all_gather of 1 GiB on one quad GH200 node: the rings move at a GPU's three links
    # (370.8 GB/s as NCCL moves them, Simple's efficiency), not one pair's 123.6.
    from commdsl.calibrate.nccl_tests import Run, busbw_gb_per_s, simulate_run

    run, size = Run(OpKind.ALL_GATHER, 4), 1 << 30
    assert 330 < busbw_gb_per_s(OpKind.ALL_GATHER, 4, size, simulate_run(GH200, run, size)) < 370.8
    send = Run(OpKind.SEND, 4)  # one peer: one pair's links
    assert busbw_gb_per_s(OpKind.SEND, 4, size, simulate_run(GH200, send, size)) < 123.6


def test_nccl_takes_the_tree_on_two_nodes_whose_nics_are_slower_than_nvlink():
    # NCCL searches a ring at one speed inside and across nodes, no faster than the NICs;
    # a tree's speed inside may rise to twice that, and its table reads the inside speed on
    # two nodes (search.cc pass 2, tuning.cc). Two quad GH200 nodes (one 200G NIC a GPU):
    # the ring's table bandwidth is the NICs', the tree's is higher, so large all_reduces
    # take the tree, which moves more than a ring through those NICs could (CSCS's 2 x 4
    # GH200 log: 122 GB/s of bus bandwidth at 128 MiB, above the NICs' 94).
    f, lay = flows(GH200.with_nodes(2), 8)
    table = nccl.nccl_table(f.cfg, OpKind.ALL_REDUCE, lay)
    nch = f.cfg.coll_channels(2) // 2
    assert table[(Algo.RING, Protocol.SIMPLE)][1] == pytest.approx(nch * lay.inter_gb_per_s / nch * 8 / 14)
    assert table[(Algo.TREE, Protocol.SIMPLE)][1] > table[(Algo.RING, Protocol.SIMPLE)][1]
    assert pick(GH200.with_nodes(2), OpKind.ALL_REDUCE, 8, 128 << 20)[0] == "tree"
    # On a DGX H100 pair the NICs (47 GB/s each) match NVLink per channel: nothing moves.
    f, lay = flows(H100, 16)
    assert nccl._graph(f.cfg, lay, Algo.TREE)[1] == nccl._graph(f.cfg, lay, Algo.RING)[1] == pytest.approx(370.8 / 8)


def test_a_networks_latency_per_message_is_paid_once_per_crossing_not_per_ring_step():
    # TCPXO (Google Cloud A3 Mega) takes tens of microseconds per message where InfiniBand
    # takes none in the model. A connection keeps NCCL_STEPS messages in flight, so a ring
    # pays that latency once per crossing of its chain (as NCCL's table counts it), while
    # each of its 15 steps on 2 x 8 GPUs still takes the network step's turn.
    from commdsl.calibrate.nccl_tests import Run, busbw_gb_per_s, simulate_run

    a3 = resolve_machine("a3-mega")
    assert a3.nccl.net_latency_us == 57
    f, lay = flows(a3.with_nodes(2), 16)
    none = dataclasses.replace(f.cfg, net_latency_us=0.0)
    for kind, crossings in ((OpKind.ALL_GATHER, 1), (OpKind.ALL_REDUCE, 2)):
        for proto in (Protocol.LL128, Protocol.SIMPLE):
            added = nccl.latency_us(f.cfg, kind, lay, Algo.RING, proto) - nccl.latency_us(none, kind, lay, Algo.RING, proto)
            assert added == pytest.approx(crossings * f.cfg.net_message_us(proto))
    # So a 2-node all_gather of 64 MiB stays near its NICs' bandwidth (measured 121 GB/s
    # of bus bandwidth on GKE A3 Mega), and an 8-byte all_reduce pays two messages (123-147
    # us measured on another A3 Mega cluster; the tree's two network levels).
    run = Run(OpKind.ALL_GATHER, 16)
    assert 100 < busbw_gb_per_s(OpKind.ALL_GATHER, 16, 64 << 20, simulate_run(a3, run, 64 << 20)) < 188
    small = Run(OpKind.ALL_REDUCE, 16)
    ib = dataclasses.replace(a3, nccl=dataclasses.replace(a3.nccl, net_latency_us=0.0))
    assert simulate_run(a3, small, 8) - simulate_run(ib, small, 8) == pytest.approx(2 * 57, rel=0.01)


def test_p2p_channels_of_a_communicator_with_fewer_gpus_a_node_follow_its_own_graph():
    # NCCL's P2P channels are its communicator's collective channels across nodes: a ring
    # per NIC its GPUs use, doubled up to 4 rings (ncclTopoDupChannels) and again
    # (ncclTopoPostset). 10 DGX H100 nodes with 1, 2, 4, 8 GPUs each (nccl-tests-cluster's
    # runs): 4, 8, 16, 16 P2P channels, so 2, 2, 2, 1 channels a peer.
    m = H100.with_nodes(10)
    flows = NcclFlows(Fabric(m, 80), m.nccl)
    got = {}
    for g in (1, 2, 4, 8):
        comm = flows.p2p_comm(tuple(r for r in range(80) if r % 8 < g))
        got[g] = (comm.nics, nccl.p2p_channel_total(m.nccl, comm), nccl.p2p_channels_per_peer(m.nccl, comm))
    assert got == {1: (1, 4, 2), 2: (2, 8, 2), 4: (4, 16, 2), 8: (0, 16, 1)}
    # so a sendrecv ring over 10 single-GPU nodes runs at 2 channels' network rate, not at the NIC's
    ring = tuple(range(0, 80, 8))
    send = flows.coflow(OpKind.SEND, (0, 8), 1 << 30, None, Algo.DIRECT, Protocol.SIMPLE, ring)
    assert send.cap == pytest.approx(2 * m.nccl.p2p_net_channel_bandwidth_gb_per_s * 1e3)
    # a group inside one node, or using every NIC, keeps the machine's count
    assert nccl.p2p_channel_total(m.nccl, flows.p2p_comm(tuple(range(8)))) == 32
    assert nccl.p2p_channel_total(m.nccl, flows.p2p_comm(tuple(range(16)))) == 16
    # rings of less than 25 GB/s (200 Gb/s NICs) are not doubled, on any GPU; before
    # Hopper, rings of 25-50 GB/s are doubled however many there are
    assert nccl.p2p_channel_total(m.nccl, nccl.P2pComm(10, 10, 23.5, 1)) == 2
    ampere = dataclasses.replace(m.nccl, generation=Generation.AMPERE, channels_across_nodes=64, p2p_channels=64)
    assert nccl.p2p_channel_total(ampere, nccl.P2pComm(60, 10, 47.0, 6)) == 32
    assert nccl.p2p_channel_total(m.nccl, nccl.P2pComm(60, 10, 47.0, 6)) == 16


def test_a_send_inside_a_node_slows_when_its_communicator_spans_many_nodes():
    # nccl-tests' sendrecv ring: the same NVLink send between GPUs 0 and 1 of node 0 gets
    # NCCL's channels of its communicator: 32 on one node, 1 among 80 ranks on 10 nodes.
    prog = "h = batch:\n      isend x 1GiB to (rank + 1) % world_size\n      irecv x 1GiB from (rank + world_size - 1) % world_size\n  wait h"
    one = simulate(one_op(8, prog), H100)
    ten = simulate(one_op(80, prog), H100.with_nodes(10))
    intra = [s for s in ten.flow_stats() if s.kind is OpKind.SEND and s.algbw_gb_per_s > 0]
    assert one.flow_stats()[0].algbw_gb_per_s > 3 * min(s.algbw_gb_per_s for s in intra)


# ---- loads on the links ---------------------------------------------------------------------


def test_rings_across_nodes_load_every_nic_equally():
    m = H100.with_nodes(4)
    r = simulate(one_op(32, "all_reduce x 1GiB algo=ring"), m)
    nic = {s.name: s.bytes for s in r.link_stats() if "network" in s.name}
    assert len(nic) == 2 * 8 * 4  # every NIC, both directions
    assert max(nic.values()) == pytest.approx(min(nic.values()), rel=1e-9)
    # ... so a 32-GPU ring all_reduce runs at the rate of 8 NICs, not one's (its 16
    # channels' own rate, 16 x 20 GB/s, is a little below the 8 NICs' 8 x 47).
    stat = r.flow_stats()[0]
    busbw = 2 * 31 / 32 * stat.algbw_gb_per_s
    assert 4 * 47 < busbw < 8 * 47


def test_aggregated_all_to_all_loads_equal_the_loads_of_every_pair():
    m = H100.with_nodes(3)
    f = NcclFlows(Fabric(m, 24), m.nccl)
    ranks = tuple(r for r in range(24) if r % 8 != 5)  # not every GPU of a node
    agg: dict[int, float] = {}
    f._all_to_all(agg, f.layout(ranks))
    pairs: dict[int, float] = {}
    for a in ranks:
        for b in ranks:
            if a != b:
                for c in f.fabric.route(a, b, Transport.NCCL).channels:
                    pairs[c] = pairs.get(c, 0.0) + 1 / len(ranks)
    assert agg.keys() == pairs.keys()
    assert all(agg[c] == pytest.approx(pairs[c], rel=1e-12) for c in pairs)


def test_a_large_all_to_all_is_one_coflow_at_the_nics_rate():
    ranks = 512
    m = H100.with_nodes(ranks // 8)
    size = ranks * 2**20
    r = simulate(one_op(ranks, f"all_to_all x {size}B"), m)
    assert r.network_model.events == 2
    cfg = m.nccl
    nic = 47 * cfg.p2p_net_efficiency * cfg.protocol(Protocol.SIMPLE).efficiency  # what leaves a GPU's NIC, GB/s
    stat = r.flow_stats()[0]
    away = (ranks - 8) / ranks * size
    # the first peer's hop, then the proxies post the other 503 remote peers 3 us apart (Simple, Intel)
    posts = (ranks - 8 - 1) * 3 * cfg.net_overhead_us
    latency = cfg.protocol(Protocol.SIMPLE).base_latency_us + cfg.protocol(Protocol.SIMPLE).hop_us(HopKind.NETWORK) + posts
    assert stat.end_us - stat.start_us == pytest.approx(latency + away / (nic * 1e3), rel=1e-6)


def test_an_all_to_all_across_nodes_waits_for_its_remote_peers_to_be_posted():
    # NCCL's proxies post a rank's remote peers one after another, 1 us per network
    # operation on Intel hosts, 3 with Simple (tuning.cc getNetOverhead): the latency
    # grows with the peers across the network, not with those inside the node, and a
    # send (one peer) pays none of it.
    def latency(nodes: int, ppn: int, kind: OpKind = OpKind.ALL_TO_ALL, proto: Protocol = Protocol.SIMPLE) -> float:
        m = H100.with_nodes(nodes)
        ranks = tuple(r for r in range(nodes * 8) if r % 8 < ppn)
        return nccl.latency_us(m.nccl, kind, NcclFlows(Fabric(m, nodes * 8), m.nccl).layout(ranks), Algo.DIRECT, proto)

    assert latency(10, 8) - latency(2, 8) == pytest.approx((72 - 8) * 3.0)
    assert latency(10, 4) - latency(2, 4) == pytest.approx((36 - 4) * 3.0)
    assert latency(10, 8, proto=Protocol.LL) - latency(2, 8, proto=Protocol.LL) == pytest.approx(72 - 8)
    simple = H100.nccl.protocol(Protocol.SIMPLE)
    assert latency(1, 8) == pytest.approx(simple.base_latency_us + simple.hop_us(HopKind.NVLINK))  # inside one node: no proxy
    # A send is one peer's kernel: NCCL's own base latency (tuning.cc baseLat, Simple 8.4
    # us), not the one the machine's collectives were fitted to; across nodes the
    # receiver's clear-to-send crosses the network before the first chunk does.
    assert latency(1, 8, OpKind.SEND) == pytest.approx(8.4 + simple.hop_us(HopKind.NVLINK))
    assert latency(2, 8, OpKind.SEND) == pytest.approx(8.4 + 2 * simple.hop_us(HopKind.NETWORK))
    # The handshake is the proxies', the same for LL: two of their (Simple) network steps.
    assert latency(2, 8, OpKind.SEND, Protocol.LL) == pytest.approx(6.6 + 2 * simple.hop_us(HopKind.NETWORK))
    # A network that adds latency per message (TCP offload) adds it to both messages,
    # and Simple's flush of the receive once more.
    m = H100.with_nodes(2)
    tcpx = dataclasses.replace(m.nccl, net_latency_us=30.0)
    lay = NcclFlows(Fabric(m, 16), m.nccl).layout((0, 8))
    assert nccl.latency_us(tcpx, OpKind.SEND, lay, Algo.DIRECT, Protocol.SIMPLE) == pytest.approx(8.4 + 2 * simple.hop_us(HopKind.NETWORK) + 90)
    assert nccl.latency_us(tcpx, OpKind.SEND, lay, Algo.DIRECT, Protocol.LL) == pytest.approx(6.6 + 2 * simple.hop_us(HopKind.NETWORK) + 60)
    m = H100.with_nodes(10)
    amd = dataclasses.replace(m.nccl, cpu=CpuVendor.AMD)  # 2 us per network operation
    lay = NcclFlows(Fabric(m, 80), m.nccl).layout(tuple(range(80)))
    assert nccl.proxy_posts_us(amd, OpKind.ALL_TO_ALL, lay, Protocol.SIMPLE) == pytest.approx(71 * 3 * 2.0)
    assert nccl.proxy_posts_us(amd, OpKind.SEND, lay, Protocol.SIMPLE) == 0.0


def test_all_to_alls_contend_on_the_nics_they_share():
    m = H100.with_nodes(2)
    groups = "groups:\n  left: [0, 1, 2, 3, 8, 9, 10, 11]\n  right: [4, 5, 6, 7, 12, 13, 14, 15]\n"
    alone = simulate(one_op(16, "if rank % 8 < 4:\n      all_to_all x 1GiB group=left", groups), m).makespan_us
    both = simulate(one_op(16, "if rank % 8 < 4:\n      all_to_all x 1GiB group=left\n  else:\n      all_to_all y 1GiB group=right", groups), m)
    assert both.makespan_us == pytest.approx(alone, rel=1e-9)  # disjoint GPUs and NICs
    # A ring all_reduce of all 16 ranks on another stream crosses the same NICs at once.
    shared = "if rank % 8 < 4:\n      h = all_to_all x 1GiB group=left on s\n      wait h\n  g = all_reduce y 1GiB algo=ring on t\n  wait g"
    with_ring = simulate(one_op(16, shared, groups, streams="[s, t]"), m)
    a2a_end = max(with_ring.raw.end[g] for g, op in enumerate(with_ring.raw.ops) if op.kind is OpKind.ALL_TO_ALL)
    assert a2a_end > alone * 1.05


# ---- both networks ---------------------------------------------------------------------------

CASES = [
    (8, "all_reduce x 64MiB"), (8, "all_reduce x 4KiB"), (8, "all_reduce x 64MiB algo=ring proto=ll128"),
    (8, "all_gather x 256MiB"), (8, "reduce_scatter x 1MiB"), (8, "broadcast x 64MiB src=3"), (8, "reduce x 1MiB dst=0"),
    (8, "all_to_all x 64MiB"), (8, "gather x 8MiB dst=2"), (8, "scatter x 8MiB src=1"), (8, "barrier"),
    (32, "all_reduce x 1GiB"), (32, "all_reduce x 64KiB"), (32, "all_reduce x 256MiB algo=tree"), (32, "all_gather x 1GiB"),
    (32, "all_to_all x 1GiB"),
]


@pytest.mark.parametrize("ranks,statement", CASES)
def test_analytic_and_flow_agree_within_half_a_percent_uncontended(ranks, statement):
    for machine in (H100, A100):
        m = machine if ranks <= 8 else machine.with_nodes(ranks // 8)
        program = one_op(ranks, statement)
        flow = simulate(program, m, "flow").makespan_us
        analytic = simulate(program, m, "analytic").makespan_us
        assert flow == pytest.approx(analytic, rel=0.005)


def test_nvls_tree_and_collnet_run_where_the_machine_has_them():
    collnet = load_machine_text(open(H100.source).read().replace("  nvls: true\n", "  nvls: true\n  collnet: true\n"), "sharp.yaml")
    for machine, statement in ((H100, "all_reduce x 1GiB algo=nvls_tree"), (collnet, "all_reduce x 1GiB algo=collnet_direct"),
                               (collnet, "all_reduce x 1GiB algo=collnet_chain"), (collnet, "all_reduce x 1GiB algo=nvls")):  # fmt: skip
        program = one_op(16, statement)
        m = machine.with_nodes(2)
        flow = simulate(program, m)
        assert flow.makespan_us == pytest.approx(simulate(program, m, "analytic").makespan_us, rel=0.005)
        assert {f.algo.value for f in flow.flow_stats()} == {statement.split("algo=")[1]}
    with pytest.raises(ScheduleError, match="NCCL has no nvls for all_reduce on 16 ranks over 2 node"):
        simulate(one_op(16, "all_reduce x 1GiB algo=nvls"), H100.with_nodes(2))  # NVLS across nodes needs CollNet


def test_a_64_rank_all_reduce_is_a_handful_of_events():
    r = simulate(one_op(64, "all_reduce x 256MiB algo=ring"), H100.with_nodes(8))
    assert r.network_model.events == 2


# ---- traces --------------------------------------------------------------------------------


def test_kernel_names_carry_ncclS_algorithm_and_protocol(tmp_path, capsys):
    text = "name: t\nworld: 8\nstreams: [s]\nprogram: |\n  all_reduce a 4KiB\n  all_reduce b 1GiB\n  all_gather c 1GiB\n  all_reduce d 4MiB algo=ring proto=ll128\n"
    path = tmp_path / "t.yaml"
    path.write_text(text)
    trace = tmp_path / "trace.json"
    assert main(["simulate", str(path), "--machine", "dgx-h100", "--trace", str(trace), "--gantt", "never"]) == 0
    import json

    names = {e["args"]["name"]: (e["name"], e["args"]["proto"]) for e in json.loads(trace.read_text())["traceEvents"]
             if e.get("ph") == "X" and e["args"].get("role") == "exec" and e["pid"] == 0}  # fmt: skip
    assert names["a"] == ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ll")
    assert names["b"] == ("ncclDevKernel_AllReduce_Sum_f32_NVLS_SIMPLE", "simple")
    assert names["c"] == ("ncclDevKernel_AllGather_RING_SIMPLE", "simple")
    assert names["d"] == ("ncclDevKernel_AllReduce_Sum_f32_RING_LL128", "ll128")


# ---- machine files --------------------------------------------------------------------------

BASE = open(H100.source).read()
NCCL_AT = BASE.index("\nnccl:")

BAD_NCCL = [
    ("unknown key", "  colour: blue\n", "unknown key 'colour'"),
    ("generation", None, "unknown kind 'kepler'"),
    ("no channels", None, "must be at least 1"),
    ("too many channels", None, "at most 64"),
    ("algo name", "  algo: [ring, hypercube]\n", "unknown name 'hypercube'"),
    ("efficiency", "  nvls_efficiency: 1.5\n", "at most 1"),
    ("per peer", "  p2p_channels: 8\n  p2p_channels_per_peer: 16\n", "more than nccl.p2p_channels"),
    ("protocol", "  protocols:\n    ll256: {efficiency: 0.5}\n", "unknown key 'll256'"),
    ("hop", "  protocols:\n    ll: {hop_latency_us: {infiniband: 2}}\n", "unknown key 'infiniband'"),
    ("net latency", "  net_latency_us: fast\n", "nccl.net_latency_us"),
    ("tree level scale", "  tree_net_scale: 0\n", "nccl.tree_net_scale must be"),
    ("no channels across nodes", None, "nccl.channels_across_nodes must be at least 1"),
    ("too many channels across nodes", None, "at most 64"),
    ("p2p net channel rate", None, "nccl.p2p_net_channel_bandwidth_gb_per_s"),
    ("version", "  version: latest\n", "nccl.version must be an NCCL release such as 2.24.3"),
    ("version list", "  version: [2, 24, 3]\n", "nccl.version must be an NCCL release"),
    ("graph scale kind", "  graph_scale: {nic: 1.0, infiniband: 0.9}\n", "unknown key 'infiniband'"),
    ("graph scale factor", "  graph_scale: {nvlink: 0}\n", "nccl.graph_scale.nvlink must be"),
    ("graph scale list", "  graph_scale: [0.9]\n", "nccl.graph_scale"),
]


def _variant(name: str, extra: str | None) -> str:
    head, tail = BASE[:NCCL_AT], BASE[NCCL_AT:]
    if name == "generation":
        return head + tail.replace("generation: hopper", "generation: kepler")
    if name == "no channels":
        return head + tail.replace("channels: 24", "channels: 0", 1)
    if name == "too many channels":
        return head + tail.replace("channels: 24", "channels: 65", 1)
    if name == "no channels across nodes":
        return head + tail.replace("channels_across_nodes: 16", "channels_across_nodes: 0")
    if name == "too many channels across nodes":
        return head + tail.replace("channels_across_nodes: 16", "channels_across_nodes: 65")
    if name == "p2p net channel rate":
        return head + tail.replace("  p2p_net_efficiency: 1.0\n", "  p2p_net_efficiency: 1.0\n  p2p_net_channel_bandwidth_gb_per_s: -3\n")
    tail = tail.replace("  p2p_channels: 32\n  p2p_channels_per_peer: 32\n", "") if name == "per peer" else tail
    tail = tail.replace("  nvls_efficiency: 0.85\n", "") if name == "efficiency" else tail
    return head + tail.split("  protocols:")[0] + extra if name in ("protocol", "hop") else head + tail + extra


@pytest.mark.parametrize("name,extra,message", BAD_NCCL, ids=[b[0] for b in BAD_NCCL])
def test_bad_nccl_sections_are_errors_with_their_line(name, extra, message):
    with pytest.raises(MachineError) as info:
        load_machine_text(_variant(name, extra), "bad.yaml")
    assert message in info.value.message and info.value.loc is not None and info.value.loc.line > 1


def test_nccl_needs_a_topology_and_nvls_an_nvswitch():
    star = open(resolve_machine("h100-nvlink").source).read() + "nccl: {generation: hopper, channels: 24}\n"
    with pytest.raises(MachineError, match="nccl: needs a topology"):
        load_machine_text(star, "star.yaml")
    pairs = open(resolve_machine("pcie-nvlink-pairs").source).read() + "nccl: {generation: ampere, channels: 8, nvls: true}\n"
    with pytest.raises(MachineError, match="no link to an nvswitch"):
        load_machine_text(pairs, "pairs.yaml")
    with pytest.raises(MachineError, match="lists nvls but the machine has no nvls"):
        load_machine_text(open(A100.source).read() + "  algo: [ring, nvls]\n", "a.yaml")


def test_machines_without_an_nccl_model_are_unchanged():
    # The implied star: a ring all_reduce takes 2(n-1) steps of latency and its bytes at
    # the transport's bandwidth, no protocol.
    m = resolve_machine("h100-nvlink")
    r = simulate(one_op(8, "all_reduce x 1GiB"), m)
    nccl_link = m.transport(Transport.NCCL)
    expected = m.comm_launch_us + 14 * nccl_link.latency_us + 2 * 7 / 8 * 2**30 / (nccl_link.bandwidth_gb_per_s * 1e3)
    assert r.makespan_us == pytest.approx(expected, rel=1e-9)
    assert math.isclose(r.makespan_us, simulate(one_op(8, "all_reduce x 1GiB"), m, "analytic").makespan_us, rel_tol=1e-9)


def test_proto_takes_a_protocol_name():
    with pytest.raises(ScheduleError) as info:
        one_op(8, "all_reduce x 1MiB proto=ll64")
    assert "unknown proto 'll64'; expected one of simple, ll, ll128" in info.value.message and info.value.loc.column > 1
    ops = one_op(8, "all_reduce x 1MiB proto=ll128 algo=ring").ops[0]
    assert (ops[0].proto, ops[0].algo) == (Protocol.LL128, Algo.RING) and ops[0].to_json()["proto"] == "ll128"


def test_point_to_point_has_no_ll128():
    with pytest.raises(ScheduleError, match="run LL or Simple, not LL128") as info:
        simulate(one_op(8, "all_to_all x 8MiB proto=ll128"), H100)
    assert info.value.loc.line == 5


# ---- mechanisms from NCCL's source ----------------------------------------------------------


def nccl_tests_time(machine, op: OpKind, ranks: int, size: int) -> float:
    from commdsl.calibrate.nccl_tests import Run, simulate_run

    return simulate_run(machine, Run(op, ranks), size)


def test_each_send_gets_the_protocol_of_its_own_pair():
    # NVLink pairs beside PCIe (pcie-nvlink-pairs with NCCL's model): at 64 KiB NCCL sends
    # 0 -> 2 (PCIe) with LL and 3 -> 2 (NVLink) with Simple. Both sends go to rank 2 with
    # the same size and group: each must still get its own pair's choice.
    from commdsl.machine.loader import PRESETS_DIR
    from commdsl.sim.entities import PROTOS as ENGINE_PROTOS

    text = (PRESETS_DIR / "pcie-nvlink-pairs.yaml").read_text() + "\nnccl: {generation: ampere, channels: 2}\n"
    m = load_machine_text(text, "pairs-nccl.yaml")
    prog = load_schedule_text(
        "name: t\nworld: 4\nprogram: |\n"
        "  if rank == 0 or rank == 3:\n      send x 64KiB to 2\n"
        "  if rank == 2:\n      recv a 64KiB from 0\n      recv b 64KiB from 3\n", "t.yaml")
    raw = simulate(prog, m, "analytic").raw
    got = {op.rank: ENGINE_PROTOS[raw.protos[g]] for g, op in enumerate(raw.ops) if op.kind is OpKind.SEND}
    assert got == {0: Protocol.LL, 3: Protocol.SIMPLE}


def test_a_simple_ring_across_nodes_moves_at_its_channels_rate():
    # DGX H100: 16 ring channels across nodes at 20 GB/s each (one CTA's copy) move at most
    # 320 GB/s of bus bandwidth, below 8 NICs' 8 x 47: an 8 GiB all_gather on 4 nodes runs
    # at that rate; with a channel as fast as its links it runs at the NICs'.
    size = 8 << 30
    m = H100.with_nodes(4)
    spec = m.nccl.protocol(Protocol.SIMPLE)
    assert spec.channel_bandwidth_gb_per_s == 20 and m.nccl.coll_channels(4) == 16
    bus = size * 31 / 32 / nccl_tests_time(m, OpKind.ALL_GATHER, 32, size) / 1e3
    assert 0.95 * 320 < bus < 320
    free = dataclasses.replace(spec, channel_bandwidth_gb_per_s=math.inf)
    links = dataclasses.replace(m, nccl=dataclasses.replace(m.nccl, protocols=tuple((p, free if p is Protocol.SIMPLE else s) for p, s in m.nccl.protocols)))
    bus_links = size * 31 / 32 / nccl_tests_time(links, OpKind.ALL_GATHER, 32, size) / 1e3
    assert 340 < bus_links < 8 * 47


def test_p2p_across_many_nodes_runs_on_one_channel_at_its_network_rate():
    # nccl-tests' sendrecv ring over 10 DGX H100 nodes: NCCL's P2P channels across nodes are
    # the 16 ring channels, so each of 80 peers gets one (paths.cc), and one P2P channel
    # drives NCCL_P2P_PER_CHANNEL_NET_BW (14 GB/s) across the network; among 16 ranks a peer
    # gets 4 channels and the NIC (47 GB/s) is the limit.
    gib = 1 << 30
    ten = gib / nccl_tests_time(H100.with_nodes(10), OpKind.SEND, 80, gib) / 1e3
    two = gib / nccl_tests_time(H100.with_nodes(2), OpKind.SEND, 16, gib) / 1e3
    assert 13.0 < ten <= 14.0 and 40.0 < two <= 47.0
    # the rate is the machine's: a faster channel carries more (up to the 20 GB/s of the
    # NVLink sends, also on one channel each), on 10 nodes only
    fast = load_machine_text(BASE.replace("  p2p_net_efficiency: 1.0\n",
                                          "  p2p_net_efficiency: 1.0\n  p2p_net_channel_bandwidth_gb_per_s: 18\n"), "fast.yaml")
    assert fast.nccl.p2p_net_channel_bandwidth_gb_per_s == 18.0
    assert gib / nccl_tests_time(fast.with_nodes(10), OpKind.SEND, 80, gib) / 1e3 > 1.25 * ten
    assert nccl_tests_time(fast, OpKind.SEND, 8, gib) == nccl_tests_time(H100, OpKind.SEND, 8, gib)


def test_rings_across_nodes_use_the_multi_node_channel_count():
    # channels_across_nodes (16 on DGX H100) caps the rings once a communicator spans nodes;
    # without it the node's 24 channels would run, a third more LL128/LL per-channel bandwidth.
    same = load_machine_text(BASE.replace("  channels_across_nodes: 16\n", ""), "same.yaml")
    assert (H100.nccl.coll_channels(1), H100.nccl.coll_channels(4), same.nccl.coll_channels(4)) == (24, 16, 24)
    size = 268435200  # 256 MiB rounded down to a multiple of 80 x 8 bytes, as nccl-tests does
    assert nccl_tests_time(H100, OpKind.ALL_GATHER, 8, size) == nccl_tests_time(same, OpKind.ALL_GATHER, 8, size)
    assert nccl_tests_time(H100.with_nodes(10), OpKind.ALL_GATHER, 80, size) > nccl_tests_time(same.with_nodes(10), OpKind.ALL_GATHER, 80, size)


def test_nvls_chunks_shrink_for_smaller_ops_as_enqueue_cc_does():
    _, lay = flows(H100, 8)
    lanes = 16 * 8  # 16 NVLS channels x a head per GPU
    chunk = lambda size: nccl.nvls_chunk_bytes(Algo.NVLS, lay, 16, size)  # noqa: E731
    assert chunk(1 << 30) == 128 << 10  # 64 lanes' chunks of 128 KiB = 1 GiB: not below
    assert chunk((1 << 30) - 1) == 64 << 10
    assert chunk(8 * lanes * (64 << 10) - 1) == 32 << 10
    assert chunk(2 * lanes * (32 << 10) - 1) == 16 << 10
    assert chunk(128) == 16 << 10
    # The fill is a few chunks per lane, never more than the op holds.
    assert nccl.nvls_fill_bytes(Algo.NVLS, lay, 16, 1 << 30) == 3 * (128 << 10) * lanes
    assert nccl.nvls_fill_bytes(Algo.NVLS, lay, 16, 4096) == 3 * 4096


def test_nvls_bus_bandwidth_ramps_with_its_chunk_size():
    bus = {size: size / nccl_tests_time(H100, OpKind.ALL_REDUCE, 8, size) for size in (32 << 20, 256 << 20, 8 << 30)}
    assert nccl.select(H100.nccl, OpKind.ALL_REDUCE, flows(H100, 8)[1], 32 << 20).algo is Algo.NVLS
    # 32 MiB moves in 32 KiB chunks, 256 MiB in 64 KiB, 8 GiB in 128 KiB: the fill weighs less and less.
    assert bus[32 << 20] < 0.8 * bus[8 << 30]
    assert bus[32 << 20] < bus[256 << 20] < bus[8 << 30]
    _, lay = flows(H100, 8)
    assert nccl.nvls_fill_bytes(Algo.NVLS, lay, 16, 8 << 30) / (8 << 30) < 0.01


def test_ring_steps_across_nodes_last_as_long_as_the_network_hop():
    _, lay = flows(H100, 16)
    spec = H100.nccl.protocol(Protocol.LL128)
    net = spec.hop_us(HopKind.NETWORK)
    assert net > spec.hop_us(HopKind.NVLINK)
    got = nccl.latency_us(H100.nccl, OpKind.ALL_GATHER, lay, Algo.RING, Protocol.LL128)
    assert got == pytest.approx(spec.base_latency_us + 15 * net)
    # On one node the steps are the NVLink's.
    _, one = flows(H100, 8)
    got = nccl.latency_us(H100.nccl, OpKind.ALL_GATHER, one, Algo.RING, Protocol.LL128)
    assert got == pytest.approx(spec.base_latency_us + 7 * spec.hop_us(HopKind.NVLINK))


def test_an_ll_ring_across_nodes_pays_each_hop_once():
    # LL forwards words as their flags land: 32 ranks on 4 nodes, an all_gather's 31 steps
    # are 3 network hops and 28 NVLink ones, each at least the proxy's post (1 us, Intel).
    _, lay = flows(H100, 32)
    spec = H100.nccl.protocol(Protocol.LL)
    net = spec.hop_us(HopKind.NETWORK) + H100.nccl.net_message_us(Protocol.LL)
    step = max(spec.hop_us(HopKind.NVLINK), H100.nccl.net_overhead_us)
    got = nccl.latency_us(H100.nccl, OpKind.ALL_GATHER, lay, Algo.RING, Protocol.LL)
    assert got == pytest.approx(spec.base_latency_us + 28 * step + 3 * net)
    assert got < nccl.latency_us(H100.nccl, OpKind.ALL_GATHER, lay, Algo.RING, Protocol.LL128)


def test_a_tree_level_across_nodes_costs_what_ncclS_table_says_over_a_ring_step():
    _, lay = flows(H100, 32)
    spec = H100.nccl.protocol(Protocol.LL)
    level = spec.hop_us(HopKind.NETWORK) * 5.0 / 2.7  # tuning.cc hwLat NET: tree LL 5.0, ring LL 2.7
    want = spec.base_latency_us + 2 * (7 * spec.hop_us(HopKind.NVLINK) + 2 * level)
    assert nccl.latency_us(H100.nccl, OpKind.ALL_REDUCE, lay, Algo.TREE, Protocol.LL) == pytest.approx(want)


def test_the_networks_own_latency_is_paid_on_every_network_step():
    slow = load_machine_text(BASE + "  net_latency_us: 50\n", "tcpxo.yaml")
    assert slow.nccl.net_latency_us == 50
    _, lay = flows(H100, 16)
    for proto, times in ((Protocol.LL, 1), (Protocol.SIMPLE, 2)):  # Simple: the data, then the flush
        base = nccl.latency_us(H100.nccl, OpKind.ALL_REDUCE, lay, Algo.TREE, proto)
        more = nccl.latency_us(slow.nccl, OpKind.ALL_REDUCE, lay, Algo.TREE, proto)
        assert more - base == pytest.approx(2 * 1 * 50 * times)  # 2 x log2(2 nodes) levels
    # A small all_reduce over two nodes pays it; one node does not.
    assert nccl_tests_time(slow, OpKind.ALL_REDUCE, 16, 8) > nccl_tests_time(H100, OpKind.ALL_REDUCE, 16, 8) + 50
    assert nccl_tests_time(slow, OpKind.ALL_REDUCE, 8, 8) == nccl_tests_time(H100, OpKind.ALL_REDUCE, 8, 8)


def test_nvls_tree_wins_across_h100_nodes_as_ncclS_newer_table_says():
    _, lay = flows(H100, 32)
    table = nccl.nccl_table(H100.nccl, OpKind.ALL_REDUCE, lay)
    _, nvls_tree_bw = table[(Algo.NVLS_TREE, Protocol.SIMPLE)]
    # 8 channels x min(switch 40 x 0.85 x 7/8 x 2, NIC 47, perChMaxNVLSTreeBw 45.5) x 32/62
    assert nvls_tree_bw == pytest.approx(8 * 45.5 * 32 / 62)


def test_h800s_eight_nvlinks_give_it_less_than_half_an_h100s_bus_bandwidth():
    h800, h200 = resolve_machine("hgx-h800"), resolve_machine("dgx-h200")
    t100 = nccl_tests_time(H100, OpKind.ALL_GATHER, 8, 1 << 30)
    assert nccl_tests_time(h800, OpKind.ALL_GATHER, 8, 1 << 30) / t100 == pytest.approx(370.8 / 164.8, rel=0.05)
    assert nccl_tests_time(h200, OpKind.ALL_GATHER, 8, 1 << 30) == pytest.approx(t100)
    assert h200.device.memory_bandwidth_gb_per_s > H100.device.memory_bandwidth_gb_per_s


def test_p2p_channels_alone_bound_the_channels_per_peer():
    # A file that sets p2p_channels below the default per-peer count and says nothing of
    # the per-peer count loads: a peer gets at most every P2P channel there is.
    head, tail = BASE[:NCCL_AT], BASE[NCCL_AT:]
    m = load_machine_text(head + tail.replace("  p2p_channels: 32\n  p2p_channels_per_peer: 32\n", "  p2p_channels: 2\n"), "few.yaml")
    assert (m.nccl.p2p_channels, m.nccl.p2p_channels_per_peer) == (2, 2)


def test_ncclS_double_binary_tree_is_trees_cc_s():
    # trees.cc's illustrations: 13 positions, the first tree rooted at 0 with one child (8),
    # the second shifted by one (odd count); 12 positions, the second mirrored (even count).
    first = nccl._binary_tree(13, second=False)
    assert first == [-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 12, 10, 8]
    second = nccl._binary_tree(13, second=True)
    assert second.index(-1) == 1 and second[9] == 1 and second[0] == 9 and second[11] == 0 and second[12] == 11
    mirrored = nccl._binary_tree(12, second=True)
    assert mirrored.index(-1) == 11 and mirrored[3] == 11 and mirrored[7] == 3
    for count in range(2, 40):
        for tree in (nccl._binary_tree(count, False), nccl._binary_tree(count, True)):
            assert tree.count(-1) == 1 and all(sum(1 for p in tree if p == i) <= 2 for i in range(count))


def test_nvls_tree_across_nodes_loads_a_nic_as_ncclS_tree_does():
    # 4 nodes: in NCCL's trees two of the nodes are inner in one tree (a parent and two
    # children) and leaves in the other: their NICs carry 4 of the 16 channel shares each
    # way, S/4 per NIC (a heap-ordered tree would give 3/16). The tree's bytes cross PCIe
    # and the network as NCCL's Simple protocol: data alone, not at NVLS's efficiency.
    f, lay = flows(H100, 32)
    co = f.coflow(OpKind.ALL_REDUCE, lay.ranks, 1 << 30, None, Algo.NVLS_TREE, Protocol.SIMPLE)
    fill = 1.0 + nccl.nvls_fill_bytes(Algo.NVLS_TREE, lay, H100.nccl.nvls_channels, 1 << 30) / (1 << 30)
    net = [b for c, b in co.channel_bytes if c in f._network_channels]
    assert max(net) == pytest.approx(fill * 4 / 16)


def test_collectives_cross_the_nics_at_their_protocols_wire_format():
    # A NIC's rate is what NCCL delivers through it and the net transport sends the
    # protocol's buffer as it is (Simple: data alone): a ring all_gather across nodes
    # charges the machine's fitted Simple efficiency on NVLink and PCIe, not on the NICs;
    # an all_to_all (point to point) keeps it on every link.
    f, lay = flows(H100, 16)
    eff = H100.nccl.protocol(Protocol.SIMPLE).efficiency
    assert eff < 1.0
    kinds = f.fabric.kinds
    size = 1 << 30
    ring = f.coflow(OpKind.ALL_GATHER, lay.ranks, size, None, Algo.RING, Protocol.SIMPLE)
    bare = dataclasses.replace(H100.nccl, protocols=tuple((p, dataclasses.replace(s, efficiency=1.0)) for p, s in H100.nccl.protocols))
    plain = flows(dataclasses.replace(H100, nccl=bare), 16)[0].coflow(OpKind.ALL_GATHER, lay.ranks, size, None, Algo.RING, Protocol.SIMPLE)
    for (c, b), (c0, b0) in zip(ring.channel_bytes, plain.channel_bytes):
        assert c == c0
        assert b == pytest.approx(b0 if c in f._network_channels else b0 / eff)
    assert any(kinds[c] is LinkKind.NVLINK for c, _ in ring.channel_bytes) and any(c in f._network_channels for c, _ in ring.channel_bytes)
    a2a = f.coflow(OpKind.ALL_TO_ALL, lay.ranks, size, None, Algo.DIRECT, Protocol.SIMPLE)
    a2a0 = flows(dataclasses.replace(H100, nccl=bare), 16)[0].coflow(OpKind.ALL_TO_ALL, lay.ranks, size, None, Algo.DIRECT, Protocol.SIMPLE)
    assert [b for _, b in a2a.channel_bytes] == pytest.approx([b0 / eff for _, b0 in a2a0.channel_bytes])


def test_the_nccl_release_sets_the_table_that_chooses():
    # NCCL 2.24 rates NVLS_TREE beyond two nodes at the graph's bandwidth with half the
    # network's per channel and 5/6 of it as algorithm bandwidth (tuning.cc v2.24.3);
    # 2.28+ at the switch's (see above). On 4 DGX H100 nodes 2.24 thus runs rings from
    # 256 MiB where 2.29 keeps NVLS_TREE up to several GiB.
    from dataclasses import replace

    old = replace(H100, nccl=replace(H100.nccl, version=(2, 24, 3)))
    _, lay = flows(old, 32)
    table = nccl.nccl_table(old.nccl, OpKind.ALL_REDUCE, lay)
    lat, bw = table[(Algo.NVLS_TREE, Protocol.SIMPLE)]
    assert bw == pytest.approx(8 * min(40.0, 47.0 / 2) * 5 / 6)
    assert lat == pytest.approx(25.0 + 2 * 2 * 14.0)  # hwLat NVLink 25 + 2 log2(4) x NET 14 (20.9 from 2.28.9)
    assert pick(old, OpKind.ALL_REDUCE, 32, 256 << 20) == ("ring", "simple")
    assert pick(replace(H100, nccl=replace(H100.nccl, version=(2, 29, 2))), OpKind.ALL_REDUCE, 32, 256 << 20) == ("nvls_tree", "simple")
    assert pick(H100, OpKind.ALL_REDUCE, 32, 256 << 20) == ("nvls_tree", "simple")  # no version: the newest modelled
    assert pick(old, OpKind.ALL_REDUCE, 32, 32 << 20) == ("nvls_tree", "simple")


def test_a_machine_file_names_its_nccl_release():
    head, tail = BASE[:NCCL_AT], BASE[NCCL_AT:]
    m = load_machine_text(head + tail.replace("  generation: hopper\n", "  generation: hopper\n  version: 2.24.3\n"), "m.yaml")
    assert m.nccl.version == (2, 24, 3) and m.nccl.to_json()["version"] == "2.24.3"
    assert not m.nccl.tuning.nvls_switch_model and H100.nccl.tuning.nvls_switch_model
    short = load_machine_text(head + tail.replace("  generation: hopper\n", "  generation: hopper\n  version: 2.28\n"), "m.yaml")
    assert short.nccl.version == (2, 28, 0) and short.nccl.tuning.nvls_switch_model


def test_an_nvls_tree_level_costs_what_the_releases_table_says():
    # NCCL 2.28.9 raised hwLat NET NVLS_TREE from 14 to 20.9 us: a tree level across nodes
    # costs 14 us before it and 20.9 from it on, times the machine's `tree_net_scale`,
    # whatever the machine's ring step across nodes is.
    from dataclasses import replace

    _, lay = flows(H100, 32)
    times = {v: nccl.latency_us(replace(H100.nccl, version=v), OpKind.ALL_REDUCE, lay, Algo.NVLS_TREE, Protocol.SIMPLE)
             for v in ((2, 24, 3), (2, 28, 7), (2, 28, 9), (2, 29, 2))}  # fmt: skip
    assert times[(2, 24, 3)] == times[(2, 28, 7)] == pytest.approx(H100.nccl.nvls_latency_us + 2 * 2 * 14)
    assert times[(2, 28, 9)] == times[(2, 29, 2)] == pytest.approx(H100.nccl.nvls_latency_us + 2 * 2 * 20.9)
    scaled = replace(H100.nccl, version=(2, 29, 2), tree_net_scale=1.5)
    assert nccl.latency_us(scaled, OpKind.ALL_REDUCE, lay, Algo.NVLS_TREE, Protocol.SIMPLE) == pytest.approx(H100.nccl.nvls_latency_us + 2 * 2 * 20.9 * 1.5)
    # the ring's own network step does not move it
    spec = H100.nccl.protocol(Protocol.SIMPLE)
    hops = tuple((h, 99.0 if h is HopKind.NETWORK else us) for h, us in spec.hop_latency_us)
    slow_ring = replace(H100.nccl, version=(2, 29, 2), protocols=tuple((p, replace(s, hop_latency_us=hops) if p is Protocol.SIMPLE else s) for p, s in H100.nccl.protocols))
    assert nccl.latency_us(slow_ring, OpKind.ALL_REDUCE, lay, Algo.NVLS_TREE, Protocol.SIMPLE) == times[(2, 29, 2)]


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=24), channels=st.integers(1, 40), size=st.sampled_from([1.0, 3.0, 12345.678]))
def test_tree_edges_are_every_channels_chain_and_tree_summed(sizes, channels, size):
    """`tree_edges` works out one period of channels (the trees' parity, each node's head)
    and counts how often each edge recurs: the loads, their order and every float are those
    of a walk over every channel that adds size / channels to each edge it uses."""
    nodes, first = [], 0
    for m in sizes:
        nodes.append(tuple(range(first, first + m)))
        first += m + 1  # ranks of a node need not be contiguous with the next's
    lay = nccl.Layout(tuple(r for node in nodes for r in node), tuple(nodes), HopKind.NVLINK, 1.0, 1.0, True, False)
    want: dict[tuple[int, int], float] = {}

    def add(a: int, b: int) -> None:
        want[(a, b)] = want.get((a, b), 0.0) + size / channels
        want[(b, a)] = want.get((b, a), 0.0) + size / channels

    for c in range(channels):
        heads = []
        for members in nodes:
            order = [members[(c + i) % len(members)] for i in range(len(members))]
            heads.append(order[0])
            for a, b in zip(order, order[1:]):
                add(a, b)
        for i, parent in enumerate(nccl._binary_tree(len(nodes), second=c % 2 == 1)):
            if parent >= 0:
                add(heads[i], heads[parent])
    assert list(nccl.tree_edges(lay, channels, size).items()) == list(want.items())
