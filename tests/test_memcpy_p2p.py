"""memcpy between GPUs and NCCL through host memory (docs/simulator.md, "memcpy").

memcpy runs on its stream and the GPUs' copy engines, never in a comm queue; a copy
staged through host memory is one pipelined flow over both legs, at its pipeline's rate
or the slower leg's; copy engines limit how many copies a GPU runs; NCCL between GPUs
without peer access goes through host memory, a communicator's sends to one peer in
order; compute slows by the SMs NCCL kernels hold and their memory traffic. The last
part holds the findings of the forum post the `pcie-nvlink-pairs` preset comes from on
the bundled `memcpy_vs_nccl` schedule.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import commdsl
from commdsl.dsl import load_schedule_text
from commdsl.errors import DeadlockError, MachineError
from commdsl.ir import Transport
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.sim import check_deadlock, simulate

# Four GPUs without peer access on one socket: staged copies at 4 GB/s each (their
# pipeline), PCIe links at 6 GB/s per direction; no latencies, so times are bytes / rate.
STAGED = """
name: staged
device: {{name: t, peak_tflops: {{fp32: 1}}, memory_bandwidth_gb_per_s: 1000, sm_count: 10}}
kernel_launch_us: 0
comm_launch_us: 0
host_link: {{latency_us: 0, bandwidth_gb_per_s: 6}}
transports:
  nccl: {{latency_us: 0, bandwidth_gb_per_s: 100, staged: {{latency_us: 0, bandwidth_gb_per_s: 1}}}}
  memcpy: {{latency_us: 0, bandwidth_gb_per_s: 100, staged: {{latency_us: 0, bandwidth_gb_per_s: 4}}}}
topology:
  gpus_per_node: 4
  vertices: {{cpu0: cpu}}
  links:
    - {{kind: pcie, bandwidth_gb_per_s: 6, latency_us: 0, between: [[gpu0, cpu0], [gpu1, cpu0], [gpu2, cpu0]]}}
    - {{kind: pcie, bandwidth_gb_per_s: {gpu3_gb_per_s}, latency_us: 0, between: [[gpu3, cpu0]]}}
  peer_access: {peer_access}
{extra}
"""

S = 120_000_000  # bytes: 30 ms at 4 GB/s, 20 ms at 6, 40 ms at 3


def staged(gpu3_gb_per_s: float = 6, peer_access: str = "[[gpu0, gpu1]]", extra: str = ""):
    return load_machine_text(STAGED.format(gpu3_gb_per_s=gpu3_gb_per_s, peer_access=peer_access, extra=extra), "staged.yaml")


def sched(body: str, world: int = 4, streams: str = "[s1, s2, s3]"):
    program = "\n".join("  " + line for line in body.strip("\n").splitlines())
    return load_schedule_text(f"name: t\nworld: {world}\nstreams: {streams}\nprogram: |\n{program}\n", "t.yaml")


def spans(result, rank: int | None = None) -> dict[str, tuple[float, float]]:
    """op name -> (start, end), of `rank`'s ops (every rank's: the last rank's wins)."""
    return {op.name: (result.raw.start[g], result.raw.end[g]) for g, op in enumerate(result.raw.ops) if rank in (None, op.rank)}


def took(result, name: str) -> float:
    start, end = spans(result)[name]
    return end - start


# ---- staged copies ---------------------------------------------------------------------------


def test_a_staged_copy_is_one_pipelined_flow_at_its_pipeline_rate():
    """Not store and forward (S/6 + S/6 = 40 ms): both legs in flight, at one copy's 4 GB/s."""
    r = simulate(sched(f"if rank == 0:\n    copy x {S}B to 2"), staged())
    assert spans(r)["x"] == pytest.approx((0, S / 4e3), rel=1e-12)


def test_a_staged_copy_runs_at_the_slower_legs_rate():
    r = simulate(sched(f"if rank == 0:\n    copy x {S}B to 3"), staged(gpu3_gb_per_s=2))
    assert took(r, "x") == pytest.approx(S / 2e3, rel=1e-12)


