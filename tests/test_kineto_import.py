"""`commdsl import kineto DIR -o job.yaml`: a job's real profiler traces become a schedule
that replays their step: it loads, checks, finishes, and simulated on a machine like the
traced one its makespan is the trace's step time."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from commdsl.cli import main
from commdsl.dsl import load_schedule
from commdsl.interop.kineto_read import read_job
from commdsl.ir import OpKind

DATA = Path(__file__).parent / "data" / "kineto"
CPU = DATA / "cpu_gloo_1f1b"
GPU = DATA / "hta_ddp_a100"


@pytest.fixture(scope="module")
def replay(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("import") / "job.yaml"
    assert main(["import", "kineto", str(CPU), "-o", str(out)]) == 0
    return out


def test_the_replay_has_each_ranks_work_in_stream_order(replay):
    program = load_schedule(str(replay), {})
    job = read_job(CPU)
    assert program.world_size == 2
    for rank, trace in job.ranks.items():
        ops = program.ops[rank]
        computes = [op for op in ops if op.kind is OpKind.COMPUTE]
        # 1f1b's F and B (and its alloc/free ranges) with their measured durations, in order.
        names = [op.name for op in computes]
        assert [n for n in names if n.startswith(("F_", "B_"))] == [
            n.replace("[", "_").replace("]", "") + "[0]" for n in (r.name for r in trace.ranges) if n[:2] in ("F[", "B[")]
        f0 = next(op for op in computes if op.name == "F_0[0]")
        assert f0.duration_us == pytest.approx(next(r.duration_us for r in trace.ranges if r.name == "F[0]"), abs=1e-3)
        p2p = [op for op in ops if op.kind.is_p2p]
        assert len(p2p) == len(trace.comms) and {op.size_bytes for op in p2p} == {1 << 20}
        assert any(op.batch is not None for op in p2p)  # a send and a recv at once: batch_isend_irecv
        assert any(op.kind is OpKind.HOST for op in ops)  # the host gaps
    # gloo's CPU ranges have no launch calls: every gap is the stream's idle time.
    assert "# 0 of 48 ops are the host's time between launch calls" in replay.read_text()


def test_simulated_on_a_machine_like_the_traced_one_the_replay_takes_the_steps_time(replay, capsys):
    capsys.readouterr()
    assert main(["simulate", str(replay), "--machine", "cpu-loopback", "--json"]) == 0
    makespan_us = json.loads(capsys.readouterr().out)["makespan_us"]
    step_us = read_job(CPU).step_us
    assert abs(makespan_us - step_us) / step_us < 0.05, (makespan_us, step_us)


def test_stdout_without_o_and_the_step_option(capsys):
    assert main(["import", "kineto", str(CPU), "--step", "0", "--name", "step0"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("name: step0\n") and "Replays ProfilerStep#0" in text


def test_a_job_with_missing_ranks_is_refused_naming_them(capsys, tmp_path):
    assert main(["import", "kineto", str(GPU), "-o", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err
    assert "holds the traces of ranks [0] of a job of 2 ranks; ranks [1] are missing" in err and "Traceback" not in err
    assert not (tmp_path / "x.yaml").exists()


def test_a_step_with_nothing_in_it_is_refused_not_written_as_an_empty_schedule(capsys, tmp_path):
    """The ranks' traces hold the step's range and launch calls but no kernel, copy, comm
    or range in it: nothing to replay, said of the traces."""
    folder = tmp_path / "empty_step"
    folder.mkdir()
    for f in CPU.iterdir():
        data = json.loads(f.read_text())
        data["traceEvents"] = [e for e in data["traceEvents"] if e.get("ph") != "X" or str(e.get("name")).startswith("ProfilerStep#")]
        (folder / f.name).write_text(json.dumps(data))
    assert main(["import", "kineto", str(folder), "-o", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"{folder}: ProfilerStep#1 of the traces holds nothing to replay" in err, err
    assert not (tmp_path / "x.yaml").exists()


def test_a_folder_that_is_not_traces_is_a_clear_error(capsys, tmp_path):
    folder = tmp_path / "t"
    shutil.copytree(CPU, folder)
    (folder / "rank1.pt.trace.json").write_text((CPU / "rank1.pt.trace.json").read_text()[:1000])
    assert main(["import", "kineto", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "rank1.pt.trace.json is not a JSON profiler trace" in err and "truncated?" in err
    assert main(["import", "pipelining", str(folder / "rank0.pt.trace.json"), "--step", "1"]) == 2


def test_a_real_gpu_jobs_step_replays_within_5_percent(tmp_path, capsys):
    """HTA's ResNet trace (one V100): kernels named after their innermost range or their
    function, copies with their bytes, the host's gaps; simulated on an A100 machine (its
    compute is the trace's, only copies are modelled) it takes the step's time."""
    v100 = DATA / "hta_resnet_v100"
    out = tmp_path / "resnet.yaml"
    assert main(["import", "kineto", str(v100), "-o", str(out)]) == 0
    program = load_schedule(str(out), {})
    names = {op.name.split("[")[0] for op in program.ops[0] if op.kind is OpKind.COMPUTE}
    assert {"DistributedDataParallel_forward", "vectorized_elementwise_kernel", "volta_sgemm_64x64_nt"} <= names
    copies = [op for op in program.ops[0] if op.kind is OpKind.COPY]
    assert copies and all(op.size_bytes > 0 for op in copies)
    capsys.readouterr()
    assert main(["simulate", str(out), "--machine", "a100-nvlink", "--json"]) == 0
    makespan_us = json.loads(capsys.readouterr().out)["makespan_us"]
    step_us = read_job(v100).step_us
    assert abs(makespan_us - step_us) / step_us < 0.05, (makespan_us, step_us)


def test_a_real_8_rank_gpu_job_replays_and_compares_op_by_op(tmp_path, capsys):
    """PARAM's DLRM traces (8 V100s, NCCL all_to_all and all_reduce, tests/data/kineto):
    replayed on DGX A100 (no V100 preset; compute and host gaps are the trace's, the
    communication is small) within 5% of the step's time (docs/validation.md), and the
    replay's prediction compared against the traces pairs every comm op of every rank."""
    dlrm = DATA / "param_dlrm_v100"
    out, predicted = tmp_path / "dlrm.yaml", tmp_path / "predicted.json"
    assert main(["import", "kineto", str(dlrm), "-o", str(out)]) == 0
    program = load_schedule(str(out), {})
    for rank in range(8):
        comms = [op.kind for op in program.ops[rank] if op.kind.is_comm]
        assert comms.count(OpKind.ALL_TO_ALL) == 5 and comms.count(OpKind.ALL_REDUCE) == 3
    capsys.readouterr()
    assert main(["simulate", str(out), "--machine", "dgx-a100", "--json", "--trace", str(predicted)]) == 0
    makespan_us = json.loads(capsys.readouterr().out)["makespan_us"]
    step_us = read_job(dlrm).step_us
    assert abs(makespan_us - step_us) / step_us < 0.05, (makespan_us, step_us)
    capsys.readouterr()
    assert main(["compare", str(predicted), str(dlrm), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    compared = {op["op_id"] for op in data["ops"]}
    assert {op.id for r in range(8) for op in program.ops[r] if op.kind.is_comm} <= compared
    # compute and copies pair with the kernels and copies the import named them after
    assert {op.id for r in range(8) for op in program.ops[r] if op.kind in (OpKind.COMPUTE, OpKind.COPY)} <= compared
    assert data["unmatched"] == []
    assert not [u for u in data["unmatched"] if "all_to_all" in u or "all_reduce" in u or "nccl" in u]
    # Measured starts count from the trace's step start, as predicted ones from the replay's.
    job = read_job(dlrm)
    t0 = min(t.step_start_us for t in job.ranks.values())
    starts = sorted(round(op["measured_start_us"], 3) for op in data["ops"] if op["kind"] in ("all_to_all", "all_reduce"))
    assert starts == sorted(round(c.start_us - t0, 3) for t in job.ranks.values() for c in t.comms)


# A synthetic GPU trace whose host is the bottleneck: the framework spends GAP_US between
# launch calls of CALL_US each (the machine's kernel_launch_us below), every kernel runs
# KERNEL_US, and once the host blocks in cudaStreamSynchronize behind a long kernel.
CALL_US, GAP_US, KERNEL_US, LONG_US, KERNELS = 4.0, 50.0, 10.0, 2000.0, 40
LAUNCH_MACHINE = """
name: launches
devices: 1
device: {{name: test, peak_tflops: {{fp32: 10}}, memory_bandwidth_gb_per_s: 1000, sm_count: 4}}
kernel_launch_us: {launch}
comm_launch_us: 10
host_link: {{latency_us: 0, bandwidth_gb_per_s: 10}}
transports:
  nccl: {{latency_us: 0, bandwidth_gb_per_s: 100}}
"""


def _launch_trace(folder: Path) -> float:
    """Writes the trace (rank 0 of 1) into `folder`; returns its step's time in us."""
    events, host, device, correlation = [], 1000.0, 0.0, 100
    sync_after = KERNELS // 2
    for k in range(KERNELS):
        host += GAP_US
        duration = LONG_US if k == sync_after else KERNEL_US
        start = max(host + CALL_US + 2.0, device)  # the GPU takes it 2 us after the call ends
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": host,
                       "dur": CALL_US, "args": {"correlation": correlation}})  # fmt: skip
        events.append({"ph": "X", "cat": "kernel", "name": f"void k{k % 3}<float>(float*)", "pid": 0, "tid": 7, "ts": start,
                       "dur": duration, "args": {"correlation": correlation, "stream": 7}})  # fmt: skip
        host, device, correlation = host + CALL_US, start + duration, correlation + 1
        if k == sync_after:  # .item(): the host waits for the long kernel, then the framework goes on
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1, "tid": 1,
                           "ts": host + 1.0, "dur": device - host - 1.0, "args": {"correlation": correlation}})  # fmt: skip
            host, correlation = device, correlation + 1
    step_end = max(host, device)
    events.insert(0, {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 1000.0,
                      "dur": step_end - 1000.0, "args": {}})  # fmt: skip
    trace = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, "traceEvents": events}
    (folder / "rank0.pt.trace.json").write_text(json.dumps(trace))
    return step_end - 1000.0


