"""Topology in machine files: presets, validation errors with file:line:col, routing,
implied topology and calibrated per-collective overrides."""

from __future__ import annotations

import pytest

import commdsl

from commdsl.cli import main
from commdsl.dsl import load_schedule_text
from commdsl.errors import MachineError
from commdsl.ir import OpKind, Transport
from commdsl.machine import load_machine_text, preset_names, resolve_machine
from commdsl.machine.model import LinkKind
from commdsl.sim import simulate
from commdsl.sim.fabric import Fabric

GOOD = """\
name: two
device: {name: t, peak_tflops: {fp32: 1}, memory_bandwidth_gb_per_s: 100, sm_count: 8}
kernel_launch_us: 0
comm_launch_us: 0
host_link: {latency_us: 0, bandwidth_gb_per_s: 10}
transports:
  nccl: {latency_us: 5, bandwidth_gb_per_s: 100}
topology:
  nodes: 1
  gpus_per_node: 2
  vertices: {sw: pcie_switch, cpu0: cpu, nic0: nic}
  links:
    - kind: pcie
      bandwidth_gb_per_s: 25
      latency_us: 0.5
      between: [[gpu0, sw], [gpu1, sw], [sw, cpu0], [nic0, sw]]
    - kind: network
      bandwidth_gb_per_s: 50
      latency_us: 2
      between: [[nic0, network]]
  peer_access: all
  nccl_sms: 2
"""


def test_presets_with_topologies():
    assert {"dgx-h100", "dgx-a100", "pcie-nvlink-pairs", "cpu-loopback"} <= set(preset_names())
    h = resolve_machine("dgx-h100")
    assert h.num_devices == 8 and h.topology.nodes == 1
    assert h.with_nodes(8).num_devices == 64
    pairs = resolve_machine("pcie-nvlink-pairs").topology
    assert pairs.peers(0, 1) and pairs.peers(6, 7) and not pairs.peers(1, 2) and not pairs.peers(0, 4)
    assert resolve_machine("cpu-loopback").topology is None  # implied star: one loopback link per process


def test_a_good_file_loads_and_devices_come_from_the_topology():
    m = load_machine_text(GOOD, "two.yaml")
    assert m.num_devices == 2 and m.topology.gpus_per_node == 2
    assert m.contention.compute_slowdown() == pytest.approx(8 / 6)


@pytest.mark.parametrize(
    "old,new,message,line,col",
    [
        ("[gpu1, sw]", "[gpu2, sw]", "unknown link end 'gpu2'", 16, 30),
        ("[nic0, sw]", "[nic0, switch]", "unknown link end 'switch'", 16, 60),
        ("bandwidth_gb_per_s: 25", "bandwidth_gb_per_s: -25", "topology.links[0].bandwidth_gb_per_s must be greater than 0, got -25", 14, 27),
        ("kind: pcie", "kind: pci", "topology.links[0].kind: unknown kind 'pci'", 13, 13),
        ("{sw: pcie_switch,", "{sw: pcie_swich,", "unknown kind 'pcie_swich'", 11, 18),
        ("[gpu0, sw], [gpu1, sw]", "[gpu0, sw], [gpu0, sw]", "gpu0 and sw are linked twice", 16, 29),
        ("[gpu0, sw], [gpu1, sw]", "[gpu0, sw], [gpu1, gpu1]", "a link joins two different vertices", 16, 29),
        ("peer_access: all", "peer_access: [[gpu0, gpu7]]", "'gpu7' is not a GPU of the node", 21, 24),
        ("nccl_sms: 2", "nccl_sms: 8", "topology.nccl_sms (8) must be less than device.sm_count (8)", 22, 13),
        ("  nodes: 1\n", "  nodes: 0\n", "topology.nodes must be at least 1, got 0", 9, 10),
        ("vertices: {sw:", "vertices: {gpu1:", "'gpu1' is reserved", 11, 14),
        ("bandwidth_gb_per_s: 50\n", "bandwidth_gb_per_s: 50\n      line_rate_gb_per_s: 40\n",
         "topology.links[1].line_rate_gb_per_s (40) is below its bandwidth_gb_per_s (50)", 19, 27),
    ],
)
def test_topology_errors_name_file_line_col(old, new, message, line, col, machine_error):
    assert old in GOOD
    machine_error(GOOD.replace(old, new, 1), "two.yaml", message, line, col)


def test_disconnected_devices_are_an_error():
    with pytest.raises(MachineError, match="gpu1 is not connected to gpu0") as info:
        load_machine_text(GOOD.replace("[gpu1, sw], ", ""), "two.yaml")
    assert info.value.loc.line == 9  # the topology mapping
    with pytest.raises(MachineError, match="gpu0 has no path to host memory"):
        load_machine_text(GOOD.replace("[sw, cpu0], ", ""), "two.yaml")
    with pytest.raises(MachineError, match="2 nodes but no link reaches 'network'"):
        load_machine_text(GOOD.replace("  nodes: 1\n", "  nodes: 2\n").replace("[[nic0, network]]", "[[nic0, cpu0]]"), "two.yaml")


