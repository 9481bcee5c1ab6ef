"""LL128 across nodes only where NCCL enables it: GPUs near enough their NICs (tuning.cc
pEnable, `typeInter`), by generation and release."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from commdsl.errors import ScheduleError
from commdsl.ir import OpKind, Protocol
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.machine.nccl import NicPath
from commdsl.sim import nccl
from commdsl.sim.fabric import Fabric
from commdsl.sim.nccl_flows import NcclFlows, nic_paths

H100_TEXT = Path(resolve_machine("dgx-h100").source).read_text()
A100_TEXT = Path(resolve_machine("dgx-a100").source).read_text()
ON_SWITCHES = ("[nic0, pcie0], [nic1, pcie1], [nic2, pcie2], [nic3, pcie3],",
               "[nic4, pcie4], [nic5, pcie5], [nic6, pcie6], [nic7, pcie7],")  # fmt: skip


def nics_on_text(text: str, first: str, second: str, name: str) -> str:
    """The DGX machine file `text` with its NICs moved off the GPUs' PCIe switches: nic0-3 on
    CPU `first`, nic4-7 on CPU `second`."""
    for old in ON_SWITCHES:
        assert old in text, "the preset's NIC links moved: update this test"
    moved = text.replace(ON_SWITCHES[0], f"[nic0, {first}], [nic1, {first}], [nic2, {first}], [nic3, {first}],")
    moved = moved.replace(ON_SWITCHES[1], f"[nic4, {second}], [nic5, {second}], [nic6, {second}], [nic7, {second}],")
    return moved.replace("name: dgx-", f"name: {name}-")


def nics_on(text: str, first: str, second: str, name: str):
    """`nics_on_text`, loaded."""
    return load_machine_text(nics_on_text(text, first, second, name), f"{name}.yaml")


def table(machine, nodes: int, kind: OpKind = OpKind.ALL_GATHER, version=None, per_node: int = 8):
    m = machine.with_nodes(nodes)
    cfg = replace(m.nccl, version=version)
    g = m.topology.gpus_per_node
    flows = NcclFlows(Fabric(m, g * nodes), cfg)
    lay = flows.layout(tuple(g * k + j for k in range(nodes) for j in range(per_node)))
    return cfg, lay, nccl.nccl_table(cfg, kind, lay)


def protos(tab) -> set[Protocol]:
    return {p for _, p in tab}


def test_nic_paths_reads_how_each_gpu_reaches_its_nearest_nic():
    assert set(nic_paths(resolve_machine("dgx-h100").topology)) == {NicPath.PCIE_SWITCH}
    assert set(nic_paths(resolve_machine("gh200-quad").topology)) == {NicPath.C2C}  # Grace over NVLink-C2C
    assert set(nic_paths(nics_on(H100_TEXT, "cpu0", "cpu1", "phb").topology)) == {NicPath.CPU}
    # every NIC on the second socket: the first socket's GPUs cross the CPUs' link
    sys_paths = nic_paths(nics_on(H100_TEXT, "cpu1", "cpu1", "sys").topology)
    assert sys_paths == (NicPath.CPUS,) * 4 + (NicPath.CPU,) * 4


@pytest.mark.parametrize("text", [H100_TEXT, A100_TEXT], ids=["hopper", "ampere"])
def test_ll128_crosses_nodes_only_from_gpus_on_their_nics_pcie_switches(text):
    near = load_machine_text(text, "near.yaml")
    far = nics_on(text, "cpu0", "cpu1", "phb")
    for kind in (OpKind.ALL_GATHER, OpKind.ALL_REDUCE):
        assert Protocol.LL128 in protos(table(near, 2, kind)[2])
        assert Protocol.LL128 not in protos(table(far, 2, kind)[2])  # PHB: beyond LL128's reach
        assert Protocol.LL128 in protos(table(far, 1, kind)[2])  # nothing crosses the network
    # NCCL then never picks it, and an op that forces it is told what the machine has
    cfg, lay, _ = table(far, 4)
    assert {nccl.select(cfg, OpKind.ALL_GATHER, lay, 1 << k).proto for k in range(10, 31, 2)} <= {Protocol.LL, Protocol.SIMPLE}
    with pytest.raises(ScheduleError, match="NCCL has no ll128 for all_gather on 32 ranks over 4 node.*it has: .*ring/ll,.*"
                                            "LL128 does not cross the network where the GPUs reach their NICs through a CPU"):
        nccl.select(cfg, OpKind.ALL_GATHER, lay, 1 << 20, proto=Protocol.LL128)


def test_a_node_whose_best_gpu_is_near_a_nic_keeps_ll128():
    # Half the NICs on the GPUs' switches: NCCL's graph enters the node at those GPUs
    # (the others reach them over NVLink), so LL128 crosses the network; a group of
    # only far GPUs has no such door.
    half = load_machine_text(H100_TEXT.replace(ON_SWITCHES[1], "[nic4, cpu1], [nic5, cpu1], [nic6, cpu1], [nic7, cpu1],"), "half.yaml")
    assert Protocol.LL128 in protos(table(half, 2)[2])
    m = half.with_nodes(2)
    flows = NcclFlows(Fabric(m, 16), m.nccl)
    far_only = flows.layout(tuple(8 * k + j for k in range(2) for j in (4, 5, 6, 7)))
    assert far_only.nic_path is NicPath.CPU
    assert Protocol.LL128 not in protos(nccl.nccl_table(m.nccl, OpKind.ALL_GATHER, far_only))


def test_gh200_ll128_crosses_nodes_through_c2c_from_nccl_2_27():
    gh = resolve_machine("gh200-quad")
    assert Protocol.LL128 not in protos(table(gh, 2, OpKind.ALL_REDUCE, (2, 26, 2), 4)[2])  # C2C was PHB then
    for version in ((2, 27, 3), (2, 30, 7), None):
        assert Protocol.LL128 in protos(table(gh, 2, OpKind.ALL_REDUCE, version, 4)[2])
    assert Protocol.LL128 in protos(table(gh, 1, OpKind.ALL_REDUCE, (2, 26, 2), 4)[2])


def test_simulate_of_a_schedule_forcing_ll128_across_far_nics_fails_with_the_ops_line(tmp_path):
    machine = tmp_path / "far.yaml"
    machine.write_text(nics_on_text(H100_TEXT, "cpu0", "cpu1", "far").replace("nodes: 1", "nodes: 2"))
    sched = tmp_path / "ag.yaml"
    sched.write_text("name: ag\nworld: 16\nstreams: [s]\nprogram: |\n  all_gather x 16MiB proto=ll128\n")
    cmd = [sys.executable, "-m", "commdsl.cli", "simulate", str(sched), "--machine", str(machine)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "ag.yaml:5:3" in done.stderr and "NCCL has no ll128 for all_gather" in done.stderr
    assert "reach their NICs through a CPU" in done.stderr
    sched.write_text("name: ag\nworld: 16\nstreams: [s]\nprogram: |\n  all_gather x 16MiB\n")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
