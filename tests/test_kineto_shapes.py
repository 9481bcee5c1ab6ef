"""Profiler traces as users have them: shapes of public Kineto traces (HTA's and
TraceLens's test data, PyTorch's own tb_plugin samples, AMD's ROCm traces) that `import
kineto` and `compare` once refused or misread. Each test writes a small trace of that
shape (the events as those traces hold them, trimmed to the few that matter) and checks
what the user gets: a schedule that replays the step, or a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commdsl.cli import main
from commdsl.dsl import load_schedule
from commdsl.interop.kineto_read import read_job
from commdsl.ir import OpKind


def _x(cat: str, name: str, ts: float, dur: float, tid: int | str = 1, **args) -> dict:
    """A complete ("X") event."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 1 if cat in ("user_annotation", "cuda_runtime", "cpu_op") else 0,
            "tid": tid, "ts": ts, "dur": dur, "args": args}  # fmt: skip


def _launch(ts: float, correlation: int, dur: float = 5.0, name: str = "cudaLaunchKernel", **args) -> dict:
    return _x("cuda_runtime", name, ts, dur, correlation=correlation, **args)


def _kernel(name: str, ts: float, dur: float, correlation: int, stream: int = 7, **args) -> dict:
    return _x("kernel", name, ts, dur, tid=stream, stream=stream, correlation=correlation, **args)


def _write(folder: Path, events: list[dict], rank: int = 0, world: int = 1, **top) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    trace = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world}, "traceEvents": events, **top}
    (folder / f"rank{rank}.json").write_text(json.dumps(trace))
    return folder


def _import(folder: Path, out: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["import", "kineto", str(folder), "-o", str(out)])
    return code, capsys.readouterr().err


def _program(folder: Path, tmp_path: Path, capsys):
    """The program `import kineto` writes for `folder` (the import must succeed)."""
    code, err = _import(folder, tmp_path / "job.yaml", capsys)
    assert code == 0, err
    return load_schedule(str(tmp_path / "job.yaml"), {})


def _makespan_us(schedule: Path, capsys, machine: str = "dgx-a100") -> float:
    capsys.readouterr()
    assert main(["simulate", str(schedule), "--machine", machine, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["makespan_us"]


def test_a_copy_of_a_few_bytes_is_a_copy_of_bytes(tmp_path, capsys):
    """`.item()` on a bool: a 1-byte device-to-host copy (HTA's event_sync trace) is no
    whole fp32 element; it is imported as bytes, not refused."""
    folder = _write(tmp_path / "t", [
        _x("user_annotation", "ProfilerStep#1", 0, 200),
        _launch(10, 1, name="cudaMemcpyAsync"),
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 20, 3, tid=7, stream=7, correlation=1, bytes=1)])  # fmt: skip
    copy = next(op for op in _program(folder, tmp_path, capsys).ops[0] if op.kind is OpKind.COPY)
    assert copy.size_bytes == 1


def test_the_default_step_is_the_last_that_holds_work(tmp_path, capsys):
    """The profiler's last step is often cut off (the `prof.step()` after the loop opens a
    step holding only a synchronize): the replay takes the last step with work in it, and
    `--step` still picks any step."""
    folder = _write(tmp_path / "t", [
        _x("user_annotation", "ProfilerStep#1", 0, 1000),
        _launch(10, 1), _kernel("void k()", 20, 500, 1),
        _x("user_annotation", "ProfilerStep#2", 1000, 50),
        _x("cuda_runtime", "cudaDeviceSynchronize", 1005, 40, correlation=2)])  # fmt: skip
    assert read_job(folder).ranks[0].step == "ProfilerStep#1"
    code, err = _import(folder, tmp_path / "job.yaml", capsys)
    assert code == 0 and "replaying ProfilerStep#1" in err, err
    capsys.readouterr()
    assert main(["import", "kineto", str(folder), "--step", "2", "-o", str(tmp_path / "two.yaml")]) == 2
    assert "ProfilerStep#2 of the traces holds nothing to replay" in capsys.readouterr().err


def _broadcast_job(tmp_path: Path, with_params: bool) -> Path:
    """Two ranks of DDP's buffer broadcast from group rank 1 of the group [2, 3] of a
    4-rank job (TraceLens's MI300 ResNet trace: `record_param_comms` with `Rank`, the
    root, around the launch), and ranks 0 and 1 doing nothing in the step."""
    folder = tmp_path / "job"
    for rank in range(4):
        events = [_x("user_annotation", "ProfilerStep#3", 0, 400)]
        if rank >= 2:
            if with_params:
                events.append(_x("cpu_op", "record_param_comms", 5, 60, **{"Collective name": "broadcast", "Rank": 1,
                                                                           "Process Group Ranks": "[2, 3]"}))  # fmt: skip
            events += [_launch(10, 9),
                       _kernel("ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 40, 30, 9, stream=21, **{
                           "Collective name": "broadcast", "In msg nelems": 9600, "Out msg nelems": 9600, "Group size": 2,
                           "dtype": "BFloat16", "Process Group Name": "1", "Process Group Ranks": "[2, 3]"})]  # fmt: skip
        else:
            events += [_launch(10, 9), _kernel("void k()", 20, 100, 9)]
        _write(folder, events, rank, 4)
    return folder


