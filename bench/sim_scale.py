"""How fast and how lean `simulate()` is on large schedules, against the targets of
docs/performance.md.

    python bench/sim_scale.py            # full sizes (the README quotes these)
    python bench/sim_scale.py --quick    # smaller sizes, no 1M-op run, for a smoke run
    python bench/sim_scale.py --only samples   # one block (throughput, cost, samples; repeatable)

Every figure is process CPU time of `simulate()` alone (the engine, the memory check, the
critical path: what a summary needs; not loading the schedule, not building a trace),
the median of `--repeats` runs, on h100-nvlink with the flow network unless said:

  1. ops/s, 1F1B at 64, 128 and 256 stages x 256 microbatches (P2P-heavy: a send/recv
     pair per stage boundary and microbatch). Target >= 300k.
  2. ops/s, one data-parallel step: 256 ranks x 50 gradient buckets, the backward
     overlapped with bucketed all_reduces on a comm stream. Target >= 500k.
  3. the chained all_reduce: 1000 64 MiB ring all_reduces on 64 ranks, one link per rank
     at 50 GB/s and 500 ns (`bench/contention.py`'s machine). Target: simulate() <= 0.1 s.
     Its ranks, and the data-parallel step's, are interchangeable: `simulate()` runs rank 0
     for all (`commdsl.sim.symmetry`); "every rank" is the same with `fold=False`.
  4. cost per op at 1k, 10k, 100k and 1M ops (1F1B, 64 stages, microbatches to match):
     flat is the target. Small sizes repeat until 0.2 s has passed, per run.
  5. `samples=N` against one simulation (1F1B 64 x 64 on cpu-loopback with a compute
     noise model; each sample draws its stalls, one simulation draws none): at most N x
     one simulation is the target. The two alternate, `--repeats` times (at least 5),
     so that a change in the machine's load falls on both.

"B/op" is the peak tracemalloc sees during `simulate()` (the loaded Program is not
counted) divided by the number of ops, in a separate run.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable

from contention import CHAINED, RING_MACHINE  # bench/contention.py (the script's folder is on the path)

from commdsl.cli import count_at_least
from commdsl.dsl import load_schedule, load_schedule_text
from commdsl.ir import Program
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.machine.model import ComputeNoise, Machine
from commdsl.sim import ENGINE_BUILD, simulate

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

BLOCKS = ("throughput", "cost", "samples")
"""The figures' blocks, in the order they run (`--only`)."""
OPS_PER_MICROBATCH = 509
"""1F1B on 64 stages: ops per microbatch (130,240 ops at 256 microbatches)."""


def cpu_once(run: Callable[[], object], min_s: float = 0.0) -> float:
    """CPU time of one `run()`, after a collection; a run that takes less than `min_s` is
    repeated until that much has passed, and counted per call."""
    gc.collect()
    calls, c0 = 0, time.process_time()
    while True:
        run()
        calls += 1
        spent = time.process_time() - c0
        if spent >= min_s:
            return spent / calls


def cpu_s(run: Callable[[], object], repeats: int, min_s: float = 0.0) -> float:
    """Median over `repeats` of `cpu_once(run, min_s)`."""
    return statistics.median(cpu_once(run, min_s) for _ in range(repeats))


