"""`commdsl simulate --trace-dir` and `commdsl run --trace-dir`: one PyTorch profiler
(Kineto) trace per rank, read by Holistic Trace Analysis (HTA) itself. HTA's temporal
breakdown, comm/comp overlap, kernel breakdown and critical path run on a predicted
folder and on a measured one (a real 2-rank gloo run), and their numbers agree with
commdsl's own breakdown (compute, communication, exposed communication, idle) within 1%."""

from __future__ import annotations

import contextlib
import io
import json
import re
import os
import sys
from pathlib import Path

import pytest

from commdsl.cli import main
from commdsl.comparison import rank_breakdowns
from commdsl.timeline import Timeline

try:
    from test_run_support import run_in_group
except ImportError:  # tests/ imported as a package
    from tests.test_run_support import run_in_group

DDP = ["ddp_overlap", "-p", "ranks=2", "-p", "layers=4", "-p", "steps=1", "-p", "layer_grad=1MiB",
       "-p", "t_fwd=2ms", "-p", "t_bwd=4ms"]  # fmt: skip


def _cli(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def predicted(tmp_path_factory) -> tuple[Path, dict]:
    """A predicted trace folder and `commdsl simulate --json`'s summary of the same run."""
    folder = tmp_path_factory.mktemp("predicted") / "traces"
    summary = json.loads(_cli(["simulate", *DDP, "--machine", "dgx-h100", "--trace-dir", str(folder), "--json"]))
    return folder, summary


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[Path, Timeline]:
    """A measured trace folder from a real 2-rank gloo run, and its measured timeline."""
    root = tmp_path_factory.mktemp("measured")
    out, folder = root / "m.json", root / "traces"
    r = run_in_group([sys.executable, "-m", "commdsl.cli", "run", "-n", "2", *DDP, "--duration-mode", "sleep",
                      "--warmup", "1", "--iters", "3", "-q", "--out", str(out), "--trace-dir", str(folder)], timeout_s=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return folder, Timeline.read(out)


def _trace(folder: Path, rank: int) -> dict:
    return json.loads((folder / f"rank-{rank}.pt.trace.json").read_text())


def test_each_rank_is_a_kineto_trace_with_its_groups_device_launches_and_nccl_args(predicted):
    folder, _ = predicted
    assert sorted(p.name for p in folder.iterdir()) == ["rank-0.pt.trace.json", "rank-1.pt.trace.json"]
    doc = _trace(folder, 1)
    info = doc["distributedInfo"]
    assert (info["backend"], info["rank"], info["world_size"]) == ("nccl", 1, 2)
    assert {g["pg_name"]: g["ranks"] for g in info["pg_config"]} == {"world": [0, 1], "dp": [0, 1]}
    assert doc["deviceProperties"] == [{"id": 1, "name": "H100 SXM5 80GB", "totalGlobalMem": 85523536281, "numSms": 132}]
    events = doc["traceEvents"]
    by_cat: dict[str, list[dict]] = {}
    for e in events:
        by_cat.setdefault(e["ph"] if e["ph"] in "sf" else e.get("cat", e["ph"]), []).append(e)
    # Host: the schedule's op names, each holding its runtime call; device: kernels on streams.
    host_names = {e["name"] for e in by_cat["user_annotation"]}
    assert {"F[0,0]", "B[0,3]", "bucket[0,0]", "ProfilerStep#0"} <= host_names
    assert {e["name"] for e in by_cat["cuda_runtime"]} == {"cudaLaunchKernel", "cudaEventRecord", "cudaStreamWaitEvent"}
    kernels = by_cat["kernel"]
    nccl = [k for k in kernels if k["name"].startswith("ncclDevKernel_")]
    assert len(nccl) == 2 and len(kernels) == 4 * 2 + 1 + 2  # forward and backward per layer, the step, two buckets
    k = nccl[0]
    assert k["name"] == "ncclDevKernel_AllReduce_Avg_f32_RING_SIMPLE(ncclDevComm*, unsigned long, ncclWork*)"
    assert {key: k["args"][key] for key in ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size",
                                            "Process Group Name", "Process Group Ranks")} == {
        "Collective name": "allreduce", "In msg nelems": 2 * 2**20 // 4, "Out msg nelems": 2 * 2**20 // 4, "dtype": "Float",
        "Group size": 2, "Process Group Name": "dp", "Process Group Ranks": "[0, 1]"}  # fmt: skip
    compute_stream = {e["args"]["stream"] for e in kernels if not e["name"].startswith("nccl")}
    assert compute_stream == {7} and k["args"]["stream"] not in compute_stream and k["pid"] == 1
    # Every kernel's correlation id is its launch's, with the profiler's ac2g flow between them.
    launches = {e["args"]["correlation"]: e for e in by_cat["cuda_runtime"]}
    starts = {e["id"]: e for e in by_cat["s"]}
    finishes = {e["id"]: e for e in by_cat["f"]}
    for kernel in kernels:
        n = kernel["args"]["correlation"]
        assert launches[n]["name"] == "cudaLaunchKernel" and launches[n]["ts"] <= kernel["ts"]
        assert (starts[n]["ts"], finishes[n]["ts"], finishes[n]["tid"]) == (launches[n]["ts"], kernel["ts"], kernel["args"]["stream"])
    gpu_names = {(e["name"], e["ts"]) for e in by_cat["gpu_user_annotation"]}
    assert ("F[0,0]", kernels[0]["ts"]) in gpu_names


def test_copies_and_memcpy_transfers_are_gpu_memcpy_with_their_bytes(tmp_path):
    folder = tmp_path / "t"
    _cli(["simulate", "memcpy_vs_nccl", "--machine", "pcie-nvlink-pairs", "--trace-dir", str(folder), "--json"])
    copies = [e for e in _trace(folder, 0)["traceEvents"] if e.get("cat") == "gpu_memcpy"]
    assert copies and all(e["name"].startswith("Memcpy ") and e["args"]["bytes"] > 0 for e in copies)
    # Its sends over the memcpy transport are peer copies, not NCCL kernels.
    assert "Memcpy PtoP (Device -> Device)" in {e["name"] for e in copies}


def _hta(folder: Path):
    pytest.importorskip("hta", reason="Holistic Trace Analysis is in the dev extra")
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"  # HTA's option: keep the traces' nanoseconds
    from hta.trace_analysis import TraceAnalysis

    return TraceAnalysis(trace_dir=str(folder))


def _check_against_hta(folder: Path, ours: dict[int, dict[str, float]], makespan_us: float) -> None:
    """HTA's numbers per rank against commdsl's (`ours`: compute, comm, exposed, idle).
    HTA measures idle from the first kernel's start to the last kernel's end
    (`kernel_time`); commdsl over the whole makespan, so the time outside HTA's span is
    added back."""
    analysis = _hta(folder)
    close = lambda value: pytest.approx(value, rel=0.01, abs=0.01)  # noqa: E731
    temporal = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")
    assert sorted(temporal.index) == sorted(ours)
    for rank, mine in ours.items():
        row = temporal.loc[rank]
        assert row["compute_time(us)"] == close(mine["compute"])
        assert row["non_compute_time(us)"] == close(mine["exposed"])  # no copies: what is not compute is comm
        assert row["idle_time(us)"] + makespan_us - row["kernel_time(us)"] == close(mine["idle"])
        # HTA gives the overlap as a percentage with two decimals.
        pct = overlap.loc[rank, "comp_comm_overlap_pctg"]
        assert pct / 100 * mine["comm"] == pytest.approx(mine["comm"] - mine["exposed"], rel=0.01, abs=1e-4 * mine["comm"] + 0.01)
    kernel_types, _ = analysis.get_gpu_kernel_breakdown(visualize=False)
    sums = dict(zip(kernel_types["kernel_type"], kernel_types["sum"]))
    both = sums.get("COMPUTATION overlapping COMMUNICATION", 0)
    # HTA rounds these sums to whole microseconds.
    assert sums["COMPUTATION"] + both == pytest.approx(sum(m["compute"] for m in ours.values()), rel=0.01)
    assert sums["COMMUNICATION"] + both == pytest.approx(sum(m["comm"] for m in ours.values()), rel=0.01)
    graph, ok = analysis.critical_path_analysis(rank=0, annotation="ProfilerStep", instance_id=0)
    assert ok and graph.critical_path_nodes
    path = graph.get_critical_path_breakdown()
    # The path runs through rank 0's profiler step, which spans rank 0's own spans: in a
    # measured run the other rank may start earlier or end later than rank 0, so the step,
    # not the makespan over all ranks, is what the path adds up to.
    (step,) = [e for e in _trace(folder, 0)["traceEvents"] if e["name"] == "ProfilerStep#0"]
    assert step["dur"] <= makespan_us * (1 + 1e-9)
    assert path["duration"].sum() == pytest.approx(step["dur"], rel=0.05)


def test_hta_reads_the_predicted_traces_and_agrees_with_the_summary(predicted):
    folder, summary = predicted
    ours = {r["rank"]: {"compute": r["compute_us"], "comm": r["comm_us"], "exposed": r["exposed_comm_us"], "idle": r["idle_us"]}
            for r in summary["ranks"]}  # fmt: skip
    _check_against_hta(folder, ours, summary["makespan_us"])


def test_hta_reads_the_measured_traces_and_agrees_with_the_measured_breakdown(measured):
    folder, timeline = measured
    assert _trace(folder, 0)["distributedInfo"]["backend"] == "gloo"
    ours = {r: {"compute": b.compute_us, "comm": b.comm_us, "exposed": b.exposed_comm_us, "idle": b.idle_us}
            for r, b in rank_breakdowns(timeline).items()}  # fmt: skip
    _check_against_hta(folder, ours, timeline.makespan_us)


def test_a_trace_dir_that_is_a_file_is_refused_before_any_work(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("")
    assert main(["simulate", *DDP, "--trace-dir", str(taken)]) == 2
    assert f"--trace-dir {taken}: a file of that name exists" in capsys.readouterr().err


def test_predicted_pipeline_traces_import_back_with_each_sends_peer(tmp_path):
    """A send or recv kernel names its peer as torch's profiler does (`Dst Rank`, `Src
    Rank`), so `import kineto` replays a 4-stage 1F1B from its own predicted traces, whose
    point-to-point group is all four ranks, with every transfer between the same ranks."""
    folder, out = tmp_path / "traces", tmp_path / "back.yaml"
    original = json.loads(_cli(["simulate", "1f1b", "--machine", "dgx-h100", "--trace-dir", str(folder), "--json"]))
    kernels = [e for e in _trace(folder, 1)["traceEvents"] if e.get("cat") == "kernel" and "SendRecv" in e["name"]]
    assert {(e["args"]["Collective name"], e["args"].get("Dst Rank"), e["args"].get("Src Rank")) for e in kernels} == {
        ("send", 0, None), ("send", 2, None), ("recv", None, 0), ("recv", None, 2)}
    _cli(["import", "kineto", str(folder), "-o", str(out)])
    text = out.read_text()
    for rank, peers in {0: {"to 1", "from 1"}, 1: {"to 0", "to 2", "from 0", "from 2"}, 3: {"to 2", "from 2"}}.items():
        block = text.split(f"rank == {rank}:")[1].split("rank ==")[0]
        assert set(re.findall(r"(?:to|from) \d", block)) == peers
    replayed = json.loads(_cli(["simulate", str(out), "--machine", "dgx-h100", "--json"]))
    assert replayed["makespan_us"] == pytest.approx(original["makespan_us"], rel=0.02)


def test_a_prediction_compared_with_its_own_traces_pairs_every_op_that_does_work(tmp_path):
    """1F1B declares its memory (alloc, free): a profiler trace holds no range for those,
    nor for waits and records, so they are not sought there, and none of them is reported
    as an op "only predicted"; every op that does work pairs with itself."""
    pred, folder = tmp_path / "pred.json", tmp_path / "traces"
    _cli(["simulate", "1f1b", "--trace", str(pred), "--trace-dir", str(folder), "--json"])
    cmp = json.loads(_cli(["compare", str(pred), str(folder), "--json"]))
    timeline = Timeline.read(pred)
    kinds = {s.op_id: s.kind for s in timeline.spans}
    assert {"alloc", "free"} <= set(kinds.values())
    working = {op for op, kind in kinds.items() if kind not in ("alloc", "free", "wait", "wait_event", "record", "synchronize")}
    assert cmp["ops_compared"] == len(working) and cmp["only_predicted"] == [] and cmp["only_measured"] == []
    assert cmp["makespan_error_pct"] == pytest.approx(0.0, abs=1e-6)
