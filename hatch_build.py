"""The package build's hook: compile the hot modules with Cython where it can.

The simulation engine and the trace writer (`commdsl.native.MODULES`) compile, with the
declarations in the `.pxd` file beside each, into extension modules of the same names;
`commdsl/native.py` says when they run. The build never fails for want of a compiler: it
warns and the package runs the Python source.

    pip install -e .          # an editable install builds them in place, beside the sources
    pip install .             # a wheel carries them (those of an editable install of
                              # the same sources, copied, where there is one)
    python hatch_build.py     # rebuild in place (with hatchling and Cython installed)
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGE = Path(__file__).resolve().parent / "commdsl"
# commdsl/native.py alone (it needs only the standard library; the package needs its
# dependencies, which a build does not have).
_spec = importlib.util.spec_from_file_location("commdsl_native", PACKAGE / "native.py")
native = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(native)

DIRECTIVES = ("annotation_typing=False", "boundscheck=False", "wraparound=False", "language_level=3")
"""Type hints stay hints (the `.pxd` files declare the C types); indexes are in range and
never negative (the engine's op numbers)."""
MODULE_DIRECTIVES = {"timeline": ("infer_types=False",), "sim.trace": ("infer_types=False",)}
"""Per module, directives of its own. The trace writer's batch encoders assign maps to
extended slices of lists, which Cython's inferred list type would reject: their
variables stay Python objects but where the `.pxd` types them."""


def compile_module(name: str, out: Path, work: Path) -> Path:
    """Compile module `name` (of `native.MODULES`) into the package folder `out` (its
    place there), the C file in `work`; the built file."""
    c_file = work / f"{name}.c"
    cython = [sys.executable, "-m", "cython", str(native.source_path(PACKAGE, name)), "-o", str(c_file)]
    for directive in (*DIRECTIVES, *MODULE_DIRECTIVES.get(name, ())):
        cython += ["-X", directive]
    subprocess.run(cython, check=True, capture_output=True, text=True)
    obj = work / f"{name}.o"
    include = sysconfig.get_paths()["include"]
    cc, ccshared, ldshared = (sysconfig.get_config_var(v) or "" for v in ("CC", "CCSHARED", "LDSHARED"))
    subprocess.run([*cc.split(), *ccshared.split(), "-O2", f"-I{include}", "-c", str(c_file), "-o", str(obj)], check=True,
                   capture_output=True, text=True)  # fmt: skip
    target = native.source_path(out, name, sysconfig.get_config_var("EXT_SUFFIX"))
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([*ldshared.split(), str(obj), "-o", str(target)], check=True, capture_output=True, text=True)
    return target


def current_in_place(suffix: str) -> list[Path] | None:
    """The in-place build (`pip install -e .`) of every hot module for extension suffix
    `suffix`, where its stamp matches the sources as they are now; else None."""
    stamp = PACKAGE / native.STAMP
    if not stamp.is_file() or stamp.read_text().strip() != native.source_digest(PACKAGE):
        return None
    files = [native.source_path(PACKAGE, name, suffix) for name in native.MODULES]
    return files if all(f.is_file() for f in files) else None


def build(out: Path) -> list[Path]:
    """Compile the hot modules into the package folder `out` and write the stamp of their
    sources; the files written. Raises where Cython or the compiler is missing or fails.
    A wheel built from a checkout whose in-place build is current for this Python takes
    those files instead of compiling them again (the same sources, the same directives)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    reuse = current_in_place(suffix) if out.resolve() != PACKAGE else None
    for name in native.MODULES:  # an earlier build of another Python's, or a stale one
        for old in native.compiled_files(out, name):
            old.unlink()
    (out / native.STAMP).unlink(missing_ok=True)
    if reuse is not None:
        built = []
        for name, source in zip(native.MODULES, reuse):
            target = native.source_path(out, name, suffix)
            target.parent.mkdir(parents=True, exist_ok=True)
            built.append(Path(shutil.copy2(source, target)))
    else:
        with tempfile.TemporaryDirectory() as work, ThreadPoolExecutor() as pool:
            built = list(pool.map(lambda name: compile_module(name, out, Path(work)), native.MODULES))
    stamp = out / native.STAMP
    stamp.write_text(native.source_digest(PACKAGE) + "\n")
    return [*built, stamp]


def _why(error: Exception) -> str:
    if isinstance(error, subprocess.CalledProcessError):
        lines = (error.stderr or error.stdout or "").strip().splitlines()
        return f"{Path(error.cmd[0]).name} failed: {lines[-1] if lines else f'exit {error.returncode}'}"
    return str(error)


class CustomBuildHook(BuildHookInterface):
    """Compiles the hot modules for the wheel (in place for an editable install)."""

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        editable = version == "editable"
        out = PACKAGE if editable else Path(tempfile.mkdtemp(prefix="commdsl-build-"))
        try:
            built = build(out)
        except (OSError, subprocess.CalledProcessError) as error:
            self.app.display_warning(f"commdsl: the simulation engine and trace writer are not compiled ({_why(error)}); they run as Python")
            return
        self.app.display_info(f"commdsl: compiled the simulation engine and trace writer ({', '.join(p.name for p in built[:-1])})")
        if not editable:  # the editable install finds them in place
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
            for path in built:
                build_data["force_include"][str(path)] = f"commdsl/{path.relative_to(out).as_posix()}"
            self._out = out

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        out = getattr(self, "_out", None)
        if out is not None:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    for path in build(PACKAGE):
        print(f"built {path.relative_to(PACKAGE.parent)}")