def test_host_gaps_are_the_time_between_launch_calls_so_the_launch_is_counted_once(tmp_path):
    """The gap written is launch-to-launch less the call (the framework's own time; the
    synchronize's wait is written as `synchronize`, not as a gap), and simulated on a
    machine whose kernel_launch_us is the traced call the replay takes the step's time;
    a machine that launches slower is slower by its extra launch time on every kernel."""
    from commdsl.machine import load_machine_text
    from commdsl.sim import simulate

    folder = tmp_path / "t"
    folder.mkdir()
    step_us = _launch_trace(folder)
    out = tmp_path / "job.yaml"
    assert main(["import", "kineto", str(folder), "-o", str(out)]) == 0
    text = out.read_text()
    gaps = [float(x) for x in re.findall(r"host gap\[\d+\] ([\d.]+)us", text)]
    # Every kernel's gap is GAP_US; the framework's 1 us before the synchronize is one too;
    # the last, the host's time from its last launch to the end of the step's range.
    events = json.loads((folder / "rank0.pt.trace.json").read_text())["traceEvents"]
    last_call_end = max(e["ts"] + e["dur"] for e in events if e["name"] == "cudaLaunchKernel")
    tail = 1000.0 + step_us - last_call_end
    assert gaps == [GAP_US] * (KERNELS // 2 + 1) + [1.0] + [GAP_US] * (KERNELS - KERNELS // 2 - 1) + [tail], gaps
    assert text.count("synchronize s7") == 1
    assert f"{KERNELS} of {KERNELS} ops are the host's time between launch calls" in text
    program = load_schedule(str(out), {})
    same = simulate(program, load_machine_text(LAUNCH_MACHINE.format(launch=CALL_US), "m.yaml")).makespan_us
    assert abs(same - step_us) / step_us < 0.005, (same, step_us)  # counted twice: +40 x 4 us = +3.6%
    slower = simulate(program, load_machine_text(LAUNCH_MACHINE.format(launch=CALL_US + 5), "m.yaml")).makespan_us
    assert slower - same == pytest.approx(5.0 * KERNELS, abs=10.0)


def test_ops_are_issued_in_launch_order_not_device_order(tmp_path):
    """Kernel X is launched before Y but starts after it (its stream is busy with A): the
    replay's host issues A, X, Y as the traced host did, each after its framework time."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 1200, "args": {}}]
    for corr, (name, launch_ts, start, dur, stream) in enumerate(
            [("A", 50, 56, 1000, 7), ("X", 100, 1056, 10, 7), ("Y", 150, 156, 10, 9)]):  # fmt: skip
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": launch_ts,
                       "dur": CALL_US, "args": {"correlation": corr}})  # fmt: skip
        events.append({"ph": "X", "cat": "kernel", "name": f"void {name}()", "pid": 0, "tid": stream, "ts": start,
                       "dur": dur, "args": {"correlation": corr, "stream": stream}})  # fmt: skip
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "rank0.pt.trace.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    out = tmp_path / "job.yaml"
    assert main(["import", "kineto", str(folder), "-o", str(out)]) == 0
    body = out.read_text().split("program: |\n")[1].split("\n")
    assert [line.strip() for line in body if line.strip()] == [
        "if rank == 0:", "host gap[0] 50.000us", "compute A[0] 1000.000us on s7", "host gap[1] 46.000us",
        "compute X[0] 10.000us on s7", "host gap[2] 46.000us", "compute Y[0] 10.000us on s9",
        f"host gap[3] {1200 - 150 - CALL_US:.3f}us"]  # the host's time to the end of its step's range  # fmt: skip


def test_a_launch_call_without_a_duration_is_a_clear_error(tmp_path, capsys):
    folder = tmp_path / "t"
    folder.mkdir()
    _launch_trace(folder)
    path = folder / "rank0.pt.trace.json"
    trace = json.loads(path.read_text())
    del next(e for e in trace["traceEvents"] if e["name"] == "cudaLaunchKernel")["dur"]
    path.write_text(json.dumps(trace))
    assert main(["import", "kineto", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: an event ('cudaLaunchKernel') has no numeric 'dur'" in err and "Traceback" not in err
