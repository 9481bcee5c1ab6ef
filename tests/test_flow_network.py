"""The flow network: max-min sharing by hand, coflow collectives against the analytic
model and the step-by-step mode, host staging, interference (docs/simulator.md)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from commdsl.cli import main
from commdsl.dsl import load_schedule_text
from commdsl.ir import OpKind, Protocol
from commdsl.machine.nccl import HopKind
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.sim import simulate

BASE = """
name: star
device: {name: t, peak_tflops: {fp32: 1}, memory_bandwidth_gb_per_s: 1000, sm_count: 4}
kernel_launch_us: 0
comm_launch_us: 0
host_link: {latency_us: 0, bandwidth_gb_per_s: 10}
"""


def star(down_gb_per_s: tuple[float, ...] = (100, 100, 100, 100), link_latency_us: float = 0.0, nccl_latency_us: float = 0.0,
         extra: str = ""):  # fmt: skip
    """4 GPUs on one switch; GPU i's link has down_gb_per_s[i] per direction."""
    links = "\n".join(
        f"    - {{kind: nvlink, bandwidth_gb_per_s: {bw}, latency_us: {link_latency_us}, between: [[gpu{i}, sw]]}}"
        for i, bw in enumerate(down_gb_per_s)
    )
    return load_machine_text(
        BASE
        + f"""transports:
  nccl: {{latency_us: {nccl_latency_us}, bandwidth_gb_per_s: .inf}}
  memcpy: {{latency_us: 0, bandwidth_gb_per_s: .inf}}
{extra}
topology:
  gpus_per_node: 4
  vertices: {{sw: nvswitch, cpu0: cpu}}
  links:
{links}
    - {{kind: pcie, bandwidth_gb_per_s: 10, latency_us: 0, between: [[sw, cpu0]]}}
""",
        "star.yaml",
    )


def sched(body: str, world: int = 4, extra: str = ""):
    program = "\n".join("  " + line for line in body.strip("\n").splitlines())
    return load_schedule_text(f"name: t\nworld: {world}\nstreams: [a, b]\n{extra}\nprogram: |\n{program}\n", "t.yaml")


def ends(result) -> dict[str, float]:
    """op name -> end time (the last rank's, names are per transfer)."""
    return {op.name: result.raw.end[g] for g, op in enumerate(result.raw.ops)}


def spans(result) -> dict[str, tuple[float, float]]:
    return {op.name: (result.raw.start[g], result.raw.end[g]) for g, op in enumerate(result.raw.ops)}


P2P_PAIRS = """
if rank == {src}:
    send x 100MB to {dst}
if rank == {dst}:
    recv x 100MB from {src}
"""


# ---- max-min sharing by hand -------------------------------------------------------------


def test_one_flow_takes_latency_plus_size_over_bandwidth():
    # 5 us per step (NCCL) + two links of 1 us + 1e8 B at 100 GB/s (1e5 B/us).
    r = simulate(sched(P2P_PAIRS.format(src=0, dst=1)), star(link_latency_us=1.0, nccl_latency_us=5.0))
    assert ends(r)["x"] == pytest.approx(5 + 2 * 1 + 1000, rel=1e-12)


def test_two_flows_on_one_link_each_get_half():
    # 0 -> 2 and 1 -> 2 share sw -> gpu2: 50 GB/s each, 2000 us instead of 1000.
    body = """
if rank == 0:
    send x 100MB to 2
if rank == 1:
    send y 100MB to 2
if rank == 2:
    batch:
        irecv x 100MB from 0
        irecv y 100MB from 1
"""
    r = simulate(sched(body), star())
    assert ends(r)["x"] == pytest.approx(2000, rel=1e-12)
    assert ends(r)["y"] == pytest.approx(2000, rel=1e-12)


def test_flows_on_disjoint_links_do_not_affect_each_other():
    body = P2P_PAIRS.format(src=0, dst=1).replace("x 100MB", "x 100MB") + P2P_PAIRS.format(src=2, dst=3).replace("x 100MB", "y 100MB")
    r = simulate(sched(body), star())
    assert ends(r)["x"] == pytest.approx(1000, rel=1e-12)
    assert ends(r)["y"] == pytest.approx(1000, rel=1e-12)


