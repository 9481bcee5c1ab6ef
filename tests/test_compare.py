"""`commdsl compare` on synthetic timelines whose errors are known exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rich.console import Console

from commdsl.commands.compare import print_comparison
from commdsl.comparison import compare_timelines, machine_at_run_rate, rank_breakdowns
from commdsl.errors import UsageError
from commdsl.ir import Dtype
from commdsl.timeline import FLOP_RATE_META, REQUESTED_DURATION_ARG, Span, SpanRole, Timeline

try:
    from test_sim_engine import machine
except ImportError:  # tests/ imported as a package
    from tests.test_sim_engine import machine


def _timeline(source: str, spans: list[tuple[str, int, str, str, float, float]], t0: float = 0.0) -> Timeline:
    tl = Timeline(source, "synthetic", 2)
    for op_id, rank, track, kind, start, end in spans:
        tl.spans.append(Span(op_id, rank, track, SpanRole.EXEC, kind, f"op{op_id}", t0 + start, t0 + end,
                             (("name", f"op{op_id}"), ("source", f"s.yaml:{10 + int(op_id.split(':')[1])}"))))  # fmt: skip
    return tl


# Measured: rank 0 computes 0-100, sends 100-150 (comm queue); rank 1 computes 0-200, recv 100-150.
MEASURED = [
    ("0:0", 0, "compute", "compute", 0, 100),
    ("0:1", 0, "comm:world", "send", 100, 150),
    ("1:0", 1, "compute", "compute", 0, 200),
    ("1:1", 1, "comm:world", "recv", 100, 150),
]
# Predicted: durations off by +10%, -20%, 0%, +50% (relative); makespan 180 vs 200.
PREDICTED = [
    ("0:0", 0, "compute", "compute", 0, 110),
    ("0:1", 0, "comm:world", "send", 110, 150),
    ("1:0", 1, "compute", "compute", 0, 180),
    ("1:1", 1, "comm:world", "recv", 100, 175),
]


def test_known_errors_are_reported_exactly() -> None:
    # The measured timeline has wall-clock timestamps; comparison is relative to each start.
    cmp = compare_timelines(_timeline("predicted", PREDICTED), _timeline("measured", MEASURED, t0=1.7e9), min_duration_us=1)
    assert cmp.predicted_makespan_us == 180 and cmp.measured_makespan_us == 200
    assert cmp.makespan_error_pct == pytest.approx(-10.0)
    errors = {e.op_id: e.duration_error_pct for e in cmp.ops}
    assert errors == pytest.approx({"0:0": 10.0, "0:1": -20.0, "1:0": -10.0, "1:1": 50.0})
    d = cmp.duration_stats()
    assert d.median == pytest.approx(15.0)  # |10|, |20|, |10|, |50| -> median of 10,10,20,50
    assert d.worst == pytest.approx(50.0) and d.worst_op == "1:1"
    assert d.p90 == pytest.approx(20 + 0.7 * 30)  # linear interpolation between 20 and 50
    s = cmp.start_stats()
    assert s.worst == pytest.approx(10.0) and s.worst_op == "0:1"
    assert cmp.to_json()["duration_error_pct"]["worst_source"] == "s.yaml:11"
    assert (cmp.predicted_samples, cmp.measured_iterations) == (1, None)


def test_the_statistics_behind_both_sides_are_reported() -> None:
    predicted, measured = _timeline("predicted", PREDICTED), _timeline("measured", MEASURED)
    predicted.meta["samples"], measured.meta["iters"] = 25, 21
    cmp = compare_timelines(predicted, measured)
    assert cmp.to_json()["predicted_samples"] == 25 and cmp.to_json()["measured_iterations"] == 21


def test_the_machines_flop_rate_against_the_runs() -> None:
    """The machine file says bf16 0.40 TFLOP/s, the run's start-up timed 0.36 and 0.38:
    the machine file is +8.1% off the median (0.37); fp32 is only measured, not listed."""
    predicted, measured = _timeline("predicted", PREDICTED), _timeline("measured", MEASURED)
    predicted.meta["machine"] = {"device": {"peak_tflops": {"bf16": 0.40, "fp16": 0.5}}}
    measured.meta[FLOP_RATE_META] = {"0": {"bf16": 0.36, "fp32": 0.1}, "1": {"bf16": 0.38, "fp32": 0.1}}
    cmp = compare_timelines(predicted, measured)
    [rate] = cmp.compute_rates
    assert (rate.dtype, rate.machine_tflops, rate.measured_tflops) == ("bf16", 0.40, {0: 0.36, 1: 0.38})
    assert rate.error_pct == pytest.approx(100 * (0.40 - 0.37) / 0.37)
    assert cmp.to_json()["flop_block_tflops"] == [{"dtype": "bf16", "machine": 0.40, "measured": {"0": 0.36, "1": 0.38},
                                                    "machine_error_pct": round(rate.error_pct, 3)}]  # fmt: skip
    console = Console(record=True, width=200)
    print_comparison(cmp, console)
    text = console.export_text()
    assert "FLOP block in bf16: the machine file says 0.4 TFLOP/s" in text and "0.36 on rank 0, 0.38 on rank 1" in text and "+8.1%" in text
    # Without the run's timing (older timelines, duration-only schedules) nothing is said.
    assert compare_timelines(predicted, _timeline("measured", MEASURED)).compute_rates == []


@pytest.mark.parametrize("bad", [{"0": {"bf16": "fast"}}, {"0": {"bf17": 0.4}}, "0.4", {"r0": {"bf16": 0.4}}])
def test_a_malformed_flop_rate_is_a_usage_error(bad) -> None:
    measured = _timeline("measured", MEASURED)
    measured.meta[FLOP_RATE_META] = bad
    with pytest.raises(UsageError, match="meta.flop_block_tflops is not"):
        compare_timelines(_timeline("predicted", PREDICTED), measured)


def test_the_machine_at_the_runs_rate() -> None:
    """`commdsl.run --compare` re-simulates with the rates the run timed (median over
    ranks) in place of the machine's, other dtypes kept."""
    m = machine()  # peak_tflops fp32 10, bf16 20
    measured = _timeline("measured", MEASURED)
    assert machine_at_run_rate(m, measured) is None
    measured.meta[FLOP_RATE_META] = {"0": {"bf16": 12.0}, "1": {"bf16": 14.0}, "2": {"bf16": 30.0}}
    at_run = machine_at_run_rate(m, measured)
    assert (at_run.device.tflops(Dtype.BF16), at_run.device.tflops(Dtype.FP32)) == (14.0, 10.0)
    assert m.device.tflops(Dtype.BF16) == 20  # the machine itself is left alone


