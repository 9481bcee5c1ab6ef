"""`commdsl run --profile DIR`: the measured iterations under torch.profiler, one real
Kineto trace per rank with a range per op named as the schedule names it, read back by
`commdsl.interop.kineto_read` and compared against the simulator's prediction."""

from __future__ import annotations

import json

import pytest

from commdsl.cli import main
from commdsl.interop.kineto_read import read_job
from commdsl.timeline import Timeline

try:
    from test_run_launch import SMALL, _no_traceback, commdsl
except ImportError:  # tests/ imported as a package
    from tests.test_run_launch import SMALL, _no_traceback, commdsl


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """One real 2-rank gloo run of 1f1b with --profile: (folder, measured timeline path)."""
    d = tmp_path_factory.mktemp("profiled")
    out, prof = d / "measured.json", d / "prof"
    r = commdsl(["run", "1f1b", "-n", "2", *SMALL, "--out", str(out), "--warmup", "1", "--iters", "2", "--profile", str(prof)],
                timeout_s=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    _no_traceback(r.stderr)
    return prof, out


def test_profile_writes_one_kineto_trace_per_rank_with_the_schedules_op_names(profiled):
    prof, out = profiled
    assert sorted(p.name for p in prof.iterdir()) == ["rank-0.pt.trace.json", "rank-1.pt.trace.json"]
    data = json.loads((prof / "rank-0.pt.trace.json").read_text())
    assert data["schemaVersion"] == 1 and data["distributedInfo"]["backend"] == "gloo"
    steps = sorted(e["name"] for e in data["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#0", "ProfilerStep#1"]  # one per measured iteration
    job = read_job(prof)
    assert sorted(job.ranks) == [0, 1] and job.ranks[0].step == "ProfilerStep#1"
    names = {r: [x.name for x in t.ranges] for r, t in job.ranks.items()}
    # 1f1b with 3 microbatches: rank 0 runs F[0..2] and B[0..2], each once in the step.
    for rank in (0, 1):
        for mb in range(3):
            assert names[rank].count(f"F[{mb}]") == 1 and names[rank].count(f"B[{mb}]") == 1, names[rank]
    # gloo's own ranges give the sends and recvs with their sizes (64 KiB activations).
    comms = job.ranks[0].comms
    assert {k.value for c in comms for k in c.kinds} == {"send", "recv"}
    assert {c.in_bytes for c in comms} == {64 * 1024}
    # Ranges sit inside the step, which holds the ops and no control-group traffic.
    t = job.ranks[0]
    assert all(t.step_start_us <= x.start_us and x.end_us <= t.step_end_us for x in (*t.ranges, *t.comms))
    assert Timeline.read(out).meta["profile"] == str(prof)


def test_profile_into_a_file_is_a_usage_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["run", "1f1b", "-n", "2", "--profile", str(f)]) == 2
    assert main(["run", "1f1b", "-n", "2", "--profile", str(tmp_path / "no" / "such")]) == 2


def test_the_runs_traces_compare_with_every_op_paired_and_replay(profiled, tmp_path, capsys):
    prof, _ = profiled
    predicted = tmp_path / "predicted.json"
    assert main(["simulate", "1f1b", *SMALL, "--machine", "cpu-loopback", "--trace", str(predicted), "--gantt", "never"]) == 0
    capsys.readouterr()
    assert main(["compare", str(predicted), str(prof), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["unmatched"] == [] and data["ops_compared"] == len(Timeline.read(predicted).exec_spans())
    job = tmp_path / "job.yaml"
    assert main(["import", "kineto", str(prof), "-o", str(job)]) == 0
    assert main(["simulate", str(job), "--machine", "cpu-loopback", "--gantt", "never"]) == 0
