"""Execution semantics of the simulator: streams, events, handles, host blocking,
comm queues, batches, compute rates, traces."""

from __future__ import annotations

import json
from array import array

import pytest

from commdsl.dsl import load_schedule_text
from commdsl.errors import MachineError, ScheduleError
from commdsl.ir import OpKind
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.sim import simulate
from commdsl.sim.entities import entry_typecode, op_index_typecode
from commdsl.timeline import SpanRole, Timeline


def machine(launch_us: float = 0.0, comm_launch_us: float = 0.0, latency_us: float = 0.0, bw: str = "100",
            host_bw: str = "10", membw: str = "1000", extra: str = "", kind: str = "gpu"):  # fmt: skip
    return load_machine_text(
        f"""
name: m
devices: 16
device: {{name: test, peak_tflops: {{fp32: 10, bf16: 20}}, memory_bandwidth_gb_per_s: {membw}, sm_count: 4, kind: {kind}}}
kernel_launch_us: {launch_us}
comm_launch_us: {comm_launch_us}
host_link: {{latency_us: 0, bandwidth_gb_per_s: {host_bw}}}
transports:
  nccl: {{latency_us: {latency_us}, bandwidth_gb_per_s: {bw}}}
  gloo: {{latency_us: {latency_us}, bandwidth_gb_per_s: {bw}}}
{extra}""",
        "m.yaml",
    )


def sched(program: str, world: str = "1", streams: str = "[a, b]", extra: str = "", **overrides):
    body = "\n".join("  " + line for line in program.strip("\n").splitlines())
    text = f"name: t\nworld: {world}\nstreams: {streams}\n{extra}\nprogram: |\n{body}\n"
    return load_schedule_text(text, "t.yaml", {k: str(v) for k, v in overrides.items()})


def spans(result):
    """op name -> (start, end) of its EXEC span, for rank 0 unless names repeat per rank."""
    out = {}
    for g, op in enumerate(result.raw.ops):
        out[(op.rank, op.name)] = (result.raw.start[g], result.raw.end[g])
    return out


def times(result, rank: int = 0):
    return {name: se for (r, name), se in spans(result).items() if r == rank}


# ---- streams ------------------------------------------------------------------------


def test_copy_and_compute_on_two_streams_overlap_and_take_the_max():
    # 1 GB over a 10 GB/s host link = 100 ms; compute 60 ms.
    overlapped = simulate(sched("copy X 1GB from host on b\ncompute C 60ms on a"), machine())
    serial = simulate(sched("copy X 1GB from host on a\ncompute C 60ms on a"), machine())
    assert overlapped.makespan_us == pytest.approx(max(100_000, 60_000))
    assert serial.makespan_us == pytest.approx(100_000 + 60_000)


def test_ops_on_one_stream_run_in_issue_order_back_to_back():
    r = simulate(sched("compute A 1ms\ncompute B 2ms\ncompute C 3ms"), machine())
    assert times(r) == {"A": (0, 1000), "B": (1000, 3000), "C": (3000, 6000)}


def test_launch_overhead_delays_issue_but_host_runs_ahead():
    r = simulate(sched("compute A 1ms\ncompute B 1ms on b\ncompute C 1ms"), machine(launch_us=5))
    t = times(r)
    assert t["A"] == (5, 1005)
    assert t["B"] == (10, 1010)  # issued second, on another stream
    assert t["C"] == (1005, 2005)  # issued at 15us, waits for A
    issue = [s for s in r.timeline.spans if s.role is SpanRole.ISSUE]
    assert [(s.start_us, s.end_us) for s in issue] == [(0, 5), (5, 10), (10, 15)]


def test_event_orders_streams_without_blocking_the_host():
    r = simulate(sched("compute A 3ms on a\nrecord done on a\nwait done on b\ncompute B 1ms on b\nhost H 1ms"), machine())
    t = times(r)
    assert t["B"] == (3000, 4000)
    assert t["H"] == (0, 1000)  # the host is not blocked by the event wait


def test_synchronize_blocks_the_host_until_streams_drain():
    r = simulate(sched("compute A 3ms on a\ncompute B 1ms on b\nsynchronize\nhost H 1ms"), machine())
    assert times(r)["H"] == (3000, 4000)
    r = simulate(sched("compute A 3ms on a\ncompute B 1ms on b\nsynchronize b\nhost H 1ms"), machine())
    assert times(r)["H"] == (1000, 2000)


def test_host_work_delays_later_issues():
    r = simulate(sched("host prep 2ms\ncompute A 1ms"), machine())
    assert times(r)["A"] == (2000, 3000)


# ---- compute rates --------------------------------------------------------------------