def test_rank_breakdown_exposed_comm_and_idle() -> None:
    br = rank_breakdowns(_timeline("measured", MEASURED))
    # rank 0: compute 0-100, comm 100-150 (not overlapped) -> exposed 50, idle 200-150.
    assert (br[0].compute_us, br[0].comm_us, br[0].exposed_comm_us, br[0].idle_us) == (100, 50, 50, 50)
    # rank 1: compute 0-200 covers comm 100-150 -> nothing exposed, no idle.
    assert (br[1].compute_us, br[1].comm_us, br[1].exposed_comm_us, br[1].idle_us) == (200, 50, 0, 0)


def test_waits_count_for_start_error_not_duration_error() -> None:
    # A wait's span is how long its stream sat blocked: not something the model predicts.
    pred = PREDICTED + [("0:2", 0, "compute", "wait", 150, 150)]
    meas = MEASURED + [("0:2", 0, "compute", "wait", 150, 400)]
    cmp = compare_timelines(_timeline("predicted", pred), _timeline("measured", meas), min_duration_us=1)
    assert cmp.duration_stats().worst == pytest.approx(50.0)  # unchanged by the wait
    assert "0:2" in {e.op_id for e in cmp.ops}


def test_unpaired_ops_are_listed() -> None:
    cmp = compare_timelines(_timeline("predicted", PREDICTED[:3]), _timeline("measured", MEASURED))
    assert cmp.only_measured == ["1:1"] and cmp.only_predicted == []
    assert len(cmp.ops) == 3


