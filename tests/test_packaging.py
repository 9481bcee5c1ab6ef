"""A plain, non-editable install ships the grammar and the bundled schedules."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if proc.returncode != 0 and "hatchling" in proc.stderr:
        # No hatchling in this environment: build it the way `pip install .` does.
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (whl,) = out.glob("commdsl-*.whl")
    return whl


def test_wheel_ships_grammar_and_schedules(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "commdsl/grammars/commdsl.lark" in names
    bundled = {p.name for p in (ROOT / "schedules").glob("*.yaml")}
    assert bundled and all(f"commdsl/schedules/{n}" in names for n in bundled)
    assert "commdsl/cli.py" in names


def test_installed_wheel_runs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    # A venv that sees this interpreter's dependencies but not the source tree.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)], check=True, timeout=300)
    proc = subprocess.run(
        [str(py), "-c", "import commdsl.resources as r, commdsl.cli as c; print(r.grammar_path()); raise SystemExit(c.main(['check', '1f1b']))"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert str(venv) in proc.stdout.splitlines()[0], "grammar must come from the installed package"
    assert "1f1b: ok" in proc.stdout