def test_three_flows_with_different_bottlenecks_get_max_min_rates():
    """f1: 0->1 (200 MB), f2: 0->2 (60 MB), f3: 3->2 (60 MB); gpu2's link is 60 GB/s.
    Progressive filling: gpu2's downlink fills first at 30 GB/s each (f2, f3 frozen);
    gpu0's uplink then has 100 - 30 = 70 GB/s for f1. f2 and f3 end at 6e7 / 3e4 =
    2000 us, when f1 has moved 70e3 * 2000 = 1.4e8 B; alone it then gets 100 GB/s for
    the last 6e7 B: 600 us more, 2600 us in all."""
    body = """
if rank == 0:
    batch:
        isend f1 200MB to 1
        isend f2 60MB to 2
if rank == 1:
    recv f1 200MB from 0
if rank == 2:
    batch:
        irecv f2 60MB from 0
        irecv f3 60MB from 3
if rank == 3:
    send f3 60MB to 2
"""
    r = simulate(sched(body), star(down_gb_per_s=(100, 100, 60, 100)))
    e = ends(r)
    assert e["f2"] == pytest.approx(2000, rel=1e-12)
    assert e["f3"] == pytest.approx(2000, rel=1e-12)
    assert e["f1"] == pytest.approx(2600, rel=1e-12)


def test_a_transport_cap_limits_a_flow_below_its_links():
    # nccl caps one transfer at 40 GB/s on 100 GB/s links: 1e8 / 4e4 = 2500 us.
    text = """
if rank == 0:
    send x 100MB to 1
if rank == 1:
    recv x 100MB from 0
"""
    machine = load_machine_text(
        BASE + """transports:
  nccl: {latency_us: 0, bandwidth_gb_per_s: 40}
topology:
  gpus_per_node: 2
  vertices: {cpu0: cpu}
  links:
    - {kind: nvlink, bandwidth_gb_per_s: 100, latency_us: 0, between: [[gpu0, gpu1]]}
    - {kind: pcie, bandwidth_gb_per_s: 10, latency_us: 0, between: [[gpu0, cpu0], [gpu1, cpu0]]}
""",
        "cap.yaml",
    )
    assert ends(simulate(sched(text, world=2), machine))["x"] == pytest.approx(2500, rel=1e-12)


# ---- collectives as coflows -------------------------------------------------------------------

STATEMENTS = {
    "all_reduce": "all_reduce x size",
    "tree": "all_reduce x size algo=tree",
    "all_gather": "all_gather x size",
    "reduce_scatter": "reduce_scatter x size",
    "all_to_all": "all_to_all x size",
    "gather": "gather x size dst=0",
    "scatter": "scatter x size src=0",
    "broadcast": "broadcast x size src=n - 1",
    "reduce": "reduce x size dst=n // 2",
    "barrier": "barrier",
}


def one_op(n: int, statement: str, size: str = "48MiB"):
    return load_schedule_text(f"name: one\nparams: {{n: {n}, size: {size}}}\nworld: n\nstreams: [s]\nprogram: |\n  {statement}\n", "one.yaml")


def _time(program, machine, network: str) -> float:
    return max(simulate(program, machine, network).raw.end)


@pytest.mark.parametrize("n", (2, 3, 8))
@pytest.mark.parametrize("name", [k for k in STATEMENTS if k != "tree"])
def test_flow_equals_analytic_without_contention_on_a_machine_without_topology(name, n):
    """The implied topology (one link per rank per transport) gives the analytic times."""
    machine = resolve_machine("h100-nvlink")
    program = one_op(n, STATEMENTS[name])
    assert _time(program, machine, "flow") == pytest.approx(_time(program, machine, "analytic"), rel=1e-9)


