"""Traces written piece by piece are byte for byte the JSON of the whole trace.

`commdsl simulate --trace` streams the predicted timeline from the simulator's arrays
(`SimResult.write_trace`) and `Timeline.write` encodes spans from templates; both must
write exactly `json.dumps(timeline.to_chrome_trace(), sort_keys=True, separators=(",", ":"))`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from commdsl.errors import CommdslError

from commdsl import timeline
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


@pytest.mark.parametrize(("window", "narrow"), [(3, 1 << 16), (1 << 16, 2)], ids=["small-windows", "wide-numbers"])
@pytest.mark.parametrize(("name", "machine", "params"), CASES, ids=[c[0] for c in CASES])
def test_streamed_trace_is_the_whole_trace(name, machine, params, window, narrow, tmp_path: Path, monkeypatch):
    # A window of 3 spans cuts every schedule into many windows (and ties across them);
    # 2-byte numbers up to 2 only make the span formats and tracks take 4 bytes.
    monkeypatch.setattr(trace, "_WINDOW_SPANS", window)
    monkeypatch.setattr(trace, "_NARROW", narrow)
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
        Span("0:1", 0, "comm:pp", SpanRole.EXEC, "send", "gloo:send", 2.5, 7.0004, (("op_id", "0:1"), ("cat", 3))),
        Span("1:0", 1, "comm:pp", SpanRole.EXEC, "recv", "gloo:recv", 2.0, 7.0, (("ratio", 1e-7), ("ok", True), ("none", None))),
        Span("1:1", 1, "comm:pp", SpanRole.EXEC, "recv", "gloo:recv", float("inf"), float("inf")),  # JSON's Infinity and NaN
    ]
    tl.flows = [Flow("0:1", "1:0"), Flow("0:9", "1:0", "lost"), Flow("0:1", "1:1", "late")]
    tl.counters = [CounterSample("link a->b util", -1, 0.0, 0.5), CounterSample("mem", 1, 3, 2)]
    out = tmp_path / "m.json"
    tl.write(out, ("s",))
    assert out.read_text() == _whole(tl, ("s",))
    with pytest.raises(CommdslError, match=f"{out}:"):  # reading it back refuses the infinite times, at their line
        Timeline.read(out)
    tl.spans.pop()
    tl.flows.pop()
    tl.write(out, ("s",))
    assert Timeline.read(out).spans[0].name == 'F"1"%d'


def test_trace_to_an_unwritable_path_is_a_usage_error(tmp_path: Path, capsys):
    from commdsl.cli import main

    assert main(["simulate", "p2p", "--trace", str(tmp_path / "no" / "such" / "t.json")]) == 2
    assert f"--trace {tmp_path / 'no' / 'such' / 't.json'}: the folder {tmp_path / 'no' / 'such'} does not exist" in capsys.readouterr().err
    assert main(["simulate", "p2p", "--trace", str(tmp_path)]) == 2  # a folder: found when writing
    assert f"cannot write --trace {tmp_path}: Is a directory" in capsys.readouterr().err


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


# ---- the encoders' fast paths against the JSON encoder --------------------------------

from array import array  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from commdsl.timeline import DecimalTexts, SpanEncoder, json_text, sign_clear  # noqa: E402

# Floats as simulated times are (few decimals, integral, huge, tiny), and every other one.
_TIMES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**15), 10**15).map(lambda k: k / 1000),
    st.integers(0, 10**9).map(float),
    st.floats(0, 1e7).map(lambda x: round(x, 3) + 0.0005),  # halfway cases of round(x, 3)
    st.floats(1e11, 1e13),  # about where the thousandths stop fitting in 15 digits
    st.integers(0, 2**53).map(lambda k: k / 2048),  # exact binary fractions: halfway thousandths among them
    st.sampled_from([0.0, -0.0, 5e-4, -5e-4, 1e-4, 1e16, 1e22, 2.0**53 + 1, 0.1 + 0.2]),
)


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@settings(max_examples=500, deadline=None)
@given(st.lists(_TIMES, max_size=40), st.sampled_from([3, 6]))
def test_decimal_texts_are_the_json_of_the_rounded_floats(values, digits):
    texts = DecimalTexts(digits)
    expected = [_json(round(x, digits)) for x in values]
    # Kept texts where no sign bit is set, formatted afresh where one is; twice over, the
    # second time from what was kept.
    clear = sign_clear(array("d", values))
    assert clear == all(math.copysign(1.0, x) > 0 for x in values)
    assert list(texts.texts(values, clear)) == expected
    assert list(texts.texts(values, clear)) == expected
    # A value kept as 0.0 never stands for -0.0 (one dict key, two texts).
    assert list(texts.texts([0.0], True)) == ["0.0"] and list(texts.texts([-0.0, 0.0], sign_clear(array("d", [-0.0, 0.0])))) == ["-0.0", "0.0"]


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES)
def test_json_text_is_the_json_encoders(value):
    assert json_text(value) == _json(value)


_ARGS = st.lists(st.tuples(st.text(max_size=6), st.one_of(st.text(max_size=6), st.integers(), st.floats(), st.booleans(), st.none())),
                 max_size=5, unique_by=lambda kv: kv[0]).map(tuple)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=8), st.sampled_from(["exec", "issue"]), st.text(max_size=8), _ARGS,
       st.one_of(st.text(max_size=6), st.sampled_from(["0:1", "12:345"])), st.integers(0, 99), st.integers(0, 9), _TIMES, _TIMES)  # fmt: skip
def test_a_span_event_from_pieces_is_the_json_of_the_event(kind, role, name, args, op_id, pid, tid, start, end):
    fields = {"op_id": op_id, "kind": kind, "role": role}
    fields.update(args)
    expected = _json({"ph": "X", "name": name, "cat": kind, "pid": pid, "tid": tid, "ts": round(start, 3), "dur": round(end - start, 3), "args": fields})
    assert SpanEncoder().event(kind, role, name, args, op_id, pid, tid, start, end) == expected


def test_a_streamed_trace_with_a_negative_zero_time_is_the_whole_trace(tmp_path: Path, monkeypatch):
    # A -0.0 start is one dict key with 0.0: the streamed trace must not take one's text
    # for the other's (it stops keeping texts when any time has its sign bit set).
    monkeypatch.setattr(trace, "_WINDOW_SPANS", 4)
    program = load("1f1b", stages=2, microbatches=2)
    result = simulate(program, resolve_machine("h100-nvlink"))
    zero = [g for g, t in enumerate(result.raw.start) if t == 0.0]
    assert zero and any(t > 0.0 for t in result.raw.start)
    result.raw.start[zero[0]] = -0.0
    out = tmp_path / "t.json"
    result.write_trace(out)
    text = out.read_text()
    assert text == _whole(result.timeline, program.streams)
    assert '"ts":-0.0' in text and '"ts":0.0' in text


def test_ties_across_a_power_of_ten_sort_by_op_id_as_text_on_every_track(tmp_path: Path, monkeypatch):
    # Zero-length allocs and a record tied in time with ops 9/10 and 99/100 on the
    # host and on a stream: "0:10" before "0:9", "0:100" before "0:99", ISSUE after EXEC.
    lines = [f"  alloc b{i} 1KiB on s\n" for i in range(120)] + ["  compute c 5us on s\n"]
    path = tmp_path / "ties.yaml"
    path.write_text("name: ties\nworld: 2\nstreams: [s]\nprogram: |\n" + "".join(lines))
    for window in (2, 1 << 16):
        monkeypatch.setattr(trace, "_WINDOW_SPANS", window)
        program = load(str(path))
        result = simulate(program, resolve_machine("h100-nvlink"))
        out = tmp_path / "t.json"
        result.write_trace(out)
        assert out.read_text() == _whole(result.timeline, program.streams)


def test_span_events_of_equal_but_differently_typed_annotations_keep_their_own_text():
    # 1, 1.0 and True are one dict key, as are 0.0 and -0.0: each event still writes its own.
    encoder = SpanEncoder()
    for value in (1, 1.0, True, 0.0, -0.0, 1, "1"):
        args = (("v", value),)
        expected = _json({"ph": "X", "name": "n", "cat": "compute", "pid": 0, "tid": 0, "ts": 0.0, "dur": 1.0,
                          "args": {"op_id": "0:0", "kind": "compute", "role": "exec", "v": value}})  # fmt: skip
        assert encoder.event("compute", "exec", "n", args, "0:0", 0, 0, 0.0, 1.0) == expected



def test_a_copy_whose_peer_differs_per_rank_annotates_each_ranks_own_peer(tmp_path: Path):
    # One statement, a peer per rank: ranks must not share one rank's annotations.
    path = tmp_path / "peers.yaml"
    path.write_text("name: peers\nworld: 4\nstreams: [s]\nprogram: |\n  copy x 1MiB to (rank + 1) % 4 on s\n")
    program = load(str(path))
    result = simulate(program, resolve_machine("h100-nvlink"))
    out = tmp_path / "t.json"
    result.write_trace(out)
    assert out.read_text() == _whole(result.timeline, program.streams)
    annotated = {e["pid"]: e["args"]["dst rank"] for e in json.loads(out.read_text())["traceEvents"]
                 if e.get("ph") == "X" and e["args"].get("role") == "exec"}  # fmt: skip
    assert annotated == {0: 1, 1: 2, 2: 3, 3: 0}


def test_span_numbers_widen_past_two_bytes():
    """Past 65,536 span formats or tracks, their per-code numbers take 4 bytes."""
    numbers = array("H", [7, 65535])
    assert trace._holding(numbers, 1 << 16) is numbers
    wide = trace._holding(numbers, (1 << 16) + 1)
    wide[0] = 1 << 16  # an 'H' array refuses it
    assert wide.typecode == "i" and list(wide) == [1 << 16, 65535]


@pytest.mark.parametrize(("write_chars", "chunk"), [(1, 3), (200, 1 << 14)])
def test_written_in_any_batches_the_trace_is_the_same(write_chars, chunk, tmp_path: Path, monkeypatch):
    """Items as long as a batch are written alone, shorter ones joined until one is full;
    flows, arrows and counters encoded a few at a time or all at once."""
    monkeypatch.setattr(timeline, "_WRITE_CHARS", write_chars)
    monkeypatch.setattr(trace, "_CHUNK", chunk)
    program = load("1f1b", stages=4, microbatches=6)
    result = simulate(program, resolve_machine("h100-nvlink"))
    out = tmp_path / "t.json"
    result.write_trace(out)
    assert out.read_text() == _whole(result.timeline, program.streams)
