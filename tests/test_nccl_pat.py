"""NCCL's PAT (Parallel Aggregated Trees): all_gather and reduce_scatter with one GPU a node."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from commdsl.calibrate.nccl_logs import read_logs
from commdsl.calibrate.nccl_tests import Run, bench_machine, choice, simulate_run
from commdsl.dsl import load_schedule_text
from commdsl.errors import ScheduleError
from commdsl.ir import Algo, OpKind, Protocol
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.machine.nccl import parse_nccl_version
from commdsl.sim import nccl, simulate
from commdsl.sim.fabric import Fabric
from commdsl.sim.nccl_flows import NcclFlows

H100 = resolve_machine("dgx-h100")


def one_a_node(machine, nodes: int, version: tuple[int, int, int] | None = (2, 29, 2)) -> tuple[NcclFlows, nccl.Layout]:
    """NCCL's view of a group of GPU 0 of each of `nodes` DGX nodes."""
    m = machine.with_nodes(nodes)
    cfg = replace(m.nccl, version=version)
    f = NcclFlows(Fabric(m, 8 * nodes), cfg)
    return f, f.layout(tuple(8 * k for k in range(nodes)))


def test_ncclS_table_rates_pat_with_its_own_figures():
    # tuning.cc: PAT latency = baseLat 8 + log2(nodes) x interLat / 3.5 + nRanks x 2.8, its
    # interLat the tree's network figure (one GPU a node: 14 us Simple); its bandwidth the
    # tree graph's x 0.75, not converted to algorithm bandwidth.
    f, lay = one_a_node(H100, 10)
    table = nccl.nccl_table(f.cfg, OpKind.ALL_GATHER, lay)
    lat, bw = table[(Algo.PAT, Protocol.SIMPLE)]
    assert lat == pytest.approx(8 + 3 * 14 / 3.5 + 10 * 2.8)
    assert not any(a is Algo.PAT and p is not Protocol.SIMPLE for a, p in table)  # Simple only
    nch, intra, inter = nccl._graph(f.cfg, lay, Algo.TREE)
    assert bw == pytest.approx(nch * inter * 0.75)
    # 2.23 took the graph's whole bandwidth; before 2.23 there was no PAT.
    f23, lay23 = one_a_node(H100, 10, (2, 23, 4))
    assert nccl.nccl_table(f23.cfg, OpKind.ALL_GATHER, lay23)[(Algo.PAT, Protocol.SIMPLE)][1] == pytest.approx(nch * inter)
    f22, lay22 = one_a_node(H100, 10, (2, 22, 3))
    assert (Algo.PAT, Protocol.SIMPLE) not in nccl.nccl_table(f22.cfg, OpKind.ALL_GATHER, lay22)


def test_nccl_runs_pat_only_with_one_gpu_a_node_for_all_gather_and_reduce_scatter():
    f, lay = one_a_node(H100, 10)
    size = 10 * 4096
    for kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER):
        assert nccl.select(f.cfg, kind, lay, size).algo is Algo.PAT
        assert nccl.select(f.cfg, kind, lay, 1 << 30).algo is Algo.RING  # the ring's bandwidth wins large
    assert Algo.PAT not in {a for a, _ in nccl.nccl_table(f.cfg, OpKind.ALL_REDUCE, lay)}
    # Two GPUs a node, one node, an older release or a plugin that leaves the unpacking to
    # the GPU (GPUDirect-TCPX): no PAT, as ncclPatEnable says.
    m = H100.with_nodes(10)
    two = NcclFlows(Fabric(m, 80), m.nccl).layout(tuple(8 * k + j for k in range(10) for j in (0, 1)))
    one_node = NcclFlows(Fabric(H100, 8), H100.nccl).layout(tuple(range(8)))
    f22, lay22 = one_a_node(H100, 10, (2, 22, 3))
    offload = replace(f.cfg, net_device_offload=True)
    for cfg, layout in ((f.cfg, two), (H100.nccl, one_node), (f22.cfg, lay22), (offload, lay)):
        assert nccl.select(cfg, OpKind.ALL_GATHER, layout, size).algo is not Algo.PAT
    with pytest.raises(ScheduleError, match=r"NCCL has no pat for all_gather on 20 ranks over 10 node\(s\)"):
        nccl.select(f.cfg, OpKind.ALL_GATHER, two, size, Algo.PAT)


def test_pat_is_timed_by_ncclS_figures_over_the_machines_tree_level():
    f, lay = one_a_node(H100, 16)
    level = 14.0 * f.cfg.tree_net_scale + f.cfg.net_message_us(Protocol.SIMPLE)
    want = 8 + 4 * level / 3.5 + 16 * 2.8
    assert nccl.latency_us(f.cfg, OpKind.ALL_GATHER, lay, Algo.PAT, Protocol.SIMPLE) == pytest.approx(want)
    slow = replace(f.cfg, tree_net_scale=2.0)  # a calibrated tree level moves PAT's levels with it
    assert nccl.latency_us(slow, OpKind.ALL_GATHER, lay, Algo.PAT, Protocol.SIMPLE) == pytest.approx(want + 4 * 14.0 / 3.5)


