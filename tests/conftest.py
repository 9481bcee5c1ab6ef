"""Shared test helpers."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest

from commdsl.errors import MachineError
from commdsl.machine import load_machine_text


@pytest.fixture
def machine_error() -> Callable[[str, str, str, int, int], MachineError]:
    """`machine_error(text, file, message, line, col)`: loading `text` as `file` fails with
    `message` at that line and column; returns the error."""

    def check(text: str, file: str, message: str, line: int, col: int) -> MachineError:
        with pytest.raises(MachineError) as info:
            load_machine_text(text, file)
        err = info.value
        assert message in err.message
        assert (err.loc.file, err.loc.line, err.loc.column) == (file, line, col)
        return err

    return check


def _shared_fixture_group(item: pytest.Item) -> str | None:
    """The xdist group of a test that uses a module- or session-scoped fixture of the
    tests' own (a torchrun, a calibration, a wheel built once for several tests): its
    module, or the session-scoped fixture's name; None for any other test."""
    tests_dir = Path(__file__).resolve().parent
    group = None
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info is not None else ()):
        for fixturedef in defs:
            if fixturedef.scope not in ("module", "session"):
                continue
            source = Path(inspect.getfile(fixturedef.func)).resolve()
            if source.parent != tests_dir:  # pytest's own (tmp_path_factory, ...) and plugins'
                continue
            if fixturedef.scope == "session":
                return f"session:{fixturedef.argname}"
            group = f"module:{item.module.__name__}"
    return group


# tryfirst: xdist's worker names each test by its group in its own hook of this name,
# so the marks must be on the items before it runs.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`--dist loadgroup`, pyproject.toml's addopts) the tests that
    share an expensive fixture run on one worker, which sets it up once; the others are
    spread one by one."""
    for item in items:
        group = _shared_fixture_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session: pytest.Session) -> None:
    """On an xdist worker: warn where the groups did not take (xdist names a grouped test
    `id@group`; a pytest that ignores the renaming spreads each group's tests and sets its
    fixture up on every worker, which costs minutes, not correctness)."""
    if not (hasattr(session.config, "workerinput") and session.config.getvalue("loadgroup")):
        return
    lost = [item.nodeid for item in session.items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        session.config.issue_config_time_warning(pytest.PytestWarning(
            f"{len(lost)} tests lost their xdist group (e.g. {lost[0]}): this pytest and pytest-xdist do not "
            "group tests; each worker sets up the shared fixtures again"), stacklevel=1)
