"""Every output path a command takes is checked before any work starts (one usage error
naming the option and the path, exit 2), and every output is written whole or not at
all: a failure leaves what was there before, never a file cut short."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from commdsl.cli import main
from commdsl.errors import UsageError
from commdsl.files import output_file, read_bytes

# Each command line with OUT where the output path goes ({ok}: a valid 2-rank schedule,
# {trace}: a predicted timeline of it, {csv}: a pipelining CSV).
COMMANDS = [
    ["simulate", "{ok}", "--trace", "OUT"],
    ["compare", "{trace}", "{trace}", "--html", "OUT"],
    ["compare", "{trace}", "{trace}", "--trace", "OUT"],
    ["export", "pipelining", "1f1b", "-p", "stages=2", "-o", "OUT"],
    ["import", "pipelining", "{csv}", "-o", "OUT"],
    ["import", "pipelining", "{csv}", "--out", "OUT"],
    ["run", "{ok}", "--out", "OUT"],
    ["run", "{ok}", "--records", "OUT"],
    ["run", "{ok}", "--dump-values", "OUT"],
    ["calibrate", "--out", "OUT"],
    ["calibrate", "--out", "{dir}/m.yaml", "--raw", "OUT"],
]

# Output paths that cannot be written ({dir}: a folder; "loop": a symlink to itself),
# and what the message says after "cannot write FLAG PATH: ".
BAD_PATHS = [
    ("{dir}", "Is a directory"),
    ("{dir}/loop", "Too many levels of symbolic links"),
    ("{dir}/loop/x.json", "Too many levels of symbolic links"),
    ("{dir}/no/such/out.json", "the folder {dir}/no/such does not exist"),
    ("{dir}/" + "a" * 300, "File name too long"),
    ("{dir}/file.txt/x.json", "Not a directory"),
]


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    ok = tmp_path / "ok.yaml"
    ok.write_text("name: ok\nworld: 2\nstreams: [s]\nprogram: |\n  compute F 1ms\n")
    trace = tmp_path / "predicted.json"
    assert main(["simulate", str(ok), "--trace", str(trace), "--json"]) == 0
    csv = tmp_path / "s.csv"
    csv.write_text("0F0,0B0\n1F0,1B0\n")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "file.txt").write_text("a file, not a folder\n")
    return {"ok": str(ok), "trace": str(trace), "csv": str(csv), "dir": str(tmp_path)}


@pytest.mark.parametrize("path, reason", BAD_PATHS, ids=[r for _, r in BAD_PATHS])
@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[:1] + c[-2:-1]) for c in COMMANDS])
def test_bad_output_path_stops_before_any_work(command, path, reason, files, capsys):
    out = path.format(**files)
    args = [a.format(**files) if a != "OUT" else out for a in command]
    flag = command[command.index("OUT") - 1]
    before = sorted(os.listdir(files["dir"]))
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage error: cannot write {flag} {out}: {reason.format(**files)}"), err
    assert "Traceback" not in err and len(err.splitlines()) <= 3, err
    assert sorted(os.listdir(files["dir"])) == before, "nothing is written"


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[:1] + c[-2:-1]) for c in COMMANDS])
def test_dash_is_not_an_output_file(command, files, capsys):
    args = [a.format(**files) if a != "OUT" else "-" for a in command]
    assert main(args) == 2
    assert "-: give the path of a file to write" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_folder_without_write_permission(files, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert main(["simulate", files["ok"], "--trace", str(locked / "t.json")]) == 2
        assert "Permission denied" in capsys.readouterr().err
    finally:
        locked.chmod(0o700)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args, flag", [
    (["simulate", "{ok}", "--trace", "/dev/full", "--json"], "--trace"),
    (["export", "pipelining", "1f1b", "-p", "stages=2", "-o", "/dev/full"], "-o"),
    (["import", "pipelining", "{csv}", "-o", "/dev/full"], "-o"),
    (["compare", "{trace}", "{trace}", "--html", "/dev/full", "--json"], "--html"),
])  # fmt: skip
def test_a_full_device_names_the_path(args, flag, files):
    """A device is written in place; when it is full the message names it."""
    cmd = [sys.executable, "-m", "commdsl.cli", *(a.format(**files) for a in args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"usage error: cannot write {flag} /dev/full: No space left on device" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_devices_and_symlinks_are_written_through(files, tmp_path):
    """/dev/null takes an output; a symlink's target is written, the link kept."""
    assert main(["simulate", files["ok"], "--trace", os.devnull, "--json"]) == 0
    target = tmp_path / "target.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert main(["simulate", files["ok"], "--trace", str(link), "--json"]) == 0
    assert link.is_symlink() and target.read_text().startswith('{"displayTimeUnit"')


def test_a_failed_write_leaves_the_old_file(tmp_path):
    """An output that fails half-way (here: an error while writing) leaves the file as it
    was and no temporary file beside it."""
    out = tmp_path / "out.json"
    out.write_text("old and complete\n")
    with pytest.raises(KeyboardInterrupt), output_file(out, "--out") as f:
        f.write("new but ")
        raise KeyboardInterrupt
    assert out.read_text() == "old and complete\n"
    assert os.listdir(tmp_path) == ["out.json"]
    with output_file(out, "--out") as f:
        f.write("new and complete\n")
    assert out.read_text() == "new and complete\n"
    assert os.listdir(tmp_path) == ["out.json"]
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask


@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_inputs_that_are_not_files_never_block(kind, tmp_path):
    """A FIFO (which reading would wait on forever), a folder or a device given as an
    input is refused at once, naming it."""
    path = tmp_path / "in.csv"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path = Path("/dev/zero")
    with pytest.raises(UsageError, match="not a regular file"):
        read_bytes(path, str(path))
    for args in (["import", "pipelining", str(path)], ["compare", str(path), str(path)]):
        proc = subprocess.run([sys.executable, "-m", "commdsl.cli", *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert str(path) in proc.stderr and "Traceback" not in proc.stderr


def test_every_rank_checking_the_same_output_folder_at_once_is_no_error(tmp_path, monkeypatch):
    """`run --profile DIR` checks DIR in every rank at once: a folder another rank made
    between this rank's look and its own mkdir, or filled before this rank removes it
    again, is no error (it was: rank 1 of a loaded 4-rank run exited 2, silently)."""
    from commdsl.files import check_output_folder

    target = tmp_path / "prof" / "deep"
    real_mkdir, real_rmdir = Path.mkdir, Path.rmdir

    def mkdir_after_another_rank(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)  # another rank made it first
        raise FileExistsError(17, "File exists", str(self))

    monkeypatch.setattr(Path, "mkdir", mkdir_after_another_rank)
    check_output_folder("--profile", str(target))
    monkeypatch.setattr(Path, "mkdir", real_mkdir)
    real_rmdir(target)
    real_rmdir(target.parent)

    def rmdir_after_another_rank_filled_it(self):
        (self / "rank-1").mkdir(exist_ok=True)  # another rank's own check made its folder inside
        real_rmdir(self)

    monkeypatch.setattr(Path, "rmdir", rmdir_after_another_rank_filled_it)
    check_output_folder("--profile", str(target))
    # a name that is a file stays refused
    monkeypatch.undo()
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="a file of that name exists"):
        check_output_folder("--profile", str(tmp_path / "file"))
