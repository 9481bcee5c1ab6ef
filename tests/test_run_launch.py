"""`commdsl run FILE -n N` and `commdsl calibrate -n N`: the ranks start through
commdsl.run.launch; errors end in one commdsl message and the rank's exit code, with no
launcher traceback."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from commdsl.calibrate import main as calibrate_main
from commdsl.comparison import duration_drifts
from commdsl.progress import PROGRESS_INTERVAL_ENV
from commdsl.run import cli as run_cli
from commdsl.run.launch import rank_argv
from commdsl.timeline import Timeline

try:
    from test_run_support import DATA, Launch, processes_mentioning, run_in_group
except ImportError:  # tests/ imported as a package
    from tests.test_run_support import DATA, Launch, processes_mentioning, run_in_group

SMALL = ["-p", "stages=2", "-p", "microbatches=3", "-p", "act=64KiB"]


def commdsl(args: list[str], *, timeout_s: float = 180, env: dict[str, str] | None = None) -> Launch:
    """The commdsl CLI in its own process group (killed as a whole on timeout)."""
    return run_in_group([sys.executable, "-m", "commdsl.cli", *args], timeout_s=timeout_s, env=env)


def _no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr and "ChildFailedError" not in stderr, stderr


def test_run_launches_the_ranks_and_shows_progress_when_piped(tmp_path):
    out = tmp_path / "m.json"
    r = commdsl(["run", "1f1b", "-n", "2", *SMALL, "--check", "--out", str(out), "--warmup", "1", "--iters", "2", "--compare"],
                env={PROGRESS_INTERVAL_ENV: "0.01"})  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "1f1b: 2 rank(s), gloo (cpu), 1 warm-up + 2 measured iteration(s)" in r.stdout
    assert "check: 12 communication results on 2 rank(s): all correct" in r.stdout
    # --compare on the default preset says it is no calibration of this machine, and how to make one.
    said = " ".join(r.stdout.split())
    assert "warning: machine cpu-loopback is not calibrated" in said
    assert "`commdsl calibrate -n 2 --out my.yaml` (or `--quick`: a rough file in a minute or two), then use `--machine my.yaml`" in said
    assert "commdsl run: running 1 warm-up + 2 measured iterations, checking every result" in r.stderr
    assert "Failed to initialize NumPy" not in r.stderr  # numpy comes with the run extra
    _no_traceback(r.stderr)
    tl = Timeline.read(out)
    assert tl.world_size == 2 and tl.meta["iters"] == 2


def test_run_without_n_starts_the_schedules_world_and_sleeping_durations_need_no_timing(tmp_path):
    out = tmp_path / "m.json"
    r = commdsl(["run", "1f1b", *SMALL, "--duration-mode", "sleep", "--out", str(out), "--warmup", "0", "--iters", "1"])
    assert r.returncode == 0, r.stderr
    assert "1f1b: 2 rank(s)" in r.stdout
    tl = Timeline.read(out)
    assert "compute_timing" not in tl.meta and "compute timing:" not in r.stdout  # sleeping ops time no block
    assert {d.rank for d in duration_drifts(tl)} == {0, 1}  # and are held to their durations too


@pytest.mark.parametrize(
    "args, code, message",
    [
        # Caught before any rank starts.
        (["1f1b", "-n", "2"], 2, "usage error: the schedule has 4 ranks, -n asks for 2"),
        (["1f1b", "-n", "2", *SMALL, "--iters", "0"], 2, "--iters must be from 1 to 100,000, got 0"),
        (["1f1b", "-n", "2", *SMALL, "--network", "analytic"], 2, "--machine and --network only apply with --compare"),
        (["1f1b", "-n", "2", *SMALL, "--iters", "99999999999999999999"], 2, "--iters must be from 1 to 100,000"),
        (["1f1b", "-n", "2", *SMALL, "--trace-dir", ""], 2, "--trace-dir '': not a folder name"),
        (["1f1b", "-n", "2", *SMALL, "--profile", "/proc/commdsl-x"], 2, "cannot make --profile /proc/commdsl-x"),
        (["ddp_overlap", "-p", "ranks=300", "-n", "300"], 2, "-n must be from 1 to 256 ranks on this machine, got 300"),
        ([str(DATA / "recv_without_send.yaml"), "-n", "2"], 1, "recv_without_send.yaml:9"),
        ([str(DATA / "head_to_head.yaml"), "-n", "2"], 3, "deadlock: no op can progress and 2 of 2 ranks have ops left"),
        # Caught by the ranks: the launcher passes their exit code on, and nothing else.
        (["1f1b", "-n", "2", *SMALL, "--backend", "nccl"], 2, "--backend nccl needs a CUDA build of torch and a GPU"),
        # --compare's machine cannot run the schedule (bf16 compute on cpu-loopback): before the run, not after it
        (["tp_mlp", "-n", "2", "-p", "dp=1", "-p", "tp=2", "-p", "blocks=1", "-p", "tokens=64", "-p", "hidden=64", "--compare"], 1,
         "machine error: machine cpu-loopback has no bf16 compute rate"),
    ],
)
def test_errors_are_one_message_and_the_right_exit_code(args, code, message, tmp_path):
    r = commdsl(["run", *args, "--out", str(tmp_path / "m.json")], timeout_s=120)
    assert r.returncode == code, r.stderr
    assert message in r.stderr
    _no_traceback(r.stderr)
    assert r.stderr.count("error") + r.stderr.count("deadlock:") == 1, r.stderr  # one message, said once (by rank 0)


def test_a_hang_exits_with_the_watchdogs_code(tmp_path):
    out = tmp_path / "partial.json"
    r = commdsl(["run", str(DATA / "recv_without_send.yaml"), "-n", "2", "--no-validate", "--timeout", "3", "--out", str(out),
                 "--warmup", "0", "--iters", "1"], timeout_s=120)  # fmt: skip
    assert r.returncode == 3, r.stderr
    assert "rank 1: stuck on op 1:1 recv t from rank 0" in r.stderr and "partial timeline written" in r.stderr
    _no_traceback(r.stderr)
    assert processes_mentioning(str(out)) == [], "orphan processes remain"


def test_run_without_torch_says_how_to_install_it():
    probe = ("import sys; sys.modules['torch'] = None\nfrom commdsl.cli import main\n"
             "raise SystemExit(main(['run', '1f1b', '-p', 'stages=2']))")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "`commdsl run` runs ranks with torch.distributed, and torch is not installed here" in r.stderr
    assert 'pip install "commdsl[run]"' in r.stderr
    _no_traceback(r.stderr)


def _round_trip(add_arguments, argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    actions = add_arguments(parser)
    args = parser.parse_args(argv)
    again = parser.parse_args(rank_argv(actions, args))
    assert vars(again) == vars(args)


@pytest.mark.parametrize("argv", [
    ["1f1b"],
    ["my schedule.yaml", "-p", "stages=2", "-p", "act=-1MiB", "--check", "--timeout", "2.5", "--iters", "3", "-q",
     "--compare", "--machine", "m.yaml", "--network", "flow", "--max-ops", "10"],
])  # fmt: skip
def test_the_ranks_get_the_options_they_were_given(argv):
    _round_trip(run_cli.add_arguments, argv)


def test_calibrates_options_reach_the_ranks():
    _round_trip(calibrate_main.add_arguments, ["--out", "m.yaml", "--quick", "--max-size", "64KiB", "--warm-up", "0.5",
                                               "--matmul-sizes", "32,64", "--repeats", "3"])  # fmt: skip
    _round_trip(calibrate_main.add_arguments, ["--out", "m.yaml", "--from-nccl-tests", "a.log", "sendrecv=b.log", "--nccl-algo", "ring"])


def test_calibrate_usage_errors_stop_before_any_rank_starts(tmp_path):
    few = commdsl(["calibrate", "-n", "0", "--out", str(tmp_path / "m.yaml")], timeout_s=60)
    assert few.returncode == 2 and "calibrate needs at least 1 rank, got -n 0" in few.stderr
    bad = commdsl(["calibrate", "--out", str(tmp_path / "m.yaml"), "--max-size", "2ms"], timeout_s=60)
    assert bad.returncode == 2 and "--max-size takes a size" in bad.stderr
    _no_traceback(few.stderr + bad.stderr)


def test_calibrate_from_nccl_tests_logs_starts_no_ranks(tmp_path):
    """`commdsl calibrate --from-nccl-tests` fits logs in this process: no ranks, no torch."""
    log = DATA / "nccl_tests" / "h100_all_reduce_g8_ring.log"
    out = tmp_path / "cluster.yaml"
    probe = ("import sys; sys.modules['torch'] = None\nfrom commdsl.cli import main\n"
             f"raise SystemExit(main(['calibrate', '--from-nccl-tests', {str(log)!r}, '--out', {str(out)!r}, '--machine', 'dgx-h100']))")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "base machine dgx-h100" in r.stderr and out.is_file()


@pytest.mark.parametrize(("rank", "stopped", "printed"), [
    ("0", False, "usage error: --iters must be from 1 to 100,000"),  # rank 0 says it at once
    ("1", True, None),  # rank 0 said it and ended the run: the launcher stops the others in their wait
    ("1", False, "rank 1: usage error: --iters must be from 1 to 100,000"),  # nobody ended it: the error is rank 1's alone
])  # fmt: skip
def test_an_error_every_rank_hits_is_printed_by_rank_0_while_the_others_wait(rank, stopped, printed, monkeypatch, capsys):
    # Another rank that exited at once could make the launcher stop rank 0 before it printed.
    slept = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if stopped:
            raise KeyboardInterrupt

    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(run_cli.time, "sleep", sleep)
    code = run_cli.main(["1f1b", "--iters", "0"])
    assert code == 2
    err = capsys.readouterr().err
    assert (printed in err) if printed else ("--iters" not in err), err
    assert slept == ([run_cli.COMMON_ERROR_GRACE_S] if rank != "0" else [])


def test_the_first_failure_seen_is_reported_and_a_signal_death_comes_first_in_a_tie():
    """Ranks that ended before the launcher looked: the one killed by a signal is the
    cause (a rank's error exit is often its peer's echo of it), whatever its rank."""
    from commdsl.run.launch import Ranks

    ranks = Ranks()
    ranks.procs = [subprocess.Popen(["sh", "-c", cmd]) for cmd in ("exit 1", "kill -9 $$", "exit 0")]
    for p in ranks.procs:  # wait for all three to end without reaping them
        os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
    assert ranks.wait_first_failure() == (1, -9)
    assert ranks.stop() == []


def test_a_lone_error_exit_is_the_first_failure():
    from commdsl.run.launch import Ranks

    ranks = Ranks()
    ranks.procs = [subprocess.Popen(["sh", "-c", cmd]) for cmd in ("sleep 60", "exit 4")]
    try:
        assert ranks.wait_first_failure() == (1, 4)
    finally:
        assert ranks.stop() == []  # SIGTERM ends the sleeping rank at once
    assert ranks.procs[0].returncode == -15


def test_signals_while_ranks_start_are_held_until_every_started_rank_is_known():
    """A SIGTERM between a rank's fork and its Popen's return raised there and lost the
    rank (left running, an orphan); inside `_signals_held` it is noted, and the handler
    before it is back after."""
    import os
    import signal

    from commdsl.run.launch import _signals_held

    before = signal.getsignal(signal.SIGTERM)
    with _signals_held(signal.SIGTERM, signal.SIGHUP) as held:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGHUP)
    assert held == [signal.SIGTERM, signal.SIGHUP] and signal.getsignal(signal.SIGTERM) is before
