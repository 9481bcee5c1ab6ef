"""A plain, non-editable install ships the grammar and the bundled schedules."""

from __future__ import annotations

import os
import site
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


def _dependency_dirs() -> list[str]:
    """Where this interpreter finds commdsl's dependencies: its site-packages (a venv's
    or the system's) and the user site, never the checkout."""
    dirs = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir() and Path(d).resolve() != ROOT]


def test_installed_wheel_runs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    # A fresh venv (no --system-site-packages: from inside a user's venv that would show
    # the base interpreter's packages, not the user's) that holds the wheel, and sees
    # this interpreter's dependencies through a .pth file listing their folders. A .pth
    # line adds the folder alone: the .pth files inside it (this checkout's editable
    # install among them) are not read, so the checkout stays invisible.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()  # fmt: skip
    (Path(purelib) / "outer_dependencies.pth").write_text("".join(f"{d}\n" for d in _dependency_dirs()))
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, timeout=300)
    proc = subprocess.run(
        [str(py), "-c", "import commdsl, commdsl.resources as r, commdsl.cli as c, commdsl.sim as s; print(commdsl.__file__); "
                        "print(r.grammar_path()); print(s.ENGINE_BUILD.describe()); raise SystemExit(c.main(['check', '1f1b']))"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, env={**os.environ, "PYTHONPATH": ""},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    package, grammar, engine = proc.stdout.splitlines()[:3]
    assert package.startswith(purelib), f"commdsl must come from the installed wheel, not {package}"
    assert grammar.startswith(purelib), "grammar must come from the installed package"
    assert "1f1b: ok" in proc.stdout
    # A wheel built with the compiled modules runs them (its stamp matches the sources it holds).
    compiled = "commdsl/compiled.sha256" in zipfile.ZipFile(wheel).namelist()
    assert (engine == "compiled (Cython)") == compiled, engine


def test_ci_runs_the_readmes_test_command_in_a_fresh_venv() -> None:
    """`.ci/run` is what a newcomer does: a fresh venv (no --system-site-packages),
    activated, then the README's test command word for word."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("Set up and run the tests", 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0]
    (command,) = [ln for ln in block.splitlines() if ln.strip()]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci, f".ci/run must run the README's test command: {command}"
    lines = [ln for ln in ci if ln.strip() and not ln.lstrip().startswith("#")]
    venv = next(i for i, ln in enumerate(lines) if " -m venv " in ln)
    assert "--system-site-packages" not in lines[venv]
    assert any("bin/activate" in ln for ln in lines[venv:lines.index(command)])
