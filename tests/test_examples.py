"""The examples under examples/ run as a user runs them, and say what they claim."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_auto_pipeliner_prints_every_split_and_the_best():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "auto_pipeliner.py"), "--microbatches", "8"],
                         capture_output=True, text=True, timeout=600, check=True).stdout  # fmt: skip
    rows = re.findall(r"^\s+(\d)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\[([\d, ]+)\]$", out, re.M)
    assert [int(r[0]) for r in rows] == list(range(2, 9))
    for stages, _, bubble, _, split in rows:
        layers = [int(x) for x in split.split(",")]
        assert len(layers) == int(stages) and sum(layers) == 16 and min(layers) >= 1
        assert 0 < float(bubble) < 1
    step = {int(r[0]): float(r[1]) for r in rows}
    best = min(step, key=step.get)
    assert re.search(rf"^best: {best} stages, {step[best]:.2f} ms per step", out, re.M)
    # More stages hold fewer layers each: the largest stage's memory shrinks.
    assert float(rows[-1][3]) < float(rows[0][3])


def test_auto_pipeliner_on_another_machine_differs():
    """Compute is work (FLOPs): a slower GPU gives a longer step."""
    def step_of(machine: str) -> float:
        out = subprocess.run([sys.executable, str(ROOT / "examples" / "auto_pipeliner.py"), "--machine", machine],
                             capture_output=True, text=True, timeout=600, check=True).stdout  # fmt: skip
        return float(re.search(r"^best: \d stages, ([\d.]+) ms", out, re.M).group(1))

    assert step_of("dgx-a100") > step_of("dgx-h100")