@pytest.mark.parametrize("n", (2, 3, 8))
@pytest.mark.parametrize("name", list(STATEMENTS))
def test_flow_equals_analytic_without_contention_on_a_topology_without_nccls_model(name, n):
    """pcie-nvlink-pairs has a topology but no `nccl:`: a collective's pairs take their
    routes (NVLink within a pair, staged through host memory between pairs), in both
    networks alike, the slowest route capping it."""
    machine = resolve_machine("pcie-nvlink-pairs")
    program = one_op(n, STATEMENTS[name])
    assert _time(program, machine, "analytic") == pytest.approx(_time(program, machine, "flow"), rel=1e-9)


def test_tree_all_reduce_on_8_ranks_equals_analytic():
    # Every rank is inner node of one tree (2 children) and leaf of the other: 2S out, 2S in.
    machine = resolve_machine("h100-nvlink")
    program = one_op(8, STATEMENTS["tree"])
    assert _time(program, machine, "flow") == pytest.approx(_time(program, machine, "analytic"), rel=1e-9)


def test_ring_all_reduce_on_an_uncontended_ring_matches_analytic():
    # dgx-h100 (NCCL's model): a 1 GiB ring all_reduce runs Simple on 24 rings; both
    # networks time its coflow alone, after the 10 us comm launch.
    machine = resolve_machine("dgx-h100")
    program = one_op(8, "all_reduce x size algo=ring", "1GiB")
    flow, analytic = _time(program, machine, "flow"), _time(program, machine, "analytic")
    assert flow == pytest.approx(analytic, rel=1e-9)
    # By hand: launch + Simple's base + 14 NVLink hops + 2 * 7/8 * 2^30 B at 0.962 of 370.8 GB/s.
    simple = machine.nccl.protocol(Protocol.SIMPLE)
    latency = simple.base_latency_us + 14 * simple.hop_us(HopKind.NVLINK)
    assert flow == pytest.approx(10 + latency + 2 * 7 / 8 * 2**30 / (simple.efficiency * 370.8e3), rel=1e-9)


@pytest.mark.parametrize("statement", ["all_reduce x size", "all_gather x size", "broadcast x size src=0", "all_to_all x size"])
def test_step_by_step_mode_agrees_with_the_coflow_uncontended(statement):
    machine = resolve_machine("dgx-h100")
    program = one_op(8, statement, "64MiB")
    assert _time(program, machine, "flow-steps") == pytest.approx(_time(program, machine, "flow"), rel=1e-9)


SHARED_UPLINK = """
name: two-switches
device: {name: t, peak_tflops: {fp32: 1}, memory_bandwidth_gb_per_s: 1000, sm_count: 4}
kernel_launch_us: 0
comm_launch_us: 0
host_link: {latency_us: 0, bandwidth_gb_per_s: 10}
transports:
  nccl: {latency_us: 5, bandwidth_gb_per_s: .inf}
topology:
  gpus_per_node: 4
  vertices: {sw0: pcie_switch, sw1: pcie_switch, cpu0: cpu}
  links:
    - {kind: pcie, bandwidth_gb_per_s: 25, latency_us: 0, between: [[gpu0, sw0], [gpu1, sw0], [gpu2, sw1], [gpu3, sw1]]}
    - {kind: pcie, bandwidth_gb_per_s: 10, latency_us: 0, between: [[sw0, cpu0], [sw1, cpu0]]}
  peer_access: all
"""

TWO_RINGS = """
groups:
  left: [0, 2]
  right: [1, 3]
"""


@pytest.mark.parametrize("network", ["flow", "flow-steps"])
def test_two_all_reduces_on_disjoint_groups_sharing_a_pcie_uplink(network):
    """Groups {0, 2} and {1, 3}: each ring edge crosses sw0 <-> cpu0 <-> sw1 (10 GB/s).
    A 2-rank ring all_reduce moves S = 100 MB each way in 2 steps of 5 us: alone
    10 + 1e8 / 1e4 = 10010 us; both at once share each uplink direction, 5 GB/s each:
    10 + 1e8 / 5e3 = 20010 us."""
    machine = load_machine_text(SHARED_UPLINK, "two.yaml")
    alone = simulate(sched("if rank == 0 or rank == 2:\n    all_reduce x 100MB group=left", extra=TWO_RINGS), machine, network)
    assert max(alone.raw.end) == pytest.approx(10010, rel=1e-12)
    both = simulate(sched("if rank == 0 or rank == 2:\n    all_reduce x 100MB group=left\nelse:\n    all_reduce y 100MB group=right",
                          extra=TWO_RINGS), machine, network)  # fmt: skip
    e = ends(both)
    assert e["x"] == pytest.approx(20010, rel=1e-12)
    assert e["y"] == pytest.approx(20010, rel=1e-12)


