"""The grammar's parse tables are cached between processes in the user's cache folder
(`XDG_CACHE_HOME`), and a cache that is damaged or missing never changes a result."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHECK = [sys.executable, "-m", "commdsl.cli", "check", "1f1b", "-p", "stages=2"]


def _check(cache_home: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": cache_home}
    return subprocess.run(CHECK, capture_output=True, text=True, env=env, timeout=120)


def test_the_parse_tables_are_cached_in_the_users_cache_folder(tmp_path):
    first = _check(str(tmp_path))
    assert first.returncode == 0, first.stderr
    cached = sorted(p.name for p in (tmp_path / "commdsl").iterdir())
    assert any(name.startswith("grammar-program-") for name in cached), cached
    assert oct((tmp_path / "commdsl").stat().st_mode & 0o777) == oct(0o700)
    second = _check(str(tmp_path))
    assert second.returncode == 0 and second.stdout == first.stdout


def test_a_damaged_cache_is_rebuilt(tmp_path):
    assert _check(str(tmp_path)).returncode == 0
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
