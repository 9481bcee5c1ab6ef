"""Which engine runs: the compiled one where the install built it, else the Python source.

The simulator's hot modules (`MODULES`: the engine, its entities, the wiring, the
networks, the sample medians) are their `.py` source, and run as it anywhere. Where the
package build could compile them (`hatch_build.py` at the repository root: Cython, from
the declarations in the `.pxd` file beside each, and a C compiler), the compiled modules
sit beside the sources, and Python imports a compiled module before the `.py` of the
same name. `select` keeps them only where they were built
from the sources as they are now: the build writes a digest of the sources (`STAMP`); a
source edited since, a module missing, or `COMMDSL_PURE_PYTHON=1` in the environment
loads every source instead. Either way a simulation comes out the same, op for op.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

MODULES = ("entities", "network", "flow", "wiring", "engine", "medians")
"""The compiled modules, in import order (each needs the compiled classes of those before
it that it types with: the entities, the network's base class)."""
SOURCES = tuple(f"{m}.{x}" for m in MODULES for x in ("py", "pxd"))
"""The files the compiled modules are built from (`source_digest`)."""
STAMP = "compiled.sha256"
"""Beside the sources: the digest of the sources the compiled modules were built from."""
PURE_ENV = "COMMDSL_PURE_PYTHON"
"""Set (to anything but empty or 0): run the Python source even where a build is there."""


@dataclass(frozen=True)
class EngineBuild:
    """Which engine this process runs."""

    compiled: bool
    """The Cython-compiled modules run; False: the Python source."""
    reason: str
    """Why the source runs where it does ("" where compiled)."""

    def describe(self) -> str:
        return "compiled (Cython)" if self.compiled else f"Python source ({self.reason})"


def source_digest(folder: Path) -> str:
    """SHA-256 over the names and bytes of `SOURCES` in `folder`."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes())
    return digest.hexdigest()


def compiled_files(folder: Path, name: str) -> list[Path]:
    """The compiled builds of module `name` in `folder` (any Python's)."""
    return [p for suffix in importlib.machinery.EXTENSION_SUFFIXES if (p := folder / f"{name}{suffix}").exists()]


def _why_source(folder: Path) -> str:
    """Why the source must run ("" where the compiled modules may)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return f"{PURE_ENV} is set"
    if not all(compiled_files(folder, name) for name in MODULES):
        return "not compiled at install: no Cython or no C compiler"
    stamp = folder / STAMP
    if not stamp.exists() or stamp.read_text().strip() != source_digest(folder):
        return "the compiled modules were built from other sources: reinstall (`pip install -e .`) to rebuild them"
    return ""


def select() -> EngineBuild:
    """Load the engine's modules from the source where the compiled ones must not run (see
    the module doc); call before anything imports them."""
    folder = Path(__file__).resolve().parent
    reason = _why_source(folder)
    if not reason:
        return EngineBuild(True, "")
    for name in MODULES:
        full = f"commdsl.sim.{name}"
        spec = importlib.util.spec_from_file_location(full, folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
        setattr(sys.modules["commdsl.sim"], name, module)  # as the import system does for a submodule
    return EngineBuild(False, reason)