def test_a_64_rank_ring_all_reduce_is_a_handful_of_events():
    program = one_op(64, "all_reduce x size", "64MiB")
    r = simulate(program, resolve_machine("h100-nvlink"))
    assert r.network_model.events == 2  # one flow: its start and its end
    stepped = simulate(program, resolve_machine("h100-nvlink"), "flow-steps")
    assert stepped.network_model.events == 2 * 64 * 126
    assert max(stepped.raw.end) == pytest.approx(max(r.raw.end), rel=1e-9)


def test_nccl_like_algorithm_choice_and_override():
    machine = resolve_machine("dgx-h100").with_nodes(2)

    def algo(statement: str, size: str) -> str:
        r = simulate(one_op(16, statement, size), machine)
        return {f.algo.value for f in r.flow_stats()}.pop()

    assert algo("all_reduce x size", "4KiB") == "tree"  # latency-bound across nodes: log steps
    assert algo("all_reduce x size algo=ring", "4KiB") == "ring"  # the op's choice wins
    one_node = simulate(one_op(8, "all_reduce x size", "4KiB"), resolve_machine("dgx-h100"))
    assert {f.algo.value for f in one_node.flow_stats()} == {"ring"}  # NCCL keeps rings inside a node


def test_without_nccls_model_both_networks_choose_and_time_an_all_reduce_across_nodes_alike():
    """Two DGX H100 nodes without `nccl:`: the textbook algorithms on the routes. Across
    nodes an all_reduce takes the faster of ring and tree alone on the links, in the
    analytic network as in the flow network."""
    machine = dataclasses.replace(resolve_machine("dgx-h100").with_nodes(2), nccl=None)
    chosen = {}
    for size in ("4KiB", "256MiB"):
        program = one_op(16, "all_reduce x size", size)
        flow, analytic = simulate(program, machine), simulate(program, machine, "analytic")
        chosen[size] = {f.algo.value for f in flow.flow_stats()}
        assert {f.algo.value for f in analytic.flow_stats()} == chosen[size]
        assert max(analytic.raw.end) == pytest.approx(max(flow.raw.end), rel=1e-9)
    assert chosen["4KiB"] == {"tree"}  # latency-bound across nodes: log steps, not the ring's 2(n-1)


# ---- transports on pcie-nvlink-pairs ------------------------------------------------------------


def test_copy_between_an_nvlink_pair_is_far_faster_than_across_pcie():
    machine = resolve_machine("pcie-nvlink-pairs")
    body = "if rank == 0:\n    send x 80MB to {d} transport=memcpy\nif rank == {d}:\n    recv x 80MB from 0 transport=memcpy"
    nvlink = ends(simulate(sched(body.format(d=1)), machine))["x"]
    pcie = ends(simulate(sched(body.format(d=2)), machine))["x"]
    assert nvlink == pytest.approx(5 + 10 + 1 + 8e7 / 50.85e3, rel=1e-12)  # launch, then direct at 50.85 GB/s
    # Staged: one pipelined flow over both legs at one copy's staged rate, 20 us + 2 links.
    assert pcie == pytest.approx(5 + 20 + 2 + 8e7 / 4.4e3, rel=1e-12)
    assert pcie > 10 * nvlink


def test_nccl_without_peer_access_is_staged_and_capped():
    # NCCL's SHM path: one pipelined flow over both legs, capped at 1.47 GB/s, 20 us per step.
    machine = resolve_machine("pcie-nvlink-pairs")
    body = "if rank == 0:\n    send x 13MB to 2\nif rank == 2:\n    recv x 13MB from 0"
    assert ends(simulate(sched(body), machine))["x"] == pytest.approx(10 + 20 + 2 + 1.3e7 / 1.47e3, rel=1e-12)


