"""The executor under real torchrun on gloo: semantics, values, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from commdsl.run.check import Checker, Fill
from commdsl.timeline import Timeline

try:
    from test_run_support import DATA, REPO, assert_durations_kept_or_warned, assert_semantics, commdsl_frames, load, torchrun
except ImportError:  # tests/ imported as a package
    from tests.test_run_support import DATA, REPO, assert_durations_kept_or_warned, assert_semantics, commdsl_frames, load, torchrun

FAST = ["--warmup", "0", "--iters", "1"]


def test_tutorial_collectives_produce_the_documents_values(tmp_path):
    """broadcast, reduce, all_reduce, gather, all_gather, scatter, reduce_scatter on 3
    ranks with the tutorial's inputs give the outputs the document prints."""
    out, values = tmp_path / "m.json", tmp_path / "values.json"
    run = torchrun(3, [str(DATA / "tutorial_collectives.yaml"), "--values", str(DATA / "tutorial_values.yaml"),
                       "--check", "--dump-values", str(values), "--out", str(out), *FAST])  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "all correct" in run.stdout
    got = json.loads(values.read_text())

    def out_of(rank: int, index: int) -> list[float]:
        return got[f"{rank}:{index}"]["out"]

    for r in range(3):
        assert out_of(r, 0) == [1, 2, 3, 4, 5]  # broadcast from rank 0
        assert out_of(r, 2) == [6] * 5  # all_reduce of [rank + 1] * 5
        assert out_of(r, 4) == [1] * 5 + [2] * 5 + [3] * 5  # all_gather
        assert out_of(r, 5) == [r + 1] * 5  # scatter from rank 0
    assert out_of(0, 1) == [6] * 5  # reduce to rank 0 (gloo uses the others' buffers as scratch)
    assert out_of(0, 3) == [1] * 5 + [2] * 5 + [3] * 5  # gather to rank 0
    assert "out" not in got["1:3"] and "out" not in got["2:3"]  # gather: only the root has an output
    assert [out_of(r, 6) for r in range(3)] == [[6, 12], [14, 56], [36, 288]]  # reduce_scatter
    program = load(DATA / "tutorial_collectives.yaml")
    assert_semantics(program, Timeline.read(out))


def test_streams_events_and_waits_follow_the_semantics(tmp_path):
    out = tmp_path / "m.json"
    run = torchrun(2, [str(DATA / "streams_events.yaml"), "--check", "--duration-mode", "sleep", "--out", str(out), *FAST])
    assert run.returncode == 0, run.stderr
    program = load(DATA / "streams_events.yaml")
    tl = Timeline.read(out)
    assert_semantics(program, tl)
    spans = tl.exec_spans()
    for rank in range(2):
        ops = {op.name: op for op in program.ops[rank]}

        def span(name: str):
            return spans[ops[name].id]

        a, b, g, c = span("A"), span("B"), span("g"), span("C")
        assert a.track == "compute" and b.track == "comm" and g.track == "comm:world"
        assert a.start_us < b.end_us and b.start_us < a.end_us, "ops on two streams must overlap"
        assert span("a_done").end_us >= a.end_us - 1  # record runs after A on its stream
        wait_ev = spans[next(op.id for op in program.ops[rank] if op.kind.value == "wait_event")]
        assert wait_ev.track == "comm" and wait_ev.end_us >= span("a_done").end_us - 1
        assert g.start_us >= wait_ev.end_us - 1 and g.start_us >= b.end_us - 1  # comm waits for its stream
        assert c.start_us < g.end_us or c.start_us >= a.end_us  # C is not held back by the async all_reduce
        assert span("h").end_us >= g.end_us - 1  # `wait h` holds the compute stream until g is done
        assert span("D").start_us >= g.end_us - 1
        host = span("H")
        assert host.track == "host" and host.duration_us >= 2000 * 0.9
        p2p = spans[ops["x"].id]
        host_wait = spans[next(op.id for op in program.ops[rank] if op.kind.value == "wait" and op.stream == "host")]
        assert host_wait.track == "host" and host_wait.end_us >= p2p.end_us - 1
        sync_all = spans[program.ops[rank][-1].id]
        assert sync_all.track == "host"
        assert all(sync_all.end_us >= s.end_us - 1 for s in spans.values() if s.rank == rank and s.op_id != sync_all.op_id)


