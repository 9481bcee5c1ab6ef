"""Calibrate-then-predict: how well a machine fitted to part of nccl-tests logs predicts the rest.

    python bench/calibrate_predict.py LOG... [--machine dgx-h100] [--split 64MiB]
    python bench/calibrate_predict.py          # the test fixtures (tests/data/nccl_tests)

For each direction, the machine is fitted (`commdsl calibrate --from-nccl-tests`'s fit) to
every log's sizes on one side of the split, and the simulator times the sizes on the other
side on the fitted machine (`commdsl.calibrate.nccl_tests.holdout_errors`). Printed: per
direction the median and worst absolute error over the held-out points. Target (issue 39):
median <= 5% in both directions.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from commdsl.calibrate.nccl_logs import read_logs
from commdsl.calibrate.nccl_tests import SPLIT_BYTES, Run, base_machine, holdout_errors
from commdsl.dsl.values import Unit, parse_quantity

FIXTURES = sorted(str(p) for p in (Path(__file__).parent.parent / "tests" / "data" / "nccl_tests").glob("*.log"))
TARGET_MEDIAN = 0.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="*", default=FIXTURES, help="nccl-tests logs (TOOL=FILE, TOOL:GPUS=FILE as calibrate takes them)")
    parser.add_argument("--machine", help="base machine (default: by the GPU the logs name)")
    parser.add_argument("--split", default=None, help="size that splits the points (default 64MiB)")
    args = parser.parse_args()
    split = SPLIT_BYTES
    if args.split:
        q = parse_quantity(args.split)
        assert q.unit is Unit.SIZE, f"--split takes a size, got {args.split!r}"
        split = int(q.value)
    logs = read_logs(args.logs)
    base = base_machine(logs, args.machine)
    runs = [Run.of(log) for log in logs]
    print(f"{len(logs)} log(s), {sum(len(log.points) for log in logs)} points, base machine {base.name}, split at {split} B")
    for direction, errors in holdout_errors(base, logs, runs, split).items():
        med = statistics.median(abs(e) for e in errors)
        worst = max(abs(e) for e in errors)
        verdict = "met" if med <= TARGET_MEDIAN else "NOT met"
        print(f"{direction:14} {len(errors):4} held-out points: median {100 * med:.1f}%, worst {100 * worst:.1f}%  "
              f"(target median <= {100 * TARGET_MEDIAN:.0f}%: {verdict})")


if __name__ == "__main__":
    main()