# ---- interference ----------------------------------------------------------------------------


@pytest.mark.parametrize("transport,end", [("nccl", 12000), ("memcpy", 10000)])
def test_compute_slows_while_an_nccl_kernel_runs_and_not_for_memcpy(transport, end):
    """Slowdown 2: a 400 MB send at 100 GB/s takes 4000 us; a 10 ms compute overlapped
    with it does 2000 us of work in those 4000 us, then 8000 us alone: 12000 us. memcpy
    uses copy engines: 10000 us."""
    machine = star(extra="comm_compute_slowdown: 2.0")
    body = f"""
if rank == 0:
    h = isend x 400MB to 1 transport={transport} on b
    compute C 10ms on a
    wait h
if rank == 1:
    recv x 400MB from 0 transport={transport} on b
"""
    r = simulate(sched(body), machine)
    assert ends(r)["x"] == pytest.approx(4000, rel=1e-12)
    c = spans(r)["C"]
    assert c == pytest.approx((0, end), rel=1e-12)
    assert (r.nominal_us != {}) == (transport == "nccl")


def test_slowdown_factor_defaults_to_the_sm_share_nccl_takes():
    m = resolve_machine("dgx-h100")
    assert m.contention.comm_compute_slowdown is None
    assert m.contention.compute_slowdown() == pytest.approx(132 / (132 - 32))
    assert resolve_machine("h100-nvlink").contention.compute_slowdown() == 1.0


# ---- outputs ---------------------------------------------------------------------------------


def test_memcpy_vs_nccl_on_pcie_nvlink_pairs_reports_transfers_links_and_slowed_compute(capsys, tmp_path):
    trace = tmp_path / "t.json"
    args = ["simulate", "memcpy_vs_nccl", "-p", "copies=4", "-p", "msg=16MB", "-p", "t_compute=10ms", "--machine", "pcie-nvlink-pairs"]
    assert main([*args, "--json", "--flows", "--trace", str(trace)]) == 0
    data = json.loads(capsys.readouterr().out)
    by = {(t["transport"], t["kind"]): t for t in data["transfers"]}
    assert by[("memcpy", "copy")]["mean_us"] * 2 < by[("nccl", "send")]["mean_us"]  # memcpy well ahead
    slowed = [c["name"] for c in data["slowed"]]
    assert len(slowed) == 1 and slowed[0].startswith("with_nccl ")  # never with_memcpy
    assert data["links"][0]["name"] == "gpu0->cpu0"  # every transfer leaves GPU 0 through host memory
    assert data["flows"] and {"ops", "kind", "transport", "algo", "bytes", "start_us", "end_us", "bottleneck"} <= set(data["flows"][0])
    events = json.loads(trace.read_text())["traceEvents"]
    util = [e["args"]["value"] for e in events if e["ph"] == "C" and e["name"] == "link gpu0->cpu0 util"]
    assert max(util) == 1.0 and util[-1] == 0.0
    copies = [e for e in events if e["ph"] == "X" and e["name"] == "Memcpy PtoP (Device -> Device)"]
    assert copies and all(e["args"]["dst rank"] in (2, 3) for e in copies)  # one-sided copies on their streams
    assert main([*args, "--links", "4", "--gantt", "never"]) == 0
    out = capsys.readouterr().out
    assert "busiest links" in out and "gpu0->cpu0" in out and "gpu0 shm out" in out
    assert "compute slowed by comm kernels" in out and "with_nccl" in out


def test_flow_stats_name_the_bottleneck():
    machine = resolve_machine("pcie-nvlink-pairs")
    r = simulate(sched("if rank == 0:\n    send x 13MB to 2\nif rank == 2:\n    recv x 13MB from 0"), machine)
    (f,) = r.flow_stats()
    assert f.kind is OpKind.SEND and f.bottleneck == "gpu0 shm out" and f.links == 4  # NCCL's SHM path binds
    r = simulate(sched("if rank == 0:\n    copy x 13MB to 2"), machine)
    (f,) = r.flow_stats()
    assert f.kind is OpKind.COPY and f.bottleneck == "gpu0->cpu0" and f.links == 2