def test_a_staged_copy_writes_and_reads_host_memory():
    """With 6 GB/s of host memory, each byte written then read: at most 3 GB/s."""
    m = staged(extra="  host_memory_bandwidth_gb_per_s: 6")
    r = simulate(sched(f"if rank == 0:\n    copy x {S}B to 2"), m)
    assert took(r, "x") == pytest.approx(S / 3e3, rel=1e-12)
    assert {l.name for l in r.link_stats()} >= {"cpu0 memory", "gpu0->cpu0", "cpu0->gpu2"}


def test_two_streams_overlap_copies_that_one_stream_runs_in_turn():
    """GPU 0 to GPUs 2 and 3: on one stream 30 + 30 ms; on two streams both device->host
    legs share gpu0->cpu0 (3 GB/s each), the host->device legs run in parallel: 40 ms,
    sooner in total though each copy takes longer."""
    one = simulate(sched(f"if rank == 0:\n    copy a {S}B to 2 on s1\n    copy b {S}B to 3 on s1"), staged())
    assert spans(one)["a"] == pytest.approx((0, 30_000), rel=1e-12)
    assert spans(one)["b"] == pytest.approx((30_000, 60_000), rel=1e-12)
    two = simulate(sched(f"if rank == 0:\n    copy a {S}B to 2 on s1\n    copy b {S}B to 3 on s2"), staged())
    assert spans(two)["a"] == pytest.approx((0, 40_000), rel=1e-12)
    assert spans(two)["b"] == pytest.approx((0, 40_000), rel=1e-12)


def test_a_copy_between_gpus_with_peer_access_is_direct():
    r = simulate(sched(f"if rank == 0:\n    copy x {S}B to 1"), staged())
    assert took(r, "x") == pytest.approx(S / 6e3, rel=1e-12)  # gpu0 -> cpu0 -> gpu1 (the switch), unstaged: the links' rate


@pytest.mark.parametrize("body", [
    f"if rank == 0:\n    copy x {S}B to 2",
    f"if rank == 0:\n    copy x {S}B to 1",
    f"if rank == 0:\n    send x {S}B to 2 transport=memcpy\nif rank == 2:\n    recv x {S}B from 0 transport=memcpy",
    f"if rank == 0:\n    send x {S}B to 2\nif rank == 2:\n    recv x {S}B from 0",
    f"if rank == 0:\n    send x {S}B to 1\nif rank == 1:\n    recv x {S}B from 0",
])  # fmt: skip
def test_analytic_and_flow_agree_on_a_transfer_alone(body):
    m = resolve_machine("pcie-nvlink-pairs")
    flow, analytic = simulate(sched(body), m, "flow"), simulate(sched(body), m, "analytic")
    assert analytic.makespan_us == pytest.approx(flow.makespan_us, rel=1e-12)


# ---- memcpy runs on its stream ------------------------------------------------------------------


def test_memcpy_does_not_wait_in_the_groups_comm_queue():
    """Rank 0 starts an all_reduce that waits 5 ms for rank 1, then sends by memcpy on
    another stream: the memcpy moves at once (NCCL would queue it behind the all_reduce)."""
    body = f"""
if rank == 1:
    compute late 50ms on s3
    record done on s3
    wait done on s2
h = all_reduce g 1MB on s2
if rank == 0:
    send x {S}B to 1 transport=memcpy on s1
else:
    recv x {S}B from 0 transport=memcpy on s1
wait h
"""
    r = simulate(sched(body, world=2), staged())
    assert spans(r, rank=0)["x"] == pytest.approx((0, S / 6e3), rel=1e-12)
    assert spans(r, rank=0)["g"][1] >= 50_000