def _write(tmp_path: Path) -> tuple[Path, Path]:
    p, m = tmp_path / "pred.json", tmp_path / "meas.json"
    _timeline("predicted", PREDICTED).write(p)
    _timeline("measured", MEASURED, t0=5e6).write(m)
    return p, m


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdsl.cli", *args], capture_output=True, text=True, timeout=60)


def test_cli_json_html_trace_and_max_error(tmp_path: Path) -> None:
    p, m = _write(tmp_path)
    html, trace = tmp_path / "report.html", tmp_path / "both.json"
    proc = _cli("compare", str(p), str(m), "--json", "--min-duration", "1", "--html", str(html), "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["makespan_error_pct"] == -10.0 and data["ops_compared"] == 4
    page = html.read_text()
    # Self-contained: an inline script draws the timeline (tests/test_report_html.py runs it in Chromium).
    assert page.startswith("<!doctype html>") and "<canvas" in page and "<script src" not in page and "http" not in page
    timeline = json.loads(page.split('id="timeline-data">')[1].split("</script>")[0])
    assert sum(len(lane["spans"]) for lane in timeline["lanes"]) == 8  # 4 ops predicted + 4 measured
    assert '</i>compute</span>' in page  # the legend names the kinds shown
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {"predicted rank 0", "predicted rank 1", "measured rank 0", "measured rank 1"}
    assert min(e["ts"] for e in events if e.get("ph") == "X" and e["pid"] >= 2) == 0  # measured re-based to zero

    assert _cli("compare", str(p), str(m), "--max-error", "15").returncode == 0
    over = _cli("compare", str(p), str(m), "--max-error", "5")
    assert over.returncode == 4 and "exceeds --max-error 5%" in over.stderr


def test_cli_bad_inputs(tmp_path: Path) -> None:
    p, _ = _write(tmp_path)
    missing = _cli("compare", str(p), str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "no such timeline file" in missing.stderr
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    bad = _cli("compare", str(p), str(junk))
    assert bad.returncode == 2 and "not a timeline JSON file" in bad.stderr and "Traceback" not in bad.stderr
    broken = tmp_path / "broken.json"
    data = json.loads(p.read_text())
    next(e for e in data["traceEvents"] if e["ph"] == "X")["args"]["kind"] = "teleport"
    broken.write_text(json.dumps(data))
    bad_kind = _cli("compare", str(p), str(broken))
    assert bad_kind.returncode == 2 and "malformed commdsl timeline" in bad_kind.stderr and "Traceback" not in bad_kind.stderr
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"traceEvents": []}))
    assert "not a commdsl timeline" in _cli("compare", str(p), str(other)).stderr


def _with_requested(tl: Timeline, requested: dict[str, float]) -> Timeline:
    """`tl` with the requested duration on the named compute spans, as commdsl.run writes it."""
    spans = []
    for s in tl.spans:
        if s.op_id in requested:
            s = Span(s.op_id, s.rank, s.track, s.role, s.kind, s.name, s.start_us, s.end_us,
                     s.args + ((REQUESTED_DURATION_ARG, requested[s.op_id]),))  # fmt: skip
        spans.append(s)
    tl.spans = spans
    return tl


def test_compute_that_ran_off_its_requested_duration_is_reported(tmp_path: Path) -> None:
    """Rank 0's compute asked for 100 us and ran 100; rank 1's asked for 400 and ran 200
    (its start-up timing of the compute block was off): compare says so, in its text, its
    JSON and on stderr beside the JSON."""
    measured = _with_requested(_timeline("measured", MEASURED), {"0:0": 100.0, "1:0": 400.0})
    cmp = compare_timelines(_timeline("predicted", PREDICTED), measured)
    drifts = {d.rank: d for d in cmp.duration_drifts}
    assert drifts[0].median_ratio == 1.0 and not drifts[0].drifted and drifts[0].off == 0
    assert drifts[1].median_ratio == 0.5 and drifts[1].drifted and drifts[1].off == 1 and drifts[1].worst_op == "1:0"
    assert [w.startswith("rank 1: its compute ops with an explicit duration ran x0.50") for w in cmp.warnings()] == [True]

    p, m = tmp_path / "pred.json", tmp_path / "meas.json"
    _timeline("predicted", PREDICTED).write(p)
    measured.write(m)
    text = _cli("compare", str(p), str(m))
    assert text.returncode == 0, text.stderr
    assert "warning: rank 1: its compute ops with an explicit duration ran x0.50" in " ".join(text.stdout.split())
    assert "rank 0: its compute" not in text.stdout
    as_json = _cli("compare", str(p), str(m), "--json")
    data = json.loads(as_json.stdout)
    assert [(d["rank"], d["drifted"]) for d in data["compute_duration_drift"]] == [(0, False), (1, True)]
    assert "rank 1: its compute ops with an explicit duration ran x0.50" in " ".join(as_json.stderr.split())
    # Within 10%: no warning.
    close = _with_requested(_timeline("measured", MEASURED), {"0:0": 95.0, "1:0": 190.0})
    assert compare_timelines(_timeline("predicted", PREDICTED), close).warnings() == []


