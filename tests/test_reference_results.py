"""Every bundled schedule, expanded and simulated, against the results recorded before the
fast paths: the expanded program (its JSON, by digest) and every op's predicted start and
end, on the analytic and flow networks and on a CPU machine with its contention model.

The reference files were written by the engine as it was before any fast path; a change
that moves a result shows up here. When a change of results is intended, regenerate them
and review the diff in the commit:

    COMMDSL_UPDATE_GOLDEN=1 python -m pytest tests/test_reference_results.py
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from commdsl.dsl import load_schedule
from commdsl.errors import CommdslError
from commdsl.resources import bundled_schedules
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.machine.loader import PRESETS_DIR
from commdsl.sim import simulate

REFERENCE = Path(__file__).parent / "golden" / "reference"
UPDATE = os.environ.get("COMMDSL_UPDATE_GOLDEN") == "1"

CONFIGS = (("h100-nvlink", "analytic", 1), ("h100-nvlink", "flow", 1), ("dgx-h100", "flow", 1), ("cpu-loopback", "analytic", 1),
           ("cpu-noisy", "flow", 3), ("cpu-noisy-slowed", "flow", 3))  # fmt: skip
"""(machine, network, samples) every bundled schedule is simulated with."""
MACHINE_FOR = {"memcpy_vs_nccl": "pcie-nvlink-pairs"}
"""Schedules written for one machine: it replaces the h100-nvlink rows."""
REL_TOLERANCE = 1e-9
NOISE = "compute_noise: {stalls_per_s: 200, stall_us: 300}\n"
"""cpu-noisy: cpu-loopback with compute stalls, so that samples differ (the noise path)."""
SLOWED = "copy_compute_slowdown: 1.2\ncompute_comm_slowdown: 1.25\n"
"""cpu-noisy-slowed: cpu-noisy where copies slow compute and compute slows comm, as on a
calibrated CPU machine: compute runs on timers that follow the work beside it."""


def _machine(name: str):
    text = (PRESETS_DIR / "cpu-loopback.yaml").read_text()
    if name == "cpu-noisy":
        return load_machine_text(text + NOISE, "cpu-noisy.yaml")
    if name == "cpu-noisy-slowed":
        return load_machine_text(text + NOISE + SLOWED, "cpu-noisy-slowed.yaml")
    return resolve_machine(name)


def _digest(program) -> str:
    return hashlib.sha256(json.dumps(program.to_json(), sort_keys=True).encode()).hexdigest()


def _results(name: str) -> dict:
    program = load_schedule(name, {})
    out: dict = {"program_sha256": _digest(program), "num_ops": program.num_ops, "runs": {}}
    for machine_name, network, samples in CONFIGS:
        machine_name = MACHINE_FOR.get(name, machine_name) if machine_name == "h100-nvlink" else machine_name
        try:
            result = simulate(program, _machine(machine_name), network, samples=samples)
        except CommdslError as e:  # a machine without a rate the schedule needs: the message is the result
            out["runs"][f"{machine_name}/{network}/{samples}"] = {"error": str(e)}
            continue
        raw = result.raw
        out["runs"][f"{machine_name}/{network}/{samples}"] = {
            "makespan_us": result.makespan_us,
            "sampling": result.sampling,
            "start_us": [round(x, 6) for x in raw.start],
            "end_us": [round(x, 6) for x in raw.end],
        }
    return out


@pytest.mark.parametrize("name", sorted(bundled_schedules()))
def test_bundled_schedule_results_are_unchanged(name: str):
    path = REFERENCE / f"{name}.json"
    got = _results(name)
    if UPDATE:
        path.write_text(json.dumps(got, separators=(",", ":")) + "\n")
    expected = json.loads(path.read_text())
    assert got["num_ops"] == expected["num_ops"]
    assert got["program_sha256"] == expected["program_sha256"], f"{name}: the expanded program changed"
    assert got["runs"].keys() == expected["runs"].keys()
    for key, run in expected["runs"].items():
        mine = got["runs"][key]
        if "error" in run:
            assert mine == run
            continue
        samples_us = run["sampling"].get("sample_makespans_us", [])
        assert mine["sampling"].get("sample_makespans_us", []) == pytest.approx(samples_us, rel=REL_TOLERANCE), f"{name} on {key}"
        assert mine["makespan_us"] == pytest.approx(run["makespan_us"], rel=REL_TOLERANCE), f"{name} on {key}"
        for field in ("start_us", "end_us"):
            for g, (a, b) in enumerate(zip(mine[field], run[field], strict=True)):
                assert a == pytest.approx(b, rel=REL_TOLERANCE, abs=1e-6), f"{name} on {key}: op #{g} {field} {a} != {b}"
