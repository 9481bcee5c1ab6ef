"""Hangs end by the watchdog: a report from every rank, a partial timeline, a non-zero
exit, no orphan processes."""

from __future__ import annotations

import json
import re
import time

import pytest

try:
    from test_run_support import DATA, processes_mentioning, torchrun
except ImportError:
    from tests.test_run_support import DATA, processes_mentioning, torchrun

TIMEOUT_S = 3
FIRE_ALLOWANCE_S = 5
"""The watchdog polls every quarter second; a loaded 2-core machine delays it a little."""


@pytest.mark.parametrize(
    "schedule, extra, stuck",
    [
        ("recv_without_send.yaml", ["--no-validate"], "rank 1: stuck on op 1:1 recv t from rank 0"),
        ("head_to_head.yaml", ["--no-validate"], "stuck on op 0:0 recv a from rank 1"),
        # Rank 0 has no op: its partial timeline holds none of its spans (it used to fail).
        ("rank0_idle_hang.yaml", ["--no-validate"], "rank 1: stuck on op 1:0 recv t from rank 0"),
    ],
)
def test_a_hang_ends_with_reports_a_partial_timeline_and_nonzero_exit(tmp_path, schedule, extra, stuck):
    out = tmp_path / "partial.json"
    run = torchrun(2, [str(DATA / schedule), *extra, "--timeout", str(TIMEOUT_S), "--out", str(out),
                       "--warmup", "0", "--iters", "1"], timeout_s=60)  # fmt: skip
    assert run.returncode != 0
    err = run.stderr
    # The watchdog fires within the timeout plus a few seconds of the stuck op's issue,
    # as its own report says (torchrun's start-up on a busy machine is no part of it).
    waited = [float(s) for s in re.findall(r"issued ([0-9.]+)s ago", err)]
    assert waited and TIMEOUT_S <= min(waited) < TIMEOUT_S + FIRE_ALLOWANCE_S, err
    assert stuck in err
    assert f"{schedule}:" in err  # the source line of the op
    assert "rank 0:" in err and "rank 1:" in err  # every rank reports
    assert "exitcode  : 3" in err  # the watchdog's exit status reaches torchrun
    data = json.loads(out.read_text())
    assert data["otherData"]["commdsl"]["meta"]["partial"] is True
    running = [e for e in data["traceEvents"] if e["ph"] == "X" and e["args"].get("state") == "running"]
    assert running, "the stuck op is in the partial timeline"
    time.sleep(0.5)
    assert processes_mentioning(str(out)) == [], "orphan processes remain"


def test_a_hang_the_static_check_finds_stops_every_rank_before_any_op_runs(tmp_path):
    """Head-to-head blocking recvs match (every send has its recv) but cannot finish:
    every rank runs `commdsl check`'s deadlock check after loading, so the run ends with
    its report (exit 3) at once, not when the watchdog fires."""
    out = tmp_path / "partial.json"
    run = torchrun(2, [str(DATA / "head_to_head.yaml"), "--timeout", "600", "--out", str(out)], timeout_s=120)
    err = run.stderr
    assert "deadlock: no op can progress and 2 of 2 ranks have ops left" in err, err
    assert "Ranks 0 and 1 are both blocked receiving from each other (head to head)" in err
    assert "head_to_head.yaml:8:3" in err
    assert "exitcode  : 3" in err
    assert "stuck on op" not in err and not out.exists()  # no watchdog, no partial timeline


def test_a_long_schedule_that_keeps_progressing_is_not_stopped(tmp_path):
    """The watchdog judges progress, not age: each op finishes 0.6 s after the one before,
    so the run lives well past --timeout although its last op waits 4.8 s after its issue."""
    out = tmp_path / "measured.json"
    run = torchrun(2, [str(DATA / "long_but_moving.yaml"), "--timeout", "2", "--duration-mode", "sleep", "--out", str(out),
                       "--warmup", "0", "--iters", "1"], timeout_s=90)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "stuck" not in run.stderr
    spans = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X" and e["args"].get("role") == "exec"]
    assert len(spans) == 16
    assert max(e["ts"] + e["dur"] for e in spans) - min(e["ts"] for e in spans) > 2 * 2e6, "it ran past twice the timeout"
