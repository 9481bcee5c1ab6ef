"""Files written to attack the user's terminal or commdsl itself: terminal escape
sequences in names and values are printed escaped, and timeline files with values out
of any range fail with the file and the line, never a traceback (commdsl/timeline.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from commdsl.cli import main
from commdsl.errors import CommdslError, ScheduleError, SourceLoc, printable
from commdsl.timeline import Timeline

# Text a terminal acts on: retitle the window (OSC), recolour (CSI, and its one-byte C1
# form), a bell, a carriage return that overwrites the line, a right-to-left override,
# and rich's markup.
HOSTILE = "a\x1b]0;pwned\x07\x1b[31m\x9b2J\r\u202e[bold]z"
SHOWN = "a\\x1b]0;pwned\\x07\\x1b[31m\\x9b2J\\x0d\\u202e[bold]z"


def test_printable_escapes_what_a_terminal_acts_on():
    assert printable(HOSTILE) == SHOWN
    assert printable("plain text, é, 日本, tabs\tare kept") == "plain text, é, 日本, tabs\tare kept"
    message = ScheduleError(f"bad {HOSTILE}", SourceLoc(f"f{HOSTILE}.yaml", 1, 1), hint=HOSTILE).format()
    assert "\x1b" not in message and "\x9b" not in message and "\r" not in message and SHOWN in message


@pytest.mark.parametrize("command", [["check"], ["show"], ["simulate", "--gantt", "always"]], ids=lambda c: c[0])
def test_a_hostile_name_is_printed_escaped(command, tmp_path):
    path = tmp_path / "hostile.yaml"
    name = json.dumps(HOSTILE)  # a YAML double-quoted string holds the control characters
    path.write_text(f"name: {name}\nworld: 2\nstreams: [s]\nprogram: |\n  compute F 1ms\n")
    proc = subprocess.run([sys.executable, "-m", "commdsl.cli", command[0], str(path), *command[1:]],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert not any(c in out for c in "\x1b\x07\x9b\r\u202e"), repr(out[:300])
    assert SHOWN in out, out[:300]


def test_a_hostile_value_in_an_error_is_escaped(tmp_path, capsys):
    path = tmp_path / "hostile.yaml"
    path.write_text(f"name: t\nworld: {json.dumps(HOSTILE)}\nprogram: |\n  pass\n")
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert not any(c in err for c in "\x1b\x07\x9b\r\u202e"), repr(err)


# ---- timeline files whose values are out of any range ------------------------------------------

RAW = "@@raw@@"
"""A placeholder string replaced by raw JSON text (NaN, a number json.dumps will not write)."""

# (id, how the first complete event (`ph: "X"`) is changed, raw text for RAW, message)
TIMELINE_CASES = [
    ("ts_nan", lambda ev: ev.update(ts=RAW), "NaN", "NaN is not a JSON number"),
    ("ts_infinity", lambda ev: ev.update(ts=RAW), "Infinity", "Infinity is not a JSON number"),
    ("ts_1e300", lambda ev: ev.update(ts=1e300), None, "of traceEvents: ts 1e+300 us is out of range"),
    ("dur_negative", lambda ev: ev.update(dur=-5.0), None, "dur -5 us is out of range (0 to 1e+12 us"),
    ("ts_a_string", lambda ev: ev.update(ts="12"), None, "ts is a finite number of microseconds, not a string"),
    ("ts_5000_digits", lambda ev: ev.update(ts=RAW), "9" * 5000, "Exceeds the limit (4300 digits)"),
    ("pid_1e11", lambda ev: ev.update(pid=10**11), None, "pid 100,000,000,000 is out of range"),
    ("pid_outside_world", lambda ev: ev.update(pid=7), None, "rank 7 is outside the world of 2"),
    ("tid_past_tracks", lambda ev: ev.update(tid=99), None, "rank 0 has no track 99"),
    ("pid_float", lambda ev: ev.update(pid=0.5), None, "pid is a whole number, not 0.5"),
    ("op_id_a_list", lambda ev: ev["args"].update(op_id=[1, 2]), None, "args.op_id is a string, not a list"),
    ("kind_unknown", lambda ev: ev["args"].update(kind="teleport"), None, "args.kind 'teleport' is not an op kind"),
    ("role_missing", lambda ev: ev["args"].pop("role"), None, "args.role is one of exec, issue"),
    ("bytes_negative", lambda ev: ev["args"].update(bytes=-4096), None, "args.bytes is a whole number from 0 to"),
    ("bytes_5000_digits", lambda ev: ev["args"].update(bytes=RAW), "1" * 5000, "Exceeds the limit (4300 digits)"),
    ("flops_infinite", lambda ev: ev["args"].update(flops=1e309), None, "Infinity is not a JSON number"),
    ("arg_an_object", lambda ev: ev["args"].update(extra={"a": 1}), None, "args.extra is a string, a number or a list of numbers"),
    ("event_a_list", lambda ev: ev.clear() or ev.update(ph="X", args=RAW), "[1]", "'args' is an object, not a list"),
]  # fmt: skip


@pytest.fixture(scope="module")
def trace_data(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("trace")
    schedule = folder / "ok.yaml"
    schedule.write_text("name: ok\nworld: 2\nstreams: [s]\nprogram: |\n  compute F 1ms\n  all_reduce g 1MiB on s\n")
    assert main(["simulate", str(schedule), "--trace", str(folder / "t.json"), "--json"]) == 0
    return json.loads((folder / "t.json").read_text())


@pytest.mark.parametrize("case_id, change, raw, message", TIMELINE_CASES, ids=[c[0] for c in TIMELINE_CASES])
def test_bad_timeline_value_names_file_and_line(case_id, change, raw, message, trace_data, tmp_path):
    data = json.loads(json.dumps(trace_data))
    k = next(i for i, ev in enumerate(data["traceEvents"]) if ev.get("ph") == "X")
    change(data["traceEvents"][k])
    # One event a line, after otherData: event k on line `head + k + 1`.
    other = json.dumps({key: v for key, v in data.items() if key != "traceEvents"}, indent=1)
    text = other[:-2] + ',\n "traceEvents": [\n' + ",\n".join(json.dumps(ev, allow_nan=True) for ev in data["traceEvents"]) + "\n ]\n}\n"
    line = other.count("\n") + 2 + k
    if raw is not None:
        text = text.replace(json.dumps(RAW), raw)
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(CommdslError) as info:
        Timeline.read(path)
    err = info.value
    assert message in err.message, err.format()
    assert err.loc is not None and (err.loc.file, err.loc.line) == (str(path), line), err.format()
    proc = subprocess.run([sys.executable, "-m", "commdsl.cli", "compare", str(path), str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and f"--> {path}:{err.loc.line}:" in proc.stderr, proc.stderr


def test_annotations_kept_once_are_still_checked_per_span(trace_data, tmp_path):
    """The reader checks a span's annotations once per distinct args: a `true` where an
    equal 1 was read before is still refused (1 == True in Python)."""
    data = json.loads(json.dumps(trace_data))
    first, second = (ev for ev in data["traceEvents"] if ev.get("ph") == "X" and ev["args"].get("kind") == "all_reduce"
                     and ev["args"]["role"] == "exec")  # fmt: skip
    first["args"]["bytes"], second["args"]["bytes"] = 1, True
    path = tmp_path / "bool.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CommdslError, match="args.bytes is a whole number from 0 to .*, got True"):
        Timeline.read(path)
    second["args"]["bytes"] = 1
    path.write_text(json.dumps(data))
    spans = [s for s in Timeline.read(path).spans if s.kind == "all_reduce" and s.role.value == "exec"]
    assert [dict(s.args)["bytes"] for s in spans] == [1, 1] and spans[0].args is spans[1].args


def test_a_timeline_reads_back_as_written(trace_data, tmp_path):
    """The streamed reader gives the spans, flows and counters the writer wrote, in a
    file split across many chunks and pretty-printed over many lines alike."""
    import commdsl.jsonstream as js

    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace_data))
    whole = Timeline.read(path)
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(trace_data, indent=3))
    chunk = js.CHUNK_CHARS
    js.CHUNK_CHARS = 5
    try:
        small = Timeline.read(pretty)
    finally:
        js.CHUNK_CHARS = chunk
    assert small.spans == whole.spans and small.flows == whole.flows and small.counters == whole.counters
    assert len(whole.spans) >= 4 and whole.world_size == 2
    again = tmp_path / "again.json"
    whole.write(again)
    assert json.loads(again.read_text()) == trace_data


def test_infinite_values_in_meta_are_read(trace_data, tmp_path):
    """A machine's infinite bandwidth (a barrier's) sits in the meta as Infinity, as
    json.dumps writes it: read back as it is; only the events' numbers must be finite."""
    data = json.loads(json.dumps(trace_data))
    data["otherData"]["commdsl"]["meta"]["bandwidth_gb_per_s"] = float("inf")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    assert Timeline.read(path).meta["bandwidth_gb_per_s"] == float("inf")
