"""How close compute ops with an explicit duration run to their duration.

    python bench/duration_accuracy.py [--launches 3] [--iters 5]

The executor sizes a duration-sized op (`compute c 10ms`) from its timing of a compute
block (agreed per host, re-checked between iterations: docs/executor.md, "Compute").
This launches `commdsl run` on two schedules, `--launches` times each:

* busy1: one rank, four 10 ms ops on one stream (no communication: the ops' own
  accuracy; torchrun with one rank sets no OMP_NUM_THREADS, where intra-op thread
  teams once made 10 ms ops take 27-40 ms);
* 1f1b: two ranks, 2 ms forwards and 4 ms backwards beside P2P (the ops share the
  cores with the ranks' comm threads).

and prints, per launch and rank, the median and range over its ops of measured /
requested duration, how many ops ran more than 10% off, and whether the run warned.
A figure, not a test: a busy machine moves it (tests check only that a run more than 10%
off says so).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from commdsl.comparison import DURATION_DRIFT_PCT, duration_drifts
from commdsl.timeline import Timeline

BUSY1 = "name: busy1\nworld: 1\nstreams: [compute]\nprogram: |\n  for i in range(4):\n      compute c[i] 10ms\n"
RUNS = {
    "busy1": ["-n", "1"],
    "1f1b": ["-n", "2", "-p", "stages=2", "-p", "microbatches=8", "-p", "act=64KiB", "-p", "t_fwd=2ms", "-p", "t_bwd=4ms"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        busy1 = Path(tmp) / "busy1.yaml"
        busy1.write_text(BUSY1)
        print(f"{'schedule':<8} {'launch':>6} {'rank':>4} {'median':>7} {'min':>6} {'max':>6} {'off>10%':>8}  warned")
        for name, extra in RUNS.items():
            schedule = str(busy1) if name == "busy1" else name
            for launch in range(args.launches):
                out = Path(tmp) / f"{name}-{launch}.json"
                proc = subprocess.run([sys.executable, "-m", "commdsl.cli", "run", schedule, *extra, "--out", str(out),
                                       "--warmup", str(args.warmup), "--iters", str(args.iters)],
                                      capture_output=True, text=True, timeout=600)  # fmt: skip
                if proc.returncode != 0:
                    sys.exit(f"{name}: commdsl run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
                tl = Timeline.read(out)
                requested = {s.op_id: dict(s.args)["requested_duration_us"] for s in tl.exec_spans().values()
                             if "requested_duration_us" in dict(s.args)}  # fmt: skip
                for d in duration_drifts(tl):
                    ratios = [s.duration_us / requested[s.op_id] for s in tl.exec_spans().values()
                              if s.rank == d.rank and s.op_id in requested]  # fmt: skip
                    warned = f"warning: rank {d.rank}:" in proc.stdout
                    print(f"{name:<8} {launch:>6} {d.rank:>4} {statistics.median(ratios):>7.3f} {min(ratios):>6.3f} "
                          f"{max(ratios):>6.3f} {d.off:>4}/{d.ops:<3}  {'yes' if warned else 'no'}")  # fmt: skip
    print(f"(ratios: measured / requested duration of each op's per-iteration median; a rank whose median is more "
          f"than {DURATION_DRIFT_PCT:g}% off warns)")


if __name__ == "__main__":
    main()
