"""Reading real PyTorch profiler (Kineto) traces and comparing a prediction against them:
commdsl's own `run --profile` traces (CPU, gloo) and a real GPU job's (HTA's DDP trace,
NCCL kernels with their args), and edited copies with an extra, a missing and a
reordered op, which are listed, never paired."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from commdsl.cli import main
from commdsl.comparison import compare_trace
from commdsl.errors import UsageError
from commdsl.interop import kineto_read
from commdsl.interop.kineto_read import Place, TraceError, load_trace, read_job
from commdsl.ir import OpKind
from commdsl.timeline import Timeline

DATA = Path(__file__).parent / "data" / "kineto"
CPU = DATA / "cpu_gloo_1f1b"
GPU = DATA / "hta_ddp_a100"
PARAMS = ["-p", "stages=2", "-p", "microbatches=4", "-p", "act=1MiB"]
"""The params the CPU traces were run with (tests/data/kineto/README.md)."""


@pytest.fixture(scope="module")
def predicted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pred") / "predicted.json"
    assert main(["simulate", "1f1b", *PARAMS, "--machine", "cpu-loopback", "--trace", str(out), "--gantt", "never"]) == 0
    return out


def _edit(tmp_path: Path, rank: int, edit) -> Path:
    """A copy of the CPU traces with rank `rank`'s events passed through `edit`."""
    folder = tmp_path / "edited"
    shutil.copytree(CPU, folder)
    f = folder / f"rank{rank}.pt.trace.json"
    data = json.loads(f.read_text())
    data["traceEvents"] = edit(data["traceEvents"])
    f.write_text(json.dumps(data))
    return folder


