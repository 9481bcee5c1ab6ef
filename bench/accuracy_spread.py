"""Bias or spread? What keeps `bench/accuracy.py` runs from the targets, over many runs.

    python bench/accuracy_spread.py RUN_DIR [RUN_DIR ...]

Each RUN_DIR holds one run's `accuracy.json` (`bench/accuracy.py --out-dir D` writes
D/run1, D/run2, ... with `--runs N`). Prints, per schedule, the mean and sd of its
makespan error over the runs and the sd of one launch around its run's mean; then how
many runs meet both targets as measured, and with each schedule's mean error taken out
of every run (what a model without systematic error would score on the same runs); and
how often a model with no error at all would meet the worst-case target, with only the
launches' noise (three launches per schedule drawn at each schedule's launch sd, the
median compared, as the bench does; seeded).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

MEDIAN_TARGET_PCT = 5.0
WORST_TARGET_PCT = 10.0
DRAWS = 20_000


def load_runs(dirs: list[Path]) -> list[dict[str, dict]]:
    """Per run, its rows by schedule name."""
    runs = []
    for d in dirs:
        path = d / "accuracy.json"
        if not path.is_file():
            raise SystemExit(f"accuracy_spread: {path}: no such file (a bench/accuracy.py run directory holds one)")
        try:
            rows = json.loads(path.read_text())["rows"]
            # A schedule that failed to run or compare has an "error" row instead: left out.
            compared = {row["schedule"]: row for row in rows if "error" not in row}
            for row in compared.values():  # the two fields used, as numbers
                row["makespan_error_pct"] = float(row["makespan_error_pct"])
                row["launch_makespans_ms"] = [float(ms) for ms in row["launch_makespans_ms"]]
            runs.append(compared)
        except (KeyError, TypeError, ValueError) as e:  # JSONDecodeError is a ValueError
            raise SystemExit(f"accuracy_spread: {path}: not a bench/accuracy.py result ({type(e).__name__}: {e})") from None
    return runs


def meets_targets(errors_pct: list[float]) -> bool:
    return statistics.median(abs(e) for e in errors_pct) <= MEDIAN_TARGET_PCT and max(abs(e) for e in errors_pct) <= WORST_TARGET_PCT


def launch_sd(runs: list[dict[str, dict]], name: str) -> float:
    """Relative sd of one launch around its run's mean, pooled over the runs."""
    variances = []
    for run in runs:
        launches = run[name]["launch_makespans_ms"]
        if len(launches) >= 2:
            variances.append(statistics.variance(launches) / statistics.fmean(launches) ** 2)
    return math.sqrt(statistics.fmean(variances)) if variances else 0.0


def noise_only_pass_rate(sds: list[float], launches: int, rng: random.Random) -> float:
    """Share of draws where every schedule's median launch lies within the worst-case target."""
    ok = 0
    for _ in range(DRAWS):
        ok += all(abs(statistics.median(rng.gauss(0.0, sd) for _ in range(launches))) * 100 <= WORST_TARGET_PCT for sd in sds)
    return ok / DRAWS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", type=Path, help="bench/accuracy.py run directories")
    args = p.parse_args(argv)
    runs = load_runs(args.dirs)
    names = [n for n in runs[0] if all(n in r for r in runs)]
    if not names:
        raise SystemExit("accuracy_spread: no schedule was compared in every run")
    errors = {n: [r[n]["makespan_error_pct"] for r in runs] for n in names}
    means = {n: statistics.fmean(e) for n, e in errors.items()}
    sds = {n: launch_sd(runs, n) for n in names}
    print(f"{len(runs)} runs, {len(names)} schedules")
    print(f"{'schedule':18} {'mean error':>10} {'error sd':>9} {'launch sd':>9}")
    for n in names:
        spread = statistics.stdev(errors[n]) if len(runs) > 1 else 0.0
        print(f"{n:18} {means[n]:+9.1f}% {spread:8.1f}% {100 * sds[n]:8.1f}%")
    measured = sum(meets_targets([errors[n][i] for n in names]) for i in range(len(runs)))
    unbiased = sum(meets_targets([errors[n][i] - means[n] for n in names]) for i in range(len(runs)))
    launches = min(len(r[n]["launch_makespans_ms"]) for r in runs for n in names)
    rate = noise_only_pass_rate(list(sds.values()), launches, random.Random(0))
    print(f"both targets: {measured} of {len(runs)} runs as measured, {unbiased} of {len(runs)} with each schedule's mean error taken out")
    print(f"a model with no error, the launches' noise only ({launches} a schedule): worst <= {WORST_TARGET_PCT:g}% in {100 * rate:.0f}% of runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
