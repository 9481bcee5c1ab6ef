"""Timeline files whose op ids or meta cannot be a timeline's: `commdsl compare` refuses
them naming the file and what inside it is wrong, exit 2, never a Python error and never
a comparison of wrong numbers (commdsl/timeline_reader.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commdsl.cli import main


def _span(data: dict, role: str = "exec", pid: int = 0, nth: int = 0) -> dict:
    """The `nth` span event of `role` on rank `pid`."""
    return [e for e in data["traceEvents"] if e.get("ph") == "X" and e["args"]["role"] == role and e["pid"] == pid][nth]


def _meta(data: dict) -> dict:
    return data["otherData"]["commdsl"]["meta"]


def _second(data: dict, role: str) -> None:
    """Give rank 0's second span of `role` the op id of its first."""
    _span(data, role, nth=1)["args"]["op_id"] = _span(data, role)["args"]["op_id"]


# (id, how the measured file is changed, message)
BAD_TIMELINES = [
    # ---- op ids: "rank:index", of the rank the span is on, one exec and one issue span an op
    ("op_id_letters", lambda d: _span(d)["args"].update(op_id="zz"), "of traceEvents: args.op_id 'zz' is not an op id: \"<rank>:<index>\""),
    ("op_id_no_index", lambda d: _span(d)["args"].update(op_id="0"), "args.op_id '0' is not an op id"),
    ("op_id_leading_zero", lambda d: _span(d)["args"].update(op_id="0:01"), "args.op_id '0:01' is not an op id"),
    ("op_id_negative", lambda d: _span(d)["args"].update(op_id="-1:0"), "args.op_id '-1:0' is not an op id"),
    ("op_id_5000_digits", lambda d: _span(d)["args"].update(op_id="0:" + "9" * 5000), "args.op_id '0:99999"),
    ("op_id_outside_world", lambda d: _span(d)["args"].update(op_id="99:4"), "a span of op '99:4' is on rank (pid) 0: an op of rank 99"),
    ("op_id_other_rank", lambda d: _span(d)["args"].update(op_id="1:0"), "a span of op '1:0' is on rank (pid) 0: an op of rank 1"),
    ("exec_span_twice", lambda d: _second(d, "exec"), "a second exec span of op '0:0': an op has one exec span"),
    ("issue_span_twice", lambda d: _second(d, "issue"), "a second issue span of op '0:"),
    # ---- the meta compare computes with
    ("machine_a_string", lambda d: _meta(d).update(machine="x"), "otherData.commdsl.meta.machine is an object, not a string"),
    ("machine_name_a_list", lambda d: _meta(d)["machine"].update(name=[1]), "otherData.commdsl.meta.machine.name is a string, not a list"),
    ("calibration_a_number", lambda d: _meta(d)["machine"].update(calibration=3), "meta.machine.calibration is an object, not a number"),
    ("device_a_list", lambda d: _meta(d)["machine"].update(device=[]), "otherData.commdsl.meta.machine.device is an object, not a list"),
    ("peak_tflops_text", lambda d: _meta(d)["machine"]["device"]["peak_tflops"].update(bf16="fast"),
     "meta.machine.device.peak_tflops['bf16'] is a finite number of TFLOP/s from 0, got 'fast'"),
    ("samples_text", lambda d: _meta(d).update(samples="x"), "otherData.commdsl.meta.samples is a whole number from 1, got 'x'"),
    ("samples_zero", lambda d: _meta(d).update(samples=0), "meta.samples is a whole number from 1, got 0"),
    ("iters_fraction", lambda d: _meta(d).update(iters=1.5), "meta.iters is a whole number from 1, got 1.5"),
    ("iters_true", lambda d: _meta(d).update(iters=True), "meta.iters is a whole number from 1, got True"),
    ("memory_source_number", lambda d: _meta(d).update(memory_peak_source=5), "meta.memory_peak_source is a string, not a number"),
    ("memory_peak_text", lambda d: _meta(d).update(memory_peak_bytes={"0": "1GiB"}),
     "meta.memory_peak_bytes.0 is a whole number of bytes from 0 to"),
    ("memory_peak_rank_9", lambda d: _meta(d).update(memory_peak_bytes={"9": 1}), "meta.memory_peak_bytes names rank '9', not one of the world's 0..1"),
    ("flop_rates_a_list", lambda d: _meta(d).update(flop_block_tflops=[1]), "meta.flop_block_tflops is an object, not a list"),
    ("flop_rate_dtype", lambda d: _meta(d).update(flop_block_tflops={"0": {"bf17": 0.4}}), "meta.flop_block_tflops.0 names 'bf17', not a dtype"),
    ("flop_rate_negative", lambda d: _meta(d).update(flop_block_tflops={"0": {"bf16": -1}}),
     "meta.flop_block_tflops.0.bf16 is a finite number of TFLOP/s from 0, got -1"),
    ("flop_rate_rank_r0", lambda d: _meta(d).update(flop_block_tflops={"r0": {"bf16": 1}}), "meta.flop_block_tflops names rank 'r0'"),
]  # fmt: skip


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    """A predicted timeline of two ranks, with issue and exec spans and memory peaks."""
    folder = tmp_path_factory.mktemp("trace")
    schedule = folder / "ok.yaml"
    schedule.write_text("name: ok\nworld: 2\nstreams: [s]\nprogram: |\n  alloc a 1MiB\n  compute F 1ms\n  compute G 1ms\n"
                        "  all_reduce g 1MiB on s\n  all_reduce h 1MiB on s\n  free a\n")  # fmt: skip
    assert main(["simulate", str(schedule), "--trace", str(folder / "t.json"), "--json"]) == 0
    return folder / "t.json"


def test_the_fixture_compares_clean(trace, capsys):
    data = json.loads(trace.read_text())
    assert _meta(data)["machine"]["device"]["peak_tflops"] and _meta(data)["memory_peak_bytes"]
    assert len([e for e in data["traceEvents"] if e.get("ph") == "X" and e["args"]["role"] == "issue" and e["pid"] == 0]) >= 2
    assert main(["compare", str(trace), str(trace)]) == 0


@pytest.mark.parametrize("case_id, change, message", BAD_TIMELINES, ids=[c[0] for c in BAD_TIMELINES])
def test_a_timeline_that_cannot_be_is_refused_naming_the_file(case_id, change, message, trace, tmp_path, capsys):
    data = json.loads(trace.read_text())
    change(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["compare", str(trace), str(bad)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{bad} is a malformed commdsl timeline: " in err and message in err, err