def _compare_json(capsys, predicted: Path, measured: Path, *extra: str) -> dict:
    capsys.readouterr()
    assert main(["compare", str(predicted), str(measured), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _step1(events: list[dict]) -> tuple[float, float]:
    s = next(e for e in events if e.get("name") == "ProfilerStep#1")
    return s["ts"], s["ts"] + s["dur"]


def _in_step1(events: list[dict], name: str) -> list[dict]:
    lo, hi = _step1(events)
    return [e for e in events if e.get("name") == name and e.get("ph") == "X" and lo <= e["ts"] <= hi]


def test_a_real_run_profile_trace_pairs_every_op(predicted, capsys, tmp_path):
    data = _compare_json(capsys, predicted, CPU, "--html", str(tmp_path / "r.html"))
    tl = Timeline.read(predicted)
    assert data["ops_compared"] == len(tl.exec_spans()) and data["unmatched"] == []
    job = read_job(CPU)
    assert data["measured_makespan_us"] == pytest.approx(job.step_us, abs=1e-3)
    assert "<html" in (tmp_path / "r.html").read_text().lower()
    # The terminal report is today's, with the trace's step as the measured side.
    assert main(["compare", str(predicted), str(CPU)]) == 0
    assert "ops compared" in capsys.readouterr().out


def test_step_picks_another_profiler_step(predicted, capsys):
    first = _compare_json(capsys, predicted, CPU, "--step", "0")
    last = _compare_json(capsys, predicted, CPU)
    assert first["unmatched"] == [] and first["measured_makespan_us"] != last["measured_makespan_us"]
    assert main(["compare", str(predicted), str(CPU), "--step", "7"]) == 2
    assert "not a profiler step of every rank's trace (common steps: [0, 1])" in capsys.readouterr().err


def test_an_extra_comm_op_and_a_duplicated_range_are_listed(predicted, capsys, tmp_path):
    def edit(events):
        send = _in_step1(events, "gloo:send")[0]
        f0 = _in_step1(events, "F[0]")[0]
        extra_send = dict(send, ts=send["ts"] + 1.0)  # a send the schedule does not have
        return [*events, extra_send, dict(f0, ts=f0["ts"] + 5.0, dur=1.0)]

    data = _compare_json(capsys, predicted, _edit(tmp_path, 0, edit))
    unmatched = data["unmatched"]
    assert any(u.startswith("rank 0: F[0]: ambiguous, 1 op(s) of this name (0:4) and 2 range(s) in the trace; none paired") for u in unmatched), unmatched
    extra = [u for u in unmatched if "in the trace, not in the schedule" in u]
    assert len(extra) == 1 and extra[0].startswith("rank 0: gloo:send (send, 1048576 B in)"), unmatched
    assert "0:4" not in {op["op_id"] for op in data["ops"]}  # never paired on a guess
    assert data["ops_compared"] == len(Timeline.read(predicted).exec_spans()) - 1


def test_a_missing_op_is_listed(predicted, capsys, tmp_path):
    def edit(events):
        gone = {id(_in_step1(events, "B[2]")[0]), id(_in_step1(events, "gloo:recv")[-1])}
        return [e for e in events if id(e) not in gone]

    data = _compare_json(capsys, predicted, _edit(tmp_path, 1, edit))
    unmatched = data["unmatched"]
    assert "rank 1: compute B[2] (op 1:18): no range named B[2] in the trace" in unmatched, unmatched
    missing = [u for u in unmatched if "not in the trace in this order" in u]
    assert len(missing) == 1 and missing[0].startswith("rank 1: recv "), unmatched


def test_a_reordered_pair_is_listed_not_paired_across(predicted, capsys, tmp_path):
    def edit(events):
        # rank 0's last send and the recv before it trade places in time.
        comms = sorted(_in_step1(events, "gloo:send") + _in_step1(events, "gloo:recv"), key=lambda e: e["ts"])
        a, b = next((x, y) for x, y in zip(comms, comms[1:]) if x["name"] != y["name"])
        a["ts"], b["ts"] = b["ts"], a["ts"]
        return events

    data = _compare_json(capsys, predicted, _edit(tmp_path, 0, edit))
    out_of_order = [u for u in data["unmatched"] if u.startswith("rank 0:") and "in this order" in u]
    assert len(out_of_order) == 2, data["unmatched"]  # one op of the pair each side; the other pairs
    assert any("not in the trace in this order" in u for u in out_of_order)
    assert any("in the trace, not in the schedule in this order" in u for u in out_of_order)


def test_a_real_gpu_trace_gives_nccl_kernels_with_sizes_and_groups():
    job = read_job(GPU)
    t = job.ranks[0]
    assert job.world_size == 2 and t.step == "ProfilerStep#5" and t.backend == "nccl"
    assert t.profiler == "Kineto schemaVersion 1, NCCL 2.17.1"
    kinds = [next(iter(c.kinds)) for c in t.comms]
    assert kinds.count(OpKind.BROADCAST) == 2 and kinds.count(OpKind.ALL_REDUCE) == 5
    assert all(c.group == (0, 1) and c.place is Place.DEVICE and c.track == "stream 40" for c in t.comms)
    assert t.comms[2].in_bytes == 2049000 * 4  # In msg nelems x Float
    assert len(t.kernels) > 800 and {k.track for k in t.kernels} == {"stream 7"}
    assert all(c.size_bytes > 0 for c in t.copies)
    # Device work of the step comes after its host range began, and it ends later.
    assert t.step_end_us > t.step_start_us and t.step_us >= 219726.9


@pytest.mark.parametrize("name,content,message", [
    ("cut.json", b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "na', "is not a JSON profiler trace: Unterminated string"),
    ("cut.json.gz", gzip.compress(b'{"schemaVersion": 1, "traceEvents": []}', mtime=0)[:20], "a gzip file that does not decompress"),
    ("other.json", json.dumps({"traceEvents": [{"ph": "X", "name": "x", "ts": 0, "dur": 1, "pid": 0, "tid": 0}]}).encode(),
     "is a Chrome trace but not a PyTorch profiler (Kineto) trace"),
    ("list.json", b"[]", "is not a Kineto trace: no traceEvents list"),
    ("timeline.json", json.dumps({"traceEvents": [], "otherData": {"commdsl": {"version": 1}}}).encode(),
     "is a commdsl timeline, not a profiler trace"),
])  # fmt: skip
def test_a_file_that_is_not_a_kineto_trace_is_a_clear_error_naming_it(tmp_path, name, content, message, predicted, capsys):
    f = tmp_path / name
    f.write_bytes(content)
    with pytest.raises(TraceError) as info:
        load_trace(f)
    assert message in info.value.message and str(f) in info.value.message
    if name != "timeline.json":  # through the CLI, in a folder: the same message and exit code 2
        folder = tmp_path / "folder"
        folder.mkdir()
        shutil.copy(f, folder / name)
        capsys.readouterr()
        assert main(["compare", str(predicted), str(folder)]) == 2
        err = capsys.readouterr().err
        assert message in err and name in err and "Traceback" not in err


def _first(data: dict, cat: str) -> dict:
    return next(e for e in data["traceEvents"] if e.get("cat") == cat)


def _set(path: str, value):
    """An edit of a trace's JSON setting the value at `path` (keys separated by dots)."""
    def edit(data: dict) -> None:
        *keys, last = path.split(".")
        node = data
        for k in keys:
            node = node[k]
        node[last] = value
    return edit


BAD_FIELDS = [
    ("info_list", _set("distributedInfo", [0]), "distributedInfo is list, not an object"),
    ("world_text", _set("distributedInfo.world_size", "x"), 'distributedInfo.world_size is "x", not an integer from 1 to 65536'),
    ("world_huge", _set("distributedInfo.world_size", 10**12), "distributedInfo.world_size is 1000000000000, not an integer"),
    ("rank_huge", _set("distributedInfo.rank", 10**12), "distributedInfo.rank is 1000000000000, not an integer from 0 to 65535"),
    ("rank_bool", _set("distributedInfo.rank", True), "distributedInfo.rank is true, not an integer"),
    ("pg_config_int", _set("distributedInfo.pg_config", 5), "distributedInfo.pg_config is int, not a list of process groups"),
    ("pg_ranks_text", lambda d: d["distributedInfo"].update(pg_config=[{"pg_name": "0", "ranks": ["a"]}]),
     "the ranks of process group '0' is \"a\", not an integer"),
    ("copy_bytes_text", lambda d: _first(d, "gpu_memcpy")["args"].update(bytes="abc"), 'has bytes "abc", not a count of bytes'),
    ("negative_dur", lambda d: _first(d, "kernel").update(dur=-50), "has a negative duration (dur -50)"),
    ("huge_ts", lambda d: _first(d, "kernel").update(ts=10**400), "has no numeric 'ts'"),
]  # fmt: skip


@pytest.mark.parametrize("name,edit,message", BAD_FIELDS, ids=[b[0] for b in BAD_FIELDS])
def test_a_trace_field_of_the_wrong_type_or_range_is_a_trace_error_naming_the_file(tmp_path, name, edit, message):
    data = json.loads(gzip.decompress((GPU / "rank0.json.gz").read_bytes()))
    data["distributedInfo"].setdefault("rank", 0)
    edit(data)
    folder = tmp_path / name
    folder.mkdir()
    f = folder / "rank0.json"
    f.write_text(json.dumps(data))
    with pytest.raises(TraceError) as info:
        read_job(folder)
    assert message in info.value.message and str(f) in info.value.message


def test_ids_and_step_numbers_that_cannot_key_anything_are_read_past(tmp_path):
    """A correlation id that is a list, or a step number of 5,000 digits, is not a launch
    or a step: the rest of the trace reads as before, without a traceback."""
    data = json.loads(gzip.decompress((GPU / "rank0.json.gz").read_bytes()))
    _first(data, "cuda_runtime")["args"]["correlation"] = [1]
    data["traceEvents"].append({**_first(data, "user_annotation"), "name": "ProfilerStep#" + "9" * 5000})
    (tmp_path / "rank0.json").write_text(json.dumps(data))
    job = read_job(tmp_path)
    assert job.ranks[0].step == read_job(GPU).ranks[0].step


def test_a_json_integer_past_pythons_digit_limit_is_a_trace_error(tmp_path):
    f = tmp_path / "rank0.json"
    f.write_text('{"schemaVersion": 1, "traceEvents": [{"ts": ' + "9" * 5000 + "}]}")
    with pytest.raises(TraceError) as info:
        load_trace(f)
    assert f"{f} is not a profiler trace" in info.value.message


def test_an_empty_folder_and_traces_of_another_job_are_usage_errors(tmp_path, predicted, capsys):
    assert main(["compare", str(predicted), str(tmp_path)]) == 2
    assert "holds no profiler traces" in capsys.readouterr().err
    # A DDP job's traces (rank 0's, and a copy of it as rank 1) hold no op of 1f1b.
    ddp = tmp_path / "ddp"
    ddp.mkdir()
    data = json.loads(gzip.decompress((GPU / "rank0.json.gz").read_bytes()))
    data["distributedInfo"]["rank"] = 0
    (ddp / "rank0.json").write_text(json.dumps(data))
    data["distributedInfo"]["rank"] = 1
    (ddp / "rank1.json").write_text(json.dumps(data))
    with pytest.raises(UsageError) as info:
        compare_trace(Timeline.read(predicted), read_job(ddp))
    assert f"no op of 1f1b was found in the traces of {ddp}" in info.value.message
    with pytest.raises(TraceError) as info:  # rank 0's alone: the job's rank 1 is missing
        compare_trace(Timeline.read(predicted), read_job(GPU))
    assert "holds the traces of ranks [0] of a job of 2 ranks; ranks [1] are missing" in info.value.message


def test_traces_read_whatever_their_names_and_gzip(predicted, capsys, tmp_path):
    """commdsl's `rank-<r>` names, the older `rank<r>` ones and the names (and gzip) of
    torch's `tensorboard_trace_handler`: a rank is its `distributedInfo.rank`."""
    folder = tmp_path / "named"
    folder.mkdir()
    shutil.copy(CPU / "rank0.pt.trace.json", folder / "rank-0.pt.trace.json")
    (folder / "vm_28941.1790857026000000000.pt.trace.json.gz").write_bytes(gzip.compress((CPU / "rank1.pt.trace.json").read_bytes()))
    renamed, original = read_job(folder), read_job(CPU)
    assert sorted(renamed.ranks) == [0, 1] and renamed.step_us == original.step_us
    assert [c.start_us for c in renamed.ranks[1].comms] == [c.start_us for c in original.ranks[1].comms]
    assert _compare_json(capsys, predicted, folder)["unmatched"] == []
    # A gzip of several members (as `cat a.gz b.gz` makes) reads as their concatenation.
    text = (CPU / "rank1.pt.trace.json").read_bytes()
    (folder / "vm_28941.1790857026000000000.pt.trace.json.gz").write_bytes(gzip.compress(text[:100]) + gzip.compress(text[100:]))
    assert read_job(folder).ranks[1].comms == original.ranks[1].comms


def test_a_trace_past_the_size_cap_is_refused_before_it_is_inflated(predicted, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(kineto_read, "MAX_TRACE_BYTES", 1 << 20)
    padded = b'{"schemaVersion": 1, "traceEvents": []' + b" " * (4 << 20) + b"}"
    for name, content, message in (("bomb.json.gz", gzip.compress(padded), "decompresses to more than the 1MiB a profiler trace may hold"),
                                   ("big.json", padded, "is 4MiB, more than the 1MiB a profiler trace may hold")):  # fmt: skip
        folder = tmp_path / name.partition(".")[0]
        folder.mkdir()
        (folder / name).write_bytes(content)
        assert len(content) < (1 << 20) or name == "big.json"
        capsys.readouterr()
        assert main(["compare", str(predicted), str(folder)]) == 2
        err = capsys.readouterr().err
        assert message in err and name in err and "Traceback" not in err, err


def test_nccl_kernels_without_args_take_their_collective_and_size_from_the_nccl_range_that_launched_them():
    """PARAM's 8-rank DLRM traces (V100, a profiler before torch 2.2): the NCCL kernels carry
    no args; the `nccl:<collective>` range around each launch says what it ran (TorchRec's
    all_to_all runs as `SendRecv` kernels) and its input's dims and type give the size."""
    job = read_job(DATA / "param_dlrm_v100")
    assert sorted(job.ranks) == list(range(8)) and job.world_size == 8 and job.step_us == 20823.0
    for t in job.ranks.values():
        assert [(next(iter(c.kinds)).value, c.in_bytes) for c in t.comms] == [
            ("all_to_all", 24576), ("all_to_all", 192), ("all_to_all", 1536), ("all_to_all", 13568),
            ("all_reduce", 394241 * 4), ("all_to_all", 24576), ("all_reduce", 448), ("all_reduce", 226960 * 4)]  # fmt: skip
        assert all(c.name.startswith(("ncclKernel_SendRecv", "ncclKernel_AllReduce")) for c in t.comms)
        assert all(c.issued_us < c.start_us for c in t.comms)  # the launch, before the kernel ran
        assert not any(r.name.startswith("nccl:") for r in t.ranges)  # the host side of a comm, not a range