def test_pat_loads_each_nic_as_a_ring_does():
    f, lay = one_a_node(H100, 8)
    size = 64 << 20
    pat = dict(f.coflow(OpKind.ALL_GATHER, lay.ranks, size, None, Algo.PAT, Protocol.SIMPLE).channel_bytes)
    ring = dict(f.coflow(OpKind.ALL_GATHER, lay.ranks, size, None, Algo.RING, Protocol.SIMPLE).channel_bytes)
    assert pat and pat.keys() == ring.keys()
    for c, b in pat.items():
        assert b == pytest.approx(ring[c])
    assert sum(pat.values()) > 0


AG_PAT = """
name: pat
world: 32
streams: [s]
groups:
  heads: [0, 8, 16, 24]
program: |
  if rank % 8 == 0:
      all_gather x {size} group=heads {algo}
"""


def test_a_schedule_runs_pat_on_one_gpu_a_node_and_both_networks_agree():
    m = H100.with_nodes(4)

    def run(algo: str, network: str = "flow") -> float:
        return simulate(load_schedule_text(AG_PAT.format(size="1MiB", algo=algo), "pat.yaml"), m, network=network).makespan_us

    chosen = run("")  # at 1 MiB over four nodes NCCL's table takes PAT
    assert chosen == pytest.approx(run("algo=pat"), rel=1e-12)
    assert chosen != pytest.approx(run("algo=ring"), rel=1e-3)
    assert run("", "analytic") == pytest.approx(chosen, rel=5e-3)
    # forced where NCCL has no PAT: an error at the op, naming what it has
    bad = AG_PAT.replace("heads: [0, 8, 16, 24]", "heads: [0, 1, 16, 17]").replace("rank % 8 == 0", "rank % 16 < 2")
    with pytest.raises(ScheduleError, match=r"pat.yaml:\d+:\d+: .*NCCL has no pat for all_gather on 4 ranks over 2 node"):
        simulate(load_schedule_text(bad.format(size="1MiB", algo="algo=pat"), "pat.yaml"), m)


def test_a_machine_file_says_its_plugin_leaves_unpacking_to_the_gpu():
    base = Path(H100.source).read_text()
    m = load_machine_text(base.replace("\nnccl:\n", "\nnccl:\n  net_device_offload: true\n"), "tcpx.yaml")
    assert m.nccl.net_device_offload and not H100.nccl.net_device_offload
    run = Run(OpKind.ALL_GATHER, 4, nccl_version=parse_nccl_version("2.29.2"), ranks_per_node=1)
    assert choice(bench_machine(H100, run), run, 1 << 20).algo is Algo.PAT
    assert choice(bench_machine(m, run), run, 1 << 20).algo is not Algo.PAT


def _ag_log(times: dict[int, float]) -> str:
    """nccl-tests' all_gather_perf on 4 nodes, one GPU each, NCCL 2.29.2."""
    lines = ["# nccl-tests version 2.17.8 nccl-headers=22902 nccl-library=22902", "# Collective test starting: all_gather_perf",
             "# nThread 1 nGpus 1 minBytes 65536 maxBytes 16777216 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
             "#", "# Using devices"]  # fmt: skip
    lines += [f"#  Rank  {r} Group  0 Pid {1000 + r} on node{r} device  0 [0000:18:00] NVIDIA H100 80GB HBM3" for r in range(4)]
    lines += ["#", "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)"]  # fmt: skip
    for size, t in times.items():
        algbw = size / t / 1e3
        busbw = algbw * 3 / 4
        row = f"{t:.2f} {algbw:.2f} {busbw:.2f} 0"
        lines.append(f"{size:12d} {size // 16:12d} float none -1 {row} {row}")
    lines += ["# Avg bus bandwidth    : 1", "#", "# Collective test concluded: all_gather_perf", ""]
    return "\n".join(lines)


def test_calibrating_on_a_log_nccl_ran_with_pat_keeps_the_closed_form_the_simulator(tmp_path):
    from commdsl.calibrate.nccl_tests import _parameters, _points, _predict, fit

    run = Run(OpKind.ALL_GATHER, 4, nccl_version=parse_nccl_version("2.29.2"), ranks_per_node=1)
    sizes = [1 << k for k in range(16, 25)]
    log = tmp_path / "ag_1gpu.log"
    log.write_text(_ag_log({s: 1.2 * simulate_run(H100, run, s) for s in sizes}))
    logs = read_logs([str(log)])
    runs = [Run.of(x) for x in logs]
    assert (runs[0].ranks, runs[0].ranks_per_node) == (4, 1)
    # On the base machine NCCL runs PAT at some of the sizes: the closed form times them
    # as the simulator does.
    points = _points(H100, H100, logs, runs)
    assert any(p.choice[0] is Algo.PAT for p in points)
    for p, c in zip(points, _predict(points, _parameters(H100))):
        assert simulate_run(H100, runs[p.log], int(p.size)) == pytest.approx(c, rel=1e-3), (p.size, p.choice)
    # and so on the fitted machine, whatever it runs
    fitted = fit(H100, Path(H100.source).read_text(), logs, runs, [str(log)])
    points = _points(fitted.machine, H100, logs, runs)
    closed = _predict(points, {**_parameters(H100), **fitted.values})
    for p, c in zip(points, closed):
        assert simulate_run(fitted.machine, runs[p.log], int(p.size)) == pytest.approx(c, rel=1e-3), (p.size, p.choice)
