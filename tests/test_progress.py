"""Progress of long work: periodic plain lines on stderr when it is not a terminal, a
rich bar when it is, nothing on stdout (so --json stays clean)."""

from __future__ import annotations

import dataclasses
import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from commdsl.dsl import load_schedule
from commdsl.errors import UsageError
from commdsl.machine import resolve_machine
from commdsl.machine.model import ComputeNoise
from commdsl.progress import PROGRESS_INTERVAL_ENV, Progress, interval_from_environ
from commdsl.sim import simulate

BIG = ["1f1b", "-p", "stages=32", "-p", "microbatches=256"]
"""About 49,000 ops: seconds of expansion and simulation on any machine, so that lines at
a 10 ms interval show every phase."""


def _cli(args: list[str], interval_s: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **{PROGRESS_INTERVAL_ENV: interval_s})
    return subprocess.run([sys.executable, "-m", "commdsl.cli", *args], capture_output=True, text=True, timeout=300, env=env)


def test_simulate_prints_progress_lines_on_stderr_when_piped():
    proc = _cli(["simulate", *BIG, "--json"], "0.01")
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)  # stdout is the JSON alone
    lines = proc.stderr.splitlines()
    assert any(ln.startswith("commdsl simulate: expanding 1f1b") for ln in lines), proc.stderr
    assert any(ln.startswith("commdsl simulate: simulating on h100-nvlink: ") and " ops (" in ln for ln in lines), proc.stderr
    assert lines[-1].startswith("commdsl simulate: done, ")


def test_check_reports_its_deadlock_simulation():
    proc = _cli(["check", *BIG, "--json"], "0.01")
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)
    assert "commdsl check: checking that every rank finishes" in proc.stderr


def test_show_reports_formatting_its_listing():
    proc = _cli(["show", *BIG], "0.01")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("1f1b: 32 ranks, ") and "commdsl show" not in proc.stdout
    assert any(ln.startswith("commdsl show: formatting the grid and listings: ") and " ops (" in ln for ln in proc.stderr.splitlines()), proc.stderr


def test_progress_off_and_bad_intervals():
    off = _cli(["simulate", *BIG, "--json"], "0")
    assert off.returncode == 0 and off.stderr == ""
    bad = _cli(["simulate", "1f1b", "--json"], "soon")
    assert bad.returncode == 2 and f"{PROGRESS_INTERVAL_ENV}='soon'" in bad.stderr and "Traceback" not in bad.stderr


def test_the_simulators_callback_counts_every_op_once(monkeypatch):
    from commdsl.sim import engine

    monkeypatch.setattr(engine, "PROGRESS_EVENTS", 500)  # many reports from a small program
    program = load_schedule("1f1b", {"stages": "8", "microbatches": "64"})
    heard: list[tuple[int, int]] = []
    simulate(program, resolve_machine("h100-nvlink"), progress=lambda done, total: heard.append((done, total)))
    ops = sum(len(r) for r in program.ops)
    assert heard[0] == (0, ops) and heard[-1] == (ops, ops) and len(heard) > 2
    assert all(total == ops for _, total in heard) and [d for d, _ in heard] == sorted(d for d, _ in heard)
    sampled: list[tuple[int, int]] = []
    cpu = resolve_machine("cpu-loopback")
    noisy = dataclasses.replace(cpu, contention=dataclasses.replace(cpu.contention, noise=ComputeNoise(stalls_per_s=1.0, stall_us=100.0)))
    simulate(program, noisy, samples=3, progress=lambda done, total: sampled.append((done, total)))
    assert sampled[-1] == (3 * ops, 3 * ops)  # one run per sample


def test_a_terminal_gets_a_rich_bar_and_no_plain_lines():
    master, slave = pty.openpty()
    stream = os.fdopen(slave, "w")
    try:
        with Progress("commdsl test", stream=stream, interval_s=0.01) as progress:
            progress.phase("simulating", total=10, unit="ops")
            for _ in range(10):
                progress.advance(1)
                time.sleep(0.02)
        stream.flush()
        out = b""
        while True:
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                break
            out += os.read(master, 65536)
    finally:
        stream.close()
        os.close(master)
    text = out.decode(errors="replace")
    assert "simulating" in text and "\x1b[" in text  # drawn by rich, with terminal control codes
    assert "commdsl test:" not in text


def test_plain_line_and_interval_from_environ(monkeypatch):
    p = Progress("commdsl x", interval_s=60)
    p.phase("measuring", total=200, unit="steps")
    p.advance(50, "p2p 4KiB")
    assert p.line().startswith("commdsl x: p2p 4KiB: 50 of 200 steps (25%), ")
    monkeypatch.delenv(PROGRESS_INTERVAL_ENV, raising=False)
    assert interval_from_environ() == 5.0
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "0.5")
    assert interval_from_environ() == 0.5
    for bad in ("-1", "nan", "inf", "x"):
        monkeypatch.setenv(PROGRESS_INTERVAL_ENV, bad)
        with pytest.raises(UsageError, match="give the seconds between progress lines"):
            interval_from_environ()
