"""`commdsl compare --html`: the report's times are rounded to four significant digits
with one unit per column, its worst ops link to their quoted statements, it loads
nothing from the network, and its timeline script runs without error in a real
headless Chromium (Debian's `chromium`, which `.ci/run` installs), drawing every span."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from commdsl.cli import main
from commdsl.report import format_time, time_column

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]  # fmt: skip


@pytest.mark.parametrize("us, text", [(86079.1, "86.08 ms"), (1234567.0, "1.235 s"), (412.46, "412.5 us"), (0.5, "500.0 ns"),
                                      (12.0, "12.00 us"), (0.0, "0.000 us")])  # fmt: skip
def test_a_time_shows_four_significant_digits_in_its_unit(us, text):
    assert format_time(us) == text


def test_a_column_of_times_has_one_unit_and_the_same_decimals():
    assert time_column([86079.1, 512.3, 0.0]) == ("ms", ["86.08", "0.51", "0.00"])
    assert time_column([3.26, 120.0]) == ("us", ["3.3", "120.0"])


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """A real comparison's report: the same schedule simulated on two machines."""
    root = tmp_path_factory.mktemp("report")
    sched = ["ddp_overlap", "-p", "ranks=2", "-p", "layers=4", "--json"]
    for machine, name in (("dgx-h100", "p.json"), ("a100-nvlink", "m.json")):
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["simulate", *sched, "--machine", machine, "--trace", str(root / name)]) == 0
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["compare", str(root / "p.json"), str(root / "m.json"), "--html", str(root / "r.html"), "--json"]) == 0
    return root / "r.html"


def test_columns_name_their_unit_and_the_worst_ops_link_to_their_statements(report):
    text = report.read_text()
    tables = text[text.index("<h2>Per rank</h2>"):]
    headers = re.findall(r"<th(?: class=num)?>([^<]*)</th>", tables)
    timed = [h for h in headers if h.startswith(("compute", "comm", "exposed", "idle", "predicted", "measured", "start error"))]
    assert len(timed) == 8 + 3
    assert timed and all(re.search(r" \((s|ms|us|ns)\)$", h) for h in timed), timed
    # No cell shows more than four significant digits of a time or a unit of its own.
    assert not re.search(r"<td class=num>\d+\.\d{5,}</td>", text)
    assert not re.search(r"<td class=num>[^<]*(ms|us)</td>", text)
    links = re.findall(r'<a href="#(src-\d+)">schedules/ddp_overlap\.yaml:(\d+)</a>', text)
    assert links
    for anchor, line in links:
        quote = re.search(rf'<div id="{anchor}" class="src"><div class="file">schedules/ddp_overlap\.yaml:{line}</div><pre>(.*?)</pre>', text, re.S)
        assert quote and f'<span class="hit">{int(line):>5}  ' in quote.group(1)
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", text)  # nothing from the network


def _chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it: apt-get install chromium)")
    return path


def test_the_timeline_script_runs_in_chromium_and_draws_every_span(report, tmp_path):
    chromium = _chromium()
    profile = tmp_path / "profile"
    profile.mkdir()
    url = report.resolve().as_uri()
    run = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
                          "--virtual-time-budget=5000", "--dump-dom", url], capture_output=True, text=True, timeout=180)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    assert not [line for line in console if "Uncaught" in line or "Error" in line], console
    data = json.loads(re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', report.read_text(), re.S).group(1))
    spans = sum(len(lane["spans"]) for lane in data["lanes"])
    assert spans > 0
    assert f'data-drawn-spans="{spans}"' in run.stdout
    shot = tmp_path / "report.png"
    subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--window-size=1400,1000",
                    f"--screenshot={shot}", url], capture_output=True, timeout=180, check=True)  # fmt: skip
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
