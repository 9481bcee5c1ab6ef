"""Where the grammar and the bundled schedules are, installed or in a source checkout.

A wheel carries them inside the package (`commdsl/grammars`, `commdsl/schedules`, see
pyproject.toml); a source checkout or editable install has them at the repository top.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    for candidate in (_PACKAGE_DIR / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"commdsl installation is missing its {name}/ directory (looked in {_PACKAGE_DIR})")


def grammar_path() -> Path:
    return _data_dir("grammars") / "commdsl.lark"


def schedules_dir() -> Path:
    return _data_dir("schedules")


def bundled_schedules() -> list[str]:
    """Names of the bundled schedules (file stems), sorted."""
    return sorted(p.stem for p in schedules_dir().glob("*.yaml"))


def resolve_schedule(arg: str) -> Path | None:
    """A schedule argument is a path, or the name of a bundled schedule ("1f1b")."""
    from commdsl.files import is_file

    if is_file(arg):
        return Path(arg)
    if "/" not in arg and "\\" not in arg:
        stem = arg[:-5] if arg.endswith(".yaml") else arg
        bundled = schedules_dir() / f"{stem}.yaml"
        if is_file(bundled):
            return bundled
    return None
