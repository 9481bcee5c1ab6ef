"""check, show, simulate and compare never import torch: the simulator must run where
torch is absent (only the executor and calibrate need it)."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
from commdsl.cli import main
for argv in (["check", "1f1b"], ["show", "1f1b", "--no-listing"], ["simulate", "1f1b", "--trace", sys.argv[1]],
             ["compare", sys.argv[1], sys.argv[1], "--json"]):
    code = main(argv)
    assert code == 0, (argv, code)
print("ok")
"""


def test_commands_run_without_torch(tmp_path) -> None:
    trace = tmp_path / "t.json"
    proc = subprocess.run([sys.executable, "-c", PROBE, str(trace)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("ok")


BLOCKED = """
import runpy, sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_module(sys.argv[0], run_name="__main__")
"""


def test_the_executors_entry_points_say_torch_is_missing(tmp_path) -> None:
    """`python -m commdsl.run` (what torchrun runs per rank), `commdsl run` and a
    calibration rank end in a usage error naming the install, not an ImportError."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2"}
    cases = [(["commdsl.run", "stream_overlap"], os.environ, "`python -m commdsl.run` runs ranks"),
             (["commdsl.cli", "run", "stream_overlap"], os.environ, "`commdsl run` runs ranks"),
             (["commdsl.calibrate", "--out", str(tmp_path / "m.yaml")], env, "`torchrun -m commdsl.calibrate` runs ranks")]  # fmt: skip
    for argv, environ, message in cases:
        proc = subprocess.run([sys.executable, "-c", BLOCKED, *argv], capture_output=True, text=True, timeout=120, env=environ)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert message in proc.stderr and "torch is not installed here" in proc.stderr, proc.stderr
        assert 'pip install "commdsl[run]"' in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