def cpu_s_alternating(a: Callable[[], object], b: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Medians over `repeats` of the CPU times of `a()` and `b()`, run in turn."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for run, spent in zip((a, b), times):
            spent.append(cpu_once(run))
    return statistics.median(times[0]), statistics.median(times[1])


def bytes_per_op(program: Program, machine: Machine, network: str = "flow", fold: bool = True) -> float:
    gc.collect()
    tracemalloc.start()
    simulate(program, machine, network, fold=fold)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / program.num_ops


def one_f_one_b(stages: int, microbatches: int, **params: str) -> Program:
    return load_schedule("1f1b", {"stages": str(stages), "microbatches": str(microbatches), **params})


def throughput(name: str, program: Program, machine: Machine, repeats: int, fold: bool = True, note: str = "") -> None:
    s = cpu_s(lambda: simulate(program, machine, "flow", fold=fold), repeats)
    print(f"  {name:40} {program.num_ops:>9,} ops {s:>8.3f} s {program.num_ops / s:>10,.0f} ops/s "
          f"{bytes_per_op(program, machine, fold=fold):>6.0f} B/op{note}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, no 1M-op run")
    parser.add_argument("--repeats", type=count_at_least(1), default=3)
    parser.add_argument("--samples", type=count_at_least(2), default=3, help="N of the samples=N comparison (2 or more)")
    parser.add_argument("--only", action="append", choices=BLOCKS, help="run this block only (repeatable)")
    args = parser.parse_args()
    only = set(args.only or BLOCKS)
    print(f"engine: {ENGINE_BUILD.describe()}")
    if "throughput" in only:
        throughputs(args.quick, args.repeats)
    if "cost" in only:
        cost_per_op(args.quick, args.repeats)
    if "samples" in only:
        samples(args.quick, max(5, args.repeats), args.samples)


def throughputs(quick: bool, repeats: int) -> None:
    h100 = resolve_machine("h100-nvlink")

    print("simulate() throughput, CPU time, median of", repeats, "(flow network)")
    microbatches = 64 if quick else 256
    for stages in (64, 128) if quick else (64, 128, 256):
        throughput(f"1f1b {stages} stages x {microbatches} mb", one_f_one_b(stages, microbatches), h100, repeats)
    buckets = 12 if quick else 50
    dp = load_schedule_text(DP_STEP, "dp_step.yaml", {"buckets": str(buckets)})
    throughput(f"dp step 256 ranks x {buckets} buckets", dp, h100, repeats)
    throughput("  the same, every rank run", dp, h100, repeats, fold=False)

    count = 250 if quick else 1000
    chained = load_schedule_text(CHAINED, "chained.yaml", {"count": str(count)})
    ring = load_machine_text(RING_MACHINE, "ring-50.yaml")
    predicted = f"  (predicted {simulate(chained, ring, 'flow').makespan_us / 1e3:.3f} ms)"
    throughput(f"chained all_reduce 64 ranks x {count}", chained, ring, repeats, note=predicted)
    throughput("  the same, every rank run", chained, ring, repeats, fold=False,
               note=f"  (predicted {simulate(chained, ring, 'flow', fold=False).makespan_us / 1e3:.3f} ms)")  # fmt: skip


def cost_per_op(quick: bool, repeats: int) -> None:
    h100 = resolve_machine("h100-nvlink")
    print("cost per op, 1F1B 64 stages (flow network)")
    for ops in (1_000, 10_000, 100_000) if quick else (1_000, 10_000, 100_000, 1_000_000):
        program = one_f_one_b(64, max(1, round(ops / OPS_PER_MICROBATCH)))
        s = cpu_s(lambda: simulate(program, h100, "flow"), repeats, min_s=0.2)
        print(f"  {program.num_ops:>9,} ops {s:>8.3f} s {s / program.num_ops * 1e6:>6.2f} us/op {bytes_per_op(program, h100):>6.0f} B/op", flush=True)


def samples(quick: bool, repeats: int, n: int) -> None:
    cpu = resolve_machine("cpu-loopback")
    noise = ComputeNoise(stalls_per_s=20.0, stall_us=300.0, wake_stall_probability=0.2, wake_stall_us=50.0)
    noisy = dataclasses.replace(cpu, contention=dataclasses.replace(cpu.contention, noise=noise))
    program = one_f_one_b(64, 16 if quick else 64, saved="16MiB")  # within cpu-loopback's 4 GiB per rank
    one, many = cpu_s_alternating(lambda: simulate(program, noisy, "flow"), lambda: simulate(program, noisy, "flow", samples=n), repeats)
    print(f"samples={n} against one simulation, 1F1B 64 x {program.num_ops // OPS_PER_MICROBATCH} on cpu-loopback with compute noise "
          f"(flow), CPU time, medians of {repeats} taken in turn")  # fmt: skip
    print(f"  {program.num_ops:>9,} ops  one {one:.3f} s  samples={n} {many:.3f} s  = {many / one:.2f} x one (target <= {n})", flush=True)


if __name__ == "__main__":
    main()