def test_compute_time_from_flops_bytes_and_explicit_duration():
    r = simulate(sched("compute F 10GFLOP\ncompute G 10GFLOP dtype=bf16\ncompute M bytes=2GB\ncompute D 7us flops=1TFLOP"), machine())
    t = times(r)
    assert t["F"][1] - t["F"][0] == pytest.approx(1000.0)  # 1e10 / 10 TFLOP/s
    assert t["G"][1] - t["G"][0] == pytest.approx(500.0)  # bf16 at 20 TFLOP/s
    assert t["M"][1] - t["M"][0] == pytest.approx(2000.0)  # 2 GB / 1000 GB/s
    assert t["D"][1] - t["D"][0] == pytest.approx(7.0)  # explicit duration wins


def test_roofline_takes_the_slower_of_flops_and_bytes():
    r = simulate(sched("compute F 10GFLOP bytes=4GB"), machine())
    assert times(r)["F"][1] == pytest.approx(4000.0)


def test_missing_compute_rate_is_a_machine_error():
    with pytest.raises(MachineError, match="no fp64 compute rate.*fp32, bf16"):
        simulate(sched("compute F 1GFLOP dtype=fp64"), machine())


def test_missing_transport_is_a_machine_error():
    with pytest.raises(MachineError, match="no 'memcpy' transport"):
        prog = "if rank == 0:\n    send x 1MiB to 1 transport=memcpy\nelse:\n    recv x 1MiB from 0 transport=memcpy"
        simulate(sched(prog, world="2"), machine())


def test_a_memcpy_collective_is_a_schedule_error():
    with pytest.raises(ScheduleError, match=r"all_reduce x on rank 0: transport=memcpy copies point to point only") as e:
        simulate(sched("all_reduce x 1MiB transport=memcpy", world="2"), resolve_machine("h100-nvlink"))
    assert e.value.loc is not None and e.value.loc.line == 6  # the statement in sched()'s file


# ---- comm queues ----------------------------------------------------------------------

TWO_GROUPS = "groups:\n  g1: [0, 1]\n  g2: [0, 1]\n"


def test_two_collectives_on_one_group_never_overlap():
    # 100 MB all_reduce on 2 ranks at 100 GB/s: 2*(1)/2 * 1e8 / 1e5 = 1000 us each.
    r = simulate(sched("h1 = all_reduce x 100MB group=g1 on a\nh2 = all_reduce y 100MB group=g1 on b\nwait h1\nwait h2",
                       world="2", extra=TWO_GROUPS), machine())  # fmt: skip
    for rank in (0, 1):
        t = times(r, rank)
        assert t["x"] == (0, 1000)
        assert t["y"] == (1000, 2000)


@pytest.mark.parametrize("network,end", [("analytic", 1000), ("flow", 2000)])
def test_collectives_on_different_groups_may_overlap(network, end):
    # Alone each takes 1000 us; overlapped on the flow network they share both ranks'
    # links, so each gets half the bandwidth (the analytic network ignores contention).
    r = simulate(sched("h1 = all_reduce x 100MB group=g1 on a\nh2 = all_reduce y 100MB group=g2 on b\nwait h1\nwait h2",
                       world="2", extra=TWO_GROUPS), machine(), network)  # fmt: skip
    for rank in (0, 1):
        t = times(r, rank)
        assert t["x"] == (0, end)
        assert t["y"] == (0, end)


def test_async_comm_waits_for_prior_stream_work_and_wait_orders_the_stream():
    prog = "compute A 2ms\nh = all_reduce x 100MB\ncompute B 1ms\nwait h\ncompute C 1ms"
    r = simulate(sched(prog, world="2"), machine())
    t = times(r)
    assert t["x"] == (2000, 3000)  # starts after A (issuing stream's earlier work)
    assert t["B"] == (2000, 3000)  # overlaps the all_reduce
    assert t["C"] == (3000, 4000)  # after the wait


def test_synchronous_collective_blocks_its_stream_only():
    r = simulate(sched("all_reduce x 100MB on a\ncompute A 1ms on a\ncompute B 1ms on b", world="2"), machine())
    t = times(r)
    assert t["A"] == (1000, 2000)
    assert t["B"] == (0, 1000)


def test_early_member_waits_inside_its_kernel():
    prog = "if rank == 1:\n    compute late 5ms\nall_reduce x 100MB"
    r = simulate(sched(prog, world="2"), machine())
    assert times(r, 0)["x"] == (0, 6000)  # active from 0, data moves at 5 ms
    assert times(r, 1)["x"] == (5000, 6000)
    # The critical path goes through the late member: its compute, its x, then rank 0's x.
    assert [r.op_at(g).id for g in r.critical_path] == ["1:0", "1:1", "0:0"]


def test_wait_on_host_blocks_the_host():
    prog = "h = all_reduce x 100MB\nwait h on host\nhost H 1ms"
    r = simulate(sched(prog, world="2"), machine())
    assert times(r)["H"] == (1000, 2000)


