"""Expansion speed: how fast a schedule becomes a per-rank op list.

Loads 1F1B with 64 stages x 1024 microbatches (parse, compile, expand for every rank,
cross-rank validation) several times and reports the median. Target: >= 100k ops/s.

    python bench/expand.py [--stages 64] [--microbatches 1024] [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
import tracemalloc

from commdsl.dsl import load_schedule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--stages", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    overrides = {"stages": str(args.stages), "microbatches": str(args.microbatches)}

    load_schedule(args.schedule, {"stages": "2", "microbatches": "2"})  # warm: grammar build, imports
    times = []
    num_ops = 0
    for _ in range(args.repeats):
        start = time.perf_counter()
        program = load_schedule(args.schedule, overrides)
        times.append(time.perf_counter() - start)
        num_ops = program.num_ops
        del program
    tracemalloc.start()
    program = load_schedule(args.schedule, overrides)  # alive while the peak is read
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del program

    median = statistics.median(times)
    print(f"schedule      {args.schedule} stages={args.stages} microbatches={args.microbatches}")
    print(f"machine       {platform.machine()} {platform.python_implementation()} {platform.python_version()}")
    print(f"ops           {num_ops:,}")
    print(f"load time     median {median:.3f} s over {args.repeats} runs (min {min(times):.3f}, max {max(times):.3f})")
    print(f"expansion     {num_ops / median:,.0f} ops/s (target >= 100,000)")
    print(f"peak memory   {peak / 2**20:.1f} MiB under tracemalloc ({peak / num_ops:.0f} B/op)")


if __name__ == "__main__":
    main()
