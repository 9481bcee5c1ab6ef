"""Duration-sized compute: the compute block's timing is agreed between the ranks of a
host and re-checked between iterations, and a run whose ops still end more than 10% off
their requested durations says so (real 2-rank gloo runs with a disturbed start-up)."""

from __future__ import annotations

import os
import subprocess
import sys

from commdsl.comparison import duration_drifts
from commdsl.run.compute_timing import RECHECK_TOLERANCE, SKEW_ENV, agreed_block_us
from commdsl.timeline import Timeline

try:
    from test_run_support import assert_durations_kept_or_warned, torchrun
except ImportError:  # tests/ imported as a package
    from tests.test_run_support import assert_durations_kept_or_warned, torchrun

PARAMS = ["-p", "stages=2", "-p", "microbatches=3", "-p", "act=64KiB", "-p", "t_fwd=2ms", "-p", "t_bwd=4ms"]


def test_the_ranks_of_a_host_agree_on_the_lower_median():
    per_rank = [{256: 300.0, 64: 5.0}, {256: 1200.0, 64: 20.0}, {256: 310.0, 64: 5.2}, {256: 900.0, 64: 9.0}]
    # Two ranks on a host: the faster timing wins (load only lengthens a timing).
    assert agreed_block_us(per_rank[:2], ["a", "a"]) == [{256: 300.0, 64: 5.0}] * 2
    # Each host agrees on its own ranks' timings only; three ranks outvote one disturbed.
    agreed = agreed_block_us(per_rank, ["a", "b", "a", "a"])
    assert agreed[0] == agreed[2] == agreed[3] == {256: 310.0, 64: 5.2}
    assert agreed[1] == {256: 1200.0, 64: 20.0}


def _run(tmp_path, skew: str, *extra: str):
    out = tmp_path / "m.json"
    run = torchrun(2, ["1f1b", *PARAMS, "--out", str(out), *extra], env={SKEW_ENV: skew})
    assert run.returncode == 0, run.stderr[-3000:]
    tl = Timeline.read(out)
    return run, tl, tl.meta["compute_timing"]


def test_one_ranks_disturbed_start_up_timing_is_outvoted(tmp_path):
    """Rank 1 times its block 4x too long at start-up (as a burst of load would make it):
    without agreement its 2 ms ops would run about 0.5 ms."""
    run, tl, timing = _run(tmp_path, "1=4", "--warmup", "1", "--iters", "2")
    startup = timing["startup_us"]
    # One host: both ranks size their ops from the faster start-up timing, block by block
    # (unless a re-check moved both). That is rank 0's unless load on this machine slowed
    # rank 0's own timing by more than rank 1's skew: then rank 0's is outvoted, rightly.
    used = timing["used_us"]
    assert used["0"] == used["1"], timing
    if not timing["adopted"]:
        assert used["1"] == {side: min(startup["0"][side], startup["1"][side]) for side in startup["0"]}, timing
    assert timing["rechecks"] == 2 and timing["test_skew"] == {"1": 4.0}
    # The measured timeline keeps each op's requested duration beside its measured one.
    requested = {s.name[0]: dict(s.args)["requested_duration_us"] for s in tl.exec_spans().values() if s.kind == "compute"}
    assert requested == {"F": 2000.0, "B": 4000.0}
    assert {d.rank: d.ops for d in duration_drifts(tl)} == {0: 6, 1: 6}
    assert_durations_kept_or_warned(run.stdout, tl)


def test_every_ranks_disturbed_start_up_timing_is_corrected_by_the_re_check(tmp_path):
    """Both ranks time their block 20x too short at start-up: agreement cannot help, the
    re-check before the second iteration must (the measured iterations follow it). 20x,
    not less: load on a busy 2-core machine alone moves a timing by 4x."""
    run, tl, timing = _run(tmp_path, "0=0.05,1=0.05", "--warmup", "1", "--iters", "2")
    bulk = str(timing["blocks"][0])
    first = timing["adopted"][0]
    assert first["before_iteration"] == 1 and first["ranks"] == [0, 1], timing
    # The re-check moved both ranks off the skewed start-up: first by more than the
    # tolerance, and at the end to the last re-timing they adopted (the faster rank's). A
    # busy machine may move the times again, never back to the skewed ones unnoticed.
    skewed = min(t[bulk] for t in timing["startup_us"].values())
    assert min(first["bulk_us"]) > (1 + RECHECK_TOLERANCE) * skewed, timing
    last = min(timing["adopted"][-1]["bulk_us"])
    assert all(t[bulk] == last for t in timing["used_us"].values()), timing
    assert "ops re-sized" in run.stdout
    assert {d.rank: d.ops for d in duration_drifts(tl)} == {0: 6, 1: 6}
    assert_durations_kept_or_warned(run.stdout, tl)


def test_a_bad_skew_is_a_usage_error(tmp_path):
    sched = tmp_path / "one.yaml"
    sched.write_text("name: one\nworld: 1\nstreams: [s]\nprogram: |\n  compute X 1ms\n")
    run = subprocess.run([sys.executable, "-m", "commdsl.run", str(sched), "--out", str(tmp_path / "m.json")], capture_output=True,
                         text=True, timeout=60, env=dict(os.environ, **{SKEW_ENV: "1=fast"}))  # fmt: skip
    assert run.returncode == 2
    assert f"{SKEW_ENV}='1=fast': give RANK=FACTOR" in run.stderr and "Traceback" not in run.stderr
