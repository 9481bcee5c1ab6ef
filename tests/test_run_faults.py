"""`commdsl run -n 2` under faults, with real processes and real signals: a rank killed,
a rank stopped, the launcher interrupted or killed. Each fault ends in one commdsl line
naming what happened and the matching exit code, within the watchdog's timeout plus a
few seconds, with no rank left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from commdsl.progress import PROGRESS_INTERVAL_ENV

try:
    from test_run_support import DATA, REPO
except ImportError:  # tests/ imported as a package
    from tests.test_run_support import DATA, REPO

STARTUP_S = 300.0
"""How long the ranks may take to reach their ops on a loaded machine."""
WATCHDOG_S = 5.0
"""The run's --timeout."""
END_WITHIN_S = WATCHDOG_S + 15.0
"""After the fault, the run must have ended within this."""


@dataclass(frozen=True)
class Fault:
    target: str
    """`rank 0`, `rank 1` (that process), or `launcher` (the launcher's process group, as a terminal signals it)."""
    sig: signal.Signals
    code: int
    """The exit code of `commdsl run`."""
    says: str
    """A line of its stderr."""


FAULTS = [
    Fault("rank 1", signal.SIGKILL, 137, "commdsl run: rank 1 was killed by SIGKILL"),
    Fault("rank 0", signal.SIGKILL, 137, "commdsl run: rank 0 was killed by SIGKILL"),
    Fault("rank 1", signal.SIGTERM, 143, "commdsl run: rank 1 was killed by SIGTERM"),
    Fault("rank 1", signal.SIGSTOP, 3, "rank 0: no report from rank 1"),
    Fault("launcher", signal.SIGINT, 130, "commdsl run: interrupted"),
    Fault("launcher", signal.SIGTERM, 143, "commdsl run: stopped by SIGTERM"),
]


def _sigint_at_its_default() -> None:
    """In the launcher before it starts: SIGINT at its default, as a terminal's foreground
    job has it. A test run may have SIGINT ignored (a background job of a shell script
    ignores it, and children inherit that), and Python then keeps it ignored: the
    Ctrl-C this file sends would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Run:
    """`commdsl run` of a long ping-pong on 2 ranks, in its own session; its stderr is
    read as it comes."""

    def __init__(self, tmp_path: Path):
        self.out = tmp_path / "m.json"
        cmd = [sys.executable, "-m", "commdsl.cli", "run", str(DATA / "ping_pong_long.yaml"), "-n", "2", "--duration-mode",
               "sleep", "--warmup", "0", "--iters", "3", "--timeout", str(WATCHDOG_S), "--out", str(self.out)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, env=dict(os.environ, **{PROGRESS_INTERVAL_ENV: "0.5"}),
                                     preexec_fn=_sigint_at_its_default)  # fmt: skip
        self.lines: list[str] = []
        self.running = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.rank_pids: dict[int, int] = {}

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            if "measured iterations" in line:  # rank 0's progress: the ranks run their ops
                self.running.set()

    def wait_running(self) -> None:
        if not self.running.wait(STARTUP_S):
            self.kill()
            pytest.fail("the ranks did not reach their ops:\n" + "\n".join(self.lines))
        self.rank_pids = _children_by_rank(self.proc.pid)
        assert sorted(self.rank_pids) == [0, 1], self.rank_pids

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            self._reader.join(10)

    def kill(self) -> None:
        """Leaves nothing behind, whatever the test saw."""
        for pid in [self.proc.pid, *self.rank_pids.values()]:
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        self.proc.wait()

    def alive_ranks(self) -> list[int]:
        return [rank for rank, pid in self.rank_pids.items() if _alive(pid)]


def _children_by_rank(parent: int) -> dict[int, int]:
    """The launcher's child processes, by their RANK."""
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rpartition(")")[2].split()[1])
            if ppid != parent:
                continue
            env = dict(item.partition(b"=")[::2] for item in (p / "environ").read_bytes().split(b"\0") if item)
        except (OSError, ValueError, IndexError):
            continue
        if b"RANK" in env:
            out[int(env[b"RANK"])] = int(p.name)
    return out


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f"{f.target}-{f.sig.name}")
def test_a_fault_ends_in_one_line_and_its_exit_code(fault, tmp_path):
    run = Run(tmp_path)
    try:
        run.wait_running()
        time.sleep(1.0)  # well inside the ops
        seen = len(run.lines)
        if fault.target == "launcher":
            os.killpg(run.proc.pid, fault.sig)
        else:
            os.kill(run.rank_pids[int(fault.target.split()[1])], fault.sig)
        code = run.wait(END_WITHIN_S)
        stderr = "\n".join(run.lines)
        assert code is not None, f"commdsl run did not end within {END_WITHIN_S}s of {fault.sig.name}:\n{stderr}"
        assert code == fault.code, stderr
        assert fault.says in run.lines, stderr
        assert run.alive_ranks() == [], "ranks outlived the launcher"
        assert "Traceback" not in stderr and "terminate called" not in stderr and "death signal" not in stderr, stderr
        if fault.target == "launcher":  # the launcher stopped the ranks: only its own line (and progress) follows
            after = [line for line in run.lines[seen:] if not line.startswith("commdsl run: running")]
            assert after == [fault.says], stderr
    finally:
        run.kill()


