"""bench/accuracy_spread.py tells a model's bias from the measurement's spread."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "accuracy_spread.py"


def _run_dir(root: Path, i: int, errors: dict[str, float], launches: dict[str, list[float]]) -> Path:
    d = root / f"run{i}"
    d.mkdir()
    rows = [{"schedule": n, "makespan_error_pct": e, "launch_makespans_ms": launches[n]} for n, e in errors.items()]
    (d / "accuracy.json").write_text(json.dumps({"rows": rows}))
    return d


def _spread(*args: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120)


def test_a_constant_bias_fails_every_run_and_is_told_from_spread(tmp_path: Path) -> None:
    # "slow" is always 12% off (a bias); "steady" moves by a point. Launches agree exactly.
    launches = {"slow": [100.0, 100.0, 100.0], "steady": [50.0, 50.0, 50.0]}
    dirs = [_run_dir(tmp_path, i, {"slow": 12.0, "steady": e}, launches) for i, e in enumerate((1.0, -1.0, 0.5, -0.5))]
    proc = _spread(*dirs)
    assert proc.returncode == 0, proc.stderr
    assert "both targets: 0 of 4 runs as measured, 4 of 4 with each schedule's mean error taken out" in proc.stdout
    assert "worst <= 10% in 100% of runs" in proc.stdout  # no launch noise at all
    slow = next(line for line in proc.stdout.splitlines() if line.startswith("slow"))
    assert slow.split()[1:] == ["+12.0%", "0.0%", "0.0%"]


def test_launch_noise_alone_keeps_a_perfect_model_from_the_target(tmp_path: Path) -> None:
    # One launch's sd about 10%: a model with no error still misses in a good share of runs.
    launches = {"noisy": [90.0, 100.0, 110.0]}
    dirs = [_run_dir(tmp_path, i, {"noisy": 0.0}, launches) for i in range(2)]
    proc = _spread(*dirs)
    assert proc.returncode == 0, proc.stderr
    noisy = next(line for line in proc.stdout.splitlines() if line.startswith("noisy"))
    assert noisy.split()[3] == "10.0%"
    rate = int(proc.stdout.split("worst <= 10% in ")[1].split("%")[0])
    assert 83 <= rate <= 90  # |median of three N(0, 0.1)| <= 0.1: 86.5% (its CDF is 3F^2 - 2F^3)


def test_a_directory_without_results_is_a_clear_error(tmp_path: Path) -> None:
    proc = _spread(tmp_path)
    assert proc.returncode != 0
    assert f"{tmp_path / 'accuracy.json'}: no such file" in proc.stderr and "Traceback" not in proc.stderr


def test_a_file_that_is_not_a_bench_result_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "accuracy.json").write_text('{"rows": [{"schedule": "p2p"}]}')  # no launches
    proc = _spread(tmp_path)
    assert proc.returncode != 0
    assert "not a bench/accuracy.py result (KeyError" in proc.stderr and "Traceback" not in proc.stderr
