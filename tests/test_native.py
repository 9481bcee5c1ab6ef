"""The compiled modules (hatch_build.py) against the Python source they are built from,
and `commdsl.native` choosing between them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commdsl import ENGINE_BUILD, native

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "commdsl"
needs_build = pytest.mark.skipif(not ENGINE_BUILD.compiled, reason=f"the engine runs as {ENGINE_BUILD.describe()}")


def _run(code: str, env: dict[str, str], cwd: Path = ROOT) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@needs_build
def test_the_compiled_modules_simulate_and_trace_every_bundled_schedule_as_the_source_does():
    # Each in its own process: the source run loads both modules from the .py files.
    script = (ROOT / "tests" / "engine_digests.py").read_text()
    compiled = _run(script, {native.PURE_ENV: ""}).splitlines()
    source = _run(script, {native.PURE_ENV: "1"}).splitlines()
    assert compiled[0] == "engine: compiled (Cython)"
    assert source[0] == f"engine: Python source ({native.PURE_ENV} is set)"
    assert len(compiled) > 100 and sum("Error" not in line for line in compiled) > 100
    assert sum(" trace " in line for line in compiled) > 30
    assert compiled[1:] == source[1:]


# Random chains (rings of a shuffled order, leads and parts as linear forms), replayed as
# the calibration's fit replays nccl-tests' loop: the floats, printed exactly.
CHAIN_REPLAY = """
import random
from array import array
from commdsl import ENGINE_BUILD
from commdsl.sim.chain_times import ChainTerms
print(ENGINE_BUILD.describe())
rng = random.Random(5)
for _ in range(40):
    rings, members, lats = rng.randint(1, 4), rng.randint(2, 12), rng.randint(1, 4)
    first = list(range(100, 100 + members))
    orders = tuple(tuple(first if j == 0 else rng.sample(first, members)) for j in range(rings))
    form = lambda: tuple(tuple(tuple(rng.uniform(0, 3) for _ in range(lats)) for _ in range(members)) for _ in range(rings))
    col = lambda: tuple(tuple(rng.uniform(0, 1e6) for _ in range(members)) for _ in range(rings))
    terms = ChainTerms(orders, form(), col(), col(), form(), col(), col())
    unit = array("d", [rng.uniform(0, 10) for _ in range(lats)])
    print(terms.run_us(unit, rng.uniform(1, 500), rng.uniform(0, 5000), rng.randint(1, 25)).hex())
"""


@needs_build
def test_the_compiled_chain_replay_gives_the_sources_floats():
    compiled = _run(CHAIN_REPLAY, {native.PURE_ENV: ""}).splitlines()
    source = _run(CHAIN_REPLAY, {native.PURE_ENV: "1"}).splitlines()
    assert compiled[0] == "compiled (Cython)" and source[0].startswith("Python source")
    assert len(compiled) == 41 and len(set(compiled[1:])) == 40
    assert compiled[1:] == source[1:]


def _copy_package(tmp_path: Path) -> Path:
    """The package, with its build, in a folder of its own (to edit without touching ours)."""
    shutil.copytree(PACKAGE, tmp_path / "commdsl", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "commdsl"


# Imports every compiled module (the timeline first: it is imported before the simulator
# where a measured trace is read).
SHOW = ("import sys, commdsl.timeline, commdsl.sim.trace, commdsl.sim.chain_times, commdsl.sim as s; print(s.ENGINE_BUILD.describe()); "
        f"print(*(sys.modules['commdsl.' + m].__file__ for m in {native.MODULES!r}), sep=chr(10))")


def _show(tmp_path: Path, env: dict[str, str]) -> tuple[str, list[str]]:
    """Which engine a process in `tmp_path` says it runs, and the files of its modules."""
    described, *files = _run(SHOW, env, tmp_path).splitlines()
    return described, files


@needs_build
def test_modules_edited_since_the_build_run_from_their_source(tmp_path):
    package = _copy_package(tmp_path)
    env = {"PYTHONPATH": str(tmp_path), native.PURE_ENV: ""}
    described, files = _show(tmp_path, env)
    assert described == "compiled (Cython)" and all(f.endswith(".so") for f in files), files
    with open(package / "sim" / "engine.py", "a") as f:
        f.write("\n# edited\n")
    described, files = _show(tmp_path, env)
    assert described.startswith("Python source (the compiled modules were built from other sources")
    # Every one: they type with each other's classes.
    assert files == [str(native.source_path(package, m)) for m in native.MODULES]


def test_with_no_build_the_modules_run_from_their_source(tmp_path):
    package = _copy_package(tmp_path)
    for name in native.MODULES:
        for built in native.compiled_files(package, name):
            built.unlink()
    described, files = _show(tmp_path, {"PYTHONPATH": str(tmp_path), native.PURE_ENV: ""})
    assert described == "Python source (not compiled at install: no Cython or no C compiler)"
    assert files == [str(native.source_path(package, m)) for m in native.MODULES]


def test_the_stamp_covers_every_source_the_build_reads(tmp_path):
    for name in native.SOURCES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(PACKAGE / name, tmp_path / name)
    before = native.source_digest(tmp_path)
    for name in native.SOURCES:
        original = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(original + b"\n")
        assert native.source_digest(tmp_path) != before, name
        (tmp_path / name).write_bytes(original)
    assert native.source_digest(tmp_path) == before
