"""Traces written piece by piece are byte for byte the JSON of the whole trace.

`commdsl simulate --trace` streams the predicted timeline from the simulator's arrays
(`SimResult.write_trace`) and `Timeline.write` encodes spans from templates; both must
write exactly `json.dumps(timeline.to_chrome_trace(), sort_keys=True, separators=(",", ":"))`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commdsl.api import load
from commdsl.machine import resolve_machine
from commdsl.sim import simulate, trace
from commdsl.timeline import CounterSample, Flow, Span, SpanRole, Timeline


def _whole(tl: Timeline, streams: tuple[str, ...]) -> str:
    return json.dumps(tl.to_chrome_trace(streams), sort_keys=True, separators=(",", ":")) + "\n"


CASES = [
    ("1f1b", "h100-nvlink", {"stages": 4, "microbatches": 6}),
    ("interleaved_zb", "dgx-h100", {}),
    ("memcpy_vs_nccl", "pcie-nvlink-pairs", {"gpus": 4, "copies": 4}),
    ("collectives", "dgx-h100", {}),
    ("ddp_overlap", "h100-nvlink", {}),
    ("tp_mlp", "dgx-h100", {}),
]


@pytest.mark.parametrize("window", [3, 1 << 16])
@pytest.mark.parametrize(("name", "machine", "params"), CASES, ids=[c[0] for c in CASES])
def test_streamed_trace_is_the_whole_trace(name, machine, params, window, tmp_path: Path, monkeypatch):
    # A window of 3 spans cuts every schedule into many windows (and ties across them).
    monkeypatch.setattr(trace, "_WINDOW_SPANS", window)
    program = load(name, **params)
    result = simulate(program, resolve_machine(machine))
    streamed, written = tmp_path / "s.json", tmp_path / "w.json"
    result.write_trace(streamed)
    result.timeline.write(written, program.streams)
    expected = _whole(result.timeline, program.streams)
    assert streamed.read_text() == expected
    assert written.read_text() == expected


def test_zero_length_spans_tied_in_time_sort_by_op_id_as_text(tmp_path: Path, monkeypatch):
    # 12 allocs at t=0 on one stream: "0:10" and "0:11" come before "0:2" in the trace.
    text = "name: ties\nworld: 1\nstreams: [s]\nprogram: |\n" + "".join(f"  alloc b{i} 1KiB on s\n" for i in range(12))
    path = tmp_path / "ties.yaml"
    path.write_text(text)
    monkeypatch.setattr(trace, "_WINDOW_SPANS", 2)
    program = load(str(path))
    result = simulate(program, resolve_machine("h100-nvlink"))
    out = tmp_path / "t.json"
    result.write_trace(out)
    assert out.read_text() == _whole(result.timeline, program.streams)
    ids = [e["args"]["op_id"] for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    assert ids == sorted(ids) and ids.index("0:10") < ids.index("0:2")


def test_timeline_write_encodes_any_name_and_annotation_as_json_does(tmp_path: Path):
    # Measured timelines carry what the executor and files give: quotes, non-ASCII, '%',
    # lists, integer times, an annotation named like an event field.
    tl = Timeline("measured", 'sched "q"', 2, meta={"note": "ü%s"}, tracks={0: ["host", "s"]})
    tl.spans = [
        Span("0:0", 0, "s", SpanRole.EXEC, "compute", 'F"1"%d', 0, 5, (("name", "ü"), ("sizes", [1, 2]), ("source", "a\\b:1"))),
        Span("0:1", 0, "host", SpanRole.ISSUE, "send", "gloo:send", 1.25, 2.5),
        Span("0:1", 0, "comm:pp", SpanRole.EXEC, "send", "gloo:send", 2.5, 7.0004, (("op_id", "x"), ("cat", 3))),
        Span("1:0", 1, "comm:pp", SpanRole.EXEC, "recv", "gloo:recv", 2.0, 7.0, (("ratio", 1e-7), ("ok", True), ("none", None))),
        Span("1:1", 1, "comm:pp", SpanRole.EXEC, "recv", "gloo:recv", float("inf"), float("inf")),  # JSON's Infinity and NaN
    ]
    tl.flows = [Flow("0:1", "1:0"), Flow("0:9", "1:0", "lost"), Flow("0:1", "1:1", "late")]
    tl.counters = [CounterSample("link a->b util", -1, 0.0, 0.5), CounterSample("mem", 1, 3, 2)]
    out = tmp_path / "m.json"
    tl.write(out, ("s",))
    assert out.read_text() == _whole(tl, ("s",))
    assert Timeline.read(out).spans[0].name == 'F"1"%d'


def test_trace_to_an_unwritable_path_is_a_usage_error(tmp_path: Path, capsys):
    from commdsl.cli import main

    assert main(["simulate", "p2p", "--trace", str(tmp_path / "no" / "such" / "t.json")]) == 2
    assert "cannot write --trace" in capsys.readouterr().err


def test_write_trace_reports_its_progress_window_by_window(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(trace, "_WINDOW_SPANS", 16)
    program = load("1f1b", stages=4, microbatches=8)
    result = simulate(program, resolve_machine("h100-nvlink"))
    heard: list[tuple[int, int]] = []
    result.write_trace(tmp_path / "t.json", progress=lambda done, total: heard.append((done, total)))
    spans = sum(1 for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e["ph"] == "X")
    assert len(heard) > 3 and heard[-1] == (spans, spans)
    assert [d for d, _ in heard] == sorted(d for d, _ in heard) and {t for _, t in heard} == {spans}


def test_a_sampled_simulation_streams_its_medians_and_sampling_metadata(tmp_path: Path):
    import dataclasses

    from commdsl.machine.model import ComputeNoise

    cpu = resolve_machine("cpu-loopback")
    noisy = dataclasses.replace(cpu, contention=dataclasses.replace(cpu.contention, noise=ComputeNoise(stalls_per_s=50.0, stall_us=300.0)))
    program = load("1f1b", stages=2, microbatches=4)
    result = simulate(program, noisy, samples=3, seed=7)
    out = tmp_path / "s.json"
    result.write_trace(out)
    assert out.read_text() == _whole(result.timeline, program.streams)
    assert json.loads(out.read_text())["otherData"]["commdsl"]["meta"]["samples"] == 3