def test_gloo_synchronous_send_blocks_the_host():
    prog = ("if rank == 0:\n    send x 100MB to 1 transport=gloo\n    host H 1ms\n"
            "else:\n    compute late 3ms\n    recv x 100MB from 0 transport=gloo")  # fmt: skip
    r = simulate(sched(prog, world="2"), machine())
    # The send moves data once the recv is active at 3 ms, 1 ms at 100 GB/s; H follows.
    assert times(r, 0)["x"] == (0, 4000)
    assert times(r, 0)["H"] == (4000, 5000)
    nccl = simulate(sched(prog.replace(" transport=gloo", ""), world="2"), machine())
    assert times(nccl, 0)["H"] == (0, 1000)  # an NCCL send blocks the stream, not the host


@pytest.mark.parametrize("first, second", [("gloo", "gloo"), ("gloo", "nccl"), ("nccl", "gloo")])
def test_gloo_synchronous_batch_blocks_the_host(first, second):
    prog = f"""
if rank == 0:
    batch:
        isend a 100MB to 1 transport={first}
        irecv b 100MB from 1 transport={second}
    host H 1ms
else:
    compute late 3ms
    batch:
        isend b 100MB to 0 transport={second}
        irecv a 100MB from 0 transport={first}
"""
    r = simulate(sched(prog, world="2"), machine())
    # A batch holding any gloo op blocks the calling thread until the batch is done (a
    # transfer at a time: 1 ms each at 100 GB/s once rank 1 arrives at 3 ms); H follows.
    done = max(times(r, 0)["a"][1], times(r, 0)["b"][1])
    assert done > 3000
    assert times(r, 0)["H"] == (done, done + 1000)
    nccl = simulate(sched(prog.replace(" transport=gloo", " transport=nccl"), world="2"), machine())
    assert times(nccl, 0)["H"] == (0, 1000)  # an NCCL batch holds the stream, not the host


def test_batched_p2p_activates_as_a_unit():
    prog = """
if rank == 0:
    batch:
        isend a 100MB to 1
        irecv b 100MB from 1
else:
    batch:
        isend b 100MB to 0
        irecv a 100MB from 0
compute after 1ms
"""
    r = simulate(sched(prog, world="2"), machine())
    for rank in (0, 1):
        t = times(r, rank)
        assert t["a"] == (0, 1000) and t["b"] == (0, 1000)
        assert t["after"] == (1000, 2000)  # a handle-less batch is synchronous


def test_send_recv_match_fifo_per_channel():
    prog = "if rank == 0:\n    send a 100MB to 1\n    send b 200MB to 1\nelse:\n    recv a 100MB from 0\n    recv b 200MB from 0"
    r = simulate(sched(prog, world="2"), machine(latency_us=10))
    assert times(r, 1)["a"] == (0, 1010)
    assert times(r, 1)["b"] == (1010, 3020)
    assert [(f.src_op, f.dst_op) for f in r.timeline.flows] == [("0:0", "1:0"), ("0:1", "1:1")]


# ---- outputs --------------------------------------------------------------------------


