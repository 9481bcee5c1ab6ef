"""Comparing against profiler traces per process group: a job with a TP and a DP group
(tests/data/kineto/two_groups.yaml), run for real on 4 gloo ranks under `run --profile`
and written as NCCL traces by `simulate --trace-dir`. Comm ops pair with the trace's
ops of their own group in issue order: a reorder across groups is legal and pairs, a
reorder within a group is listed, and a gloo op that fits ops of both groups (gloo names
no group) is listed as ambiguous, never paired."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from commdsl.cli import main
from commdsl.comparison import unfolded
from commdsl.interop.kineto_read import TRACE_FILE, read_job
from commdsl.timeline import Timeline

try:
    from test_run_launch import _no_traceback, commdsl
except ImportError:  # tests/ imported as a package
    from tests.test_run_launch import _no_traceback, commdsl

SCHEDULE = Path(__file__).parent / "data" / "kineto" / "two_groups.yaml"
TP, DP = "tp[dp=0]", "dp[tp=0]"
"""Rank 0's groups: tp with rank 1, dp with rank 2."""


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> tuple[Path, Path]:
    """One real 4-rank gloo run under --profile, and the prediction: (traces, predicted)."""
    d = tmp_path_factory.mktemp("groups")
    prof, predicted = d / "prof", d / "predicted.json"
    r = commdsl(["run", str(SCHEDULE), "-n", "4", "--warmup", "1", "--iters", "2", "-q", "--out", str(d / "m.json"),
                 "--profile", str(prof)], timeout_s=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    _no_traceback(r.stderr)
    assert main(["simulate", str(SCHEDULE), "--machine", "cpu-loopback", "--trace", str(predicted), "--gantt", "never"]) == 0
    return prof, predicted


def _compare(capsys, predicted: Path, traces: Path) -> dict:
    capsys.readouterr()
    assert main(["compare", str(predicted), str(traces), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _edited(src: Path, dst: Path, rank: int, name: str, edit) -> Path:
    """A copy of the trace folder `src` with rank `rank`'s events passed through `edit`."""
    shutil.copytree(src, dst)
    f = dst / name.format(rank=rank)
    data = json.loads(f.read_text())
    edit(data["traceEvents"])
    f.write_text(json.dumps(data))
    return dst


def _gloo(events: list[dict], name: str, elems: int) -> dict:
    """Rank's gloo range `name` over `elems` input elements in the last profiler step."""
    step = max((e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    found = [e for e in events if e.get("name") == name and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]
             and e["args"].get("Input Dims") == [[elems]]]  # fmt: skip
    assert len(found) == 1, found
    return found[0]


def test_a_real_two_group_run_pairs_every_op_in_its_group(profiled, capsys):
    prof, predicted = profiled
    data = _compare(capsys, predicted, prof)
    assert data["unmatched"] == [] and data["ops_compared"] == len(unfolded(Timeline.read(predicted)).exec_spans())
    # gloo runs reduce_scatter_tensor as an all_reduce of its input: w pairs with it.
    w = next(op for op in data["ops"] if op["op_id"] == "0:4")
    assert w["kind"] == "reduce_scatter"
    assert read_job(prof).ranks[0].groups == {"0": (0, 1, 2, 3), "1": (0, 1, 2, 3), "2": (0, 2), "4": (0, 1)}


def test_a_reorder_across_groups_pairs_and_one_within_a_group_is_listed(profiled, capsys, tmp_path):
    prof, predicted = profiled

    def dp_first(events):  # rank 0's dp all_reduce g now runs before its tp ops
        y, g = _gloo(events, "gloo:all_reduce", 4096), _gloo(events, "gloo:all_reduce", 8192)
        g["ts"] = y["ts"] - 10.0

    across = _compare(capsys, predicted, _edited(prof, tmp_path / "across", 0, TRACE_FILE, dp_first))
    assert across["unmatched"] == [] and across["ops_compared"] == len(unfolded(Timeline.read(predicted)).exec_spans())

    def swap_tp(events):  # rank 0's tp all_gather h now runs before its tp all_reduce y
        # Within the span the two took (h where y began, y right after h), so that neither
        # overlaps another range of its thread: a swap of the two start times alone made y,
        # the longer, overlap what followed h in some runs, a trace no thread can write.
        y, h = _gloo(events, "gloo:all_reduce", 4096), _gloo(events, "gloo:all_gather", 1024)
        assert y["ts"] + y["dur"] < h["ts"]
        h["ts"], y["ts"] = y["ts"], y["ts"] + h["dur"] + 0.5

    within = _compare(capsys, predicted, _edited(prof, tmp_path / "within", 0, TRACE_FILE, swap_tp))
    listed = within["unmatched"]
    assert len(listed) == 2 and all(u.startswith("rank 0: ") and f"group {TP}" in u for u in listed), listed
    assert any("not in the trace in this order" in u for u in listed)
    assert any("in the trace, not in the schedule in this order" in u for u in listed)
    assert within["ops_compared"] == across["ops_compared"] - 1  # one of the pair is never paired


def test_a_gloo_op_that_fits_ops_of_two_groups_is_ambiguous(profiled, capsys, tmp_path):
    prof, predicted = profiled
    # A prediction whose dp all_reduce g is y's size: the trace's all_reduce of 4096
    # elements could be either; the trace names no group for gloo's ranges.
    tl = Timeline.read(predicted)
    for i, s in enumerate(tl.spans):
        if s.op_id == "0:3" and s.args:
            tl.spans[i] = replace(s, args=tuple((k, 4096 if k == "In msg nelems" else v) for k, v in s.args))
    same = tmp_path / "same.json"
    tl.write(same)
    listed = _compare(capsys, same, prof)["unmatched"]
    ambiguous = [u for u in listed if "ambiguous" in u]
    # rank 0's, and its data-parallel replica's (the prediction is folded: rank 2 runs rank 0's ops)
    assert [u.partition(":")[0] for u in ambiguous] == ["rank 0", "rank 2"], listed
    assert ambiguous[0].startswith("rank 0: gloo:all_reduce (all_reduce, 16384 B in)"), listed
    assert f"fits ops of groups {DP}, {TP}; not paired" in ambiguous[0] or f"fits ops of groups {TP}, {DP}; not paired" in ambiguous[0]


def test_nccl_kernels_pair_per_group_in_launch_order(capsys, tmp_path):
    """The simulator's NCCL traces: kernels carry `Process Group Ranks`, each group its
    stream; the issue order is the launches' (`cuda_runtime`, by correlation)."""
    predicted, traces = tmp_path / "p.json", tmp_path / "traces"
    assert main(["simulate", str(SCHEDULE), "--machine", "dgx-h100", "--trace", str(predicted), "--trace-dir", str(traces),
                 "--gantt", "never"]) == 0  # fmt: skip
    assert _compare(capsys, predicted, traces)["unmatched"] == []
    job = read_job(traces)
    assert {c.group for c in job.ranks[0].comms} == {(0, 1), (0, 2)}

    def launch_h_first(events):  # rank 0 launches its tp all_gather before its tp all_reduce
        kernels = {e["args"]["correlation"]: e for e in events if e.get("cat") == "kernel" and "nccl" in e["name"]}
        y = next(c for c, e in kernels.items() if "AllReduce" in e["name"] and e["args"]["Process Group Ranks"] == "[0, 1]")
        h = next(c for c, e in kernels.items() if "AllGather" in e["name"])
        launch = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
        launch[y]["ts"], launch[h]["ts"] = launch[h]["ts"], launch[y]["ts"]

    listed = _compare(capsys, predicted, _edited(traces, tmp_path / "swapped", 0, TRACE_FILE, launch_h_first))["unmatched"]
    assert len(listed) == 2 and all(u.startswith("rank 0: ") and f"group {TP}" in u for u in listed), listed