def test_1f1b_runs_checks_and_writes_a_trace_with_the_simulators_ids(tmp_path):
    out = tmp_path / "m.json"
    params = ["-p", "stages=2", "-p", "microbatches=3", "-p", "act=64KiB", "-p", "t_fwd=1ms", "-p", "t_bwd=2ms"]
    records = tmp_path / "records.json"
    run = torchrun(2, ["1f1b", *params, "--check", "--out", str(out), "--warmup", "1", "--iters", "3", "--records", str(records)])
    assert run.returncode == 0, run.stderr
    assert "check: 12 communication results on 2 rank(s): all correct" in run.stdout
    program = load("1f1b", {"stages": "2", "microbatches": "3", "act": "64KiB", "t_fwd": "1ms", "t_bwd": "2ms"})
    data = json.loads(out.read_text())
    meta = data["otherData"]["commdsl"]
    assert meta["source"] == "measured" and meta["world_size"] == 2 and meta["meta"]["iters"] == 3
    assert len(meta["meta"]["iteration_makespans_us"]) == 3
    tl = Timeline.read(out)
    assert_semantics(program, tl)
    names = {s.name for s in tl.spans}
    # Spans are named by the backend that ran them: gloo here, never an NCCL kernel.
    assert {"gloo:send", "gloo:recv", "F[0]"} <= names and not any(n.startswith("nccl") for n in names)
    assert {f.dst_op for f in tl.flows} == {op.id for op in program.all_ops() if op.kind.value == "recv"}
    # Explicit-duration compute is calibrated real work: a 2 ms backward runs about 2 ms, or the run says it did not.
    b0 = next(s for s in tl.exec_spans().values() if s.name == "B[0]")
    assert dict(b0.args)["requested_duration_us"] == 2000.0
    assert_durations_kept_or_warned(run.stdout, tl)
    # --records: every measured iteration's op times, whose per-op medians are the timeline.
    iterations = json.loads(records.read_text())["iterations"]
    assert len(iterations) == 3 and all(set(it) == {op.id for op in program.all_ops()} for it in iterations)
    for op_id, span in tl.exec_spans().items():
        starts = sorted(it[op_id][0] for it in iterations)
        assert span.start_us == pytest.approx(starts[1], abs=1e-2)  # the median of 3


def test_world_size_mismatch_is_a_clear_error(tmp_path):
    run = torchrun(2, [str(DATA / "tutorial_collectives.yaml"), "--out", str(tmp_path / "m.json"), *FAST], timeout_s=60)
    assert run.returncode != 0
    assert "the schedule has 3 ranks but torchrun started 2 processes" in run.stderr
    # torchrun prints its own traceback of the failed launch; none comes from commdsl.
    assert not commdsl_frames(run.stderr)


def _python_m(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdsl.run", *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def _in_process(args: list[str], capsys, monkeypatch) -> subprocess.CompletedProcess:
    """`python -m commdsl.run ARGS` as its `main` in this process, outside torchrun (an
    error that is not a CommdslError escapes and fails the test, as a traceback would)."""
    from commdsl.run.cli import main

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(REPO)
    code = main(args)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["commdsl.run", *args], code, out, err)


def test_without_torchrun_a_multi_rank_schedule_asks_for_torchrun(capsys, monkeypatch):
    r = _in_process([str(DATA / "tutorial_collectives.yaml")], capsys, monkeypatch)
    assert r.returncode == 2
    assert "needs 3 ranks" in r.stderr and "torchrun --nproc_per_node=3" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["no_such_schedule_xyz"], "no such schedule file"),
        (["1f1b", "--iters", "0"], "--iters must be from 1 to 100,000"),
        (["1f1b", "-p", "nope=1"], "no param 'nope'"),
        (["1f1b", "--timeout", "-1"], "--timeout must be a number of seconds above 0"),
        (["1f1b", "--timeout", "inf"], "--timeout must be a number of seconds above 0 and below"),
        (["1f1b", "--records", "/no/such/folder/r.json"], "--records /no/such/folder/r.json: the folder /no/such/folder does not exist"),
        (["1f1b", "--out", "/no/such/folder/m.json"], "--out /no/such/folder/m.json: the folder /no/such/folder does not exist"),
    ],
)
def test_usage_errors_exit_2_without_traceback(args, message, capsys, monkeypatch):
    r = _in_process(args, capsys, monkeypatch)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


