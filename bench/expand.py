"""Expansion speed and memory: how fast a schedule becomes a per-rank op list, and what
the loaded Program costs per op.

Loads each workload (parse, compile, expand for every rank, cross-rank validation:
`load_schedule`) several times and reports the median CPU time as ops/s, then loads it
once more under tracemalloc and reports the peak while the Program is alive, per op.
Target: >= 500k ops/s, and the Program well under 200 B/op.

  * 1F1B, 64 stages x 1024 microbatches (P2P-heavy: every op depends on the stage);
  * data parallel: DDP overlap (bucketed async all_reduce) on 256 ranks;
  * the chained all_reduce of bench/contention.py: 1000 ring all_reduces on 64 ranks.

    python bench/expand.py [--stages 64] [--microbatches 1024] [--dp-ranks 256] [--dp-steps 30] [--repeats 3]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from commdsl.dsl import load_schedule, load_schedule_text
from commdsl.ir import Program

sys.path.insert(0, str(Path(__file__).resolve().parent))
from contention import CHAINED  # noqa: E402  (the chained all_reduce, as the simulator bench runs it)


def measure(label: str, load: Callable[[], Program], repeats: int) -> None:
    load()  # warm: imports, grammar, caches
    times = []
    num_ops = 0
    for _ in range(repeats):
        start = time.process_time()
        program = load()
        times.append(time.process_time() - start)
        num_ops = program.num_ops
        del program
    tracemalloc.start()
    program = load()  # alive while the peak is read
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del program
    median = statistics.median(times)
    print(f"{label:<44} {num_ops:>9,} ops  {median:6.3f} s CPU (min {min(times):.3f})  {num_ops / median:>9,.0f} ops/s  "
          f"{peak / num_ops:4.0f} B/op")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=1024)
    parser.add_argument("--dp-ranks", type=int, default=256)
    parser.add_argument("--dp-steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    print(f"machine: {platform.machine()} {platform.python_implementation()} {platform.python_version()}; "
          f"median CPU time of {args.repeats} loads; target >= 500,000 ops/s, well under 200 B/op")  # fmt: skip
    pipeline = {"stages": str(args.stages), "microbatches": str(args.microbatches)}
    measure(f"1f1b stages={args.stages} microbatches={args.microbatches}", lambda: load_schedule("1f1b", pipeline), args.repeats)
    dp = {"ranks": str(args.dp_ranks), "steps": str(args.dp_steps)}
    measure(f"ddp_overlap ranks={args.dp_ranks} steps={args.dp_steps}", lambda: load_schedule("ddp_overlap", dp), args.repeats)
    measure("chained all_reduce 64 ranks x 1000", lambda: load_schedule_text(CHAINED, "chained.yaml"), args.repeats)


if __name__ == "__main__":
    main()
