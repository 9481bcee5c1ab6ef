"""Golden files: the exact trace and IR JSON of small schedules.

A change to the simulator's timing, the trace format or the expander shows up here as
a diff a reviewer reads. When the change is intended, regenerate the files and review
them in the commit:

    COMMDSL_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from commdsl.cli import main

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("COMMDSL_UPDATE_GOLDEN") == "1"

TRACES = {
    "1f1b_trace.json": ["simulate", "1f1b", "-p", "stages=2", "-p", "microbatches=2"],
    "collectives_trace.json": ["simulate", "collectives", "-p", "tensor=fp32[6]"],
    "memcpy_vs_nccl_pcie_trace.json": ["simulate", "memcpy_vs_nccl", "-p", "gpus=4", "-p", "copies=4", "-p", "msg=4MiB",
                                       "-p", "t_compute=1ms", "--machine", "pcie-nvlink-pairs"],
}  # fmt: skip


def _check(name: str, produced: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(produced)
    assert path.exists(), f"missing golden file {path}; run with COMMDSL_UPDATE_GOLDEN=1 to create it"
    expected = path.read_text()
    if produced != expected:
        # Point at the first differing event rather than dumping megabytes.
        a, b = json.loads(produced), json.loads(expected)
        ea, eb = a.get("traceEvents", a.get("ranks")), b.get("traceEvents", b.get("ranks"))
        first = next((i for i, (x, y) in enumerate(zip(ea, eb)) if x != y), min(len(ea), len(eb)))
        pytest.fail(f"{name} differs from the golden file at entry {first}:\n  got      {ea[first] if first < len(ea) else None}\n"
                    f"  expected {eb[first] if first < len(eb) else None}\n(regenerate with COMMDSL_UPDATE_GOLDEN=1 if intended)")


@pytest.mark.parametrize("name", sorted(TRACES))
def test_simulated_trace_matches_golden(name: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / name
    assert main([*TRACES[name], "--trace", str(out)]) == 0
    capsys.readouterr()
    _check(name, out.read_text())


def test_expanded_ir_matches_golden(capsys) -> None:
    assert main(["show", "1f1b", "-p", "stages=2", "-p", "microbatches=2", "--json"]) == 0
    _check("1f1b_ir.json", capsys.readouterr().out)
