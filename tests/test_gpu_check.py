"""bench/gpu_check.py on this CPU (gloo), as CI runs it; on a GPU the same script runs NCCL.

It runs the real executor on one rank, a real one-rank calibration (`commdsl calibrate
-n 1`), simulations on the preset and on the calibrated file, and `commdsl compare --json`;
here on two of its schedules with --quick, which keeps it to a minute or two.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from commdsl.dsl import load_schedule_text
from commdsl.machine import resolve_machine
from commdsl.sim import simulate
from commdsl.timeline import SpanRole

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.py"


@pytest.fixture(scope="module")
def check_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("gpu_check") / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--quick", "--only", "copies", "--only", "memory"],
                          capture_output=True, text=True, timeout=1200)  # fmt: skip
    return proc, out


def test_the_check_runs_calibrates_simulates_and_compares_every_schedule(check_run):
    proc, out = check_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [r["schedule"] for r in summary["rows"]] == ["copies", "memory"]
    for row in summary["rows"]:
        for key in ("measured_ms", "preset_ms", "calibrated_ms", "preset_error_pct", "calibrated_error_pct"):
            assert isinstance(row[key], float), (row["schedule"], key, row)
        assert row["measured_ms"] > 0 and row["calibrated_ms"] > 0
        assert set(row["worst_ops"]) == {"preset", "calibrated"}
        for label in ("preset", "calibrated"):
            cmp = json.loads((out / "compare" / f"{row['schedule']}.{label}.json").read_text())
            assert cmp["ops_compared"] > 0 and not cmp["only_predicted"] and not cmp["only_measured"]
    # Each schedule ran once with --check before its timed run, and every step is logged.
    names = [s["name"] for s in summary["steps"]]
    assert names.index("run-check-copies") < names.index("run-copies") < names.index("calibrate")
    assert all((out / s["output_file"]).is_file() for s in summary["steps"])
    env = json.loads((out / "env" / "versions.json").read_text())
    assert env["torch"] and env["cuda_available"] is False and env["nccl"] is None
    assert "| copies |" in (out / "summary.md").read_text()


def test_the_one_rank_calibration_measures_copies_both_ways_and_takes_its_transports_from_the_base(check_run):
    proc, out = check_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (out / "calibrated.yaml").read_text()
    assert "# One rank: communication not measured; the transports are cpu-loopback's." in text
    machine = resolve_machine(str(out / "calibrated.yaml"))
    assert machine.calibration is not None and machine.num_devices == 1
    assert machine.host_copy_profile and machine.to_host_copy_profile and machine.device_copy_profile
    assert dict(machine.transports).keys() == dict(resolve_machine("cpu-loopback").transports).keys()
    raw = json.loads((out / "calibration_raw.json").read_text())
    assert raw["to_host_copy_us"] and raw["host_copy_us"] and not raw["p2p_us"]


def test_a_device_to_host_copy_takes_its_own_profile():
    text = """
name: copies
world: 1
streams: [s]
program: |
  copy up 4MiB from host
  copy down 4MiB to host
"""
    base = resolve_machine("h100-nvlink")
    machine = dataclasses.replace(base, host_copy_profile=((1024.0, 10.0), (8 * 2**20, 1000.0)),
                                  to_host_copy_profile=((1024.0, 10.0), (8 * 2**20, 3000.0)))  # fmt: skip
    result = simulate(load_schedule_text(text), machine, network="analytic")
    up, down = (s.duration_us for s in result.timeline.spans if s.kind == "copy" and s.role is SpanRole.EXEC)
    assert up == pytest.approx(machine.host_copy_us(4 * 2**20))
    assert down == pytest.approx(machine.host_copy_us(4 * 2**20, to_host=True))
    assert down > 2 * up  # the to_host table, not the host one


def test_an_output_folder_that_is_not_empty_is_refused(tmp_path):
    (tmp_path / "old.txt").write_text("x")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not an empty folder" in proc.stderr