def test_trace_has_tracks_args_flows_and_nccl_names(tmp_path):
    prog = "compute F 1ms on a\nif rank == 0:\n    send x 1MiB to 1 on b\nelse:\n    recv x 1MiB from 0 on b\nall_reduce g 4MiB on a"
    r = simulate(sched(prog, world="2"), machine(launch_us=3, comm_launch_us=9))
    path = tmp_path / "trace.json"
    r.timeline.write(path, r.program.streams)
    data = json.loads(path.read_text())
    names = {(e["pid"], e["args"]["name"]) for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    for rank in (0, 1):
        assert {(rank, "host"), (rank, "stream a"), (rank, "stream b"), (rank, "comm:world")} <= names
    xs = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert all("op_id" in e["args"] and "kind" in e["args"] for e in xs)
    ar = next(e for e in xs if e["args"]["kind"] == "all_reduce" and e["args"]["role"] == "exec")
    # No NCCL model on this machine, so no protocol choice: NCCL's compiled kernel's name (..._LL).
    assert ar["name"] == "ncclDevKernel_AllReduce_Sum_f32_RING_LL" and "proto" not in ar["args"]
    assert ar["args"]["Collective name"] == "allreduce" and ar["args"]["Group size"] == 2
    send = next(e for e in xs if e["args"]["kind"] == "send" and e["args"]["role"] == "exec")
    assert send["name"] == "ncclDevKernel_SendRecv"
    assert [e["ph"] for e in data["traceEvents"] if e.get("cat") == "flow"] == ["s", "f"]
    back = Timeline.read(path)
    assert back.exec_spans().keys() == r.timeline.exec_spans().keys()
    assert back.makespan_us == pytest.approx(r.makespan_us)


def test_same_input_gives_byte_identical_trace(tmp_path):
    prog = "for i in range(4):\n    h = all_reduce x[i] 8MiB on b\n    compute F[i] 1ms on a\n    wait h on a"
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for p in (a, b):
        r = simulate(sched(prog, world="4"), machine(launch_us=2.5, comm_launch_us=7.1, latency_us=3.3))
        r.timeline.write(p, r.program.streams)
    assert a.read_bytes() == b.read_bytes()


def test_every_op_has_exactly_one_exec_span():
    prog = "compute A 1ms\nrecord e\nwait e on b\nh = all_reduce x 1MiB\nwait h\nsynchronize\nhost H 1us"
    r = simulate(sched(prog, world="2"), machine(launch_us=1))
    exec_ids = [s.op_id for s in r.timeline.spans if s.role is SpanRole.EXEC]
    assert sorted(exec_ids) == sorted(op.id for op in r.raw.ops)
    kinds = {s.kind for s in r.timeline.spans}
    assert {OpKind.WAIT_EVENT.value, OpKind.SYNCHRONIZE.value, OpKind.HOST.value} <= kinds


def test_batch_over_two_groups_activates_when_it_heads_both_queues():
    # Rank 0's batch touches g1 and g2; g2's queue first runs an all_reduce (1 ms).
    prog = """
h = all_reduce warm 100MB group=g2 on b
if rank == 0:
    batch:
        isend x 100MB to 1 group=g1
        isend y 100MB to 1 group=g2
else:
    recv x 100MB from 0 group=g1
    recv y 100MB from 0 group=g2
wait h
"""
    r = simulate(sched(prog, world="2", extra=TWO_GROUPS), machine())
    t0, t1 = times(r, 0), times(r, 1)
    assert t0["warm"] == (0, 1000)
    assert t0["x"][0] == 1000 and t0["y"][0] == 1000  # both wait for g2's queue, then start together
    assert t1["x"] == (0, 2000)  # rank 1's recv is active early, waits inside its kernel
    # Rank 1's synchronous recv x holds its stream until 2 ms, so recv y starts then.
    assert t1["y"] == (2000, 3000) and t0["y"] == (1000, 3000) and t0["x"] == (1000, 2000)


def test_every_bundled_schedule_simulates_without_deadlock():
    from commdsl.dsl import load_schedule
    from commdsl.machine import resolve_machine
    from commdsl.resources import bundled_schedules

    for name in bundled_schedules():
        result = simulate(load_schedule(name), resolve_machine("h100-nvlink"))
        assert result.makespan_us > 0, name
        assert len(result.timeline.exec_spans()) == result.program.num_ops, name


def test_per_op_arrays_hold_every_op_number_of_the_program():
    # 4-byte entries while they fit: an op number (or -1), and a stream entry (g * 4 + tag).
    for n in (1, 2**20, 2**29 - 1, 2**29, 2**31 - 1, 2**31, 2**33):
        assert array(op_index_typecode(n), [n - 1, -1])[0] == n - 1
        assert array(entry_typecode(n), [4 * (n - 1) + 3])[0] == 4 * (n - 1) + 3
    assert op_index_typecode(1000) == "i" and entry_typecode(1000) == "I"  # entries are never negative


def test_the_engines_timeout_is_simpys_own_event_in_simpys_order():
    # network.timeout writes SimPy's queue as Environment.schedule does (it reads its
    # internals, as the engine reads env._now): it must stay the same event, at the same
    # time, priority and id as env.timeout's, and fire in the same order, on the SimPy
    # release installed. A SimPy that changes those internals fails here, not in a result.
    import simpy

    from commdsl.sim.network import timeout

    fired: dict[str, list] = {"simpy": [], "ours": []}
    envs = {name: simpy.Environment(initial_time=5.0) for name in fired}
    for name, env in envs.items():
        for delay, value in ((3.0, "a"), (0.0, "b"), (3.0, "c"), (1.5, "d")):
            if name == "simpy":
                env.timeout(delay, value).callbacks.append(lambda ev, name=name: fired[name].append((ev.env.now, ev.value)))
            else:
                timeout(env, delay, value, lambda ev, name=name: fired[name].append((ev.env.now, ev.value)))
    assert [(t, p, eid, type(ev), ev._delay, ev.ok) for t, p, eid, ev in sorted(envs["simpy"]._queue)] == \
           [(t, p, eid, type(ev), ev._delay, ev.ok) for t, p, eid, ev in sorted(envs["ours"]._queue)]  # fmt: skip
    for env in envs.values():
        env.run()
    assert fired["ours"] == fired["simpy"] == [(5.0, "b"), (6.5, "d"), (8.0, "a"), (8.0, "c")]
    with pytest.raises(ValueError, match="Negative delay"):
        timeout(envs["ours"], -1.0, None, lambda ev: None)
