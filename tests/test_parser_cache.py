"""The grammar's parse tables are cached between processes in the user's cache folder
(`XDG_CACHE_HOME`), a cache that is damaged or missing never changes a result, and a
cache file someone planted never runs code (commdsl/dsl/parse_cache.py)."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = [sys.executable, "-m", "commdsl.cli", "check", "1f1b", "-p", "stages=2"]


def _check(cache_home: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": cache_home}
    return subprocess.run(CHECK, capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory) -> Path:
    """A cache folder one `commdsl check` filled (building the tables takes a while)."""
    home = tmp_path_factory.mktemp("cache_home")
    assert _check(str(home)).returncode == 0
    return home / "commdsl"


def _filled(tmp_path: Path, built_cache: Path) -> None:
    """`tmp_path` as XDG_CACHE_HOME holds a copy of `built_cache` (modes kept: 0700, 0600)."""
    shutil.copytree(built_cache, tmp_path / "commdsl")


def test_the_parse_tables_are_cached_in_the_users_cache_folder(tmp_path):
    first = _check(str(tmp_path))
    assert first.returncode == 0, first.stderr
    cached = sorted(p.name for p in (tmp_path / "commdsl").iterdir())
    assert any(name.startswith("grammar-start-") for name in cached), cached
    assert oct((tmp_path / "commdsl").stat().st_mode & 0o777) == oct(0o700)
    second = _check(str(tmp_path))
    assert second.returncode == 0 and second.stdout == first.stdout


def test_a_damaged_cache_is_rebuilt(tmp_path, built_cache):
    _filled(tmp_path, built_cache)
    for f in (tmp_path / "commdsl").iterdir():
        f.write_bytes(b"not a cache\n\x80\x04junk")
    again = _check(str(tmp_path))
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr
    assert all(not f.read_bytes().startswith(b"not a cache") for f in (tmp_path / "commdsl").iterdir())


def test_no_cache_folder_is_no_error(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would go")
    result = _check(str(blocked))
    assert result.returncode == 0, result.stderr
    assert not Path(blocked).is_dir()


class _Planted:
    """Unpickling this runs `touch MARKER` (what a planted pickle would do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(cache_home: Path, marker: Path) -> list[Path]:
    """Replace the body of every cache file with a pickle that runs code, keeping its
    header (format and digest) as a forger who read the file would."""
    files = sorted((cache_home / "commdsl").iterdir())
    for f in files:
        header = f.read_bytes().partition(b"\n")[0]
        f.write_bytes(header + b"\n" + pickle.dumps({"data": _Planted(marker), "memo": _Planted(marker)}))
        f.chmod(0o600)
    # lark's own cache file name, as older commdsl versions used it
    (cache_home / "commdsl" / "grammar-program-py311-lark1.3.1.pickle").write_bytes(b"x\n" + pickle.dumps(_Planted(marker)))
    return files


def test_a_planted_cache_file_runs_nothing(tmp_path, built_cache):
    _filled(tmp_path, built_cache)
    marker = tmp_path / "ran"
    files = _plant(tmp_path, marker)
    result = _check(str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert not marker.exists(), "the planted pickle ran"
    # Rebuilt: the files hold tables again, which the next run reads.
    assert all(b"posix" not in f.read_bytes() and b"system" not in f.read_bytes() for f in files)
    assert _check(str(tmp_path)).returncode == 0 and not marker.exists()


def test_the_unpickler_refuses_every_global():
    from commdsl.dsl.parse_cache import _TablesUnpickler

    import io

    for payload in (pickle.dumps(_Planted(Path("/nonexistent/x"))), pickle.dumps(Path("x")), pickle.dumps(set(), protocol=2)):
        with pytest.raises(pickle.UnpicklingError, match="plain data only"):
            _TablesUnpickler(io.BytesIO(payload)).load()


@pytest.mark.parametrize("how", ["file writable by others", "folder writable by others", "file of another user"])
def test_a_cache_others_could_write_is_not_read(tmp_path, built_cache, how):
    _filled(tmp_path, built_cache)
    marker = tmp_path / "ran"
    folder = tmp_path / "commdsl"
    files = _plant(tmp_path, marker)
    if how == "file writable by others":
        for f in files:
            f.chmod(0o666)
    elif how == "folder writable by others":
        folder.chmod(0o777)
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give a file away")
        for f in files:
            os.chown(f, 65534, 65534)
    result = _check(str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    folder.chmod(0o700)
