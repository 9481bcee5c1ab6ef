"""`commdsl import kineto DIR -o job.yaml`: a job's real profiler traces become a schedule
that replays their step: it loads, checks, finishes, and simulated on a machine like the
traced one its makespan is the trace's step time."""

from __future__ import annotations

import json
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
    assert "holds the traces of ranks [0] of a 2-rank job; ranks [1] are missing" in err and "Traceback" not in err
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
    assert not [u for u in data["unmatched"] if "all_to_all" in u or "all_reduce" in u or "nccl" in u]
    # Measured starts count from the trace's step start, as predicted ones from the replay's.
    job = read_job(dlrm)
    t0 = min(t.step_start_us for t in job.ranks.values())
    starts = sorted(round(op["measured_start_us"], 3) for op in data["ops"] if op["kind"] in ("all_to_all", "all_reduce"))
    assert starts == sorted(round(c.start_us - t0, 3) for t in job.ranks.values() for c in t.comms)
