"""What `commdsl simulate`'s outputs cost on top of the simulation: the summary, `--json`
and `--trace`, per op, on a 1F1B pipeline (64 stages by default).

    python bench/outputs.py                      # 1F1B 64 x 263 (133k ops)
    python bench/outputs.py --microbatches 2632  # 1.34M ops

Prints CPU seconds (median of `--repeats`) and microseconds per op of: summarize,
the JSON summary, the streamed trace (`SimResult.write_trace`), and, for comparison, the
trace's size; then the most memory the streamed trace takes beyond the simulation's
(tracemalloc's peak while it writes, per op). `bench/scale.py` measures the whole command
(imports, expansion, simulation included); this one isolates the outputs.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
import tracemalloc

from commdsl.dsl import load_schedule
from commdsl.machine import resolve_machine
from commdsl.sim import simulate
from commdsl.sim.summary import summarize


def _cpu(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=263)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    program = load_schedule("1f1b", {"stages": str(args.stages), "microbatches": str(args.microbatches)})
    result = simulate(program, resolve_machine("h100-nvlink"))
    ops = program.num_ops
    summary = summarize(result)
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "t.json")
        rows = [
            ("summarize", _cpu(lambda: summarize(result), args.repeats)),
            ("--json", _cpu(lambda: summary.write_json(io.StringIO()), args.repeats)),
            ("--trace", _cpu(lambda: result.write_trace(trace), args.repeats)),
        ]
        size = os.path.getsize(trace)
        tracemalloc.start()
        result.write_trace(trace)
        trace_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    print(f"1F1B {args.stages} stages x {args.microbatches} microbatches: {ops:,} ops, trace {size / 1e6:.0f} MB "
          f"({size / ops:.0f} bytes per op)")  # fmt: skip
    for name, cpu in rows:
        print(f"  {name:<10} {cpu:7.3f} s CPU  {1e6 * cpu / ops:6.2f} us/op")
    print(f"  --trace's peak memory beyond the simulation: {trace_peak / 2**20:.0f} MiB ({trace_peak / ops:.0f} bytes per op)")


if __name__ == "__main__":
    main()