def test_schedule_errors_exit_1(capsys, monkeypatch):
    r = _in_process([str(DATA / "recv_without_send.yaml")], capsys, monkeypatch)  # fails the static matching check
    assert r.returncode == 1
    assert "schedule error" in r.stderr and "recv_without_send.yaml:9" in r.stderr


def test_a_one_rank_schedule_runs_without_torchrun(tmp_path):
    sched = tmp_path / "one.yaml"
    sched.write_text("name: one\nworld: 1\nstreams: [a, b]\nprogram: |\n  compute X 1ms\n  compute Y 1ms on b\n"
                     "  all_reduce g 4KiB\n  synchronize\n")  # fmt: skip
    out = tmp_path / "m.json"
    r = _python_m([str(sched), "--out", str(out), "--check", *FAST])
    assert r.returncode == 0, r.stderr
    tl = Timeline.read(out)
    assert {s.track for s in tl.exec_spans().values()} == {"a", "b", "comm:world", "host"}


def test_check_names_the_op_and_ranks_of_a_wrong_result():
    """The verification itself (a real run never produces a wrong value on purpose)."""
    program = load(DATA / "tutorial_collectives.yaml")
    checker = Checker(program, 1, Fill())
    all_reduce = program.ops[1][2]
    right = checker.expect[all_reduce.index].out
    assert checker.verify(all_reduce, right.clone()) is None
    wrong = right.clone()
    wrong[3] += 1
    why = checker.verify(all_reduce, wrong)
    assert why is not None
    assert "op 1:2 all_reduce ar" in why and "ranks [0, 1, 2]" in why and "element 3" in why
    assert "tutorial_collectives.yaml:" in why
    recv_program = load(DATA / "head_to_head.yaml")
    recv = recv_program.ops[0][0]
    recv_checker = Checker(recv_program, 0, Fill())
    why = recv_checker.verify(recv, torch.zeros(1024))
    assert why is not None and "from rank 1" in why and "rank 1 op 1:1" in why


def test_runs_without_numpy(tmp_path):
    """torch does not install numpy, and torch.distributed's *_object collectives need it
    to receive: a fresh environment's first `commdsl.run` failed gathering the hosts."""
    blocker = tmp_path / "no_numpy" / "numpy"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text('raise ModuleNotFoundError("numpy is blocked for this test", name="numpy")\n')
    env = {"PYTHONPATH": os.pathsep.join([str(blocker.parent), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    out = tmp_path / "m.json"
    r = torchrun(2, ["1f1b", "-p", "stages=2", "-p", "act=1MiB", "--check", "--out", str(out), *FAST], env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    probe = subprocess.run([sys.executable, "-c", "import numpy"], capture_output=True, text=True, env=dict(os.environ, **env))
    assert "numpy is blocked" in probe.stderr  # the blocker is in effect for such processes
    assert len(Timeline.read(out).exec_spans()) == len(load("1f1b", {"stages": "2"}).ops[0]) * 2


def test_measured_comm_spans_are_named_by_the_backend_that_ran_them():
    from commdsl.run.timing import measured_comm_name

    program = load("1f1b", {"stages": "2"})
    send = next(op for op in program.ops[0] if op.kind.value == "send")
    assert measured_comm_name("gloo")(send) == "gloo:send"
    assert measured_comm_name("nccl")(send) == "ncclDevKernel_SendRecv"
    with pytest.raises(ValueError, match="no span names for backend 'mpi'"):
        measured_comm_name("mpi")
