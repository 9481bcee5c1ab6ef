"""How fast and how lean the simulator is on large schedules.

    python bench/sim_scale.py            # full sizes (the README quotes these)
    python bench/sim_scale.py --quick    # a quarter of the work, for a smoke run

Workloads (acceptance targets of the simulator issue):
  * 1F1B pipeline, 64 stages x 256 microbatches (the bundled 1f1b schedule);
  * one data-parallel step, 256 ranks x 50 gradient buckets, backward overlapped with
    bucketed all_reduces on a comm stream (events order the streams);
  * 1000 chained 64 MiB all_reduces over 64 ranks (target: <= 0.5 s).
Targets: >= 100k simulated ops per second, <= 1 KB of memory per op, linear in ops.

"sim s" is the wall time of `simulate()` (the engine, the critical path; what a summary
needs), best of a few runs, and ops/s is based on it; "cpu s" is the process CPU time of
the same call (less sensitive to other load on a shared machine); "+trace s" is the extra time to
build the Timeline (what `--trace` writes). Memory is the peak traced by tracemalloc,
divided by the number of ops, in separate runs (the loaded Program is not counted):
"B/op" during `simulate()` (the simulator, what the 1 KB target is about) and
"+trace B/op" during `simulate()` plus building the Timeline (two spans per op, counters). Loading (front end) is reported
separately. Each workload runs at half and full size to show linear growth.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

from commdsl.dsl import load_schedule, load_schedule_text
from commdsl.machine import resolve_machine
from commdsl.sim import simulate

DP_STEP = """
name: dp_step
params: {ranks: 256, buckets: 50, bucket: 25MiB, t_bwd: 1ms, t_opt: 2ms}
world: {dp: ranks}
streams: [compute, comm]
program: |
  for b in range(buckets):
      compute B[b] t_bwd on compute
      record ready[b] on compute
      wait ready[b] on comm
      h[b] = all_reduce grad[b] bucket group=dp on comm
  for b in range(buckets):
      wait h[b] on compute
  compute step t_opt on compute
"""

CHAINED_ALL_REDUCE = """
name: chained_all_reduce
params: {ranks: 64, count: 1000, size: 64MiB}
world: ranks
streams: [compute]
program: |
  for i in range(count):
      all_reduce x[i] size
"""


def workloads(scale: float):
    def s(n: int) -> str:
        return str(max(1, int(n * scale)))

    yield "1f1b 64 stages x 256 mb", lambda: load_schedule("1f1b", {"stages": "64", "microbatches": s(256)})
    yield "dp step 256 ranks x 50 buckets", lambda: load_schedule_text(DP_STEP, "dp_step.yaml", {"buckets": s(50)})
    yield "1000 chained 64MiB all_reduce x 64", lambda: load_schedule_text(CHAINED_ALL_REDUCE, "chained.yaml", {"count": s(1000)})


def measure(load, machine, repeats: int) -> dict:
    t0 = time.perf_counter()
    program = load()
    load_s = time.perf_counter() - t0
    best, best_cpu, best_tl = float("inf"), float("inf"), float("inf")
    for _ in range(repeats):
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        result = simulate(program, machine)
        t1, c1 = time.perf_counter(), time.process_time()
        result.timeline  # noqa: B018 -- built on first use, as `--trace` does
        t2 = time.perf_counter()
        best, best_cpu, best_tl = min(best, t1 - t0), min(best_cpu, c1 - c0), min(best_tl, t2 - t1)
        del result
    gc.collect()
    tracemalloc.start()
    result = simulate(program, machine)
    _, peak_sim = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del result
    gc.collect()
    tracemalloc.start()
    result = simulate(program, machine)
    result.timeline  # noqa: B018 -- count the timeline's spans too
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "ops": program.num_ops,
        "load_s": load_s,
        "sim_s": best,
        "cpu_s": best_cpu,
        "timeline_s": best_tl,
        "ops_per_s": program.num_ops / best,
        "peak_bytes": peak,
        "sim_bytes_per_op": peak_sim / program.num_ops,
        "bytes_per_op": peak / program.num_ops,
        "makespan_us": result.makespan_us,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="quarter-size workloads")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    machine = resolve_machine("h100-nvlink")
    scales = (0.25,) if args.quick else (0.5, 1.0)
    print(f"{'workload':36} {'scale':>5} {'ops':>9} {'load s':>7} {'sim s':>7} {'cpu s':>7} {'ops/s':>10} {'+trace s':>8} {'peak MB':>8} {'B/op':>6} {'+trace B/op':>11} {'makespan':>12}")
    for name, load in workloads(1.0):
        for scale in scales:
            loader = dict(workloads(scale))[name] if scale != 1.0 else load
            r = measure(loader, machine, args.repeats)
            print(
                f"{name:36} {scale:>5} {r['ops']:>9,} {r['load_s']:>7.2f} {r['sim_s']:>7.3f} {r['cpu_s']:>7.3f} {r['ops_per_s']:>10,.0f} {r['timeline_s']:>8.3f} "
                f"{r['peak_bytes'] / 1e6:>8.1f} {r['sim_bytes_per_op']:>6.0f} {r['bytes_per_op']:>11.0f} {r['makespan_us'] / 1e3:>10.3f}ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