def test_an_uncalibrated_machine_says_how_to_calibrate() -> None:
    preset = _timeline("predicted", PREDICTED)
    preset.meta["machine"] = machine().to_json()  # a hand-written description: no measured profiles
    cmp = compare_timelines(preset, _timeline("measured", MEASURED))
    (hint,) = cmp.warnings()
    assert "is not calibrated" in hint and "commdsl calibrate -n 2 --out my.yaml" in hint and "--machine my.yaml" in hint
    assert cmp.to_json()["machine_calibrated"] is False
    calibrated = _timeline("predicted", PREDICTED)
    record = {"by": "commdsl calibrate", "date": "2026-11-24T00:00:00Z", "source": "test", "quick": False}
    calibrated.meta["machine"] = dict(machine().to_json(), calibration=record)
    assert compare_timelines(calibrated, _timeline("measured", MEASURED)).warnings() == []
    # Measured profiles alone do not make a description calibrated; a quick calibration warns.
    profiled = _timeline("predicted", PREDICTED)
    profiled.meta["machine"] = dict(machine().to_json(), copy_measured_us={"host": [[1024, 2.0], [2048, 3.0]]})
    assert "is not calibrated" in compare_timelines(profiled, _timeline("measured", MEASURED)).warnings()[0]
    rough = _timeline("predicted", PREDICTED)
    rough.meta["machine"] = dict(machine().to_json(), calibration=dict(record, quick=True))
    (hint,) = compare_timelines(rough, _timeline("measured", MEASURED)).warnings()
    assert "rough calibration (--quick)" in hint


@pytest.mark.parametrize("ops_per_write", [1, 3, 4096])
@pytest.mark.parametrize("predicted", [PREDICTED, PREDICTED[:3], []], ids=["all", "unpaired", "none"])
def test_json_written_streamed_is_json_dumps_text(monkeypatch, predicted, ops_per_write) -> None:
    """`--json` writes the ops a batch at a time: the very text `json.dumps(indent=1)`
    of the whole comparison gives, whatever the batch size and however many ops."""
    import io

    from commdsl import comparison

    monkeypatch.setattr(comparison, "_OPS_PER_WRITE", ops_per_write)
    cmp = compare_timelines(_timeline("predicted", predicted), _timeline("measured", MEASURED), min_duration_us=1)
    out = io.StringIO()
    cmp.write_json(out)
    assert out.getvalue() == json.dumps(cmp.to_json(), indent=1)
    assert len(json.loads(out.getvalue())["ops"]) == len(cmp.ops) == len(predicted)


def test_a_run_missing_a_rank_is_refused(tmp_path: Path) -> None:
    """A run's timeline holds a span of every rank with ops: one without rank 1's would
    show rank 1 as a rank that did no work."""
    from commdsl.api import compare

    p, _ = _write(tmp_path)
    lost = tmp_path / "lost.json"
    _timeline("measured", [s for s in MEASURED if s[1] == 0]).write(lost)
    proc = _cli("compare", str(p), str(lost))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{lost} holds no span of rank(s) 1, which have ops in {p}: the run's timeline is missing ranks" in " ".join(proc.stderr.split())
    # A hung run's partial timeline may hold no span of a rank that started no op; a
    # prediction may hold only some ranks (a folded program's representatives).
    partial = _timeline("measured", [s for s in MEASURED if s[1] == 0])
    partial.meta["partial"] = True
    assert compare(_timeline("predicted", PREDICTED), partial).only_predicted == ["1:0", "1:1"]
    assert compare(_timeline("predicted", PREDICTED), _timeline("predicted", MEASURED[:2])).only_predicted == ["1:0", "1:1"]


