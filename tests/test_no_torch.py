"""check, show, simulate and compare never import torch: the simulator must run where
torch is absent (only the executor and calibrate need it)."""

from __future__ import annotations

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