def test_ranks_end_when_the_launcher_is_killed(tmp_path):
    """SIGKILL gives the launcher no chance to stop its ranks: they notice that the
    store it hosted is gone, and exit."""
    run = Run(tmp_path)
    try:
        run.wait_running()
        _kill_launcher_and_wait_for_ranks(run)
        assert run.alive_ranks() == [], "ranks outlived the killed launcher"
    finally:
        run.kill()


def _kill_launcher_and_wait_for_ranks(run: Run) -> None:
    """SIGKILL the launcher, then give its ranks up to `END_WITHIN_S` to end."""
    os.kill(run.proc.pid, signal.SIGKILL)
    run.wait(10)
    deadline = time.monotonic() + END_WITHIN_S
    while run.alive_ranks() and time.monotonic() < deadline:
        time.sleep(0.2)


def test_ranks_still_setting_up_end_when_the_launcher_is_killed(tmp_path):
    """Killed while its ranks import torch and set up (no watchdog yet, and the store it
    hosted gone): each rank ends with its launcher (Linux's parent-death signal), where it
    used to retry the store for minutes."""
    run = Run(tmp_path)
    try:
        deadline = time.monotonic() + STARTUP_S
        while len(run.rank_pids) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            run.rank_pids = _children_by_rank(run.proc.pid)
        assert sorted(run.rank_pids) == [0, 1], run.rank_pids
        _kill_launcher_and_wait_for_ranks(run)
        assert run.alive_ranks() == [], "ranks outlived the launcher killed during their set-up"
    finally:
        run.kill()


def _folder(tmp: Path) -> str:
    return str(tmp)


def _loop(tmp: Path) -> str:
    (tmp / "a").symlink_to(tmp / "b")
    (tmp / "b").symlink_to(tmp / "a")
    return str(tmp / "a")


def _under_loop(tmp: Path) -> str:
    return str(Path(_loop(tmp)) / "m.json")


def _read_only_folder(tmp: Path) -> str:
    folder = tmp / "ro"
    folder.mkdir(mode=0o500)
    return str(folder / "m.json")


UNWRITABLE = [
    ("--records", _folder, "Is a directory"),
    ("--records", _loop, "Too many levels of symbolic links"),
    ("--out", _under_loop, "Too many levels of symbolic links"),
    ("--dump-values", _folder, "Is a directory"),
    pytest.param("--records", _read_only_folder, "Permission denied",
                 marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")),  # fmt: skip
]


@pytest.mark.parametrize("flag, make, message", UNWRITABLE)
def test_an_output_that_cannot_be_written_stops_the_run_before_any_rank_starts(flag, make, message, tmp_path, capsys):
    from commdsl.cli import main

    path = make(tmp_path)
    code = main(["run", "1f1b", "-n", "2", "-p", "stages=2", flag, path])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{flag} {path}: {message}" in err, err
    assert "expanding" not in err and "rank(s)" not in err, err  # nothing ran
