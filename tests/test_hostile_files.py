"""Files written to attack the user's terminal or commdsl itself: terminal escape
sequences in names and values are printed escaped, and timeline files with values out
of any range fail with the file and the line, never a traceback (commdsl/timeline.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
