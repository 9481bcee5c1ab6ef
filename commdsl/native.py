"""Which build runs: the compiled modules where the install built them, else the Python source.

The hot modules (`MODULES`: the simulation engine, its entities, the wiring, the
networks, the contention model, the sample medians, the nccl-tests chain replay of the
calibration's fit, and the trace writer with the
timeline's encoders) are
their `.py` source, and run as it anywhere. Where the package build could compile them
(`hatch_build.py` at the repository root: Cython, from the declarations in the `.pxd`
file beside each, and a C compiler), the compiled modules sit beside the sources, and
Python imports a compiled module before the `.py` of the same name. `select` keeps them
only where they were built from the sources as they are now: the build writes a digest
of the sources (`STAMP`); a source edited since, a module missing, or
`COMMDSL_PURE_PYTHON=1` in the environment imports every source instead. Either way a
simulation and its trace come out the same, op for op and byte for byte.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "commdsl"
MODULES = ("sim.entities", "sim.network", "sim.flow", "sim.analytic", "sim.contention", "sim.wiring", "sim.engine", "sim.medians",
           "sim.chain_times", "timeline", "sim.trace")
"""The compiled modules, named within the package (each types with the compiled classes
of those before it that it cimports: the entities, the network's base class, the
timeline's `DecimalTexts`)."""
SOURCES = tuple(f"{m.replace('.', '/')}.{x}" for m in MODULES for x in ("py", "pxd"))
"""The files the compiled modules are built from (`source_digest`), within the package."""
STAMP = "compiled.sha256"
"""In the package's folder: the digest of the sources the compiled modules were built from."""
PURE_ENV = "COMMDSL_PURE_PYTHON"
"""Set (to anything but empty or 0): run the Python source even where a build is there."""


@dataclass(frozen=True)
class EngineBuild:
    """Which build this process runs."""

    compiled: bool
    """The Cython-compiled modules run; False: the Python source."""
    reason: str
    """Why the source runs where it does ("" where compiled)."""

    def describe(self) -> str:
        return "compiled (Cython)" if self.compiled else f"Python source ({self.reason})"


def source_path(root: Path, name: str, suffix: str = ".py") -> Path:
    """The file of module `name` (one of `MODULES`) in the package folder `root`."""
    return root.joinpath(*name.split(".")).with_suffix(suffix)


def source_digest(root: Path) -> str:
    """SHA-256 over the names and bytes of `SOURCES` in the package folder `root`."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode() + b"\0" + (root / name).read_bytes())
    return digest.hexdigest()


def compiled_files(root: Path, name: str) -> list[Path]:
    """The compiled builds of module `name` in the package folder `root` (any Python's)."""
    return [p for suffix in importlib.machinery.EXTENSION_SUFFIXES if (p := source_path(root, name, suffix)).exists()]


def _why_source(root: Path) -> str:
    """Why the source must run ("" where the compiled modules may)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return f"{PURE_ENV} is set"
    if not all(compiled_files(root, name) for name in MODULES):
        return "not compiled at install: no Cython or no C compiler"
    stamp = root / STAMP
    if not stamp.exists() or stamp.read_text().strip() != source_digest(root):
        return "the compiled modules were built from other sources: reinstall (`pip install -e .`) to rebuild them"
    return ""


class SourceFinder:
    """An import finder that gives the `.py` source of the compiled modules (first on
    `sys.meta_path`, where they must not run)."""

    def __init__(self, root: Path):
        self.files = {f"{PACKAGE}.{name}": str(source_path(root, name)) for name in MODULES}
        """Full module name -> its source file."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        return None if file is None else importlib.util.spec_from_file_location(fullname, file)


def select() -> EngineBuild:
    """Have the compiled modules' sources imported where the compiled ones must not run
    (see the module doc); the package calls it before anything imports them."""
    root = Path(__file__).resolve().parent
    reason = _why_source(root)
    if not reason:
        return EngineBuild(True, "")
    # One finder per process: the package imports this once.
    if not any(isinstance(finder, SourceFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, SourceFinder(root))
    return EngineBuild(False, reason)