KINETO = Path(__file__).parent / "data" / "kineto" / "cpu_gloo_1f1b"
"""Both ranks' profiler traces of a 2-rank job."""


def _rank0(folder: Path, **info) -> Path:
    """`folder` holding rank 0's trace alone, its distributedInfo updated with `info`."""
    folder.mkdir()
    data = json.loads((KINETO / "rank0.pt.trace.json").read_text())
    data["distributedInfo"].update(info)
    (folder / "rank0.pt.trace.json").write_text(json.dumps(data))
    return folder


# (id, the measured path made in tmp_path, message): profiler traces that are not every rank's
BAD_TRACES = [
    ("folder_missing_rank_1", lambda t: _rank0(t / "job"), "job holds the traces of ranks [0] of a job of 2 ranks; ranks [1] are missing"),
    ("one_file_of_two_ranks", lambda t: _rank0(t / "job") / "rank0.pt.trace.json",
     "rank0.pt.trace.json holds the traces of ranks [0] of a job of 2 ranks; ranks [1] are missing"),
    ("rank_negative", lambda t: _rank0(t / "job", rank=-1), "distributedInfo.rank is -1, not an integer from 0"),
]  # fmt: skip


@pytest.mark.parametrize("case_id, make, message", BAD_TRACES, ids=[c[0] for c in BAD_TRACES])
def test_profiler_traces_missing_a_rank_are_refused(case_id, make, message, tmp_path: Path) -> None:
    p, _ = _write(tmp_path)
    proc = _cli("compare", str(p), str(make(tmp_path)))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and message in " ".join(proc.stderr.split()), proc.stderr
    assert "trace error: " in proc.stderr


def test_a_folded_prediction_is_compared_rank_by_rank(tmp_path: Path, capsys) -> None:
    """`simulate` folds a data-parallel schedule's replicas by default, and its trace holds
    the representative's ranks; `compare` stands them in for every replica, so it pairs
    every rank's ops as against the same prediction unfolded (`--no-fold`)."""
    from commdsl.cli import main

    params = ["-p", "ranks=4", "-p", "steps=1", "-p", "layers=2", "-p", "bucket_layers=1", "-p", "layer_grad=64KiB"]
    folded, whole = tmp_path / "folded.json", tmp_path / "whole.json"
    for out, extra in ((folded, []), (whole, ["--no-fold"])):
        assert main(["simulate", "ddp_overlap", *params, "--machine", "cpu-loopback", "--gantt", "never", "--trace", str(out), *extra]) == 0
    meta = json.loads(folded.read_text())["otherData"]["commdsl"]["meta"]
    assert meta["fold"]["ranks"] == [0] and meta["fold"]["replicas"] == 4
    capsys.readouterr()
    assert main(["compare", str(folded), str(whole), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ops = {op["op_id"] for op in data["ops"]}
    assert {int(op_id.split(":")[0]) for op_id in ops} == {0, 1, 2, 3} and not data["only_measured"]
    assert abs(data["makespan_error_pct"]) < 1e-9
    assert all(op["predicted_duration_us"] == pytest.approx(op["measured_duration_us"]) for op in data["ops"])


def test_a_malformed_fold_in_a_timeline_is_a_usage_error(tmp_path: Path, capsys) -> None:
    from commdsl.cli import main

    folded = tmp_path / "folded.json"
    assert main(["simulate", "ddp_overlap", "-p", "ranks=2", "--machine", "cpu-loopback", "--gantt", "never", "--trace", str(folded)]) == 0
    data = json.loads(folded.read_text())
    data["otherData"]["commdsl"]["meta"]["fold"]["stride"] = 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["compare", str(bad), str(folded)]) == 2
    assert "meta.fold.stride is a whole number from 1 to 2, got 0" in capsys.readouterr().err