def test_a_memcpy_recv_holds_its_stream_until_the_data_arrives():
    body = f"""
if rank == 0:
    compute before 10ms on s1
    h = isend x {S}B to 1 transport=memcpy on s1
    compute after 1ms on s1
    wait h on s2
    compute waited 1ms on s2
else:
    recv x {S}B from 0 transport=memcpy on s1
    compute use 1ms on s1
"""
    r = simulate(sched(body, world=2), staged())
    t = spans(r)
    end = 10_000 + S / 6e3  # gpu0 and gpu1 have peer access: direct, at the links' rate
    assert spans(r, rank=0)["x"] == pytest.approx((10_000, end), rel=1e-12)
    assert spans(r, rank=1)["x"] == pytest.approx((0, end), rel=1e-12)  # active at once, waiting for the send
    assert t["after"][0] == pytest.approx(end, rel=1e-12)  # the copy holds its stream, even when asynchronous
    assert t["waited"][0] == pytest.approx(end, rel=1e-12)  # the handle orders another stream
    assert t["use"][0] == pytest.approx(end, rel=1e-12)  # and the recv holds the receiver's


def test_head_to_head_memcpy_sends_deadlock_with_a_clear_report():
    body = """
if rank == 0:
    send a 1MB to 1 transport=memcpy
    recv b 1MB from 1 transport=memcpy
else:
    send b 1MB to 0 transport=memcpy
    recv a 1MB from 0 transport=memcpy
"""
    with pytest.raises(DeadlockError, match="both blocked sending to each other on their streams") as e:
        check_deadlock(sched(body, world=2))
    assert "different streams" in e.value.hint


# ---- copy engines -------------------------------------------------------------------------------


def test_copy_engines_limit_the_copies_a_gpu_runs_at_once():
    body = f"if rank == 0:\n    copy a {S}B to 2 on s1\n    copy b {S}B to 3 on s2"
    one = simulate(sched(body), staged(extra="  copy_engines: 1"))
    assert spans(one)["a"] == pytest.approx((0, 30_000), rel=1e-12)
    assert spans(one)["b"] == pytest.approx((0, 60_000), rel=1e-12)  # active at once, moving once an engine frees
    two = simulate(sched(body), staged(extra="  copy_engines: 2"))
    assert spans(two)["b"] == pytest.approx((0, 40_000), rel=1e-12)


def test_a_staged_copy_holds_an_engine_of_its_destination_too():
    """gpu0 -> gpu2 and gpu1 -> gpu2, staged, one engine each: gpu2's engine runs them in
    turn; a direct copy gpu0 -> gpu1 needs only gpu0's."""
    staged_body = f"if rank == 0:\n    copy a {S}B to 2\nif rank == 1:\n    copy b {S}B to 2"
    r = simulate(sched(staged_body), staged(extra="  copy_engines: 1"))
    ends = sorted(end for start, end in spans(r).values())
    assert ends == pytest.approx([30_000, 60_000], rel=1e-12)
    direct_body = f"if rank == 0:\n    copy a {S}B to 1\nif rank == 2:\n    copy b {S}B to 1"
    r = simulate(sched(direct_body), staged(extra="  copy_engines: 1"))
    assert [f.start_us for f in r.flow_stats()] == [0.0, 0.0]  # gpu0's engine and gpu2's + gpu1's: no conflict


# ---- NCCL through host memory ----------------------------------------------------------------------


def nccl_sends(dests: tuple[int, int], batch: bool) -> str:
    """Rank 0 sends a and b (S/10 each) to `dests` by NCCL, in one batch or one by one."""
    size = f"{S // 10}B"
    if batch:
        sends = f"    h = batch:\n        isend a {size} to {dests[0]}\n        isend b {size} to {dests[1]}\n    wait h\n"
    else:
        sends = f"    send a {size} to {dests[0]}\n    send b {size} to {dests[1]}\n"
    recvs = "".join(f"if rank == {d}:\n    recv {n} {size} from 0\n" for n, d in zip("ab", dests))
    return "if rank == 0:\n" + sends + recvs