def test_devices_must_match_the_topology():
    with pytest.raises(MachineError, match="devices is 4 but the topology has 1 x 2 = 2") as info:
        load_machine_text("devices: 4\n" + GOOD, "two.yaml")
    assert (info.value.loc.line, info.value.loc.column) == (1, 10)


def test_bad_comm_compute_slowdown_and_collective_override():
    with pytest.raises(MachineError, match="comm_compute_slowdown must be at least 1.0"):
        load_machine_text(GOOD + "comm_compute_slowdown: 0.5\n", "two.yaml")
    bad = GOOD.replace("  nccl: {latency_us: 5, bandwidth_gb_per_s: 100}",
                       "  nccl: {latency_us: 5, bandwidth_gb_per_s: 100, collectives: {allreduce: {latency_us: 1, bandwidth_gb_per_s: 1}}}")  # fmt: skip
    with pytest.raises(MachineError, match="unknown collective 'allreduce'") as info:
        load_machine_text(bad, "two.yaml")
    assert info.value.loc.line == 7


def test_cli_reports_machine_errors_without_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("[gpu1, sw]", "[gpu9, sw]"))
    assert main(["simulate", "p2p", "--machine", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("machine error:") and f"{bad}:16:30" in err and "Traceback" not in err


def test_more_ranks_than_devices_and_memcpy_between_nodes(capsys):
    program = load_schedule_text("name: t\nworld: 16\nstreams: [s]\nprogram: |\n  all_reduce x 1MiB\n", "t.yaml")
    with pytest.raises(MachineError, match="1 node\\(s\\) x 8 devices = 8, but the schedule has 16 ranks") as info:
        simulate(program, resolve_machine("dgx-h100"))
    assert "--nodes 2" in info.value.hint
    assert simulate(program, resolve_machine("dgx-h100").with_nodes(2)).makespan_us > 0
    copy = load_schedule_text(
        "name: t\nworld: 16\nstreams: [s]\nprogram: |\n  if rank == 0:\n    send x 1MiB to 8 transport=memcpy\n"
        "  if rank == 8:\n    recv x 1MiB from 0 transport=memcpy\n", "c.yaml")  # fmt: skip
    with pytest.raises(MachineError, match="memcpy cannot copy between nodes"):
        simulate(copy, resolve_machine("dgx-h100").with_nodes(2))
    assert main(["simulate", "p2p", "--machine", "h100-nvlink", "--nodes", "2"]) == 2
    assert "--nodes needs a machine with a topology" in capsys.readouterr().err


def test_nodes_of_a_machine_without_nics_or_topology_are_an_error_not_a_traceback(tmp_path, capsys):
    """A node with no link to `network` cannot be repeated: its nodes could not reach each
    other (the route search found no path and raised a KeyError). The API says so too."""
    program = tmp_path / "x.yaml"
    program.write_text("name: t\nworld: 16\nstreams: [s]\nprogram: |\n  if rank == 0:\n    send x 1MiB to 8\n"
                       "  if rank == 8:\n    recv x 1MiB from 0\n")  # fmt: skip
    for preset in ("pcie-nvlink-pairs", "pcie-rtx4090"):
        assert main(["simulate", str(program), "--machine", preset, "--nodes", "2"]) == 1
        err = capsys.readouterr().err
        assert f"machine error: machine {preset}: 2 nodes, but its node has no link to 'network' (no NIC)" in err
        assert "Traceback" not in err
    assert main(["simulate", str(program), "--machine", "pcie-nvlink-pairs", "--nodes", "1"]) == 1  # 16 ranks, 8 GPUs
    assert "--nodes 2" not in capsys.readouterr().err
    with pytest.raises(MachineError, match="machine h100-nvlink has no topology"):
        commdsl.simulate(str(program), resolve_machine("h100-nvlink"), nodes=2)
    with pytest.raises(MachineError, match="nodes must be at least 1, got 0"):
        resolve_machine("dgx-h100").with_nodes(0)


def test_routes_prefer_nvlink_stage_without_peer_access_and_use_the_gpus_own_nic():
    f = Fabric(resolve_machine("pcie-nvlink-pairs"), 8)
    assert f.describe(f.route(0, 1, Transport.MEMCPY)) == "gpu0 -> gpu1"
    r = f.route(0, 5, Transport.MEMCPY)
    assert r.staged and len(r.legs) == 2 and f.describe(r) == "gpu0 -> cpu0 -> cpu1 -> gpu5"
    nccl = f.route(0, 2, Transport.NCCL)
    assert nccl.spec.bandwidth_gb_per_s == 1.47  # NCCL's staged (SHM) cap
    # ... and it crosses the GPUs' SHM channels, which every staged NCCL transfer of a GPU shares.
    assert [f.names[c] for c in nccl.channels] == ["gpu0 shm out", "gpu0->cpu0", "cpu0->gpu2", "gpu2 shm in"]
    assert f.describe(nccl) == "gpu0 -> cpu0 -> gpu2"
    assert not any(f.kinds[c] is LinkKind.SHM for c in f.route(0, 2, Transport.MEMCPY).channels)  # copies have no proxy
    assert f.route(0, 1, Transport.GLOO).staged  # gloo always goes through host memory
    dgx = Fabric(resolve_machine("dgx-h100").with_nodes(2), 16)
    assert dgx.describe(dgx.route(0, 3, Transport.NCCL)) == "n0.gpu0 -> n0.nvswitch -> n0.gpu3"
    assert dgx.describe(dgx.route(5, 13, Transport.NCCL)) == "n0.gpu5 -> n0.pcie5 -> n0.nic5 -> network -> n1.nic5 -> n1.pcie5 -> n1.gpu5"
    star = Fabric(resolve_machine("h100-nvlink"), 4)
    assert star.describe(star.route(0, 3, Transport.NCCL)) == "rank0 -> nccl -> rank3"



@pytest.mark.parametrize("preset", ["dgx-h100", "dgx-a100", "gh200-quad"])
def test_routes_on_a_large_cluster_are_the_two_node_routes_moved_and_cost_two_nodes_to_search(preset):
    """Every route of a cluster is node 0's or node 0 -> 1's, moved: on 40 nodes the routes
    between nodes 37 and 38 (and inside 39) read as those of a 2-node machine, and the
    searches behind them reach the vertices of two nodes and the network, not of 40."""
    machine = resolve_machine(preset)
    g = machine.topology.gpus_per_node
    small, large = Fabric(machine.with_nodes(2), 2 * g), Fabric(machine.with_nodes(40), 40 * g)

    def local(text: str, *nodes: int) -> str:
        for new, old in enumerate(nodes):
            text = text.replace(f"n{old}.", f"n{new}.")
        return text

    for transport in (Transport.NCCL, Transport.GLOO):
        for i in range(g):
            for j in range(g):
                across = large.route(37 * g + i, 38 * g + j, transport)
                assert local(large.describe(across), 37, 38) == small.describe(small.route(i, g + j, transport))
                if i != j:
                    inside = large.route(39 * g + i, 39 * g + j, transport)
                    assert local(large.describe(inside), 39) == small.describe(small.route(i, j, transport))
    searched = [len(paths) for paths in large._trees.values()]
    assert searched and max(searched) <= len(small.vertex_names)

OVERRIDE = """
name: calibrated
devices: 4
device: {name: t, peak_tflops: {fp32: 1}, memory_bandwidth_gb_per_s: 100, sm_count: 1}
kernel_launch_us: 0
comm_launch_us: 0
host_link: {latency_us: 0, bandwidth_gb_per_s: 10}
transports:
  gloo:
    latency_us: 30
    bandwidth_gb_per_s: 3
    collectives:
      all_reduce: {latency_us: 100, bandwidth_gb_per_s: 1}
"""


@pytest.mark.parametrize("network", ["analytic", "flow", "flow-steps"])
def test_per_collective_overrides(network):
    """all_reduce on 4 ranks, 12 MB: 6 steps x 100 us + 2*3/4 * 1.2e7 B / 1 GB/s = 18600 us;
    an all_gather keeps the transport's parameters: 3 x 30 + 3/4 * 1.2e7 / 3e3 = 3090 us."""
    m = load_machine_text(OVERRIDE, "cal.yaml")
    assert m.collective_link(Transport.GLOO, OpKind.ALL_REDUCE).latency_us == 100

    def run(statement: str) -> float:
        program = load_schedule_text(f"name: t\nworld: 4\nstreams: [s]\nprogram: |\n  {statement} x 12MB transport=gloo\n", "t.yaml")
        return max(simulate(program, m, network).raw.end)

    assert run("all_reduce") == pytest.approx(18600, rel=1e-9)
    assert run("all_gather") == pytest.approx(3090, rel=1e-9)


def test_v1_files_keep_loading_as_topology_less_machines():
    for name in ("h100-nvlink", "a100-nvlink", "cpu-loopback"):
        m = resolve_machine(name)
        assert m.topology is None and m.collective_overrides == () and m.contention.compute_slowdown() == 1.0