def test_a_broadcasts_root_comes_from_record_param_comms(tmp_path, capsys):
    program = _program(_broadcast_job(tmp_path, True), tmp_path, capsys)
    op = next(op for op in program.ops[2] if op.kind is OpKind.BROADCAST)
    assert op.root == 3 and op.size_bytes == 9600 * 2  # group rank 1 of [2, 3]


def test_a_broadcast_without_its_root_in_the_trace_says_where_the_root_is_recorded(tmp_path, capsys):
    code, err = _import(_broadcast_job(tmp_path, False), tmp_path / "job.yaml", capsys)
    assert code == 2 and "us into the step: the trace does not name the broadcast's root" in err, err
    assert "record_param_comms" in err and "Traceback" not in err
    assert not (tmp_path / "job.yaml").exists()


def test_a_rocm_copy_takes_its_size_from_the_hip_call_and_an_unknown_size_is_said(tmp_path, capsys):
    """ROCm's `gpu_memcpy` events often carry no `bytes`; `hipMemcpyWithStream` gives the
    size (a string). A copy sized nowhere is written as 0 B, and the import says so."""
    folder = _write(tmp_path / "t", [
        _x("user_annotation", "ProfilerStep#1", 0, 300),
        _launch(10, 1, name="hipMemcpyWithStream", size="2560", kind="1", stream="0x0"),
        _x("gpu_memcpy", "Memcpy HtoD (Host -> Device)", 20, 22, tid=0, device=2, stream=0, correlation=1, kind="HtoD"),
        _launch(100, 2, name="hipMemcpyAsync"),
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Host)", 110, 5, tid=0, device=2, stream=0, correlation=2)])  # fmt: skip
    code, err = _import(folder, tmp_path / "job.yaml", capsys)
    assert code == 0, err
    assert "note: 1 copies give no size in the traces" in err
    assert "written as 0 B" in (tmp_path / "job.yaml").read_text()
    sizes = [op.size_bytes for op in load_schedule(str(tmp_path / "job.yaml"), {}).ops[0] if op.kind is OpKind.COPY]
    assert sizes == [2560, 0]


def test_a_launch_call_that_held_the_host_keeps_its_time(tmp_path, capsys):
    """A 6.5 ms cudaLaunchKernel (a module loaded on first use) while the GPU sits idle:
    the replay keeps it as the host's time, not as the machine's few-us launch."""
    folder = _write(tmp_path / "t", [
        _x("user_annotation", "ProfilerStep#1", 0, 7000),
        _launch(10, 1), _kernel("void a()", 20, 50, 1),
        _launch(100, 2, dur=6500), _kernel("void b()", 6610, 300, 2)])  # fmt: skip
    assert _import(folder, tmp_path / "job.yaml", capsys)[0] == 0
    makespan_us = _makespan_us(tmp_path / "job.yaml", capsys)
    assert makespan_us == pytest.approx(7000, rel=0.01), makespan_us


def test_the_hosts_work_after_its_last_launch_is_part_of_the_step(tmp_path, capsys):
    """A CUDA graph's replay or the optimizer's host side after the step's last launch
    (TraceLens's SGLang trace): the step's range ends long after its last kernel."""
    folder = _write(tmp_path / "t", [
        _x("user_annotation", "ProfilerStep#1", 0, 31000),
        _launch(10, 1), _kernel("void k()", 20, 500, 1)])  # fmt: skip
    assert _import(folder, tmp_path / "job.yaml", capsys)[0] == 0
    assert _makespan_us(tmp_path / "job.yaml", capsys) == pytest.approx(31000, rel=0.001)


def test_a_torch_1_9_trace_with_the_old_event_categories_is_read(tmp_path, capsys):
    """torch 1.8 / 1.9 wrote `Operator` (steps among them), `Runtime`, `Kernel`, `Memcpy`
    (pytorch/kineto's tb_plugin ResNet-50 sample)."""
    folder = _write(tmp_path / "t", [
        _x("Operator", "ProfilerStep#5", 0, 300),
        _x("Runtime", "cudaMemcpyAsync", 10, 30, tid="25738", cbid=41, correlation=34417),
        _x("Memcpy", "Memcpy HtoD (Pageable -> Device)", 15, 20, tid="stream 7", device=0, stream=7, correlation=34417, bytes=19267584),
        _x("Runtime", "cudaLaunchKernel", 50, 5, tid="25738", cbid=211, correlation=34441),
        _x("Kernel", "volta_sgemm_128x64_nn", 60, 200, tid="stream 7", device=0, stream=7, correlation=34441)])  # fmt: skip
    code, err = _import(folder, tmp_path / "job.yaml", capsys)
    assert code == 0 and "replaying ProfilerStep#5" in err, err
    kinds = [op.kind for op in load_schedule(str(tmp_path / "job.yaml"), {}).ops[0] if op.kind in (OpKind.COPY, OpKind.COMPUTE)]
    assert kinds == [OpKind.COPY, OpKind.COMPUTE]


def _all_to_all_job(tmp_path: Path, splits: bool) -> Path:
    """An uneven all_to_all_single on 2 ranks (a DLRM's or an MoE's): each rank's input of
    its own size, with the kernel's split sizes (torch >= 2.2) or without (HTA's
    trace_diff traces: a SendRecv kernel inside an `nccl:all_to_all` range)."""
    folder = tmp_path / ("splits" if splits else "bare")
    rows = {0: ([3, 5], [3, 7]), 1: ([7, 1], [5, 1])}  # rows sent to / received from each rank; 4 int32 a row
    for rank, (ins, outs) in rows.items():
        events = [_x("user_annotation", "ProfilerStep#1", 0, 500)]
        if splits:
            events += [_launch(20, 5), _kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 40, 300, 5, stream=21, **{
                "Collective name": "all_to_allv", "In msg nelems": 4 * sum(ins), "Out msg nelems": 4 * sum(outs), "dtype": "Int",
                "In split size": json.dumps(ins), "Out split size": json.dumps(outs), "Process Group Ranks": "[0, 1]"})]  # fmt: skip
        else:
            events += [_x("user_annotation", "nccl:all_to_all", 10, 60, **{"Input Dims": [[4 * sum(ins) + 1]], "Input type": ["int"]}),
                       _launch(20, 5), _kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", 40, 300, 5, stream=21)]  # fmt: skip
        _write(folder, events, rank, 2)
    return folder


def test_an_uneven_all_to_all_with_its_splits_is_a_batch_of_sends_and_receives(tmp_path, capsys):
    program = _program(_all_to_all_job(tmp_path, True), tmp_path, capsys)
    for rank, (sent, received) in {0: (5 * 16, 7 * 16), 1: (7 * 16, 5 * 16)}.items():
        p2p = {op.kind: op.size_bytes for op in program.ops[rank] if op.kind.is_p2p}
        assert p2p == {OpKind.SEND: sent, OpKind.RECV: received}  # the own split stays local


def test_an_uneven_all_to_all_without_splits_is_its_groups_mean_and_said(tmp_path, capsys):
    code, err = _import(_all_to_all_job(tmp_path, False), tmp_path / "job.yaml", capsys)
    assert code == 0, err
    assert "does not split evenly over 2 ranks, and the trace gives no split sizes" in err
    program = load_schedule(str(tmp_path / "job.yaml"), {})
    sizes = {rank: [op.size_bytes for op in program.ops[rank] if op.kind is OpKind.ALL_TO_ALL] for rank in (0, 1)}
    assert sizes[0] == sizes[1] and sizes[0][0] % 8 == 0  # the same collective on both ranks, whole int32 chunks
    # and the replay's prediction pairs with the traces' uneven all_to_alls
    predicted = tmp_path / "predicted.json"
    assert main(["simulate", str(tmp_path / "job.yaml"), "--machine", "dgx-a100", "--trace", str(predicted)]) == 0
    capsys.readouterr()
    assert main(["compare", str(predicted), str(tmp_path / "bare"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sorted(op["op_id"] for op in data["ops"] if op["kind"] == "all_to_all") == ["0:1", "1:1"] and data["unmatched"] == []


def test_traces_of_two_jobs_in_one_folder_are_said_to_be(tmp_path, capsys):
    _write(tmp_path / "t", [_x("user_annotation", "ProfilerStep#1", 0, 10)], rank=1, world=2)
    _write(tmp_path / "t", [_x("user_annotation", "ProfilerStep#1", 0, 10)], rank=3, world=8)
    assert main(["import", "kineto", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "is a trace of a job of 2 ranks" in err and "of a job of 8: the folder holds traces of different jobs" in err, err


@pytest.mark.parametrize(("out", "name"), [(None, "job"), ("8gpu_run.yaml", "_8gpu_run")])
def test_the_default_name_is_a_valid_one(tmp_path, capsys, monkeypatch, out, name):
    """`import kineto .` takes the folder's own name; a file name starting with a digit gets a `_`."""
    _write(tmp_path / "job", [_x("user_annotation", "ProfilerStep#1", 0, 100), _launch(10, 1), _kernel("void k()", 20, 50, 1)])
    monkeypatch.chdir(tmp_path / "job")
    assert main(["import", "kineto", "."] + (["-o", out] if out else [])) == 0
    text = (tmp_path / "job" / out).read_text() if out else capsys.readouterr().out
    assert text.startswith(f"name: {name}\n")
    assert main(["import", "kineto", ".", "--name", "9x"]) == 2
    assert "--name '9x': a schedule name starts with a letter or _" in capsys.readouterr().err


def test_an_imported_step_compares_op_by_op_with_its_traces(tmp_path, capsys):
    """import -> simulate -> compare on the same traces pairs every op: compute by the
    kernels and ranges the import named them after (`forward[0]` with the range `forward`),
    copies, and the host's gaps are not sought."""
    folder = _write(tmp_path / "t", [
        _x("user_annotation", "ProfilerStep#1", 0, 1000),
        _x("user_annotation", "forward", 5, 400),
        _launch(10, 1), _x("gpu_user_annotation", "forward", 20, 500, tid=7),
        _kernel("void k1()", 20, 250, 1), _launch(30, 2), _kernel("void at::native::elementwise_kernel<4>(float*)", 270, 250, 2),
        _launch(600, 3, name="cudaMemcpyAsync"),
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 610, 20, tid=7, stream=7, correlation=3, bytes=4096),
        _launch(700, 4), _kernel("void at::native::vectorized_elementwise_kernel<4>(float*)", 710, 100, 4)])  # fmt: skip
    out, predicted = tmp_path / "job.yaml", tmp_path / "predicted.json"
    assert _import(folder, out, capsys)[0] == 0
    assert main(["simulate", str(out), "--machine", "dgx-a100", "--trace", str(predicted)]) == 0
    capsys.readouterr()
    assert main(["compare", str(predicted), str(folder), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["unmatched"] == []
    assert sorted(op["name"] for op in data["ops"]) == ["copy[0]", "forward[0]", "forward[1]", "vectorized_elementwise_kernel[0]"]
    assert all(abs(op["measured_duration_us"] - op["predicted_duration_us"]) < 0.01 for op in data["ops"] if op["kind"] == "compute")