def test_nccl_runs_a_groups_sends_to_one_peer_in_order_even_in_a_batch():
    """Two isends to rank 2 in one batch: one after the other at the SHM rate (1 GB/s)."""
    r = simulate(sched(nccl_sends((2, 2), batch=True)), staged())
    assert spans(r, rank=0)["a"][1] == pytest.approx(12_000, rel=1e-12)
    assert spans(r, rank=0)["b"] == pytest.approx((0, 24_000), rel=1e-12)  # active with the batch, moving after a


@pytest.mark.parametrize("batch", [True, False])
def test_a_batch_to_two_peers_is_no_faster_than_plain_sends(batch):
    """To ranks 2 and 3 in a batch, both share gpu0's SHM channel (1 GB/s): the batch takes
    as long as the two sends one after the other."""
    assert simulate(sched(nccl_sends((2, 3), batch)), staged()).makespan_us == pytest.approx(24_000, rel=1e-12)


# ---- validation -------------------------------------------------------------------------------------


def test_memcpy_cannot_copy_between_nodes():
    body = "if rank == 0:\n    copy x 1MiB to 8"
    with pytest.raises(MachineError, match="copy x: .*memcpy cannot copy between nodes") as e:
        simulate(sched(body, world=16), resolve_machine("dgx-h100").with_nodes(2))
    assert e.value.loc is not None and e.value.loc.line == 6 and e.value.rank == 0


def test_a_machine_without_memcpy_cannot_run_a_peer_copy():
    m = staged()
    m = replace(m, transports=tuple((t, spec) for t, spec in m.transports if t is not Transport.MEMCPY))
    with pytest.raises(MachineError, match="no 'memcpy' transport, which copy x on rank 0 uses"):
        simulate(sched("if rank == 0:\n    copy x 1MiB to 2"), m)


# ---- compute beside NCCL and memcpy ---------------------------------------------------------------------


def test_compute_slows_by_the_sms_an_nccl_kernel_holds():
    """nccl_sms 2 of 10 SMs: compute runs 10/8 = 1.25x as long while the kernel is active
    (12 ms of NCCL send: 12 ms of it at 0.8, then the rest at full speed)."""
    m = staged(extra="  nccl_sms: 2")
    body = f"""
if rank == 0:
    send x {S // 10}B to 2 on s1
if rank == 2:
    recv x {S // 10}B from 0 on s1
if rank == 0:
    compute c 20ms on s2
    copy y {S}B to 3 on s3
    compute d 20ms on s3
"""
    r = simulate(sched(body), m)
    assert took(r, "c") == pytest.approx(12_000 + (20_000 - 12_000 * 0.8), rel=1e-9)
    assert took(r, "d") == pytest.approx(20_000, rel=1e-9)  # after a copy: nothing holds SMs


def test_memory_bound_compute_shares_memory_with_nccl_traffic():
    """dgx-h100: an all_reduce reads and writes about twice its bytes per unit of its
    uncontended time, so compute of bytes= runs bandwidth / (bandwidth - traffic) times
    longer while it moves; compute of FLOPs slows by the SMs of its channels instead."""
    m = resolve_machine("dgx-h100")
    assert m.nccl_sm_share()
    body = "h = all_reduce g 1GB on s1\ncompute M bytes=40GB on s2\ncompute F 20ms on s3\nwait h"
    r = simulate(sched(body, world=8), m)
    t = spans(r)
    transfer = r.network_model.records[0][0]
    memory = 3350e3  # bytes/us
    traffic = 2 * r.network_model.solo_rate(transfer)
    nominal = 2 * 40e9 / 2 / memory
    assert r.nominal_us[1] == pytest.approx(nominal, rel=1e-12)
    window = t["g"][1] - t["M"][0]
    assert took(r, "M") == pytest.approx(nominal + window * traffic / memory, rel=1e-9)
    channels = r.network_model.nccl.choose(r.raw.ops[0], tuple(range(8))).channels
    assert took(r, "F") == pytest.approx(20_000 + (t["g"][1] - t["F"][0]) * channels / 132, rel=1e-9)


def test_nccl_traffic_is_tracked_only_where_a_compute_op_is_bound_by_its_bytes():
    """Only compute of bytes= shares the memory with NCCL's traffic: a program without
    such an op does not report its transfers to the model, and comes out as it would
    with them reported (the factors they could change are none of its ops')."""
    from commdsl.sim.analytic import AnalyticNetwork
    from commdsl.sim.engine import Engine

    m = resolve_machine("dgx-h100")
    flops = sched("h = all_reduce g 1GB on s1\ncompute F 20ms on s2\ncompute G flops=2PFLOP on s3\nwait h", world=8)
    bytes_bound = sched("h = all_reduce g 1GB on s1\ncompute M bytes=40GB on s2\nwait h", world=8)
    runs = {}
    for name, program in (("flops", flops), ("bytes", bytes_bound)):
        for report in (False, True):
            engine = Engine(program, m, AnalyticNetwork, fold=False)
            assert engine.traffic == (name == "bytes") and engine.wiring.memory_bound == (name == "bytes")
            engine.traffic = engine.traffic or report
            raw = engine.run()
            runs[name, report] = [list(raw.start), list(raw.end), list(raw.cause)]
    assert runs["flops", False] == runs["flops", True]
    assert runs["flops", False][1] != [0.0] * len(runs["flops", False][1])  # (it ran)
    # The memory-bound op is slowed by the traffic: its end moves without the reports.
    engine = Engine(bytes_bound, m, AnalyticNetwork, fold=False)
    engine.traffic = False
    assert list(engine.run().end) != runs["bytes", True][1]


def test_a_measured_factor_replaces_the_sm_share():
    m = staged(extra="  nccl_sms: 2\ncomm_compute_slowdown: 2.0")
    assert not m.nccl_sm_share()
    body = f"if rank == 0:\n    send x {S // 10}B to 2 on s1\nif rank == 2:\n    recv x {S // 10}B from 0 on s1\nif rank == 0:\n    compute c 20ms on s2"
    assert took(simulate(sched(body), m), "c") == pytest.approx(12_000 + (20_000 - 6_000), rel=1e-9)


# ---- the forum post's findings on pcie-nvlink-pairs --------------------------------------------------


@pytest.fixture(scope="module")
def parts():
    """Per part of memcpy_vs_nccl on pcie-nvlink-pairs: (total ms, mean ms per transfer)."""
    r = simulate(commdsl.load("memcpy_vs_nccl"), resolve_machine("pcie-nvlink-pairs"))
    by: dict[int, list[tuple[float, float]]] = {}
    for g, op in enumerate(r.raw.ops):
        if op.rank == 0 and op.name[:2] in ("x[", "y["):
            by.setdefault(int(op.name[2:].split(",")[0]), []).append((r.raw.start[g], r.raw.end[g]))
    out = {p: ((max(e for _, e in s) - min(b for b, _ in s)) / 1e3, sum(e - b for b, e in s) / len(s) / 1e3) for p, s in by.items()}
    compute = {op.name: (r.raw.end[g] - r.raw.start[g]) / 1e3 for g, op in enumerate(r.raw.ops) if op.kind.value == "compute"}
    return out, compute


def test_overlapped_copies_finish_sooner_though_each_is_slower(parts):
    p, _ = parts
    one_stream, two_streams = p[1], p[2]
    assert two_streams[0] < 0.8 * one_stream[0]  # 109 ms vs 146 ms: three leg times for four
    assert two_streams[1] > 1.4 * one_stream[1]  # 21.8 ms vs 14.6 ms per copy


def test_memcpy_beats_nccl_over_pcie_by_a_wide_margin(parts):
    p, _ = parts
    assert p[3][0] > 2.5 * p[1][0]  # the post: almost 3x


def test_a_batch_is_no_faster_than_plain_sends_to_the_same_peers(parts):
    p, _ = parts
    assert p[4][0] >= 0.99 * p[3][0]


def test_nccl_overlap_slows_compute_and_memcpy_overlap_does_not(parts):
    _, compute = parts
    assert compute["with_memcpy"] == compute["compute_alone"]
    assert compute["with_nccl"] > compute["compute_alone"]
